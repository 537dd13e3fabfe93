//! `leasehold sidecar` with real processes on SQLite and on a 3-member
//! etcd cluster: how fast `/leader` answers, and how soon `/watch` tells a
//! follower of a new leader.
//!
//! `cargo bench -p leasehold-cli --bench sidecar [-- --requests N --rounds N]`
//!
//! `/leader`: N requests one after another on one keep-alive connection
//! from this process, each timed from its first byte written to its last
//! byte read. `/watch`: a third sidecar's stream is open; the time from
//! just before SIGTERM to the leader's sidecar until that stream's
//! `leader` event names the new leader. Figures are percentiles; nothing
//! asserts a timing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::EtcdCluster;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;
use common::{arg, http_code, ms, percentile};

struct Sidecar {
    child: Child,
    addr: SocketAddr,
}

impl Sidecar {
    fn start(store: &str, election: &str, id: &str) -> Self {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["sidecar", "--election", election, "--id", id, "--ttl", "5s"])
            .args(["--store", store, "--http", &addr.to_string(), "-q"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the sidecar");
        Sidecar { child, addr }
    }

    /// The code of one `/leader` on a connection of its own.
    fn leader_code(&self) -> Option<u16> {
        http_code(self.addr, "/leader")
    }

    fn wait_for(&self, code: u16) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.leader_code() != Some(code) {
            assert!(Instant::now() < until, "no {code} from {}", self.addr);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        kill(Pid::from_raw(pid), signal).expect("signal");
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `requests` answers of `/leader` on one keep-alive connection.
fn leader_latency(sidecar: &Sidecar, requests: usize) -> (Vec<Duration>, Duration) {
    let stream = TcpStream::connect(sidecar.addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut samples = Vec::with_capacity(requests);
    let start = Instant::now();
    for _ in 0..requests {
        let t0 = Instant::now();
        writer
            .write_all(b"GET /leader HTTP/1.1\r\nHost: b\r\n\r\n")
            .expect("ask");
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("head");
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().expect("length");
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        samples.push(t0.elapsed());
    }
    (samples, start.elapsed())
}

/// SIGTERM to the leader's sidecar → a follower's `/watch` names the new
/// leader.
fn watch_delay(store: &str, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|round| {
            let election = format!("watch-{round}");
            let a = Sidecar::start(store, &election, "a");
            a.wait_for(200);
            let b = Sidecar::start(store, &election, "b");
            let c = Sidecar::start(store, &election, "c");
            b.wait_for(503);
            c.wait_for(503);
            std::thread::sleep(Duration::from_millis(500));
            let mut stream = TcpStream::connect(c.addr).expect("connect");
            write!(stream, "GET /watch HTTP/1.1\r\nHost: b\r\n\r\n").expect("ask");
            let mut lines = BufReader::new(stream).lines();
            // The state first: wait for the leader's line.
            for line in lines.by_ref() {
                if line.expect("line").contains("\"leader\":\"a\"") {
                    break;
                }
            }
            let t0 = Instant::now();
            a.signal(Signal::SIGTERM);
            for line in lines.by_ref() {
                let line = line.expect("line");
                if line.contains("\"leader\":\"b\"") || line.contains("\"leader\":\"c\"") {
                    return t0.elapsed();
                }
            }
            panic!("the stream ended");
        })
        .collect()
}

fn main() {
    let requests = arg("--requests", 2000);
    let rounds = arg("--rounds", 5);
    let scratch = tempfile::tempdir().expect("temp dir");
    let etcd = EtcdCluster::start(3);
    let stores = [
        (
            "sqlite",
            format!("sqlite:{}", scratch.path().join("bench.db").display()),
        ),
        ("etcd (3 members)", etcd.url("/sidecar")),
    ];
    println!("| measurement | {} | {} |", stores[0].0, stores[1].0);
    println!("|---|---|---|");
    let mut latency = Vec::new();
    let mut rate = Vec::new();
    let mut watch = Vec::new();
    for (_, store) in &stores {
        let leader = Sidecar::start(store, "latency", "a");
        leader.wait_for(200);
        let (samples, took) = leader_latency(&leader, requests);
        let fine = |p| format!("{:.2}", percentile(&samples, p).as_secs_f64() * 1e3);
        latency.push(format!("{} / {} / {}", fine(50.0), fine(99.0), fine(100.0)));
        rate.push(format!("{:.0}", requests as f64 / took.as_secs_f64()));
        drop(leader);
        let delays = watch_delay(store, rounds);
        watch.push(format!(
            "{} / {}",
            ms(percentile(&delays, 50.0)),
            ms(percentile(&delays, 100.0))
        ));
    }
    println!(
        "| `/leader`, {requests} in a row on one connection: p50 / p99 / max ms | {} | {} |",
        latency[0], latency[1]
    );
    println!(
        "| `/leader` answers per second, one client | {} | {} |",
        rate[0], rate[1]
    );
    println!(
        "| SIGTERM to the leader's sidecar → a follower's `/watch` names the new leader, {rounds} rounds: median / max ms | {} | {} |",
        watch[0], watch[1]
    );
}
