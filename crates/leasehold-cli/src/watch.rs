//! `GET /watch` on `run --http` and `sidecar --http`: Server-Sent Events of
//! this replica's leadership (gained with its token and time left,
//! renewed, lost with the reason) and of the election's leader. A client
//! is sent the last changes first (`history`, with their times), then the
//! current state; one that falls behind is sent the state again.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use tokio::sync::broadcast;

/// How many events a slow client may fall behind before it is sent the
/// state again instead.
pub const BACKLOG: usize = 64;

/// How many past changes (not renewals) a client is sent first.
const HISTORY: usize = 50;

/// `d` in whole milliseconds, as the answers and events give times.
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Something `/watch` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// This replica's leadership.
    Leadership(LeadershipEvent),
    /// The election's leader: its id and token, or none.
    Leader(Option<(String, u64)>),
}

/// This replica's leadership: `change` is `state` (on connecting),
/// `gained`, `renewed` or `lost`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeadershipEvent {
    pub change: &'static str,
    pub leading: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// This replica's leadership now, as a late client is first told it.
pub type Now = Arc<dyn Fn() -> LeadershipEvent + Send + Sync>;

/// What `/watch` streams: the changes as they are sent, and how to tell
/// the state now.
#[derive(Clone)]
pub struct Changes {
    sender: broadcast::Sender<Change>,
    leaders: Option<leasehold::LeaderWatch>,
    now: Now,
    /// The last changes, oldest first, with when they were seen.
    history: Arc<Mutex<VecDeque<(SystemTime, Change)>>>,
}

impl Changes {
    /// Streams what is sent on `sender` and each change of the leader
    /// `leaders` sees (forwarded from now on, in the background).
    pub fn new(
        sender: broadcast::Sender<Change>,
        leaders: Option<leasehold::LeaderWatch>,
        now: Now,
    ) -> Self {
        // Subscribed before the leader is first forwarded: it is the
        // first entry of the history.
        let history = Arc::default();
        tokio::spawn(record(sender.subscribe(), Arc::clone(&history)));
        if let Some(leaders) = leaders.clone() {
            tokio::spawn(forward_leaders(leaders, sender.clone()));
        }
        Changes {
            sender,
            leaders,
            now,
            history,
        }
    }

    /// The last changes as one `history` event: a JSON array of each
    /// change's event name, its fields and `at_ms` (Unix time, ms).
    fn history(&self) -> Event {
        let past: Vec<serde_json::Value> = self
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(at, change)| {
                let (name, mut data) = fields(change);
                let at_ms = at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, millis);
                data["event"] = name.into();
                data["at_ms"] = at_ms.into();
                data
            })
            .collect();
        Event::default()
            .event("history")
            .data(serde_json::Value::from(past).to_string())
    }

    fn state(&self) -> Vec<Change> {
        let leader = self.leaders.as_ref().and_then(|w| {
            w.borrow()
                .as_ref()
                .map(|l| (l.candidate.to_string(), l.token.0))
        });
        vec![Change::Leadership((self.now)()), Change::Leader(leader)]
    }
}

#[derive(Serialize)]
struct LeaderEvent<'a> {
    leader: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
}

/// A change's event name and fields.
fn fields(change: &Change) -> (&'static str, serde_json::Value) {
    let data = match change {
        Change::Leadership(leadership) => serde_json::to_value(leadership),
        Change::Leader(leader) => serde_json::to_value(LeaderEvent {
            leader: leader.as_ref().map(|(id, _)| id.as_str()),
            token: leader.as_ref().map(|(_, token)| *token),
        }),
    };
    let name = match change {
        Change::Leadership(_) => "leadership",
        Change::Leader(_) => "leader",
    };
    (name, data.unwrap_or_default())
}

fn event(change: &Change) -> Event {
    let (name, data) = fields(change);
    Event::default().event(name).data(data.to_string())
}

/// Keeps the last [`HISTORY`] changes other than renewals.
async fn record(
    mut changes: broadcast::Receiver<Change>,
    history: Arc<Mutex<VecDeque<(SystemTime, Change)>>>,
) {
    loop {
        match changes.recv().await {
            Ok(Change::Leadership(LeadershipEvent {
                change: "renewed", ..
            })) => {}
            Ok(change) => {
                let mut history = history.lock().unwrap_or_else(PoisonError::into_inner);
                if history.len() == HISTORY {
                    history.pop_front();
                }
                history.push_back((SystemTime::now(), change));
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

pub async fn watch(
    State(changes): State<Changes>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Subscribed before the state is read: nothing is missed in between.
    let receiver = changes.sender.subscribe();
    let history = changes.history();
    let first = changes.state();
    let later = stream::unfold((receiver, changes), |(mut receiver, changes)| async move {
        let next = match receiver.recv().await {
            Ok(change) => vec![change],
            Err(broadcast::error::RecvError::Lagged(_)) => changes.state(),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((stream::iter(next), (receiver, changes)))
    })
    .flatten();
    let events = stream::once(async { history })
        .chain(stream::iter(first).chain(later).map(|c| event(&c)))
        .map(Ok);
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Reports each change of the election's leader (not its renewals).
async fn forward_leaders(mut leaders: leasehold::LeaderWatch, events: broadcast::Sender<Change>) {
    let mut last: Option<(String, u64)> = None;
    loop {
        let now = leaders
            .borrow_and_update()
            .as_ref()
            .map(|l| (l.candidate.to_string(), l.token.0));
        if now != last {
            let _ = events.send(Change::Leader(now.clone()));
            last = now;
        }
        if leaders.changed().await.is_err() {
            return;
        }
    }
}
