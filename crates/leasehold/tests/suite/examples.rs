//! The examples in `crates/leasehold/examples` run as the README says.
//! `cargo test` (and nextest) build them next to this test binary.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/tests-… → target/<profile>/examples/<name>
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build -p leasehold --examples`",
        path.display()
    );
    path
}

/// Runs an example to completion (30 s at most).
fn run(name: &str, args: &[&str]) -> Output {
    let child = Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start example");
    wait(child, Duration::from_secs(30))
}

fn wait(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("example still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn campaign_writes_fenced_and_resigns_on_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let resource = dir.path().join("resource.db");
    let out = stdout(&run(
        "campaign",
        &["memory:", resource.to_str().expect("utf-8 path")],
    ));
    assert!(out.contains("with fencing token 1\n"), "{out}");
    assert_eq!(out.matches("wrote journal entry").count(), 5, "{out}");
    assert!(
        out.ends_with("resigned; the next candidate takes over now\n"),
        "{out}"
    );
}

#[test]
fn follow_on_memory_sees_three_leaders_take_turns() {
    let out = stdout(&run("follow", &["memory:"]));
    let leaders: Vec<(&str, u64)> = out
        .lines()
        .filter_map(|l| l.strip_prefix("leader: ")?.split_once(" with token "))
        .filter_map(|(who, rest)| Some((who, rest.split(' ').next()?.parse().ok()?)))
        .collect();
    // The memory store's tokens are its revisions, which the line's notes
    // use too: they increase, not one by one; the first grant of a new
    // store is its first write.
    let mut who: Vec<&str> = leaders.iter().map(|(w, _)| *w).collect();
    who.sort_unstable();
    assert_eq!(who, ["replica-a", "replica-b", "replica-c"], "{out}");
    assert_eq!(leaders.first().map(|(_, t)| *t), Some(1), "{out}");
    assert!(leaders.windows(2).all(|w| w[0].1 < w[1].1), "{out}");
    assert!(out.ends_with("no leader\n"), "{out}");
}

/// Two `campaign` processes on one SQLite file take turns while `follow`
/// watches; then a campaign on `memory:` (tokens start at 1 again) is
/// refused by the journal, which has accepted token 2.
#[test]
fn follow_watches_campaigns_on_sqlite_and_the_journal_fences_a_stale_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("sqlite:{}", dir.path().join("store.db").display());
    let resource = dir.path().join("resource.db");
    let resource = resource.to_str().expect("utf-8 path");

    let mut follower = Command::new(example("follow"))
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start follow");
    let spawn_campaign = || {
        Command::new(example("campaign"))
            .args([store.as_str(), resource])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start campaign")
    };
    let (a, b) = (spawn_campaign(), spawn_campaign());
    let (a, b) = (
        stdout(&wait(a, Duration::from_secs(30))),
        stdout(&wait(b, Duration::from_secs(30))),
    );
    let tokens = [a.as_str(), b.as_str()].map(|out| {
        out.lines()
            .find_map(|l| l.split("with fencing token ").nth(1))
            .unwrap_or_else(|| panic!("never led: {out}"))
            .to_owned()
    });
    let mut tokens = tokens.map(|t| t.parse::<u64>().expect("a token"));
    tokens.sort_unstable();
    assert!(tokens[0] == 1 && tokens[0] < tokens[1], "{tokens:?}");

    // Give the follower a moment to see the last release, then stop it.
    std::thread::sleep(Duration::from_millis(500));
    let pid = i32::try_from(follower.id()).expect("pid");
    kill(Pid::from_raw(pid), Signal::SIGINT).expect("interrupt follow");
    let status = follower.wait().expect("follow exits");
    let mut watched = String::new();
    follower
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut watched)
        .expect("read follow's output");
    assert!(status.success(), "{status:?}: {watched}");
    for token in tokens {
        assert!(
            watched.contains(&format!(" with token {token} ")),
            "{watched}"
        );
    }
    assert!(watched.ends_with("no leader\n"), "{watched}");

    let stale = stdout(&run("campaign", &["memory:", resource]));
    assert!(
        stale.contains(&format!(
            "stale: the journal has accepted token {} > 1",
            tokens[1]
        )),
        "{stale}"
    );
    assert!(!stale.contains("wrote journal entry"), "{stale}");
}
