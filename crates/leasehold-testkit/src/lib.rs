//! leasehold's test kit, for the workspace's tests, benchmarks and
//! simulation (a dev-only crate, never published): real servers started
//! from Debian's binaries — an etcd cluster ([`EtcdCluster`]), a ZooKeeper
//! server or ensemble ([`ZooKeeperServer`], [`ZooKeeperEnsemble`]) and a
//! PostgreSQL server ([`PostgresServer`]) — each on free loopback ports
//! ([`free_port`]) with its data in a temporary folder, stopped by process
//! id when dropped; test certificates made on the spot ([`TestCa`]); a seeded
//! generator for randomized tests and the simulation ([`Rng`]); and the
//! GUIDE's load-balancer recipe, replicas behind HAProxy
//! ([`leader_fleet`]).
//!
//! It does not depend on `leasehold`, so that the library's own tests can
//! use it; the conformance suite and the fault-injecting wrappers, which
//! need the library, are `leasehold::testing` (feature `testing`).

mod certs;
mod etcd_cluster;
pub mod leader_fleet;
mod postgres_server;
mod rng;
pub mod shared;
mod zookeeper_ensemble;
mod zookeeper_server;

use std::sync::atomic::{AtomicU64, Ordering};

pub use certs::{CertFiles, TestCa, Usage};
pub use etcd_cluster::EtcdCluster;
pub use postgres_server::{LEAST_PRIVILEGE, PostgresServer, SECURED_HBA, Shutdown};
pub use rng::Rng;
pub use zookeeper_ensemble::ZooKeeperEnsemble;
pub use zookeeper_server::ZooKeeperServer;

/// The host's monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds, as
/// `leasehold`'s own clock reads it: unique names for temporary folders and
/// tokens, and seeds.
fn monotonic_ns() -> i64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
        .unwrap_or(0)
}

/// A loopback port that is free now and lies below the kernel's range of
/// ephemeral ports (`net.ipv4.ip_local_port_range`), so that no outgoing
/// connection of a concurrent test can take it between this call and the
/// server's bind, nor while a killed server is down before its restart on
/// the same port. Chosen at random among the ports that bind, so tests in
/// parallel processes rarely pick the same one; a server that still finds
/// its port taken is started again on another one by its harness.
pub fn free_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low: u16 = 10_000;
    let high = ephemeral_low.max(low + 1_000);
    let mut rng = Rng::new(
        monotonic_ns().unsigned_abs()
            ^ (u64::from(std::process::id()) << 32)
            ^ NEXT.fetch_add(1, Ordering::Relaxed),
    );
    for _ in 0..1_000 {
        let port = low + u16::try_from(rng.below(u64::from(high - low))).unwrap_or(0);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
