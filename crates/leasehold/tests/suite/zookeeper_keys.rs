//! The store primitive on ZooKeeper (`ZkKeys`), under a root of its own
//! on the run's shared server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold::backend::KeyedStore;
use leasehold::backend::zookeeper::ZkKeys;
use leasehold::backend::{Check, KeyWatch, Keys, Range, Revision, Write};
use leasehold::store::{Access, SessionId, SessionLease, Store, StoreUrl};
use leasehold::testing::keys::KeysHarness;
use leasehold_testkit::ZooKeeperServer;
use leasehold_testkit::shared::{self, Server};

/// A root of its own on the shared server; every handle connects anew.
struct ZooKeeper {
    _server: Server<ZooKeeperServer>,
    url: String,
}

async fn zookeeper() -> ZooKeeper {
    let server = tokio::task::spawn_blocking(shared::zookeeper)
        .await
        .expect("server start");
    let url = server.url(&shared::unique("/keys"));
    ZooKeeper {
        _server: server,
        url,
    }
}

#[async_trait]
impl KeysHarness for ZooKeeper {
    type Keys = ZkKeys;

    async fn open(&self) -> Arc<ZkKeys> {
        let StoreUrl::ZooKeeper(url) = self.url.parse().expect("a zk:// URL") else {
            panic!("not a ZooKeeper URL: {}", self.url);
        };
        Arc::new(
            ZkKeys::open(&url, Access::ReadWrite)
                .await
                .expect("connect"),
        )
    }
}

leasehold::keys_conformance_tests!(zookeeper());

/// The primitive on ZooKeeper, counting its reads.
#[derive(Debug)]
struct Counting {
    keys: Arc<ZkKeys>,
    reads: AtomicU64,
}

#[async_trait]
impl Keys for Counting {
    async fn open_session(&self, ttl: Duration) -> leasehold::Result<SessionLease> {
        self.keys.open_session(ttl).await
    }
    async fn keep_alive(&self, session: SessionId) -> leasehold::Result<Duration> {
        self.keys.keep_alive(session).await
    }
    async fn close_session(&self, session: SessionId) -> leasehold::Result<()> {
        self.keys.close_session(session).await
    }
    async fn commit(
        &self,
        checks: &[Check],
        writes: &[Write],
    ) -> leasehold::Result<Option<Revision>> {
        self.keys.commit(checks, writes).await
    }
    async fn range(&self, prefix: &str) -> leasehold::Result<Range> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.keys.range(prefix).await
    }
    async fn watch(&self, prefix: &str, from: Revision) -> leasehold::Result<KeyWatch> {
        self.keys.watch(prefix, from).await
    }
    async fn session_ended(&self, session: SessionId) {
        self.keys.session_ended(session).await;
    }
    fn properties(&self) -> leasehold::backend::Properties {
        self.keys.properties()
    }
}

/// No herd: with 30 candidates waiting, a release wakes the next in line
/// alone (each waiter watches the candidate just ahead of its own, and
/// the directory's watch tells each prefix of its own keys alone), so a
/// handover costs one or two reads of the candidates, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_next_in_line() {
    let zk = zookeeper().await;
    let keys = Counting {
        keys: zk.open().await,
        reads: AtomicU64::new(0),
    };
    let store = Arc::new(KeyedStore::over(keys));
    let election = leasehold::testing::unique_election("herd");
    let ttl = Duration::from_secs(30);
    let mut grant =
        leasehold::testing::campaign_on_new_session(&*store, &election, "holder", ttl).await;
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..30 {
        let (store, election, tx) = (Arc::clone(&store), election.clone(), tx.clone());
        tokio::spawn(async move {
            let who = format!("w{i}");
            let grant =
                leasehold::testing::campaign_on_new_session(&*store, &election, &who, ttl).await;
            let _ = tx.send(grant);
        });
    }
    let candidates = format!("{election}:c:");
    let in_line = async {
        while store
            .keys()
            .keys
            .range(&candidates)
            .await
            .expect("read")
            .entries
            .len()
            < 31
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), in_line)
        .await
        .expect("30 waiters in line");
    for handover in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = store.keys().reads.load(Ordering::SeqCst);
        store.resign(&grant).await.expect("resign");
        let next = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("the next is granted")
            .expect("a waiter");
        assert!(next.token > grant.token, "tokens increase");
        grant = next;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let reads = store.keys().reads.load(Ordering::SeqCst) - before;
        assert!(
            (1..=2).contains(&reads),
            "handover {handover}: {reads} reads of the candidates for 30 waiters"
        );
    }
}

/// A watch is told when its election's node is deleted by hand with
/// everything in it, in one transaction: the node then reads as revision
/// 0, below what the watch was told, and once nothing was told (a leader
/// whose election node was deleted kept leading, its waiters waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_told_when_its_election_node_is_deleted() {
    let zk = zookeeper().await;
    let keys = zk.open().await;
    let session = keys
        .open_session(Duration::from_secs(30))
        .await
        .expect("open")
        .id;
    let put = Write::Put {
        key: "gone:c:1".into(),
        value: "a".into(),
        session: Some(session),
    };
    keys.commit(&[], &[put])
        .await
        .expect("commit")
        .expect("written");
    let at = keys.range("gone:c:").await.expect("range").revision;
    let mut watch = keys.watch("gone:c:", at).await.expect("watch");
    let StoreUrl::ZooKeeper(url) = zk.url.parse().expect("a zk:// URL") else {
        panic!("not a ZooKeeper URL");
    };
    let client = zookeeper_client::Client::connect(&url.endpoints()[0])
        .await
        .expect("connect");
    let node = format!("{}/elections/gone", url.path());
    let mut multi = client.new_multi_writer();
    multi.add_delete(&format!("{node}/:c:1"), None).expect("op");
    multi.add_delete(&node, None).expect("op");
    multi.commit().await.expect("deleted by hand");
    tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("the watch is told")
        .expect("the watch is open");
    assert!(
        keys.range("gone:c:")
            .await
            .expect("range")
            .entries
            .is_empty()
    );
}
