//! What the process-level benchmarks share: a supervised command whose
//! output lines are timestamped on arrival, and summary statistics.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A supervisor process (`leasehold run`, `etcdctl lock`) whose command
/// prints lines; each line is stamped when it arrives here.
pub struct Replica {
    pub child: Child,
    pub lines: Receiver<(Instant, String)>,
}

impl Replica {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn a replica");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Replica { child, lines }
    }

    /// `leasehold run` of `election` on `store`, running `script` under sh.
    pub fn leasehold(store: &str, election: &str, id: &str, ttl: &str, script: &str) -> Self {
        Replica::leasehold_of(
            env!("CARGO_BIN_EXE_leasehold"),
            store,
            election,
            id,
            ttl,
            script,
        )
    }

    /// The same with the `leasehold` executable at `bin` (another build, to
    /// compare).
    pub fn leasehold_of(
        bin: &str,
        store: &str,
        election: &str,
        id: &str,
        ttl: &str,
        script: &str,
    ) -> Self {
        let mut command = Command::new(bin);
        command
            .args([
                "run",
                "-q",
                "--election",
                election,
                "--id",
                id,
                "--ttl",
                ttl,
            ])
            .args(["--store", store, "--", "sh", "-c", script]);
        Replica::spawn(command)
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    pub fn signal(&self, signal: Signal) {
        let _ = kill(self.pid(), signal);
    }

    /// The next line whose text contains `needle`, with its arrival time.
    pub fn line_with(&self, needle: &str, limit: Duration) -> Option<(Instant, String)> {
        let until = Instant::now() + limit;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(needle) => return Some((at, line)),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a process runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// In-process: `n` concurrent campaigns on `store`, each on its own
/// session; the time until the first is granted, then each resign → next
/// grant down the line.
pub async fn library(store: Arc<dyn leasehold::Store>, n: usize) -> (Duration, Vec<Duration>) {
    let election =
        leasehold::ElectionName::new(format!("lib-{n}-{}", leasehold::clock::host_monotonic_ns()))
            .expect("name");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let t0 = Instant::now();
    for i in 0..n {
        let (store, election, tx) = (Arc::clone(&store), election.clone(), tx.clone());
        tokio::spawn(async move {
            let grant = leasehold::testing::campaign_on_new_session(
                &*store,
                &election,
                &format!("c{i}"),
                Duration::from_secs(30),
            )
            .await;
            let _ = tx.send((Instant::now(), grant));
        });
    }
    let (first_at, mut grant) = rx.recv().await.expect("a first grant");
    let first = first_at - t0;
    let mut handovers = Vec::new();
    for _ in 1..n {
        let released = Instant::now();
        store.resign(&grant).await.expect("resign");
        let (at, next) = rx.recv().await.expect("the next grant");
        handovers.push(at - released);
        grant = next;
    }
    let _ = store.close_session(grant.session).await;
    (first, handovers)
}

/// The status code of one `GET path` to `at`, on a connection of its own.
pub fn http_code(at: std::net::SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(at).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The value after `name` on the command line, if any.
pub fn arg_text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}
