//! Notes on PostgreSQL (see [`crate::line`]): rows of `{schema}.notes`,
//! live while their session is (read joined with the live sessions, on the
//! server's clock), in the order first put (`seq`). `put_note` and
//! `delete_note` are one statement each and `NOTIFY` the store's channel
//! with `"#n {election}"`; the release records its token in
//! `{schema}.releases` in the same statement (`postgres/schema.sql`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{Inner, Notice, RETRY, from_millis, timed};
use crate::error::{Error, Result};
use crate::names::ElectionName;
use crate::store::note_watch::NoteSource;
use crate::store::watch_driver::Event;
use crate::store::{FencingToken, Note, NoteWatch, SessionId, check_note, session_key};

impl Inner {
    pub(super) async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        check_note(name, text)?;
        let id = session_key(session)?;
        let client = self.client().await?;
        let put: bool = timed(
            "put a note",
            client.query_one(
                &format!("SELECT {}($1, $2, $3, $4)", self.table("put_note")),
                &[&election.as_str(), &id, &name, &text],
            ),
        )
        .await?
        .get(0);
        if put {
            Ok(())
        } else {
            Err(Error::SessionExpired(session))
        }
    }

    pub(super) async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        let Ok(id) = session_key(session) else {
            return Ok(());
        };
        let client = self.client().await?;
        timed(
            "delete a note",
            client.execute(
                &format!("SELECT {}($1, $2, $3)", self.table("delete_note")),
                &[&election.as_str(), &id, &name],
            ),
        )
        .await?;
        Ok(())
    }

    /// Replaces the text of a live session's note, in one statement that
    /// also tells the listeners; `false` if there is no such note.
    pub(super) async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        check_note(name, text)?;
        let Ok(id) = session_key(session) else {
            return Ok(false);
        };
        let client = self.client().await?;
        let amended = timed(
            "amend a note",
            client.execute(
                &format!(
                    "UPDATE {notes} n SET text = $4
                     WHERE n.election = $1 AND n.session = $2 AND n.name = $3 AND EXISTS (
                         SELECT 1 FROM {sessions} h
                         WHERE h.id = $2 AND h.expires_at > clock_timestamp())
                     RETURNING pg_notify('{channel}', '#n ' || $1)",
                    notes = self.table("notes"),
                    sessions = self.table("sessions"),
                    channel = self.channel,
                ),
                &[&election.as_str(), &id, &name, &text],
            ),
        )
        .await?;
        Ok(amended > 0)
    }

    /// The live notes on `election`, in order.
    pub(super) async fn read_notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        let rows = self.note_rows(election).await?;
        Ok(rows.into_iter().map(|(note, _)| note).collect())
    }

    /// The live notes on `election`, in order, each with how long until
    /// its session expires unless renewed.
    async fn note_rows(&self, election: &ElectionName) -> Result<Vec<(Note, Duration)>> {
        let client = self.client().await?;
        let rows = timed(
            "read notes",
            client.query(
                &format!(
                    "SELECT n.session, n.name, n.seq, n.text,
                            (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
                     FROM {} n JOIN {} h
                          ON h.id = n.session AND h.expires_at > clock_timestamp()
                     WHERE n.election = $1
                     ORDER BY n.seq",
                    self.table("notes"),
                    self.table("sessions")
                ),
                &[&election.as_str()],
            ),
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let (session, name, seq, text, left): (i64, String, i64, String, i64) =
                    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
                let note = Note {
                    session: SessionId(session.unsigned_abs()),
                    name,
                    order: seq.unsigned_abs(),
                    text,
                };
                (note, from_millis(left))
            })
            .collect())
    }

    pub(super) async fn last_release(
        &self,
        election: &ElectionName,
    ) -> Result<Option<FencingToken>> {
        let client = self.client().await?;
        let row = timed(
            "read the last release",
            client.query_opt(
                &format!(
                    "SELECT token FROM {} WHERE election = $1",
                    self.table("releases")
                ),
                &[&election.as_str()],
            ),
        )
        .await?;
        Ok(row.map(|row| FencingToken::from_stored(row.get(0))))
    }

    /// Watches `election`'s notes, or with `only` that one note. A notice
    /// names the election alone, so every watch of the election wakes at
    /// each change of its notes; the watches of this handle then share
    /// their reads of the whole line (`shared_read`), and a one-note
    /// watch keeps its note of it. A thousand sessions of one process
    /// waiting in one line, each watching its own note and the one ahead,
    /// so read the line a couple of times per change, not two thousand.
    pub(super) async fn watch_notes(
        self: &Arc<Self>,
        election: &ElectionName,
        only: Option<(SessionId, &str)>,
    ) -> Result<NoteWatch> {
        let source = PgNotes {
            inner: Arc::clone(self),
            election: election.clone(),
            only: only.map(|(session, name)| (session, name.to_owned())),
            // Subscribed before the first read, so that no change between
            // the two is missed.
            notices: self.notices.subscribe(),
            tag: format!("#n {election}"),
        };
        crate::store::note_watch::start(source, election).await
    }
}

/// One shared read of an election's notes: each live note with how long
/// until its session expires.
pub(super) type Rows = Arc<Vec<(Note, Duration)>>;

/// The PostgreSQL side of a notes watch: it wakes on the listener's notes
/// notices for the election and on a lost listener connection; expiries
/// send no notice, so the watch also reads again at the first one.
struct PgNotes {
    inner: Arc<Inner>,
    election: ElectionName,
    /// The one note watched, if not all.
    only: Option<(SessionId, String)>,
    notices: broadcast::Receiver<Notice>,
    /// The payload of a notice about this election's notes.
    tag: String,
}

impl NoteSource for PgNotes {
    const RETRY: Duration = RETRY;

    /// Counts the requests it makes itself: a read shared with other
    /// watches is one request.
    #[cfg(feature = "testing")]
    const COUNTS_ITS_READS: bool = true;

    async fn read(&mut self) -> Result<(Vec<Note>, Option<Duration>)> {
        let (inner, election) = (&self.inner, &self.election);
        let rows = inner
            .note_reads
            .read(election, || async {
                #[cfg(feature = "testing")]
                crate::store::watch_driver::count_watch_read(election);
                inner.note_rows(election).await.map(Arc::new)
            })
            .await?;
        let mine = |note: &Note| {
            self.only
                .as_ref()
                .is_none_or(|(session, name)| note.session == *session && note.name == *name)
        };
        let kept: Vec<&(Note, Duration)> = rows.iter().filter(|(note, _)| mine(note)).collect();
        let first_expiry = kept.iter().map(|(_, left)| *left).min();
        Ok((
            kept.into_iter().map(|(note, _)| note.clone()).collect(),
            first_expiry,
        ))
    }

    async fn changed(&mut self) -> Event {
        loop {
            match self.notices.recv().await {
                Err(broadcast::error::RecvError::Closed) => return Event::Ended,
                Ok(Some(payload)) if *payload != *self.tag => {}
                // This election's notes, a resync or a lagged receiver.
                Ok(_) | Err(_) => return Event::Changed,
            }
        }
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}
