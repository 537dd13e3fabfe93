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
