//! The ZooKeeper store in other clients' election layouts
//! (`?layout=curator`: Curator's `LeaderLatch`; `?layout=kazoo`: kazoo's
//! `Election`) against a real server: the conformance cases of one
//! election, and nodes written exactly as those clients write them (with
//! the raw client), which leasehold must take part in one election with.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::zookeeper::RecipeStore;
use leasehold::store::{Access, ClusterUrl, FencingToken, Layout, Store};
use leasehold::testing::ServerHarness;
use leasehold::{CandidateId, ElectionName, Error};
use leasehold_testkit::ZooKeeperServer;
use leasehold_testkit::shared::{self, Server};
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions};

async fn server() -> ZooKeeperServer {
    tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .expect("server start")
}

/// The conformance suite's store: a root of its own on the run's shared
/// server (see `leasehold_testkit::shared`).
async fn harness(layout: &str) -> ServerHarness<Server<ZooKeeperServer>> {
    let server = tokio::task::spawn_blocking(shared::zookeeper)
        .await
        .expect("server start");
    let root = shared::unique("/recipes");
    let url = format!("{}?layout={layout}", server.url(&root));
    ServerHarness::new(server, &url)
}

/// The URL of `root` on `server`, in `layout`.
fn recipe_url(server: &ZooKeeperServer, root: &str, layout: Layout) -> ClusterUrl {
    format!("{}?layout={layout}", server.url(root))
        .parse()
        .expect("a valid URL")
}

async fn store(server: &ZooKeeperServer, root: &str, layout: Layout) -> Arc<RecipeStore> {
    Arc::new(
        RecipeStore::open(&recipe_url(server, root, layout), Access::ReadWrite)
            .await
            .expect("connect"),
    )
}

async fn raw_client(server: &ZooKeeperServer) -> Client {
    Client::connect(&server.endpoints()[0])
        .await
        .expect("connect")
}

fn open(mode: CreateMode) -> CreateOptions<'static> {
    mode.with_acls(Acls::anyone_all())
}

fn name(name: &str) -> ElectionName {
    ElectionName::new(name).expect("name")
}

fn id(id: &str) -> CandidateId {
    CandidateId::new(id).expect("id")
}

/// A version-4 UUID's text, made up (the tests need names of the shape,
/// not randomness).
fn uuid(n: u32) -> String {
    format!("{n:08x}-1111-4222-8333-444455556666")
}

/// Campaigns as `who` on a new session of `ttl` in a task.
fn spawn_campaign(
    store: &Arc<RecipeStore>,
    election: &ElectionName,
    who: &str,
    ttl: Duration,
) -> tokio::task::JoinHandle<leasehold::store::Grant> {
    let (store, election, who) = (Arc::clone(store), election.clone(), who.to_owned());
    tokio::spawn(async move {
        let lease = store.open_session(ttl).await.expect("open");
        store
            .campaign(lease.id, &election, &id(&who))
            .await
            .expect("campaign")
    })
}

/// The children of `dir` and their data.
async fn children(raw: &Client, dir: &str) -> Vec<(String, Vec<u8>, zookeeper_client::Stat)> {
    let mut out = Vec::new();
    let mut names = raw.list_children(dir).await.expect("list");
    names.sort();
    for child in names {
        let (data, stat) = raw.get_data(&format!("{dir}/{child}")).await.expect("read");
        out.push((child, data, stat));
    }
    out
}

/// Whether some session of the server watches `path` (from `wchp`).
fn watched(server: &ZooKeeperServer, path: &str) -> bool {
    server
        .four_letter("wchp")
        .unwrap_or_default()
        .lines()
        .any(|line| line.trim() == path)
}

/// What only leasehold's own layout can keep is refused, whichever recipe.
async fn refusals(layout: Layout) {
    let server = server().await;
    let store = store(&server, "/recipes", layout).await;
    let raw = raw_client(&server).await;
    // No marker, no node of leasehold's: opening wrote nothing.
    assert!(raw.check_stat("/recipes").await.expect("stat").is_none());
    for bad in ["a//b", "a/./b", "a/..", "a/"] {
        let lease = store
            .open_session(Duration::from_secs(10))
            .await
            .expect("open");
        match store.campaign(lease.id, &name(bad), &id("a")).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("{bad}: expected InvalidInput, got {other:?}"),
        }
        assert!(matches!(
            store.leader(&name(bad)).await,
            Err(Error::InvalidInput { .. })
        ));
    }
    let rootless = self::store(&server, "", layout).await;
    match rootless.leader(&name("zookeeper/config")).await {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("/zookeeper must be refused, got {other:?}"),
    }
    let message = match store.elections().await {
        Err(Error::Unsupported(message)) => message,
        other => panic!("listing must be refused, got {other:?}"),
    };
    assert!(message.contains("only line"), "{message}");
    assert!(
        message.contains("priorities, lock-delay, transfers, shards, slots"),
        "{message}"
    );
    assert!(matches!(
        store.last_release(&name("x")).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.watch_notes(&name("x")).await,
        Err(Error::Unsupported(_))
    ));
    let lease = store
        .open_session(Duration::from_secs(10))
        .await
        .expect("open");
    assert!(matches!(
        store.watch_note(lease.id, &name("x"), "n").await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.delete_note(lease.id, &name("x"), "n").await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.amend_note(lease.id, &name("x"), "n", "t").await,
        Err(Error::Unsupported(_))
    ));
    // Nothing was written by any of it.
    assert!(raw.check_stat("/recipes").await.expect("stat").is_none());
    // A read-only opening of a path nobody used reads no leader.
    let reader = RecipeStore::open(&recipe_url(&server, "/nothing", layout), Access::ReadOnly)
        .await
        .expect("read-only");
    assert_eq!(reader.leader(&name("job")).await.expect("read"), None);
    assert!(raw.check_stat("/nothing").await.expect("stat").is_none());
    // A leasehold store's root, or a node inside one, is not a recipe's
    // path: its candidates would stand among that store's nodes.
    let own: ClusterUrl = server.url("/own").parse().expect("a valid URL");
    leasehold::backend::zookeeper::ZkStore::open(&own, Access::ReadWrite)
        .await
        .expect("a leasehold store");
    for (path, says) in [
        ("/own", "is a leasehold store"),
        ("/own/elections", "inside the leasehold store at /own"),
    ] {
        match RecipeStore::open(&recipe_url(&server, path, layout), Access::ReadWrite).await {
            Err(Error::InvalidInput { reason, .. }) => assert!(reason.contains(says), "{reason}"),
            other => panic!("{path}: expected InvalidInput, got {other:?}"),
        }
    }
    // Nor is it when the election's name leads there from a path outside
    // (a review once ran a Curator-layout candidate in /own/elections/e,
    // where it led beside leasehold's own leader).
    let rootless = self::store(&server, "", layout).await;
    let lease = rootless
        .open_session(Duration::from_secs(10))
        .await
        .expect("open");
    for (election, says) in [
        ("own", "is a leasehold store"),
        ("own/elections", "inside the leasehold store at /own"),
        ("own/elections/e", "inside the leasehold store at /own"),
    ] {
        match rootless.campaign(lease.id, &name(election), &id("a")).await {
            Err(Error::InvalidInput { what, reason }) => {
                assert_eq!(what, "election name");
                assert!(reason.contains(says), "{reason}");
            }
            other => panic!("{election}: expected InvalidInput, got {other:?}"),
        }
    }
    let under_own = children(&raw, "/own/elections").await;
    assert!(
        under_own
            .iter()
            .all(|(name, _, _)| !name.contains("latch") && !name.contains("lock")),
        "a candidate was written into the leasehold store: {under_own:?}"
    );
}

/// A campaign makes the missing nodes of the election's path, without any
/// data and not ephemeral (whether a node is a container, as Curator makes
/// them, or persistent, as kazoo does, the server does not tell clients);
/// a resign deletes the candidate node alone.
async fn parents_are_made(layout: Layout) {
    let server = server().await;
    let store = store(&server, "/made/here", layout).await;
    let raw = raw_client(&server).await;
    let election = name("team/job");
    let grant = spawn_campaign(&store, &election, "a", Duration::from_secs(10))
        .await
        .expect("task");
    for path in [
        "/made",
        "/made/here",
        "/made/here/team",
        "/made/here/team/job",
    ] {
        let (data, stat) = raw.get_data(path).await.expect("made");
        assert!(data.is_empty(), "{path}");
        assert_eq!(stat.ephemeral_owner, 0, "{path}");
    }
    store.resign(&grant).await.expect("resign");
    assert!(
        raw.list_children("/made/here/team/job")
            .await
            .unwrap_or_default()
            .is_empty()
    );
}

/// No herd: with 12 candidates waiting, the server holds exactly one
/// watch on the candidate node just ahead of each waiter's in the
/// recipe's order, and none on any other candidate (read from the
/// server's `wchc`), as the recipe's own clients set them. (The watches
/// are the store handle's, as all of a handle's watches are, not each
/// waiter's session's.)
async fn each_waiter_watches_only_its_predecessor(layout: Layout) {
    let server = server().await;
    let store = store(&server, "/herd", layout).await;
    let raw = raw_client(&server).await;
    let election = name("job");
    let dir = "/herd/job";
    let holder = spawn_campaign(&store, &election, "holder", Duration::from_secs(30))
        .await
        .expect("task");
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..12 {
        let (store, election) = (Arc::clone(&store), election.clone());
        waiting.spawn(async move {
            let lease = store
                .open_session(Duration::from_secs(30))
                .await
                .expect("open");
            store
                .campaign(lease.id, &election, &id(&format!("w{i}")))
                .await
                .expect("campaign")
        });
    }
    // Every watch the server holds on a candidate node, by any session.
    let watches = || {
        let answer = server.four_letter("wchc").unwrap_or_default();
        let mut paths: Vec<String> = (answer.lines())
            .map(str::trim)
            .filter(|line| line.starts_with(&format!("{dir}/")))
            .map(str::to_owned)
            .collect();
        paths.sort();
        paths
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while watches().len() < 12 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("12 waiters watching");
    // In line: the sequence, the last ten characters of both recipes' names.
    let mut nodes = children(&raw, dir).await;
    nodes.sort_by(|a, b| a.0[a.0.len() - 10..].cmp(&b.0[b.0.len() - 10..]));
    assert_eq!(nodes.len(), 13, "the holder and 12 waiters: {nodes:?}");
    let mut predecessors: Vec<String> = (nodes[..12].iter())
        .map(|(name, _, _)| format!("{dir}/{name}"))
        .collect();
    predecessors.sort();
    assert_eq!(
        watches(),
        predecessors,
        "one watch on the node just ahead of each waiter, none on the last"
    );
    store.resign(&holder).await.expect("resign");
    let next = tokio::time::timeout(Duration::from_secs(10), waiting.join_next())
        .await
        .expect("a waiter is granted")
        .expect("a waiter")
        .expect("task");
    assert!(next.token > holder.token);
    waiting.abort_all();
}

/// A dropped campaign deletes its node; a campaign dropped and at once
/// made again on the same session ends with one node of the session, the
/// one it is granted on, never two.
async fn a_dropped_campaign_withdraws_its_node(layout: Layout) {
    let server = server().await;
    let store = store(&server, "/withdraw", layout).await;
    let election = name("job");
    let holder = spawn_campaign(&store, &election, "holder", Duration::from_secs(30))
        .await
        .expect("task");
    let waiter = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let nodes = || store.candidate_keys(waiter.id, &election);
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        store.campaign(waiter.id, &election, &id("b")),
    )
    .await;
    assert!(attempt.is_err(), "b was granted a held election");
    tokio::time::timeout(Duration::from_secs(5), async {
        while nodes().await.expect("count") != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the dropped campaign's node is deleted");
    // Dropped, then made again at once on the same session.
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        store.campaign(waiter.id, &election, &id("b")),
    )
    .await;
    assert!(attempt.is_err(), "b was granted a held election");
    let again = {
        let (store, election) = (Arc::clone(&store), election.clone());
        tokio::spawn(async move { store.campaign(waiter.id, &election, &id("b")).await })
    };
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            nodes().await.expect("count") <= 1,
            "two nodes of one session"
        );
    }
    store.resign(&holder).await.expect("resign");
    let grant = tokio::time::timeout(Duration::from_secs(10), again)
        .await
        .expect("granted")
        .expect("task")
        .expect("campaign");
    assert!(grant.token > holder.token);
    assert_eq!(nodes().await.expect("count"), 1);
    let leader = store
        .leader(&election)
        .await
        .expect("read")
        .expect("b leads");
    assert_eq!(leader.token, grant.token);
}

mod curator {
    use super::*;

    async fn harness() -> ServerHarness<Server<ZooKeeperServer>> {
        super::harness("curator").await
    }

    leasehold::conformance_tests!(@recipe harness());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_only_leasehold_keeps_is_refused() {
        refusals(Layout::Curator).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_nodes_are_made() {
        parents_are_made(Layout::Curator).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_waiter_watches_only_its_predecessor() {
        super::each_waiter_watches_only_its_predecessor(Layout::Curator).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_campaign_withdraws_its_node() {
        super::a_dropped_campaign_withdraws_its_node(Layout::Curator).await;
    }

    /// A `LeaderLatch` participant's node, written as Curator writes it,
    /// leads (its data the id, its `czxid` the token); a leasehold
    /// candidate joins the same line with a node of the same shape, waits
    /// behind it watching it, and is granted once it is deleted. A node
    /// without `latch-` that sorts later is left alone and does not block.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_latch_node_written_as_curator_does_leads_and_a_campaign_waits_behind_it() {
        let server = server().await;
        let store = store(&server, "/recipes", Layout::Curator).await;
        let raw = raw_client(&server).await;
        let election = name("job/nightly");
        let latch = "/recipes/job/nightly";
        raw.mkdir(latch, &open(CreateMode::Container))
            .await
            .expect("the latch path, as Curator makes it");
        let (java, _) = raw
            .create(
                &format!("{latch}/_c_{}-latch-", uuid(1)),
                b"java-1",
                &open(CreateMode::EphemeralSequential),
            )
            .await
            .expect("a Curator participant");
        raw.create(
            &format!("{latch}/zz-other"),
            b"x",
            &open(CreateMode::Persistent),
        )
        .await
        .expect("a node that is no participant's");
        let java_node = children(&raw, latch)
            .await
            .into_iter()
            .find(|(_, data, _)| data == b"java-1")
            .expect("the participant's node")
            .0;
        let leader = store
            .leader(&election)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!(leader.candidate.as_str(), "java-1");
        assert_eq!(leader.token, FencingToken::from_stored(java.czxid));
        // Another client's session: the reader's negotiated timeout, an
        // estimate (the store's reader asks for 10 s).
        assert_eq!(leader.expires_in, Duration::from_secs(10));

        let campaign = spawn_campaign(&store, &election, "rust-1", Duration::from_secs(30));
        let java_path = format!("{latch}/{java_node}");
        let waiting = async {
            while !watched(&server, &java_path) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the campaign watches the node ahead of it");
        assert!(
            !campaign.is_finished(),
            "granted while Curator's participant led"
        );
        let nodes = children(&raw, latch).await;
        let (ours, _, our_stat) = nodes
            .iter()
            .find(|(_, data, _)| data == b"rust-1")
            .expect("leasehold's node");
        // `_c_{uuid}-latch-{sequence}`, ephemeral.
        assert!(ours.starts_with("_c_"), "{ours}");
        assert_eq!(&ours[39..46], "-latch-", "{ours}");
        assert_eq!(ours.len(), 56, "{ours}");
        assert!(ours[46..].bytes().all(|b| b.is_ascii_digit()), "{ours}");
        assert_ne!(our_stat.ephemeral_owner, 0);
        assert_eq!(nodes.len(), 3, "{nodes:?}");
        assert_eq!(
            store
                .leader(&election)
                .await
                .expect("read")
                .map(|l| l.token),
            Some(leader.token),
            "Curator's participant still leads"
        );

        raw.delete(&java_path, None)
            .await
            .expect("the participant closes");
        let grant = tokio::time::timeout(Duration::from_secs(10), campaign)
            .await
            .expect("granted once the participant is gone")
            .expect("task");
        assert!(grant.token > leader.token);
        let now = store
            .leader(&election)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!(now.candidate.as_str(), "rust-1");
        assert_eq!(now.token, grant.token);
        // This store's own session: its TTL.
        assert_eq!(now.expires_in, Duration::from_secs(30));
        assert_eq!(now.token, FencingToken::from_stored(our_stat.czxid));

        store.resign(&grant).await.expect("resign");
        let left: Vec<String> = children(&raw, latch)
            .await
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(left, ["zz-other"], "only leasehold's node is deleted");
        // A node that sorts after every sequence is Curator's last
        // participant: it is the leader now, for Curator as for leasehold.
        let last = store
            .leader(&election)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!(last.candidate.as_str(), "x");
        assert!(matches!(
            store.resign(&grant).await,
            Err(Error::NotHolder { .. })
        ));
        assert!(
            raw.check_stat(&format!("{latch}/zz-other"))
                .await
                .expect("stat")
                .is_some()
        );
    }
}

mod kazoo {
    use super::*;

    async fn harness() -> ServerHarness<Server<ZooKeeperServer>> {
        super::harness("kazoo").await
    }

    leasehold::conformance_tests!(@recipe harness());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_only_leasehold_keeps_is_refused() {
        refusals(Layout::Kazoo).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_nodes_are_made() {
        parents_are_made(Layout::Kazoo).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_waiter_watches_only_its_predecessor() {
        super::each_waiter_watches_only_its_predecessor(Layout::Kazoo).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_campaign_withdraws_its_node() {
        super::a_dropped_campaign_withdraws_its_node(Layout::Kazoo).await;
    }

    /// An `Election` contender's node, written as kazoo writes it, leads;
    /// a read lock's node ahead of it and a node of another kind are no
    /// contenders (kazoo's `Lock` neither counts nor waits on them); a
    /// leasehold candidate waits behind the contender alone and is granted
    /// once it is deleted, leaving the others as they are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_node_written_as_kazoo_does_leads_and_a_campaign_waits_behind_it() {
        let server = server().await;
        let store = store(&server, "/recipes", Layout::Kazoo).await;
        let raw = raw_client(&server).await;
        let election = name("job");
        let dir = "/recipes/job";
        raw.mkdir(dir, &open(CreateMode::Persistent))
            .await
            .expect("the election's path, as kazoo's ensure_path makes it");
        let ephemeral = open(CreateMode::EphemeralSequential);
        raw.create(
            &format!("{dir}/{}__rlock__", "1".repeat(32)),
            b"reader",
            &ephemeral,
        )
        .await
        .expect("a read lock's node");
        let (python, _) = raw
            .create(
                &format!("{dir}/{}__lock__", "2".repeat(32)),
                b"python-1",
                &ephemeral,
            )
            .await
            .expect("a kazoo contender");
        raw.create(
            &format!("{dir}/lease_holder"),
            b"other",
            &open(CreateMode::Persistent),
        )
        .await
        .expect("a node of another kind");
        let leader = store
            .leader(&election)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!(leader.candidate.as_str(), "python-1");
        assert_eq!(leader.token, FencingToken::from_stored(python.czxid));

        let campaign = spawn_campaign(&store, &election, "rust-1", Duration::from_secs(30));
        let python_path = format!("{dir}/{}__lock__0000000001", "2".repeat(32));
        let waiting = async {
            while !watched(&server, &python_path) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the campaign watches the contender ahead of it");
        assert!(
            !campaign.is_finished(),
            "granted while kazoo's contender led"
        );
        let nodes = children(&raw, dir).await;
        let (ours, _, _) = nodes
            .iter()
            .find(|(_, data, _)| data == b"rust-1")
            .expect("leasehold's node");
        // `{uuid hex}__lock__{sequence}`.
        assert_eq!(ours.len(), 32 + 8 + 10, "{ours}");
        assert!(
            ours[..32]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{ours}"
        );
        assert_eq!(&ours[32..40], "__lock__", "{ours}");
        assert_eq!(&ours[40..], "0000000003", "{ours}");

        raw.delete(&python_path, None)
            .await
            .expect("the contender releases");
        let grant = tokio::time::timeout(Duration::from_secs(10), campaign)
            .await
            .expect("granted with the read lock's and the other node still there")
            .expect("task");
        assert!(grant.token > leader.token);
        let now = store
            .leader(&election)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!((now.candidate.as_str(), now.token), ("rust-1", grant.token));

        store.resign(&grant).await.expect("resign");
        let left: Vec<String> = children(&raw, dir).await.into_iter().map(|c| c.0).collect();
        assert_eq!(
            left,
            [
                format!("{}__rlock__0000000000", "1".repeat(32)),
                "lease_holder".to_owned()
            ],
            "only leasehold's node is deleted"
        );
        assert_eq!(store.leader(&election).await.expect("read"), None);
    }
}
