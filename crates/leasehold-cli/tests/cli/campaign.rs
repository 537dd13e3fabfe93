//! `leasehold campaign` as a user runs it, including every bad input.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::harness::{Proc, Scratch, events, leasehold, status_json, stderr, wait_until};

const SECOND: Duration = Duration::from_secs(1);

/// `campaign --hold 1h` with a 60 s TTL, its JSON lines written to `out`.
fn holder(scratch: &Scratch, id: &str, hold: &str, out: &std::path::Path) -> Proc {
    Proc::spawn(
        leasehold()
            .args([
                "campaign",
                "--election",
                "held",
                "--ttl",
                "60s",
                "--hold",
                hold,
            ])
            .args(["--id", id, "--store", &scratch.store_url()])
            .stdout(std::fs::File::create(out).expect("out file"))
            .stderr(Stdio::null()),
    )
}

fn lines(path: &std::path::Path) -> Vec<String> {
    super::harness::read_lines(path)
}

/// SIGTERM, SIGINT, SIGHUP or SIGQUIT during `--hold` resign the election
/// before `campaign` exits (0), with `releasing` and `released` naming the
/// signal; a candidate already waiting is granted right after the release,
/// long before the 60 s TTL could expire.
#[test]
fn a_stop_signal_during_hold_resigns_and_a_successor_leads() {
    let scratch = Scratch::new();
    for (round, signal) in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ]
    .into_iter()
    .enumerate()
    {
        let (held, next) = (
            scratch.path(&format!("held-{round}.jsonl")),
            scratch.path(&format!("next-{round}.jsonl")),
        );
        let mut first = holder(&scratch, "first", "1h", &held);
        assert!(wait_until(10 * SECOND, || lines(&held)
            .iter()
            .any(|l| l.contains(r#""event":"acquired""#))));
        let mut successor = holder(&scratch, "successor", "0s", &next);
        assert!(wait_until(10 * SECOND, || lines(&next)
            .iter()
            .any(|l| l.contains(r#""event":"campaigning""#))));
        first.signal(signal);
        let status = first.wait_for_exit(10 * SECOND).expect("campaign exits");
        assert_eq!(status.code(), Some(0), "{signal}");
        let ours = events(lines(&held).join("\n").as_bytes());
        let sequence: Vec<&str> = ours.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(
            sequence,
            ["campaigning", "acquired", "releasing", "released"],
            "{signal}"
        );
        let reason = format!(r#""reason":"{signal} received""#);
        assert!(
            lines(&held).iter().filter(|l| l.contains(&reason)).count() == 2,
            "{signal}: {:?}",
            lines(&held)
        );
        assert!(
            successor
                .wait_for_exit(10 * SECOND)
                .expect("the successor is granted and exits")
                .success(),
            "{signal}"
        );
        let theirs = events(lines(&next).join("\n").as_bytes());
        // `releasing` is the holder's last moment as leader; the successor
        // may be granted as soon as the store has the release, which can be
        // before the holder prints `released`.
        let releasing = ours
            .iter()
            .find(|e| e.event == "releasing")
            .expect("releasing");
        let acquired = theirs
            .iter()
            .find(|e| e.event == "acquired")
            .expect("successor acquired");
        assert!(
            releasing.monotonic_ns < acquired.monotonic_ns,
            "{signal}: the successor led while the holder still did"
        );
        assert!(
            acquired.token > releasing.token,
            "{signal}: {acquired:?} after {releasing:?}"
        );
    }
}

/// A stop signal while still waiting to lead ends `campaign` at once (0),
/// without holding anything.
#[test]
fn a_stop_signal_while_waiting_ends_the_campaign() {
    let scratch = Scratch::new();
    let (held, waiting) = (scratch.path("held.jsonl"), scratch.path("waiting.jsonl"));
    let first = holder(&scratch, "first", "1h", &held);
    assert!(wait_until(10 * SECOND, || lines(&held)
        .iter()
        .any(|l| l.contains(r#""event":"acquired""#))));
    let mut waiter = holder(&scratch, "waiter", "1h", &waiting);
    assert!(wait_until(10 * SECOND, || lines(&waiting)
        .iter()
        .any(|l| l.contains(r#""event":"campaigning""#))));
    waiter.signal(Signal::SIGINT);
    let status = waiter.wait_for_exit(10 * SECOND).expect("campaign exits");
    assert_eq!(status.code(), Some(0));
    let sequence: Vec<String> = events(lines(&waiting).join("\n").as_bytes())
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(sequence, ["campaigning"]);
    assert_eq!(
        status_json(&scratch.store_url(), "held")["leader"]["id"],
        "first"
    );
    drop(first);
}

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
    // The first grant of a new store is its first revision; each later
    // one is higher (a release is a revision of its own in between).
    assert_eq!(acquired.len(), 3, "{acquired:?}");
    assert_eq!(acquired[0], 1, "{acquired:?}");
    assert!(acquired.windows(2).all(|w| w[0] < w[1]), "{acquired:?}");
    // Each round says when the release completed, not only that it began.
    let sequence: Vec<(String, Option<u64>)> = events(&out.stdout)
        .into_iter()
        .map(|e| (e.event, e.token))
        .collect();
    let mut expected = Vec::new();
    for &token in &acquired {
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
    assert!(
        later.first().is_some_and(|t| *t > acquired[2]),
        "{later:?} after {acquired:?}"
    );
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

/// `campaign --hold`, which has no command to pass signals to, resigns on
/// every signal `run` passes on, as on SIGTERM — SIGUSR1 once killed it
/// (exit 138) and left the election held until the TTL — and on SIGPWR;
/// the successor is granted the next token at once. SIGABRT, SIGXCPU and
/// the other signals `run` ignores are ignored: the hold goes on.
#[test]
fn any_other_signal_that_would_end_campaign_resigns_or_is_ignored() {
    let scratch = Scratch::new();
    // SIGUSR1, SIGUSR2, SIGALRM, SIGPWR, SIGIO, SIGRTMIN, SIGRTMAX.
    for (round, (number, name)) in [
        (10, "SIGUSR1"),
        (12, "SIGUSR2"),
        (14, "SIGALRM"),
        (30, "SIGPWR"),
        (29, "SIGIO"),
        (34, "SIGRTMIN"),
        (64, "SIGRTMAX"),
    ]
    .into_iter()
    .enumerate()
    {
        let (held, next) = (
            scratch.path(&format!("held-{round}.jsonl")),
            scratch.path(&format!("next-{round}.jsonl")),
        );
        let mut first = holder(&scratch, "first", "1h", &held);
        assert!(wait_until(10 * SECOND, || lines(&held)
            .iter()
            .any(|l| l.contains(r#""event":"acquired""#))));
        if round == 0 {
            // SIGTRAP, SIGABRT, SIGSYS, SIGXCPU, SIGXFSZ: ignored.
            for ignored in [5, 6, 31, 24, 25] {
                super::run::kill_by_number(first.pid(), ignored);
            }
            std::thread::sleep(SECOND / 2);
            assert!(
                first.child.try_wait().expect("try_wait").is_none(),
                "campaign ended on an ignored signal"
            );
            assert_eq!(lines(&held).len(), 2, "{:?}", lines(&held));
        }
        let mut successor = holder(&scratch, "successor", "0s", &next);
        assert!(wait_until(10 * SECOND, || lines(&next)
            .iter()
            .any(|l| l.contains(r#""event":"campaigning""#))));
        super::run::kill_by_number(first.pid(), number);
        let status = first.wait_for_exit(10 * SECOND).expect("campaign exits");
        assert_eq!(status.code(), Some(0), "{name}");
        let ours = events(lines(&held).join("\n").as_bytes());
        let sequence: Vec<&str> = ours.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(
            sequence,
            ["campaigning", "acquired", "releasing", "released"],
            "{name}"
        );
        let reason = format!(r#""reason":"{name} received""#);
        assert!(
            lines(&held).iter().filter(|l| l.contains(&reason)).count() == 2,
            "{name}: {:?}",
            lines(&held)
        );
        assert!(
            successor
                .wait_for_exit(10 * SECOND)
                .expect("the successor is granted and exits")
                .success(),
            "{name}"
        );
        let theirs = events(lines(&next).join("\n").as_bytes());
        let releasing = ours
            .iter()
            .find(|e| e.event == "releasing")
            .expect("releasing");
        let acquired = theirs
            .iter()
            .find(|e| e.event == "acquired")
            .expect("successor acquired");
        assert!(
            acquired.token > releasing.token,
            "{name}: {acquired:?} after {releasing:?}"
        );
    }
}

/// `campaign --hold` whose stdout reader goes away once it has read the
/// first line (`campaign … | head -1`): the `acquired` line cannot be
/// written, and the election is released at once, not left held for the
/// 60 s TTL; the error names stdout.
#[test]
fn a_reader_gone_before_acquired_releases_the_election() {
    use std::io::BufRead;
    let scratch = Scratch::new();
    // `a` holds first, so that `b` is still waiting when its reader goes.
    let a_out = scratch.path("a.out");
    let a = holder(&scratch, "a", "1h", &a_out);
    assert!(
        wait_until(10 * SECOND, || lines(&a_out).len() >= 2),
        "a never led"
    );
    let mut child = leasehold()
        .args([
            "campaign",
            "--election",
            "held",
            "--ttl",
            "60s",
            "--hold",
            "1h",
        ])
        .args(["--store", &scratch.store_url()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .expect("first line");
    assert!(first.contains("campaigning"), "{first}");
    // The reader is dropped: the pipe's read end is closed. Then `a` lets
    // go, `b` is granted the election and cannot say so.
    a.signal(Signal::SIGTERM);
    let out = child.wait_with_output().expect("exit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write to stdout"), "{err}");
    let status = status_json(&scratch.store_url(), "held");
    assert!(status["leader"].is_null(), "still held: {status}");
}

/// A `campaign` stopped (SIGSTOP) during `--hold` past its lease's
/// deadline, and continued after its hold ended: it says `lost`, never
/// `releasing` (before: it printed `releasing` with a time after its
/// successor's whole term, as if it had led through it), and exits 1.
#[test]
fn a_hold_that_ends_after_the_deadline_is_reported_lost() {
    let scratch = Scratch::new();
    let out = scratch.path("a.out");
    let mut a = Proc::spawn(
        leasehold()
            .args(["campaign", "--election", "held", "--ttl", "1s"])
            .args([
                "--hold",
                "1500ms",
                "--id",
                "a",
                "--store",
                &scratch.store_url(),
            ])
            .stdout(std::fs::File::create(&out).expect("out file"))
            .stderr(Stdio::null()),
    );
    assert!(
        wait_until(Duration::from_secs(30), || lines(&out)
            .iter()
            .any(|l| l.contains("\"acquired\""))),
        "a was not granted"
    );
    let pid = nix::unistd::Pid::from_raw(a.pid());
    nix::sys::signal::kill(pid, Signal::SIGSTOP).expect("stop");
    std::thread::sleep(Duration::from_secs(2));
    nix::sys::signal::kill(pid, Signal::SIGCONT).expect("continue");
    let status = a.wait_for_exit(Duration::from_secs(30)).expect("a exits");
    let seen: Vec<String> = events(&std::fs::read(&out).expect("read"))
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(status.code(), Some(1), "{seen:?}");
    assert!(seen.iter().any(|e| e == "lost"), "{seen:?}");
    assert!(!seen.iter().any(|e| e == "releasing"), "{seen:?}");
}
