//! What the sidecar answers about leadership: decided at the moment of a
//! request, from a snapshot taken at that moment, by pure functions whose
//! rules the tests below check exactly.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::watch::millis;

/// What the sidecar knows at the moment of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// This replica's candidate id.
    pub me: String,
    /// This replica's session, while it has one.
    pub my_session: Option<u64>,
    /// The grant this replica holds, if any.
    pub held: Option<Held>,
    /// Whether this replica waits in the election's line.
    pub waiting: bool,
    /// The election's leader as last observed; `None` when there is none
    /// or it is not known.
    pub leader: Option<Seen>,
}

/// A grant this replica holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub token: u64,
    /// The conservative deadline: no longer the leader at or after it.
    pub deadline: Instant,
    /// Whether the lease core already says it is over (lost, released).
    pub over: bool,
}

/// A leader as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: String,
    pub session: Option<u64>,
    pub token: u64,
}

/// The body of `/leader` and `/follower`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Body {
    /// This replica's id.
    pub id: String,
    /// Whether this replica leads now.
    pub leading: bool,
    /// This replica's token, while it leads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Time left before the deadline, while it leads: how long the
    /// application may act on this answer at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_for_ms: Option<u64>,
    /// Another replica that leads, as last observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Its token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_token: Option<u64>,
}

/// An answer: 200 or 503, and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub ok: bool,
    pub body: Body,
}

impl Snapshot {
    /// The time left on this replica's grant at `now`: `Some` only while it
    /// holds one that is not over and whose deadline has not passed.
    pub fn valid_for(&self, now: Instant) -> Option<(u64, Duration)> {
        let held = self.held.filter(|h| !h.over && now < h.deadline)?;
        Some((held.token, held.deadline - now))
    }

    /// Another replica (or another session of this id) that leads.
    fn other_leader(&self) -> Option<&Seen> {
        self.leader
            .as_ref()
            .filter(|l| l.id != self.me || l.session != self.my_session)
    }

    fn body(&self, now: Instant) -> Body {
        let valid = self.valid_for(now);
        let other = valid.is_none().then(|| self.other_leader()).flatten();
        Body {
            id: self.me.clone(),
            leading: valid.is_some(),
            token: valid.map(|(token, _)| token),
            valid_for_ms: valid.map(|(_, left)| millis(left)),
            leader: other.map(|l| l.id.clone()),
            leader_token: other.map(|l| l.token),
        }
    }
}

/// `/leader`: 200 only while this replica holds a grant that is not over
/// and whose deadline has not passed at `now`.
pub fn leader(snapshot: &Snapshot, now: Instant) -> Answer {
    let body = snapshot.body(now);
    Answer {
        ok: body.leading,
        body,
    }
}

/// `/follower`: 200 while this replica waits in the line and another
/// leads.
pub fn follower(snapshot: &Snapshot, now: Instant) -> Answer {
    let body = snapshot.body(now);
    Answer {
        ok: !body.leading && snapshot.waiting && body.leader.is_some(),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(held: Option<Held>, waiting: bool, leader: Option<Seen>) -> Snapshot {
        Snapshot {
            me: "a".into(),
            my_session: Some(1),
            held,
            waiting,
            leader,
        }
    }

    fn seen(id: &str, session: u64, token: u64) -> Option<Seen> {
        Some(Seen {
            id: id.into(),
            session: Some(session),
            token,
        })
    }

    #[test]
    fn a_holder_leads_until_its_deadline_and_not_at_it() {
        let now = Instant::now();
        let deadline = now + Duration::from_millis(1500);
        let held = Some(Held {
            token: 7,
            deadline,
            over: false,
        });
        let s = snapshot(held, false, seen("a", 1, 7));
        let answer = leader(&s, now);
        assert!(answer.ok);
        assert_eq!(answer.body.token, Some(7));
        assert_eq!(answer.body.valid_for_ms, Some(1500));
        assert_eq!(answer.body.leader, None, "it leads itself");
        let just_before = leader(&s, deadline - Duration::from_nanos(1));
        assert!(just_before.ok);
        assert_eq!(just_before.body.valid_for_ms, Some(0));
        for at in [deadline, deadline + Duration::from_secs(1)] {
            let answer = leader(&s, at);
            assert!(!answer.ok, "at or after the deadline: {answer:?}");
            assert_eq!((answer.body.token, answer.body.valid_for_ms), (None, None));
            assert!(!follower(&s, at).ok, "not waiting in the line");
        }
    }

    #[test]
    fn a_grant_the_lease_core_says_is_over_is_not_leadership() {
        let now = Instant::now();
        let held = Some(Held {
            token: 7,
            deadline: now + Duration::from_secs(10),
            over: true,
        });
        let answer = leader(&snapshot(held, false, seen("a", 1, 7)), now);
        assert!(!answer.ok);
        assert!(!answer.body.leading);
    }

    #[test]
    fn a_waiting_replica_follows_another_leader() {
        let now = Instant::now();
        let s = snapshot(None, true, seen("b", 2, 9));
        let (l, f) = (leader(&s, now), follower(&s, now));
        assert!(!l.ok && f.ok);
        assert_eq!(
            (f.body.leader.as_deref(), f.body.leader_token),
            (Some("b"), Some(9))
        );
        // A twin (this id, another session) is another leader too.
        let twin = snapshot(None, true, seen("a", 3, 9));
        assert!(follower(&twin, now).ok);
    }

    #[test]
    fn no_leader_or_not_waiting_is_not_following() {
        let now = Instant::now();
        assert!(!follower(&snapshot(None, true, None), now).ok);
        assert!(!follower(&snapshot(None, false, seen("b", 2, 9)), now).ok);
        // This replica's own grant, seen by the watch after its deadline
        // passed: neither leading nor following another.
        let past = Some(Held {
            token: 7,
            deadline: now,
            over: false,
        });
        let s = snapshot(past, true, seen("a", 1, 7));
        assert!(!leader(&s, now).ok);
        assert!(!follower(&s, now).ok);
    }
}
