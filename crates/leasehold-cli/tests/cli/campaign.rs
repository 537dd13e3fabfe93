//! `leasehold campaign` as a user runs it, including every bad input.

use super::harness::{Scratch, events, leasehold, stderr};

#[test]
fn campaigns_holds_and_resigns_with_increasing_tokens() {
    let scratch = Scratch::new();
    let out = leasehold()
        .args([
            "campaign",
            "--election",
            "demo",
            "--hold",
            "20ms",
            "--rounds",
            "3",
        ])
        .args(["--store", &scratch.store_url(), "--id", "me"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let acquired: Vec<u64> = events(&out.stdout)
        .iter()
        .filter(|e| e.event == "acquired")
        .map(|e| {
            assert_eq!(e.id, "me");
            e.token.expect("token")
        })
        .collect();
    assert_eq!(acquired, vec![1, 2, 3]);
    // Each round says when the release completed, not only that it began.
    let sequence: Vec<(String, Option<u64>)> = events(&out.stdout)
        .into_iter()
        .map(|e| (e.event, e.token))
        .collect();
    let mut expected = Vec::new();
    for token in 1..=3 {
        expected.push(("campaigning".to_owned(), None));
        for event in ["acquired", "releasing", "released"] {
            expected.push((event.to_owned(), Some(token)));
        }
    }
    assert_eq!(sequence, expected);
    // A later process continues the same counter: tokens survive restarts.
    let out = leasehold()
        .args([
            "campaign",
            "--election",
            "demo",
            "--store",
            &scratch.store_url(),
        ])
        .output()
        .expect("spawn");
    let later: Vec<_> = events(&out.stdout)
        .into_iter()
        .filter_map(|e| e.token)
        .collect();
    assert_eq!(later.first(), Some(&4));
}

#[test]
fn default_store_lives_under_xdg_state_home_and_its_folder_is_created() {
    let scratch = Scratch::new();
    let state = scratch.path("state");
    let out = leasehold()
        .args(["campaign", "--election", "defaults"])
        .env("XDG_STATE_HOME", &state)
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.join("leasehold/leasehold.db").is_file());
}

#[test]
fn bad_input_exits_2_with_one_clear_line() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let cases: &[(&[&str], &str)] = &[
        (&["campaign", "--store", &store], "--election"),
        (
            &["campaign", "--election", "", "--store", &store],
            "must not be empty",
        ),
        (
            &["campaign", "--election", "/x", "--store", &store],
            "must not start with",
        ),
        (
            &["campaign", "--election", "a", "--store", "redis://x"],
            "unknown scheme",
        ),
        (
            &[
                "campaign",
                "--election",
                "a",
                "--store",
                &store,
                "--ttl",
                "fast",
            ],
            "15s",
        ),
        (
            &[
                "campaign",
                "--election",
                "a",
                "--store",
                &store,
                "--ttl",
                "0s",
            ],
            "TTL must be greater than zero",
        ),
        (
            &[
                "campaign",
                "--election",
                "a",
                "--store",
                &store,
                "--ttl",
                "2s",
                "--renew-every",
                "1s",
            ],
            "the renewal period must be shorter than half of TTL·(1 − drift) − skew",
        ),
    ];
    for (args, needle) in cases {
        let out = leasehold().args(*args).output().expect("spawn");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_unusable_store_exits_1_without_a_panic_and_loses_nothing() {
    let scratch = Scratch::new();
    let notes = scratch.path("notes.txt");
    std::fs::write(&notes, "precious\n").expect("write");
    let dir = scratch.path("a-folder");
    std::fs::create_dir(&dir).expect("mkdir");
    for (url, code, needle) in [
        (
            format!("sqlite:{}", notes.display()),
            1,
            "not a SQLite database",
        ),
        ("sqlite:/proc/leasehold.db".to_owned(), 1, "cannot open"),
        (format!("sqlite:{}", dir.display()), 2, "is a directory"),
    ] {
        let out = leasehold()
            .args(["campaign", "--election", "a", "--store", &url])
            .output()
            .expect("spawn");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{url}: {err}");
        assert!(err.contains(needle), "{url}: {err}");
        assert!(!err.contains("panicked"), "{url}: {err}");
    }
    assert_eq!(std::fs::read_to_string(&notes).expect("read"), "precious\n");
}
