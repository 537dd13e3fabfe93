//! The store under the chaos run, and what the nemesis can do to it: a
//! 3-member etcd cluster, a 3-member ZooKeeper ensemble, or a PostgreSQL
//! server (Debian's packages, on loopback, stopped by process id on drop).

use std::time::Duration;

use leasehold_testkit::{EtcdCluster, PostgresServer, Rng, ZooKeeperEnsemble};
use nix::sys::signal::Signal;

/// The nemesis's faults, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    PauseRunnerAndCommand,
    PauseReplica,
    StopRunnerAlone,
    KillRunner,
    TermRunner,
    CutRunnerOff,
    KillMember,
    PauseMember,
    RestartPostgresFast,
    RestartPostgresImmediate,
}

impl Fault {
    /// The faults aimed at runners, on every store.
    pub const RUNNER: [Fault; 6] = [
        Fault::KillRunner,
        Fault::TermRunner,
        Fault::StopRunnerAlone,
        Fault::PauseRunnerAndCommand,
        Fault::PauseReplica,
        Fault::CutRunnerOff,
    ];

    /// The report's name for the count of this kind.
    pub fn name(self) -> &'static str {
        match self {
            Fault::PauseRunnerAndCommand => "faults_sigstop_runner_and_command",
            Fault::PauseReplica => "faults_sigstop_runner_guard_and_command",
            Fault::StopRunnerAlone => "faults_sigstop_runner_alone",
            Fault::KillRunner => "faults_sigkill_runner",
            Fault::TermRunner => "faults_sigterm_runner",
            Fault::CutRunnerOff => "faults_cut_runner_from_store",
            Fault::KillMember => "faults_sigkill_store_member",
            Fault::PauseMember => "faults_sigstop_store_member",
            Fault::RestartPostgresFast => "faults_postgres_fast_restart",
            Fault::RestartPostgresImmediate => "faults_postgres_immediate_restart",
        }
    }
}

/// Which store the run uses (`--store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Etcd,
    ZooKeeper,
    Postgres,
}

impl Kind {
    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "etcd" => Some(Kind::Etcd),
            "zookeeper" | "zk" => Some(Kind::ZooKeeper),
            "postgres" | "postgresql" => Some(Kind::Postgres),
            _ => None,
        }
    }
}

pub enum Cluster {
    Etcd(EtcdCluster),
    ZooKeeper(ZooKeeperEnsemble),
    Postgres(PostgresServer),
}

fn port_of(endpoint: &str) -> u16 {
    endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("an endpoint ends in its port")
}

impl Cluster {
    pub fn start(kind: Kind) -> Cluster {
        match kind {
            Kind::Etcd => Cluster::Etcd(EtcdCluster::start(3)),
            Kind::ZooKeeper => Cluster::ZooKeeper(ZooKeeperEnsemble::start(3)),
            Kind::Postgres => Cluster::Postgres(PostgresServer::start()),
        }
    }

    /// What the report calls the store.
    pub fn describe(&self) -> &'static str {
        match self {
            Cluster::Etcd(_) => "etcd, 3 members",
            Cluster::ZooKeeper(_) => "ZooKeeper, a 3-member ensemble",
            Cluster::Postgres(_) => "PostgreSQL, one server",
        }
    }

    /// The client port of every server, each reached by every runner
    /// through a proxy of its own.
    pub fn ports(&self) -> Vec<u16> {
        match self {
            Cluster::Etcd(c) => c.endpoints().iter().map(|e| port_of(e)).collect(),
            Cluster::ZooKeeper(c) => c.endpoints().iter().map(|e| port_of(e)).collect(),
            Cluster::Postgres(s) => vec![s.port()],
        }
    }

    /// The store URL through the proxies listening on `via` (one per
    /// server, in the order of [`Cluster::ports`]).
    pub fn url(&self, via: &[u16]) -> String {
        let hosts: Vec<String> = via.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        match self {
            Cluster::Etcd(_) => format!("etcd://{}/chaos", hosts.join(",")),
            Cluster::ZooKeeper(_) => format!("zk://{}/chaos", hosts.join(",")),
            Cluster::Postgres(_) => format!("postgres://postgres@{}/postgres", hosts[0]),
        }
    }

    /// The faults this store takes.
    pub fn faults(&self) -> &'static [Fault] {
        match self {
            Cluster::Etcd(_) | Cluster::ZooKeeper(_) => &[Fault::KillMember, Fault::PauseMember],
            Cluster::Postgres(_) => &[Fault::RestartPostgresFast, Fault::RestartPostgresImmediate],
        }
    }

    fn members(&self) -> usize {
        match self {
            Cluster::Etcd(_) | Cluster::ZooKeeper(_) => 3,
            Cluster::Postgres(_) => 1,
        }
    }

    /// The member a fault hits: for ZooKeeper the ensemble's leader half
    /// of the time (its loss makes the ensemble elect another).
    fn victim(&self, rng: &mut Rng) -> usize {
        let any = usize::try_from(rng.below(self.members() as u64)).expect("index");
        match self {
            Cluster::ZooKeeper(c) if rng.chance(0.5) => c.leader().unwrap_or(any),
            _ => any,
        }
    }

    /// Begins `fault`, a store fault; returns what it did, and `down`
    /// (how long before [`Cluster::end`] should undo it).
    pub fn begin(&mut self, fault: Fault, rng: &mut Rng) -> (String, usize, Duration) {
        let m = self.victim(rng);
        match (self, fault) {
            (Cluster::Etcd(c), Fault::KillMember) => {
                c.kill(m);
                (format!("sigkill etcd m{m}"), m, rng.millis(1000, 3000))
            }
            (Cluster::ZooKeeper(c), Fault::KillMember) => {
                c.kill(m);
                (format!("sigkill zookeeper m{m}"), m, rng.millis(1000, 3000))
            }
            (Cluster::Etcd(c), Fault::PauseMember) => {
                c.signal(m, Signal::SIGSTOP);
                (format!("sigstop etcd m{m}"), m, rng.millis(1000, 4000))
            }
            (Cluster::ZooKeeper(c), Fault::PauseMember) => {
                c.signal(m, Signal::SIGSTOP);
                (format!("sigstop zookeeper m{m}"), m, rng.millis(1000, 4000))
            }
            (Cluster::Postgres(s), Fault::RestartPostgresFast) => {
                s.stop_with(leasehold_testkit::Shutdown::Fast);
                ("postgres fast shutdown".into(), 0, rng.millis(200, 2000))
            }
            (Cluster::Postgres(s), Fault::RestartPostgresImmediate) => {
                s.stop_with(leasehold_testkit::Shutdown::Immediate);
                (
                    "postgres immediate shutdown".into(),
                    0,
                    rng.millis(200, 2000),
                )
            }
            (_, fault) => panic!("{fault:?} is not a fault of this store"),
        }
    }

    /// Undoes a store fault `begin` started on member `m`.
    pub fn end(&mut self, fault: Fault, m: usize) {
        match (self, fault) {
            (Cluster::Etcd(c), Fault::KillMember) => c.restart(m),
            (Cluster::ZooKeeper(c), Fault::KillMember) => {
                c.restart(m);
                // Back in the ensemble before the next fault, so that the
                // nemesis takes one member at a time.
                c.wait_serving(m, Duration::from_secs(20));
            }
            (Cluster::Etcd(c), Fault::PauseMember) => c.signal(m, Signal::SIGCONT),
            (Cluster::ZooKeeper(c), Fault::PauseMember) => c.signal(m, Signal::SIGCONT),
            (Cluster::Postgres(s), _) => s.start_again(),
            (_, fault) => panic!("{fault:?} is not a fault of this store"),
        }
    }
}
