//! etcd's own maintenance and membership changes while elections run, on a
//! real 3-member cluster (Debian's etcd-server) started per test:
//! compaction and defragmentation under waiters' watches, a member killed
//! and restarted with its data, a member replaced by an empty one (member
//! remove, wipe, member add); and, on the run's shared cluster, answers
//! lost on their way to the client.
//!
//! The store reads before it opens every watch (from one past the read's
//! revision), and reads again whenever a watch breaks or is refused as
//! compacted. So a watch that is *already* synced never notices a
//! compaction; the dangerous moment is a watch created from a revision
//! that a compaction passed between the read and the creation: etcd then
//! refuses it, and a store that took the refusal for "nothing happened"
//! would miss the release or expiry that the compaction erased. [`Proxy`]
//! makes that moment happen on purpose: it stands between one waiter's
//! client and its member, understands just enough HTTP/2 and protobuf to
//! recognise the creation of an etcd watch, holds it while the test
//! releases (or lets expire), writes and compacts, then lets it go, and
//! records etcd's answers on that watch as evidence that the compacted
//! path was taken.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasehold::backend::etcd::EtcdStore;
use leasehold::store::{Security, Store};
use leasehold::testing::{campaign_until_granted, unique_election};
use leasehold::{
    CandidateId, ElectionName, Elector, FencingToken, Grant, Leadership, LeaseConfig, SessionId,
};
use leasehold_testkit::{EtcdCluster, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle, block_in_place};
use tokio::time::Instant;

/// A generous bound on anything that must happen "eventually".
const LIMIT: Duration = Duration::from_secs(20);

async fn cluster() -> EtcdCluster {
    tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .expect("cluster start")
}

async fn connect(endpoints: &[String], prefix: &str) -> EtcdStore {
    EtcdStore::connect(endpoints, prefix, &Security::none())
        .await
        .expect("connect")
}

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("id")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits until `check` holds, for at most [`LIMIT`]; panics naming `what`.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + LIMIT;
    while !check() {
        assert!(Instant::now() < until, "not within {LIMIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------
// The proxy.

/// The creation of an etcd watch, as the proxy saw it go by.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WatchCreate {
    /// The client connection (numbered by the proxy) and its HTTP/2
    /// stream, which carries this one watch.
    connection: u64,
    stream: u32,
    key: Vec<u8>,
    start_revision: i64,
}

/// One of etcd's answers on a watch.
#[derive(Clone, Copy, Debug, Default)]
struct WatchReply {
    created: bool,
    canceled: bool,
    compact_revision: i64,
    events: usize,
}

#[derive(Debug, Default)]
struct ProxyState {
    /// Hold the next watch created on a key that starts with this.
    hold: Option<Vec<u8>>,
    /// The watch held now.
    held: Option<WatchCreate>,
    creates: Vec<WatchCreate>,
    replies: HashMap<(u64, u32), Vec<WatchReply>>,
    connections: Vec<AbortHandle>,
    next_connection: u64,
}

/// Whether etcd's answers are held back (kept in order, passed on once
/// let go), as an answer lost on its way is to the client.
type RepliesHeld = tokio::sync::watch::Sender<bool>;

/// A TCP proxy in front of one etcd member that can hold the creation of
/// one watch (the HTTP/2 frames of its stream; every other stream, and the
/// connection's pings, pass), hold back every answer, and cut its
/// connections.
#[derive(Debug)]
struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    released: tokio::sync::watch::Sender<u64>,
    replies_held: RepliesHeld,
    accept: AbortHandle,
}

/// A frame on its way from the client to etcd.
#[derive(Debug)]
struct Frame {
    bytes: Vec<u8>,
    stream: u32,
    /// It completes the creation of the watch to hold.
    holds: bool,
}

const DATA: u8 = 0x0;
const PADDED: u8 = 0x8;

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let (released, release_seen) = tokio::sync::watch::channel(0);
        let replies_held = RepliesHeld::new(false);
        let accept = {
            let state = Arc::clone(&state);
            let held = replies_held.subscribe();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let mut s = lock(&state);
                    s.next_connection += 1;
                    let relay = relay(
                        client,
                        upstream,
                        Arc::clone(&state),
                        (release_seen.clone(), held.clone()),
                        s.next_connection,
                    );
                    s.connections.push(tokio::spawn(relay).abort_handle());
                }
            })
            .abort_handle()
        };
        Proxy {
            addr,
            state,
            released,
            replies_held,
            accept,
        }
    }

    /// Holds back etcd's answers (`true`), or lets them go on (`false`).
    fn hold_replies(&self, hold: bool) {
        self.replies_held.send_replace(hold);
    }

    /// The `host:port` to give the client.
    fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    fn state(&self) -> MutexGuard<'_, ProxyState> {
        lock(&self.state)
    }

    /// Holds the next watch created on a key starting with `prefix`.
    fn hold_next_watch(&self, prefix: &str) {
        self.state().hold = Some(prefix.as_bytes().to_vec());
    }

    fn held(&self) -> Option<WatchCreate> {
        self.state().held.clone()
    }

    /// Lets the held watch's creation reach etcd; the watch released.
    fn release(&self) -> WatchCreate {
        let held = self.state().held.take().expect("a watch is held");
        self.released.send_modify(|n| *n += 1);
        held
    }

    /// etcd's answers on `watch` so far.
    fn replies_to(&self, watch: &WatchCreate) -> Vec<WatchReply> {
        self.state()
            .replies
            .get(&(watch.connection, watch.stream))
            .cloned()
            .unwrap_or_default()
    }

    /// The watches created on `key`.
    fn creates_on(&self, key: &str) -> Vec<WatchCreate> {
        let state = self.state();
        state
            .creates
            .iter()
            .filter(|c| c.key == key.as_bytes())
            .cloned()
            .collect()
    }

    /// Whether a watch on `key` was created and etcd confirmed it.
    fn established(&self, key: &str) -> bool {
        self.creates_on(key)
            .iter()
            .any(|c| self.replies_to(c).iter().any(|r| r.created))
    }

    /// Closes every connection through the proxy (the client reconnects).
    fn cut(&self) {
        for connection in self.state().connections.drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Relays one client connection to `upstream` until either side closes.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    (released, replies_held): (
        tokio::sync::watch::Receiver<u64>,
        tokio::sync::watch::Receiver<bool>,
    ),
    connection: u64,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let watches = Mutex::new(HashSet::new());
    let (frames_tx, frames_rx) = mpsc::unbounded_channel();
    tokio::select! {
        _ = requests_in(client_read, frames_tx, &state, &watches, connection) => {}
        _ = requests_out(frames_rx, server_write, &state, released, connection) => {}
        _ = replies(server_read, client_write, &state, (&watches, replies_held), connection) => {}
    }
}

/// One HTTP/2 frame: its bytes, type, flags and stream.
async fn read_frame(from: &mut OwnedReadHalf) -> std::io::Result<(Vec<u8>, u8, u8, u32)> {
    let mut bytes = vec![0; 9];
    from.read_exact(&mut bytes).await?;
    let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
    let (kind, flags) = (bytes[3], bytes[4]);
    let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
    bytes.resize(9 + len, 0);
    from.read_exact(&mut bytes[9..]).await?;
    Ok((bytes, kind, flags, stream))
}

/// A DATA frame's data, without padding.
fn data_of(frame: &[u8], flags: u8) -> &[u8] {
    let payload = &frame[9..];
    if flags & PADDED == 0 {
        return payload;
    }
    let pad = payload.first().map_or(0, |&p| usize::from(p));
    payload
        .get(1..payload.len().saturating_sub(pad))
        .unwrap_or(&[])
}

/// Appends `data` to a stream's `buffer` and takes the gRPC messages it
/// completes (a 5-byte prefix, then the message).
fn messages(buffer: &mut Vec<u8>, data: &[u8]) -> Vec<Vec<u8>> {
    buffer.extend_from_slice(data);
    let mut complete = Vec::new();
    while buffer.len() >= 5 {
        let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
        if buffer.len() < 5 + len {
            break;
        }
        complete.push(buffer[5..5 + len].to_vec());
        buffer.drain(..5 + len);
    }
    complete
}

/// Frames from the client: watch creations recorded (and the one to hold
/// marked), everything passed on in order.
async fn requests_in(
    mut client: OwnedReadHalf,
    frames: mpsc::UnboundedSender<Frame>,
    state: &Mutex<ProxyState>,
    watches: &Mutex<HashSet<u32>>,
    connection: u64,
) -> std::io::Result<()> {
    let mut preface = vec![0; 24];
    client.read_exact(&mut preface).await?;
    let _ = frames.send(Frame {
        bytes: preface,
        stream: 0,
        holds: false,
    });
    let mut partial: HashMap<u32, Vec<u8>> = HashMap::new();
    loop {
        let (bytes, kind, flags, stream) = read_frame(&mut client).await?;
        let mut holds = false;
        if kind == DATA {
            let buffer = partial.entry(stream).or_default();
            for message in messages(buffer, data_of(&bytes, flags)) {
                let Some((key, start_revision)) = watch_create(&message) else {
                    continue;
                };
                lock(watches).insert(stream);
                let create = WatchCreate {
                    connection,
                    stream,
                    key,
                    start_revision,
                };
                let mut state = lock(state);
                if state
                    .hold
                    .as_ref()
                    .is_some_and(|prefix| create.key.starts_with(prefix))
                {
                    state.hold = None;
                    state.held = Some(create.clone());
                    holds = true;
                }
                state.creates.push(create);
            }
        }
        if frames
            .send(Frame {
                bytes,
                stream,
                holds,
            })
            .is_err()
        {
            return Ok(());
        }
    }
}

/// Frames to etcd: those of the held watch's stream wait until it is
/// released; the others go at once.
async fn requests_out(
    mut frames: mpsc::UnboundedReceiver<Frame>,
    mut server: OwnedWriteHalf,
    state: &Mutex<ProxyState>,
    mut released: tokio::sync::watch::Receiver<u64>,
    connection: u64,
) -> std::io::Result<()> {
    let is_held = |stream: u32| {
        lock(state)
            .held
            .as_ref()
            .is_some_and(|h| h.connection == connection && h.stream == stream)
    };
    let mut holding: Option<u32> = None;
    let mut waiting: Vec<Vec<u8>> = Vec::new();
    loop {
        tokio::select! {
            biased;
            frame = frames.recv() => {
                let Some(frame) = frame else { return Ok(()) };
                if frame.holds && is_held(frame.stream) {
                    holding = Some(frame.stream);
                }
                if holding == Some(frame.stream) {
                    waiting.push(frame.bytes);
                } else {
                    server.write_all(&frame.bytes).await?;
                }
            }
            changed = released.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                if holding.is_some_and(|stream| !is_held(stream)) {
                    holding = None;
                    for bytes in waiting.drain(..) {
                        server.write_all(&bytes).await?;
                    }
                }
            }
        }
    }
}

/// Frames from etcd, passed on; the answers on watch streams recorded.
async fn replies(
    mut server: OwnedReadHalf,
    mut client: OwnedWriteHalf,
    state: &Mutex<ProxyState>,
    (watches, mut held): (&Mutex<HashSet<u32>>, tokio::sync::watch::Receiver<bool>),
    connection: u64,
) -> std::io::Result<()> {
    let mut partial: HashMap<u32, Vec<u8>> = HashMap::new();
    loop {
        let (bytes, kind, flags, stream) = read_frame(&mut server).await?;
        if held.wait_for(|held| !*held).await.is_err() {
            return Ok(());
        }
        if kind == DATA && lock(watches).contains(&stream) {
            let buffer = partial.entry(stream).or_default();
            for message in messages(buffer, data_of(&bytes, flags)) {
                if let Some(reply) = watch_reply(&message) {
                    lock(state)
                        .replies
                        .entry((connection, stream))
                        .or_default()
                        .push(reply);
                }
            }
        }
        client.write_all(&bytes).await?;
    }
}

/// A protobuf field's value.
#[derive(Clone, Copy, Debug)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A protobuf message's fields, or `None` if it is not one.
fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let tag = varint(&mut buf)?;
        let value = match tag & 7 {
            0 => Field::Varint(varint(&mut buf)?),
            1 => {
                buf = buf.get(8..)?;
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let value = buf.get(..len)?;
                buf = buf.get(len..)?;
                Field::Bytes(value)
            }
            5 => {
                buf = buf.get(4..)?;
                Field::Fixed
            }
            _ => return None,
        };
        out.push((tag >> 3, value));
    }
    Some(out)
}

/// The key and start revision of a `WatchRequest` that creates a watch
/// (`create_request` = 1: `key` = 1, `range_end` = 2, `start_revision` =
/// 3, then flags and filters); `None` for any other message.
fn watch_create(message: &[u8]) -> Option<(Vec<u8>, i64)> {
    let outer = fields(message)?;
    let [(1, Field::Bytes(create))] = outer.as_slice() else {
        return None;
    };
    let (mut key, mut start) = (None, 0);
    for (number, value) in fields(create)? {
        match (number, value) {
            (1, Field::Bytes(k)) => key = Some(k.to_vec()),
            (3, Field::Varint(r)) => start = i64::try_from(r).ok()?,
            (2 | 5, Field::Bytes(_)) | (4..=8, Field::Varint(_)) => {}
            _ => return None,
        }
    }
    Some((key?, start))
}

/// A `WatchResponse`: `created` = 3, `canceled` = 4, `compact_revision`
/// = 5, `events` = 11.
fn watch_reply(message: &[u8]) -> Option<WatchReply> {
    let mut reply = WatchReply::default();
    for (number, value) in fields(message)? {
        match (number, value) {
            (3, Field::Varint(v)) => reply.created = v != 0,
            (4, Field::Varint(v)) => reply.canceled = v != 0,
            (5, Field::Varint(v)) => reply.compact_revision = i64::try_from(v).ok()?,
            (11, Field::Bytes(_)) => reply.events += 1,
            (1 | 6, Field::Bytes(_)) | (2 | 7, Field::Varint(_)) => {}
            _ => return None,
        }
    }
    Some(reply)
}

// ---------------------------------------------------------------------
// Compaction under live watches.

/// A session kept alive by a task, one keep-alive every 500 ms.
#[derive(Debug)]
struct Renewal {
    task: JoinHandle<()>,
    /// When the last keep-alive was sent.
    last_sent: Arc<Mutex<Instant>>,
}

impl Renewal {
    fn start(store: EtcdStore, session: SessionId) -> Self {
        let last_sent = Arc::new(Mutex::new(Instant::now()));
        let task = {
            let last_sent = Arc::clone(&last_sent);
            tokio::spawn(async move {
                loop {
                    *lock(&last_sent) = Instant::now();
                    if let Err(error) = store.keep_alive(session).await {
                        eprintln!("keep-alive of {session}: {error}");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        Renewal { task, last_sent }
    }

    /// Stops renewing; when the last keep-alive was sent (the lease lives
    /// at least its TTL after that).
    fn stop(&self) -> Instant {
        self.task.abort();
        *lock(&self.last_sent)
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter: its own client, through its own proxy, on its own session.
#[derive(Debug)]
struct Waiter {
    proxy: Proxy,
    store: EtcdStore,
    session: SessionId,
    renewal: Renewal,
}

type Granted = mpsc::UnboundedReceiver<(usize, leasehold::Result<Grant>, Instant)>;

/// The next grant among the waiters: which one, the grant, when.
async fn next_grant(granted: &mut Granted) -> (usize, Grant, Instant) {
    let (who, grant, at) = tokio::time::timeout(LIMIT, granted.recv())
        .await
        .unwrap_or_else(|_| panic!("no waiter was granted within {LIMIT:?}"))
        .expect("the waiters' channel is open");
    let grant = grant.unwrap_or_else(|e| panic!("w{}'s campaign failed: {e}", who + 1));
    (who, grant, at)
}

/// Nobody else is granted for a while (`holder` holds).
async fn nobody_else_granted(granted: &mut Granted, holder: &str) {
    if let Ok(Some((who, grant, _))) =
        tokio::time::timeout(Duration::from_millis(500), granted.recv()).await
    {
        panic!(
            "w{} was granted ({grant:?}) out of turn while {holder} held",
            who + 1
        );
    }
}

/// Writes unrelated keys, then compacts the history up to the current
/// revision and defragments every member; the compaction's revision.
fn write_compact_and_defrag(cluster: &EtcdCluster) -> i64 {
    block_in_place(|| {
        for n in 0..10 {
            cluster.put(&format!("/unrelated/{n}"), "x");
        }
        let revision = cluster.revision();
        cluster.compact(revision);
        cluster.defrag();
        revision
    })
}

/// A leader and four waiters in line (w1 … w4), each waiter with its own
/// client through its own [`Proxy`]. The leader releases while w1's watch
/// on it is held at the proxy; unrelated writes, a compaction past the
/// release and a defragmentation of every member follow; then w1's watch
/// reaches etcd from a revision below the compaction. etcd refuses it as
/// compacted (the proxy sees that answer, naming the compaction's
/// revision), and w1 must still learn of the release: w1 is granted, and
/// nobody else. Then w2's connection is cut and its watch on w1, made
/// again, is held; w1 stops renewing, its lease expires, and again writes,
/// compaction and defragmentation pass the watch's start before it is let
/// go: w2 must be granted after the expiry, and nobody else. w3 and w4,
/// whose watches were synced through both compactions, are granted in
/// turn after. Tokens strictly increase along the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_whose_watches_start_below_a_compaction_miss_no_release_nor_expiry() {
    const PREFIX: &str = "/faults-compaction";
    let w1_ttl = Duration::from_secs(3);
    let started = Instant::now();
    let cluster = cluster().await;
    let endpoints = cluster.endpoints();
    let election = unique_election("compaction");
    let space = format!("{PREFIX}/{election}:c:");
    let key_of = |session: SessionId| format!("{space}{:016x}", session.0);

    let direct = connect(&endpoints, PREFIX).await;
    let leader = direct
        .open_session(Duration::from_secs(10))
        .await
        .expect("open");
    let leader_renewal = Renewal::start(direct.clone(), leader.id);
    let first = tokio::time::timeout(LIMIT, direct.campaign(leader.id, &election, &id("leader")))
        .await
        .expect("the leader is granted at once")
        .expect("campaign");

    let (granted_tx, mut granted) = mpsc::unbounded_channel();
    let mut waiters: Vec<Waiter> = Vec::new();
    for i in 0..4 {
        let upstream: SocketAddr = endpoints[i % 3].parse().expect("host:port");
        let proxy = Proxy::start(upstream).await;
        if i == 0 {
            proxy.hold_next_watch(&space);
        }
        let store = connect(&[proxy.endpoint()], PREFIX).await;
        let ttl = if i == 0 {
            w1_ttl
        } else {
            Duration::from_secs(10)
        };
        let session = store.open_session(ttl).await.expect("open").id;
        let renewal = Renewal::start(store.clone(), session);
        let ahead = waiters.last().map_or(leader.id, |w| w.session);
        {
            let (store, election, granted) = (store.clone(), election.clone(), granted_tx.clone());
            tokio::spawn(async move {
                let grant = store
                    .campaign(session, &election, &id(&format!("w{}", i + 1)))
                    .await;
                let _ = granted.send((i, grant, Instant::now()));
            });
        }
        if i == 0 {
            eventually("the proxy holds w1's watch", || proxy.held().is_some()).await;
        } else {
            eventually(&format!("w{}'s watch on the one ahead", i + 1), || {
                proxy.established(&key_of(ahead))
            })
            .await;
        }
        waiters.push(Waiter {
            proxy,
            store,
            session,
            renewal,
        });
    }
    let held = waiters[0].proxy.held().expect("w1's watch is held");
    assert_eq!(
        String::from_utf8_lossy(&held.key),
        key_of(leader.id),
        "w1 watches the leader's key"
    );
    assert!(
        granted.try_recv().is_err(),
        "a waiter was granted while the leader held"
    );

    // The leader releases; the release is compacted away before w1's watch
    // reaches etcd.
    direct.resign(&first).await.expect("the leader resigns");
    leader_renewal.stop();
    let compacted = write_compact_and_defrag(&cluster);
    assert!(
        held.start_revision < compacted,
        "w1's watch starts at {}, not below the compaction at {compacted}",
        held.start_revision
    );
    assert!(
        granted.try_recv().is_err(),
        "granted while w1's watch was held"
    );
    let released = waiters[0].proxy.release();
    let (who, w1, _) = next_grant(&mut granted).await;
    assert_eq!(
        who,
        0,
        "the release went to w{}, not w1, first in line",
        who + 1
    );
    assert!(w1.token > first.token, "{} after {}", w1.token, first.token);
    let answers = waiters[0].proxy.replies_to(&released);
    assert!(
        answers
            .iter()
            .any(|r| r.canceled && r.compact_revision == compacted),
        "etcd did not refuse w1's watch (from {}) as compacted at {compacted}: {answers:?}",
        released.start_revision
    );
    nobody_else_granted(&mut granted, "w1").await;

    // w2 watches w1 again after its connection is cut, and that watch is
    // held; w1's lease expires, and that too is compacted away first.
    waiters[1].proxy.hold_next_watch(&space);
    waiters[1].proxy.cut();
    eventually("the proxy holds w2's watch, made again", || {
        waiters[1].proxy.held().is_some()
    })
    .await;
    let held = waiters[1].proxy.held().expect("w2's watch is held");
    assert_eq!(
        String::from_utf8_lossy(&held.key),
        key_of(waiters[0].session),
        "w2 watches w1's key"
    );
    let last_renewal = waiters[0].renewal.stop();
    let until = Instant::now() + LIMIT;
    loop {
        match direct.leader(&election).await {
            Ok(Some(l)) if l.token == w1.token => {}
            Ok(_) => break,
            Err(error) => eprintln!("reading the leader: {error}"),
        }
        assert!(Instant::now() < until, "w1's lease did not expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let compacted_again = write_compact_and_defrag(&cluster);
    assert!(
        held.start_revision < compacted_again,
        "w2's watch starts at {}, not below the compaction at {compacted_again}",
        held.start_revision
    );
    assert!(
        granted.try_recv().is_err(),
        "granted while w2's watch was held"
    );
    let released_again = waiters[1].proxy.release();
    let (who, w2, at) = next_grant(&mut granted).await;
    assert_eq!(who, 1, "w1's expiry went to w{}, not w2", who + 1);
    assert!(w2.token > w1.token, "{} after {}", w2.token, w1.token);
    assert!(
        at >= last_renewal + w1_ttl,
        "w2 was granted {:?} after w1's last keep-alive, before w1's lease could expire",
        at - last_renewal
    );
    // The store's watches follow from the last revision told: after the
    // cut, w2 read again as soon as the new stream answered (that is how
    // it learned of the expiry in time), and etcd's refusal of the held
    // creation as compacted may come after the grant.
    eventually("etcd refuses w2's watch as compacted", || {
        waiters[1]
            .proxy
            .replies_to(&released_again)
            .iter()
            .any(|r| r.canceled && r.compact_revision == compacted_again)
    })
    .await;
    nobody_else_granted(&mut granted, "w2").await;

    // w3 and w4, synced through both compactions, take their turns.
    waiters[1].store.resign(&w2).await.expect("w2 resigns");
    let (who, w3, _) = next_grant(&mut granted).await;
    assert_eq!(who, 2, "w2's release went to w{}, not w3", who + 1);
    assert!(w3.token > w2.token, "{} after {}", w3.token, w2.token);
    nobody_else_granted(&mut granted, "w3").await;
    waiters[2].store.resign(&w3).await.expect("w3 resigns");
    let (who, w4, _) = next_grant(&mut granted).await;
    assert_eq!(who, 3, "w3's release went to w{}, not w4", who + 1);
    assert!(w4.token > w3.token, "{} after {}", w4.token, w3.token);
    println!(
        "compaction at {compacted}: w1's watch from {} refused as compacted, w1 granted token {}; \
         compaction at {compacted_again}: w2's watch from {} refused as compacted, w2 granted \
         token {}; w3's watch made {} time(s), w4's {} time(s); took {:?}",
        released.start_revision,
        w1.token,
        released_again.start_revision,
        w2.token,
        waiters[2]
            .proxy
            .creates_on(&key_of(waiters[1].session))
            .len(),
        waiters[3]
            .proxy
            .creates_on(&key_of(waiters[2].session))
            .len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------
// Elections across member restarts and replacements.

/// What candidates taking turns saw: grants in order, the holders now,
/// and what broke a rule.
#[derive(Debug, Default)]
struct Record {
    grants: Vec<(String, FencingToken)>,
    holders: Vec<(String, Arc<Leadership>)>,
    last: Option<(String, FencingToken)>,
    failed_resigns: usize,
    violations: Vec<String>,
}

impl Record {
    fn granted(&mut self, who: &str, leadership: &Arc<Leadership>, granted_at: Instant) {
        let token = leadership.token();
        // Every other holder must have stepped down before this grant: not
        // leading now, and its deadline (rule 3) not after the grant.
        for (other, held) in &self.holders {
            if held.is_leader() || held.deadline() > granted_at {
                self.violations.push(format!(
                    "two leaders: {who} was granted token {token} while {other} (token {}) \
                     still led (is_leader {}, deadline {:?} after the grant)",
                    held.token(),
                    held.is_leader(),
                    held.deadline().saturating_duration_since(granted_at)
                ));
            }
        }
        // Strictly increasing, except the same grant found again (a
        // release whose answer was lost: the store shows the candidate's
        // own grant, which it takes up at once).
        if let Some((last_who, last)) = &self.last
            && (token < *last || (token == *last && last_who != who))
        {
            self.violations.push(format!(
                "tokens: {who} was granted {token} after {last_who} was granted {last}"
            ));
        }
        self.last = Some((who.to_owned(), token));
        self.grants.push((who.to_owned(), token));
        self.holders.push((who.to_owned(), Arc::clone(leadership)));
    }
}

/// Campaigns, holds for 50–250 ms (or until leadership is lost), resigns
/// and campaigns again, recording every grant, until `stop`.
async fn take_turns(
    elector: Elector,
    election: ElectionName,
    record: Arc<Mutex<Record>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    seed: u64,
) {
    let who = elector.candidate().to_string();
    let mut rng = Rng::new(seed);
    loop {
        let leadership = tokio::select! {
            leadership = campaign_until_granted(&elector, &election) => leadership,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let granted_at = Instant::now();
        let leadership = Arc::new(leadership);
        lock(&record).granted(&who, &leadership, granted_at);
        tokio::select! {
            _ = leadership.lost() => {}
            () = tokio::time::sleep(rng.millis(50, 250)) => {}
        }
        lock(&record).holders.retain(|(holder, _)| *holder != who);
        if let Ok(leadership) = Arc::try_unwrap(leadership)
            && leadership.resign().await.is_err()
        {
            lock(&record).failed_resigns += 1;
        }
        tokio::time::sleep(rng.millis(0, 100)).await;
    }
    let _ = elector.close().await;
}

/// Candidates taking turns in one election, each on its own client.
#[derive(Debug)]
struct Turns {
    prefix: &'static str,
    election: ElectionName,
    record: Arc<Mutex<Record>>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    seed: u64,
}

impl Turns {
    fn new(prefix: &'static str) -> Self {
        let (seed, _) = Rng::from_env();
        println!("seed {seed} (rerun with LEASEHOLD_SEED={seed})");
        Turns {
            prefix,
            election: unique_election(prefix.trim_start_matches('/')),
            record: Arc::default(),
            stop: tokio::sync::watch::channel(false).0,
            tasks: Vec::new(),
            seed,
        }
    }

    /// Adds candidate `name`, whose client knows `endpoints` only.
    async fn join(&mut self, name: &str, endpoints: &[String]) {
        let store = connect(endpoints, self.prefix).await;
        let elector = Elector::new(
            Arc::new(store),
            id(name),
            LeaseConfig::new(Duration::from_secs(2)),
        )
        .expect("config");
        let seed = self.seed ^ (self.tasks.len() as u64 + 1);
        self.tasks.push(tokio::spawn(take_turns(
            elector,
            self.election.clone(),
            Arc::clone(&self.record),
            self.stop.subscribe(),
            seed,
        )));
    }

    fn grants(&self) -> usize {
        lock(&self.record).grants.len()
    }

    /// Waits until `more` grants (of `by`, if given) have been made after
    /// the ones counted now.
    async fn more_grants(&self, more: usize, by: Option<&str>, what: &str) {
        let count = || {
            lock(&self.record)
                .grants
                .iter()
                .filter(|(who, _)| by.is_none_or(|by| by == who))
                .count()
        };
        let target = count() + more;
        eventually(what, || count() >= target).await;
    }

    /// Stops every candidate (each resigns and closes its session) and
    /// checks the record: no two leaders, tokens strictly increasing.
    async fn finish(self) -> Record {
        self.stop.send_replace(true);
        for task in self.tasks {
            tokio::time::timeout(LIMIT, task)
                .await
                .expect("a candidate stops")
                .expect("a candidate's task");
        }
        let record = Arc::try_unwrap(self.record)
            .expect("the candidates are done")
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(
            record.violations.is_empty(),
            "{} violation(s), seed {}:\n{}",
            record.violations.len(),
            self.seed,
            record.violations.join("\n")
        );
        record
    }
}

/// Waits until every member has applied the same revision (each read
/// from that member alone): the one that was down or replaced caught up.
async fn members_agree(cluster: &EtcdCluster) -> Vec<i64> {
    let until = Instant::now() + LIMIT;
    loop {
        let revisions: Vec<i64> =
            block_in_place(|| (0..3).map(|i| cluster.member_revision(i)).collect());
        if revisions.windows(2).all(|w| w[0] == w[1]) {
            return revisions;
        }
        assert!(
            Instant::now() < until,
            "the members' revisions differ: {revisions:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three candidates take turns (campaign, renew, resign) while member 0
/// (where every client starts) is SIGKILLed; while it is down the others
/// compact and defragment; it is restarted on its data (replaying the
/// compaction); then the raft leader, whichever member it is, is
/// SIGKILLed and restarted too. At every grant no other candidate still
/// leads or has a deadline after it; tokens strictly increase; grants go
/// on while a member is down and after each restart; a fourth candidate
/// whose client knows only the restarted member 0 is granted too; in the
/// end every member has applied the same revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elections_go_on_across_members_killed_and_restarted_with_their_data() {
    const PREFIX: &str = "/faults-restart";
    let started = Instant::now();
    let mut cluster = cluster().await;
    let endpoints = cluster.endpoints();
    let mut turns = Turns::new(PREFIX);
    for name in ["a", "b", "c"] {
        turns.join(name, &endpoints).await;
    }
    turns.more_grants(3, None, "three grants").await;

    block_in_place(|| cluster.kill(0));
    turns
        .more_grants(3, None, "three grants while member 0 is down")
        .await;
    let compacted = write_compact_and_defrag(&cluster);
    turns
        .more_grants(1, None, "a grant after the compaction")
        .await;
    block_in_place(|| {
        cluster.restart(0);
        cluster.wait_ready(LIMIT);
    });
    // Member 0 applied, on its own data, the compaction it missed.
    let below = format!("--rev={}", compacted - 1);
    eventually("member 0 refuses a read below the compaction", || {
        let out = block_in_place(|| {
            std::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={}", endpoints[0]))
                .args(["get", "/", below.as_str(), "--consistency=s"])
                .output()
                .expect("etcdctl (Debian's etcd-client) runs")
        });
        String::from_utf8_lossy(&out.stderr).contains("compacted")
    })
    .await;
    turns
        .more_grants(3, None, "three grants after member 0's restart")
        .await;

    let victim = block_in_place(|| cluster.raft_leader()).unwrap_or(1);
    block_in_place(|| cluster.kill(victim));
    turns
        .more_grants(2, None, "two grants while the raft leader is down")
        .await;
    block_in_place(|| {
        cluster.restart(victim);
        cluster.wait_ready(LIMIT);
    });

    turns.join("d", &endpoints[..1]).await;
    turns
        .more_grants(1, Some("d"), "a grant to d, through member 0 alone")
        .await;
    turns
        .more_grants(3, None, "three grants after both restarts")
        .await;
    let grants = turns.grants();
    let record = turns.finish().await;
    let revisions = members_agree(&cluster).await;
    println!(
        "{grants} grants (last token {:?}), {} failed resigns, killed member 0 (compacted at \
         {compacted} meanwhile) then the raft leader m{victim}; members at revision \
         {revisions:?}; took {:?}",
        record.last.map(|(_, t)| t),
        record.failed_resigns,
        started.elapsed()
    );
}

/// Three candidates take turns while member 0 (where every client
/// starts) is replaced by a new, empty one: SIGKILLed, removed from the
/// cluster, its data folder wiped, added again on a new peer port and
/// started to join the existing cluster. At every grant no other
/// candidate still leads or has a deadline after it; tokens strictly
/// increase; grants go on during and after the replacement; a fourth
/// candidate whose client knows only the new member 0 is granted; in the
/// end the new member has applied the same revision as the others, holds
/// the same keys (read from it alone), and the cluster lists three started
/// members.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elections_go_on_while_a_member_is_replaced_by_an_empty_one() {
    const PREFIX: &str = "/faults-replace";
    let started = Instant::now();
    let mut cluster = cluster().await;
    let endpoints = cluster.endpoints();
    let mut turns = Turns::new(PREFIX);
    for name in ["a", "b", "c"] {
        turns.join(name, &endpoints).await;
    }
    turns.more_grants(3, None, "three grants").await;
    let before = turns.grants();
    let replacing = Instant::now();
    block_in_place(|| cluster.replace(0));
    let replaced_in = replacing.elapsed();
    let during = turns.grants() - before;
    turns
        .more_grants(3, None, "three grants after the replacement")
        .await;

    turns.join("d", &endpoints[..1]).await;
    turns
        .more_grants(1, Some("d"), "a grant to d, through the new member 0 alone")
        .await;
    let grants = turns.grants();
    let record = turns.finish().await;

    let revisions = members_agree(&cluster).await;
    let local_read = |i: usize| {
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints[i]))
            .args(["get", "--prefix", PREFIX, "--consistency=s", "-w", "simple"])
            .output()
            .expect("etcdctl (Debian's etcd-client) runs");
        assert!(out.status.success(), "etcdctl get: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (new, old) = block_in_place(|| (local_read(0), local_read(1)));
    assert!(
        new.contains(&format!("{PREFIX}/leasehold")),
        "the new member lacks the store: {new}"
    );
    assert_eq!(new, old, "the new member's keys differ from member 1's");
    let members = block_in_place(|| cluster.etcdctl(&["member", "list"]));
    assert_eq!(
        members
            .lines()
            .filter(|line| line.contains(", started, "))
            .count(),
        3,
        "{members}"
    );
    println!(
        "{grants} grants ({during} during the {replaced_in:?} replacement), last token {:?}, \
         {} failed resigns; members at revision {revisions:?}; took {:?}",
        record.last.map(|(_, t)| t),
        record.failed_resigns,
        started.elapsed()
    );
}

/// A campaign dropped while etcd does not answer withdraws its key once
/// etcd answers again. A key left behind would wait in etcd's order for a
/// campaign nobody runs and, once the holder resigns, hold the election
/// for a session that does not know it: every other candidate would wait
/// behind it for as long as that session lives (a standby that leaves the
/// front of the line for a higher priority does exactly this, and so the
/// whole line stalled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_dropped_while_etcd_is_stopped_withdraws_its_key_once_it_answers() {
    use nix::sys::signal::Signal;
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .expect("cluster start");
    let endpoints = cluster.endpoints();
    let (holder, waiter) = (
        connect(&endpoints, "/withdraw").await,
        connect(&endpoints, "/withdraw").await,
    );
    let election = unique_election("withdraw");
    let ttl = Duration::from_secs(60);
    let held = holder.open_session(ttl).await.expect("a session").id;
    let grant = holder
        .campaign(held, &election, &id("holder"))
        .await
        .expect("granted");
    let session = waiter.open_session(ttl).await.expect("a session").id;
    let before = block_in_place(|| cluster.revision());
    let campaign = tokio::spawn({
        let (waiter, election) = (waiter.clone(), election.clone());
        async move { waiter.campaign(session, &election, &id("waiter")).await }
    });
    let until = Instant::now() + LIMIT;
    while block_in_place(|| cluster.revision()) == before {
        assert!(Instant::now() < until, "the waiter's key was not created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.signal(0, Signal::SIGSTOP);
    campaign.abort();
    // Longer than a request may take (3 s): the first withdrawal fails.
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.signal(0, Signal::SIGCONT);
    holder.resign(&grant).await.expect("resign");
    let until = Instant::now() + LIMIT;
    loop {
        match holder.leader(&election).await.expect("a read") {
            None => break,
            Some(leader) => assert!(
                Instant::now() < until,
                "the dropped campaign's key holds the election: {leader:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A commit etcd carried out but whose answer was lost, sent again to
/// another member by the client, is the commit it was: a release finds
/// the key it deleted and the token it recorded, and answers released
/// (it answered "not the holder" before, as a loaded CI machine showed),
/// a campaign finds its own key and is granted; a stale release, sent
/// once, is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_is_not_refused_when_sent_again() {
    let cluster = block_in_place(leasehold_testkit::shared::etcd);
    let members: Vec<String> = match &cluster {
        leasehold_testkit::shared::Server::Shared(members) => {
            members.split(',').map(str::to_owned).collect()
        }
        leasehold_testkit::shared::Server::Own(cluster) => cluster.endpoints(),
    };
    let first: SocketAddr = members[0].parse().expect("an address");
    let proxy = Proxy::start(first).await;
    let mut endpoints = vec![proxy.endpoint()];
    endpoints.extend(members[1..].iter().cloned());
    let prefix = format!("/{}", leasehold_testkit::shared::unique("lost-answer"));
    // Two handles, each with its own connections, both on the proxy.
    let (a, b) = (
        connect(&endpoints, &prefix).await,
        connect(&endpoints, &prefix).await,
    );
    let (held, free) = (unique_election("lost-held"), unique_election("lost-free"));
    let ttl = Duration::from_secs(60);
    let (sa, sb) = (
        a.open_session(ttl).await.expect("a session").id,
        b.open_session(ttl).await.expect("a session").id,
    );
    let grant = a.campaign(sa, &held, &id("a")).await.expect("granted");
    let candidate = id("b");
    proxy.hold_replies(true);
    let (released, granted) = tokio::join!(a.resign(&grant), b.campaign(sb, &free, &candidate));
    proxy.hold_replies(false);
    released.expect("the release its first attempt carried out");
    let granted = granted.expect("the campaign its first attempt carried out");
    assert_eq!(a.leader(&held).await.expect("a read"), None);
    let leader = a.leader(&free).await.expect("a read");
    assert_eq!(leader.map(|l| l.token), Some(granted.token));
    assert!(matches!(
        a.resign(&grant).await,
        Err(leasehold::Error::NotHolder { .. })
    ));
    b.resign(&granted).await.expect("released");
}
