//! The runner on ZooKeeper and PostgreSQL: the same behaviour as on SQLite
//! and etcd, against real servers.

use leasehold::testing::{PostgresServer, ZooKeeperServer};

use super::harness::Scratch;
use super::run::{
    exit_status_and_release, free_port, sigterm_handover, unreachable_exits_1, worked_example_1,
};

#[test]
fn worked_example_1_on_zookeeper() {
    let server = ZooKeeperServer::start();
    worked_example_1(&server.url("/we1"), &Scratch::new());
}

#[test]
fn sigterm_hands_over_on_zookeeper() {
    let server = ZooKeeperServer::start();
    sigterm_handover(&server.url("/term"), &Scratch::new());
}

#[test]
fn exit_status_and_release_on_zookeeper() {
    let server = ZooKeeperServer::start();
    exit_status_and_release(&server.url("/exit"));
}

#[test]
fn an_unreachable_zookeeper_exits_1() {
    let port = free_port();
    unreachable_exits_1(
        &format!("zk://127.0.0.1:{port}"),
        &format!("cannot connect to zookeeper at 127.0.0.1:{port}"),
    );
}

#[test]
fn worked_example_1_on_postgres() {
    let server = PostgresServer::start();
    worked_example_1(&server.url(), &Scratch::new());
}

#[test]
fn sigterm_hands_over_on_postgres() {
    let server = PostgresServer::start();
    sigterm_handover(&format!("{}?schema=term", server.url()), &Scratch::new());
}

#[test]
fn exit_status_and_release_on_postgres() {
    let server = PostgresServer::start();
    exit_status_and_release(&server.url());
}

#[test]
fn an_unreachable_postgres_exits_1() {
    let port = free_port();
    unreachable_exits_1(
        &format!("postgresql://postgres@127.0.0.1:{port}/postgres"),
        &format!("127.0.0.1:{port}"),
    );
}

/// The one case where `run` renews more often than configured: the store
/// granted a shorter TTL than asked (ZooKeeper clamps it to its
/// maxSessionTimeout, 60 s here). The period is shortened to obey the
/// renewal rule for the granted TTL, and the lease line says so.
#[test]
fn a_clamped_zookeeper_ttl_shortens_the_period_and_run_says_so() {
    let server = ZooKeeperServer::start();
    let out = super::harness::leasehold()
        .args(["run", "--election", "clamped", "--ttl", "120s"])
        .args(["--store", &server.url("/clamped"), "--", "true"])
        .env_remove("RUST_LOG")
        .output()
        .expect("spawn");
    let err = super::harness::stderr(&out);
    assert!(out.status.success(), "{err}");
    let lease = err
        .lines()
        .position(|l| l.contains("lease: TTL"))
        .unwrap_or_else(|| panic!("no lease line: {err}"));
    let line = err.lines().nth(lease).unwrap_or_default();
    // V = 60s·0.99 − 100ms = 59.3s; 2 × 40s breaks the rule; 59.3s/3.
    assert!(
        line.contains(
            "lease: TTL 1m (the store granted less than the 2m asked for), \
             renewing every 19s 766ms instead of 40s"
        ),
        "{line}"
    );
    assert!(line.contains(leasehold::RENEWAL_RULE), "{line}");
    let campaigning = err
        .lines()
        .position(|l| l.contains("campaigning"))
        .unwrap_or_else(|| panic!("no campaign: {err}"));
    assert!(lease < campaigning, "{err}");
}
