//! The runner on ZooKeeper and PostgreSQL: the same behaviour as on SQLite
//! and etcd, against real servers.

use leasehold::testing::{PostgresServer, ZooKeeperServer};

use super::harness::{Scratch, leasehold, stderr};
use super::run::{sigterm_handover, worked_example_1};

/// The command's status is passed on and the election is free afterwards.
fn exit_status_and_release(store: &str) {
    let out = leasehold()
        .args(["run", "--election", "job", "--ttl", "30s", "--store", store])
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = leasehold()
        .args(["status", "--json", "--election", "job", "--store", store])
        .output()
        .expect("spawn");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"election":"job","leader":null}"#,
        "{}",
        stderr(&out)
    );
}

/// A store that cannot be reached: exit 1, one line naming the address.
fn unreachable_exits_1(url: &str, needle: &str) {
    let out = leasehold()
        .args(["run", "--election", "job", "--store", url, "--", "true"])
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

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
