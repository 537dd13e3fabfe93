//! The etcd store over TLS with client certificates and etcd's
//! authentication (RBAC) on: the conformance suite as a user granted its
//! prefix alone, the one-line refusals, least privilege, certificate
//! rotation without a restart, password files and token expiry. One
//! secured member per test (Debian's etcd-server).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::etcd::EtcdStore;
use leasehold::store::{Access, ClusterUrl, Store};
use leasehold::testing::{ServerHarness, unique_election};
use leasehold::{CandidateId, Elector, Error, LeaseConfig};
use leasehold_testkit::{EtcdCluster, TestCa, Usage};

const PASSWORD: &str = "Sup3r-s3cret-pw";

/// A secured member and the folder of its certificates (which must
/// outlive it).
#[derive(Debug)]
struct Secured {
    cluster: EtcdCluster,
    dir: tempfile::TempDir,
    ca: TestCa,
}

impl Secured {
    async fn start(token_ttl: Option<Duration>) -> Self {
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::tempdir().expect("temp dir");
            let ca = TestCa::new(dir.path(), "ca1");
            let cluster = EtcdCluster::start_secured(dir.path(), &ca, token_ttl);
            Secured { cluster, dir, ca }
        })
        .await
        .expect("secured etcd start")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The client's CA file (a copy of the CA, replaced by a rotation)
    /// and a client certificate named `user` at `{user}.pem`.
    fn client_files(&self, user: &str) -> (PathBuf, PathBuf, PathBuf) {
        let cacert = self.path("client-ca.pem");
        std::fs::copy(self.ca.ca_path(), &cacert).expect("copy the CA");
        let files = self.ca.issue(user, user, Usage::Client, false);
        (cacert, files.cert, files.key)
    }

    /// `etcd://USER:PASSWORD@…/PREFIX?cacert=…&cert=…&key=…`.
    fn url(&self, userinfo: &str, prefix: &str, query: &str) -> String {
        format!(
            "etcd://{userinfo}@{}{prefix}?{query}",
            self.cluster.endpoints().join(",")
        )
    }

    /// A user named `user` with `PASSWORD`, granted `prefix/`, its client
    /// certificate, and the URL for it.
    fn user_url(&self, user: &str, prefix: &str) -> String {
        self.cluster
            .add_user(user, PASSWORD, Some(&format!("{prefix}/")));
        let (cacert, cert, key) = self.client_files(user);
        self.url(
            &format!("{user}:{PASSWORD}"),
            prefix,
            &tls_query(&cacert, &cert, &key),
        )
    }
}

fn tls_query(cacert: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "cacert={}&cert={}&key={}",
        cacert.display(),
        cert.display(),
        key.display()
    )
}

async fn connect(url: &str) -> leasehold::Result<EtcdStore> {
    let url: ClusterUrl = url.parse().expect("a valid URL");
    EtcdStore::open(&url, Access::ReadWrite).await
}

/// Connecting with `url` is refused with [`Error::Denied`], one line
/// holding `needle` and neither the password nor a key.
async fn assert_denied(url: &str, needle: &str) {
    let error = connect(url).await.expect_err(needle);
    let (shown, debug) = (error.to_string(), format!("{error:?}"));
    assert!(matches!(error, Error::Denied(_)), "{needle}: {debug}");
    assert!(shown.contains(needle), "{needle}: {shown}");
    assert_eq!(shown.lines().count(), 1, "{shown}");
    for text in [&shown, &debug] {
        assert!(!text.contains(PASSWORD), "{text}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }
}

async fn secured_harness() -> ServerHarness<Secured> {
    let secured = Secured::start(None).await;
    let url = secured.user_url("app", "/conformance");
    ServerHarness::new(secured, &url)
}

mod conformance {
    leasehold::conformance_tests!(super::secured_harness());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_is_one_line_naming_its_cause() {
    let secured = Secured::start(None).await;
    let good = secured.user_url("app", "/app");
    connect(&good).await.expect("the right settings connect");
    let (cacert, cert, key) = (
        secured.path("client-ca.pem"),
        secured.path("app.pem"),
        secured.path("app-key.pem"),
    );
    let userinfo = format!("app:{PASSWORD}");

    // A CA that did not sign the server's certificate.
    let other = TestCa::new(secured.dir.path(), "other");
    let url = secured.url(&userinfo, "/app", &tls_query(&other.ca_path(), &cert, &key));
    assert_denied(&url, "certificate verify failed").await;

    // No client certificate, which the server requires.
    let url = secured.url(&userinfo, "/app", &format!("cacert={}", cacert.display()));
    assert_denied(&url, "requires a client certificate").await;

    // An expired client certificate.
    let expired = secured.ca.issue("expired", "app", Usage::Client, true);
    let url = secured.url(
        &userinfo,
        "/app",
        &tls_query(&cacert, &expired.cert, &expired.key),
    );
    assert_denied(&url, "certificate expired").await;

    // A client certificate of another CA.
    let foreign = other.issue("foreign", "app", Usage::Client, false);
    let url = secured.url(
        &userinfo,
        "/app",
        &tls_query(&cacert, &foreign.cert, &foreign.key),
    );
    assert_denied(&url, "refused the client certificate").await;

    // A wrong password.
    let url = secured.url("app:wrong-Sup3r", "/app", &tls_query(&cacert, &cert, &key));
    let error = connect(&url).await.expect_err("wrong password").to_string();
    assert!(
        error.contains("authentication failed for user \"app\"") && !error.contains("wrong-Sup3r"),
        "{error}"
    );

    // A user without permission on the prefix.
    let url = secured.url(&userinfo, "/elsewhere", &tls_query(&cacert, &cert, &key));
    assert_denied(&url, "permission denied on /elsewhere/").await;

    // A missing file: invalid input naming the option and the path.
    let missing = secured.path("missing-ca.pem");
    let url = secured.url(&userinfo, "/app", &tls_query(&missing, &cert, &key));
    let error = connect(&url).await.expect_err("missing cacert");
    assert!(
        matches!(error, Error::InvalidInput { .. })
            && error.to_string().contains("cacert=")
            && error.to_string().contains("missing-ca.pem"),
        "{error:?}"
    );
}

/// A role granted readwrite on the prefix alone is enough, even inside a
/// prefix holding another leasehold store it cannot read; a user who can
/// read that store is refused as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_granted_its_prefix_alone_is_enough() {
    let secured = Secured::start(None).await;
    secured
        .cluster
        .etcdctl(&["put", "/team/leasehold", "leasehold 1"]);
    let url = secured.user_url("app", "/team/app");
    let store = connect(&url).await.expect("a prefix-only role connects");
    let election = unique_election("least-privilege");
    let grant =
        leasehold::testing::campaign_on_new_session(&store, &election, "a", Duration::from_secs(5))
            .await;
    assert_eq!(
        store
            .leader(&election)
            .await
            .expect("leader")
            .map(|l| l.token),
        Some(grant.token)
    );
    assert_eq!(store.elections().await.expect("elections").len(), 1);
    store.resign(&grant).await.expect("resign");
    store.close_session(grant.session).await.expect("close");

    secured.cluster.add_user("wide", PASSWORD, Some("/team/"));
    let (cacert, cert, key) = secured.client_files("wide");
    let url = secured.url(
        &format!("wide:{PASSWORD}"),
        "/team/other",
        &tls_query(&cacert, &cert, &key),
    );
    let error = connect(&url).await.expect_err("inside another store");
    assert!(matches!(error, Error::Corrupt(_)), "{error:?}");
}

async fn elector(store: EtcdStore, id: &str, ttl: Duration) -> Elector {
    Elector::new(
        Arc::new(store),
        CandidateId::new(id).expect("id"),
        LeaseConfig::new(ttl),
    )
    .expect("config")
}

/// While leading, the server moves to a new CA and the client's files are
/// replaced on disk: the same store reconnects, reading them anew, and
/// keeps leading. A client certificate replaced by an expired one is then
/// refused at the next reconnection, naming the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_files_take_effect_at_the_next_reconnection() {
    let mut secured = Secured::start(None).await;
    let url = secured.user_url("app", "/rotate");
    let store = connect(&url).await.expect("connect");
    let handle = store.clone();
    let elector = elector(store, "a", Duration::from_secs(6)).await;
    let election = unique_election("rotate");
    let leadership = elector.campaign(&election).await.expect("campaign");

    let ca2 = TestCa::new(secured.dir.path(), "ca2");
    ca2.issue("app", "app", Usage::Client, false);
    std::fs::copy(ca2.ca_path(), secured.path("client-ca.pem")).expect("copy");
    tokio::task::block_in_place(|| secured.cluster.rotate(&ca2));
    // Renewals go on over new connections made with the new files.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        leadership.is_leader(),
        "leadership lost across the rotation: {:?}",
        leadership.lost_reason()
    );
    let leader = handle
        .leader(&election)
        .await
        .expect("leader after rotation");
    assert_eq!(leader.map(|l| l.token), Some(leadership.token()));

    // An expired client certificate over the same paths: a restart of the
    // member makes the handle reconnect, and it is refused.
    ca2.issue("app", "app", Usage::Client, true);
    tokio::task::block_in_place(|| {
        secured.cluster.kill(0);
        secured.cluster.restart(0);
        secured.cluster.wait_ready(Duration::from_secs(30));
    });
    let error = handle.leader(&election).await.expect_err("expired");
    assert!(
        matches!(&error, Error::Denied(line) if line.contains("certificate expired")),
        "{error:?}"
    );
    assert_denied(&url, "certificate expired").await;
}

/// The password comes from a file read at each authentication; a token
/// etcd forgot (its TTL passed, or the user was replaced) is replaced by a
/// new one without the caller noticing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_renewed_and_password_files_reread() {
    let secured = Secured::start(Some(Duration::from_secs(2))).await;
    secured.cluster.add_user("app", PASSWORD, Some("/tokens/"));
    let (cacert, cert, key) = secured.client_files("app");
    let password_file = secured.path("app-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("write");
    let url = secured.url(
        "app",
        "/tokens",
        &format!(
            "{}&password_file={}",
            tls_query(&cacert, &cert, &key),
            password_file.display()
        ),
    );
    let store = connect(&url).await.expect("connect with a password file");
    assert_eq!(store.authentications(), 1);
    let election = unique_election("tokens");
    let grant = leasehold::testing::campaign_on_new_session(
        &store,
        &election,
        "a",
        Duration::from_secs(10),
    )
    .await;
    // Idle past the token's TTL, holding the election: etcd forgets the
    // token (its use would renew it).
    tokio::time::sleep(Duration::from_secs(4)).await;
    store.keep_alive(grant.session).await.expect("renewal");
    let leader = store.leader(&election).await.expect("leader after expiry");
    assert_eq!(leader.map(|l| l.token), Some(grant.token));
    let after_ttl = store.authentications();
    assert!(after_ttl >= 2, "no new token after the TTL: {after_ttl}");
    let handle = store;

    // The user replaced with a new password (etcd drops its tokens), the
    // file rewritten: the next request authenticates with the new one.
    let new_password = "An0ther-s3cret";
    secured.cluster.etcdctl(&["user", "delete", "app"]);
    secured.cluster.etcdctl(&[
        "user",
        "add",
        &format!("app:{new_password}"),
        "--interactive=false",
    ]);
    secured
        .cluster
        .etcdctl(&["user", "grant-role", "app", "app"]);
    std::fs::write(&password_file, new_password).expect("write");
    handle
        .leader(&election)
        .await
        .expect("a read with the new password");
    assert!(handle.authentications() > after_ttl);
    handle.resign(&grant).await.expect("resign");
}

/// A handle's watches share one stream, opened with the token of its
/// time. Once etcd forgot that token it refuses the waits created on that
/// stream; the handle then opens a new stream (with a new token), so a
/// watch opened before still hears every change after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_outlive_a_forgotten_token() {
    let secured = Secured::start(Some(Duration::from_secs(2))).await;
    secured.cluster.add_user("app", PASSWORD, Some("/watches/"));
    let (cacert, cert, key) = secured.client_files("app");
    let url = secured.url(
        &format!("app:{PASSWORD}"),
        "/watches",
        &tls_query(&cacert, &cert, &key),
    );
    let store: Arc<dyn Store> = Arc::new(connect(&url).await.expect("connect"));
    let election = unique_election("watches");
    let mut leaders = store.watch(&election).await.expect("watch");
    assert_eq!(*leaders.borrow_and_update(), None);
    // Idle past the token's TTL: etcd forgets it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for round in 0..3 {
        let grant = leasehold::testing::campaign_on_new_session(
            &*store,
            &election,
            "a",
            Duration::from_secs(10),
        )
        .await;
        let seen = tokio::time::timeout(
            Duration::from_secs(15),
            leaders.wait_for(|l| l.as_ref().map(|l| l.token) == Some(grant.token)),
        )
        .await
        .map(|seen| seen.is_ok());
        assert!(
            matches!(seen, Ok(true)),
            "round {round}: the watch did not hear the grant"
        );
        store.resign(&grant).await.expect("resign");
        let seen = tokio::time::timeout(Duration::from_secs(15), leaders.wait_for(Option::is_none))
            .await
            .map(|seen| seen.is_ok());
        assert!(
            matches!(seen, Ok(true)),
            "round {round}: the watch did not hear the release"
        );
    }
    // Heard by a watch again, not by reading over and over on a stream
    // etcd refuses.
    let before = leasehold::testing::watch_reads_of(&election);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        leasehold::testing::watch_reads_of(&election) - before,
        0,
        "the watch reads the store while nothing changes"
    );
}

/// Connecting with `url` is refused at once (well before the 3 s a
/// request may take), naming a TLS mismatch with `needle`.
async fn assert_mismatch_named_at_once(url: &str, needle: &str) {
    let started = std::time::Instant::now();
    assert_denied(url, needle).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{needle}: took {took:?}");
}

/// A URL asking for TLS (`cacert=`, with a client certificate) against a
/// member serving plaintext: refused at once, naming the endpoint, the
/// mismatch and what to change in the URL (it said `Connection reset by
/// peer … transport error` after 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_url_against_a_plaintext_member_names_the_mismatch() {
    let (plain, dir, ca) = tokio::task::spawn_blocking(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new(dir.path(), "ca");
        (EtcdCluster::start(1), dir, ca)
    })
    .await
    .expect("plaintext etcd start");
    let endpoint = plain.endpoints().join(",");
    let client = ca.issue("app", "app", Usage::Client, false);
    let url = format!(
        "etcd://app:{PASSWORD}@{endpoint}/app?{}",
        tls_query(&ca.ca_path(), &client.cert, &client.key)
    );
    assert_mismatch_named_at_once(
        &url,
        &format!("etcd at {endpoint} does not offer TLS (it answered in plaintext), and cacert="),
    )
    .await;
    drop(dir);
}

/// A URL without `cacert=` against a member serving TLS alone: refused at
/// once, naming the endpoint, the mismatch and what to add to the URL (it
/// said `stream closed because of a broken pipe` after 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_url_against_a_tls_member_names_the_mismatch() {
    let secured = Secured::start(None).await;
    let endpoint = secured.cluster.endpoints().join(",");
    for userinfo in ["", &format!("app:{PASSWORD}@")] {
        assert_mismatch_named_at_once(
            &format!("etcd://{userinfo}{endpoint}/app"),
            &format!("etcd at {endpoint} requires TLS, and the URL gives no cacert="),
        )
        .await;
    }
}
