//! The conformance suite and ZooKeeper-specific cases against a real server
//! (Debian's zookeeper package), started per test on a free loopback port.
//! The reconnect cases follow the double-leader reports against Curator's
//! leader recipes (apache/curator issues 1211, 1169, 1137).

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::zookeeper::ZkStore;
use leasehold::store::Store;
use leasehold::testing::{ServerHarness, campaign_until_granted, spawn_campaign, unique_election};
use leasehold::{CandidateId, Elector, LeaderStatus, LeaseConfig, LostReason};
use leasehold_testkit::ZooKeeperServer;
use leasehold_testkit::shared::{self, Server};
use nix::sys::signal::Signal;
use tokio::time::Instant;

async fn server() -> ZooKeeperServer {
    tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .expect("server start")
}

/// The conformance suite's store: a root of its own on the run's shared
/// server (see `leasehold_testkit::shared`).
async fn harness() -> ServerHarness<Server<ZooKeeperServer>> {
    let server = tokio::task::spawn_blocking(shared::zookeeper)
        .await
        .expect("server start");
    let url = server.url(&shared::unique("/conformance"));
    ServerHarness::new(server, &url)
}

leasehold::conformance_tests!(harness());

async fn store(server: &ZooKeeperServer) -> Arc<ZkStore> {
    Arc::new(
        ZkStore::connect(
            &server.endpoints(),
            "/faults",
            &leasehold::store::Security::none(),
        )
        .await
        .expect("connect"),
    )
}

fn elector(store: &Arc<ZkStore>, id: &str, ttl: Duration) -> Elector {
    Elector::new(
        Arc::clone(store) as Arc<dyn Store>,
        CandidateId::new(id).expect("id"),
        LeaseConfig::new(ttl),
    )
    .expect("config")
}

/// Opens a session of `ttl`, again while the server is unreachable: a
/// 200 ms session must finish its handshake within 200 ms, which a loaded
/// machine sometimes misses. What is checked is the negotiated timeout.
async fn open_negotiated(store: &ZkStore, ttl: Duration) -> leasehold::store::SessionLease {
    let mut attempts = 0;
    loop {
        match store.open_session(ttl).await {
            Err(leasehold::Error::Unavailable { .. }) if attempts < 20 => attempts += 1,
            other => return other.expect("open"),
        }
    }
}

/// The TTL is the session timeout the server negotiated: the test server
/// (tick 100 ms) clamps to [200 ms, 60 s].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_is_the_negotiated_session_timeout() {
    let server = server().await;
    let store = store(&server).await;
    let short = open_negotiated(&store, Duration::from_millis(50)).await;
    assert_eq!(short.ttl, Duration::from_millis(200));
    let long = open_negotiated(&store, Duration::from_secs(600)).await;
    assert_eq!(long.ttl, Duration::from_secs(60));
    let fine = open_negotiated(&store, Duration::from_millis(1500)).await;
    assert_eq!(fine.ttl, Duration::from_millis(1500));
    // The elector uses the granted value for its deadline.
    let mut config = LeaseConfig::new(Duration::from_secs(120));
    config.renew_every = Duration::from_secs(10);
    let elector = Elector::new(
        Arc::clone(&store) as Arc<dyn Store>,
        CandidateId::new("a").expect("id"),
        config,
    )
    .expect("config");
    let session = elector.session().await.expect("session");
    assert_eq!(session.granted_ttl(), Duration::from_secs(60));
    let left = session.deadline() - Instant::now();
    assert!(left <= Duration::from_secs(60), "{left:?}");
}

/// A session the server expires while the client is connected (taken over
/// and closed from outside, as Curator's KillSession does) ends leadership
/// at once — long before the lease deadline — and a new session campaigns
/// afresh with a higher token.
#[tokio::test(flavor = "current_thread")]
async fn an_expired_session_ends_leadership_at_once() {
    let server = server().await;
    let store = store(&server).await;
    let a = elector(&store, "a", Duration::from_secs(20));
    let election = unique_election("killed");
    let first = a.campaign(&election).await.expect("campaign");
    let killed_at = Instant::now();
    store
        .kill_session_from_outside(first.session().id())
        .await
        .expect("kill the session");
    let reason = tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("leadership ends without waiting for the deadline");
    // The client's Expired event, or the leader's own watch seeing its node
    // deleted by the server, whichever comes first.
    assert!(
        matches!(reason, LostReason::SessionExpired | LostReason::Superseded),
        "{reason:?}"
    );
    assert!(
        Instant::now() < first.deadline(),
        "ended only at the deadline ({:?} after the kill)",
        killed_at.elapsed()
    );
    let second = campaign_until_granted(&a, &election).await;
    assert_ne!(second.session().id(), first.session().id());
    assert!(second.token() > first.token());
}

/// Expire, then reconnect: the server is paused (SIGSTOP) for longer than
/// the TTL, so the client is disconnected and its session expires. The
/// leader steps down at its deadline while still disconnected; once the
/// server resumes, the old session is gone, and whoever leads next has a
/// higher token. At no instant do two
/// candidates lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_then_reconnect_never_gives_two_leaders() {
    let server = server().await;
    let store_a = store(&server).await;
    let store_b = store(&server).await;
    let ttl = Duration::from_secs(2);
    let a = elector(&store_a, "a", ttl);
    let b = elector(&store_b, "b", ttl);
    let election = unique_election("stop-expire");
    let first = a.campaign(&election).await.expect("a campaigns");
    let contender = spawn_campaign(b, election.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.signal(Signal::SIGSTOP);
    let reason = tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("a steps down while the server is paused");
    assert!(
        matches!(reason, LostReason::DeadlineExpired { .. }),
        "{reason:?}"
    );
    // Stepped down by its own deadline, with the server still paused.
    assert!(Instant::now() >= first.deadline());
    assert!(!contender.is_finished(), "b granted by a paused server");
    tokio::time::sleep(ttl).await;
    server.signal(Signal::SIGCONT);
    let (granted_at, second, _b) = tokio::time::timeout(Duration::from_secs(20), contender)
        .await
        .expect("someone leads after the server resumes")
        .expect("task");
    assert!(granted_at >= first.deadline(), "b granted while a led");
    assert!(second.token() > first.token(), "rule 2 after expiry");
    // The old session is over in the store too (closed by the elector when
    // its deadline passed, or reported expired by the reconnected client).
    tokio::time::timeout(
        Duration::from_secs(10),
        store_a.session_ended(first.session().id()),
    )
    .await
    .expect("the store reports the old session ended");
    // a's old session is gone; a campaigns on a new one and waits.
    assert_eq!(
        store_a
            .candidate_keys(first.session().id(), &election)
            .await
            .expect("list"),
        0
    );
}

/// Reconnect within the session timeout: the server is paused long enough
/// for the client to see Disconnected, then resumed before the session can
/// expire. The leader keeps one candidate node (never a second one, the
/// Curator double-leader bug), a waiter is not granted while the leader
/// leads, and a later expiry still hands over cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_then_expire_never_gives_two_leaders() {
    let server = server().await;
    let store_a = store(&server).await;
    let store_b = store(&server).await;
    let ttl = Duration::from_secs(4);
    let a = elector(&store_a, "a", ttl);
    let b = elector(&store_b, "b", ttl);
    let election = unique_election("reconnect");
    let first = a.campaign(&election).await.expect("a campaigns");
    let contender = spawn_campaign(b, election.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client declares the connection lost after 2/5 of the session
    // timeout (1.6 s) without an answer.
    server.signal(Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    server.signal(Signal::SIGCONT);
    // Give renewals time to confirm the session is alive again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if first.is_leader() {
        assert!(!contender.is_finished(), "b granted while a leads");
        assert_eq!(
            store_a
                .candidate_keys(first.session().id(), &election)
                .await
                .expect("list"),
            1,
            "a reconnected leader must keep exactly one candidate node"
        );
        // Now let the session expire: a long pause.
        server.signal(Signal::SIGSTOP);
        let reason = tokio::time::timeout(Duration::from_secs(10), first.lost())
            .await
            .expect("a steps down");
        assert!(
            matches!(reason, LostReason::DeadlineExpired { .. }),
            "{reason:?}"
        );
        tokio::time::sleep(ttl).await;
        server.signal(Signal::SIGCONT);
    }
    let (granted_at, second, _b) = tokio::time::timeout(Duration::from_secs(30), contender)
        .await
        .expect("someone leads after the expiry")
        .expect("task");
    assert!(granted_at >= first.deadline(), "b granted while a led");
    assert!(second.token() > first.token());
}

/// A dropped campaign leaves no candidate node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_campaign_withdraws_its_node() {
    let server = server().await;
    let store = store(&server).await;
    let election = unique_election("withdraw");
    let holder = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    store
        .campaign(holder.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    let waiter = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        store.campaign(waiter.id, &election, &CandidateId::new("b").expect("id")),
    )
    .await;
    assert!(attempt.is_err(), "b was granted a held election");
    let withdrawn = async {
        while store
            .candidate_keys(waiter.id, &election)
            .await
            .expect("list")
            != 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), withdrawn)
        .await
        .expect("the dropped campaign's node is deleted");
}

/// Issue 12: while the server does not answer (paused), a status watch
/// reports the leader unknown once its client sees the connection lost,
/// and the true state once the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_watch_reports_a_lost_connection_then_the_state_after_it() {
    let server = server().await;
    let observer = store(&server).await;
    let holder = store(&server).await;
    let election = unique_election("lost-connection");
    let mut status = observer.watch_status(&election).await.expect("watch");
    let lease = holder
        .open_session(Duration::from_secs(20))
        .await
        .expect("open");
    let grant = holder
        .campaign(lease.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    let limit = Duration::from_secs(15);
    tokio::time::timeout(
        limit,
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("the watch sees a")
    .expect("watch open");
    server.signal(Signal::SIGSTOP);
    let unknown = tokio::time::timeout(limit, status.wait_for(LeaderStatus::is_unknown)).await;
    server.signal(Signal::SIGCONT);
    unknown
        .expect("the watch reports the leader unknown while the server does not answer")
        .expect("watch open");
    tokio::time::timeout(
        limit,
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("the watch reports the leader again once the server answers")
    .expect("watch open");
    // And it keeps watching: a release and a successor after the reconnect
    // are seen (the watch once went deaf after a reconnect).
    holder.resign(&grant).await.expect("resign");
    tokio::time::timeout(
        limit,
        status.wait_for(|s| matches!(s, LeaderStatus::Known(None))),
    )
    .await
    .expect("the watch sees the release after the reconnect")
    .expect("watch open");
    let successor = leasehold::testing::campaign_on_new_session(
        holder.as_ref(),
        &election,
        "b",
        Duration::from_secs(20),
    )
    .await;
    tokio::time::timeout(
        limit,
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == successor.token)),
    )
    .await
    .expect("the watch sees the successor after the reconnect")
    .expect("watch open");
}

// Issue 13: hostile input and a store that changes under us.

async fn raw_client(server: &ZooKeeperServer) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&server.endpoints()[0])
        .await
        .expect("connect")
}

fn persistent() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

/// `root` of `server`, opened for reading only, through its URL.
async fn read_only(server: &ZooKeeperServer, root: &str) -> leasehold::Result<ZkStore> {
    let url: leasehold::store::ClusterUrl = server.url(root).parse()?;
    ZkStore::open(&url, leasehold::store::Access::ReadOnly).await
}

async fn exists(client: &zookeeper_client::Client, path: &str) -> bool {
    client.check_stat(path).await.expect("stat").is_some()
}

/// ZooKeeper's own `/zookeeper`, `/` and paths ZooKeeper would refuse are
/// bad input, refused before anything is written: leasehold wrote inside
/// `/zookeeper`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeepers_own_node_and_malformed_roots_are_refused() {
    let server = server().await;
    let raw = raw_client(&server).await;
    for root in [
        "/zookeeper",
        "/zookeeper/leasehold",
        "/a/../b",
        "/a/./b",
        "/a//b",
        "/",
        "relative",
    ] {
        // Through a URL, as every read-only opening goes, `/` is the
        // default root: refused only when given apart.
        for read_only in [false, true].into_iter().filter(|r| !(*r && root == "/")) {
            let opened = if read_only {
                self::read_only(&server, root).await
            } else {
                ZkStore::connect(
                    &server.endpoints(),
                    root,
                    &leasehold::store::Security::none(),
                )
                .await
            };
            assert!(
                matches!(opened, Err(leasehold::Error::InvalidInput { .. })),
                "{root} (read-only {read_only}): {opened:?}"
            );
        }
    }
    assert!(!exists(&raw, "/zookeeper/leasehold").await);
    assert!(!exists(&raw, "/zookeeper/elections").await);
    assert!(!exists(&raw, "/a").await);
    assert!(!exists(&raw, "/elections").await);
}

/// A node leasehold did not create is refused without writing, also
/// read-only; so are a root inside another leasehold store and one a newer
/// leasehold wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_leasehold_did_not_create_is_refused_untouched() {
    let server = server().await;
    let raw = raw_client(&server).await;
    raw.create("/app", b"config", &persistent())
        .await
        .expect("another program's node");
    raw.create("/app/x", b"1", &persistent())
        .await
        .expect("its child");
    raw.create("/empty", b"", &persistent())
        .await
        .expect("an empty node");
    raw.create("/newer", b"leasehold 2", &persistent())
        .await
        .expect("a newer leasehold's root");
    for root in ["/app", "/empty"] {
        for read_only in [false, true] {
            let opened = if read_only {
                self::read_only(&server, root).await
            } else {
                ZkStore::connect(
                    &server.endpoints(),
                    root,
                    &leasehold::store::Security::none(),
                )
                .await
            };
            match opened {
                Err(leasehold::Error::Corrupt(message)) => {
                    assert!(message.contains("did not create"), "{message}");
                }
                other => panic!("{root} (read-only {read_only}) must be refused, got {other:?}"),
            }
        }
    }
    assert_eq!(
        raw.list_children("/app").await.expect("list"),
        ["x"],
        "written"
    );
    assert_eq!(raw.get_data("/app").await.expect("read").0, b"config");
    assert!(raw.list_children("/empty").await.expect("list").is_empty());
    assert_eq!(raw.get_data("/empty").await.expect("read").0, b"");
    match ZkStore::connect(
        &server.endpoints(),
        "/newer",
        &leasehold::store::Security::none(),
    )
    .await
    {
        Err(leasehold::Error::IncompatibleSchema { found, supported }) => assert_eq!(
            (found, supported),
            (2, leasehold::backend::zookeeper::LAYOUT_VERSION)
        ),
        other => panic!("a newer layout must be refused, got {other:?}"),
    }
    assert!(raw.list_children("/newer").await.expect("list").is_empty());
    ZkStore::connect(
        &server.endpoints(),
        "/outer",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("a store of its own");
    match ZkStore::connect(
        &server.endpoints(),
        "/outer/elections/x",
        &leasehold::store::Security::none(),
    )
    .await
    {
        Err(leasehold::Error::Corrupt(message)) => assert!(message.contains("inside"), "{message}"),
        other => panic!("a root inside a store must be refused, got {other:?}"),
    }
    assert!(!exists(&raw, "/outer/elections/x").await);
}

/// Nodes another program creates among an election's candidates are never
/// taken for a leader, and a campaign does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_leasehold_did_not_create_are_never_taken_for_a_leader() {
    let server = server().await;
    let raw = raw_client(&server).await;
    let store = ZkStore::connect(
        &server.endpoints(),
        "/space",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("connect");
    raw.mkdir("/space/elections/job", &persistent())
        .await
        .expect("the election's node");
    let sequential = zookeeper_client::CreateMode::PersistentSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let ephemeral = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    for (prefix, data, options) in [
        ("c-", &b"100 user data e"[..], &sequential),
        ("c-0123456789abcdef-", b"100 mimic", &sequential),
        ("c-00000000000000ff-", b"100 not its session", &ephemeral),
    ] {
        raw.create(&format!("/space/elections/job/{prefix}"), data, options)
            .await
            .expect("a node leasehold did not create");
    }
    let job = leasehold::ElectionName::new("job").expect("name");
    assert_eq!(store.leader(&job).await.expect("read"), None);
    let grant = tokio::time::timeout(
        Duration::from_secs(10),
        leasehold::testing::campaign_on_new_session(&store, &job, "a", Duration::from_secs(10)),
    )
    .await
    .expect("the campaign does not wait for nodes leasehold did not create");
    let leader = store.leader(&job).await.expect("read").expect("a leads");
    assert_eq!(leader.candidate.as_str(), "a");
    assert_eq!(leader.token, grant.token);
    store.resign(&grant).await.expect("resign");
    assert_eq!(store.leader(&job).await.expect("read"), None);
    assert_eq!(
        raw.get_data("/space").await.expect("read").0,
        b"leasehold 1",
        "the first use writes the marker"
    );
}

/// Reading a root that does not exist says so and creates nothing; a store
/// opened read-only opens no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_root_that_does_not_exist_creates_nothing() {
    let server = server().await;
    let raw = raw_client(&server).await;
    match read_only(&server, "/team/nothing").await {
        Err(leasehold::Error::NotFound(message)) => {
            assert!(message.contains("/team/nothing"), "{message}");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(!exists(&raw, "/team").await, "created");
    ZkStore::connect(
        &server.endpoints(),
        "/team/nothing",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("first use");
    let reader = read_only(&server, "/team/nothing")
        .await
        .expect("read-only");
    let job = leasehold::ElectionName::new("job").expect("name");
    assert_eq!(reader.leader(&job).await.expect("read"), None);
    assert!(reader.elections().await.expect("list").is_empty());
    assert!(matches!(
        reader.open_session(Duration::from_secs(10)).await,
        Err(leasehold::Error::InvalidInput { .. })
    ));
}

/// A node another program made with leasehold-like child names (an
/// election node with data, an `elections` node with data, a persistent
/// node named like a candidate) is not leasehold's without the marker: it
/// is refused, read-only too, and left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_node_shaped_like_a_leasehold_root_is_refused_untouched() {
    let server = server().await;
    let raw = raw_client(&server).await;
    let nodes: [(&str, &[u8]); 9] = [
        ("/shaped", b""),
        ("/shaped/elections", b""),
        ("/shaped/elections/myjob", b"important"),
        ("/busy", b""),
        ("/busy/elections", b"config"),
        ("/mimic", b""),
        ("/mimic/elections", b""),
        ("/mimic/elections/job", b""),
        (
            "/mimic/elections/job/c-0123456789abcdef-0000000001",
            b"100 mimic",
        ),
    ];
    for (path, data) in nodes {
        raw.create(path, data, &persistent())
            .await
            .expect("another program's node");
    }
    for root in ["/shaped", "/busy", "/mimic"] {
        for read_only in [false, true] {
            let opened = if read_only {
                self::read_only(&server, root).await
            } else {
                ZkStore::connect(
                    &server.endpoints(),
                    root,
                    &leasehold::store::Security::none(),
                )
                .await
            };
            match opened {
                Err(leasehold::Error::Corrupt(message)) => {
                    assert!(message.contains("did not create"), "{message}");
                }
                other => panic!("{root} (read-only {read_only}) must be refused, got {other:?}"),
            }
        }
    }
    for (path, data) in nodes {
        assert_eq!(raw.get_data(path).await.expect("read").0, data, "{path}");
    }
    assert_eq!(
        raw.list_children("/shaped/elections").await.expect("list"),
        ["myjob"],
        "written"
    );
    assert!(
        raw.list_children("/shaped/elections/myjob")
            .await
            .expect("list")
            .is_empty()
    );
}

/// A campaign dropped while ZooKeeper does not answer withdraws its node
/// once ZooKeeper answers again. A node left behind would, once the holder
/// resigns, hold the election for a session that does not know it, with
/// every other candidate waiting behind it for as long as that session
/// lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_dropped_while_zookeeper_is_stopped_withdraws_its_node_once_it_answers() {
    let server = server().await;
    let raw = raw_client(&server).await;
    let (holder, waiter) = (store(&server).await, store(&server).await);
    let election = unique_election("withdraw");
    let ttl = Duration::from_secs(40);
    let held = open_negotiated(&holder, ttl).await.id;
    let grant = holder
        .campaign(held, &election, &CandidateId::new("holder").expect("id"))
        .await
        .expect("granted");
    let session = open_negotiated(&waiter, ttl).await.id;
    let campaign = tokio::spawn({
        let (waiter, election) = (Arc::clone(&waiter), election.clone());
        let id = CandidateId::new("waiter").expect("id");
        async move { waiter.campaign(session, &election, &id).await }
    });
    let dir = format!("/faults/elections/{election}");
    let until = Instant::now() + Duration::from_secs(20);
    while raw.list_children(&dir).await.expect("list").len() < 2 {
        assert!(Instant::now() < until, "the waiter's node was not created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.signal(Signal::SIGSTOP);
    campaign.abort();
    // Longer than a request may take (5 s): the first withdrawal fails.
    tokio::time::sleep(Duration::from_secs(7)).await;
    server.signal(Signal::SIGCONT);
    holder.resign(&grant).await.expect("resign");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match holder.leader(&election).await.expect("a read") {
            None => break,
            Some(leader) => assert!(
                Instant::now() < until,
                "the dropped campaign's node holds the election: {leader:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node another program put among an election's keys, holding what
/// leasehold never writes there, makes reads of the election fail as
/// corrupt, naming that node by its own path (a review saw
/// `/r/elections/e_c_…/%`, a path that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_node_among_an_election_s_keys_is_named_by_its_path() {
    let server = server().await;
    let raw = raw_client(&server).await;
    let store = ZkStore::connect(
        &server.endpoints(),
        "/named",
        &leasehold::store::Security::none(),
    )
    .await
    .expect("store");
    let election = leasehold::ElectionName::new("e").expect("name");
    leasehold::testing::campaign_on_new_session(&store, &election, "a", Duration::from_secs(30))
        .await;
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(
        "/named/elections/e/_c_x-latch-0000000001",
        b"java",
        &ephemeral,
    )
    .await
    .expect("another program's node");
    match store.elections().await {
        Err(leasehold::Error::Corrupt(message)) => assert!(
            message.contains("/named/elections/e/_c_x-latch-0000000001 is not one"),
            "{message}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
