//! The `leasehold-sim` binary's arguments: bad input is refused with exit 2
//! (issue 12: `--seeds abc` used to run 1,000 seeds and exit 0, `--bogus`
//! was ignored), good input runs what it says.

use std::process::{Command, Output, Stdio};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold-sim"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn leasehold-sim")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bad_arguments_exit_2_and_run_nothing() {
    for (args, needle) in [
        (&["--seeds", "abc"][..], "--seeds"),
        (&["--seeds", "0"], "--seeds"),
        (&["--seeds", "-5"], "-5"),
        (&["--seed", "x"], "--seed"),
        (&["--start", "1.5"], "--start"),
        (&["--store-clock-step-ms", "soon"], "--store-clock-step-ms"),
        (&["--shards", "0"], "--shards"),
        (&["--shards", "65537"], "--shards"),
        (&["--shards", "many"], "--shards"),
        (&["--bogus"], "--bogus"),
        (&["--seed", "1", "--seeds", "2"], "--seed"),
        (&["--seeds"], "--seeds"),
        (&["extra"], "extra"),
        (
            &["--start", "18446744073709551615", "--seeds", "2"],
            "--start",
        ),
    ] {
        let out = sim(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !text(&out.stdout).contains("seeds passed"),
            "{args:?} ran anyway: {}",
            text(&out.stdout)
        );
    }
}

#[test]
fn good_arguments_run_the_seeds_they_name() {
    let out = sim(&["--seeds", "2", "--start", "5"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("2 seeds passed (5..7)"), "{stdout}");
    let out = sim(&["--seed", "42"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("1 seeds passed (42..43)"));
    let out = sim(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--seed ",
        "--seeds",
        "--start",
        "--unsafe-deadline",
        "--unfenced",
        "--store-clock-step-ms",
        "--shards",
        "--history",
        "--keep-going",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
}

/// A broken setup still fails with exit 1 and names the replay command.
#[test]
fn a_broken_invariant_exits_1() {
    let out = sim(&["--seeds", "1000", "--unfenced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--unfenced"),
        "{}",
        text(&out.stderr)
    );
}

/// `--shards N` runs the sharded mode, and its failures name it in the
/// replay command.
#[test]
fn the_sharded_mode_runs_from_the_binary() {
    let out = sim(&["--seeds", "2", "--start", "5", "--shards", "8"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("2 seeds passed (5..7)"), "{stdout}");
    assert!(stdout.contains("8 shards per run"), "{stdout}");
    let out = sim(&["--seeds", "1000", "--shards", "8", "--unfenced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("fenced writes never go back"), "{stderr}");
    assert!(stderr.contains("--shards 8 --unfenced"), "{stderr}");
}
