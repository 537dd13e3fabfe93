//! Elections written once, above the store primitive
//! ([`crate::store::keys`]): [`KeyedStore`] is the [`Store`] of any
//! [`Keys`], its decisions the pure functions of `election`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::grant::{FencingToken, Grant, Leader, SessionId, SessionLease};
use crate::names::{CandidateId, ElectionName};
use crate::store::keys::{Check, KeyWatch, Keys, Revision, Write};
use crate::store::layout::Layout;
use crate::store::shared_read::SharedRanges;
use crate::store::{
    ElectionState, LeaderWatch, Note, NoteWatch, StatusWatch, Store, check_note, note_watch,
    watch_driver,
};

mod campaign;
mod election;
mod recipes;
mod sources;

use campaign::{CandidateKey, Withdrawing};
use election::Standing;
use sources::{CandidatesSource, NotesSource};

/// The [`Store`] of a store primitive: elections, notes and the release
/// record as keys. Cloning gives another handle onto the same keys.
#[derive(Debug)]
pub struct KeyedStore<K: Keys> {
    /// The primitive, its reads of a prefix shared by this handle's
    /// callers.
    keys: Arc<SharedRanges<K>>,
    layout: Layout,
    withdrawing: Arc<Withdrawing>,
}

impl<K: Keys> Clone for KeyedStore<K> {
    fn clone(&self) -> Self {
        KeyedStore {
            keys: Arc::clone(&self.keys),
            layout: self.layout,
            withdrawing: Arc::clone(&self.withdrawing),
        }
    }
}

/// How long a campaign that found its session's key being withdrawn (a
/// dropped campaign's) waits before it tries again.
const WITHDRAWN_SOON: Duration = Duration::from_millis(10);

impl<K: Keys> KeyedStore<K> {
    /// Elections on `keys`, in leasehold's own layout.
    pub fn over(keys: K) -> Self {
        Self::with_layout(keys, Layout::Leasehold)
    }

    /// Elections on `keys`, laid out as `layout` says (another recipe's
    /// layout writes candidates alone, and refuses what needs more).
    pub fn with_layout(keys: K, layout: Layout) -> Self {
        KeyedStore {
            keys: Arc::new(SharedRanges::new(keys)),
            layout,
            withdrawing: Arc::default(),
        }
    }

    /// The layout of its elections.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The prefix of the candidates' keys of `election`, in its layout.
    #[cfg(feature = "etcd")]
    pub(crate) fn candidates_prefix(&self, election: &ElectionName) -> String {
        election::candidates(self.layout, election)
    }

    /// The key of `session`'s candidate in `election`, in its layout.
    #[cfg(feature = "etcd")]
    pub(crate) fn candidate_key(&self, election: &ElectionName, session: SessionId) -> String {
        election::candidate_key(self.layout, election, session)
    }

    fn own_layout(&self, what: &str) -> Result<()> {
        election::own_layout(self.layout, what)
    }

    /// The primitive underneath.
    pub fn keys(&self) -> &K {
        &self.keys.keys
    }

    /// How many candidate keys `session` has in `election` (tests: a
    /// campaign again after a lost answer must never leave two).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn candidate_keys(
        &self,
        session: SessionId,
        election: &ElectionName,
    ) -> Result<usize> {
        let range = self
            .keys
            .range(&election::candidates(self.layout, election))
            .await?;
        Ok(range
            .entries
            .iter()
            .filter(|e| e.session == Some(session))
            .count())
    }

    /// Waits until the campaign key of `session` leads, or is gone: a
    /// watch of the key just ahead of its own (so that a release wakes
    /// the next in line alone), opened anew only when that key is another,
    /// and a read of the candidates at each change it tells.
    async fn wait_for_front(&self, session: SessionId, election: &ElectionName) -> Result<Grant> {
        let prefix = election::candidates(self.layout, election);
        let mut range = self.keys.range(&prefix).await?;
        let mut watched: Option<(String, KeyWatch)> = None;
        let mut led_by: Option<Leader> = None;
        loop {
            let (ahead, recheck) = match election::standing(self.layout, &range, election, session)?
            {
                Standing::Granted(grant) => {
                    self.tell_how_it_was_left(led_by, &grant).await;
                    return Ok(grant);
                }
                Standing::Gone => return Err(Error::SessionExpired(session)),
                Standing::Waits { ahead, recheck } => (ahead, recheck),
            };
            let watch = match &mut watched {
                Some((key, watch)) if *key == ahead => watch,
                _ => {
                    let watch = self.keys.watch(&ahead, range.revision).await?;
                    &mut watched.insert((ahead, watch)).1
                }
            };
            let expiry = match recheck.filter(|_| !self.keys.tells_expiries()) {
                Some(left) => self.keys.sleep(left + Duration::from_millis(1)),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                changed = watch.changed() => if changed.is_err() {
                    return Err(Error::Unavailable {
                        reason: "the store's watch ended".into(),
                        source: None,
                    });
                },
                () = expiry => {}
            }
            // Seen before the read: a change made during it is told again.
            watch.borrow_and_update();
            led_by = election::holder(self.layout, &range)?.or(led_by);
            range = self.keys.range(&prefix).await?;
        }
    }

    /// Says so when `grant` was made after `led_by`, another session's
    /// grant this campaign waited behind, ended without a release: its
    /// lease expired (or, on SQLite, its process died) first.
    async fn tell_how_it_was_left(&self, led_by: Option<Leader>, grant: &Grant) {
        let Some(leader) = led_by.filter(|l| l.session != Some(grant.session)) else {
            return;
        };
        if self.layout.is_foreign()
            || self.last_release(&grant.election).await.ok().flatten() == Some(leader.token)
        {
            return;
        }
        tracing::info!(election = %grant.election, id = %grant.candidate, expired_leader = %leader.candidate,
            expired_token = leader.token.0,
            "the previous leader did not release (its lease expired, or on SQLite its process died); taking over");
    }

    /// Waits until the store may grant (see [`Properties::grants_from`]).
    async fn wait_to_grant(&self) {
        if let Some(at) = self.keys.properties.grants_from {
            let left = at.saturating_duration_since(std::time::Instant::now());
            if !left.is_zero() {
                self.keys.sleep(left).await;
            }
        }
    }

    /// Deletes the grant's key and records its release, if it still holds.
    /// (In a recipe's layout, which keeps no record, it deletes the key.)
    async fn release(&self, grant: &Grant) -> Result<()> {
        let key = match recipes::store_named(self.layout) {
            false => election::candidate_key(self.layout, &grant.election, grant.session),
            true => self.named_key(grant).await?,
        };
        let checks = [Check::Created {
            key: key.clone(),
            revision: Revision(grant.token.0),
            session: Some(grant.session),
        }];
        let mut writes = vec![Write::Delete(key)];
        if !self.layout.is_foreign() {
            writes.push(Write::Put {
                key: election::release_key(&grant.election),
                value: grant.token.to_string(),
                session: None,
            });
        }
        match self.keys.commit(&checks, &writes).await? {
            Some(_) => Ok(()),
            None => Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            }),
        }
    }
}

impl<K: Keys> KeyedStore<K> {
    /// [`Store::campaign`] in a layout whose store names the candidates:
    /// the session's key already in line (a campaign again after a lost
    /// answer finds it, as Curator's protected mode and kazoo do), or a
    /// new one, named `{prefix}{sequence}` by the store.
    async fn campaign_in_line(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate_id: &CandidateId,
    ) -> Result<Grant> {
        let line = election::candidates(self.layout, election);
        loop {
            let range = self.keys.range(&line).await?;
            let own = election::own(self.layout, &range, election, session)?;
            if own.is_some_and(|e| self.withdrawing.has(&e.key)) {
                // A dropped campaign's key of this session, on its way out.
                self.keys.sleep(WITHDRAWN_SOON).await;
                continue;
            }
            let withdraw = match own {
                Some(_) => None,
                None => {
                    let candidate = CandidateKey {
                        key: format!("{line}{}", recipes::new_prefix(self.layout)),
                        session,
                        line: Some(line.clone()),
                    };
                    let value = candidate_value(candidate_id);
                    let created =
                        (candidate.create(&self.keys, &self.withdrawing, Vec::new(), value))
                            .await?
                            .ok_or_else(|| Error::Unavailable {
                                reason: "the store created no candidate".into(),
                                source: None,
                            })?;
                    Some(candidate.withdraw_on_drop(&self.keys, &self.withdrawing, created))
                }
            };
            let taken_up = withdraw.is_none();
            match self.wait_for_front(session, election).await {
                Ok(grant) => {
                    if let Some(withdraw) = withdraw {
                        withdraw.disarm();
                    }
                    return Ok(grant);
                }
                Err(Error::SessionExpired(_)) if taken_up => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// The key of `grant`'s candidate, in a layout whose store names the
    /// candidates: the one attached to its session and created at its
    /// token; [`Error::NotHolder`] if there is none.
    async fn named_key(&self, grant: &Grant) -> Result<String> {
        let range = (self.keys)
            .range(&election::candidates(self.layout, &grant.election))
            .await?;
        (range.entries.into_iter())
            .find(|e| e.session == Some(grant.session) && e.created.0 == grant.token.0)
            .map(|e| e.key)
            .ok_or_else(|| Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            })
    }
}

/// A candidate key's value: the candidate's id.
fn candidate_value(candidate: &CandidateId) -> String {
    candidate.to_string()
}

#[async_trait]
impl<K: Keys> Store for KeyedStore<K> {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.keys.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.keys.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.keys.close_session(session).await
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate_id: &CandidateId,
    ) -> Result<Grant> {
        if recipes::store_named(self.layout) {
            return self.campaign_in_line(session, election, candidate_id).await;
        }
        let candidate = CandidateKey {
            key: election::candidate_key(self.layout, election, session),
            session,
            line: None,
        };
        self.wait_to_grant().await;
        loop {
            let checks = vec![Check::Absent(candidate.key.clone())];
            let value = candidate_value(candidate_id);
            let created = candidate
                .create(&self.keys, &self.withdrawing, checks, value)
                .await?;
            if created.is_none() && self.withdrawing.has(&candidate.key) {
                // A dropped campaign's key of this session, on its way
                // out: not this one's to take up.
                self.keys.sleep(WITHDRAWN_SOON).await;
                continue;
            }
            // Without `created`, the key was an earlier campaign's of this
            // session, which is not this one's to withdraw.
            let withdraw = created.map(|revision| {
                candidate.withdraw_on_drop(&self.keys, &self.withdrawing, revision)
            });
            match self.wait_for_front(session, election).await {
                Ok(grant) => {
                    if let Some(withdraw) = withdraw {
                        withdraw.disarm();
                    }
                    return Ok(grant);
                }
                // That earlier campaign's key went meanwhile: this one
                // puts its own (which fails if the session ended).
                Err(Error::SessionExpired(_)) if created.is_none() => {}
                Err(error) => return Err(error),
            }
        }
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate_id: &CandidateId,
    ) -> Result<Option<Grant>> {
        let candidate = CandidateKey {
            key: election::candidate_key(self.layout, election, session),
            session,
            line: None,
        };
        // In a recipe's layout a campaign takes the line the elector
        // checks first (it refuses what the recipe cannot honour).
        if self.layout.is_foreign() {
            return Ok(None);
        }
        self.wait_to_grant().await;
        let checks = vec![
            Check::NoneUnder(election::candidates(self.layout, election)),
            Check::NoneUnder(election::notes(election)),
        ];
        let value = candidate_value(candidate_id);
        let created = candidate
            .create(&self.keys, &self.withdrawing, checks, value)
            .await?;
        let Some(revision) = created else {
            return Ok(None);
        };
        Ok(Some(Grant {
            election: election.clone(),
            candidate: candidate_id.clone(),
            session,
            token: election::token(revision)?,
        }))
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        self.release(grant).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let range = self
            .keys
            .range(&election::candidates(self.layout, election))
            .await?;
        let holder = election::holder(self.layout, &range)?;
        sources::with_time_left(&*self.keys, holder).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        let source = CandidatesSource::new(Arc::clone(&self.keys), self.layout, election).await?;
        watch_driver::start(source, election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        let source = CandidatesSource::new(Arc::clone(&self.keys), self.layout, election).await?;
        watch_driver::start(source, election, None).await
    }

    /// Started from the grant, unread: its key was created at the
    /// revision that is its token, and any change since is told.
    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        let granted = Revision(grant.token.0);
        let source = CandidatesSource::since(
            Arc::clone(&self.keys),
            self.layout,
            &grant.election,
            granted,
        );
        Ok(watch_driver::start_held(source.await?, grant))
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.own_layout("listing elections")?;
        let mut listed = election::list(&self.keys.range("").await?)?;
        for state in &mut listed {
            state.leader = sources::with_time_left(&*self.keys, state.leader.take()).await?;
        }
        Ok(listed)
    }

    async fn session_ended(&self, session: SessionId) {
        self.keys.session_ended(session).await;
    }

    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.keys.keys.session_lock_file()
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.own_layout("a note")?;
        check_note(name, text)?;
        let put = Write::Put {
            key: election::note_key(election, name, session),
            value: text.to_owned(),
            session: Some(session),
        };
        self.keys.commit(&[], &[put]).await.map(drop)
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.own_layout("a note")?;
        let key = election::note_key(election, name, session);
        self.keys.commit(&[], &[Write::Delete(key)]).await.map(drop)
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.own_layout("a note")?;
        check_note(name, text)?;
        let key = election::note_key(election, name, session);
        let range = self.keys.range(&key).await?;
        let Some(note) = range.entries.iter().find(|e| e.key == key) else {
            return Ok(false);
        };
        let check = Check::Created {
            key: key.clone(),
            revision: note.created,
            session: Some(session),
        };
        let put = Write::Put {
            key,
            value: text.to_owned(),
            session: Some(session),
        };
        Ok(self.keys.commit(&[check], &[put]).await?.is_some())
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.own_layout("the line of standbys")?;
        let range = self.keys.range(&election::notes(election)).await?;
        Ok(election::read_notes(election, &range)?.0)
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.own_layout("a note")?;
        check_note(name, "")?;
        let key = election::note_key(election, name, session);
        let source = NotesSource::new(Arc::clone(&self.keys), election, key).await?;
        note_watch::start(source, election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        let prefix = election::notes(election);
        let source = NotesSource::new(Arc::clone(&self.keys), election, prefix).await?;
        note_watch::start(source, election).await
    }

    /// Started unread: the commit that made the grant checked that the
    /// election had no note at its revision.
    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        let from = Revision(grant.token.0);
        let source = NotesSource::since(Arc::clone(&self.keys), &grant.election, from).await?;
        Ok(note_watch::start_known(source, &grant.election, Vec::new()))
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.own_layout("the record of releases")?;
        let key = election::release_key(election);
        let range = self.keys.range(&key).await?;
        election::last_release(&range, election)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, timeout};

    use crate::names::{CandidateId, ElectionName};
    use crate::store::Store;
    use crate::store::keys::Keys;
    use crate::store::memory::MemoryStore;

    /// A campaign dropped and tried again at once on the same live session
    /// never reads as expired: it does not take up the dropped campaign's
    /// key, which is on its way out (found by a review: 119 of 200 tries
    /// failed with "session expired" before).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_campaign_tried_again_after_a_dropped_one_never_reads_as_expired() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(30);
        let (a, b) = (
            store.open_session(ttl).await.expect("open"),
            store.open_session(ttl).await.expect("open"),
        );
        let election = ElectionName::new("tried-again").expect("valid");
        let (ca, cb) = (
            CandidateId::new("a").expect("valid"),
            CandidateId::new("b").expect("valid"),
        );
        let held = store.campaign(a.id, &election, &ca).await.expect("a holds");
        for _ in 0..200 {
            let _ = timeout(
                Duration::from_millis(2),
                store.campaign(b.id, &election, &cb),
            )
            .await;
            let again = timeout(
                Duration::from_millis(20),
                store.campaign(b.id, &election, &cb),
            )
            .await;
            assert!(again.is_err(), "a held election: {again:?}");
            sleep(Duration::from_millis(5)).await;
        }
        store.keep_alive(b.id).await.expect("b lives");
        let leader = store.leader(&election).await.expect("read");
        assert_eq!(leader.map(|l| l.token), Some(held.token));
    }

    /// The primitive in memory, counting its reads; with `late`, its
    /// watches start late: before each is set, another session adds a
    /// note under its prefix (the window between a watch's first read and
    /// the watch, milliseconds on ZooKeeper).
    #[derive(Debug, Default)]
    struct CountingKeys {
        keys: crate::store::keys::memory::MemoryKeys,
        reads: std::sync::atomic::AtomicU64,
        late: bool,
    }

    #[async_trait::async_trait]
    impl Keys for CountingKeys {
        async fn open_session(&self, ttl: Duration) -> crate::Result<crate::store::SessionLease> {
            self.keys.open_session(ttl).await
        }
        async fn keep_alive(&self, session: crate::store::SessionId) -> crate::Result<Duration> {
            self.keys.keep_alive(session).await
        }
        async fn close_session(&self, session: crate::store::SessionId) -> crate::Result<()> {
            self.keys.close_session(session).await
        }
        async fn commit(
            &self,
            checks: &[super::Check],
            writes: &[super::Write],
        ) -> crate::Result<Option<super::Revision>> {
            self.keys.commit(checks, writes).await
        }
        async fn range(&self, prefix: &str) -> crate::Result<crate::store::keys::Range> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.keys.range(prefix).await
        }
        async fn watch(
            &self,
            prefix: &str,
            from: super::Revision,
        ) -> crate::Result<super::KeyWatch> {
            if self.late {
                let session = self.keys.open_session(Duration::from_secs(30)).await?.id;
                let late = super::Write::Put {
                    key: format!("{prefix}late:{:016x}", session.0),
                    value: "0 late".into(),
                    session: Some(session),
                };
                self.keys.commit(&[], &[late]).await?;
            }
            self.keys.watch(prefix, from).await
        }
        fn properties(&self) -> crate::store::keys::Properties {
            self.keys.properties()
        }
    }

    /// A change made between a watch's first read and the watch is seen:
    /// the first read is not kept once the watch told a change after it
    /// (before, the watch's at-once tell was marked seen and the first
    /// read stood: a group member on ZooKeeper never saw a member that
    /// joined in that window, and kept its shards).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_before_a_watch_started_is_read() {
        let store = super::KeyedStore::over(CountingKeys {
            late: true,
            ..CountingKeys::default()
        });
        let election = ElectionName::new("late").expect("valid");
        let notes = store.watch_notes(&election).await.expect("watch");
        let mut waiting = notes.clone();
        let seen = timeout(
            Duration::from_secs(5),
            waiting.wait_for(|notes| notes.iter().any(|n| n.name == "late")),
        )
        .await
        .map(|r| r.is_ok());
        assert!(
            seen == Ok(true),
            "the note added before the watch started was never read: {:?}",
            *notes.borrow()
        );
    }

    /// No herd: with 20 campaigns waiting on the store, a release wakes
    /// the next in line alone, which reads once and holds (before, every
    /// waiter watched all the candidates and read again: 20 reads).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_wakes_only_the_next_in_line() {
        use std::sync::atomic::Ordering;
        let store = std::sync::Arc::new(super::KeyedStore::over(CountingKeys::default()));
        let ttl = Duration::from_secs(30);
        let election = ElectionName::new("herd").expect("valid");
        let holder = store.open_session(ttl).await.expect("open").id;
        let id = |n: usize| CandidateId::new(format!("c{n}")).expect("valid");
        let mut grant = store
            .campaign(holder, &election, &id(0))
            .await
            .expect("held");
        let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
        for n in 1..=20 {
            let (store, election, tx) =
                (std::sync::Arc::clone(&store), election.clone(), tx.clone());
            let session = store.open_session(ttl).await.expect("open").id;
            tokio::spawn(async move {
                let _ = tx.send(store.campaign(session, &election, &id(n)).await);
            });
        }
        let prefix =
            super::election::candidates(crate::store::layout::Layout::Leasehold, &election);
        while store
            .keys()
            .keys
            .range(&prefix)
            .await
            .expect("read")
            .entries
            .len()
            < 21
        {
            sleep(Duration::from_millis(5)).await;
        }
        for handover in 0..3 {
            sleep(Duration::from_millis(50)).await;
            let before = store.keys().reads.load(Ordering::SeqCst);
            store.resign(&grant).await.expect("resign");
            grant = timeout(Duration::from_secs(5), granted.recv())
                .await
                .expect("the next is granted")
                .expect("open")
                .expect("granted");
            sleep(Duration::from_millis(50)).await;
            let reads = store.keys().reads.load(Ordering::SeqCst) - before;
            assert!(
                (1..=2).contains(&reads),
                "handover {handover}: {reads} reads of the candidates for 20 waiters"
            );
            assert!(granted.try_recv().is_err(), "two granted at once");
        }
    }
}
