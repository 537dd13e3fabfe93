//! ZooKeeper with digest authentication (issue 16): the conformance suite
//! on an authenticated store, intruders without or with other credentials,
//! wrong passwords and observers without credentials, against a real
//! server (Debian's zookeeper package).

use std::sync::Arc;
use std::time::Duration;

use leasehold::store::{Store, StoreUrl};
use leasehold::testing::{ServerHarness, unique_election};
use leasehold::{CandidateId, ElectionName, Elector, Error, LeaseConfig};
use leasehold_testkit::ZooKeeperServer;
use leasehold_testkit::shared::{self, Server};
use zookeeper_client::{Acl, CreateMode, Permission};

/// The user and password every replica of the test stores uses.
const USER: &str = "app";
const PASSWORD: &str = "Sup3rSecret";

async fn server() -> ZooKeeperServer {
    tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .expect("server start")
}

mod conformance {
    use super::*;

    /// A root of its own on the run's shared server (see
    /// `leasehold_testkit::shared`).
    async fn harness() -> ServerHarness<Server<ZooKeeperServer>> {
        let server = tokio::task::spawn_blocking(shared::zookeeper)
            .await
            .expect("server start");
        let url = server.url_as(USER, PASSWORD, &shared::unique("/conformance"));
        ServerHarness::new(server, &url)
    }

    leasehold::conformance_tests!(harness());
}

async fn open(url: &str) -> leasehold::Result<Arc<dyn Store>> {
    let url: StoreUrl = url.parse().expect("a valid store URL");
    leasehold::store::open(&url, leasehold::store::Access::ReadWrite).await
}

/// `error` is one line naming a refusal and never `PASSWORD` (or `secret`).
fn assert_denied(error: &Error, needle: &str, secret: &str) -> String {
    let message = error.to_string();
    eprintln!("refused: {message}");
    assert!(matches!(error, Error::Denied(_)), "not Denied: {error:?}");
    assert!(message.contains(needle), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    for hidden in [PASSWORD, secret] {
        assert!(!message.contains(hidden), "the password shows: {message}");
        assert!(!format!("{error:?}").contains(hidden), "{error:?}");
    }
    message
}

/// While an elector leads with credentials, a client without any and one
/// with another identity (another user; the right user with a wrong
/// password) can delete, change, add to or re-ACL none of leasehold's
/// nodes — the leader's candidate node, its election node, `elections`,
/// the root with its marker — and the leader still leads with the same
/// token afterwards. With open ACLs the intruder's delete of the leader's
/// node would depose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intruder_cannot_depose_the_leader() {
    let server = server().await;
    let store = open(&server.url_as(USER, PASSWORD, "/locked/app"))
        .await
        .expect("open with credentials");
    let elector = Elector::new(
        Arc::clone(&store),
        CandidateId::new("a").expect("id"),
        LeaseConfig::new(Duration::from_secs(2)),
    )
    .expect("config");
    let election = ElectionName::new("job").expect("name");
    let leadership = elector.campaign(&election).await.expect("campaign");
    let token = leadership.token();

    let owner = server.raw_client(Some(&format!("{USER}:{PASSWORD}"))).await;
    let dir = "/locked/app/elections/job";
    let candidates = owner.list_children(dir).await.expect("list");
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    let candidate = format!("{dir}/{}", candidates[0]);
    let nodes = [
        "/locked",
        "/locked/app",
        "/locked/app/elections",
        dir,
        candidate.as_str(),
    ];
    // Every node leasehold created: its creator may do all, anyone read.
    for node in nodes {
        let (acls, _) = owner.get_acl(node).await.expect("ACL");
        assert_eq!(acls.len(), 2, "{node}: {acls:?}");
        assert!(
            acls.iter().any(|a| a.scheme() == "digest"
                && a.id().starts_with("app:")
                && a.permission() == Permission::ALL),
            "{node}: {acls:?}"
        );
        assert!(
            acls.iter().any(|a| a.scheme() == "world"
                && a.id() == "anyone"
                && a.permission() == Permission::READ),
            "{node}: {acls:?}"
        );
    }

    let open_acl = [Acl::new(
        Permission::ALL,
        zookeeper_client::AuthId::anyone(),
    )];
    let options = CreateMode::Persistent.with_acls((&open_acl[..]).into());
    for identity in [None, Some("mallory:x"), Some("app:wrong")] {
        let intruder = server.raw_client(identity).await;
        for node in nodes {
            // Deleting the root itself is refused as not empty: its parent
            // is not leasehold's to guard.
            match intruder.delete(node, None).await {
                Err(zookeeper_client::Error::NoAuth) => {}
                Err(zookeeper_client::Error::NotEmpty) if node == "/locked" => {}
                other => panic!("{identity:?} deleting {node}: {other:?}"),
            }
            assert!(
                matches!(
                    intruder.set_data(node, b"leasehold 1", None).await,
                    Err(zookeeper_client::Error::NoAuth)
                ),
                "{identity:?} changed {node}"
            );
            assert!(
                matches!(
                    intruder.set_acl(node, &open_acl, None).await,
                    Err(zookeeper_client::Error::NoAuth)
                ),
                "{identity:?} changed the ACL of {node}"
            );
            let child = format!("{node}/c-0000000000000001-");
            assert!(
                matches!(
                    intruder.create(&child, b"100 forged", &options).await,
                    Err(zookeeper_client::Error::NoAuth)
                ),
                "{identity:?} created a node under {node}"
            );
        }
        // Reading is open to anyone (observers need no credentials).
        assert_eq!(
            intruder.get_data("/locked/app").await.expect("read").0,
            b"leasehold 1"
        );
    }
    // Longer than a TTL: renewals went on, the leader still leads.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(leadership.is_leader(), "the leader was deposed");
    assert_eq!(leadership.token(), token);
    let leader = store
        .leader(&election)
        .await
        .expect("read")
        .expect("a leads");
    assert_eq!((leader.candidate.as_str(), leader.token), ("a", token));
    assert_eq!(
        owner.list_children(dir).await.expect("list"),
        candidates,
        "the candidate nodes changed"
    );
}

/// A wrong password, another user and no credentials on a store made with
/// credentials are each refused at opening, in one line that says which
/// and never shows a password; a password file works; a user without a
/// password is bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_denied_in_one_line() {
    let server = server().await;
    let root = "/guarded";
    let store = open(&server.url_as(USER, PASSWORD, root))
        .await
        .expect("first use with credentials");
    let job = unique_election("creds");
    let grant =
        leasehold::testing::campaign_on_new_session(&*store, &job, "a", Duration::from_secs(10))
            .await;

    let error = open(&server.url_as(USER, "Wr0ngPass", root))
        .await
        .expect_err("a wrong password is refused");
    let message = assert_denied(
        &error,
        "wrong password for zookeeper user \"app\"",
        "Wr0ngPass",
    );
    assert!(message.contains(root), "{message}");

    let error = open(&server.url_as("bob", "B0bsPass", root))
        .await
        .expect_err("another user is refused");
    let message = assert_denied(&error, "belongs to zookeeper user \"app\"", "B0bsPass");
    assert!(message.contains("to user \"bob\""), "{message}");

    let error = open(&server.url(root))
        .await
        .expect_err("no credentials are refused");
    assert_denied(&error, "belongs to zookeeper user \"app\"", PASSWORD);

    // The refused openings wrote nothing, and the leader is untouched.
    let leader = store.leader(&job).await.expect("read").expect("a leads");
    assert_eq!(leader.token, grant.token);

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("zk-password");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("write");
    let from_file = server.url(root).replace("zk://", &format!("zk://{USER}@"))
        + &format!("?password_file={}", file.display());
    let second = open(&from_file).await.expect("a password file works");
    let other = unique_election("creds-file");
    let by_file =
        leasehold::testing::campaign_on_new_session(&*second, &other, "b", Duration::from_secs(10))
            .await;
    second.resign(&by_file).await.expect("resign");
    // Read at each connection: a wrong one now is refused.
    std::fs::write(&file, "Wr0ngPass\n").expect("write");
    let error = open(&from_file).await.expect_err("the file is read anew");
    assert_denied(&error, "wrong password", "Wr0ngPass");

    let no_password = server.url(root).replace("zk://", &format!("zk://{USER}@"));
    match open(&no_password).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("has no password"), "{reason}");
        }
        other => panic!("a user without a password must be bad input: {other:?}"),
    }
}

/// Observers (`status`, `list`, `observe`) need no credentials on an
/// authenticated store: its nodes are world-readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_read_an_authenticated_store_without_credentials() {
    let server = server().await;
    let root = "/observed";
    let store = open(&server.url_as(USER, PASSWORD, root))
        .await
        .expect("open");
    let job = unique_election("observed");
    let grant =
        leasehold::testing::campaign_on_new_session(&*store, &job, "a", Duration::from_secs(10))
            .await;
    let url: StoreUrl = server.url(root).parse().expect("url");
    let observer = leasehold::store::open(&url, leasehold::store::Access::ReadOnly)
        .await
        .expect("read-only without credentials");
    let leader = observer.leader(&job).await.expect("read").expect("a leads");
    assert_eq!(
        (leader.candidate.as_str(), leader.token),
        ("a", grant.token)
    );
    let listed = observer.elections().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].election, job);
    let mut status = observer.watch_status(&job).await.expect("watch");
    store.resign(&grant).await.expect("resign");
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| matches!(s, leasehold::store::LeaderStatus::Known(None))),
    )
    .await
    .expect("the observer sees the release")
    .expect("watch open");
}

/// The guard's release of a dead holder's grant (`release_orphaned`, on a
/// connection of its own) works with credentials, and is refused clearly
/// without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_grant_is_released_with_credentials() {
    let server = server().await;
    let root = "/orphans";
    let store = open(&server.url_as(USER, PASSWORD, root))
        .await
        .expect("open");
    let job = unique_election("orphan");
    let grant =
        leasehold::testing::campaign_on_new_session(&*store, &job, "a", Duration::from_secs(30))
            .await;
    let anonymous: StoreUrl = server.url(root).parse().expect("url");
    let error = release_orphaned(&anonymous, &grant)
        .await
        .expect_err("no credentials may not delete the node");
    assert_denied(&error, "permission denied on zookeeper node", PASSWORD);
    assert!(store.leader(&job).await.expect("read").is_some());
    let url: StoreUrl = server.url_as(USER, PASSWORD, root).parse().expect("url");
    release_orphaned(&url, &grant)
        .await
        .expect("released with credentials");
    assert_eq!(store.leader(&job).await.expect("read"), None);
}

/// What a runner's guard does after its runner died.
async fn release_orphaned(url: &StoreUrl, grant: &leasehold::Grant) -> leasehold::Result<()> {
    let store = leasehold::store::open(url, leasehold::store::Access::ReleaseOnly).await?;
    store.release_orphaned(grant).await
}
