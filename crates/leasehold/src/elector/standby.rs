//! A candidate's wait in the line of standbys ([`crate::line`]): it asks
//! the store only while it is the chosen one, and while it is neither the
//! first in line nor chosen it watches just its own note and the one of
//! the standby ahead of it, so that no change elsewhere wakes it.

use std::sync::Arc;

use super::Elector;
use crate::error::{Error, Result};
use crate::line::{self, FrontStep};
use crate::names::ElectionName;
use crate::session::Session;
use crate::store::{FencingToken, Grant, Note, Store};

/// How a campaign got its grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Free and nobody in line: one request, no note
    /// ([`Store::try_campaign_unwaited`]).
    Unwaited,
    /// Through the line of standbys.
    InLine,
    /// Straight from the store, which keeps no line (or a campaign that
    /// skips it).
    WithoutLine,
}

impl Elector {
    /// A single election's campaign ([`Elector::campaign_in_line`]),
    /// refused on the name of a shard or slot of a group that has members,
    /// before it starts and again once granted, resigning the grant. A
    /// group whose first member joins after that second look counts the
    /// grant as no member's, and waits for the shard. No store request
    /// for any other name.
    pub(super) async fn campaign_single(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<(Grant, Taken)> {
        crate::group::refuse_inside_group(&*self.store, election).await?;
        let (grant, taken) = self.campaign_in_line(session, election).await?;
        if let Err(refused @ Error::Conflict(_)) =
            crate::group::refuse_inside_group(&*self.store, election).await
        {
            if let Err(error) = self.store.resign(&grant).await {
                tracing::debug!(%election, %error, "could not resign a grant inside a group; it ends with its session");
            }
            return Err(refused);
        }
        Ok((grant, taken))
    }

    /// Campaigns on `session` as one of the line of standbys; with the
    /// grant, how it was taken. On a store that keeps no notes, campaigns
    /// directly (priorities and lock-delay then cannot be honoured, and
    /// are refused).
    pub(super) async fn campaign_in_line(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<(Grant, Taken)> {
        let sid = session.id();
        let started = self.started(election);
        // Nobody holds it and nobody waits: taken with one request, no
        // note. Not with a lock-delay, which must first learn how the last
        // holder left.
        if self.planned.lock_delay.is_zero()
            && let Some(grant) = self
                .store
                .try_campaign_unwaited(sid, election, &self.candidate)
                .await?
        {
            return Ok((grant, Taken::Unwaited));
        }
        match self.join_line(session, election).await {
            Err(Error::Unsupported(what)) => {
                if self.planned.priority != 0 || !self.planned.lock_delay.is_zero() {
                    return Err(Error::Unsupported(format!(
                        "priorities and lock-delay: {what}"
                    )));
                }
                let grant = self.store.campaign(sid, election, &self.candidate).await?;
                return Ok((grant, Taken::WithoutLine));
            }
            other => other?,
        }
        // Leaves the line however the campaign ends (granted, failed, or
        // dropped).
        let _leave = LeaveLine {
            store: Arc::clone(&self.store),
            session: sid,
            election: election.clone(),
            joins: Arc::clone(&self.joins),
            started,
        };
        let grant = self.wait_in_line(session, election).await?;
        Ok((grant, Taken::InLine))
    }

    /// Waits in the line (joined) until granted: behind the standby
    /// ahead, then at the front.
    async fn wait_in_line(&self, session: &Arc<Session>, election: &ElectionName) -> Result<Grant> {
        let sid = session.id();
        if let Some(grant) = self.live_or_release_stale(session, election).await? {
            return Ok(grant);
        }
        let mut missing = false;
        loop {
            let notes = self.store.notes(election).await?;
            group_refuses(election, &notes)?;
            let mut marked = false;
            let line = line::standbys(&notes);
            let Some(ahead) = line::place(&line, sid) else {
                // This candidate's note is not there (a store that lost
                // it): put it again, once.
                if std::mem::replace(&mut missing, true) {
                    return Err(Error::Unavailable {
                        reason: format!(
                            "the store does not show this candidate waiting for {election}"
                        ),
                        source: None,
                    });
                }
                self.join_line(session, election).await?;
                continue;
            };
            missing = false;
            if let Some(ahead) = ahead
                && line::chosen(&notes) != Some(sid)
            {
                marked = self.wait_behind(sid, ahead, election).await?;
            }
            // A leader's mark is the handover's critical path: straight
            // to the front, which reads the whole line as it opens its
            // watch. Otherwise read the line again first.
            if (ahead.is_none() || marked || line::chosen(&notes) == Some(sid))
                && let Some(grant) = self.campaign_at_the_front(session, election).await?
            {
                return Ok(grant);
            }
        }
    }

    /// Counts a campaign of this elector for `election` starting: the
    /// number it is given.
    fn started(&self, election: &ElectionName) -> u64 {
        let mut joins = crate::mutex::lock(&self.joins);
        let started = joins.entry(election.clone()).or_default();
        *started += 1;
        *started
    }

    async fn join_line(&self, session: &Arc<Session>, election: &ElectionName) -> Result<()> {
        self.store
            .put_note(
                session.id(),
                election,
                line::CANDIDATE,
                &line::candidate_note(self.planned.priority, &self.candidate),
            )
            .await
    }

    /// Waits, behind the standby `ahead` (as the line read showed it),
    /// until that one leaves the line or its note is no longer the one
    /// read (`false`), or a leader marks this candidate as its choice
    /// (`true`). Changes of any other note never reach it.
    ///
    /// A note put again (its candidate's campaign failed and started over,
    /// a delete and a put that one read of the store saw as one) stands
    /// later in the line: the candidate may now wait behind this one, and
    /// waiting on would close a ring in which nobody is first.
    async fn wait_behind(
        &self,
        sid: crate::grant::SessionId,
        ahead: &line::Standby,
        election: &ElectionName,
    ) -> Result<bool> {
        let mut own = self
            .store
            .watch_note(sid, election, line::CANDIDATE)
            .await?;
        let mut front = self
            .store
            .watch_note(ahead.session, election, line::CANDIDATE)
            .await?;
        loop {
            let mine = line::standbys(&own.borrow_and_update());
            match mine.first() {
                Some(me) if me.chosen_by.is_some() => return Ok(true),
                // Gone: the caller reads the line and puts it again.
                None => return Ok(false),
                Some(_) => {}
            }
            let still_ahead = line::standbys(&front.borrow_and_update())
                .first()
                .is_some_and(|now| now.order == ahead.order && now.priority == ahead.priority);
            if !still_ahead {
                return Ok(false);
            }
            tokio::select! {
                changed = own.changed() => changed.map_err(|_| watch_ended())?,
                changed = front.changed() => changed.map_err(|_| watch_ended())?,
            }
        }
    }

    /// Waits at the front of the line — first in line, or chosen by a
    /// leader — watching the whole line, and asks the store while chosen.
    /// `None` once this candidate is neither first nor chosen any more.
    async fn campaign_at_the_front(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<Option<Grant>> {
        let sid = session.id();
        let mut notes = self.store.watch_notes(election).await?;
        // Only lock-delay needs to follow the leader while waiting.
        let mut leaders = if self.planned.lock_delay.is_zero() {
            None
        } else {
            Some(self.store.watch(election).await?)
        };
        let mut last_leader: Option<FencingToken> = None;
        // Notes read afresh after a grant this candidate gave back, newer
        // than the watch may show yet.
        let mut fresh: Option<Vec<Note>> = None;
        loop {
            let current = match fresh.take() {
                Some(fresh) => fresh,
                None => notes.borrow_and_update().clone(),
            };
            let holder = leaders.as_mut().map(|l| l.borrow_and_update().clone());
            if let Some(Some(holder)) = &holder {
                last_leader = Some(holder.token);
            }
            let followed = holder.as_ref().map(Option::as_ref);
            match line::front_step(&current, sid, followed, last_leader) {
                FrontStep::Leave => return Ok(None),
                FrontStep::Wait => {
                    match leaders.as_mut() {
                        Some(leaders) => tokio::select! {
                            changed = notes.changed() => changed.map_err(|_| watch_ended())?,
                            changed = leaders.changed() => changed.map_err(|_| watch_ended())?,
                        },
                        None => notes.changed().await.map_err(|_| watch_ended())?,
                    }
                    continue;
                }
                FrontStep::AskHowItLeft(token) => {
                    last_leader = None;
                    if self.store.last_release(election).await? != Some(token) {
                        tracing::info!(%election, expired_token = token.0, delay = ?self.planned.lock_delay,
                            "the previous leader did not release (its lease expired, or on SQLite its process died); waiting out the lock-delay");
                        session.sleep(self.planned.lock_delay).await;
                        continue;
                    }
                }
                FrontStep::Campaign => {}
            }
            match self.ask_while_chosen(sid, election, &mut notes).await? {
                Asked::Granted(grant) => return Ok(Some(grant)),
                Asked::GaveBack(notes) => fresh = Some(notes),
                Asked::Withdrew => {}
            }
            // A campaign withdrawn after the store granted it (its reply
            // was still on the way) leaves a grant this session holds.
            self.live_or_release_stale(session, election).await?;
        }
    }

    /// Asks the store for `election` while this candidate stays chosen.
    async fn ask_while_chosen(
        &self,
        sid: crate::grant::SessionId,
        election: &ElectionName,
        notes: &mut crate::store::NoteWatch,
    ) -> Result<Asked> {
        let campaign = self.store.campaign(sid, election, &self.candidate);
        tokio::pin!(campaign);
        loop {
            tokio::select! {
                biased;
                grant = &mut campaign => {
                    let grant = grant?;
                    return Ok(match self.give_back_if_another_was_chosen(&grant).await {
                        None => Asked::Granted(grant),
                        Some(notes) => Asked::GaveBack(notes),
                    });
                }
                changed = notes.changed() => {
                    changed.map_err(|_| watch_ended())?;
                    if line::chosen(&notes.borrow_and_update()) != Some(sid) {
                        // Another was chosen: withdraw from the store.
                        return Ok(Asked::Withdrew);
                    }
                }
            }
        }
    }

    /// A grant of `election` that the store shows this candidate holding
    /// while this campaign runs. Live in this process (another campaign of
    /// this elector holds it): the store gives it again, as before the
    /// line. Otherwise it is one this session no longer holds though the
    /// store still shows it — a release whose reply was lost or that is
    /// still on its way, a campaign withdrawn after the store had granted
    /// it — and it is released (guarded by its token, as every release),
    /// never taken up again: a release of it may land at any moment, and
    /// waiting in line instead would wait for a grant this very session
    /// keeps alive. (A failed read fails the campaign, which its caller
    /// tries again.)
    pub(super) async fn live_or_release_stale(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<Option<Grant>> {
        let Some(leader) = self.store.leader(election).await? else {
            return Ok(None);
        };
        if leader.candidate != self.candidate {
            return Ok(None);
        }
        let grant = Grant {
            election: election.clone(),
            candidate: self.candidate.clone(),
            session: session.id(),
            token: leader.token,
        };
        if session.grant_lost_now(&grant).is_none() {
            let grant = self
                .store
                .campaign(session.id(), election, &self.candidate)
                .await?;
            return Ok(Some(grant));
        }
        match self.store.resign(&grant).await {
            Ok(()) => {
                tracing::debug!(%election, token = grant.token.0, "released a grant the store still showed for this session");
            }
            // Gone meanwhile, or another session's: a twin of this
            // candidate id, which is named (it is never released).
            Err(Error::NotHolder { .. }) => {
                let held = self.store.leader(election).await.ok().flatten();
                if held.is_some_and(|l| l.token == leader.token) {
                    tracing::warn!(%election, id = %self.candidate, token = leader.token.0,
                        "another replica with this candidate id holds the election (ids must be unique: give each replica its own); this one waits");
                }
            }
            Err(error) => return Err(error),
        }
        Ok(None)
    }

    /// After the store granted `grant`: whether a leader that handed over
    /// chose another standby (it marked that standby's note just before it
    /// released), which this candidate's notes watch may not have shown
    /// when it asked. Then the grant is released at once, before anyone
    /// acts on it, and the fresh notes are returned. The store orders that
    /// mark before the release
    /// that let this grant happen, so the read sees it; the old leader
    /// removes it only once the chosen one holds. If the notes cannot be
    /// read, the grant is kept: the choice is a preference, never safety.
    async fn give_back_if_another_was_chosen(
        &self,
        grant: &Grant,
    ) -> Option<Vec<crate::store::Note>> {
        let election = &grant.election;
        let notes = match self.store.notes(election).await {
            Ok(notes) => notes,
            Err(error) => {
                tracing::debug!(%election, %error, "cannot read the line after a grant; keeping it");
                return None;
            }
        };
        if !line::gives_back(&notes, grant.session) {
            return None;
        }
        tracing::debug!(%election, token = grant.token.0, "granted while another standby was chosen; giving the grant back");
        // Given back even if the release fails: its reply may have been
        // lost after the store released it, and a successor may hold now.
        // If it did not land, the grant is released again once the
        // campaign sees the store still showing it.
        if let Err(error) = self.store.resign(grant).await {
            tracing::debug!(%election, %error, "giving back a grant failed; it is released again later");
        }
        Some(notes)
    }
}

/// How asking the store while chosen ended.
enum Asked {
    /// Granted, and kept.
    Granted(Grant),
    /// Granted while a leader had chosen another: given back; the line as
    /// read then.
    GaveBack(Vec<Note>),
    /// Another was chosen meanwhile: the campaign was withdrawn.
    Withdrew,
}

/// A single election's campaign finds, once its note is in the line,
/// that a group uses the name: it withdraws (its note goes with the
/// campaign). A group's member that joins after that note was written sees
/// it and withdraws instead, so that of the two at least one sees the
/// other; an unwaited grant is made only while no note is kept at all.
fn group_refuses(election: &ElectionName, notes: &[Note]) -> Result<()> {
    match crate::group::kind_of(notes) {
        Some(kind) => Err(Error::Conflict(format!(
            "{election} is a group of {kind}: a single election cannot use its name"
        ))),
        None => Ok(()),
    }
}

fn watch_ended() -> Error {
    Error::Unavailable {
        reason: "the store's watch ended".into(),
        source: None,
    }
}

/// Deletes a campaign's `cand` note when dropped.
struct LeaveLine {
    store: Arc<dyn Store>,
    session: crate::grant::SessionId,
    election: ElectionName,
    joins: Arc<std::sync::Mutex<std::collections::HashMap<ElectionName, u64>>>,
    /// This campaign's number ([`Elector::started`]).
    started: u64,
}

/// How long a campaign that left the line, and could not delete its note,
/// leaves it to a later campaign of its elector before trying again: an
/// elector that campaigns again at once keeps its place in the line.
const LATER_CAMPAIGN: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for LeaveLine {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, session, election) =
                (Arc::clone(&self.store), self.session, self.election.clone());
            let (joins, started) = (Arc::clone(&self.joins), self.started);
            runtime.spawn(leave_line(store, session, election, joins, started));
        }
    }
}

/// Deletes a campaign's note. If the store fails, it tries again until it
/// lands — the session lives on with the elector, and a note left in
/// front would keep every standby behind it waiting — unless a later
/// campaign of the elector started within [`LATER_CAMPAIGN`] and so owns
/// the note (it keeps its place in the line).
async fn leave_line(
    store: Arc<dyn Store>,
    session: crate::grant::SessionId,
    election: ElectionName,
    joins: Arc<std::sync::Mutex<std::collections::HashMap<ElectionName, u64>>>,
    started: u64,
) {
    match store.delete_note(session, &election, line::CANDIDATE).await {
        Err(Error::Unavailable { .. } | Error::Timeout(_)) => {}
        _ => return,
    }
    tokio::time::sleep(LATER_CAMPAIGN).await;
    crate::store::cleanup::until_done("leave the line", || {
        let (store, election) = (Arc::clone(&store), election.clone());
        let later = crate::mutex::lock(&joins).get(&election).copied() != Some(started);
        async move {
            if later {
                return Ok(());
            }
            store.delete_note(session, &election, line::CANDIDATE).await
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::LeaseConfig;
    use crate::names::CandidateId;
    use crate::store::memory::MemoryStore;

    const TTL: Duration = Duration::from_secs(30);

    async fn join(
        store: &dyn Store,
        election: &ElectionName,
        who: &str,
    ) -> crate::grant::SessionId {
        let session = store.open_session(TTL).await.expect("a session").id;
        let id = CandidateId::new(who).expect("valid id");
        store
            .put_note(
                session,
                election,
                line::CANDIDATE,
                &line::candidate_note(0, &id),
            )
            .await
            .expect("a note");
        session
    }

    /// `a` waits first in line, `b` behind it. `a`'s campaign fails and
    /// starts over: its note is deleted and put again, which `b`'s watch
    /// may see as one change (the read after a broken etcd watch did),
    /// and `a` now waits behind `b`. `b` must stop waiting for `a`, or
    /// neither is ever first.
    #[tokio::test]
    async fn a_standby_ahead_that_joined_the_line_again_is_not_waited_for() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let election = ElectionName::new("ring").expect("valid name");
        let a = join(&*store, &election, "a").await;
        let b = join(&*store, &election, "b").await;
        let read = line::line(&*store, &election).await.expect("the line");
        let ahead = read[0].clone();
        assert_eq!((ahead.session, read[1].session), (a, b));

        let elector = Elector::new(
            Arc::clone(&store),
            CandidateId::new("b").expect("valid id"),
            LeaseConfig::new(TTL),
        )
        .expect("config");
        // While `a`'s note is the one read, `b` waits.
        let waiting = tokio::time::timeout(
            Duration::from_millis(200),
            elector.wait_behind(b, &ahead, &election),
        )
        .await;
        assert!(waiting.is_err(), "b stopped waiting for a: {waiting:?}");

        store
            .delete_note(a, &election, line::CANDIDATE)
            .await
            .expect("delete");
        let id = CandidateId::new("a").expect("valid id");
        store
            .put_note(a, &election, line::CANDIDATE, &line::candidate_note(0, &id))
            .await
            .expect("put again");
        let now = line::line(&*store, &election).await.expect("the line");
        assert_eq!((now[0].session, now[1].session), (b, a), "a joined again");

        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            elector.wait_behind(b, &ahead, &election),
        )
        .await;
        assert!(
            matches!(waited, Ok(Ok(false))),
            "b still waits behind a, which waits behind b: {waited:?}"
        );
    }

    /// A single election's campaign that finds a group's member on the
    /// name once its own note is in the line is refused, and leaves the
    /// line (before, it was granted, and its command ran beside the
    /// group's: the member had looked before this note was there).
    #[tokio::test]
    async fn a_campaign_on_a_group_s_name_is_refused_once_in_line() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let group = ElectionName::new("jobs").expect("valid name");
        let member = store.open_session(TTL).await.expect("a session").id;
        crate::group::join(
            &*store,
            member,
            &group,
            crate::group::GroupKind::Shards(2),
            &CandidateId::new("member").expect("valid id"),
        )
        .await
        .expect("joined");
        let elector = Elector::new(
            Arc::clone(&store),
            CandidateId::new("plain").expect("valid id"),
            LeaseConfig::new(TTL),
        )
        .expect("config");
        let campaign = tokio::time::timeout(Duration::from_secs(10), elector.campaign(&group))
            .await
            .expect("answered");
        assert!(
            matches!(&campaign, Err(Error::Conflict(why)) if why.contains("is a group of 2 shards")),
            "{:?}",
            campaign.map(|l| l.token())
        );
        assert_eq!(store.leader(&group).await.expect("read"), None);
        tokio::time::timeout(Duration::from_secs(10), async {
            while !line::line(&*store, &group).await.expect("read").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the campaign's note left the line");
    }
}
