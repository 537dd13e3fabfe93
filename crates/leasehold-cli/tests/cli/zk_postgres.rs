//! The runner on ZooKeeper and PostgreSQL: the same behaviour as on SQLite
//! and etcd, against real servers.

use leasehold_testkit::shared::{self, Server, unique};
use leasehold_testkit::{PostgresServer, ZooKeeperServer};

use super::guard::sigkill_hands_over_at_once;
use super::harness::Scratch;
use super::planned::{
    a_transfer_to_a_stopped_replica_fails_after_its_timeout, transfer_to_the_named_replica,
};
use super::run::{
    exit_status_and_release, free_port, sigterm_handover, unreachable_exits_1, worked_example_1,
};

#[test]
fn worked_example_1_and_the_sigkill_fast_path_on_zookeeper() {
    let server = shared::zookeeper();
    worked_example_1(&server.url(&unique("/we1")), &Scratch::new());
    sigkill_hands_over_at_once(&server.url(&unique("/fast")), &Scratch::new());
}

#[test]
fn sigterm_and_transfer_hand_over_on_zookeeper() {
    let server = shared::zookeeper();
    sigterm_handover(&server.url(&unique("/term")), &Scratch::new());
    transfer_to_the_named_replica(&server.url(&unique("/transfer")), &Scratch::new());
    a_transfer_to_a_stopped_replica_fails_after_its_timeout(
        &server.url(&unique("/stopped")),
        &Scratch::new(),
    );
}

#[test]
fn exit_status_and_release_on_zookeeper() {
    let server = shared::zookeeper();
    exit_status_and_release(&server.url(&unique("/exit")));
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
fn worked_example_1_and_the_sigkill_fast_path_on_postgres() {
    let server = shared::postgres();
    worked_example_1(&schema(&server, "we1"), &Scratch::new());
    sigkill_hands_over_at_once(&schema(&server, "fast"), &Scratch::new());
}

#[test]
fn sigterm_and_transfer_hand_over_on_postgres() {
    let server = shared::postgres();
    sigterm_handover(&schema(&server, "term"), &Scratch::new());
    transfer_to_the_named_replica(&schema(&server, "transfer"), &Scratch::new());
}

#[test]
fn exit_status_and_release_on_postgres() {
    let server = shared::postgres();
    exit_status_and_release(&schema(&server, "exit"));
}

/// A schema of its own (from `stem`) on `server`.
fn schema(server: &Server<PostgresServer>, stem: &str) -> String {
    format!("{}?schema={}", server.url(), unique(stem))
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
    let server = shared::zookeeper();
    let err = run_at_ttl(&server, "120s");
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
    // Clamped by a second: the period stands, and the line still says
    // what the store granted (found by a review: it did not).
    let err = run_at_ttl(&server, "61s");
    assert!(
        err.lines().any(|l| l.contains(
            "lease: TTL 1m (the store granted less than the 1m 1s asked for), renewing every 20s 333ms"
        ) && !l.contains("instead of")),
        "{err}"
    );
}

/// `run --ttl TTL -- true` on a root of its own on `server`; its stderr,
/// once it exited 0.
fn run_at_ttl(server: &shared::Server<leasehold_testkit::ZooKeeperServer>, ttl: &str) -> String {
    let out = super::harness::leasehold()
        .args(["run", "--election", "clamped", "--ttl", ttl])
        .args(["--store", &server.url(&unique("/clamped")), "--", "true"])
        .env_remove("RUST_LOG")
        .output()
        .expect("spawn");
    let err = super::harness::stderr(&out);
    assert!(out.status.success(), "{err}");
    err
}

// Issue 13: hostile input and a store that changes under us.

/// Runs `leasehold SUBCOMMAND --store STORE ARGS…`; its exit code, stderr
/// and stdout.
fn leasehold_on(store: &str, args: &[&str]) -> (Option<i32>, String, Vec<u8>) {
    let (subcommand, rest) = args.split_first().expect("a subcommand");
    let out = super::harness::leasehold()
        .args([subcommand, "--store", store])
        .args(rest)
        .output()
        .expect("spawn");
    (out.status.code(), super::harness::stderr(&out), out.stdout)
}

/// The commands that only read the store.
const READERS: [&[&str]; 4] = [
    &["status", "--election", "job"],
    &["status", "--election", "job", "--json"],
    &["list"],
    &["observe", "--election", "job"],
];

/// How many nodes the server holds, from its `srvr` command.
fn node_count(server: &ZooKeeperServer) -> u64 {
    server
        .four_letter("srvr")
        .and_then(|answer| {
            answer
                .lines()
                .find_map(|l| l.strip_prefix("Node count: "))
                .and_then(|n| n.trim().parse().ok())
        })
        .expect("srvr names the node count")
}

/// `status`, `list` and `observe` of a root that does not exist exit 1,
/// saying so in one line, and create nothing (they created the root).
#[test]
fn reading_a_zookeeper_root_that_does_not_exist_exits_1_and_creates_nothing() {
    let server = ZooKeeperServer::start();
    let nodes = node_count(&server);
    for args in READERS {
        let (code, err, stdout) = leasehold_on(&server.url("/nothing"), args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no leasehold store at zookeeper node /nothing"),
            "{args:?}: {err}"
        );
        assert!(stdout.is_empty(), "{args:?}");
    }
    assert_eq!(node_count(&server), nodes, "nodes were created");
}

/// ZooKeeper's own node and paths it would refuse are bad input (exit 2),
/// refused before anything is written: leasehold wrote in `/zookeeper`.
#[test]
fn zookeepers_own_node_and_malformed_roots_exit_2() {
    let server = ZooKeeperServer::start();
    let nodes = node_count(&server);
    for root in ["/zookeeper", "/zookeeper/leasehold", "/a/../b"] {
        for args in [&["run", "--election", "job", "--", "true"][..], READERS[0]] {
            let (code, err, _) = leasehold_on(&server.url(root), args);
            assert_eq!(code, Some(2), "{root} {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{root} {args:?}: {err}");
        }
    }
    assert_eq!(node_count(&server), nodes, "nodes were created");
}

/// Runs `psql` on the server; its output, one row a line.
fn psql(server: &PostgresServer, query: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([&server.url(), "-XAtc", query])
        .output()
        .expect("psql (Debian's postgresql-client) runs");
    assert!(out.status.success(), "psql {query:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Every schema, relation and function, by name.
fn catalog(server: &PostgresServer) -> String {
    psql(
        server,
        "SELECT nspname FROM pg_namespace
         UNION ALL SELECT n.nspname || '.' || c.relname FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
         UNION ALL SELECT n.nspname || '.' || p.proname FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
         ORDER BY 1",
    )
}

/// PostgreSQL's own schemas are bad input (exit 2): `?schema=public` put
/// leasehold's tables and functions among other programs'.
#[test]
fn postgresqls_own_schemas_exit_2() {
    let server = PostgresServer::start();
    let before = catalog(&server);
    for schema in ["public", "information_schema", "pg_catalog"] {
        let store = format!("{}?schema={schema}", server.url());
        for args in [&["run", "--election", "job", "--", "true"][..], READERS[0]] {
            let (code, err, _) = leasehold_on(&store, args);
            assert_eq!(code, Some(2), "{schema} {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{schema} {args:?}: {err}");
        }
    }
    assert_eq!(catalog(&server), before, "something was created");
}

/// A schema leasehold did not create is refused by every command, exit 1
/// in one line, and left as it is.
#[test]
fn a_postgres_schema_leasehold_did_not_create_is_refused_in_one_line() {
    let server = PostgresServer::start();
    psql(
        &server,
        "CREATE SCHEMA shop; CREATE TABLE shop.orders (id int)",
    );
    let before = catalog(&server);
    let store = format!("{}?schema=shop", server.url());
    for args in [
        &["campaign", "--election", "job"][..],
        &["run", "--election", "job", "--", "true"],
    ]
    .into_iter()
    .chain(READERS)
    {
        let (code, err, _) = leasehold_on(&store, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("schema shop exists but leasehold did not create it"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(catalog(&server), before, "something was written");
}

/// `status`, `list` and `observe` of a schema that does not exist exit 1,
/// saying so in one line, and create nothing (they created the schema).
#[test]
fn reading_a_postgres_schema_that_does_not_exist_exits_1_and_creates_nothing() {
    let server = PostgresServer::start();
    let before = catalog(&server);
    let store = format!("{}?schema=nothing", server.url());
    for args in READERS {
        let (code, err, stdout) = leasehold_on(&store, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no leasehold store in schema nothing"),
            "{args:?}: {err}"
        );
        assert!(stdout.is_empty(), "{args:?}");
    }
    assert_eq!(catalog(&server), before, "something was created");
}

/// A schema holding another program's `schema_version` (Flyway's old
/// history table) is refused by every command, exit 1 in one line, and
/// left as it is; `run` exits rather than retrying forever (before: taken
/// for leasehold's, then "relation flyway.sessions does not exist").
#[test]
fn a_postgres_schema_with_a_foreign_schema_version_is_refused_in_one_line() {
    let server = PostgresServer::start();
    psql(
        &server,
        "CREATE SCHEMA flyway; CREATE TABLE flyway.schema_version (version text);
         CREATE TABLE flyway.orders (id int)",
    );
    let before = catalog(&server);
    let store = format!("{}?schema=flyway", server.url());
    for args in [
        &["campaign", "--election", "job"][..],
        &["run", "--election", "job", "--", "true"],
    ]
    .into_iter()
    .chain(READERS)
    {
        let (code, err, _) = leasehold_on(&store, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("schema flyway exists but leasehold did not create it"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(catalog(&server), before, "something was written");
    assert_eq!(
        psql(&server, "SELECT count(*) FROM flyway.schema_version"),
        "0\n"
    );
}

/// Another program's node with leasehold-like child names is refused by
/// `campaign`, exit 1 in one line, and left untouched (before: marked
/// "leasehold 1", and an election node created in it).
/// Runs ZooKeeper's own client on `commands` (one a line); its output.
fn zk_cli(server: &ZooKeeperServer, commands: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("/usr/share/zookeeper/bin/zkCli.sh")
        .args(["-server", &server.endpoints()[0]])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("zkCli.sh (Debian's zookeeper) runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{commands}\nquit\n").as_bytes())
        .expect("write commands");
    let out = child.wait_with_output().expect("zkCli.sh ends");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_zookeeper_node_shaped_like_leaseholds_is_refused_untouched() {
    let server = ZooKeeperServer::start();
    zk_cli(
        &server,
        "create /shaped\ncreate /shaped/elections\ncreate /shaped/elections/myjob important",
    );
    let nodes = node_count(&server);
    assert!(nodes >= 3, "the nodes were not created: {nodes}");
    let (code, err, _) = leasehold_on(&server.url("/shaped"), &["campaign", "--election", "e"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("leasehold did not create it"), "{err}");
    assert_eq!(node_count(&server), nodes, "nodes were created");
    let shown = zk_cli(&server, "get /shaped\nget /shaped/elections/myjob");
    assert!(
        !shown.contains("leasehold 1"),
        "the marker was written: {shown}"
    );
    assert!(shown.contains("important"), "{shown}");
}

// Issue 16: a secured PostgreSQL (TLS only, scram-sha-256, a
// least-privilege role).

/// `run` and `status` on a PostgreSQL that takes TLS only, verifying its
/// certificate and name (`sslmode=verify-full`), as a role that may only
/// connect and create on its database, its password from
/// `LEASEHOLD_STORE_PASSWORD`; a wrong password exits 1 with one line
/// naming the cause, never the password — at `-vvv` too.
#[test]
fn run_and_status_on_a_secured_postgres_with_leasehold_store_password() {
    use leasehold_testkit::{TestCa, Usage};
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "pg");
    let server_files = ca.issue("server", "localhost", Usage::Server, false);
    let server = PostgresServer::start_secured(&ca.ca_path(), &server_files);
    server.psql(&[
        "CREATE DATABASE lease",
        "REVOKE ALL ON DATABASE lease FROM PUBLIC",
        "CREATE ROLE app LOGIN PASSWORD 'app-Pa55word'",
        "GRANT CONNECT, CREATE ON DATABASE lease TO app",
    ]);
    let store = format!(
        "postgresql://app@localhost:{}/lease?sslmode=verify-full&sslrootcert={}",
        server.port(),
        ca.ca_path().display()
    );
    let with_password = |password: &str, args: &[&str]| {
        let (subcommand, rest) = args.split_first().expect("a subcommand");
        super::harness::leasehold()
            .args([subcommand, "--store", &store])
            .args(rest)
            .env("LEASEHOLD_STORE_PASSWORD", password)
            .env_remove("RUST_LOG")
            .output()
            .expect("spawn")
    };
    let out = with_password(
        "app-Pa55word",
        &[
            "run",
            "--election",
            "job",
            "--",
            "sh",
            "-c",
            "test -z \"$LEASEHOLD_STORE_PASSWORD\"",
        ],
    );
    let err = super::harness::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("app-Pa55word"), "{err}");
    let out = with_password("app-Pa55word", &["status", "--election", "job"]);
    let err = super::harness::stderr(&out);
    assert!(out.status.success(), "{err}");

    for verbosity in [None, Some("-vvv")] {
        let mut args = vec!["run", "--election", "job"];
        args.extend(verbosity);
        args.extend(["--", "true"]);
        let out = with_password("Wr0ngPa55word", &args);
        let err = super::harness::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{verbosity:?}: {err}");
        assert!(!err.contains("Wr0ngPa55word"), "{verbosity:?}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("Wr0ngPa55word"));
        let cause: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("password authentication failed for user \"app\""))
            .collect();
        assert!(!cause.is_empty(), "{verbosity:?}: {err}");
        if verbosity.is_none() {
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
}

// Issue 16: ZooKeeper digest authentication.

/// The password of the authenticated ZooKeeper stores below.
const ZK_PASSWORD: &str = "Sup3rSecret";

/// `run` on a ZooKeeper store with digest authentication, the password in
/// `LEASEHOLD_STORE_PASSWORD`: the command runs without seeing the
/// variable (nor the password); a run without credentials, and one with a
/// wrong password, exit 1 naming the cause in one line that never holds
/// the password, also at `-vvv` (where the ZooKeeper client logs its
/// requests).
#[test]
fn run_on_an_authenticated_zookeeper_and_wrong_credentials() {
    let server = ZooKeeperServer::start();
    let scratch = Scratch::new();
    let store = server.url("/auth").replace("zk://", "zk://app@");
    let run = |password: Option<&str>, store: &str, verbose: bool| {
        let mut cmd = super::harness::leasehold();
        if verbose {
            cmd.arg("-vvv");
        }
        cmd.args(["run", "--election", "job", "--store", store])
            .args(["--", "sh", "-c", "env > env.out"])
            .current_dir(scratch.dir.path());
        match password {
            Some(password) => cmd.env("LEASEHOLD_STORE_PASSWORD", password),
            None => cmd.env_remove("LEASEHOLD_STORE_PASSWORD"),
        };
        let out = cmd.output().expect("spawn");
        (out.status.code(), super::harness::stderr(&out))
    };
    let (code, err) = run(Some(ZK_PASSWORD), &store, true);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !err.contains(ZK_PASSWORD),
        "the password shows at -vvv: {err}"
    );
    let env = std::fs::read_to_string(scratch.path("env.out")).expect("the command ran");
    assert!(!env.contains("LEASEHOLD_STORE_PASSWORD"), "{env}");
    assert!(!env.contains(ZK_PASSWORD), "{env}");
    std::fs::remove_file(scratch.path("env.out")).expect("remove");

    for verbose in [false, true] {
        let (code, err) = run(Some("Wr0ngPass"), &store, verbose);
        assert_eq!(code, Some(1), "{err}");
        assert!(!err.contains("Wr0ngPass"), "the password shows: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("wrong password for zookeeper user \"app\""))
            .unwrap_or_else(|| panic!("no line names the cause: {err}"));
        assert!(line.contains("/auth"), "{line}");
        if !verbose {
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let (code, err) = run(None, &server.url("/auth"), verbose);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("belongs to zookeeper user \"app\""),
            "without credentials: {err}"
        );
        if !verbose {
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    assert!(
        !scratch.path("env.out").exists(),
        "a refused run ran its command"
    );
}

/// SIGKILL of a runner on an authenticated ZooKeeper: its guard releases
/// the grant on a connection of its own, with the store's credentials, and
/// the successor leads at once.
#[test]
fn the_sigkill_fast_path_on_an_authenticated_zookeeper() {
    let server = ZooKeeperServer::start();
    sigkill_hands_over_at_once(
        &server.url_as("app", ZK_PASSWORD, "/fast-auth"),
        &Scratch::new(),
    );
}

#[test]
fn twelve_shards_over_three_replicas_on_zookeeper() {
    let server = ZooKeeperServer::start();
    super::groups::twelve_shards_over_three_replicas(&server.url("/shards"), &Scratch::new());
}

#[test]
fn twelve_shards_over_three_replicas_on_postgres() {
    let server = PostgresServer::start();
    super::groups::twelve_shards_over_three_replicas(
        &format!("{}?schema=shards", server.url()),
        &Scratch::new(),
    );
}

/// A campaign refused as corrupt (the store's revision counter, its
/// tokens, set below zero by hand)
/// leaves nobody waiting: its session is closed as it exits, so once the
/// counter is set right the next campaign is granted at once (before: the
/// exited process stayed in line for its TTL, shown by `status`, and the
/// next campaign waited behind it).
#[test]
fn a_refused_campaign_leaves_nobody_waiting_on_postgres() {
    let server = PostgresServer::start();
    let store = server.url();
    let (code, err, _) = leasehold_on(&store, &["campaign", "--election", "job", "--hold", "0s"]);
    assert_eq!(code, Some(0), "{err}");
    psql(&server, "UPDATE leasehold.revision SET value = -7");
    let (code, err, _) = leasehold_on(&store, &["campaign", "--election", "job", "--ttl", "60s"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no count of grants"), "{err}");
    let (code, err, out) = leasehold_on(&store, &["status", "--election", "job", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let status: serde_json::Value = serde_json::from_slice(&out).expect("status --json");
    assert_eq!(status["candidates"], serde_json::json!([]), "{status}");
}
