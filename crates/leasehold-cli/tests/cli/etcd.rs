//! The runner on etcd: the same behaviour as on SQLite, against a real
//! 3-member cluster.

use leasehold::testing::EtcdCluster;

use super::harness::Scratch;
use super::run::{
    exit_status_and_release, free_port, sigterm_handover, unreachable_exits_1, worked_example_1,
};

#[test]
fn worked_example_1_on_etcd() {
    let cluster = EtcdCluster::start(3);
    let scratch = Scratch::new();
    worked_example_1(&cluster.url("/we1"), &scratch);
}

#[test]
fn sigterm_hands_over_on_etcd() {
    let cluster = EtcdCluster::start(3);
    let scratch = Scratch::new();
    sigterm_handover(&cluster.url("/term"), &scratch);
}

#[test]
fn exit_status_and_release_on_etcd() {
    let cluster = EtcdCluster::start(3);
    exit_status_and_release(&cluster.url("/exit"));
}

#[test]
fn an_unreachable_cluster_exits_1_with_the_endpoints_named() {
    let port = free_port();
    unreachable_exits_1(
        &format!("etcd://127.0.0.1:{port}"),
        &format!("cannot reach etcd at 127.0.0.1:{port}"),
    );
}
