//! A real etcd cluster for tests and benchmarks: Debian's `etcd` binary,
//! members on free loopback ports in a temporary folder, stopped by process
//! id when dropped (also when a test panics). [`EtcdCluster::start_secured`]
//! starts one member serving TLS, requiring client certificates, with
//! etcd's authentication (RBAC) on.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{CertFiles, TestCa, Usage};

/// One member's process and addresses.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health` and `/metrics`, whatever the client URLs are.
    metrics_port: u16,
    process: Option<Child>,
}

/// The TLS files and settings of a secured cluster.
#[derive(Clone, Debug)]
struct Secured {
    /// The CA the member trusts for client certificates (a copy, so that
    /// a rotation can replace it).
    trusted_ca: PathBuf,
    /// The member's certificate and key.
    server: CertFiles,
    /// `root`'s client certificate (common name `root`), for `etcdctl`.
    admin: CertFiles,
    token_ttl: Option<Duration>,
}

/// A running etcd cluster on 127.0.0.1.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    token: String,
    secured: Option<Secured>,
    timing: Timing,
}

/// The members' raft heartbeat and election timeout, in milliseconds.
#[derive(Clone, Copy, Debug)]
struct Timing {
    heartbeat_ms: u64,
    election_ms: u64,
}

/// A tenth of etcd's defaults: a killed or cut-off leader is replaced
/// within about half a second, which fault tests wait for. Under a loaded
/// machine such a cluster can also lose its leader with no fault at all.
const FAST: Timing = Timing {
    heartbeat_ms: 50,
    election_ms: 500,
};

/// etcd's own defaults, for a cluster that many tests share and none
/// faults: a member starved of CPU for a few hundred milliseconds (the
/// whole suite runs beside it) does not start an election.
const STEADY: Timing = Timing {
    heartbeat_ms: 100,
    election_ms: 1000,
};

/// How many times a cluster is started on fresh ports before giving up:
/// a port found free can still be taken by a concurrent test's server
/// before a member binds it, and the member then exits at once.
const START_ATTEMPTS: usize = 3;

impl EtcdCluster {
    /// Starts `size` members and waits until the cluster serves requests.
    /// Panics with a clear message if `etcd` is not installed or does not
    /// come up (this is test support).
    /// Its members elect a new raft leader quickly (for fault tests).
    pub fn start(size: usize) -> Self {
        Self::start_on_fresh_ports(size, None, FAST)
    }

    /// Starts `size` members with etcd's default raft timings: for a
    /// cluster shared by many tests, which no test faults.
    pub fn start_steady(size: usize) -> Self {
        Self::start_on_fresh_ports(size, None, STEADY)
    }

    /// Starts the members on fresh ports and folders, again after a
    /// member that did not come up (its port taken), up to
    /// [`START_ATTEMPTS`] times.
    fn start_on_fresh_ports(size: usize, secured: Option<&Secured>, timing: Timing) -> Self {
        let mut attempt = 1;
        loop {
            let mut cluster = Self::unstarted(size, secured.cloned(), timing);
            for i in 0..size {
                cluster.spawn(i, "new");
            }
            match cluster.try_wait_ready(Duration::from_secs(30)) {
                Ok(()) => return cluster,
                Err(why) if attempt < START_ATTEMPTS => {
                    eprintln!("etcd cluster start, attempt {attempt}: {why}; again on other ports");
                    attempt += 1;
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn unstarted(size: usize, secured: Option<Secured>, timing: Timing) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-etcd-{}-{}",
            std::process::id(),
            crate::monotonic_ns()
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster folder");
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: crate::free_port(),
                peer_port: crate::free_port(),
                metrics_port: crate::free_port(),
                process: None,
            })
            .collect();
        EtcdCluster {
            token: format!("leasehold-{}", crate::monotonic_ns()),
            dir,
            members,
            secured,
            timing,
        }
    }

    /// Starts one member that serves TLS with a certificate of `ca`
    /// (issued into `dir`), requires a client certificate signed by `ca`
    /// (`--client-cert-auth`), and has authentication on: the user `root`
    /// (role `root`) exists, and `etcdctl` ([`EtcdCluster::etcdctl`]) acts
    /// as root by its certificate's common name. `token_ttl`: etcd's
    /// `--auth-token-ttl` (300 s when `None`).
    pub fn start_secured(dir: &Path, ca: &TestCa, token_ttl: Option<Duration>) -> Self {
        let trusted_ca = dir.join("etcd-trusted-ca.pem");
        std::fs::copy(ca.ca_path(), &trusted_ca).expect("copy the CA");
        let secured = Secured {
            trusted_ca,
            server: ca.issue("etcd-server", "etcd", Usage::Server, false),
            admin: ca.issue("etcd-root", "root", Usage::Client, false),
            token_ttl,
        };
        let cluster = Self::start_on_fresh_ports(1, Some(&secured), FAST);
        let password = format!("root-{}", crate::monotonic_ns());
        cluster.etcdctl(&[
            "user",
            "add",
            &format!("root:{password}"),
            "--interactive=false",
        ]);
        cluster.etcdctl(&["auth", "enable"]);
        cluster
    }

    /// Adds the user `user` with `password` and a role of the same name
    /// granted `readwrite` on the keys starting with `prefix` (none if
    /// `None`): `etcdctl role grant-permission ROLE readwrite
    /// --prefix=true PREFIX`.
    pub fn add_user(&self, user: &str, password: &str, prefix: Option<&str>) {
        self.etcdctl(&["role", "add", user]);
        if let Some(prefix) = prefix {
            self.etcdctl(&[
                "role",
                "grant-permission",
                user,
                "readwrite",
                "--prefix=true",
                prefix,
            ]);
        }
        self.etcdctl(&[
            "user",
            "add",
            &format!("{user}:{password}"),
            "--interactive=false",
        ]);
        self.etcdctl(&["user", "grant-role", user, user]);
    }

    /// Runs Debian's `etcdctl` (API 3) against the cluster, as `root` on a
    /// secured one; its standard output. Panics if it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.etcdctl_on(&self.client_urls(), args)
    }

    /// A rotation on a secured cluster: stops the member, gives it a new
    /// certificate of `ca` and trusts `ca` alone (the old CA no more), and
    /// starts it again; `root`'s certificate is reissued too.
    pub fn rotate(&mut self, ca: &TestCa) {
        let Some(secured) = &self.secured else {
            panic!("rotate: the cluster is not secured");
        };
        let trusted_ca = secured.trusted_ca.clone();
        self.kill(0);
        let _ = ca.issue("etcd-server", "etcd", Usage::Server, false);
        let _ = ca.issue("etcd-root", "root", Usage::Client, false);
        std::fs::copy(ca.ca_path(), &trusted_ca).expect("copy the CA");
        self.restart(0);
        self.wait_ready(Duration::from_secs(30));
    }

    fn scheme(&self) -> &'static str {
        if self.secured.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn client_urls(&self) -> Vec<String> {
        self.endpoints()
            .iter()
            .map(|e| format!("{}://{e}", self.scheme()))
            .collect()
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let scheme = self.scheme();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .expect("member log file");
        let mut command = Command::new("etcd");
        if let Some(secured) = &self.secured {
            command
                .arg("--client-cert-auth")
                .arg(format!(
                    "--trusted-ca-file={}",
                    secured.trusted_ca.display()
                ))
                .arg(format!("--cert-file={}", secured.server.cert.display()))
                .arg(format!("--key-file={}", secured.server.key.display()));
            if let Some(ttl) = secured.token_ttl {
                command.arg(format!("--auth-token-ttl={}", ttl.as_secs().max(1)));
            }
        }
        let child = command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .arg(format!(
                "--listen-client-urls={scheme}://127.0.0.1:{}",
                member.client_port
            ))
            .arg(format!(
                "--advertise-client-urls={scheme}://127.0.0.1:{}",
                member.client_port
            ))
            .arg(format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                member.metrics_port
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
            .arg(format!("--heartbeat-interval={}", self.timing.heartbeat_ms))
            .arg(format!("--election-timeout={}", self.timing.election_ms))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("cannot start etcd: install Debian's etcd-server package (scripts/test does)");
        self.members[i].process = Some(child);
    }

    /// Waits until every running member answers `/health` with true;
    /// panics if one has not within `limit` or exited.
    pub fn wait_ready(&mut self, limit: Duration) {
        if let Err(why) = self.try_wait_ready(limit) {
            panic!("{why}");
        }
    }

    fn try_wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        let dir = self.dir.display().to_string();
        for member in self.members.iter_mut() {
            let Some(process) = member.process.as_mut() else {
                continue;
            };
            while !http_get(member.metrics_port, "/health").is_some_and(|b| b.contains("true")) {
                if let Ok(Some(status)) = process.try_wait() {
                    member.process = None;
                    let log = std::fs::read_to_string(format!("{dir}/{}.log", member.name))
                        .unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    return Err(format!(
                        "etcd member {} exited ({status}) before it was healthy; its log ends: {}",
                        member.name,
                        tail.join(" | ")
                    ));
                }
                if Instant::now() >= until {
                    return Err(format!(
                        "etcd member {} did not become healthy within {limit:?}; see {dir}",
                        member.name
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// `host:port` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The folder holding the members' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
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
            .filter_map(|m| http_get(m.metrics_port, "/metrics"))
            .flat_map(|body| {
                body.lines()
                    .filter(|l| l.starts_with(series))
                    .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

impl EtcdCluster {
    /// Whether member `i` runs (was not killed, or was started again).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process.is_some()
    }

    /// The client URLs of the members that run.
    fn running_endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .filter(|&i| self.is_running(i))
            .map(|i| self.client_url(i))
            .collect()
    }

    /// Runs `etcdctl` (API 3) against `endpoints` (URLs) only, as `root`
    /// on a secured cluster; its standard output. Panics if it fails.
    fn etcdctl_on(&self, endpoints: &[String], args: &[&str]) -> String {
        self.try_etcdctl_on(endpoints, args)
            .unwrap_or_else(|why| panic!("etcdctl {endpoints:?} {args:?}: {why}"))
    }

    /// [`EtcdCluster::etcdctl_on`], its standard error if it fails.
    fn try_etcdctl_on(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")));
        if let Some(secured) = &self.secured {
            command
                .arg(format!("--cacert={}", secured.trusted_ca.display()))
                .arg(format!("--cert={}", secured.admin.cert.display()))
                .arg(format!("--key={}", secured.admin.key.display()));
        }
        let out = command
            .args(args)
            .output()
            .expect("etcdctl (Debian's etcd-client) runs");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Member `i`'s client URL.
    fn client_url(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// The cluster's current revision: a linearizable read through the
    /// members that run.
    pub fn revision(&self) -> i64 {
        let out = self.etcdctl_on(
            &self.running_endpoints(),
            &["get", "/leasehold-test-revision-probe", "-w", "json"],
        );
        json_number(&out, "revision")
            .and_then(|r| i64::try_from(r).ok())
            .unwrap_or_else(|| panic!("no revision in etcdctl's answer: {out}"))
    }

    /// Member `i`'s own revision (what it has applied, read from that
    /// member alone: `etcdctl endpoint status`).
    pub fn member_revision(&self, i: usize) -> i64 {
        let out = self.etcdctl_on(&[self.client_url(i)], &["endpoint", "status", "-w", "json"]);
        json_number(&out, "revision")
            .and_then(|r| i64::try_from(r).ok())
            .unwrap_or_else(|| panic!("no revision in etcdctl's answer: {out}"))
    }

    /// The member that is the raft leader now, as the members that run
    /// report it; `None` while they have none or do not agree.
    pub fn raft_leader(&self) -> Option<usize> {
        let mut leader = None;
        for i in (0..self.members.len()).filter(|&i| self.is_running(i)) {
            let out = self
                .try_etcdctl_on(&[self.client_url(i)], &["endpoint", "status", "-w", "json"])
                .ok()?;
            let (me, theirs) = (
                json_number(&out, "member_id")?,
                json_number(&out, "leader")?,
            );
            if me == theirs {
                if leader.is_some() {
                    return None;
                }
                leader = Some(i);
            }
        }
        leader
    }

    /// Puts `value` at `key` through the members that run; the revision
    /// of the write.
    pub fn put(&self, key: &str, value: &str) -> i64 {
        let out = self.etcdctl_on(
            &self.running_endpoints(),
            &["put", key, value, "-w", "json"],
        );
        json_number(&out, "revision")
            .and_then(|r| i64::try_from(r).ok())
            .unwrap_or_else(|| panic!("no revision in etcdctl's answer: {out}"))
    }

    /// Compacts the key-value history up to `revision` (`etcdctl
    /// compaction --physical`), and waits until every member that runs
    /// has applied the compaction (a read of that member alone at an
    /// earlier revision is refused): a watch from an earlier revision is
    /// then refused as compacted, whichever member it reaches.
    pub fn compact(&self, revision: i64) {
        self.etcdctl_on(
            &self.running_endpoints(),
            &["compaction", "--physical", &revision.to_string()],
        );
        if revision <= 1 {
            return;
        }
        let earlier = format!("--rev={}", revision - 1);
        let until = Instant::now() + Duration::from_secs(30);
        for i in (0..self.members.len()).filter(|&i| self.is_running(i)) {
            let probe = ["get", "/", earlier.as_str(), "--consistency=s"];
            loop {
                match self.try_etcdctl_on(&[self.client_url(i)], &probe) {
                    Err(why) if why.contains("compacted") => break,
                    other => assert!(
                        Instant::now() < until,
                        "member {} has not applied the compaction at {revision}: {other:?}",
                        self.members[i].name
                    ),
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Defragments every member that runs, one at a time (`etcdctl
    /// defrag`; a member answers nothing while it defragments).
    pub fn defrag(&self) {
        for i in (0..self.members.len()).filter(|&i| self.is_running(i)) {
            self.etcdctl_on(&[self.client_url(i)], &["defrag"]);
        }
    }

    /// Replaces member `i` by a new one with an empty data folder, as an
    /// operator replaces a member whose disk died: SIGKILLs it,
    /// removes it from the cluster (`etcdctl member remove`), wipes its
    /// data folder, adds a new member of the same name on a new peer port
    /// (`etcdctl member add`) and starts it with
    /// `--initial-cluster-state existing`, on the same client port, so
    /// that clients given the old endpoint reach the new member. Waits
    /// until it is healthy (it has caught up with the cluster's log).
    pub fn replace(&mut self, i: usize) {
        self.kill(i);
        let others: Vec<String> = (0..self.members.len())
            .filter(|&j| j != i && self.is_running(j))
            .map(|j| self.client_url(j))
            .collect();
        let name = self.members[i].name.clone();
        // A reconfiguration is refused while the cluster elects a leader,
        // and (etcd's `--strict-reconfig-check`) until its leader has been
        // connected to a quorum for 5 s; one whose answer was lost may
        // have been made all the same. So: until `member list` shows it
        // made, at most 30 s.
        let until = Instant::now() + Duration::from_secs(30);
        let listed = |cluster: &Self| loop {
            match cluster.try_etcdctl_on(&others, &["member", "list"]) {
                Ok(listed) => return listed,
                Err(why) if Instant::now() < until => {
                    eprintln!("etcdctl member list: {why}; again");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(why) => panic!("etcdctl member list: {why}"),
            }
        };
        let old_peer = format!("http://127.0.0.1:{}", self.members[i].peer_port);
        loop {
            let list = listed(self);
            // `ID, status, name, peer URLs, client URLs, is learner`
            let Some(id) = list
                .lines()
                .map(|line| line.split(", ").collect::<Vec<_>>())
                .find(|fields| fields.get(3) == Some(&old_peer.as_str()))
                .and_then(|fields| fields.first().map(|id| (*id).to_owned()))
            else {
                break;
            };
            if let Err(why) = self.try_etcdctl_on(&others, &["member", "remove", &id]) {
                assert!(Instant::now() < until, "etcdctl member remove: {why}");
                eprintln!("etcdctl member remove: {why}; again");
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        let data = self.dir.join(&name);
        if data.exists() {
            std::fs::remove_dir_all(&data).expect("wipe the member's data folder");
        }
        self.members[i].peer_port = crate::free_port();
        let peer = format!("http://127.0.0.1:{}", self.members[i].peer_port);
        while !listed(self).contains(&peer) {
            let add = [
                "member",
                "add",
                name.as_str(),
                &format!("--peer-urls={peer}"),
            ];
            if let Err(why) = self.try_etcdctl_on(&others, &add) {
                assert!(Instant::now() < until, "etcdctl member add: {why}");
                eprintln!("etcdctl member add: {why}; again");
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        self.spawn(i, "existing");
        self.wait_ready(Duration::from_secs(30));
    }
}

/// The first number after `"key":` in `json` (etcdctl's JSON output), as
/// etcdctl writes unsigned 64-bit ids and revisions.
fn json_number(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = json[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
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
