//! Issue 16 item 4: a store password stays off command lines and out of
//! every message, and the command `run` starts is not given it.

use std::process::Output;
use std::time::Duration;

use leasehold_testkit::PostgresServer;

use super::harness::{Proc, Scratch, children_of, leasehold, wait_until};

const SECRET: &str = "Sup3rSecret-9f2c";

fn all_output(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The one line a refused invocation prints (at `-vvv` too), which must
/// name `needle` and never show the password; it exits 2, as for any
/// invalid input.
fn refused(args: &[&str], password_env: Option<&str>, needle: &str, code: i32) {
    for verbosity in [None, Some("-vvv")] {
        let mut cmd = leasehold();
        cmd.args(args).args(verbosity);
        if let Some(password) = password_env {
            cmd.env("LEASEHOLD_STORE_PASSWORD", password);
        }
        let output = cmd.output().expect("leasehold runs");
        let text = all_output(&output);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {text}");
        assert!(text.contains(needle), "{args:?} {verbosity:?}: {text}");
        assert!(
            !text.contains("Sup3r"),
            "{args:?} {verbosity:?} shows the password: {text}"
        );
        if verbosity.is_none() {
            assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: {text}");
        }
    }
}

#[test]
fn a_password_in_a_refused_url_or_the_environment_is_never_shown() {
    let scratch = Scratch::new();
    let sqlite = scratch.store_url();
    let missing = scratch.path("no-such-password-file");
    let missing_file = format!(
        "etcd://app@127.0.0.1:1/p?password_file={}",
        missing.display()
    );
    for (args, password_env, needle, code) in [
        // A control character in a path stays escaped: one line.
        (
            vec![
                "status",
                "-e",
                "x",
                "--store",
                "postgres://app@127.0.0.1:1/db?password_file=/no%0Ase%1B[31m",
            ],
            None,
            "/no\\nse\\u{1b}[31m: cannot open",
            2,
        ),
        (
            vec!["status", "-e", "x", "--store", "etcd://app@127.0.0.1:1/p"],
            Some(""),
            "is empty",
            2,
        ),
        (
            vec![
                "status",
                "-e",
                "x",
                "--store",
                "etcd://app:Sup3rSecret@127.0.0.1:1/p?bogus=1",
            ],
            None,
            "unknown option \"bogus\"",
            2,
        ),
        (
            vec![
                "status",
                "-e",
                "x",
                "--store",
                "zk://app:Sup3rSecret@127.0.0.1:1/p?cacert=/x",
            ],
            None,
            "does not speak TLS",
            2,
        ),
        (
            vec!["status", "-e", "x", "--store", &sqlite],
            Some(SECRET),
            "take no password",
            2,
        ),
        (
            vec!["status", "-e", "x", "--store", "etcd://127.0.0.1:1/p"],
            Some(SECRET),
            "names no user",
            2,
        ),
        (
            vec![
                "status",
                "-e",
                "x",
                "--store",
                "etcd://app:Sup3rOther@127.0.0.1:1/p",
            ],
            Some(SECRET),
            "given twice",
            2,
        ),
        (
            vec!["status", "-e", "x", "--store", "etcd://app@127.0.0.1:1/p"],
            None,
            "etcd user \"app\" has no password",
            2,
        ),
        (
            vec!["status", "-e", "x", "--store", &missing_file],
            None,
            "cannot open",
            2,
        ),
    ] {
        refused(&args, password_env, needle, code);
    }
}

/// `run` on a store given by `LEASEHOLD_STORE`, its password by
/// `LEASEHOLD_STORE_PASSWORD`: no process's command line holds the
/// password, and the command's environment holds neither variable (a URL
/// may hold a password too). (The test server trusts
/// loopback connections, so the password is carried but not checked; the
/// secured stores' own tests check it is used.)
#[test]
fn the_password_is_on_no_command_line_and_not_given_to_the_command() {
    let server = PostgresServer::start();
    let scratch = Scratch::new();
    let env_file = scratch.path("env");
    let script = format!(
        "env > {}.tmp && mv {0}.tmp {0} && exec sleep 60",
        env_file.display()
    );
    let url = format!("{}?schema=secrets", server.url());
    let mut runner = Proc::spawn(
        leasehold()
            .args(["run", "-e", "e", "--ttl", "5s", "-vvv"])
            .env("LEASEHOLD_STORE", &url)
            .args(["--", "sh", "-c", &script])
            .env("LEASEHOLD_STORE_PASSWORD", SECRET)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    );
    assert!(
        wait_until(Duration::from_secs(30), || env_file.exists()),
        "the command did not start"
    );
    let env = std::fs::read_to_string(&env_file).expect("env");
    assert!(env.contains("LEASEHOLD_TOKEN="), "{env}");
    assert!(!env.contains("LEASEHOLD_STORE"), "{env}");
    assert!(!env.contains("Sup3r"), "{env}");
    // run, its guard, the command: no command line holds the password.
    let mut pids = vec![runner.pid()];
    let mut i = 0;
    while i < pids.len() {
        pids.extend(children_of(pids[i]));
        i += 1;
    }
    assert!(pids.len() >= 3, "run, guard and command: {pids:?}");
    for pid in &pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("Sup3r"),
            "pid {pid}'s command line shows the password"
        );
    }
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(runner.wait_for_exit(Duration::from_secs(20)).is_some());
    let mut stderr = String::new();
    if let Some(mut pipe) = runner.child.stderr.take() {
        use std::io::Read;
        pipe.read_to_string(&mut stderr).expect("stderr");
    }
    assert!(stderr.contains("leader"), "{stderr}");
    assert!(
        !stderr.contains("Sup3r"),
        "-vvv logs show the password: {stderr}"
    );
}

/// Runs `status` with `--log-format json` and `store` (and
/// `LEASEHOLD_STORE_PASSWORD` if given): it exits 2 with exactly one line
/// on stderr, a JSON error event whose message names `needle` and never
/// shows the password.
fn one_json_error(store: &str, password_env: Option<&str>, needle: &str) {
    let mut cmd = leasehold();
    cmd.args([
        "--log-format",
        "json",
        "status",
        "-e",
        "x",
        "--store",
        store,
    ]);
    if let Some(password) = password_env {
        cmd.env("LEASEHOLD_STORE_PASSWORD", password);
    }
    let out = cmd.output().expect("leasehold runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(line["level"], "ERROR", "{err}");
    assert!(
        line["message"].as_str().is_some_and(|m| m.contains(needle)),
        "{err}"
    );
    assert!(!err.contains("Sup3r"), "{err}");
}

/// With `--log-format json`, the line that says why leasehold exits is a
/// JSON line too, and holds no password.
#[test]
fn the_reason_for_exiting_is_a_json_line_under_the_json_log_format() {
    one_json_error(
        "etcd://app@127.0.0.1:1/p",
        Some(""),
        "LEASEHOLD_STORE_PASSWORD is empty",
    );
}

/// A URL refused while the arguments are read (before logging is set
/// up) is a JSON line too under `--log-format json`.
#[test]
fn a_refused_url_is_a_json_line_under_the_json_log_format() {
    one_json_error(
        "zk://app:Sup3rSecret@127.0.0.1:1/p?foo=bar",
        None,
        "unknown option \"foo\"",
    );
}

/// Reads a client's startup message from `stream`, first answering "no"
/// to a request for TLS.
fn read_startup(stream: &mut std::net::TcpStream) -> std::io::Result<()> {
    use std::io::{Read, Write};
    const SSL_REQUEST: [u8; 4] = 80_877_103u32.to_be_bytes();
    let mut head = [0u8; 8];
    stream.read_exact(&mut head)?;
    if head[4..] == SSL_REQUEST {
        stream.write_all(b"N")?;
        stream.read_exact(&mut head)?;
    }
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let len = usize::try_from(len).unwrap_or(0);
    stream.read_exact(&mut vec![0u8; len.saturating_sub(8)])
}

/// A stand-in for a PostgreSQL server that wants a password: to every
/// startup message it answers "send your password in clear"
/// (`AuthenticationCleartextPassword`). It counts the connections that
/// got that far.
fn a_server_asking_for_a_password() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&asked);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            if read_startup(&mut stream).is_ok()
                && stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).is_ok()
            {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            // Until the client hangs up.
            let _ = stream.read_to_end(&mut Vec::new());
        }
    });
    (port, asked)
}

/// A PostgreSQL URL with a user and no password is not refused up front
/// (trust, peer and certificate authentication need none): only a server
/// that asks for one tells it is missing. That is then exit 2 — after
/// connecting — in one line saying where to give it.
#[test]
fn a_password_the_server_asks_for_is_found_missing_on_connecting() {
    let (port, asked) = a_server_asking_for_a_password();
    for args in [
        &["status", "-e", "x"][..],
        &["campaign", "-e", "x", "--ttl", "5s"],
        &["run", "-e", "x", "--ttl", "5s", "--", "true"],
    ] {
        let before = asked.load(std::sync::atomic::Ordering::SeqCst);
        let output = leasehold()
            .args(args)
            .env(
                "LEASEHOLD_STORE",
                format!("postgres://app@127.0.0.1:{port}/db"),
            )
            .output()
            .expect("leasehold runs");
        let text = all_output(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: {text}");
        assert!(
            text.contains("invalid store credentials: ")
                && text.contains("the server asks for a password and none is given")
                && text.contains("LEASEHOLD_STORE_PASSWORD"),
            "{args:?}: {text}"
        );
        assert!(
            asked.load(std::sync::atomic::Ordering::SeqCst) > before,
            "{args:?}: refused before the server asked: {text}"
        );
    }
}
