//! `?layout=concurrency`: the etcd store laid out as etcd's own
//! `concurrency.Election`, against a real etcd; the keys of that recipe's
//! clients are written here with Debian's `etcdctl`, byte for byte as the
//! recipe writes them (the interop tests with `etcdctl elect` itself are the
//! CLI's).

use std::sync::Arc;
use std::time::Duration;

use leasehold::store::Store;
use leasehold::testing::{ServerHarness, unique_election};
use leasehold::{CandidateId, ElectionName, Elector, LeaseConfig};
use leasehold_testkit::EtcdCluster;

async fn cluster() -> EtcdCluster {
    tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .expect("cluster start")
}

async fn harness() -> ServerHarness<EtcdCluster> {
    let cluster = cluster().await;
    let url = format!("{}?layout=concurrency", cluster.url("/recipes"));
    ServerHarness::new(cluster, &url)
}

leasehold::conformance_tests!(@recipe harness());

/// The store of `cluster` with elections at the top of the keyspace, as
/// `etcdctl elect NAME` names them.
async fn top_level(cluster: &EtcdCluster) -> Arc<dyn Store> {
    let url = format!(
        "etcd://{}?layout=concurrency",
        cluster.endpoints().join(",")
    );
    leasehold::store::open(
        &url.parse().expect("url"),
        leasehold::store::Access::ReadWrite,
    )
    .await
    .expect("open")
}

/// `(key, value, lease, create_revision)` of every key under `prefix`.
fn keys_under(cluster: &EtcdCluster, prefix: &str) -> Vec<(String, String, i64, i64)> {
    let json = cluster.etcdctl(&["get", "--prefix", prefix, "-w", "json"]);
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("etcdctl json");
    let text = |v: &serde_json::Value| {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("base64");
        String::from_utf8(bytes).expect("utf-8")
    };
    parsed["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    (
                        text(&kv["key"]),
                        text(&kv["value"]),
                        kv["lease"].as_i64().unwrap_or(0),
                        kv["create_revision"].as_i64().expect("create revision"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn elector(store: &Arc<dyn Store>, id: &str) -> Arc<Elector> {
    Arc::new(
        Elector::new(
            Arc::clone(store),
            CandidateId::new(id).expect("id"),
            LeaseConfig::new(Duration::from_secs(5)),
        )
        .expect("config"),
    )
}

/// A leasehold candidate is exactly a candidate of etcd's recipe: the key
/// `E/<lease id in %x>` with its session's lease, its id as the proposal,
/// and nothing else of leasehold's anywhere in the keyspace (no marker, no
/// notes, no record of releases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasehold_candidate_is_a_candidate_of_etcds_recipe() {
    let cluster = cluster().await;
    let store = top_level(&cluster).await;
    let election = ElectionName::new("svc/leader").expect("name");
    let a = elector(&store, "web-1");
    let leadership = a.campaign(&election).await.expect("campaign");
    let session = a.session().await.expect("session").id();
    let keys = keys_under(&cluster, "");
    assert_eq!(
        keys,
        [(
            format!("svc/leader/{:x}", session.0),
            "web-1".to_owned(),
            i64::try_from(session.0).expect("lease id"),
            i64::try_from(leadership.token().0).expect("token"),
        )],
        "the only key is the candidate, named and filled as the recipe does"
    );
    leadership.resign().await.expect("resign");
    assert_eq!(
        keys_under(&cluster, ""),
        [],
        "a release leaves nothing behind"
    );
    a.close().await.expect("close");
}

/// A candidate of etcd's recipe that came first leads: leasehold shows it
/// (its proposal as id, its create revision as token) and waits behind
/// it; when its lease ends, leasehold is granted with a higher token. A
/// key under the prefix that no recipe client wrote (no lease, any name)
/// is a candidate too, since the recipe counts every key there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipe_candidate_that_came_first_leads_and_leasehold_waits() {
    let cluster = cluster().await;
    let store = top_level(&cluster).await;
    let election = unique_election("etcdctl");
    let granted = cluster.etcdctl(&["lease", "grant", "60"]);
    // "lease 694d7a5c4c0bc705 granted with TTL(60s)"
    let lease = granted
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_owned();
    let key = format!("{election}/{lease}");
    cluster.etcdctl(&["put", &format!("--lease={lease}"), &key, "go-replica"]);
    let (_, _, _, created) = keys_under(&cluster, &key)[0].clone();
    let leader = store
        .leader(&election)
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(leader.candidate.as_str(), "go-replica");
    assert_eq!(leader.token.0, u64::try_from(created).expect("revision"));

    let a = elector(&store, "leasehold-1");
    let campaign = tokio::spawn({
        let (a, election) = (Arc::clone(&a), election.clone());
        async move { a.campaign(&election).await }
    });
    // Not granted while the recipe's candidate holds: checked after the
    // campaign's key is in place behind it.
    let mut queued = false;
    for _ in 0..100 {
        if keys_under(&cluster, &format!("{election}/")).len() == 2 {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(queued, "leasehold's candidate key never appeared");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign.is_finished(), "granted while go-replica held");
    cluster.etcdctl(&["lease", "revoke", &lease]);
    let leadership = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("granted once the recipe's candidate is gone")
        .expect("task")
        .expect("campaign");
    assert!(leadership.token().0 > leader.token.0);
    leadership.resign().await.expect("resign");

    // A key without a lease, not named by a lease, counts too.
    cluster.etcdctl(&["put", &format!("{election}/zz-manual"), "by hand"]);
    let leader = store
        .leader(&election)
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(leader.candidate.as_str(), "by hand");
    a.close().await.expect("close");
}

/// The prefix `/` is the root: election `leader` is then the key prefix
/// `/leader/`, which `etcdctl elect /leader` uses (no prefix at all is
/// `leader/`, as `etcdctl elect leader`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_prefix_reaches_an_election_named_with_a_leading_slash() {
    let cluster = cluster().await;
    let url = format!(
        "etcd://{}/?layout=concurrency",
        cluster.endpoints().join(",")
    );
    let store = leasehold::store::open(
        &url.parse().expect("url"),
        leasehold::store::Access::ReadWrite,
    )
    .await
    .expect("open");
    let a = elector(&store, "root-1");
    let leadership = a
        .campaign(&ElectionName::new("leader").expect("name"))
        .await
        .expect("campaign");
    let session = a.session().await.expect("session").id();
    let keys: Vec<String> = keys_under(&cluster, "")
        .into_iter()
        .map(|(key, ..)| key)
        .collect();
    assert_eq!(keys, [format!("/leader/{:x}", session.0)]);
    leadership.resign().await.expect("resign");
    a.close().await.expect("close");
}

/// A key another program rewrote (a put keeps its create revision, and
/// without `--lease` detaches it from the session) is no longer
/// leasehold's: its release refuses to delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_key_another_program_rewrote_is_not_deleted() {
    let cluster = cluster().await;
    let store = top_level(&cluster).await;
    let election = unique_election("hijacked");
    let lease = store
        .open_session(Duration::from_secs(10))
        .await
        .expect("session");
    let grant = store
        .campaign(lease.id, &election, &CandidateId::new("mine").expect("id"))
        .await
        .expect("campaign");
    let key = format!("{election}/{:x}", lease.id.0);
    cluster.etcdctl(&["put", &key, "someone else's"]);
    assert!(matches!(
        store.resign(&grant).await,
        Err(leasehold::Error::NotHolder { .. })
    ));
    let left = keys_under(&cluster, &key);
    assert_eq!(left.len(), 1, "the rewritten key must stay: {left:?}");
    assert_eq!(left[0].1, "someone else's");
    store.close_session(lease.id).await.expect("close");
}

/// etcd's recipe layout at a prefix that is a leasehold store, or lies
/// inside one, is refused before anything is written (a review found it
/// reporting the store's own leader of `e/x` as leader of `e`, and writing
/// keys into the store at `/lh7` from `/lh7/sub`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipe_layout_inside_a_leasehold_store_is_refused() {
    let cluster = cluster().await;
    let own = leasehold::backend::etcd::EtcdStore::connect(
        &cluster.endpoints(),
        "/lhstore",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("a leasehold store");
    let election = ElectionName::new("e/x").expect("name");
    leasehold::testing::campaign_on_new_session(&own, &election, "own", Duration::from_secs(30))
        .await;
    let keys = || {
        let out = std::process::Command::new("etcdctl")
            .args(["--endpoints", &cluster.endpoints().join(",")])
            .args(["get", "--prefix", "--keys-only", ""])
            .output()
            .expect("etcdctl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = keys();
    for prefix in ["/lhstore", "/lhstore/sub"] {
        let url = format!("{}?layout=concurrency", cluster.url(prefix));
        let opened = leasehold::store::open(
            &url.parse().expect("url"),
            leasehold::store::Access::ReadWrite,
        )
        .await;
        match opened {
            Err(leasehold::Error::InvalidInput { reason, .. }) => {
                assert!(reason.contains("a prefix of its own"), "{prefix}: {reason}");
            }
            other => panic!("{prefix}: a recipe layout in a store was opened: {other:?}"),
        }
    }
    // Nor is it when the election's name leads there from the root (a
    // review once wrote a candidate key into /rvown from `--election
    // rvown`; the store would then have refused to open).
    let url = format!("{}?layout=concurrency", cluster.url("/"));
    let root = leasehold::store::open(
        &url.parse().expect("url"),
        leasehold::store::Access::ReadWrite,
    )
    .await
    .expect("the root");
    let lease = root
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    for name in ["lhstore", "lhstore/sub", "lhstore/e/x"] {
        let election = ElectionName::new(name).expect("name");
        let candidate = leasehold::CandidateId::new("recipe").expect("id");
        match root.campaign(lease.id, &election, &candidate).await {
            Err(leasehold::Error::InvalidInput { what, reason }) => {
                assert_eq!(what, "election name");
                assert!(reason.contains("a prefix of its own"), "{name}: {reason}");
            }
            other => panic!("{name}: a candidate went into the store: {other:?}"),
        }
    }
    root.close_session(lease.id).await.expect("close");
    assert_eq!(keys(), before, "something was written");
    leasehold::backend::etcd::EtcdStore::connect(
        &cluster.endpoints(),
        "/lhstore",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("the store still opens");
}
