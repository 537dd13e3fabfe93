//! Notes on etcd (see [`crate::line`]): `{prefix}/n/{election}/{lease}/{name}`
//! holding the note's text, with the session's lease attached, so that
//! etcd deletes it when the lease ends. A note's order is its key's create
//! revision (a put on an existing key keeps it). An election's last
//! released token is `{prefix}/r/{election}` (decimal, no lease), put in
//! the transaction that releases the grant.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::pb::{self, KeyValue, TxnRequest};
use super::{EtcdStore, WATCH_RETRY, delete, exists, put, range_of_prefix, revision_of};
use crate::error::{Error, Result};
use crate::names::ElectionName;
use crate::store::note_watch::NoteSource;
use crate::store::watch_driver::Event;
use crate::store::{FencingToken, Grant, Note, NoteWatch, SessionId, check_note, session_key};

impl EtcdStore {
    /// `{prefix}/n/{election}/`, slashes in the name escaped as in
    /// [`EtcdStore::election_prefix`].
    pub(super) fn notes_prefix(&self, election: &ElectionName) -> String {
        format!(
            "{}/n/{}/",
            self.prefix,
            election.as_str().replace('/', "%2F")
        )
    }

    fn note_key(&self, election: &ElectionName, lease: i64, name: &str) -> String {
        format!("{}{lease:016x}/{name}", self.notes_prefix(election))
    }

    /// `{prefix}/r/{election}`: the token of the last released grant.
    pub(super) fn release_key(&self, election: &ElectionName) -> String {
        format!(
            "{}/r/{}",
            self.prefix,
            election.as_str().replace('/', "%2F")
        )
    }

    /// The op that records `token` as `election`'s last release.
    pub(super) fn record_release(&self, election: &ElectionName, token: i64) -> pb::RequestOp {
        put(self.release_key(election), token.to_string(), 0)
    }

    pub(super) async fn put_note_in(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        check_note(name, text)?;
        let lease = session_key(session)?;
        let txn = TxnRequest {
            compare: vec![exists(self.marker_key())],
            success: vec![put(self.note_key(election, lease, name), text, lease)],
            failure: Vec::new(),
        };
        let done = match self.txn("put a note", txn).await {
            Err(error) if error.is_lease_not_found() => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        if !done.succeeded {
            return Err(Error::Corrupt(format!(
                "etcd prefix {}: leasehold's marker key is gone",
                self.prefix
            )));
        }
        Ok(())
    }

    pub(super) async fn delete_note_in(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        let Ok(lease) = session_key(session) else {
            return Ok(());
        };
        let txn = TxnRequest {
            compare: Vec::new(),
            success: vec![delete(self.note_key(election, lease, name))],
            failure: Vec::new(),
        };
        self.txn("delete a note", txn).await?;
        Ok(())
    }

    /// Replaces the text of a note that is there, keeping its lease and
    /// create revision (its order): one transaction whose put runs only if
    /// the key exists, so a note deleted meanwhile is not made again.
    pub(super) async fn amend_note_in(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        check_note(name, text)?;
        let Ok(lease) = session_key(session) else {
            return Ok(false);
        };
        let key = self.note_key(election, lease, name);
        let txn = TxnRequest {
            compare: vec![exists(key.clone())],
            success: vec![put(key, text, lease)],
            failure: Vec::new(),
        };
        match self.txn("amend a note", txn).await {
            // Its lease ended: etcd deleted the note with it.
            Err(error) if error.is_lease_not_found() => Ok(false),
            other => Ok(other?.succeeded),
        }
    }

    /// The notes on `election` — only `session`'s note `name` with `only`
    /// — in order, and the revision of the read.
    pub(super) async fn notes_at(
        &self,
        election: &ElectionName,
        only: Option<(SessionId, &str)>,
    ) -> Result<(Vec<Note>, i64)> {
        let prefix = self.notes_prefix(election);
        let request = match only {
            Some((session, name)) => pb::RangeRequest {
                key: self
                    .note_key(election, session_key(session)?, name)
                    .into_bytes(),
                ..Default::default()
            },
            // The whole line: shared with this handle's other callers.
            None => {
                return self
                    .line_reads
                    .read(&prefix, || {
                        self.read_notes(&prefix, range_of_prefix(&prefix))
                    })
                    .await;
            }
        };
        self.read_notes(&prefix, request).await
    }

    async fn read_notes(
        &self,
        prefix: &str,
        request: pb::RangeRequest,
    ) -> Result<(Vec<Note>, i64)> {
        let read = self.range("read notes", request).await?;
        let mut notes: Vec<Note> = read
            .kvs
            .iter()
            .filter_map(|kv| note_of(prefix, kv))
            .collect();
        notes.sort_by_key(|n| n.order);
        Ok((notes, revision_of(read.header.as_ref())))
    }

    pub(super) async fn last_release_in(
        &self,
        election: &ElectionName,
    ) -> Result<Option<FencingToken>> {
        let key = self.release_key(election);
        let read = self
            .range(
                "read the last release",
                pb::RangeRequest {
                    key: key.into_bytes(),
                    ..Default::default()
                },
            )
            .await?;
        let Some(kv) = read.kvs.first() else {
            return Ok(None);
        };
        std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(|t| Some(FencingToken(t)))
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "etcd key {} does not hold a token",
                    super::shown(&kv.key)
                ))
            })
    }

    /// Watches `election`'s notes, or with `only` that one note's key
    /// alone (changes of other notes never reach it).
    pub(super) async fn watch_notes_of(
        &self,
        election: &ElectionName,
        only: Option<(SessionId, &str)>,
    ) -> Result<NoteWatch> {
        let only = match only {
            Some((session, name)) => {
                check_note(name, "")?;
                Some((session, name.to_owned()))
            }
            None => None,
        };
        let source = EtcdNotes {
            store: self.clone(),
            election: election.clone(),
            only,
            from: 0,
        };
        crate::store::note_watch::start(source, election).await
    }

    /// The notes on the election of `grant`, which an unwaited campaign
    /// made while no note was there: watched from the grant's revision
    /// on, starting empty, without a read.
    pub(super) fn watch_notes_since(&self, grant: &Grant) -> NoteWatch {
        let source = EtcdNotes {
            store: self.clone(),
            election: grant.election.clone(),
            only: None,
            from: grant.token.to_i64_saturating().saturating_add(1),
        };
        crate::store::note_watch::start_known(source, &grant.election, Vec::new())
    }
}

/// The note in `kv` if leasehold wrote it under `prefix`: named
/// `{lease}/{name}` by the lease attached to it, with a valid name and
/// text. Anything else is skipped.
fn note_of(prefix: &str, kv: &KeyValue) -> Option<Note> {
    let rest = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
    let (lease, name) = rest.split_once('/')?;
    if kv.lease <= 0 || lease != format!("{:016x}", kv.lease) {
        return None;
    }
    let text = std::str::from_utf8(&kv.value).ok()?;
    check_note(name, text).ok()?;
    Some(Note {
        session: SessionId(kv.lease.unsigned_abs()),
        name: name.to_owned(),
        order: kv.create_revision.unsigned_abs(),
        text: text.to_owned(),
    })
}

/// The etcd side of a notes watch: an etcd watch on the election's notes
/// from the revision after the last read (etcd deletes an ended lease's
/// keys, and that is an event too).
struct EtcdNotes {
    store: EtcdStore,
    election: ElectionName,
    /// The one note watched, if not all.
    only: Option<(SessionId, String)>,
    from: i64,
}

impl NoteSource for EtcdNotes {
    const RETRY: Duration = WATCH_RETRY;

    async fn read(&mut self) -> Result<(Vec<Note>, Option<Duration>)> {
        let only = self.only.as_ref().map(|(s, n)| (*s, n.as_str()));
        let (notes, revision) = self.store.notes_at(&self.election, only).await?;
        self.from = revision + 1;
        Ok((notes, None))
    }

    async fn changed(&mut self) -> Event {
        match &self.only {
            Some((session, name)) => {
                let Ok(lease) = session_key(*session) else {
                    return Event::Ended;
                };
                let key = self.store.note_key(&self.election, lease, name);
                self.store
                    .next_events_in(key.into_bytes(), Vec::new(), self.from)
                    .await;
            }
            None => {
                let prefix = self.store.notes_prefix(&self.election);
                self.store.next_events_under(&prefix, self.from).await;
            }
        }
        Event::Changed
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}
