//! What the sidecar's loop shares with its endpoints.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use leasehold::{CandidateId, ElectionName, Grant, LeaderWatch, NoteWatch, Session, Store};
use tokio::sync::{mpsc, oneshot};

use super::answer::{Held, Seen, Snapshot};

/// What the sidecar's loop keeps up to date for the endpoints.
#[derive(Default)]
pub struct Local {
    /// The grant held, with the session that renews it.
    pub held: Option<(Arc<Session>, Grant)>,
    /// Whether the loop waits in the line now.
    pub waiting: bool,
    /// The session this replica campaigns with, once open.
    pub session: Option<u64>,
}

/// An admin call for the loop, with where its answer goes.
pub enum Admin {
    Resign(oneshot::Sender<Result<String, String>>),
}

/// What every endpoint reads.
#[derive(Clone)]
pub struct Shared {
    pub election: ElectionName,
    pub me: CandidateId,
    pub store: Arc<dyn Store>,
    pub local: Arc<Mutex<Local>>,
    pub leader: Option<LeaderWatch>,
    /// The line's notes; `None` on a layout that keeps none (another
    /// recipe's), where waiting for the election is the line.
    pub line: Option<NoteWatch>,
    pub admin: mpsc::Sender<Admin>,
}

impl Shared {
    /// What is known now, for an answer decided now.
    pub fn snapshot(&self) -> Snapshot {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let held = local.held.as_ref().map(|(session, grant)| Held {
            token: grant.token.0,
            deadline: session.deadline().into_std(),
            over: session.grant_lost_now(grant).is_some(),
        });
        let leader = self.leader.as_ref().and_then(|w| {
            w.borrow().as_ref().map(|l| Seen {
                id: l.candidate.to_string(),
                session: l.session.map(|s| s.0),
                token: l.token.0,
            })
        });
        // In the line once its note is there, not as soon as it campaigns.
        // By id: the elector may open a new session while it campaigns
        // (after an outage), which this replica learns of only later.
        let in_line = match &self.line {
            Some(notes) => leasehold::admin::standbys(&notes.borrow())
                .iter()
                .any(|w| w.candidate == self.me),
            None => true,
        };
        Snapshot {
            me: self.me.to_string(),
            my_session: local.session,
            held,
            waiting: local.waiting && in_line,
            leader,
        }
    }
}

/// Who may make admin calls on a listener.
pub enum AdminAccess {
    /// Anyone who can connect (the socket: its mode is 0600).
    Open,
    /// Whoever sends this bearer token (TCP with `--admin-token-file`).
    Token(String),
    /// Nobody (TCP without `--admin-token-file`).
    Refused,
}

pub type AppState = State<(Shared, Arc<AdminAccess>)>;
