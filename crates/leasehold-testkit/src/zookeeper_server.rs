//! A real ZooKeeper server for tests: Debian's `zookeeper` package
//! (`ZooKeeperServerMain` from `/usr/share/java/zookeeper.jar`), standalone,
//! on a free loopback port with its data in a temporary folder, stopped by
//! process id when dropped (also when a test panics).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's ZooKeeper jar; its manifest names the jars it needs.
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// The server's tick: sessions may be as short as two ticks.
pub const TICK: Duration = Duration::from_millis(100);
/// How many ports a start tries before it gives up.
const START_ATTEMPTS: u32 = 3;

/// A running standalone ZooKeeper server on 127.0.0.1.
#[derive(Debug)]
pub struct ZooKeeperServer {
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
}

impl ZooKeeperServer {
    /// Starts a server with a 100 ms tick (so the shortest session is
    /// 200 ms) and sessions of up to 60 s, and waits until it answers.
    /// Panics with a clear message if ZooKeeper is not installed (this is
    /// test support).
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-zk-{}-{}",
            std::process::id(),
            crate::monotonic_ns()
        ));
        std::fs::create_dir_all(dir.join("data")).expect("create the server folder");
        let mut server = ZooKeeperServer {
            dir,
            port: 0,
            process: None,
        };
        // A port found free may be taken by another test's server before
        // java binds it: then the server exits, and starts again on
        // another port.
        let mut attempt = 1;
        loop {
            server.port = crate::free_port();
            server.write_config();
            match server.spawn() {
                Ok(()) => return server,
                Err(why) if attempt < START_ATTEMPTS => {
                    eprintln!("zookeeper start, attempt {attempt}: {why}; again on another port");
                    server.kill();
                    attempt += 1;
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn write_config(&self) {
        let config = format!(
            "tickTime={}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout={}\nmaxSessionTimeout=60000\nmaxClientCnxns=0\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,wchp,wchc\n",
            TICK.as_millis(),
            self.dir.join("data").display(),
            self.port,
            (TICK * 2).as_millis(),
        );
        std::fs::write(self.dir.join("zoo.cfg"), config).expect("write zoo.cfg");
    }

    /// Starts the server process and waits until it serves; an error
    /// (with the end of its log) when it exits first or takes too long.
    fn spawn(&mut self) -> Result<(), String> {
        assert!(
            std::path::Path::new(JAR).exists(),
            "{JAR} is missing: install Debian's zookeeper package (scripts/test does)"
        );
        let log = std::fs::File::create(self.dir.join("server.log")).expect("log file");
        let process = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-cp", JAR])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("cannot run java: install Debian's zookeeper package (scripts/test does)");
        self.process = Some(process);
        self.wait_ready(Duration::from_secs(60))
    }

    /// The answer to a four-letter command (`srvr`, `wchp`, …), if any.
    pub fn four_letter(&self, command: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(command.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    /// Whether the server serves sessions: `srvr` reports its mode only
    /// then (`ruok` answers earlier, while sessions are still refused).
    fn serving(&self) -> bool {
        self.four_letter("srvr")
            .is_some_and(|a| a.contains("Mode: standalone"))
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        while !self.serving() {
            if let Some(Ok(Some(status))) = self.process.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "zookeeper on port {} exited with {status}: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            if Instant::now() >= until {
                return Err(format!(
                    "zookeeper on port {} did not start within {limit:?}: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The server log's last lines that report a problem (the folder is
    /// removed with the server, so a failure must carry them).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let mut tail: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("Exception") || l.contains("WARN"))
            .rev()
            .take(4)
            .collect();
        if tail.is_empty() {
            tail = log.lines().rev().take(4).collect();
        }
        tail.reverse();
        tail.join(" | ")
    }

    /// `host:port` to connect to.
    pub fn endpoints(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.port)]
    }

    /// A `zk://` store URL with leasehold's nodes under `root`.
    pub fn url(&self, root: &str) -> String {
        format!("zk://127.0.0.1:{}{root}", self.port)
    }

    /// A `zk://USER:PASSWORD@…` store URL with leasehold's nodes under
    /// `root` (`user` and `password` plain: no characters to escape).
    pub fn url_as(&self, user: &str, password: &str, root: &str) -> String {
        format!("zk://{user}:{password}@127.0.0.1:{}{root}", self.port)
    }

    /// A raw client of the server that authenticates with the digest
    /// `user:password`, or not at all: what another program (an intruder,
    /// an operator) would use.
    pub async fn raw_client(&self, digest: Option<&str>) -> zookeeper_client::Client {
        let mut connector = zookeeper_client::Client::connector();
        if let Some(digest) = digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        connector
            .connect(&format!("127.0.0.1:{}", self.port))
            .await
            .expect("connect a raw zookeeper client")
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<i32> {
        self.process
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Sends `signal` to the server (SIGSTOP pauses it, SIGCONT resumes).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid() {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
                .expect("signal zookeeper");
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            // SIGKILL ends it even while paused by SIGSTOP.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and
    /// data: sessions survive if the restart is shorter than their timeout.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(why) = self.spawn() {
            panic!("{why}");
        }
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
