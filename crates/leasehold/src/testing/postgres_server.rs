//! A real PostgreSQL server for tests: Debian's binaries, `initdb` into a
//! temporary folder, the server on a free loopback port, stopped by process
//! id when dropped. As root (CI), the server runs as the `postgres` user,
//! since PostgreSQL refuses to run as root.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running PostgreSQL server on 127.0.0.1.
#[derive(Debug)]
pub struct PostgresServer {
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
}

/// The folder with `initdb` and `postgres`: Debian's newest
/// `/usr/lib/postgresql/N/bin`, or `PATH`.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop()
}

fn program(name: &str) -> PathBuf {
    bin_dir().map_or_else(|| PathBuf::from(name), |dir| dir.join(name))
}

/// Runs `cmd` as the `postgres` user when this process is root.
fn as_server_user(cmd: &mut Command, dir: &Path) {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("running as root needs the `postgres` user (Debian's postgresql package)");
    nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).expect("chown the data folder");
    cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
}

impl PostgresServer {
    /// Initializes a cluster and starts the server; panics with a clear
    /// message if PostgreSQL is not installed (this is test support).
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-pg-{}-{}",
            std::process::id(),
            crate::clock::host_monotonic_ns()
        ));
        std::fs::create_dir_all(&dir).expect("create the server folder");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("create the data folder");
        let mut initdb = Command::new(program("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_server_user(&mut initdb, &dir);
        as_server_user(&mut initdb, &data);
        let status = initdb
            .status()
            .expect("cannot run initdb: install Debian's postgresql package (scripts/test does)");
        assert!(status.success(), "initdb failed in {}", data.display());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut pg = PostgresServer {
            dir,
            port,
            process: None,
        };
        pg.spawn();
        pg
    }

    fn spawn(&mut self) {
        let log_path = self.dir.join("server.log");
        let _ = std::fs::remove_file(&log_path);
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut server = Command::new(program("postgres"));
        server
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            // Benchmarks run 100 runners with two connections each.
            .args(["-c", "max_connections=300"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        as_server_user(&mut server, &self.dir);
        self.process = Some(server.spawn().expect("start postgres"));
        self.wait_ready(Duration::from_secs(30));
    }

    /// Stops the server at once (SIGQUIT, as after a crash) and starts it
    /// again on the same port and data. Connections are cut; committed
    /// data survives.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Starts the server again after [`PostgresServer::stop`], on the same
    /// port and data.
    pub fn start_again(&mut self) {
        if self.process.is_none() {
            self.spawn();
        }
    }

    /// Stops the server at once (SIGQUIT, as after a crash): connections
    /// are cut and new ones refused until [`PostgresServer::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.process.take() {
            // SIGQUIT: immediate shutdown; the postmaster ends its backends.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGQUIT,
                );
            }
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_ready(&self, limit: Duration) {
        let until = Instant::now() + limit;
        // The server writes "ready to accept connections" once it serves.
        while !std::fs::read_to_string(self.dir.join("server.log"))
            .is_ok_and(|log| log.contains("ready to accept connections"))
        {
            assert!(
                Instant::now() < until,
                "postgres did not start; see {}",
                self.dir.join("server.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connection string for the `postgres` database as the `postgres` user.
    pub fn url(&self) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// What the server has logged so far (tests count logged statements).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<i32> {
        self.process
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
