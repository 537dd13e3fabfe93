//! The runner on etcd: the same behaviour as on SQLite, against a real
//! 3-member cluster.

use leasehold::testing::EtcdCluster;

use super::harness::{Scratch, leasehold, stderr};
use super::run::{sigterm_handover, worked_example_1};

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
    let store = cluster.url("/exit");
    let out = leasehold()
        .args([
            "run",
            "--election",
            "job",
            "--ttl",
            "30s",
            "--store",
            &store,
        ])
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = leasehold()
        .args(["status", "--json", "--election", "job", "--store", &store])
        .output()
        .expect("spawn");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"election":"job","leader":null}"#
    );
}

#[test]
fn an_unreachable_cluster_exits_1_with_the_endpoints_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let out = leasehold()
        .args([
            "run",
            "--election",
            "job",
            "--store",
            &format!("etcd://127.0.0.1:{port}"),
        ])
        .args(["--", "true"])
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot reach etcd at 127.0.0.1:{port}")),
        "{err}"
    );
}
