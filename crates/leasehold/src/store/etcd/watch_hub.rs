//! Every watch of one store handle on one gRPC stream.
//!
//! etcd serves any number of watches on one `Watch` stream, each under the
//! id etcd gives it, and answers create requests in the order they were
//! sent. A handle that holds thousands of elections keeps two watches open
//! per election (of its holder and of its line); a stream, or a task, each
//! cost tens of KiB or most of a KiB per election. The hub keeps one task
//! and one stream per handle, and each watch is an entry in its tables
//! that holds the sending end of the watch's channel.
//!
//! A watch follows a key or a range from a revision on: every reply with
//! events tells its channel the last revision they carry. When the stream
//! breaks (a member lost, a partition, a refused token) every watch is told
//! that the store does not answer, and once a new stream answers its
//! creation, that something may have changed (its reader reads again); a
//! watch is created again from the last revision it told, and one whose
//! revision was compacted away from the oldest etcd keeps. A member that
//! another request found silent is left the same way at once, rather than
//! after the connection's pings go unanswered (7 s). A watch nobody reads
//! any more is cancelled at its next event, or when the watches double.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::client::{Link, Members};
use super::pb;
use crate::store::keys::{Heard, KeyWatch, Revision};
use crate::watch;

/// Pause before a broken stream is opened again.
const RETRY: Duration = Duration::from_millis(200);
/// The fewest watches at which the hub looks for those nobody reads.
const PRUNE_AT: usize = 64;

/// A watch the hub keeps.
struct Follower {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The last revision told: changes after it are watched.
    seen: i64,
    tx: watch::Sender<Heard>,
}

impl Follower {
    fn tell(&mut self, at: i64) {
        self.seen = self.seen.max(at);
        self.tx.send_replace(Heard::Changed(Revision(
            u64::try_from(self.seen).unwrap_or(0),
        )));
    }

    fn unknown(&self, why: &str) {
        self.tx.send_if_modified(|heard| {
            let news = !matches!(heard, Heard::Unknown { .. });
            *heard = Heard::Unknown {
                error: format!("etcd: {why}"),
            };
            news
        });
    }

    /// The stream answers its creation: a reader that heard "unknown"
    /// reads again.
    fn answered(&self) {
        let seen = Revision(u64::try_from(self.seen).unwrap_or(0));
        self.tx.send_if_modified(|heard| {
            let was_unknown = matches!(heard, Heard::Unknown { .. });
            if was_unknown {
                *heard = Heard::Changed(seen);
            }
            was_unknown
        });
    }

    fn create(&self) -> pb::WatchRequest {
        pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: self.key.clone(),
                    range_end: self.range_end.clone(),
                    start_revision: self.seen.saturating_add(1),
                    progress_notify: false,
                },
            )),
        }
    }
}

/// The handle's watches: one task, started on the first watch, and one
/// stream at a time.
#[derive(Default)]
pub(super) struct WatchHub {
    task: Mutex<Option<mpsc::UnboundedSender<Follower>>>,
}

impl WatchHub {
    /// Watches `[key, range_end)` (`key` alone without an end) for the
    /// changes after revision `seen`.
    pub(super) fn follow(
        &self,
        members: &Arc<Members>,
        key: Vec<u8>,
        range_end: Vec<u8>,
        seen: i64,
    ) -> KeyWatch {
        let start = Revision(u64::try_from(seen).unwrap_or(0));
        let (tx, rx) = watch::channel(Heard::Changed(start));
        let mut follower = Follower {
            key,
            range_end,
            seen,
            tx,
        };
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(asks) = task.as_ref() {
            match asks.send(follower) {
                Ok(()) => return rx,
                Err(mpsc::error::SendError(back)) => follower = back,
            }
        }
        let (asks, received) = mpsc::unbounded_channel();
        // The receiver is alive: it was just made.
        let _ = asks.send(follower);
        tokio::spawn(run(Arc::clone(members), received));
        *task = Some(asks);
        rx
    }
}

/// The watches the task keeps, by ticket, and on the current stream.
#[derive(Default)]
struct Followers {
    next: u64,
    by_ticket: HashMap<u64, (Option<i64>, Follower)>,
    /// Tickets by watch id, on the current stream.
    by_id: HashMap<i64, u64>,
    /// Creations sent on the current stream and not yet answered.
    unanswered: VecDeque<u64>,
    prune_at: usize,
}

impl Followers {
    fn add(&mut self, follower: Follower) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.by_ticket.insert(ticket, (None, follower));
        ticket
    }

    /// Sends the creation of `ticket`'s watch on `outgoing`.
    fn create(&mut self, outgoing: &mpsc::UnboundedSender<pb::WatchRequest>, ticket: u64) {
        if let Some((_, follower)) = self.by_ticket.get(&ticket) {
            // The stream's receiving end lives as long as the task.
            let _ = outgoing.send(follower.create());
            self.unanswered.push_back(ticket);
        }
    }

    /// etcd answered the oldest creation on the stream, as watch `id`
    /// (`kept`: not cancelled); its ticket, `None` if none was sent.
    fn created(
        &mut self,
        outgoing: &mpsc::UnboundedSender<pb::WatchRequest>,
        id: i64,
        kept: bool,
    ) -> Option<u64> {
        let ticket = self.unanswered.pop_front()?;
        if kept {
            match self.by_ticket.get_mut(&ticket) {
                Some((slot, follower)) => {
                    *slot = Some(id);
                    self.by_id.insert(id, ticket);
                    follower.answered();
                }
                // Forgotten while its creation was on the way.
                None => cancel(outgoing, id),
            }
        }
        Some(ticket)
    }

    /// Forgets the watches nobody reads, once they doubled since the
    /// last look, cancelling them in etcd.
    fn prune(&mut self, outgoing: &mpsc::UnboundedSender<pb::WatchRequest>) {
        if self.by_ticket.len() < self.prune_at.max(PRUNE_AT) {
            return;
        }
        let by_id = &mut self.by_id;
        self.by_ticket.retain(|_, (id, follower)| {
            let read = !follower.tx.is_closed();
            if let (false, Some(id)) = (read, *id) {
                by_id.remove(&id);
                cancel(outgoing, id);
            }
            read
        });
        self.prune_at = self.by_ticket.len() * 2;
    }

    /// The stream ended: every watch hears that the store does not answer
    /// (those nobody reads are forgotten).
    fn stream_ended(&mut self, why: &str) {
        self.by_id.clear();
        self.unanswered.clear();
        self.by_ticket.retain(|_, (id, follower)| {
            *id = None;
            follower.unknown(why);
            !follower.tx.is_closed()
        });
    }
}

/// The task: while anyone follows, opens a stream, creates every watch on
/// it and passes replies in, again after a pause when it ends; ends with
/// the hub.
async fn run(members: Arc<Members>, mut asks: mpsc::UnboundedReceiver<Follower>) {
    let mut followers = Followers::default();
    loop {
        while followers.by_ticket.is_empty() {
            match asks.recv().await {
                Some(follower) => {
                    followers.add(follower);
                }
                None => return,
            }
        }
        let why = match stream(&members, &mut asks, &mut followers).await {
            Some(why) => why,
            None => return,
        };
        tracing::debug!(%why, "etcd: the watch stream ended; watches are made again on the next");
        followers.stream_ended(&why);
        // The pause, taking new watches meanwhile: they too hear that the
        // store does not answer.
        let pause = tokio::time::sleep(RETRY);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                follower = asks.recv() => match follower {
                    Some(follower) => {
                        follower.unknown(&why);
                        followers.add(follower);
                    }
                    None => return,
                },
            }
        }
    }
}

/// One stream: opened on the member requests last found answering, every
/// watch created on it; returns why it ended (`None`: the hub is gone).
async fn stream(
    members: &Arc<Members>,
    asks: &mut mpsc::UnboundedReceiver<Follower>,
    followers: &mut Followers,
) -> Option<String> {
    let (outgoing, requests) = mpsc::unbounded_channel::<pb::WatchRequest>();
    // etcd answers the call only once it has a request to answer: the
    // creations go out with the opening.
    let tickets: Vec<u64> = followers.by_ticket.keys().copied().collect();
    for ticket in tickets {
        followers.create(&outgoing, ticket);
    }
    // A member that requests find silent is left by them at once; the
    // stream follows rather than wait for its pings to go unanswered.
    let member = members.member(0);
    let mut silenced = members.silenced();
    let silences = members.silences(member);
    let opened = match members.link_of(member).await {
        Ok(link) => open(&link, requests).await.map(|events| (link, events)),
        Err(error) => Err(crate::error::Error::from(error).to_string()),
    };
    let (link, mut events) = match opened {
        Ok(opened) => opened,
        Err(error) => return Some(format!("cannot open the watch stream: {error}")),
    };
    loop {
        tokio::select! {
            follower = asks.recv() => {
                let ticket = followers.add(follower?);
                followers.create(&outgoing, ticket);
                followers.prune(&outgoing);
            }
            reply = events.message() => match reply {
                Ok(Some(reply)) => {
                    let cluster = reply.header.as_ref().map_or(0, |h| h.cluster_id);
                    if members.one_cluster(member, cluster).is_err() {
                        return Some("the watch stream's member is of another cluster".into());
                    }
                    if !answer(followers, &outgoing, reply) {
                        members.token_refused(&link);
                        return Some("etcd refused a watch".into());
                    }
                }
                Ok(None) | Err(_) => return Some("the watch stream broke".into()),
            },
            Ok(()) = silenced.changed() => {
                // Only to another member: with one endpoint, or while
                // no other has answered yet, the stream stays.
                if members.silences(member) > silences && members.active() != member {
                    members.stream_moved();
                    return Some("the watch stream's member is silent".into());
                }
            }
        }
    }
}

/// Opens the stream; its requests are what `requests` brings.
async fn open(
    link: &Link,
    requests: mpsc::UnboundedReceiver<pb::WatchRequest>,
) -> Result<tonic::Streaming<pb::WatchResponse>, String> {
    pb::watch_client::WatchClient::new(link.channel())
        .watch(link.request(UnboundedReceiverStream::new(requests)))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| super::client::describe(&status))
}

fn cancel(outgoing: &mpsc::UnboundedSender<pb::WatchRequest>, id: i64) {
    let _ = outgoing.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CancelRequest(
            pb::WatchCancelRequest { watch_id: id },
        )),
    });
}

/// Handles one reply; `false` when the stream must be given up (etcd
/// refused or cancelled a watch other than for compaction: a token it no
/// longer knows, a permission).
fn answer(
    followers: &mut Followers,
    outgoing: &mpsc::UnboundedSender<pb::WatchRequest>,
    reply: pb::WatchResponse,
) -> bool {
    let id = reply.watch_id;
    let ticket = if reply.created {
        let Some(ticket) = followers.created(outgoing, id, !reply.canceled) else {
            // A creation nobody sent: not this stream's.
            return false;
        };
        ticket
    } else {
        match followers.by_id.get(&id) {
            Some(&ticket) => ticket,
            // A watch forgotten; its cancellation is on the way.
            None => return true,
        }
    };
    if reply.canceled {
        followers.by_id.remove(&id);
        if reply.compact_revision <= 0 {
            return false;
        }
        // Its start was compacted away: its reader reads again, and it
        // follows from the oldest revision etcd keeps.
        if let Some((slot, follower)) = followers.by_ticket.get_mut(&ticket) {
            *slot = None;
            follower.tell(reply.compact_revision);
            followers.create(outgoing, ticket);
        }
        return true;
    }
    if reply.events.is_empty() {
        return true;
    }
    let at = reply
        .events
        .iter()
        .filter_map(|e| e.kv.as_ref())
        .map(|kv| kv.mod_revision)
        .max()
        .or(reply.header.as_ref().map(|h| h.revision))
        .unwrap_or(0);
    match followers.by_ticket.get_mut(&ticket) {
        Some((_, follower)) if !follower.tx.is_closed() => follower.tell(at),
        _ => {
            followers.by_ticket.remove(&ticket);
            followers.by_id.remove(&id);
            cancel(outgoing, id);
        }
    }
    true
}
