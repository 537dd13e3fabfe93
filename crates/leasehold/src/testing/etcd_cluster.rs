//! A real etcd cluster for tests and benchmarks: Debian's `etcd` binary,
//! members on free loopback ports in a temporary folder, stopped by process
//! id when dropped (also when a test panics).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One member's process and addresses.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A running etcd cluster on 127.0.0.1.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    token: String,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdCluster {
    /// Starts `size` members and waits until the cluster serves requests.
    /// Panics with a clear message if `etcd` is not installed or does not
    /// come up (this is test support).
    pub fn start(size: usize) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-etcd-{}-{}",
            std::process::id(),
            crate::clock::host_monotonic_ns()
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster folder");
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port().expect("free port"),
                peer_port: free_port().expect("free port"),
                process: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            token: format!("leasehold-{}", crate::clock::host_monotonic_ns()),
            dir,
            members,
        };
        for i in 0..size {
            cluster.spawn(i, "new");
        }
        cluster.wait_ready(Duration::from_secs(30));
        cluster
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("{}.log", member.name)))
            .expect("member log file");
        let child = Command::new("etcd")
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{}",
                member.client_port
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{}",
                member.client_port
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                member.peer_port
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                member.peer_port
            ))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .arg(format!("--initial-cluster-state={state}"))
            .arg(format!("--initial-cluster-token={}", self.token))
            .args(["--heartbeat-interval=50", "--election-timeout=500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("cannot start etcd: install Debian's etcd-server package (scripts/test does)");
        self.members[i].process = Some(child);
    }

    /// Waits until every running member answers `/health` with true.
    pub fn wait_ready(&self, limit: Duration) {
        let until = Instant::now() + limit;
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            while !http_get(member.client_port, "/health").is_some_and(|b| b.contains("true")) {
                assert!(
                    Instant::now() < until,
                    "etcd member {} did not become healthy; see {}",
                    member.name,
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `host:port` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// A store URL for the whole cluster with `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "etcd://{}/{}",
            self.endpoints().join(","),
            prefix.trim_start_matches('/')
        )
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<i32> {
        self.members[i]
            .process
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Sends `signal` to member `i`.
    pub fn signal(&self, i: usize, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid(i) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data folder (after [`EtcdCluster::kill`]).
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
    }

    /// The sum over running members of a Prometheus counter from `/metrics`
    /// whose line starts with `series` (name and labels).
    pub fn metric_sum(&self, series: &str) -> f64 {
        self.members
            .iter()
            .filter(|m| m.process.is_some())
            .filter_map(|m| http_get(m.client_port, "/metrics"))
            .flat_map(|body| {
                body.lines()
                    .filter(|l| l.starts_with(series))
                    .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.signal(i, nix::sys::signal::Signal::SIGCONT);
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A minimal HTTP/1.0 GET on loopback; the body, or `None` on any failure.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
}
