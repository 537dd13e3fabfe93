//! The GUIDE's load-balancer recipe as real processes: replicas of a
//! leader-aware service (`recipes/leader_service.py`, each beside its own
//! `leasehold sidecar`) behind Debian's HAProxy (`recipes/haproxy.cfg`),
//! writing into the fenced object store of worked example 2. The suite's
//! recipe test and the sidecar benchmark start it the same way.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The programs a fleet runs that this crate does not know the place of.
#[derive(Debug)]
pub struct FleetBinaries {
    /// The `leasehold` binary.
    pub leasehold: PathBuf,
    /// The `fenced_store` example.
    pub fenced_store: PathBuf,
}

/// How the fleet's sidecars run.
#[derive(Debug)]
pub struct FleetOptions<'a> {
    /// The store URL and the election they share.
    pub store: &'a str,
    pub election: &'a str,
    pub ttl: &'a str,
    /// Whether each sidecar tells HAProxy's runtime API at once that it
    /// leads (`--on-elected` running `recipes/haproxy_hook.py up`), rather
    /// than waiting for a check.
    pub hooks: bool,
    /// Whether HAProxy keeps the recipe's backup servers, which try every
    /// replica while none is seen up.
    pub backups: bool,
    /// The services' `--hold-off`, in milliseconds (the recipe's: 50).
    pub hold_off_ms: u32,
}

/// Replicas `web-1`…`web-N` behind one HAProxy; every process is stopped
/// by process id when the fleet is dropped.
#[derive(Debug)]
pub struct LeaderFleet {
    dir: PathBuf,
    binaries: FleetBinaries,
    sidecar_args: Vec<String>,
    hold_off: String,
    backups: bool,
    ports: Vec<(u16, u16)>,
    sidecars: Vec<Child>,
    services: Vec<Child>,
    others: Vec<Child>,
    front: SocketAddr,
}

/// The folder holding the recipes the GUIDE shows.
pub fn recipes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes")
}

/// Debian's Python 3 (fast to start), else the first `python3` on PATH.
pub fn python3() -> PathBuf {
    let debian = PathBuf::from("/usr/bin/python3");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("python3")
    }
}

fn haproxy() -> PathBuf {
    let debian = PathBuf::from("/usr/sbin/haproxy");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("haproxy")
    }
}

fn spawn(command: &mut Command, what: &str, log: &Path) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e} (scripts/test installs it)"))
}

fn wait_listening(port: u16, what: &str, log: &Path) {
    let until = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        let shown = std::fs::read_to_string(log).unwrap_or_default();
        assert!(Instant::now() < until, "{what} did not listen: {shown}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl LeaderFleet {
    /// Starts `replicas` replicas and HAProxy in front of them, and waits
    /// until each listens.
    pub fn start(binaries: FleetBinaries, options: &FleetOptions, replicas: usize) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-fleet-{}-{}",
            std::process::id(),
            crate::monotonic_ns()
        ));
        std::fs::create_dir_all(&dir).expect("create the fleet's folder");
        let store_port = crate::free_port();
        let mut store = Command::new(&binaries.fenced_store);
        store
            .arg(format!("127.0.0.1:{store_port}"))
            .arg(dir.join("fence.db"))
            .arg(dir.join("accepted.log"));
        let others = vec![spawn(&mut store, "fenced_store", &dir.join("store.err"))];
        wait_listening(store_port, "fenced_store", &dir.join("store.err"));
        let mut sidecar_args = vec![
            "sidecar".to_owned(),
            "--election".to_owned(),
            options.election.to_owned(),
            "--store".to_owned(),
            options.store.to_owned(),
            "--ttl".to_owned(),
            options.ttl.to_owned(),
        ];
        if options.hooks {
            let hook = recipes().join("haproxy_hook.py");
            let command = format!("{} {} up", python3().display(), hook.display());
            sidecar_args.extend(["--on-elected".to_owned(), command]);
        }
        let mut fleet = LeaderFleet {
            ports: (0..replicas)
                .map(|_| (crate::free_port(), crate::free_port()))
                .collect(),
            dir,
            binaries,
            sidecar_args,
            hold_off: format!("{:.3}", f64::from(options.hold_off_ms) / 1000.0),
            backups: options.backups,
            sidecars: Vec::new(),
            services: Vec::new(),
            others,
            front: SocketAddr::from(([127, 0, 0, 1], crate::free_port())),
        };
        // HAProxy first, so that the first leader's hook finds it.
        fleet.start_haproxy();
        let resource = format!("http://127.0.0.1:{store_port}/objects/orders");
        for replica in 0..replicas {
            let sidecar = fleet.spawn_sidecar(replica);
            fleet.sidecars.push(sidecar);
            fleet.start_service(replica, &resource);
        }
        fleet
    }

    /// Replica `replica`'s name, as its sidecar's `--id` and its HAProxy
    /// server's name.
    pub fn name(replica: usize) -> String {
        format!("web-{}", replica + 1)
    }

    fn admin_socket(&self) -> PathBuf {
        self.dir.join("haproxy.sock")
    }

    fn spawn_sidecar(&self, replica: usize) -> Child {
        let name = Self::name(replica);
        let (sidecar_port, _) = self.ports[replica];
        let log = self.dir.join(format!("{name}.log"));
        let child = spawn(
            Command::new(&self.binaries.leasehold)
                .args(&self.sidecar_args)
                .args([
                    "--id",
                    &name,
                    "--http",
                    &format!("127.0.0.1:{sidecar_port}"),
                ])
                .env("HAPROXY_ADMIN", self.admin_socket()),
            "leasehold sidecar",
            &log,
        );
        wait_listening(sidecar_port, &name, &log);
        child
    }

    fn start_service(&mut self, replica: usize, resource: &str) {
        let name = Self::name(replica);
        let (sidecar_port, service_port) = self.ports[replica];
        let log = self.dir.join(format!("{name}.service.log"));
        let child = spawn(
            Command::new(python3())
                .arg(recipes().join("leader_service.py"))
                .args(["--listen", &format!("127.0.0.1:{service_port}")])
                .args(["--id", &name, "--resource", resource])
                .args(["--hold-off", &self.hold_off])
                .args(["--sidecar", &format!("http://127.0.0.1:{sidecar_port}")]),
            "python3",
            &log,
        );
        self.services.push(child);
        wait_listening(service_port, "leader_service.py", &log);
    }

    fn start_haproxy(&mut self) {
        let log = self.dir.join("haproxy.log");
        let mut config = recipes().join("haproxy.cfg");
        if !self.backups {
            let recipe = std::fs::read_to_string(&config).expect("the recipe");
            let kept: Vec<&str> = recipe
                .lines()
                .filter(|l| !l.contains(" backup ") && !l.contains("allbackups"))
                .take_while(|l| !l.starts_with("# Which replicas run"))
                .collect();
            config = self.dir.join("haproxy.cfg");
            std::fs::write(&config, kept.join("\n") + "\n").expect("a config");
        }
        let mut command = Command::new(haproxy());
        command
            .arg("-db")
            .arg("-f")
            .arg(config)
            .env("HAPROXY_LISTEN", self.front.to_string())
            .env("HAPROXY_ADMIN", self.admin_socket());
        for (replica, (sidecar_port, service_port)) in self.ports.iter().enumerate() {
            let n = replica + 1;
            command
                .env(format!("WEB_{n}"), format!("127.0.0.1:{service_port}"))
                .env(format!("LH_{n}"), sidecar_port.to_string());
        }
        self.others.push(spawn(&mut command, "haproxy", &log));
        wait_listening(self.front.port(), "haproxy", &log);
    }

    /// Where the clients send their requests.
    pub fn front(&self) -> SocketAddr {
        self.front
    }

    /// The replicas HAProxy sees up now, as its runtime API lists them (the
    /// backup servers `any-N`, never checked, left out).
    pub fn up_servers(&self) -> Vec<String> {
        let Ok(mut admin) = UnixStream::connect(self.admin_socket()) else {
            return Vec::new();
        };
        let mut state = String::new();
        let asked = admin
            .write_all(b"show servers state leader\n")
            .and_then(|()| admin.read_to_string(&mut state));
        if asked.is_err() {
            return Vec::new();
        }
        // `be_id be_name srv_id srv_name srv_addr srv_op_state ...`; an
        // operational state of 2 is "running".
        state
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                let name = fields.get(3).filter(|name| !name.starts_with("any-"))?;
                (fields.get(5) == Some(&"2")).then(|| (*name).to_owned())
            })
            .collect()
    }

    /// Where replica `replica`'s sidecar answers.
    pub fn sidecar(&self, replica: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[replica].0))
    }

    /// Sends `signal` to replica `replica`'s sidecar.
    pub fn signal_sidecar(&self, replica: usize, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.sidecars[replica].id()).expect("a pid");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal");
    }

    /// Takes replica `replica` away: its sidecar stops with SIGTERM (it
    /// releases and leaves the line) and its service is killed.
    pub fn stop_replica(&mut self, replica: usize) {
        self.signal_sidecar(replica, nix::sys::signal::Signal::SIGTERM);
        let _ = self.sidecars[replica].wait();
        let _ = self.services[replica].kill();
        let _ = self.services[replica].wait();
    }

    /// Waits for replica `replica`'s sidecar to exit (after SIGTERM) and
    /// starts it again.
    pub fn restart_sidecar(&mut self, replica: usize) {
        let _ = self.sidecars[replica].wait();
        self.sidecars[replica] = self.spawn_sidecar(replica);
    }

    /// What the fleet logged: every process's log, named.
    pub fn logs(&self) -> String {
        let mut shown = String::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log" || e == "err") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                shown.push_str(&format!("== {}\n{text}", path.display()));
            }
        }
        shown
    }

    /// The tokens of the writes the fenced store accepted, in its order.
    pub fn accepted(&self) -> Vec<u64> {
        std::fs::read_to_string(self.dir.join("accepted.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("accepted ")?.split(' ').next()?.parse().ok())
            .collect()
    }
}

/// One `POST /` of `body` through the load balancer at `front`, on a
/// connection of its own: the status code and the body, or `None` when
/// nothing answered within 5 s.
pub fn post(front: SocketAddr, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&front, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: pieces would wait on Nagle's algorithm for an ACK.
    let request = format!(
        "POST / HTTP/1.1\r\nHost: leader\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, text) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, text.to_owned()))
}

impl Drop for LeaderFleet {
    fn drop(&mut self) {
        let all = self.sidecars.iter_mut().chain(&mut self.services);
        for child in all.chain(&mut self.others) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
