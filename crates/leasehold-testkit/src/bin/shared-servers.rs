//! Starts the servers the tests of one run share (see
//! `leasehold_testkit::shared`): one 3-member etcd cluster, one ZooKeeper
//! server, one PostgreSQL server and one that takes TLS only (its CA made
//! here), on free loopback ports in temporary folders. Writes `export NAME=VALUE` lines naming them into the file
//! given as its argument once all answer, then waits for SIGTERM, SIGINT
//! or SIGHUP (or for its parent to exit) and stops them by process id.
//!
//! Usage: `shared-servers ENV_FILE`

use leasehold_testkit::shared;
use leasehold_testkit::{
    EtcdCluster, LEAST_PRIVILEGE, PostgresServer, TestCa, Usage, ZooKeeperServer,
};
use nix::sys::signal::{SigSet, Signal};

fn main() {
    let Some(env_file) = std::env::args_os().nth(1) else {
        eprintln!("usage: shared-servers ENV_FILE");
        std::process::exit(2);
    };
    // Blocked before any thread starts, so that every thread inherits the
    // mask and only `wait` below takes them; the parent's exit sends one.
    let mut stop = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        stop.add(signal);
    }
    stop.thread_block().expect("block the stopping signals");
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).expect("stop with the parent");
    if nix::unistd::getppid() != parent {
        eprintln!("shared-servers: its parent exited before the servers started");
        std::process::exit(1);
    }
    let etcd = std::thread::spawn(|| EtcdCluster::start_steady(3));
    let zookeeper = std::thread::spawn(ZooKeeperServer::start);
    let postgres = PostgresServer::start();
    let ca_dir = std::env::temp_dir().join(format!("leasehold-shared-ca-{}", std::process::id()));
    std::fs::create_dir_all(&ca_dir).expect("create the CA's folder");
    let ca = TestCa::new(&ca_dir, "shared");
    let server_files = ca.issue("server", "localhost", Usage::Server, false);
    let secured = PostgresServer::start_secured(&ca.ca_path(), &server_files);
    secured.psql(LEAST_PRIVILEGE);
    // Both joined before either is judged: a server that started is
    // stopped (dropped) whatever the other did.
    let (etcd, zookeeper) = (etcd.join(), zookeeper.join());
    let (etcd, zookeeper) = (
        etcd.expect("etcd started"),
        zookeeper.expect("zookeeper started"),
    );
    let lines = format!(
        "export {}={}\nexport {}={}\nexport {}={}\nexport {}='{} {}'\n",
        shared::ETCD,
        etcd.endpoints().join(","),
        shared::ZOOKEEPER,
        zookeeper.endpoints().join(","),
        shared::POSTGRES,
        postgres.url(),
        shared::POSTGRES_TLS,
        secured.port(),
        ca.ca_path().display(),
    );
    // Whole or not at all: the script waits for the file to appear.
    let env_file = std::path::PathBuf::from(env_file);
    let fresh = env_file.with_extension("new");
    std::fs::write(&fresh, lines).expect("write the servers' names");
    std::fs::rename(&fresh, &env_file).expect("name the servers");
    let signal = stop.wait().expect("wait for a stopping signal");
    eprintln!("shared-servers: {signal}: stopping the servers");
    drop((etcd, zookeeper, postgres, secured));
    let _ = std::fs::remove_dir_all(&ca_dir);
}
