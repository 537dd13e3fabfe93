//! The election and its notes, as keys, decided from what a read found:
//! pure functions with exact tests, which the async code only carries out.
//!
//! leasehold's own layout, for an election `E` (an election name holds no
//! `:`, so `E:` is the prefix of its keys alone):
//!
//! - `E:c:{session}` — a candidate that campaigns in the store, its id as
//!   the value, attached to its session. The live one of lowest creation
//!   revision holds the election, and that revision is its token.
//! - `E:n:{name}:{session}` — a note ([`crate::store::Note`]), attached to
//!   the session that keeps it; its order is its creation revision.
//! - `E:r` — the token of the last grant its holder released.
//!
//! Sessions are written as 16 hex digits, so that keys sort as they were
//! numbered.
//!
//! etcd's `concurrency.Election` ([`Layout::Concurrency`]): a candidate is
//! `E/{session in lower-case hex, unpadded}`, its proposal (the candidate
//! id) as the value; every key under `E/` is a candidate, whoever wrote
//! it, since that recipe counts them all. Nothing else is written: no
//! notes, no release record. Curator's and kazoo's layouts (see
//! `recipes`) are the same, but for the names of their candidates, which
//! the store ends with its sequence, and their order, the recipe's order
//! of the names.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::grant::{FencingToken, Grant, Leader, SessionId};
use crate::names::{CandidateId, ElectionName};
use crate::store::keys::{Entry, Range, Revision};
use crate::store::layout::Layout;
use crate::store::{ElectionState, Note};

use super::recipes;

/// How long a candidate key without a session is shown to have left: it
/// never expires (a year stands for that). Only another program writes
/// one, in a recipe's layout that counts every key.
const NO_SESSION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The prefix of the candidates' keys.
pub(crate) fn candidates(layout: Layout, election: &ElectionName) -> String {
    match layout {
        Layout::Leasehold => format!("{election}:c:"),
        _ => format!("{election}/"),
    }
}

/// `session`'s candidate key (in a layout whose store names the
/// candidates, the name's part before the sequence is not known from the
/// session: see [`own`]).
pub(crate) fn candidate_key(layout: Layout, election: &ElectionName, session: SessionId) -> String {
    match layout {
        Layout::Concurrency => format!("{election}/{:x}", session.0),
        _ => format!("{election}:c:{:016x}", session.0),
    }
}

/// Refuses what needs keys of leasehold's own besides the candidates
/// (notes, the record of releases, the list of elections) in a recipe's
/// layout, where nothing but candidates may live under an election.
pub(crate) fn own_layout(layout: Layout, what: &str) -> Result<()> {
    if layout.is_foreign() {
        return Err(Error::Unsupported(format!(
            "{what} needs leasehold's own layout; with ?layout={layout} the recipe \
             decides alone (its order of candidates is the only line), so \
             priorities, lock-delay, transfers, shards, slots and listing elections \
             are not available"
        )));
    }
    Ok(())
}

/// The prefix of the notes' keys.
pub(crate) fn notes(election: &ElectionName) -> String {
    format!("{election}:n:")
}

/// `session`'s note `name`.
pub(crate) fn note_key(election: &ElectionName, name: &str, session: SessionId) -> String {
    format!("{election}:n:{name}:{:016x}", session.0)
}

/// The key of the release record.
pub(crate) fn release_key(election: &ElectionName) -> String {
    format!("{election}:r")
}

/// A key this layout does not know, or a value it did not write.
fn corrupt(entry: &Entry) -> Error {
    Error::Corrupt(format!(
        "key {:?} is not one leasehold writes (or its value is not)",
        entry.key
    ))
}

/// Whether `entry` is a candidate key leasehold wrote: attached to the
/// session its name carries. Any other key among the candidates (written
/// by hand or by another program) is never taken for a candidate.
fn written_by_leasehold(entry: &Entry) -> bool {
    entry
        .session
        .is_some_and(|s| entry.key.ends_with(&format!(":c:{:016x}", s.0)))
}

/// Whether `entry`, among an election's candidates, is one: in leasehold's
/// layout only what it wrote; in a recipe's, every key.
fn counts(layout: Layout, entry: &Entry) -> bool {
    layout.is_foreign() || written_by_leasehold(entry)
}

/// The token of a grant whose key the store created at `revision`: that
/// revision, which stores number from 1 up; [`Error::Corrupt`] for 0, which
/// only a damaged store or a server breaking its protocol gives, and which
/// must never be granted as a token.
pub(crate) fn token(revision: Revision) -> Result<FencingToken> {
    if revision.0 == 0 {
        return Err(Error::Corrupt(
            "the store gave a candidate the creation revision 0, which is no fencing token; \
             nothing was granted"
                .into(),
        ));
    }
    Ok(FencingToken(revision.0))
}

/// A candidate key as the leader it names. A recipe's proposal that is no
/// valid candidate id is shown as well as it can be.
fn leader(layout: Layout, entry: &Entry) -> Result<Leader> {
    let candidate = if recipes::store_named(layout) {
        CandidateId::shown(entry.value.as_bytes(), "(empty id)")
    } else if layout.is_foreign() {
        CandidateId::shown(entry.value.as_bytes(), "(empty proposal)")
    } else {
        CandidateId::new(entry.value.as_str()).map_err(|_| corrupt(entry))?
    };
    let never = entry.session.is_none().then_some(NO_SESSION);
    Ok(Leader {
        candidate,
        token: token(entry.created)?,
        expires_in: entry.expires_in.or(never).unwrap_or_default(),
        session: entry.session,
    })
}

/// The candidates of a read in a layout whose store names them, in the
/// recipe's order of their names (see `recipes::line`).
fn in_recipe_line(layout: Layout, range: &Range) -> Vec<&Entry> {
    let names: Vec<&str> = (range.entries.iter())
        .map(|e| e.key.rsplit_once('/').map_or(e.key.as_str(), |(_, n)| n))
        .collect();
    (recipes::line(layout, &names).into_iter())
        .map(|i| &range.entries[i])
        .collect()
}

/// The holder of an election, from a read of its candidates: the first
/// in line, the live key of lowest creation revision (in a layout whose
/// store names the candidates, the first in the recipe's order).
pub(crate) fn holder(layout: Layout, range: &Range) -> Result<Option<Leader>> {
    let first = match recipes::store_named(layout) {
        true => in_recipe_line(layout, range).first().copied(),
        false => (range.entries.iter())
            .filter(|e| counts(layout, e))
            .min_by_key(|e| e.created),
    };
    first.map(|e| leader(layout, e)).transpose()
}

/// `session`'s candidate key among a read's, if it has one: the key of its
/// name; in a layout whose store names the candidates, the first in line
/// attached to the session ([`Error::Unavailable`] if the session's only
/// keys are out of the recipe's line: ZooKeeper wrote a sequence past ten
/// digits, which the recipe would not count).
pub(crate) fn own<'a>(
    layout: Layout,
    range: &'a Range,
    election: &ElectionName,
    session: SessionId,
) -> Result<Option<&'a Entry>> {
    if !recipes::store_named(layout) {
        let own = candidate_key(layout, election, session);
        return Ok(range.entries.iter().find(|e| e.key == own));
    }
    let mine = |e: &&Entry| e.session == Some(session);
    if let Some(first) = in_recipe_line(layout, range).into_iter().find(mine) {
        return Ok(Some(first));
    }
    match range.entries.iter().find(mine) {
        Some(outside) => Err(Error::Unavailable {
            reason: format!(
                "candidate {:?} is not in the line of ?layout={layout}",
                outside.key
            ),
            source: None,
        }),
        None => Ok(None),
    }
}

/// Where a campaign stands, from a read of its election's candidates.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its key leads: the grant.
    Granted(Grant),
    /// Another key leads. The campaign waits for the key just ahead of its
    /// own (`ahead`: created last before it) to change, not for any
    /// candidate, so that a release wakes only the next in line; it reads
    /// again then, or after `recheck` (when that key's session would have
    /// expired, where the store does not tell it).
    Waits {
        ahead: String,
        recheck: Option<Duration>,
    },
    /// Its key is gone: its session ended.
    Gone,
}

/// Where the campaign of `session` on `election` stands.
pub(crate) fn standing(
    layout: Layout,
    range: &Range,
    election: &ElectionName,
    session: SessionId,
) -> Result<Standing> {
    let Some(mine) = own(layout, range, election, session)? else {
        return Ok(Standing::Gone);
    };
    if mine.session != Some(session) {
        return Err(Error::Corrupt(format!(
            "key {:?} was not written by this session; leasehold does not overwrite it",
            mine.key
        )));
    }
    let ahead = match recipes::store_named(layout) {
        true => {
            let line = in_recipe_line(layout, range);
            let at = line.iter().position(|e| e.key == mine.key);
            at.and_then(|at| at.checked_sub(1)).map(|i| line[i])
        }
        false => (range.entries.iter())
            .filter(|e| counts(layout, e) && e.created < mine.created)
            .max_by_key(|e| e.created),
    };
    match ahead {
        None => {
            let leader = leader(layout, mine)?;
            Ok(Standing::Granted(Grant {
                election: election.clone(),
                candidate: leader.candidate,
                session,
                token: leader.token,
            }))
        }
        Some(ahead) => Ok(Standing::Waits {
            ahead: ahead.key.clone(),
            recheck: ahead.expires_in,
        }),
    }
}

/// The notes of an election, from a read of them, in order; and how long
/// until the first of their sessions expires, where the store tells it.
pub(crate) fn read_notes(
    election: &ElectionName,
    range: &Range,
) -> Result<(Vec<Note>, Option<Duration>)> {
    let prefix = notes(election);
    let mut read = Vec::with_capacity(range.entries.len());
    let mut first_expiry: Option<Duration> = None;
    for entry in &range.entries {
        let Some((name, session)) = note_of(&prefix, entry) else {
            tracing::warn!(key = %entry.key, "ignoring a key leasehold did not write among the notes");
            continue;
        };
        if let Some(left) = entry.expires_in {
            first_expiry = Some(first_expiry.map_or(left, |first| first.min(left)));
        }
        read.push(Note {
            session,
            name: name.to_owned(),
            order: entry.created.0,
            text: entry.value.clone(),
        });
    }
    read.sort_by_key(|note| note.order);
    Ok((read, first_expiry))
}

/// The name and session of a note leasehold wrote under `prefix`: attached
/// to the session its name carries. Any other key there (written by hand
/// or by another program, without a session or with another) is no note:
/// a stray "waiting" entry would otherwise stand in the line for good, with
/// nobody behind it ever chosen (found by a review).
fn note_of<'a>(prefix: &str, entry: &'a Entry) -> Option<(&'a str, SessionId)> {
    let (name, session) = entry.key.strip_prefix(prefix)?.rsplit_once(':')?;
    let session = (session.len() == 16)
        .then(|| u64::from_str_radix(session, 16).ok())
        .flatten()
        .map(SessionId)?;
    (entry.session == Some(session)).then_some((name, session))
}

/// The token of the last release, from a read of the release record.
pub(crate) fn last_release(range: &Range, election: &ElectionName) -> Result<Option<FencingToken>> {
    let key = release_key(election);
    range
        .entries
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.value.parse().map(FencingToken).map_err(|_| corrupt(e)))
        .transpose()
}

/// The name of the election a key belongs to, if it is one of this
/// layout's: a candidate's, a note's or the release record.
pub(crate) fn election_of(key: &str) -> Option<ElectionName> {
    let (name, rest) = key.split_once(':')?;
    if !(rest == "r" || rest.starts_with("c:") || rest.starts_with("n:")) {
        return None;
    }
    ElectionName::new(name).ok()
}

/// Every election with a key, and its holder, from a read of all keys
/// (ordered by key: an election's keys are next to each other, since they
/// all start with its name and a `:`, which no name holds).
pub(crate) fn list(range: &Range) -> Result<Vec<ElectionState>> {
    let mut listed: Vec<(ElectionName, Option<&Entry>)> = Vec::new();
    for entry in &range.entries {
        let Some(name) = election_of(&entry.key) else {
            continue;
        };
        let among_candidates = entry.key.starts_with(&candidates(Layout::Leasehold, &name));
        if among_candidates && !written_by_leasehold(entry) {
            continue;
        }
        let candidate = among_candidates.then_some(entry);
        match listed.last_mut() {
            Some((last, first)) if *last == name => {
                if candidate.is_some_and(|c| first.is_none_or(|f| c.created < f.created)) {
                    *first = candidate;
                }
            }
            _ => listed.push((name, candidate)),
        }
    }
    listed
        .into_iter()
        .map(|(election, first)| {
            Ok(ElectionState {
                election,
                leader: first.map(|e| leader(Layout::Leasehold, e)).transpose()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: Layout = Layout::Leasehold;

    fn election() -> ElectionName {
        ElectionName::new("jobs/e").expect("valid")
    }

    fn key(session: u64, created: u64, expires_in: Option<u64>) -> Entry {
        Entry {
            key: candidate_key(OWN, &election(), SessionId(session)),
            value: format!("c{session}"),
            session: Some(SessionId(session)),
            created: Revision(created),
            modified: Revision(created),
            expires_in: expires_in.map(Duration::from_millis),
        }
    }

    fn range(entries: Vec<Entry>) -> Range {
        Range {
            entries,
            revision: Revision(100),
        }
    }

    #[test]
    fn the_key_created_first_holds_and_its_revision_is_the_token() {
        // Sorted by key (session), not by creation: session 9 came first.
        let read = range(vec![key(2, 40, Some(5)), key(9, 12, Some(7))]);
        let first = holder(OWN, &read).expect("valid").expect("a holder");
        assert_eq!(first.candidate.as_str(), "c9");
        assert_eq!(first.token, FencingToken(12));
        assert_eq!(first.expires_in, Duration::from_millis(7));
        assert_eq!(first.session, Some(SessionId(9)));
        assert_eq!(holder(OWN, &range(vec![])).expect("valid"), None);
    }

    #[test]
    fn a_campaign_is_granted_only_at_the_front() {
        let read = range(vec![key(2, 40, Some(5)), key(9, 12, Some(7))]);
        assert_eq!(
            standing(OWN, &read, &election(), SessionId(2)).expect("valid"),
            Standing::Waits {
                ahead: candidate_key(OWN, &election(), SessionId(9)),
                recheck: Some(Duration::from_millis(7))
            }
        );
        assert_eq!(
            standing(OWN, &read, &election(), SessionId(9)).expect("valid"),
            Standing::Granted(Grant {
                election: election(),
                candidate: CandidateId::new("c9").expect("valid"),
                session: SessionId(9),
                token: FencingToken(12),
            })
        );
        assert_eq!(
            standing(OWN, &read, &election(), SessionId(3)).expect("valid"),
            Standing::Gone
        );
        // Where the store tells an expiry, nothing to recheck.
        let told = range(vec![key(2, 40, None), key(9, 12, None)]);
        assert_eq!(
            standing(OWN, &told, &election(), SessionId(2)).expect("valid"),
            Standing::Waits {
                ahead: candidate_key(OWN, &election(), SessionId(9)),
                recheck: None
            }
        );
    }

    #[test]
    fn a_campaign_waits_for_the_key_just_ahead_not_the_holder() {
        // Holder 9 (created 12), then 4 (20), then 2 (40), then 7 (55).
        let read = range(vec![
            key(2, 40, Some(5)),
            key(4, 20, Some(3)),
            key(7, 55, Some(8)),
            key(9, 12, Some(7)),
        ]);
        let waits = |session| match standing(OWN, &read, &election(), SessionId(session)) {
            Ok(Standing::Waits { ahead, recheck }) => (ahead, recheck),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            waits(4),
            (
                candidate_key(OWN, &election(), SessionId(9)),
                Some(Duration::from_millis(7))
            )
        );
        assert_eq!(
            waits(2),
            (
                candidate_key(OWN, &election(), SessionId(4)),
                Some(Duration::from_millis(3))
            )
        );
        assert_eq!(
            waits(7),
            (
                candidate_key(OWN, &election(), SessionId(2)),
                Some(Duration::from_millis(5))
            )
        );
    }

    /// A key among the candidates that leasehold did not write (no
    /// session, or another session than its name carries) is never taken
    /// for a candidate (found by a review: a row put by hand led, and the
    /// election was blocked for good).
    #[test]
    fn keys_leasehold_did_not_write_are_never_candidates() {
        let mut foreign = key(1, 1, None);
        foreign.session = None;
        let mut misnamed = key(3, 2, None);
        misnamed.session = Some(SessionId(4));
        let read = range(vec![foreign, misnamed, key(9, 12, None)]);
        assert_eq!(
            holder(OWN, &read).expect("valid").map(|l| l.token),
            Some(FencingToken(12))
        );
        assert!(matches!(
            standing(OWN, &read, &election(), SessionId(9)),
            Ok(Standing::Granted(_))
        ));
        let listed = list(&read).expect("valid");
        assert_eq!(
            listed[0].leader.as_ref().map(|l| l.token),
            Some(FencingToken(12))
        );
    }

    /// A key with the name of a campaign's own, attached to another
    /// session (put there by another program), is not taken for its own:
    /// the campaign is refused (before, it was granted on that key).
    #[test]
    fn a_campaigns_key_name_held_by_another_session_is_corrupt() {
        let mut squatted = key(2, 5, None);
        squatted.session = Some(SessionId(7));
        let read = range(vec![squatted, key(9, 12, None)]);
        assert!(matches!(
            standing(OWN, &read, &election(), SessionId(2)),
            Err(Error::Corrupt(_))
        ));
    }

    /// etcd's concurrency recipe: candidates are `E/{session in hex}`,
    /// every key under `E/` counts whoever wrote it, a key without a
    /// session never expires, and a proposal that is no candidate id is
    /// shown rather than refused.
    #[test]
    fn the_concurrency_layout_counts_every_key_under_its_election() {
        const RECIPE: Layout = Layout::Concurrency;
        let e = election();
        assert_eq!(candidates(RECIPE, &e), "jobs/e/");
        assert_eq!(candidate_key(RECIPE, &e, SessionId(0xab)), "jobs/e/ab");
        let foreign = Entry {
            key: format!("{}someone", candidates(RECIPE, &e)),
            value: String::new(),
            session: None,
            created: Revision(3),
            modified: Revision(3),
            expires_in: None,
        };
        let mine = Entry {
            key: candidate_key(RECIPE, &e, SessionId(0xab)),
            value: "me".into(),
            session: Some(SessionId(0xab)),
            created: Revision(8),
            modified: Revision(8),
            expires_in: None,
        };
        let read = range(vec![foreign.clone(), mine]);
        let first = holder(RECIPE, &read).expect("valid").expect("a holder");
        assert_eq!(first.token, FencingToken(3));
        assert_eq!(first.candidate.as_str(), "(empty proposal)");
        assert_eq!(first.expires_in, NO_SESSION);
        assert_eq!(
            standing(RECIPE, &read, &e, SessionId(0xab)).expect("valid"),
            Standing::Waits {
                ahead: foreign.key.clone(),
                recheck: None
            }
        );
        // leasehold's own layout would skip that key.
        assert_eq!(holder(OWN, &range(vec![foreign])).expect("valid"), None);
        assert!(matches!(
            own_layout(RECIPE, "a note"),
            Err(Error::Unsupported(_))
        ));
        assert!(own_layout(OWN, "a note").is_ok());
    }

    /// A creation revision of 0 (a store breaking its protocol) is never
    /// granted as a token.
    #[test]
    fn a_creation_revision_of_zero_is_no_token() {
        let read = range(vec![key(1, 0, None)]);
        assert!(matches!(holder(OWN, &read), Err(Error::Corrupt(_))));
        assert!(matches!(
            standing(OWN, &read, &election(), SessionId(1)),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(token(Revision(7)).expect("valid"), FencingToken(7));
    }

    #[test]
    fn a_value_that_is_no_candidate_id_is_corrupt() {
        let mut bad = key(1, 1, None);
        bad.value = String::new();
        assert!(matches!(
            holder(OWN, &range(vec![bad])),
            Err(Error::Corrupt(_))
        ));
    }

    #[test]
    fn notes_are_read_in_order_with_their_first_expiry() {
        let e = election();
        let note = |name: &str, session: u64, created: u64, left: u64| Entry {
            key: note_key(&e, name, SessionId(session)),
            value: format!("{name} of {session}"),
            session: Some(SessionId(session)),
            created: Revision(created),
            modified: Revision(created + 1),
            expires_in: Some(Duration::from_millis(left)),
        };
        let read = range(vec![note("cand", 2, 30, 900), note("transfer", 1, 20, 300)]);
        let (read_back, first) = read_notes(&e, &read).expect("valid");
        let shown: Vec<(&str, u64, u64)> = read_back
            .iter()
            .map(|n| (n.name.as_str(), n.session.0, n.order))
            .collect();
        assert_eq!(shown, [("transfer", 1, 20), ("cand", 2, 30)]);
        assert_eq!(read_back[1].text, "cand of 2");
        assert_eq!(first, Some(Duration::from_millis(300)));
        // Keys leasehold did not write among the notes are skipped, not
        // refused (a restarted replica could not rejoin) nor taken for
        // standbys (one without a session would stand in line for good):
        // no name, no session, another session than the name's, a name
        // that is no session.
        let mut nameless = note("cand", 2, 30, 900);
        nameless.key = format!("{}cand", notes(&e));
        let mut sessionless = note("cand", 9, 31, 900);
        sessionless.session = None;
        sessionless.expires_in = None;
        let mut misnamed = note("cand", 8, 32, 100);
        misnamed.session = Some(SessionId(7));
        let mut not_hex = note("cand", 6, 33, 900);
        not_hex.key = format!("{}cand:nothex", notes(&e));
        let read = range(vec![
            note("cand", 2, 30, 900),
            nameless,
            sessionless,
            misnamed,
            not_hex,
        ]);
        let (read_back, first) = read_notes(&e, &read).expect("skipped, not refused");
        assert_eq!(read_back.len(), 1, "{read_back:?}");
        assert_eq!(read_back[0].session, SessionId(2));
        assert_eq!(first, Some(Duration::from_millis(900)));
    }

    #[test]
    fn every_election_with_a_key_is_listed_with_its_holder() {
        let a = ElectionName::new("a").expect("valid");
        let ab = ElectionName::new("a/b").expect("valid");
        // As leasehold writes them: a candidate's or a note's key attached
        // to the session its name carries, the release record to none.
        let entry = |key: String, value: &str, created: u64| Entry {
            session: key
                .rsplit_once(':')
                .and_then(|(_, s)| u64::from_str_radix(s, 16).ok())
                .filter(|_| key.contains(":c:") || key.contains(":n:"))
                .map(SessionId),
            key,
            value: value.into(),
            created: Revision(created),
            modified: Revision(created),
            expires_in: None,
        };
        let read = range(vec![
            entry(candidate_key(OWN, &ab, SessionId(1)), "x", 5),
            entry(candidate_key(OWN, &a, SessionId(1)), "late", 9),
            entry(candidate_key(OWN, &a, SessionId(2)), "early", 3),
            entry(note_key(&a, "cand", SessionId(3)), "1 - y", 1),
            entry(release_key(&a), "2", 2),
            entry(release_key(&election()), "7", 4),
            entry("no election".into(), "", 6),
            entry("b:c:user".into(), "", 7),
            entry("b:x".into(), "", 8),
        ]);
        let listed: Vec<(String, Option<(String, u64)>)> = list(&read)
            .expect("valid")
            .into_iter()
            .map(|s| {
                let holder = s.leader.map(|l| (l.candidate.to_string(), l.token.0));
                (s.election.to_string(), holder)
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("a/b".to_owned(), Some(("x".to_owned(), 5))),
                ("a".to_owned(), Some(("early".to_owned(), 3))),
                ("jobs/e".to_owned(), None),
            ]
        );
    }

    #[test]
    fn keys_name_their_election_alone() {
        let e = election();
        // An election named like another's keys cannot be: names hold no ':'.
        assert!(ElectionName::new(format!("{}x", candidates(OWN, &e))).is_err());
        assert_eq!(
            election_of(&candidate_key(OWN, &e, SessionId(1))),
            Some(e.clone())
        );
        assert_eq!(election_of(&release_key(&e)), Some(e.clone()));
        assert_eq!(
            candidate_key(OWN, &e, SessionId(0xab)),
            "jobs/e:c:00000000000000ab"
        );
        let released = Range {
            entries: vec![Entry {
                key: release_key(&e),
                value: "42".into(),
                session: None,
                created: Revision(3),
                modified: Revision(9),
                expires_in: None,
            }],
            revision: Revision(9),
        };
        assert_eq!(
            last_release(&released, &e).expect("valid"),
            Some(FencingToken(42))
        );
        assert_eq!(last_release(&range(vec![]), &e).expect("valid"), None);
    }
}
