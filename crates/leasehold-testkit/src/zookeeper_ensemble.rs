//! A real ZooKeeper ensemble for tests and benchmarks: Debian's `zookeeper`
//! package (`QuorumPeerMain` from `/usr/share/java/zookeeper.jar`, 3.8),
//! `n` members on free loopback ports with their data in a temporary
//! folder, stopped by process id when dropped (also when a test panics).
//!
//! The members are tuned for tests on a small machine: a 100 ms tick (as
//! the standalone [`crate::ZooKeeperServer`]: sessions of 200 ms to 60 s),
//! `initLimit` 10 and `syncLimit` 5 ticks (a follower that does not hear
//! from its leader for 500 ms looks for a new one), a quick leader election
//! (`zookeeper.fastleader.minNotificationInterval` 50 ms instead of 200 ms,
//! and at most 1 s between notifications instead of 60 s, so that a member
//! left alone notices its peers' return soon), no fsync of the transaction
//! log (a SIGKILL keeps the page cache, so nothing acknowledged is lost to
//! it), and small JVMs that start fast (`-Xmx64m`, serial GC, the client
//! compiler only, and a class-data archive of ZooKeeper's classes that the
//! first ensemble on the host writes into the temporary folder). Three
//! members serve in about 1.5–2 s on a loaded 2-core machine.
//!
//! Faults: [`ZooKeeperEnsemble::kill`] and [`ZooKeeperEnsemble::restart`]
//! (SIGKILL, then the same data and ports), [`ZooKeeperEnsemble::signal`]
//! (SIGSTOP and SIGCONT for pauses), and in an ensemble started by
//! [`ZooKeeperEnsemble::start_partitionable`], network partitions between
//! members ([`ZooKeeperEnsemble::partition`]) that their clients do not
//! see.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Debian's ZooKeeper jar; its manifest names the jars it needs.
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logger for ZooKeeper's slf4j, so that each member writes a log (when
/// the package is there; without it ZooKeeper logs nothing).
const LOGGER_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// The members' tick: sessions may be as short as two ticks.
pub const TICK: Duration = Duration::from_millis(100);
/// How many times an ensemble is started on fresh ports before giving up:
/// a port found free can still be taken by a concurrent test's server
/// before a member binds it, and the member then exits (or, for the port
/// only a leader binds, never leads).
const START_ATTEMPTS: usize = 3;
/// How long one attempt may take to form a quorum (it takes seconds).
const START_LIMIT: Duration = Duration::from_secs(30);
/// JVM flags that make a member start fast and small.
const JVM_FLAGS: &[&str] = &[
    "-Xmx64m",
    "-Xss512k",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Xshare:auto",
    "-Dzookeeper.fastleader.minNotificationInterval=50",
    "-Dzookeeper.fastleader.maxNotificationInterval=1000",
    // A member whose election port is taken exits after three tries, so
    // that the harness starts the ensemble again on other ports.
    "-Dzookeeper.electionPortBindRetry=3",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
];

/// One member's addresses and process.
#[derive(Debug)]
struct Member {
    /// Its `myid` (1-based, as ZooKeeper wants).
    id: usize,
    client_port: u16,
    /// The port the leader listens on for its followers.
    quorum_port: u16,
    /// The port of leader election.
    election_port: u16,
    process: Mutex<Option<Child>>,
    /// Paused by SIGSTOP through [`ZooKeeperEnsemble::signal`] (and not
    /// resumed since).
    paused: AtomicBool,
    /// This process writes the class-data archive when it exits by
    /// SIGTERM (at drop): its temporary path.
    writes_archive: Option<PathBuf>,
}

impl Member {
    fn process(&self) -> MutexGuard<'_, Option<Child>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running ZooKeeper ensemble on 127.0.0.1.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    dir: PathBuf,
    members: Vec<Member>,
    /// `links[from][to]`: the relays member `from` reaches member `to`'s
    /// quorum and election ports through (only in an ensemble started by
    /// [`ZooKeeperEnsemble::start_partitionable`]).
    links: Vec<Vec<Option<(Relay, Relay)>>>,
}

impl ZooKeeperEnsemble {
    /// Starts `n` members (3 in practice) and waits until a quorum serves:
    /// one member reports `Mode: leader` and every other `Mode: follower`.
    /// Panics with a clear message if ZooKeeper is not installed or does
    /// not come up (this is test support).
    pub fn start(n: usize) -> Self {
        Self::start_with(n, false)
    }

    /// Starts `n` members as [`ZooKeeperEnsemble::start`] does, each
    /// reaching the others' quorum and election ports through a relay of
    /// the harness, so that [`ZooKeeperEnsemble::partition`] can cut
    /// members off from each other while their clients still reach them.
    pub fn start_partitionable(n: usize) -> Self {
        Self::start_with(n, true)
    }

    fn start_with(n: usize, relayed: bool) -> Self {
        assert!(n > 0, "an ensemble has at least one member");
        assert!(
            Path::new(JAR).exists(),
            "{JAR} is missing: install Debian's zookeeper package (scripts/test does)"
        );
        let mut attempt = 1;
        loop {
            let ensemble = Self::unstarted(n, relayed);
            for i in 0..n {
                ensemble.spawn(i);
            }
            match ensemble.try_wait_quorum(START_LIMIT) {
                Ok(()) => return ensemble,
                Err(why) if attempt < START_ATTEMPTS => {
                    eprintln!(
                        "zookeeper ensemble start, attempt {attempt}: {why}; again on other ports"
                    );
                    attempt += 1;
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    /// The members' folders and configuration, on fresh ports (with a
    /// relay for each member's link to each other, if `relayed`); nothing
    /// runs yet.
    fn unstarted(n: usize, relayed: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-zk-ensemble-{}-{}",
            std::process::id(),
            crate::monotonic_ns()
        ));
        let archive = class_archive();
        let writes_archive = (!archive.exists()).then(|| {
            archive.with_extension(format!(
                "{}-{}.tmp",
                std::process::id(),
                crate::monotonic_ns()
            ))
        });
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                id: i + 1,
                client_port: crate::free_port(),
                quorum_port: crate::free_port(),
                election_port: crate::free_port(),
                process: Mutex::new(None),
                paused: AtomicBool::new(false),
                writes_archive: if i == 0 { writes_archive.clone() } else { None },
            })
            .collect();
        // Member `from` reaches member `to` at `links[from][to]`: relays
        // for the quorum and election ports, or the ports themselves.
        let links: Vec<Vec<Option<(Relay, Relay)>>> = (0..n)
            .map(|from| {
                (0..n)
                    .map(|to| {
                        (relayed && from != to).then(|| {
                            (
                                Relay::start(members[to].quorum_port),
                                Relay::start(members[to].election_port),
                            )
                        })
                    })
                    .collect()
            })
            .collect();
        for (from, member) in members.iter().enumerate() {
            let servers: String = members
                .iter()
                .enumerate()
                .map(|(to, m)| {
                    let (quorum, election) = match &links[from][to] {
                        Some((quorum, election)) => (quorum.port, election.port),
                        None => (m.quorum_port, m.election_port),
                    };
                    format!("server.{}=127.0.0.1:{quorum}:{election}\n", m.id)
                })
                .collect();
            let data = dir.join(format!("m{}", member.id)).join("data");
            std::fs::create_dir_all(&data).expect("create the member's folder");
            std::fs::write(data.join("myid"), format!("{}\n", member.id)).expect("write myid");
            let config = format!(
                "tickTime={}\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
                 clientPort={}\nclientPortAddress=127.0.0.1\n\
                 minSessionTimeout={}\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\n\
                 quorumListenOnAllIPs=false\nforceSync=no\n{servers}",
                TICK.as_millis(),
                data.display(),
                member.client_port,
                (TICK * 2).as_millis(),
            );
            std::fs::write(dir.join(format!("m{}", member.id)).join("zoo.cfg"), config)
                .expect("write zoo.cfg");
        }
        ZooKeeperEnsemble {
            dir,
            members,
            links,
        }
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("m{}", self.members[i].id))
    }

    /// Member `i`'s log file.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.member_dir(i).join("server.log")
    }

    /// Starts member `i`'s JVM on its configuration and data.
    fn spawn(&self, i: usize) {
        let member = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("member log file");
        let mut classpath = JAR.to_owned();
        if Path::new(LOGGER_JAR).exists() {
            classpath.push(':');
            classpath.push_str(LOGGER_JAR);
        }
        let mut command = Command::new("java");
        command.args(JVM_FLAGS);
        match &member.writes_archive {
            Some(tmp) => {
                command.arg(format!("-XX:ArchiveClassesAtExit={}", tmp.display()));
            }
            None => {
                let archive = class_archive();
                if archive.exists() {
                    command.arg(format!("-XX:SharedArchiveFile={}", archive.display()));
                }
            }
        }
        let child = command
            .arg("-cp")
            .arg(classpath)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.member_dir(i).join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("cannot run java: install Debian's zookeeper package (scripts/test does)");
        *member.process() = Some(child);
    }

    /// Waits until every member serves, one as leader; or why not.
    fn try_wait_quorum(&self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            let modes: Vec<Option<String>> = (0..self.len()).map(|i| self.mode(i)).collect();
            let leaders = modes
                .iter()
                .filter(|m| m.as_deref() == Some("leader"))
                .count();
            let followers = modes
                .iter()
                .filter(|m| m.as_deref() == Some("follower"))
                .count();
            let standalone = self.len() == 1 && modes[0].as_deref() == Some("standalone");
            if standalone || (leaders == 1 && followers + 1 == self.len()) {
                return Ok(());
            }
            for (i, member) in self.members.iter().enumerate() {
                let mut process = member.process();
                if let Some(Ok(Some(status))) = process.as_mut().map(Child::try_wait) {
                    *process = None;
                    return Err(format!(
                        "zookeeper member {i} exited ({status}) before the quorum formed; its log ends: {}",
                        self.log_tail(i)
                    ));
                }
            }
            if Instant::now() >= until {
                let tails: Vec<String> = (0..self.len())
                    .map(|i| format!("member {i}: {}", self.log_tail(i)))
                    .collect();
                return Err(format!(
                    "zookeeper ensemble formed no quorum within {limit:?} (modes {modes:?}); \
                     the logs end: {}",
                    tails.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of member `i`'s log, joined by ` | `.
    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let mut tail: Vec<&str> = log.lines().rev().take(3).collect();
        tail.reverse();
        tail.join(" | ")
    }

    /// How many members the ensemble has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ensemble has no member (never: [`ZooKeeperEnsemble::start`]
    /// refuses that).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The folder holding the members' configuration, data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `127.0.0.1:PORT` of every member's client port, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// A `zk://h1:p1,h2:p2,…` store URL with leasehold's nodes under `root`
    /// (which starts with `/`).
    pub fn url(&self, root: &str) -> String {
        format!("zk://{}{root}", self.endpoints().join(","))
    }

    /// The answer of member `i` to a four-letter command (`srvr`, `cons`,
    /// `wchc`, …), or `None` if it does not answer within a second (killed,
    /// paused or starting).
    pub fn four_letter(&self, i: usize, command: &str) -> Option<String> {
        let address = SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream
            .set_write_timeout(Some(Duration::from_secs(1)))
            .ok()?;
        stream.write_all(command.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    /// Member `i`'s mode from `srvr`: `leader`, `follower` (or `standalone`
    /// for one member); `None` while it does not serve clients (no quorum,
    /// electing, killed, paused).
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = self.four_letter(i, "srvr")?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
    }

    /// Whether member `i` serves clients as leader or follower now.
    fn serving(&self, i: usize) -> bool {
        matches!(
            self.mode(i).as_deref(),
            Some("leader" | "follower" | "standalone")
        )
    }

    /// Whether member `i` runs and is not paused (by SIGSTOP through
    /// [`ZooKeeperEnsemble::signal`]): whether it can answer at all.
    pub fn is_up(&self, i: usize) -> bool {
        !self.members[i].paused.load(Ordering::SeqCst) && self.is_running(i)
    }

    /// The member whose `srvr` says `Mode: leader`; `None` if none does
    /// (no quorum, an election running), or if more than one does (an old
    /// leader resumed from a pause that has not noticed yet). Members
    /// killed or paused are not asked.
    pub fn leader(&self) -> Option<usize> {
        let leaders: Vec<usize> = (0..self.len())
            .filter(|&i| self.is_up(i) && self.mode(i).as_deref() == Some("leader"))
            .collect();
        match leaders.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// A member that serves as follower now, if any (killed or paused
    /// members are not asked).
    pub fn follower(&self) -> Option<usize> {
        (0..self.len()).find(|&i| self.is_up(i) && self.mode(i).as_deref() == Some("follower"))
    }

    /// Waits until member `i` answers `srvr` as leader or follower, at most
    /// `limit`; whether it does.
    pub fn wait_serving(&self, i: usize, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if self.serving(i) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every member that is up (running, not paused) serves,
    /// exactly one as leader, at most `limit`; whether they do. With a
    /// member killed or paused, this is the moment the others have formed
    /// a quorum without it.
    pub fn wait_quorum(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let running: Vec<usize> = (0..self.len()).filter(|&i| self.is_up(i)).collect();
            let modes: Vec<Option<String>> = running.iter().map(|&i| self.mode(i)).collect();
            let leaders = modes
                .iter()
                .filter(|m| m.as_deref() == Some("leader"))
                .count();
            let followers = modes
                .iter()
                .filter(|m| m.as_deref() == Some("follower"))
                .count();
            if leaders == 1 && leaders + followers == running.len() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The member a client session is connected to now, by its id (as
    /// `leasehold::store::SessionId` holds it): the running member whose
    /// `cons` lists a connection with `sid=0x…` of it; `None` if none does
    /// (killed or paused members are not asked).
    pub fn member_of_session(&self, session: u64) -> Option<usize> {
        let needle = format!("sid={session:#x},");
        (0..self.len()).find(|&i| {
            self.is_up(i)
                && self
                    .four_letter(i, "cons")
                    .is_some_and(|cons| cons.contains(&needle))
        })
    }

    /// Member `i`'s process id, while it runs (also while paused).
    pub fn pid(&self, i: usize) -> Option<i32> {
        self.members[i]
            .process()
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Whether member `i`'s process runs (a paused one does; one that was
    /// killed or exited does not).
    pub fn is_running(&self, i: usize) -> bool {
        let mut process = self.members[i].process();
        match process.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_)) | Err(_)) => {
                *process = None;
                false
            }
            None => false,
        }
    }

    /// Sends `signal` to member `i` (SIGSTOP pauses it, SIGCONT resumes
    /// it: the harness keeps track, see [`ZooKeeperEnsemble::is_up`]);
    /// nothing if it does not run.
    pub fn signal(&self, i: usize, signal: nix::sys::signal::Signal) {
        use nix::sys::signal::Signal;
        if let Some(pid) = self.pid(i)
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).is_ok()
        {
            match signal {
                Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU => {
                    self.members[i].paused.store(true, Ordering::SeqCst);
                }
                Signal::SIGCONT => self.members[i].paused.store(false, Ordering::SeqCst),
                _ => {}
            }
        }
    }

    /// SIGKILLs member `i` (also while paused) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].process().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.members[i].paused.store(false, Ordering::SeqCst);
    }

    /// Cuts every link between the members in `side` and the others, both
    /// ways, quorum and election traffic alike: bytes in flight stay
    /// where they are and new connections hang, as in a network partition;
    /// clients still reach every member. Links within each side stay
    /// (links cut earlier stay cut). Only for an ensemble started by
    /// [`ZooKeeperEnsemble::start_partitionable`].
    pub fn partition(&self, side: &[usize]) {
        for from in 0..self.len() {
            for to in 0..self.len() {
                if side.contains(&from) != side.contains(&to) {
                    self.link(from, to).cut(true);
                }
            }
        }
    }

    /// Restores every link [`ZooKeeperEnsemble::partition`] cut.
    pub fn heal(&self) {
        for from in 0..self.len() {
            for to in 0..self.len() {
                if from != to {
                    self.link(from, to).cut(false);
                }
            }
        }
    }

    fn link(&self, from: usize, to: usize) -> Link<'_> {
        match &self.links[from][to] {
            Some((quorum, election)) => Link(quorum, election),
            None => panic!(
                "the ensemble's members are not relayed: start it with \
                 ZooKeeperEnsemble::start_partitionable to partition it"
            ),
        }
    }

    /// Starts member `i` again on its data and ports (killing it first if
    /// it still runs); returns without waiting for it to rejoin (see
    /// [`ZooKeeperEnsemble::wait_serving`]). Should another server have
    /// taken one of its ports meanwhile, the member exits
    /// ([`ZooKeeperEnsemble::is_running`] turns false).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        // The logs go with the folder: show how they end when a test fails.
        if std::thread::panicking() {
            for i in 0..self.len() {
                eprintln!("zookeeper member {i}'s log ends: {}", self.log_tail(i));
            }
        }
        for i in 0..self.len() {
            if let Some(tmp) = self.members[i].writes_archive.clone()
                && self.is_running(i)
            {
                self.signal(i, nix::sys::signal::Signal::SIGCONT);
                finish_class_archive(&mut self.members[i], &tmp);
            }
            self.signal(i, nix::sys::signal::Signal::SIGCONT);
            self.kill(i);
        }
        for relay in self.links.iter().flatten().flatten() {
            relay.0.stop();
            relay.1.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where the class-data archive of a member's classes lives: in the
/// temporary folder, named for the jar's size and time, so that another
/// ZooKeeper gets another archive. (A JVM that finds an archive it cannot
/// use, e.g. written by another Java, says so in its log and runs without
/// it.)
fn class_archive() -> PathBuf {
    let stamp = std::fs::metadata(JAR)
        .ok()
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            format!("{}-{modified}", m.len())
        })
        .unwrap_or_default();
    std::env::temp_dir().join(format!("leasehold-zookeeper-{stamp}.jsa"))
}

/// Ends the member that writes the class-data archive with SIGTERM (the
/// JVM writes it as it exits), then moves the archive into place if it
/// was written completely; a member that does not exit within 10 s is
/// left to the SIGKILL that follows.
fn finish_class_archive(member: &mut Member, tmp: &Path) {
    let mut process = member.process();
    let Some(child) = process.as_mut() else {
        return;
    };
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            *process = None;
            if tmp.exists() {
                let _ = std::fs::rename(tmp, class_archive());
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(tmp);
}

/// The two relays of one member's link to another.
struct Link<'a>(&'a Relay, &'a Relay);

impl Link<'_> {
    fn cut(&self, cut: bool) {
        self.0.cut.store(cut, Ordering::SeqCst);
        self.1.cut.store(cut, Ordering::SeqCst);
    }
}

/// A TCP relay on a loopback port to a member's port, which the harness
/// can cut: it then stops moving bytes either way (they wait in the
/// sockets' buffers) and holds new connections without connecting them on,
/// until it is restored. Its threads end when it is stopped.
#[derive(Debug)]
struct Relay {
    port: u16,
    cut: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

/// How long a relay's threads wait for bytes or connections before they
/// look at the relay's state again.
const RELAY_POLL: Duration = Duration::from_millis(10);

impl Relay {
    /// A relay to `127.0.0.1:target` on a free port.
    fn start(target: u16) -> Self {
        let listener = loop {
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", crate::free_port())) {
                break listener;
            }
        };
        let port = listener.local_addr().expect("the relay's address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let (cut, stopped) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let state = (Arc::clone(&cut), Arc::clone(&stopped));
        std::thread::spawn(move || {
            let (cut, stopped) = state;
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (cut, stopped) = (Arc::clone(&cut), Arc::clone(&stopped));
                        std::thread::spawn(move || {
                            relay_connection(stream, target, &cut, &stopped)
                        });
                    }
                    Err(_) => std::thread::sleep(RELAY_POLL),
                }
            }
        });
        Relay { port, cut, stopped }
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// Relays one accepted connection to `127.0.0.1:target` until either side
/// closes it or the relay stops; waits while the relay is cut.
fn relay_connection(
    inbound: TcpStream,
    target: u16,
    cut: &Arc<AtomicBool>,
    stopped: &Arc<AtomicBool>,
) {
    while cut.load(Ordering::SeqCst) {
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(RELAY_POLL);
    }
    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
        return;
    };
    let pairs = (inbound.try_clone(), outbound.try_clone());
    let (Ok(inbound_copy), Ok(outbound_copy)) = pairs else {
        return;
    };
    let (cut_back, stopped_back) = (Arc::clone(cut), Arc::clone(stopped));
    std::thread::spawn(move || pump(outbound_copy, inbound_copy, &cut_back, &stopped_back));
    pump(inbound, outbound, cut, stopped);
}

/// Moves bytes from `from` to `to` while the relay is not cut, until
/// `from` ends, a write fails or the relay stops; then shuts both down.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, stopped: &AtomicBool) {
    let _ = from.set_read_timeout(Some(RELAY_POLL));
    let _ = to.set_write_timeout(Some(Duration::from_secs(1)));
    let mut buffer = [0u8; 16 * 1024];
    while !stopped.load(Ordering::SeqCst) {
        if cut.load(Ordering::SeqCst) {
            std::thread::sleep(RELAY_POLL);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}
