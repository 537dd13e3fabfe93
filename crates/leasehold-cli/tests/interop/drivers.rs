//! The other election recipes' clients that leasehold's interop tests
//! (tests/cli/interop.rs) and benchmark (benches/interop.rs) drive as real
//! processes, and the servers they meet on:
//!
//! - etcd's `concurrency.Election`: Debian's `etcdctl elect` (etcd-client),
//!   on a 1-member [`EtcdCluster`];
//! - Curator's `LeaderLatch`: LatchClient.java beside this file, compiled
//!   here with `javac` against Debian's jars (libcurator-recipes-java), on a
//!   [`ZooKeeperServer`];
//! - kazoo's `Election`: kazoo_client.py beside this file, run in a virtual
//!   environment made here with kazoo from PyPI ([`KAZOO`]).
//!
//! Both are built once under the cargo target's temporary folder and kept
//! there for later runs; parallel test processes take a file lock to build
//! them, so that one builds and the others wait for it.
//!
//! Every client's standard output is read as it comes, as events, one a
//! line, each stamped with `Instant::now()` as it arrives:
//!
//! - `leader ID`: it leads (an observer: ID leads);
//! - `none`: (an observer) no one leads;
//! - `queued NODE`: (Curator, kazoo) its candidate node is in line;
//! - `key KEY`: (etcdctl) the key of the leader on the next line;
//! - `not-leader ID`: (Curator) it lost leadership;
//! - `releasing`, `released`: (Curator, kazoo) on SIGTERM, before it leaves
//!   the election and once it has left it (etcdctl prints nothing; it
//!   resigns and exits);
//! - `exited`: its standard output closed.
//!
//! With a folder, each event is also appended to its `events.log` as
//! `TAG EVENT` before it is passed on, where leasehold's commands and the
//! harness ([`mark`]) append theirs: one log in the order things happened.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use leasehold_testkit::{EtcdCluster, ZooKeeperServer};
use nix::sys::signal::Signal;

/// The kazoo release the clients run, from PyPI.
pub const KAZOO: &str = "kazoo==2.11.0";
/// Debian's Curator jar (libcurator-recipes-java); its manifest names the
/// rest of the classpath (curator-framework, curator-client, zookeeper,
/// zookeeper-jute, guava, slf4j-api …), which the JVM and javac follow.
pub const CURATOR_JAR: &str = "/usr/share/java/curator-recipes.jar";
const LATCH_CLIENT: &str = include_str!("LatchClient.java");
const KAZOO_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/kazoo_client.py");

/// Where leasehold's elections and the recipes' meet: the prefix (etcd) or
/// the parent node (ZooKeeper) of every election.
pub const ROOT: &str = "/apps";

/// Another client's election recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// etcd's `concurrency.Election`: `etcdctl elect`.
    Concurrency,
    /// Curator's `LeaderLatch`.
    Curator,
    /// kazoo's `Election`.
    Kazoo,
}

impl Recipe {
    pub const ALL: [Recipe; 3] = [Recipe::Concurrency, Recipe::Curator, Recipe::Kazoo];

    /// The `?layout=` of a store URL that speaks this recipe.
    pub fn layout(self) -> &'static str {
        match self {
            Recipe::Concurrency => "concurrency",
            Recipe::Curator => "curator",
            Recipe::Kazoo => "kazoo",
        }
    }

    /// The client, as a table shows it.
    pub fn client(self) -> &'static str {
        match self {
            Recipe::Concurrency => "etcdctl elect",
            Recipe::Curator => "Curator LeaderLatch",
            Recipe::Kazoo => "kazoo Election",
        }
    }

    /// Whether the client says `releasing` and `released` when stopped.
    pub fn says_released(self) -> bool {
        self != Recipe::Concurrency
    }
}

/// Appends `WHO WHAT` to `dir`'s events.log: one write with O_APPEND, so
/// that lines of several processes never mix.
pub fn mark(dir: &Path, who: &str, what: &str) {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("events.log"))
        .expect("open events.log");
    log.write_all(format!("{who} {what}\n").as_bytes())
        .expect("append to events.log");
}

/// The folder that keeps what the clients need between runs.
fn cache() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop");
    std::fs::create_dir_all(&dir).expect("create the interop cache folder");
    dir
}

/// Holds an exclusive lock on `CACHE/NAME.lock` while `f` runs: parallel
/// test processes build a client one at a time, and a later one finds it
/// built.
fn locked<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache().join(format!("{name}.lock")))
        .expect("open the lock file");
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock");
    f()
}

/// FNV-1a: names a build after its source, so that an edited source is
/// built anew.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The classpath of LatchClient: compiled once (per source) into the cache.
pub fn curator_classpath() -> String {
    assert!(
        Path::new(CURATOR_JAR).exists(),
        "{CURATOR_JAR} is missing: install Debian's libcurator-recipes-java (scripts/test does)"
    );
    let classes = cache().join(format!("curator-{:016x}", fnv(LATCH_CLIENT)));
    locked("curator", || {
        if classes.join("LatchClient.class").exists() {
            return;
        }
        let partial = classes.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).expect("create the classes folder");
        let source = partial.join("LatchClient.java");
        std::fs::write(&source, LATCH_CLIENT).expect("write LatchClient.java");
        let out = Command::new("javac")
            .args(["-nowarn", "-d"])
            .arg(&partial)
            .args(["-cp", CURATOR_JAR])
            .arg(&source)
            .output()
            .expect("cannot run javac: install Debian's default-jdk-headless (scripts/test does)");
        assert!(
            out.status.success(),
            "javac LatchClient.java failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&partial, &classes).expect("move the classes in place");
    });
    format!("{}:{CURATOR_JAR}", classes.display())
}

/// The Python of a virtual environment with [`KAZOO`]: made once (per
/// release) in the cache, with `python3 -m venv` and pip from PyPI.
pub fn kazoo_python() -> PathBuf {
    let venv = cache().join(format!("venv-{}", KAZOO.replace("==", "-")));
    let python = venv.join("bin").join("python");
    locked("kazoo", || {
        if venv.join("ready").exists() {
            return;
        }
        let _ = std::fs::remove_dir_all(&venv);
        let run = |command: &mut Command, what: &str| {
            let out = command
                .output()
                .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
            assert!(
                out.status.success(),
                "{what} failed (python3-venv missing? scripts/test installs it): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
        run(
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--timeout",
                "60",
                KAZOO,
            ]),
            &format!("pip install {KAZOO}"),
        );
        std::fs::write(venv.join("ready"), KAZOO).expect("mark the venv ready");
    });
    python
}

/// Questions to a ZooKeeper client living on its own thread.
enum ZkAsk {
    Children(String, Sender<Vec<String>>),
    Czxid(String, Sender<Option<u64>>),
}

enum Server {
    Etcd(EtcdCluster),
    // The agent before the server: dropped first.
    ZooKeeper(Sender<ZkAsk>, ZooKeeperServer),
}

/// A server of one recipe's kind, and the way its clients and leasehold
/// name an election on it.
pub struct Site {
    pub recipe: Recipe,
    /// The foreign clients' session timeout (Curator, kazoo; etcdctl's is
    /// 60 s, fixed).
    pub session: Duration,
    server: Server,
}

impl Site {
    /// Starts the server (a 1-member etcd cluster or a standalone
    /// ZooKeeper) and builds the recipe's client if need be.
    pub fn start(recipe: Recipe, session: Duration) -> Site {
        match recipe {
            Recipe::Curator => {
                curator_classpath();
            }
            Recipe::Kazoo => {
                kazoo_python();
            }
            Recipe::Concurrency => {}
        }
        let server = match recipe {
            Recipe::Concurrency => Server::Etcd(EtcdCluster::start(1)),
            Recipe::Curator | Recipe::Kazoo => {
                let server = ZooKeeperServer::start();
                Server::ZooKeeper(zk_agent(&server), server)
            }
        };
        Site {
            recipe,
            session,
            server,
        }
    }

    /// `host:port,…` as the clients take it.
    pub fn connect(&self) -> String {
        match &self.server {
            Server::Etcd(cluster) => cluster.endpoints().join(","),
            Server::ZooKeeper(_, server) => server.endpoints().join(","),
        }
    }

    /// leasehold's store URL, in the recipe's layout, under [`ROOT`].
    pub fn store(&self) -> String {
        let url = match &self.server {
            Server::Etcd(cluster) => cluster.url(ROOT),
            Server::ZooKeeper(_, server) => server.url(ROOT),
        };
        format!("{url}?layout={}", self.recipe.layout())
    }

    /// The election `election` as the recipe's clients name it: etcd's
    /// prefix, Curator's latch path, kazoo's election path.
    pub fn path(&self, election: &str) -> String {
        format!("{ROOT}/{election}")
    }

    pub fn etcd(&self) -> Option<&EtcdCluster> {
        match &self.server {
            Server::Etcd(cluster) => Some(cluster),
            Server::ZooKeeper(..) => None,
        }
    }

    /// A contender of the recipe's client in `election`, campaigning as
    /// `id`; with `dir`, its events go to `dir`/events.log and its stderr
    /// to `dir`/ID.err.
    pub fn contend(&self, election: &str, id: &str, dir: Option<&Path>) -> Foreign {
        let path = self.path(election);
        let connect = self.connect();
        let mut command = self.command();
        match self.recipe {
            Recipe::Concurrency => command.args(["elect", &path, id]),
            Recipe::Curator => command.args([
                "contend",
                &connect,
                &path,
                id,
                &self.session.as_millis().to_string(),
            ]),
            Recipe::Kazoo => command.args([
                "contend",
                &connect,
                &path,
                id,
                &self.session.as_secs_f64().to_string(),
            ]),
        };
        Foreign::spawn(command, id, self.recipe == Recipe::Concurrency, dir)
    }

    /// An observer of `election` with the recipe's client: `etcdctl elect
    /// --listen`, Curator's `getLeader()`, kazoo's `contenders()[0]`.
    pub fn observe(&self, election: &str, tag: &str, dir: Option<&Path>) -> Foreign {
        let path = self.path(election);
        let connect = self.connect();
        let mut command = self.command();
        match self.recipe {
            Recipe::Concurrency => command.args(["elect", "--listen", &path]),
            Recipe::Curator | Recipe::Kazoo => command.args(["observe", &connect, &path]),
        };
        Foreign::spawn(command, tag, self.recipe == Recipe::Concurrency, dir)
    }

    /// The recipe's client program, up to its mode.
    fn command(&self) -> Command {
        match self.recipe {
            Recipe::Concurrency => {
                let mut command = Command::new("etcdctl");
                command
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", self.connect()));
                command
            }
            Recipe::Curator => {
                let mut command = Command::new("java");
                command
                    .args([
                        "-XX:+UseSerialGC",
                        "-Xmx128m",
                        "-XX:TieredStopAtLevel=1",
                        "-cp",
                    ])
                    .arg(curator_classpath())
                    .arg("LatchClient");
                command
            }
            Recipe::Kazoo => {
                let mut command = Command::new(kazoo_python());
                command.arg("-u").arg(KAZOO_CLIENT);
                command
            }
        }
    }

    /// How many candidates are in line in `election`: the keys under its
    /// prefix (etcd), the children of its node (ZooKeeper; none if it does
    /// not exist).
    pub fn candidates(&self, election: &str) -> usize {
        let path = self.path(election);
        match &self.server {
            Server::Etcd(cluster) => cluster
                .etcdctl(&["get", "--prefix", &format!("{path}/"), "--keys-only"])
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count(),
            Server::ZooKeeper(agent, _) => {
                let (tx, rx) = channel();
                agent
                    .send(ZkAsk::Children(path, tx))
                    .expect("the zookeeper agent runs");
                rx.recv().expect("an answer").len()
            }
        }
    }

    /// The fencing token leasehold reports for a leader whose key (etcd)
    /// or node (ZooKeeper) is `node`: its create revision, its czxid.
    pub fn token_of(&self, node: &str) -> Option<u64> {
        match &self.server {
            Server::Etcd(cluster) => {
                let json = cluster.etcdctl(&["get", node, "-w", "json"]);
                let parsed: serde_json::Value = serde_json::from_str(&json).ok()?;
                parsed["kvs"][0]["create_revision"].as_u64()
            }
            Server::ZooKeeper(agent, _) => {
                let (tx, rx) = channel();
                agent
                    .send(ZkAsk::Czxid(node.to_owned(), tx))
                    .expect("the zookeeper agent runs");
                rx.recv().expect("an answer")
            }
        }
    }
}

/// A ZooKeeper client of `server` on a thread of its own, answering
/// [`ZkAsk`]s until the sender is dropped.
fn zk_agent(server: &ZooKeeperServer) -> Sender<ZkAsk> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = runtime.block_on(server.raw_client(None));
    let (tx, rx) = channel::<ZkAsk>();
    std::thread::spawn(move || {
        for ask in rx {
            match ask {
                ZkAsk::Children(path, reply) => {
                    let children = runtime
                        .block_on(client.get_children(&path))
                        .map(|(children, _)| children)
                        .unwrap_or_default();
                    let _ = reply.send(children);
                }
                ZkAsk::Czxid(path, reply) => {
                    let czxid = runtime
                        .block_on(client.get_data(&path))
                        .ok()
                        .and_then(|(_, stat)| u64::try_from(stat.czxid).ok());
                    let _ = reply.send(czxid);
                }
            }
        }
        drop(client);
        runtime.shutdown_background();
    });
    tx
}

/// A foreign client's process and its events, SIGKILLed and reaped when
/// dropped, so that a failing test leaves nothing running.
pub struct Foreign {
    pub tag: String,
    child: Child,
    lines: Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
}

impl Foreign {
    /// Spawns `command`, reading its events; `etcdctl` prints a leader as
    /// two lines, its key and its value, which become `key KEY` and
    /// `leader VALUE`.
    fn spawn(mut command: Command, tag: &str, etcdctl: bool, dir: Option<&Path>) -> Foreign {
        let stderr = match dir {
            Some(dir) => Stdio::from(
                std::fs::File::create(dir.join(format!("{tag}.err"))).expect("stderr file"),
            ),
            None => Stdio::null(),
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        let (tag_, dir) = (tag.to_owned(), dir.map(Path::to_path_buf));
        std::thread::spawn(move || {
            let mut key_next = true;
            let send = |event: String| {
                let at = Instant::now();
                if let Some(dir) = &dir {
                    mark(dir, &tag_, &event);
                }
                let _ = tx.send((at, event));
            };
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if etcdctl {
                    let event = if key_next {
                        format!("key {line}")
                    } else {
                        format!("leader {line}")
                    };
                    key_next = !key_next;
                    send(event);
                } else {
                    send(line);
                }
            }
            send("exited".to_owned());
        });
        Foreign {
            tag: tag.to_owned(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    pub fn signal(&self, signal: Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal);
    }

    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Every event so far.
    pub fn events(&mut self) -> Vec<String> {
        self.drain();
        self.seen.iter().map(|(_, l)| l.clone()).collect()
    }

    /// The first event so far that starts with `prefix`, waiting up to
    /// `limit` for one: its arrival and text.
    pub fn first(&mut self, prefix: &str, limit: Duration) -> Option<(Instant, String)> {
        let until = Instant::now() + limit;
        self.drain();
        if let Some(found) = self.seen.iter().find(|(_, l)| l.starts_with(prefix)) {
            return Some(found.clone());
        }
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if line.1.starts_with(prefix) {
                return Some(line);
            }
        }
    }

    /// Whether some event so far starts with `prefix`.
    pub fn has(&mut self, prefix: &str) -> bool {
        self.drain();
        self.seen.iter().any(|(_, l)| l.starts_with(prefix))
    }

    /// Waits up to `limit` until the latest `leader …` or `none` event is
    /// `want` (an observer's view).
    pub fn shows(&mut self, want: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            self.drain();
            let latest = self
                .seen
                .iter()
                .rev()
                .find(|(_, l)| l.starts_with("leader ") || l == "none");
            if latest.is_some_and(|(_, l)| l == want) {
                return true;
            }
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return false;
            };
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return false,
            }
        }
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
