//! A real PostgreSQL server for tests: Debian's binaries, `initdb` into a
//! temporary folder, the server on a free loopback port, stopped by process
//! id when dropped. As root (CI), the server runs as the `postgres` user,
//! since PostgreSQL refuses to run as root.
//!
//! [`PostgresServer::start_secured`] starts one that takes TCP connections
//! over TLS only, with scram-sha-256 passwords or client certificates
//! ([`SECURED_HBA`]); its superuser connects over the Unix socket
//! ([`PostgresServer::psql`]).

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
    /// `-c NAME=VALUE` settings beyond the defaults (TLS, pg_hba).
    settings: Vec<String>,
}

/// The `pg_hba.conf` of [`PostgresServer::start_secured`]: the superuser
/// over the Unix socket only; over TCP, TLS only (`hostssl`, no `host`
/// line): the user `mtls` with a password *and* a client certificate the
/// server's CA signed, the user `certuser` by its certificate alone (its
/// common name), everyone else by scram-sha-256 password.
pub const SECURED_HBA: &str = "\
local   all  postgres                 trust
hostssl all  mtls      127.0.0.1/32   scram-sha-256 clientcert=verify-full
hostssl all  certuser  127.0.0.1/32   cert
hostssl all  all       127.0.0.1/32   scram-sha-256
";

/// The least-privilege setup the GUIDE gives, for a server started with
/// [`PostgresServer::start_secured`]: a database `lease` of its own; the
/// role `app` (password `app-Pa55word`) may connect and create (its
/// schema, on first use), nothing more; `mtls` (`mtls-Pa55word`) needs a
/// client certificate as well ([`SECURED_HBA`]); `nocreate`
/// (`nocreate-Pa55word`) may connect, not create. PUBLIC's default
/// CONNECT and TEMP on the database are revoked.
pub const LEAST_PRIVILEGE: &[&str] = &[
    "CREATE DATABASE lease",
    "REVOKE ALL ON DATABASE lease FROM PUBLIC",
    "CREATE ROLE app LOGIN PASSWORD 'app-Pa55word'",
    "GRANT CONNECT, CREATE ON DATABASE lease TO app",
    "CREATE ROLE mtls LOGIN PASSWORD 'mtls-Pa55word'",
    "GRANT CONNECT, CREATE ON DATABASE lease TO mtls",
    "CREATE ROLE nocreate LOGIN PASSWORD 'nocreate-Pa55word'",
    "GRANT CONNECT ON DATABASE lease TO nocreate",
];

/// How [`PostgresServer::stop_with`] and [`PostgresServer::restart_with`]
/// shut the server down (PostgreSQL's shutdown modes, as `pg_ctl stop -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// SIGINT: the postmaster refuses new connections, ends every backend
    /// (their transactions abort), writes a shutdown checkpoint and exits;
    /// the next start needs no recovery.
    Fast,
    /// SIGQUIT: the postmaster ends every backend at once and exits
    /// without a checkpoint, as after a crash; the next start replays the
    /// write-ahead log.
    Immediate,
}

impl Shutdown {
    fn signal(self) -> nix::sys::signal::Signal {
        match self {
            Shutdown::Fast => nix::sys::signal::Signal::SIGINT,
            Shutdown::Immediate => nix::sys::signal::Signal::SIGQUIT,
        }
    }

    /// How long the postmaster may take to exit before it is killed.
    fn patience(self) -> Duration {
        match self {
            // A checkpoint of a test's few rows; generous for a busy host.
            Shutdown::Fast => Duration::from_secs(30),
            Shutdown::Immediate => Duration::from_secs(5),
        }
    }
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

/// The `postgres` user, when this process is root (PostgreSQL refuses to
/// run as root).
fn server_user() -> Option<nix::unistd::User> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("running as root needs the `postgres` user (Debian's postgresql package)");
    Some(user)
}

/// Runs `cmd` as the `postgres` user when this process is root.
fn as_server_user(cmd: &mut Command, dir: &Path) {
    if let Some(user) = server_user() {
        nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).expect("chown the data folder");
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
}

/// Copies `from` to `to` for the server to read: mode 0600, owned by the
/// server's user (PostgreSQL refuses a key others can read).
fn server_file(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let contents = std::fs::read(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    // Written anew (not over the old file): the server may be reading it.
    let fresh = to.with_extension("new");
    std::fs::write(&fresh, contents).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600))
        .expect("chmod a server TLS file");
    if let Some(user) = server_user() {
        nix::unistd::chown(&fresh, Some(user.uid), Some(user.gid)).expect("chown a TLS file");
    }
    std::fs::rename(&fresh, to).expect("move a server TLS file into place");
}

impl PostgresServer {
    /// Initializes a cluster and starts the server; panics with a clear
    /// message if PostgreSQL is not installed (this is test support).
    pub fn start() -> Self {
        let mut pg = Self::init();
        pg.spawn();
        pg
    }

    /// Starts a server that takes TCP connections over TLS only: its
    /// certificate and key `server` (copied into its folder, mode 0600),
    /// client certificates checked against `ca`, passwords kept as
    /// scram-sha-256, and [`SECURED_HBA`]. Create users with
    /// [`PostgresServer::psql`].
    pub fn start_secured(ca: &Path, server: &crate::CertFiles) -> Self {
        let mut pg = Self::init();
        let tls = pg.dir.join("tls");
        std::fs::create_dir_all(&tls).expect("create the TLS folder");
        if let Some(user) = server_user() {
            nix::unistd::chown(&tls, Some(user.uid), Some(user.gid)).expect("chown TLS folder");
        }
        server_file(&server.cert, &tls.join("server.pem"));
        server_file(&server.key, &tls.join("server-key.pem"));
        server_file(ca, &tls.join("ca.pem"));
        let hba = tls.join("pg_hba.conf");
        std::fs::write(&hba, SECURED_HBA).expect("write pg_hba.conf");
        server_file(&hba, &hba);
        pg.settings = vec![
            "ssl=on".into(),
            format!("ssl_cert_file={}", tls.join("server.pem").display()),
            format!("ssl_key_file={}", tls.join("server-key.pem").display()),
            format!("ssl_ca_file={}", tls.join("ca.pem").display()),
            "password_encryption=scram-sha-256".into(),
            format!("hba_file={}", hba.display()),
        ];
        pg.spawn();
        pg
    }

    /// Has a secured server trust `ca` (PEM, one or more CA certificates)
    /// for client certificates from now on: the file is replaced and the
    /// server reloads its configuration (SIGHUP, as `pg_ctl reload`).
    /// Connections already open are kept.
    pub fn trust_ca(&self, ca: &Path) {
        server_file(ca, &self.dir.join("tls").join("ca.pem"));
        self.reload();
    }

    /// Reloads the configuration files (SIGHUP to the server, as
    /// `pg_ctl reload`), and waits until the server has.
    pub fn reload(&self) {
        let Some(pid) = self.pid() else { return };
        let before = self.log().matches("reloading configuration files").count();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .expect("signal the server to reload");
        let until = Instant::now() + Duration::from_secs(10);
        while self.log().matches("reloading configuration files").count() == before {
            assert!(Instant::now() < until, "postgres did not reload");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The postmaster logs before it has read the files; a moment more.
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Runs SQL as the superuser over the Unix socket (`psql -c`, one
    /// transaction per statement given), panicking with psql's message if
    /// one fails.
    pub fn psql(&self, statements: &[&str]) {
        let mut cmd = Command::new(program("psql"));
        cmd.args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .arg("-h")
        .arg(&self.dir)
        .arg("-p")
        .arg(self.port.to_string());
        for statement in statements {
            cmd.arg("-c").arg(statement);
        }
        let out = cmd.output().expect("run psql");
        assert!(
            out.status.success(),
            "psql {statements:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A connection string for the superuser over the Unix socket (which
    /// a secured server trusts; it has no plaintext TCP).
    pub fn admin_url(&self) -> String {
        format!(
            "postgresql://postgres@/postgres?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn init() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-pg-{}-{}",
            std::process::id(),
            crate::monotonic_ns()
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
        let port = crate::free_port();
        PostgresServer {
            dir,
            port,
            process: None,
            settings: Vec::new(),
        }
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
            .arg(self.port.to_string());
        for setting in &self.settings {
            server.arg("-c").arg(setting);
        }
        server
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

    /// Shuts the server down in `mode` and starts it again on the same port
    /// and data, returning once it accepts connections. Connections are
    /// cut; committed data survives.
    pub fn restart_with(&mut self, mode: Shutdown) {
        self.stop_with(mode);
        self.spawn();
    }

    /// [`PostgresServer::restart_with`] a fast shutdown ([`Shutdown::Fast`],
    /// SIGINT).
    pub fn restart_fast(&mut self) {
        self.restart_with(Shutdown::Fast);
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
        self.stop_with(Shutdown::Immediate);
    }

    /// [`PostgresServer::stop_with`] a fast shutdown ([`Shutdown::Fast`],
    /// SIGINT); [`PostgresServer::stop`] is the immediate one.
    pub fn stop_fast(&mut self) {
        self.stop_with(Shutdown::Fast);
    }

    /// Shuts the server down in `mode` and waits for the postmaster to
    /// exit (killing it if it takes too long); new connections are refused
    /// until [`PostgresServer::start_again`].
    pub fn stop_with(&mut self, mode: Shutdown) {
        if let Some(mut child) = self.process.take() {
            // The postmaster ends its backends itself, in either mode.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), mode.signal());
            }
            let until = Instant::now() + mode.patience();
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
