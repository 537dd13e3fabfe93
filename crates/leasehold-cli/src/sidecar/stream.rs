//! `GET /watch`: Server-Sent Events of this replica's leadership (gained
//! with its token and time left, renewed, lost with the reason) and of the
//! election's leader. A client that connects late is sent the current
//! state first; one that falls behind is sent the state again.

use std::convert::Infallible;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use tokio::sync::broadcast;

use super::events::{Change, LeadershipEvent};
use super::shared::{AppState, Shared};

/// How many events a slow client may fall behind before it is sent the
/// state again instead.
pub const BACKLOG: usize = 64;

#[derive(Serialize)]
struct LeaderEvent<'a> {
    leader: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
}

fn event(change: &Change) -> Event {
    let (name, data) = match change {
        Change::Leadership(leadership) => ("leadership", serde_json::to_string(leadership)),
        Change::Leader(leader) => (
            "leader",
            serde_json::to_string(&LeaderEvent {
                leader: leader.as_ref().map(|(id, _)| id.as_str()),
                token: leader.as_ref().map(|(_, token)| *token),
            }),
        ),
    };
    Event::default()
        .event(name)
        .data(data.unwrap_or_else(|_| "{}".to_owned()))
}

/// The current state, as a late client is first told it.
fn state(shared: &Shared) -> Vec<Change> {
    let snapshot = shared.snapshot();
    // What `/leader` would answer now.
    let answer = super::answer::leader(&snapshot, Instant::now()).body;
    let leader = snapshot.leader.map(|l| (l.id, l.token));
    vec![
        Change::Leadership(LeadershipEvent {
            change: "state",
            leading: answer.leading,
            token: answer.token,
            valid_for_ms: answer.valid_for_ms,
            reason: None,
        }),
        Change::Leader(leader),
    ]
}

pub async fn watch(
    State((shared, _)): AppState,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Subscribed before the state is read: nothing is missed in between.
    let changes = shared.events.subscribe();
    let first = state(&shared);
    let later = stream::unfold((changes, shared), |(mut changes, shared)| async move {
        let next = match changes.recv().await {
            Ok(change) => vec![change],
            Err(broadcast::error::RecvError::Lagged(_)) => state(&shared),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((stream::iter(next), (changes, shared)))
    })
    .flatten();
    let events = stream::iter(first).chain(later).map(|c| Ok(event(&c)));
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Reports each change of the election's leader (not its renewals).
pub async fn forward_leaders(
    mut leaders: leasehold::LeaderWatch,
    events: broadcast::Sender<Change>,
) {
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
