//! The PostgreSQL store secured (issue 16): TLS with libpq's `sslmode`s,
//! scram-sha-256 passwords, client certificates, a least-privilege role,
//! one-line refusals, and certificates rotated without a restart — against
//! a real server that takes TCP connections over TLS only
//! ([`PostgresServer::start_secured`], [`leasehold_testkit::SECURED_HBA`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::postgres::PostgresStore;
use leasehold::store::{Access, Store};
use leasehold::testing::{ServerHarness, unique_election};
use leasehold::{CandidateId, Elector, Error, LeaseConfig};
use leasehold_testkit::shared;
use leasehold_testkit::{CertFiles, LEAST_PRIVILEGE, PostgresServer, TestCa, Usage};
use tokio::time::Instant;

const APP_PASSWORD: &str = "app-Pa55word";

/// A secured server, its CA and the certificates made for it.
struct Secured {
    server: PostgresServer,
    ca: TestCa,
    /// The client certificate of the user `mtls`.
    client: CertFiles,
    dir: tempfile::TempDir,
}

impl Secured {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `postgresql://USER[:PASSWORD]@127.0.0.1:PORT/lease?sslmode=verify-full&sslrootcert=CA`
    /// followed by `extra` (`&…`).
    fn url(&self, user: &str, password: Option<&str>, extra: &str) -> String {
        tls_url(
            self.server.port(),
            &self.ca.ca_path(),
            user,
            password,
            extra,
        )
    }

    /// `&sslcert=…&sslkey=…` of the user `mtls`.
    fn client_files(&self) -> String {
        cert_params(&self.client)
    }
}

/// `postgresql://USER[:PASSWORD]@127.0.0.1:PORT/lease?sslmode=verify-full&sslrootcert=CA`
/// followed by `extra` (`&…`).
fn tls_url(port: u16, ca: &Path, user: &str, password: Option<&str>, extra: &str) -> String {
    let password = password.map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "postgresql://{user}{password}@127.0.0.1:{port}/lease?sslmode=verify-full&sslrootcert={}{extra}",
        ca.display()
    )
}

fn cert_params(files: &CertFiles) -> String {
    format!(
        "&sslcert={}&sslkey={}",
        files.cert.display(),
        files.key.display()
    )
}

fn start_secured() -> Secured {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "pg");
    let server_files = ca.issue("server", "localhost", Usage::Server, false);
    let client = ca.issue("mtls", "mtls", Usage::Client, false);
    let server = PostgresServer::start_secured(&ca.ca_path(), &server_files);
    server.psql(LEAST_PRIVILEGE);
    Secured {
        server,
        ca,
        client,
        dir,
    }
}

async fn secured() -> Secured {
    tokio::task::spawn_blocking(start_secured)
        .await
        .expect("server start")
}

/// The conformance suite on the secured server: `sslmode=verify-full`,
/// scram-sha-256 with channel binding required, as the least-privilege
/// role `app`.
/// On the run's shared secured server (see `leasehold_testkit::shared`)
/// when there is one, in a schema of its own; else on a server of its own.
async fn harness() -> ServerHarness<Option<Secured>> {
    let extra = format!(
        "&channel_binding=require&schema={}",
        shared::unique("conformance")
    );
    match shared::postgres_tls() {
        Some((port, ca)) => {
            let url = tls_url(port, &ca, "app", Some(APP_PASSWORD), &extra);
            ServerHarness::new(None, &url)
        }
        None => {
            let secured = secured().await;
            let url = secured.url("app", Some(APP_PASSWORD), &extra);
            ServerHarness::new(Some(secured), &url)
        }
    }
}

mod conformance {
    leasehold::conformance_tests!(super::harness());
}

/// `error` is one line and holds none of `secrets`, shown or debugged.
fn one_clean_line(error: &Error, secrets: &[&str]) -> String {
    let shown = error.to_string();
    let debugged = format!("{error:?}");
    assert!(!shown.contains('\n'), "more than one line: {shown}");
    for secret in secrets {
        assert!(!shown.contains(secret), "{secret:?} shown: {shown}");
        assert!(
            !debugged.contains(secret),
            "{secret:?} in Debug: {debugged}"
        );
    }
    shown
}

async fn denied(url: &str, secrets: &[&str]) -> String {
    match PostgresStore::connect(url, "leasehold").await {
        Err(error @ Error::Denied(_)) => one_clean_line(&error, secrets),
        other => panic!("{url} must be refused, got {other:?}"),
    }
}

/// The first lines of a PEM key: what must never be shown.
fn key_contents(path: &Path) -> String {
    let pem = std::fs::read_to_string(path).expect("key");
    pem.lines().nth(1).expect("a key line").to_owned()
}

/// libpq's semantics on a server with TLS: verify-full checks the name
/// the client connects to, verify-ca (and require with sslrootcert) only
/// the chain; a certificate of another CA fails both; prefer uses TLS;
/// disable finds no `host` line (TLS only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sslmodes_on_a_tls_server() {
    let s = secured().await;
    let port = s.server.port();
    let ca = s.ca.ca_path();
    // A host name the server's certificate does not name, reached at
    // 127.0.0.1 (?hostaddr=): the name is what TLS checks.
    let elsewhere = |mode: &str, root: &Path| {
        format!(
            "postgresql://app:{APP_PASSWORD}@db.elsewhere.test:{port}/lease\
             ?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            root.display()
        )
    };
    let refused = denied(&elsewhere("verify-full", &ca), &[APP_PASSWORD]).await;
    assert!(
        refused.contains("certificate verify failed") && refused.contains("does not name the host"),
        "{refused}"
    );
    for mode in ["verify-ca", "require"] {
        let store = PostgresStore::connect(&elsewhere(mode, &ca), "leasehold")
            .await
            .unwrap_or_else(|e| panic!("{mode} does not check the name: {e}"));
        store.elections().await.expect("works");
    }
    // Both names the certificate has.
    for host in ["127.0.0.1", "localhost"] {
        let url = format!(
            "postgresql://app:{APP_PASSWORD}@{host}:{port}/lease?sslmode=verify-full&sslrootcert={}",
            ca.display()
        );
        PostgresStore::connect(&url, "leasehold")
            .await
            .unwrap_or_else(|e| panic!("verify-full at {host}: {e}"));
    }
    // Another CA: refused by every verifying mode, named in the message.
    let other = TestCa::new(s.dir.path(), "other");
    for mode in ["verify-full", "verify-ca", "require"] {
        let refused = denied(&elsewhere(mode, &other.ca_path()), &[APP_PASSWORD]).await;
        assert!(
            refused.contains("certificate verify failed")
                && refused.contains("not signed by a CA in sslrootcert=")
                && refused.contains("other-ca.pem"),
            "{mode}: {refused}"
        );
    }
    // prefer and require without sslrootcert: TLS without verification
    // (the server takes TLS only, so connecting proves TLS was used).
    for mode in ["prefer", "require"] {
        let url = format!(
            "postgresql://app:{APP_PASSWORD}@db.elsewhere.test:{port}/lease?hostaddr=127.0.0.1&sslmode={mode}"
        );
        PostgresStore::connect(&url, "leasehold")
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
    }
    let url = format!("postgresql://app:{APP_PASSWORD}@127.0.0.1:{port}/lease?sslmode=disable");
    let refused = denied(&url, &[APP_PASSWORD]).await;
    assert!(
        refused.contains("no pg_hba.conf entry") && refused.contains("no encryption"),
        "{refused}"
    );
}

/// On a server without TLS, require and the verifying modes fail clearly;
/// prefer connects in plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sslmodes_on_a_plaintext_server() {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("server start");
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "pg");
    let url = |extra: &str| format!("{}?{extra}", server.url());
    PostgresStore::connect(&url("sslmode=prefer"), "leasehold")
        .await
        .expect("prefer falls back to plaintext");
    let verify = format!("sslmode=verify-full&sslrootcert={}", ca.ca_path().display());
    for extra in ["sslmode=require", verify.as_str()] {
        let refused = denied(&url(extra), &[]).await;
        assert!(
            refused.contains("the server does not offer TLS, and sslmode="),
            "{refused}"
        );
    }
}

/// Each refusal is one `Error::Denied` line naming its cause, without the
/// password or the key; a file that is missing is invalid input naming
/// the parameter and the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusals_are_one_line_and_name_their_cause() {
    let s = secured().await;
    let key = key_contents(&s.client.key);
    let secrets = ["Wr0ngPa55word", APP_PASSWORD, "mtls-Pa55word", key.as_str()];
    let wrong = denied(&s.url("app", Some("Wr0ngPa55word"), ""), &secrets).await;
    assert!(
        wrong.contains("password authentication failed for user \"app\" (28P01)"),
        "{wrong}"
    );
    // mtls needs a client certificate (clientcert=verify-full).
    let no_cert = denied(&s.url("mtls", Some("mtls-Pa55word"), ""), &secrets).await;
    assert!(
        no_cert.contains("connection requires a valid client certificate")
            && no_cert.contains("no sslcert= given"),
        "{no_cert}"
    );
    let url = s.url("mtls", Some("mtls-Pa55word"), &s.client_files());
    PostgresStore::connect(&url, "mtls")
        .await
        .expect("with its certificate");
    // A client certificate that expired, one of another CA.
    let expired = s.ca.issue("expired", "mtls", Usage::Client, true);
    let refused = denied(
        &s.url("mtls", Some("mtls-Pa55word"), &cert_params(&expired)),
        &[&key_contents(&expired.key), "mtls-Pa55word"],
    )
    .await;
    assert!(
        refused.contains("the server refused the client certificate")
            && refused.contains("expired.pem")
            && refused.contains("it has expired"),
        "{refused}"
    );
    let other = TestCa::new(s.dir.path(), "other").issue("stranger", "mtls", Usage::Client, false);
    let refused = denied(
        &s.url("mtls", Some("mtls-Pa55word"), &cert_params(&other)),
        &[&key_contents(&other.key)],
    )
    .await;
    assert!(
        refused.contains("the server refused the client certificate")
            && refused.contains("stranger.pem"),
        "{refused}"
    );
    // No CREATE on the database: the first use cannot create the schema.
    let refused = denied(
        &s.url("nocreate", Some("nocreate-Pa55word"), ""),
        &["nocreate-Pa55word"],
    )
    .await;
    assert!(
        refused.contains("permission denied for database lease (42501)")
            && refused.contains("needs CREATE on the database"),
        "{refused}"
    );
    // The server asks for a password and none is given: invalid input,
    // with where to give one.
    match PostgresStore::connect(&s.url("app", None, ""), "leasehold").await {
        Err(error @ Error::InvalidInput { .. }) => {
            let shown = one_clean_line(&error, &[]);
            assert!(
                shown.contains("asks for a password and none is given")
                    && shown.contains("LEASEHOLD_STORE_PASSWORD"),
                "{shown}"
            );
        }
        other => panic!("no password: {other:?}"),
    }
    // A key that does not go with the certificate, in words.
    let mismatched = format!(
        "&sslcert={}&sslkey={}",
        s.client.cert.display(),
        expired.key.display()
    );
    match PostgresStore::connect(&s.url("mtls", Some("mtls-Pa55word"), &mismatched), "mtls").await {
        Err(error @ Error::InvalidInput { .. }) => {
            let shown = one_clean_line(&error, &[&key_contents(&expired.key)]);
            assert!(
                shown.contains("the key does not go with the certificate"),
                "{shown}"
            );
        }
        other => panic!("mismatched key: {other:?}"),
    }
    // Files that are not there: invalid input naming parameter and path.
    for (extra, needle) in [
        ("&password_file=/nonexistent/pw", "/nonexistent/pw"),
        (
            "&sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem",
            "cert=/nonexistent/c.pem",
        ),
    ] {
        let url = format!(
            "postgresql://app@127.0.0.1:{}/lease?sslmode=verify-full&sslrootcert={}{extra}",
            s.server.port(),
            s.ca.ca_path().display()
        );
        match PostgresStore::connect(&url, "leasehold").await {
            Err(error @ Error::InvalidInput { .. }) => {
                let shown = one_clean_line(&error, &[]);
                assert!(shown.contains(needle), "{shown}");
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    let url = format!(
        "postgresql://app@127.0.0.1:{}/lease?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        s.server.port()
    );
    let error = PostgresStore::connect(&url, "leasehold")
        .await
        .expect_err("no CA file");
    assert!(
        matches!(error, Error::InvalidInput { .. })
            && error.to_string().contains("/nonexistent/ca.pem"),
        "{error}"
    );
    // The store's own display hides the password.
    let store = PostgresStore::connect(&s.url("app", Some(APP_PASSWORD), ""), "app")
        .await
        .expect("connect");
    assert!(!format!("{store:?}").contains(APP_PASSWORD));
}

/// The least privilege: CONNECT and CREATE on the database for the first
/// use; afterwards, with CREATE revoked, the schema it owns is enough. A
/// password file is read at each connection. A read-only role with USAGE
/// on the schema and SELECT on its tables can observe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_least_privilege_and_password_file() {
    let s = secured().await;
    let password_file = s.path("app-password");
    std::fs::write(&password_file, format!("{APP_PASSWORD}\n")).expect("password file");
    let url = s.url(
        "app",
        None,
        &format!("&password_file={}", password_file.display()),
    );
    let store = PostgresStore::connect(&url, "jobs")
        .await
        .expect("first use creates the schema");
    let election = unique_election("least");
    // Nothing renews the session once the first handle is dropped: its
    // TTL covers the revoke and the second connection however slow the
    // machine (at 10 s, a loaded CI run once saw it expire: NotHolder).
    let lease = store
        .open_session(Duration::from_secs(120))
        .await
        .expect("session");
    let me = CandidateId::new("app-1").expect("id");
    let grant = store
        .campaign(lease.id, &election, &me)
        .await
        .expect("grant");
    drop(store);

    s.server.psql(&["REVOKE CREATE ON DATABASE lease FROM app"]);
    let store = PostgresStore::connect(&url, "jobs")
        .await
        .expect("afterwards the schema it owns is enough");
    store.resign(&grant).await.expect("resign");
    // The password file is read again at each connection.
    std::fs::write(&password_file, "Wr0ngPa55word\n").expect("password file");
    let refused = denied(&url, &["Wr0ngPa55word", APP_PASSWORD]).await;
    assert!(
        refused.contains("password authentication failed"),
        "{refused}"
    );
    std::fs::write(&password_file, APP_PASSWORD).expect("password file");

    s.server.psql(&[
        "CREATE ROLE observer LOGIN PASSWORD 'observer-Pa55word'",
        "GRANT CONNECT ON DATABASE lease TO observer",
    ]);
    let observer = s.url("observer", Some("observer-Pa55word"), "");
    let refused = match PostgresStore::open(&observer, "jobs", Access::ReadOnly).await {
        Err(error @ Error::Denied(_)) => one_clean_line(&error, &["observer-Pa55word"]),
        other => panic!("no USAGE on the schema: {other:?}"),
    };
    assert!(
        refused.contains("permission denied for schema jobs"),
        "{refused}"
    );
    let admin_lease = s.server.admin_url().replace("/postgres?", "/lease?");
    let (admin, connection) = tokio_postgres::connect(&admin_lease, tokio_postgres::NoTls)
        .await
        .expect("admin");
    tokio::spawn(connection);
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA jobs TO observer;
             GRANT SELECT ON ALL TABLES IN SCHEMA jobs TO observer",
        )
        .await
        .expect("grant reading");
    let reader = PostgresStore::open(&observer, "jobs", Access::ReadOnly)
        .await
        .expect("a reader with USAGE and SELECT");
    let listed = reader.elections().await.expect("list");
    assert!(listed.iter().any(|e| e.election == election), "{listed:?}");
    assert!(reader.leader(&election).await.expect("read").is_none());
}

/// Rotation without a restart: while an elector leads, the client's
/// certificate is replaced on disk by one of a new CA, which the server
/// alone trusts from then on; its connections are cut, and the same store
/// handle reconnects with the new files and keeps leading. Then the
/// certificate is replaced by an expired one: the next connection fails
/// with the expiry, so the files are read at each connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_certificates_rotate_without_a_restart() {
    let s = secured().await;
    let url = s.url("mtls", Some("mtls-Pa55word"), &s.client_files());
    let store = PostgresStore::connect(&url, "leasehold")
        .await
        .expect("connect");
    let elector = Elector::new(
        Arc::new(store.clone()),
        CandidateId::new("rotating").expect("id"),
        LeaseConfig::new(Duration::from_secs(4)),
    )
    .expect("config");
    let election = unique_election("rotate");
    let leadership = elector.campaign(&election).await.expect("leads");
    let token = leadership.token();

    let cut = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'mtls'";
    let new_ca = TestCa::new(s.dir.path(), "new");
    new_ca.issue("mtls", "mtls", Usage::Client, false);
    tokio::task::block_in_place(|| {
        s.server.trust_ca(&new_ca.ca_path());
        s.server.psql(&[cut]);
    });
    // Renewals reconnect with the new files; leadership is kept.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert!(leadership.is_leader(), "lost leadership over the rotation");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = store
        .leader(&election)
        .await
        .expect("read with the rotated certificate")
        .expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.token),
        ("rotating", token)
    );

    // An expired certificate in place: the next connection says so.
    let expired = new_ca.issue("mtls", "mtls", Usage::Client, true);
    tokio::task::block_in_place(|| s.server.psql(&[cut]));
    let until = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match store.leader(&election).await {
            Err(error @ Error::Denied(_)) => {
                break one_clean_line(&error, &[&key_contents(&expired.key), "mtls-Pa55word"]);
            }
            other => {
                assert!(
                    Instant::now() < until,
                    "the expired certificate was not used: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        refused.contains("the server refused the client certificate")
            && refused.contains("it has expired"),
        "{refused}"
    );
}
