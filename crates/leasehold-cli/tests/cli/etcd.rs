//! The runner on etcd: the same behaviour as on SQLite, against a real
//! 3-member cluster.

use leasehold_testkit::EtcdCluster;
use leasehold_testkit::shared::{self, unique};

use super::guard::sigkill_hands_over_at_once;
use super::harness::Scratch;
use super::planned::{
    a_transfer_to_a_stopped_replica_fails_after_its_timeout, transfer_to_the_named_replica,
};
use super::run::{
    exit_status_and_release, free_port, sigterm_handover, unreachable_exits_1, worked_example_1,
};

#[test]
fn worked_example_1_and_the_sigkill_fast_path_on_etcd() {
    let cluster = shared::etcd();
    worked_example_1(&cluster.url(&unique("/we1")), &Scratch::new());
    sigkill_hands_over_at_once(&cluster.url(&unique("/fast")), &Scratch::new());
}

#[test]
fn sigterm_and_transfer_hand_over_on_etcd() {
    let cluster = shared::etcd();
    let scratch = Scratch::new();
    sigterm_handover(&cluster.url(&unique("/term")), &scratch);
    transfer_to_the_named_replica(&cluster.url(&unique("/transfer")), &Scratch::new());
    a_transfer_to_a_stopped_replica_fails_after_its_timeout(
        &cluster.url(&unique("/stopped")),
        &Scratch::new(),
    );
}

#[test]
fn exit_status_and_release_on_etcd() {
    let cluster = shared::etcd();
    let prefix = unique("/exit");
    exit_status_and_release(&cluster.url(&prefix));
    // A URL asking for TLS of these plaintext members.
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = leasehold_testkit::TestCa::new(dir.path(), "ca");
    tls_mismatch_exits_1(
        &format!("{}?cacert={}", cluster.url(&prefix), ca.ca_path().display()),
        "does not offer TLS (it answered in plaintext), and cacert= in the URL requires it",
    );
}

/// `status` with `store`, whose URL asks for TLS of members without it or
/// the reverse, exits 1 at once with one line naming the mismatch.
fn tls_mismatch_exits_1(store: &str, needle: &str) {
    let started = std::time::Instant::now();
    let out = super::harness::leasehold()
        .args(["status", "--store", store, "--election", "job"])
        .output()
        .expect("spawn");
    let err = super::harness::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(2),
        "took {took:?}: {err}"
    );
}

#[test]
fn an_unreachable_cluster_exits_1_with_the_endpoints_named() {
    let port = free_port();
    unreachable_exits_1(
        &format!("etcd://127.0.0.1:{port}"),
        &format!("cannot reach etcd at 127.0.0.1:{port}"),
    );
}

// Issue 13: hostile input and a store that changes under us.

/// Runs Debian's `etcdctl` against the cluster; its standard output.
fn etcdctl(cluster: &EtcdCluster, args: &[&str]) -> String {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
        .args(args)
        .output()
        .expect("etcdctl (Debian's etcd-client) runs");
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A prefix holding another program's keys: every command exits 1 with
/// one line saying why, and writes nothing (leasehold put an empty value
/// over a key there, and reported another as the leader).
#[test]
fn a_prefix_holding_other_programs_keys_is_refused_in_one_line() {
    let cluster = EtcdCluster::start(1);
    etcdctl(&cluster, &["put", "/shared/app/config", "v=1"]);
    etcdctl(&cluster, &["put", "/shared/k/job", "precious"]);
    etcdctl(&cluster, &["put", "/shared/e/job/x", "user data e"]);
    let before = etcdctl(&cluster, &["get", "--prefix", ""]);
    let store = cluster.url("/shared");
    for args in [
        &["campaign", "--election", "job"][..],
        &["run", "--election", "job", "--", "true"],
        &["status", "--election", "job"],
        &["list"],
    ] {
        let (subcommand, rest) = args.split_first().expect("a subcommand");
        let out = super::harness::leasehold()
            .args([subcommand, "--store", &store])
            .args(rest)
            .output()
            .expect("spawn");
        let err = super::harness::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("did not write"), "{args:?}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("user data e"));
    }
    assert_eq!(etcdctl(&cluster, &["get", "--prefix", ""]), before);
}

/// A key another program puts among an election's candidates is never
/// reported as its leader, and `run` does not wait for it.
#[test]
fn a_key_among_the_candidates_that_leasehold_did_not_write_is_ignored() {
    let cluster = EtcdCluster::start(1);
    let store = cluster.url("/space");
    let first = super::harness::leasehold()
        .args(["campaign", "--election", "job", "--store", &store])
        .output()
        .expect("spawn");
    assert!(first.status.success(), "{}", super::harness::stderr(&first));
    etcdctl(&cluster, &["put", "/space/job:c:user", "user data e"]);
    let status = super::harness::status_json(&store, "job");
    assert!(status["leader"].is_null(), "{status}");
    let mut run = super::harness::Proc::spawn(
        super::harness::leasehold()
            .args(["run", "--election", "job", "--store", &store])
            .args(["--", "sh", "-c", "exit 7"])
            .stderr(std::process::Stdio::null()),
    );
    let exited = run.wait_for_exit(std::time::Duration::from_secs(20));
    assert_eq!(
        exited.and_then(|s| s.code()),
        Some(7),
        "run waited for a key leasehold did not write"
    );
}

/// `status`, `list` and `observe` of a prefix where no store was ever
/// created exit 1, saying so in one line, and write nothing: no marker.
#[test]
fn reading_a_prefix_without_a_store_exits_1_and_writes_nothing() {
    let cluster = EtcdCluster::start(1);
    let store = cluster.url("/nothing");
    for args in [
        &["status", "--election", "job"][..],
        &["status", "--election", "job", "--json"],
        &["list"],
        &["observe", "--election", "job"],
    ] {
        let (subcommand, rest) = args.split_first().expect("a subcommand");
        let out = super::harness::leasehold()
            .args([subcommand, "--store", &store])
            .args(rest)
            .output()
            .expect("spawn");
        let err = super::harness::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no leasehold store at etcd prefix /nothing"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(etcdctl(&cluster, &["get", "--prefix", ""]), "", "written");
}

// Issue 16: TLS, client certificates and etcd's authentication.

/// Against etcd serving TLS, requiring client certificates, with
/// authentication on and a role granted the prefix alone: `run` and
/// `status` work with the password in `LEASEHOLD_STORE_PASSWORD`; a wrong
/// password exits 1 with one line naming the cause and never the
/// password, at `-vvv` too.
#[test]
fn a_secured_etcd_with_the_password_from_the_environment() {
    use leasehold_testkit::{TestCa, Usage};
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "ca");
    let cluster = EtcdCluster::start_secured(dir.path(), &ca, None);
    let password = "Cli-Sup3r-s3cret";
    cluster.add_user("app", password, Some("/cli/"));
    let client = ca.issue("app", "app", Usage::Client, false);
    let store = format!(
        "etcd://app@{}/cli?cacert={}&cert={}&key={}",
        cluster.endpoints().join(","),
        ca.ca_path().display(),
        client.cert.display(),
        client.key.display()
    );
    let run = |password: &str, args: &[&str]| {
        let (subcommand, rest) = args.split_first().expect("a subcommand");
        super::harness::leasehold()
            .env("LEASEHOLD_STORE_PASSWORD", password)
            .args([subcommand, "--store", &store])
            .args(rest)
            .output()
            .expect("spawn")
    };
    let out = run(password, &["run", "--election", "job", "--", "true"]);
    let err = super::harness::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // A URL without cacert= for this member serving TLS alone.
    let endpoints = cluster.endpoints().join(",");
    tls_mismatch_exits_1(
        &format!("etcd://{endpoints}/cli"),
        &format!("etcd at {endpoints} requires TLS, and the URL gives no cacert="),
    );
    let out = run(password, &["status", "--election", "job", "--json"]);
    let err = super::harness::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains(password), "{err}");

    let wrong = "Wr0ng-Sup3r-pw";
    for verbosity in [None, Some("-vvv")] {
        for args in [
            &["run", "--election", "job", "--", "true"][..],
            &["status", "--election", "job"],
        ] {
            let mut args = args.to_vec();
            if let Some(v) = verbosity {
                args.insert(1, v);
            }
            let out = run(wrong, &args);
            let err = super::harness::stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("authentication failed for user \"app\""),
                "{args:?}: {err}"
            );
            assert!(
                !err.contains(wrong) && !err.contains(password),
                "{args:?}: {err}"
            );
            if verbosity.is_none() {
                assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            }
        }
    }
}

#[test]
fn twelve_shards_over_three_replicas_on_etcd() {
    let cluster = EtcdCluster::start(3);
    super::groups::twelve_shards_over_three_replicas(&cluster.url("/shards"), &Scratch::new());
}
