//! The GUIDE's recipes for leader-aware services, run as the GUIDE shows
//! them: the Python service behind HAProxy (`recipes/leader_service.py`,
//! `recipes/haproxy.cfg`, `recipes/haproxy_hook.py`) and the shell worker
//! (`recipes/leader_worker.sh`), each beside a real `leasehold sidecar`,
//! writing into the fenced store of worked example 2.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use leasehold_testkit::leader_fleet::{self, FleetBinaries, FleetOptions, LeaderFleet};

use super::fencing::example;
use super::harness::{Proc, Scratch, leasehold, read_lines, status_json, transferred, wait_until};
use super::operability::{free_addr, get};

const SECOND: Duration = Duration::from_secs(1);

/// What one request through the load balancer got: its code, and the
/// replica and token that served it when the code is 200.
type Served = (u16, Option<(String, u64)>);

fn served(code: u16, body: &str) -> Served {
    if code != 200 {
        return (code, None);
    }
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    let id = body["id"].as_str().expect("id").to_owned();
    (code, Some((id, body["token"].as_u64().expect("token"))))
}

/// The election's leader, as `leasehold status` sees it.
fn leader(store: &str) -> Option<String> {
    status_json(store, "web")["leader"]["id"]
        .as_str()
        .map(str::to_owned)
}

/// The recipe's three replicas behind HAProxy, with the hook, once one
/// leads and two wait in line.
fn settled_fleet(store: &str) -> LeaderFleet {
    let binaries = FleetBinaries {
        leasehold: env!("CARGO_BIN_EXE_leasehold").into(),
        fenced_store: example("fenced_store"),
    };
    let options = FleetOptions {
        store,
        election: "web",
        ttl: "3s",
        hooks: true,
        backups: true,
        hold_off_ms: 50,
    };
    let fleet = LeaderFleet::start(binaries, &options, 3);
    assert!(
        wait_until(10 * SECOND, || leader(store).is_some()),
        "{}",
        fleet.logs()
    );
    let followers = || {
        (0..3)
            .filter(|r| get(fleet.sidecar(*r), "/follower").is_some_and(|(c, _)| c == 200))
            .count()
    };
    assert!(
        wait_until(10 * SECOND, || followers() == 2),
        "{}",
        fleet.logs()
    );
    fleet
}

/// A client sending requests through `front` one after another until
/// `stop`, each answer pushed to `log`.
fn client(
    front: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Served>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let answer =
                leader_fleet::post(front, "order").map_or((0, None), |(c, b)| served(c, &b));
            log.lock().expect("log").push(answer);
        }
    })
}

/// Served one after another: the tokens never go back, each token is one
/// grant served by one replica only, `leaders` leaders served, and every
/// 200 is a write the fenced store accepted, and nothing else is.
fn assert_served_in_order(log: &[Served], leaders: usize, accepted: &[u64]) {
    let ok: Vec<(String, u64)> = log.iter().filter_map(|(_, s)| s.clone()).collect();
    assert!(ok.windows(2).all(|w| w[0].1 <= w[1].1), "{ok:?}");
    let mut by_token: HashMap<u64, &str> = HashMap::new();
    for (id, token) in &ok {
        let by = by_token.entry(*token).or_insert(id);
        assert_eq!(by, id, "token {token} served by {by} and {id}");
    }
    assert_eq!(
        by_token.len(),
        leaders,
        "{leaders} leaders served: {by_token:?}"
    );
    let tokens: Vec<u64> = ok.iter().map(|(_, t)| *t).collect();
    assert_eq!(accepted, tokens);
}

#[test]
fn haproxy_sends_each_request_to_the_leader_across_transfers_and_a_sigterm() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let fleet = settled_fleet(&store);
    let log: Arc<Mutex<Vec<Served>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let client = client(fleet.front(), stop.clone(), log.clone());
    // Served by `id`, which HAProxy alone sees up (its check asks /leader).
    let served_by = |id: &str| {
        wait_until(10 * SECOND, || {
            let log = log.lock().expect("log");
            log.last()
                .is_some_and(|(_, s)| s.as_ref().is_some_and(|(by, _)| by == id))
        }) && wait_until(10 * SECOND, || fleet.up_servers() == [id])
    };
    let first = leader(&store).expect("a leader");
    assert!(served_by(&first), "{first} never served: {}", fleet.logs());
    // Transfers to each of the two others in turn, then SIGTERM the last.
    let others: Vec<String> = (0..3)
        .map(LeaderFleet::name)
        .filter(|name| *name != first)
        .collect();
    for to in &others {
        transferred(&store, "web", to);
        assert!(served_by(to), "{to} never served: {}", fleet.logs());
    }
    let last = others.last().expect("two others");
    let replica = (0..3)
        .position(|r| LeaderFleet::name(r) == *last)
        .expect("a replica");
    fleet.signal_sidecar(replica, Signal::SIGTERM);
    assert!(
        wait_until(10 * SECOND, || leader(&store).is_some_and(|l| l != *last)),
        "nobody took over from {last}: {}",
        fleet.logs()
    );
    let next = leader(&store).expect("a leader");
    assert!(served_by(&next), "{next} never served: {}", fleet.logs());
    stop.store(true, Ordering::Relaxed);
    client.join().expect("client");
    assert_served_in_order(&log.lock().expect("log"), 4, &fleet.accepted());
    // The hooks reached HAProxy every time (it was up before the sidecars).
    let logs = fleet.logs();
    assert!(!logs.contains("hook failed"), "{logs}");
}

/// The shell worker of `recipes/leader_worker.sh` beside a sidecar at
/// `sidecar`, writing to `resource`, logging its rounds to `log`.
fn worker(sidecar: std::net::SocketAddr, resource: &str, log: &std::path::Path) -> Proc {
    let script = leader_fleet::recipes().join("leader_worker.sh");
    Proc::spawn(
        std::process::Command::new("sh")
            .arg(script)
            .env("SIDECAR", format!("http://{sidecar}"))
            .env("RESOURCE", resource)
            .env("INTERVAL", "0.05")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(log).expect("log")),
    )
}

/// `(token, status)` of each round of a worker's log that wrote.
fn rounds(log: &std::path::Path) -> Vec<(u64, u16)> {
    read_lines(log)
        .iter()
        .filter_map(|l| {
            let (token, status) = l.split_once(' ')?;
            Some((token.parse().ok()?, status.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_shell_worker_writes_only_while_leading_and_with_its_token() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let resource_addr = free_addr();
    let _fenced = Proc::spawn(
        std::process::Command::new(example("fenced_store"))
            .arg(resource_addr.to_string())
            .arg(scratch.path("fence.db"))
            .arg(scratch.path("accepted.log")),
    );
    let resource = format!("http://{resource_addr}/objects/report");
    let sidecar = |id: &str| {
        let addr = free_addr();
        let proc = Proc::spawn(
            leasehold()
                .args(["sidecar", "-e", "web", "--id", id, "--ttl", "3s"])
                .args(["--store", &store, "--http", &addr.to_string()])
                .stderr(std::fs::File::create(scratch.path(&format!("{id}.log"))).expect("log")),
        );
        (proc, addr)
    };
    let (a, a_at) = sidecar("a");
    assert!(wait_until(10 * SECOND, || get(a_at, "/leader")
        .is_some_and(|(c, _)| c == 200)));
    let (b, b_at) = sidecar("b");
    assert!(wait_until(10 * SECOND, || get(b_at, "/follower")
        .is_some_and(|(c, _)| c == 200)));
    let (a_log, b_log) = (scratch.path("a.rounds"), scratch.path("b.rounds"));
    let _a_worker = worker(a_at, &resource, &a_log);
    let _b_worker = worker(b_at, &resource, &b_log);
    assert!(wait_until(10 * SECOND, || {
        rounds(&a_log).contains(&(1, 204)) && read_lines(&b_log).iter().any(|l| l == "follower")
    }));
    transferred(&store, "web", "b");
    assert!(wait_until(10 * SECOND, || rounds(&b_log)
        .iter()
        .any(|&(token, code)| token > 1 && code == 204)));
    let a_rounds_after = read_lines(&a_log).len();
    assert!(wait_until(10 * SECOND, || {
        read_lines(&a_log)[a_rounds_after..]
            .iter()
            .any(|l| l == "follower")
    }));
    // With both sidecars gone, both workers are followers: nothing is
    // written any more.
    drop((a, b));
    let last_is_follower =
        |log: &std::path::Path| read_lines(log).last().is_some_and(|l| l == "follower");
    assert!(wait_until(10 * SECOND, || last_is_follower(&a_log)
        && last_is_follower(&b_log)));

    // Each worker wrote with its own replica's token only; every write the
    // store accepted is one a worker reported, in order.
    let (a_rounds, b_rounds) = (rounds(&a_log), rounds(&b_log));
    assert!(a_rounds.iter().all(|(t, _)| *t == 1), "{a_rounds:?}");
    let b_token = b_rounds.first().map_or(0, |(t, _)| *t);
    assert!(
        b_token > 1 && b_rounds.iter().all(|(t, _)| *t == b_token),
        "{b_rounds:?}"
    );
    let accepted: Vec<u64> = read_lines(&scratch.path("accepted.log"))
        .iter()
        .filter_map(|l| l.strip_prefix("accepted ")?.split(' ').next()?.parse().ok())
        .collect();
    let reported = a_rounds
        .iter()
        .chain(&b_rounds)
        .filter(|(_, s)| *s == 204)
        .count();
    assert!(accepted.windows(2).all(|w| w[0] <= w[1]), "{accepted:?}");
    assert_eq!(accepted.len(), reported, "{accepted:?}");
}

/// One raw request to `at`: the status code.
fn raw(at: std::net::SocketAddr, request: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(at).ok()?;
    stream.set_read_timeout(Some(10 * SECOND)).ok()?;
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split(' ').nth(1)?.parse().ok()
}

#[test]
fn the_python_service_refuses_bad_requests_and_never_calls_an_unknown_outcome_not_written() {
    let scratch = Scratch::new();
    let at = free_addr();
    let _sidecar = Proc::spawn(
        leasehold()
            .args(["sidecar", "-e", "web", "--id", "a", "--ttl", "3s"])
            .args(["--store", &scratch.store_url(), "--http", &at.to_string()])
            .stderr(std::process::Stdio::null()),
    );
    assert!(wait_until(10 * SECOND, || get(at, "/leader")
        .is_some_and(|(c, _)| c == 200)));
    // A resource that takes the write and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let resource = format!("http://{}/objects/x", silent.local_addr().expect("addr"));
    let held = std::thread::spawn(move || silent.accept().map(|(stream, _)| stream));
    let service = free_addr();
    let _service = Proc::spawn(
        std::process::Command::new(leader_fleet::python3())
            .arg(leader_fleet::recipes().join("leader_service.py"))
            .args(["--listen", &service.to_string(), "--id", "a"])
            .args([
                "--sidecar",
                &format!("http://{at}"),
                "--resource",
                &resource,
            ])
            .stderr(std::process::Stdio::null()),
    );
    assert!(wait_until(10 * SECOND, || std::net::TcpStream::connect(
        service
    )
    .is_ok()));
    let post = |headers: &str, body: &str| {
        raw(
            service,
            &format!("POST / HTTP/1.1\r\nHost: s\r\n{headers}Connection: close\r\n\r\n{body}"),
        )
    };
    assert_eq!(post("", ""), Some(411));
    assert_eq!(post("Content-Length: abc\r\n", ""), Some(400));
    assert_eq!(post("Content-Length: -1\r\n", "x"), Some(400));
    assert_eq!(post("Content-Length: 99999999999\r\n", ""), Some(413));
    // Two lengths or a chunked body could hide a second request.
    assert_eq!(
        post("Content-Length: 3\r\nContent-Length: 5\r\n", "abcde"),
        Some(400)
    );
    assert_eq!(
        post("Transfer-Encoding: chunked\r\n", "5\r\norder\r\n0\r\n\r\n"),
        Some(400)
    );
    // Sent, and no answer before the leadership answer ran out: the write
    // may have landed, so not a 503 a balancer would send again.
    assert_eq!(post("Content-Length: 5\r\n", "order"), Some(504));
    drop(held);
}
