//! Running leasehold in production: `tune`, `run --http`, logs, `--version`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::harness::{Proc, Scratch, leasehold, status_json, stderr, wait_until};

const SECOND: Duration = Duration::from_secs(1);

fn tune(args: &[&str]) -> std::process::Output {
    leasehold()
        .arg("tune")
        .args(args)
        .output()
        .expect("spawn leasehold tune")
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Worked example 3: R = 3 s, J = 1 s, S = 500 ms → a TTL in 10–15 s, with
/// the aggressive end shown as unsafe.
#[test]
fn tune_recommends_a_ttl_for_worked_example_3() {
    let out = tune(&[
        "--renew-every",
        "3s",
        "--jitter",
        "1s",
        "--skew",
        "500ms",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let ttl = v["recommended_ttl_ms"]
        .as_u64()
        .expect("recommended_ttl_ms");
    assert!((10_000..=15_000).contains(&ttl), "{v}");
    assert_eq!(
        v["recommended"]["worst_case_failover_ms"].as_u64(),
        Some(ttl + 2000),
        "{v}"
    );
    let alternatives = v["alternatives"].as_array().expect("alternatives");
    assert!(alternatives.iter().any(|a| a["verdict"] == "unsafe"), "{v}");
    assert!(
        alternatives
            .iter()
            .any(|a| a["ttl_ms"].as_u64() > Some(ttl) && a["verdict"] == "tolerant"),
        "{v}"
    );
    let human = tune(&["--renew-every", "3s", "--jitter", "1s", "--skew", "500ms"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains(&format!("Recommended TTL: {}s", ttl / 1000)),
        "{text}"
    );
}

#[test]
fn tune_judges_a_proposed_ttl() {
    let base = ["--renew-every", "3s", "--jitter", "1s", "--skew", "500ms"];
    // The worked example's aggressive 4 s: unsafe, exit 3, explained.
    let out = tune(&[&base[..], &["--ttl", "4s"]].concat());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("TTL 4s: UNSAFE"), "{text}");
    assert!(text.contains("half the TTL"), "{text}");
    // The conservative 15 s: fine.
    let out = tune(&[&base[..], &["--ttl", "15s", "--json"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["evaluated"]["verdict"], "tolerant", "{v}");
    assert_eq!(v["evaluated"]["ttl_ms"], 15_000, "{v}");
    // R well below T/2, but jitter leaves room for a single renewal only.
    let out = tune(&["--renew-every", "4s", "--jitter", "1s", "--ttl", "9s"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fragile"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // --ttl alone renews every third of it.
    let out = tune(&["--ttl", "3s", "--jitter", "2s", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(json(&out)["renew_every_ms"], 1000);
}

#[test]
fn tune_refuses_bad_values_in_one_line() {
    for (args, needle) in [
        (
            &["--renew-every", "-3s", "--jitter", "1s"][..],
            "cannot be negative",
        ),
        (
            &["--renew-every", "3s", "--jitter", "-1s"],
            "cannot be negative",
        ),
        (&["--renew-every", "3s", "--jitter", "soon"], "--jitter"),
        (
            &["--renew-every", "soon", "--jitter", "1s"],
            "--renew-every",
        ),
        (
            &["--renew-every", "0s", "--jitter", "1s"],
            "greater than zero",
        ),
        (&["--jitter", "1s"], "--renew-every"),
        (&["--renew-every", "3s"], "--jitter"),
        (&["--renew-every", "3s", "--measure", "0"], "--measure"),
    ] {
        let out = tune(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `--measure` renews a real session and uses the observed p99 as jitter.
#[test]
fn tune_measures_renewals_against_the_store() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let out = tune(&[
        "--store",
        &store,
        "--measure",
        "50",
        "--renew-every",
        "1s",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["measured"]["samples"], 50, "{v}");
    let p99 = v["measured"]["p99_ms"].as_f64().expect("p99");
    assert!(p99 > 0.0, "{v}");
    assert_eq!(v["jitter_ms"].as_f64(), Some(p99), "{v}");
    // The measuring session is closed: nothing is left in the store.
    let list = leasehold()
        .args(["list", "--json", "--store", &store])
        .output()
        .expect("list");
    assert_eq!(json(&list), serde_json::json!([]));
    // A store that cannot be used is a runtime failure.
    std::fs::write(scratch.path("notes.txt"), "not a database").expect("write");
    let out = tune(&[
        "--store",
        &format!("sqlite:{}", scratch.path("notes.txt").display()),
        "--measure",
        "5",
        "--renew-every",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A plain HTTP/1.1 GET: status code and body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, SECOND).ok()?;
    stream.set_read_timeout(Some(5 * SECOND)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The value of the sample `name{…}` in Prometheus text.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.starts_with(name)
                && l[name.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c == '{' || c == ' ')
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn runner_with_http(scratch: &Scratch, id: &str, addr: SocketAddr, ttl: &str) -> Proc {
    Proc::spawn(
        leasehold()
            .args(["run", "--election", "billing", "--id", id, "--ttl", ttl])
            .args(["--http", &addr.to_string()])
            .args(["--store", &scratch.store_url(), "--", "sleep", "600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Scrapes a leader and a follower, hands over with SIGTERM, and makes the
/// new leader's renewals fail to see the step-down counted by reason.
#[test]
fn run_serves_status_healthz_and_metrics() {
    let scratch = Scratch::new();
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = runner_with_http(&scratch, "a", addr_a, "2s");
    assert!(wait_until(10 * SECOND, || {
        get(addr_a, "/status").is_some_and(|(_, body)| body.contains("\"is_leader\":true"))
    }));
    let b = runner_with_http(&scratch, "b", addr_b, "2s");
    assert!(wait_until(10 * SECOND, || get(addr_b, "/healthz").is_some()));

    let (code, body) = get(addr_a, "/status").expect("status");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(v["election"], "billing");
    assert_eq!(v["leader"]["id"], "a");
    assert_eq!(v["leader"]["token"], 1);
    assert!(v["leader"]["expires_in_ms"].as_u64().is_some(), "{v}");
    assert_eq!(v["is_leader"], true);
    let (code, body) = get(addr_b, "/status").expect("status");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(
        (v["leader"]["id"].clone(), v["is_leader"].clone()),
        ("a".into(), false.into())
    );
    assert_eq!(get(addr_a, "/healthz"), Some((200, "ok\n".into())));
    assert_eq!(get(addr_a, "/nowhere").map(|r| r.0), Some(404));

    // Renewals every ~667 ms: wait for one in the histogram.
    assert!(wait_until(10 * SECOND, || {
        get(addr_a, "/metrics")
            .and_then(|(_, m)| sample(&m, "leasehold_renewal_duration_seconds_count"))
            .is_some_and(|n| n >= 1.0)
    }));
    let (code, m) = get(addr_a, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        m.contains(r#"leasehold_is_leader{election="billing",candidate="a"} 1"#),
        "{m}"
    );
    assert_eq!(sample(&m, "leasehold_fencing_token"), Some(1.0), "{m}");
    assert_eq!(
        sample(&m, "leasehold_leadership_transitions_total"),
        Some(1.0),
        "{m}"
    );
    let left = sample(&m, "leasehold_lease_remaining_seconds").expect("lease left");
    assert!(left > 0.0 && left <= 2.0, "{m}");
    assert!(m.ends_with("# EOF\n"), "{m}");
    let (_, m) = get(addr_b, "/metrics").expect("metrics");
    assert_eq!(sample(&m, "leasehold_is_leader"), Some(0.0), "{m}");
    assert_eq!(
        sample(&m, "leasehold_lease_remaining_seconds"),
        Some(0.0),
        "{m}"
    );

    // Handover: b leads with token 2.
    a.signal(Signal::SIGTERM);
    assert!(wait_until(10 * SECOND, || {
        get(addr_b, "/metrics")
            .and_then(|(_, m)| sample(&m, "leasehold_is_leader"))
            .is_some_and(|v| v == 1.0)
    }));
    let (_, m) = get(addr_b, "/metrics").expect("metrics");
    assert_eq!(sample(&m, "leasehold_fencing_token"), Some(2.0), "{m}");

    // Renewals fail while another process holds the SQLite write lock: b
    // steps down (at risk), counts the failures, and leads again after.
    {
        let db = rusqlite::Connection::open(scratch.path("leasehold.db")).expect("open");
        db.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        assert!(wait_until(10 * SECOND, || {
            get(addr_b, "/metrics").is_some_and(|(_, m)| {
                sample(&m, "leasehold_step_downs_total").is_some()
                    && sample(&m, "leasehold_renewal_failures_total").is_some_and(|n| n >= 1.0)
            })
        }));
        db.execute_batch("ROLLBACK").expect("unlock");
    }
    let (_, m) = get(addr_b, "/metrics").expect("metrics");
    assert!(
        m.contains(r#"leasehold_step_downs_total{election="billing",candidate="b",reason="at_risk"} 1"#)
            || m.contains(r#"leasehold_step_downs_total{election="billing",candidate="b",reason="deadline_expired"} 1"#),
        "{m}"
    );
    assert!(
        sample(&m, "leasehold_renewal_failures_total").is_some_and(|n| n >= 1.0),
        "{m}"
    );
    assert!(wait_until(15 * SECOND, || {
        get(addr_b, "/metrics")
            .and_then(|(_, m)| sample(&m, "leasehold_leadership_transitions_total"))
            .is_some_and(|n| n >= 3.0)
    }));
    drop(b);
}

#[test]
fn a_taken_http_port_is_a_clear_error_before_campaigning() {
    let scratch = Scratch::new();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = leasehold()
        .args(["run", "--election", "billing", "--http", &addr])
        .args(["--store", &scratch.store_url(), "--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot serve HTTP on {addr}")),
        "{err}"
    );
    assert!(err.contains("choose another port"), "{err}");
    assert!(!err.contains("leading"), "campaigned anyway: {err}");
    assert_eq!(
        status_json(&scratch.store_url(), "billing")["leader"],
        Value::Null
    );

    let out = leasehold()
        .args(["run", "--election", "billing", "--http", "localhost"])
        .args(["--store", &scratch.store_url(), "--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--http"), "{}", stderr(&out));
}

#[test]
fn run_warns_when_the_lease_margin_is_thin() {
    let scratch = Scratch::new();
    let run = |ttl: &str, every: &str| {
        leasehold()
            .args([
                "run",
                "--election",
                "e",
                "--ttl",
                ttl,
                "--renew-every",
                every,
            ])
            .args(["--store", &scratch.store_url(), "--", "true"])
            .output()
            .expect("spawn")
    };
    // V = 1s·0.99 − 100ms = 890 ms: the second renewal, sent at 890 ms,
    // can never confirm in time.
    let out = run("1s", "445ms");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("thin lease margin"),
        "{}",
        stderr(&out)
    );
    let out = run("2s", "600ms");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("thin lease margin"),
        "{}",
        stderr(&out)
    );
    // A period above half the validity is shortened, and `run` says so.
    let out = run("1s", "450ms");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("renewing more often than configured"),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("thin lease margin"),
        "{}",
        stderr(&out)
    );
}

/// JSON logs: one object per line; leadership changes carry the election,
/// candidate, numeric token and reason.
#[test]
fn json_logs_name_election_candidate_token_and_reason() {
    let scratch = Scratch::new();
    let out = leasehold()
        .args([
            "--log-format",
            "json",
            "run",
            "--election",
            "e",
            "--id",
            "me",
        ])
        .args(["--store", &scratch.store_url(), "--", "true"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let started = lines
        .iter()
        .find(|l| l["message"] == "leading; command started")
        .expect("leading line");
    assert_eq!(
        (&started["election"], &started["id"], &started["token"]),
        (&"e".into(), &"me".into(), &1.into())
    );
    let released = lines
        .iter()
        .find(|l| l["message"] == "election released")
        .expect("release line");
    assert_eq!(released["reason"], "command exited");
    assert_eq!(released["token"], 1);
    assert_eq!(released["level"], "INFO");

    // -q: errors only.
    let out = leasehold()
        .args(["-q", "run", "--election", "e"])
        .args(["--store", &scratch.store_url(), "--", "true"])
        .output()
        .expect("spawn");
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
    let out = leasehold()
        .args(["--log-format", "xml", "list"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn version_and_help() {
    let out = leasehold().arg("--version").output().expect("spawn");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("leasehold {}", env!("CARGO_PKG_VERSION"))
    );
    for sub in ["run", "status", "observe", "list", "campaign", "tune"] {
        let out = leasehold().args([sub, "--help"]).output().expect("spawn");
        assert!(out.status.success(), "{sub}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: leasehold"), "{sub}: {text}");
        assert!(text.contains("--store"), "{sub}: {text}");
    }
    let out = leasehold().args(["run", "--help"]).output().expect("spawn");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "[default: 15s]",
        "[default: 5s]",
        "[default: a third of --ttl]",
        "--http",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}
