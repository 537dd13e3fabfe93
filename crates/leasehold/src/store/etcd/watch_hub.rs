//! Every watch of one store handle on one gRPC stream.
//!
//! etcd serves any number of watches on one `Watch` stream, each under the
//! id etcd gives it, and answers create requests in the order they were
//! sent. A handle that holds thousands of elections keeps two waits open
//! per election (its monitor's and its steward's); one stream each cost
//! tens of KiB per election here and a stream opened per wait. The hub
//! keeps one stream per handle and sends the creations and cancellations
//! over it.
//!
//! A wait is "the first change from revision R on a key or range": the
//! hub resolves it at the first reply that carries events for its watch
//! and cancels that watch in etcd. When the stream breaks (a member lost,
//! a partition, a refused token) every wait resolves as broken, so its
//! caller reads again, and the next wait opens a new stream. A member
//! that another request found silent is left the same way at once,
//! rather than after the connection's pings go unanswered (7 s).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::client::{Link, Members};
use super::pb;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// A change in the range, at this revision (the last of the events
    /// that told it).
    Changed(i64),
    /// The watch could not be kept (the stream broke or could not be
    /// opened, the revision was compacted away, etcd cancelled it).
    Broken,
}

/// What the hub's task is asked.
enum Ask {
    Create {
        ticket: u64,
        create: pb::WatchCreateRequest,
        woken: oneshot::Sender<Woken>,
    },
    /// The wait was dropped before it resolved.
    Forget { ticket: u64 },
}

/// The handle's watches: one task and one stream, started on the first
/// wait and again after the stream ended.
#[derive(Default)]
pub(super) struct WatchHub {
    task: Mutex<Option<mpsc::UnboundedSender<Ask>>>,
    next_ticket: std::sync::atomic::AtomicU64,
}

/// Tells the hub to forget a wait dropped before it resolved.
struct Forget {
    asks: mpsc::UnboundedSender<Ask>,
    ticket: u64,
    armed: bool,
}

impl Drop for Forget {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.asks.send(Ask::Forget {
                ticket: self.ticket,
            });
        }
    }
}

impl WatchHub {
    /// Resolves at the first change of `[key, range_end)` (`key` alone
    /// without an end) from revision `from` on, or when the watch cannot
    /// be kept.
    pub(super) async fn next_change(
        &self,
        members: &Arc<Members>,
        key: Vec<u8>,
        range_end: Vec<u8>,
        from: i64,
    ) -> Woken {
        let ticket = self
            .next_ticket
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (woken, wait) = oneshot::channel();
        let ask = Ask::Create {
            ticket,
            create: pb::WatchCreateRequest {
                key,
                range_end,
                start_revision: from,
                progress_notify: false,
            },
            woken,
        };
        let asks = self.send(members, ask);
        let mut forget = Forget {
            asks,
            ticket,
            armed: true,
        };
        let outcome = wait.await.unwrap_or(Woken::Broken);
        forget.armed = false;
        outcome
    }

    /// Sends `ask` to the running task, starting one if none runs (or the
    /// last one ended with its stream).
    fn send(&self, members: &Arc<Members>, mut ask: Ask) -> mpsc::UnboundedSender<Ask> {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(asks) = task.as_ref() {
            match asks.send(ask) {
                Ok(()) => return asks.clone(),
                Err(mpsc::error::SendError(back)) => ask = back,
            }
        }
        let (asks, received) = mpsc::unbounded_channel();
        // The receiver is alive: it was just made.
        let _ = asks.send(ask);
        tokio::spawn(run(Arc::clone(members), received));
        *task = Some(asks.clone());
        asks
    }
}

/// The waits the task keeps.
#[derive(Default)]
struct Waits {
    /// Creations sent and not yet answered, in the order sent.
    unanswered: VecDeque<u64>,
    /// Waits by ticket, with their watch id once etcd gave one.
    by_ticket: HashMap<u64, (Option<i64>, oneshot::Sender<Woken>)>,
    /// Tickets by watch id.
    by_id: HashMap<i64, u64>,
}

impl Waits {
    fn wake(&mut self, ticket: u64, woken: Woken) {
        if let Some((id, sender)) = self.by_ticket.remove(&ticket) {
            if let Some(id) = id {
                self.by_id.remove(&id);
            }
            let _ = sender.send(woken);
        }
    }

    fn wake_all(&mut self, woken: Woken) {
        for (_, (_, sender)) in self.by_ticket.drain() {
            let _ = sender.send(woken);
        }
        self.by_id.clear();
        self.unanswered.clear();
    }
}

/// The task: opens the stream, then passes asks out and replies in until
/// the stream ends or the hub is gone.
async fn run(members: Arc<Members>, mut asks: mpsc::UnboundedReceiver<Ask>) {
    let mut waits = Waits::default();
    let (outgoing, requests) = mpsc::unbounded_channel::<pb::WatchRequest>();
    // etcd answers the call only once it has a request to answer: the
    // first creation goes out with the opening.
    while waits.unanswered.is_empty() {
        match asks.recv().await {
            Some(ask) => take(&mut waits, &outgoing, ask),
            None => return,
        }
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
        Err(error) => {
            tracing::debug!(%error, "etcd: cannot open the watch stream; waits read again");
            finish(waits, asks).await;
            return;
        }
    };
    loop {
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(ask) => take(&mut waits, &outgoing, ask),
                None => break,
            },
            reply = events.message() => match reply {
                Ok(Some(reply)) => {
                    if !answer(&mut waits, &outgoing, reply) {
                        members.token_refused(&link);
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            },
            Ok(()) = silenced.changed() => {
                // Only to another member: with one endpoint, or while
                // no other has answered yet, the stream stays.
                if members.silences(member) > silences && members.active() != member {
                    tracing::debug!("etcd: the watch stream's member is silent; waits read again on the next");
                    members.stream_moved();
                    break;
                }
            }
        }
    }
    finish(waits, asks).await;
}

/// Passes `ask` on to etcd.
fn take(waits: &mut Waits, outgoing: &mpsc::UnboundedSender<pb::WatchRequest>, ask: Ask) {
    match ask {
        Ask::Create {
            ticket,
            create,
            woken,
        } => {
            let request = pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
            };
            // The stream's receiving end lives as long as this task.
            let _ = outgoing.send(request);
            waits.unanswered.push_back(ticket);
            waits.by_ticket.insert(ticket, (None, woken));
        }
        Ask::Forget { ticket } => {
            if let Some((Some(id), _)) = waits.by_ticket.remove(&ticket) {
                waits.by_id.remove(&id);
                cancel(outgoing, id);
            }
        }
    }
}

/// The stream is gone: every wait reads again, and the next one opens a
/// new stream (this task's asks are refused from now on).
async fn finish(mut waits: Waits, mut asks: mpsc::UnboundedReceiver<Ask>) {
    asks.close();
    waits.wake_all(Woken::Broken);
    while let Some(ask) = asks.recv().await {
        if let Ask::Create { woken, .. } = ask {
            let _ = woken.send(Woken::Broken);
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
/// refused a creation other than for compaction: a token it no longer
/// knows, a permission).
fn answer(
    waits: &mut Waits,
    outgoing: &mpsc::UnboundedSender<pb::WatchRequest>,
    reply: pb::WatchResponse,
) -> bool {
    let id = reply.watch_id;
    if reply.created {
        let Some(ticket) = waits.unanswered.pop_front() else {
            // A creation nobody sent: not this stream's.
            return false;
        };
        if reply.canceled {
            waits.wake(ticket, Woken::Broken);
            return reply.compact_revision > 0;
        }
        match waits.by_ticket.get_mut(&ticket) {
            Some(wait) => {
                wait.0 = Some(id);
                waits.by_id.insert(id, ticket);
            }
            // Forgotten while its creation was on the way.
            None => cancel(outgoing, id),
        }
        if reply.events.is_empty() {
            return true;
        }
    }
    let Some(&ticket) = waits.by_id.get(&id) else {
        // A watch already resolved or forgotten; its cancellation is on
        // the way.
        return true;
    };
    if reply.canceled || reply.compact_revision > 0 {
        waits.wake(ticket, Woken::Broken);
    } else if !reply.events.is_empty() {
        let at = reply
            .events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.mod_revision)
            .max();
        let at = at
            .or(reply.header.as_ref().map(|h| h.revision))
            .unwrap_or(0);
        waits.wake(ticket, Woken::Changed(at));
        cancel(outgoing, id);
    }
    true
}
