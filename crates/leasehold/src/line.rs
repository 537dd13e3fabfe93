//! The line of standbys and planned handovers, kept as notes in the store:
//! the decisions, pure, and the reads and writes of notes (described in
//! [`crate::admin`]).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::grant::{FencingToken, Leader, SessionId};
use crate::names::{CandidateId, ElectionName};
use crate::store::{Note, Store};

/// The note a waiting candidate keeps: `{priority} {candidate id}`, and a
/// leader's token once that leader chose it.
pub(crate) const CANDIDATE: &str = "cand";
/// A transfer request: `{token} {session}` or `{token} *`, then
/// `{token} {to} {taken}` once a newer leader took its grant up.
pub(crate) const TRANSFER: &str = "transfer";

/// How long a newer grant than the one a handover expected must stay
/// before [`successor`] takes it for the end of another move.
const OTHER_MOVE_SETTLES: Duration = Duration::from_millis(500);

/// A candidate waiting for an election, as its note says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standby {
    /// Who waits.
    pub candidate: CandidateId,
    /// Its priority: a higher one is granted first, and preempts a leader
    /// of lower priority.
    pub priority: i64,
    /// The session it waits on.
    pub session: SessionId,
    /// When it joined the line, in the store's order of notes.
    pub order: u64,
    /// The token of the leader that chose it to take over, if one did.
    pub chosen_by: Option<FencingToken>,
}

impl Standby {
    /// Whether this is `leader`'s own entry in the line: the same session,
    /// where the store tells the leader's, else the same candidate id. A
    /// replica given the leader's id waits in the line as another entry.
    pub fn is_of(&self, leader: &Leader) -> bool {
        match leader.session {
            Some(session) => session == self.session,
            None => self.candidate == leader.candidate,
        }
    }
}

fn parse_candidate(note: &Note) -> Option<Standby> {
    if note.name != CANDIDATE {
        return None;
    }
    // `{priority} {mark} {id}`, the mark `-` or a token.
    let (priority, rest) = note.text.split_once(' ')?;
    let (mark, candidate) = rest.split_once(' ')?;
    let chosen_by = match mark {
        "-" => None,
        token => Some(FencingToken(token.parse().ok()?)),
    };
    Some(Standby {
        candidate: CandidateId::new(candidate).ok()?,
        priority: priority.parse().ok()?,
        session: note.session,
        order: note.order,
        chosen_by,
    })
}

pub(crate) fn candidate_note(priority: i64, candidate: &CandidateId) -> String {
    format!("{priority} - {candidate}")
}

/// The text of `standby`'s note once the leader holding `token` chose it
/// (or, without a token, once that choice is withdrawn).
pub(crate) fn chosen_note(standby: &Standby, token: Option<FencingToken>) -> String {
    match token {
        Some(token) => format!("{} {} {}", standby.priority, token.0, standby.candidate),
        None => candidate_note(standby.priority, &standby.candidate),
    }
}

/// The line of standbys the notes describe, in the order they would be
/// granted: highest priority first, then earliest. A candidate that shows
/// twice (two sessions under one id) shows twice. Notes of another shape
/// are skipped.
pub fn standbys(notes: &[Note]) -> Vec<Standby> {
    let mut line: Vec<Standby> = notes.iter().filter_map(parse_candidate).collect();
    line.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.order.cmp(&b.order)));
    line
}

/// The standby a leader chose, among those that wait: the latest leader's
/// choice (highest token), then the first in line.
fn designated(line: &[Standby]) -> Option<SessionId> {
    line.iter()
        .filter_map(|w| w.chosen_by.map(|token| (token, w.session)))
        .fold(
            None::<(FencingToken, SessionId)>,
            |best, (token, session)| match best {
                Some((kept, _)) if kept >= token => best,
                _ => Some((token, session)),
            },
        )
        .map(|(_, session)| session)
}

/// The standby a leader that hands over chose, while it waits in line.
pub(crate) fn chosen_by_a_leader(notes: &[Note]) -> Option<SessionId> {
    designated(&standbys(notes))
}

/// The standby that may campaign now: the one a leader chose, else the
/// first in line.
pub(crate) fn chosen(notes: &[Note]) -> Option<SessionId> {
    let line = standbys(notes);
    designated(&line).or_else(|| line.first().map(|w| w.session))
}

/// Where `session` stands in the line: `Some(None)` first, `Some(Some(w))`
/// behind the standby `w`, `None` not in line.
pub(crate) fn place(line: &[Standby], session: SessionId) -> Option<Option<&Standby>> {
    let at = line.iter().position(|w| w.session == session)?;
    Some(at.checked_sub(1).map(|ahead| &line[ahead]))
}

/// What a standby at the front of the line does next
/// ([`front_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrontStep {
    /// It is neither first in line nor chosen any more: back to waiting
    /// behind the one ahead.
    Leave,
    /// It waits for the line, or the holder it follows, to change.
    Wait,
    /// Lock-delay: before asking, learn whether the last holder, of this
    /// token, released the election; if not (its lease expired), the
    /// delay is waited out first.
    AskHowItLeft(FencingToken),
    /// It asks the store for the election.
    Campaign,
}

/// What the standby of `session` does next, from the notes of the line
/// and, under a lock-delay, the holder it follows (`None` when it does
/// not: without a lock-delay it need not) and the last holder it saw.
/// Only the chosen one asks (a leader's choice, else the first in line),
/// and under a lock-delay only while nobody holds the election.
pub(crate) fn front_step(
    notes: &[Note],
    session: SessionId,
    holder: Option<Option<&Leader>>,
    last_holder: Option<FencingToken>,
) -> FrontStep {
    let chosen = chosen(notes) == Some(session);
    let first = matches!(place(&standbys(notes), session), Some(None));
    if !chosen && !first {
        return FrontStep::Leave;
    }
    if !chosen || matches!(holder, Some(Some(_))) {
        return FrontStep::Wait;
    }
    match (holder, last_holder) {
        (Some(_), Some(token)) => FrontStep::AskHowItLeft(token),
        _ => FrontStep::Campaign,
    }
}

/// Whether a standby the store just granted gives the grant back: a
/// leader that handed over chose another standby.
pub(crate) fn gives_back(notes: &[Note], granted: SessionId) -> bool {
    chosen_by_a_leader(notes).is_some_and(|chosen| chosen != granted)
}

/// A transfer request, as its note says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    /// The grant asked to hand over.
    from: FencingToken,
    /// The standby asked for; `None` for the first in line.
    to: Option<SessionId>,
    /// The newer grant whose leader took it up and said so, if one did.
    taken: Option<FencingToken>,
}

fn parse_transfer(note: &Note) -> Option<Request> {
    if note.name != TRANSFER {
        return None;
    }
    let mut fields = note.text.split(' ');
    let from = FencingToken(fields.next()?.parse().ok()?);
    let to = match fields.next()? {
        "*" => None,
        to => Some(SessionId(to.parse().ok()?)),
    };
    let taken = match fields.next() {
        Some(taken) => Some(FencingToken(taken.parse().ok()?)),
        None => None,
    };
    fields
        .next()
        .is_none()
        .then_some(Request { from, to, taken })
}

fn transfer_text(request: &Request) -> String {
    let to = request
        .to
        .map_or_else(|| "*".to_owned(), |session| session.0.to_string());
    match request.taken {
        Some(taken) => format!("{} {to} {}", request.from.0, taken.0),
        None => format!("{} {to}", request.from.0),
    }
}

/// A transfer request addressed to the leader holding `token`: `Some(None)`
/// for "the first in line", `Some(Some(session))` for that standby.
pub(crate) fn transfer_request(notes: &[Note], token: FencingToken) -> Option<Option<SessionId>> {
    notes
        .iter()
        .filter_map(parse_transfer)
        .filter(|r| r.from == token)
        .map(|r| r.to)
        .next_back()
}

/// What the leader holding `token`, whose elector has taken that grant
/// up, answers to the transfer requests among `notes`: for each request
/// of an older grant that no leader as new as this one answered yet, the
/// session keeping it and the note's text with `token` as the grant taken
/// up. A request waits for that answer ([`request_transfer`](crate::transfer::request_transfer)).
pub(crate) fn answers(notes: &[Note], token: FencingToken) -> Vec<(SessionId, String)> {
    notes
        .iter()
        .filter_map(|note| Some((note.session, parse_transfer(note)?)))
        .filter(|(_, r)| r.from < token && r.taken.is_none_or(|taken| taken < token))
        .map(|(session, r)| {
            let answered = Request {
                taken: Some(token),
                ..r
            };
            (session, transfer_text(&answered))
        })
        .collect()
}

/// The grant a leader said it took up, in answer to the transfer request
/// that `session` keeps among `notes`.
pub(crate) fn taken_up(notes: &[Note], session: SessionId) -> Option<FencingToken> {
    notes
        .iter()
        .filter(|n| n.session == session)
        .find_map(parse_transfer)?
        .taken
}

/// The line of standbys of `election` in `store` (the leader excluded), in
/// the order they would be granted.
pub async fn line(store: &dyn Store, election: &ElectionName) -> Result<Vec<Standby>> {
    Ok(standbys(&store.notes(election).await?))
}

/// Waits for the grant that ends a handover from the grant `after`: a
/// newer one, held by the standby a leader chose (or else by `named`)
/// while that standby still waits in line; once it left the
/// line (it died), anyone's. A standby granted for a moment before it saw
/// the choice gives that grant back, and is not taken for the successor.
///
/// The watches only wake it: each time it reads the notes and then the
/// leader afresh, in that order, so that a leader read after a line that
/// chose nobody any more is at least as new as the chosen one's grant
/// (two watches may lag by different amounts).
pub(crate) async fn successor(
    store: &dyn Store,
    election: &ElectionName,
    leaders: &mut crate::store::LeaderWatch,
    notes: &mut crate::store::NoteWatch,
    after: FencingToken,
    named: Option<SessionId>,
) -> Result<Leader> {
    loop {
        leaders.borrow_and_update();
        notes.borrow_and_update();
        let fresh = store.notes(election).await?;
        let line = standbys(&fresh);
        let marked = designated(&line);
        let expected = marked
            .or(named)
            .and_then(|s| line.into_iter().find(|w| w.session == s))
            .map(|w| w.candidate);
        let newer = store.leader(election).await?.filter(|l| l.token > after);
        if let Some(leader) = &newer
            && expected.as_ref().is_none_or(|c| *c == leader.candidate)
        {
            return Ok(leader.clone());
        }
        // A newer grant of another candidate than the one expected. While
        // a leader's mark still names a standby that waits, whoever else
        // holds gives the grant back (it reads the same mark as soon as
        // the store grants it): wait for that, however long a loaded
        // machine makes it. Without a mark (only the request named one),
        // it is the end of another move that won (a concurrent transfer,
        // a preemption), once it stays.
        let settle = async {
            match (&newer, marked) {
                (Some(_), None) => tokio::time::sleep(OTHER_MOVE_SETTLES).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = leaders.changed() => changed.map_err(|_| watch_ended())?,
            changed = notes.changed() => changed.map_err(|_| watch_ended())?,
            () = settle => {
                if let Some(leader) = newer {
                    return Ok(leader);
                }
            }
        }
    }
}

/// What a leader that handed over its grant does with its mark on the
/// chosen standby's note ([`Unmarking::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnmarkStep {
    /// The mark stays: the chosen standby may still need it.
    Keep,
    /// The mark goes ([`unmark_chosen`]).
    Unmark,
}

/// The mark a leader that handed over the grant `token` left on the
/// standby it chose, and when it withdraws it: pure, events in with the
/// instant; the async code only carries out [`UnmarkStep::Unmark`].
///
/// The mark goes once the successor holds *and* no longer waits in line
/// with the mark on its note, or after the leader's patience runs out
/// (the chosen standby died, say). Not as soon as the successor holds:
/// its campaign may not have seen the grant yet, and a standby that reads
/// neither a mark on itself nor itself first in line, its grant with it, so that the first in line
/// takes over instead of the chosen one (CI saw
/// "b leads now (token 26); a (token 13) led before, not c").
#[derive(Clone, Debug)]
pub(crate) struct Unmarking {
    token: FencingToken,
    successor: Option<CandidateId>,
    until: tokio::time::Instant,
}

impl Unmarking {
    /// After the release of the grant `token` at `now`; the mark goes at
    /// `now + patience` whatever happens.
    pub(crate) fn new(token: FencingToken, now: tokio::time::Instant, patience: Duration) -> Self {
        Unmarking {
            token,
            successor: None,
            until: now + patience,
        }
    }

    /// When the mark goes whatever happens.
    pub(crate) fn until(&self) -> tokio::time::Instant {
        self.until
    }

    /// A successor holds: the grant that ended the handover
    /// ([`successor`]).
    pub(crate) fn succeeded(&mut self, successor: &Leader) {
        self.successor = Some(successor.candidate.clone());
    }

    /// What to do, given the notes as read at `now`.
    pub(crate) fn step(&self, notes: &[Note], now: tokio::time::Instant) -> UnmarkStep {
        if now >= self.until {
            return UnmarkStep::Unmark;
        }
        let Some(successor) = &self.successor else {
            return UnmarkStep::Keep;
        };
        let still_waits = standbys(notes)
            .iter()
            .any(|w| w.chosen_by == Some(self.token) && w.candidate == *successor);
        if still_waits {
            UnmarkStep::Keep
        } else {
            UnmarkStep::Unmark
        }
    }
}

/// Marks `standby`'s note as the choice of the leader holding `token`;
/// `false` if it left the line meanwhile.
pub(crate) async fn mark_chosen(
    store: &dyn Store,
    election: &ElectionName,
    standby: &Standby,
    token: FencingToken,
) -> Result<bool> {
    store
        .amend_note(
            standby.session,
            election,
            CANDIDATE,
            &chosen_note(standby, Some(token)),
        )
        .await
}

/// Withdraws the mark of the leader holding `token` from every standby
/// that still waits with it (one whose campaign ended another way).
pub(crate) async fn unmark_chosen(
    store: &dyn Store,
    election: &ElectionName,
    token: FencingToken,
) -> Result<()> {
    for standby in line(store, election).await? {
        if standby.chosen_by == Some(token) {
            store
                .amend_note(
                    standby.session,
                    election,
                    CANDIDATE,
                    &chosen_note(&standby, None),
                )
                .await?;
        }
    }
    Ok(())
}

pub(crate) fn watch_ended() -> Error {
    Error::Unavailable {
        reason: "the store's watch ended".into(),
        source: None,
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    fn note(session: u64, name: &str, order: u64, text: &str) -> Note {
        Note {
            session: SessionId(session),
            name: name.into(),
            order,
            text: text.into(),
        }
    }

    fn leader(token: u64) -> Leader {
        Leader {
            candidate: CandidateId::new("l").expect("valid"),
            token: FencingToken(token),
            expires_in: Duration::from_secs(1),
            session: Some(SessionId(99)),
        }
    }

    /// The front of the line: only the chosen one asks; the first in line
    /// waits while another is chosen; under a lock-delay nobody asks
    /// while the election is held, and the last holder's way of leaving
    /// is learnt first.
    #[test]
    fn only_the_chosen_standby_asks_and_lock_delay_asks_how_the_holder_left() {
        let (a, b, c) = (SessionId(1), SessionId(2), SessionId(3));
        let line = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "0 - b"),
        ];
        assert_eq!(front_step(&line, a, None, None), FrontStep::Campaign);
        assert_eq!(front_step(&line, b, None, None), FrontStep::Leave);
        assert_eq!(front_step(&line, c, None, None), FrontStep::Leave);
        // A leader chose b: b asks, a (still first) waits.
        let marked = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "0 7 b"),
        ];
        assert_eq!(front_step(&marked, b, None, None), FrontStep::Campaign);
        assert_eq!(front_step(&marked, a, None, None), FrontStep::Wait);
        // Under a lock-delay: held, wait; free after holder 7, ask how it
        // left; free with no holder seen, ask the store.
        let held = leader(7);
        assert_eq!(
            front_step(&line, a, Some(Some(&held)), Some(FencingToken(7))),
            FrontStep::Wait
        );
        assert_eq!(
            front_step(&line, a, Some(None), Some(FencingToken(7))),
            FrontStep::AskHowItLeft(FencingToken(7))
        );
        assert_eq!(front_step(&line, a, Some(None), None), FrontStep::Campaign);
        // Without a lock-delay a holder is not followed: the last one seen
        // does not matter.
        assert_eq!(
            front_step(&line, a, None, Some(FencingToken(7))),
            FrontStep::Campaign
        );
        assert_eq!(front_step(&[], a, Some(None), None), FrontStep::Leave);
    }

    /// A grant is given back only when a leader chose another standby;
    /// the first in line is no choice.
    /// The transfer race, at the level of the line's rules: a leader (token
    /// 13) chose c, second in line behind b, and released; the store
    /// granted c, whose campaign has not yet read its grant. Were the mark
    /// withdrawn now (the old rule: as soon as a successor holds), c would
    /// read neither a mark on itself nor itself first and leave the
    /// store's line, its grant with it, and b, first in line, would ask
    /// and lead. The mark stays until
    /// c left the line, or the leader's patience ran out.
    #[test]
    fn a_mark_stays_until_the_chosen_successor_left_the_line() {
        let start = tokio::time::Instant::now();
        let patience = Duration::from_secs(2);
        let marked = vec![
            note(1, CANDIDATE, 1, "0 - b"),
            note(2, CANDIDATE, 2, "0 13 c"),
        ];
        let unmarked = vec![
            note(1, CANDIDATE, 1, "0 - b"),
            note(2, CANDIDATE, 2, "0 - c"),
        ];
        let mut unmarking = Unmarking::new(FencingToken(13), start, patience);
        // Nobody holds yet: the mark stays.
        assert_eq!(unmarking.step(&marked, start), UnmarkStep::Keep);
        // c holds (token 26) but still waits in line, marked.
        let mut c = leader(26);
        c.candidate = CandidateId::new("c").expect("valid");
        c.session = Some(SessionId(2));
        unmarking.succeeded(&c);
        assert_eq!(unmarking.step(&marked, start), UnmarkStep::Keep);
        // Why: with the mark, c keeps its grant and b waits...
        assert!(!gives_back(&marked, SessionId(2)));
        assert_eq!(
            front_step(&marked, SessionId(1), None, None),
            FrontStep::Wait
        );
        // ...without it, c leaves the store's line (withdrawing its key,
        // and the grant with it) and b asks.
        assert_eq!(
            front_step(&unmarked, SessionId(2), None, None),
            FrontStep::Leave
        );
        assert_eq!(
            front_step(&unmarked, SessionId(1), None, None),
            FrontStep::Campaign
        );
        // c left the line (it took its grant up): the mark goes.
        let left = vec![note(1, CANDIDATE, 1, "0 - b")];
        assert_eq!(unmarking.step(&left, start), UnmarkStep::Unmark);
        // Or the patience ran out, whoever holds.
        let fresh = Unmarking::new(FencingToken(13), start, patience);
        assert_eq!(fresh.step(&marked, start + patience), UnmarkStep::Unmark);
        assert_eq!(fresh.until(), start + patience);
    }

    #[test]
    fn a_grant_is_given_back_only_to_a_leaders_other_choice() {
        let (a, b) = (SessionId(1), SessionId(2));
        let line = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "0 - b"),
        ];
        assert!(
            !gives_back(&line, b),
            "the first in line is no leader's choice"
        );
        let marked = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "0 7 b"),
        ];
        assert!(gives_back(&marked, a));
        assert!(!gives_back(&marked, b));
        assert!(!gives_back(&[], a));
    }

    #[test]
    fn the_line_is_by_priority_then_order_and_skips_other_shapes() {
        let notes = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "5 - b"),
            note(3, CANDIDATE, 3, "0 - c"),
            note(4, CANDIDATE, 4, "5 - d"),
            note(5, CANDIDATE, 5, "x - e"),
            note(6, CANDIDATE, 6, "7"),
            note(7, "other", 7, "9 f"),
        ];
        let ids: Vec<String> = standbys(&notes)
            .into_iter()
            .map(|w| w.candidate.to_string())
            .collect();
        assert_eq!(ids, ["b", "d", "a", "c"]);
        assert_eq!(chosen(&notes), Some(SessionId(2)));
    }

    #[test]
    fn a_leaders_mark_chooses_a_standby_and_the_latest_leader_wins() {
        let mut notes = vec![
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "0 - b"),
            note(3, CANDIDATE, 3, "0 7 c"),
        ];
        assert_eq!(chosen(&notes), Some(SessionId(3)));
        assert_eq!(chosen_by_a_leader(&notes), Some(SessionId(3)));
        notes[1].text = "0 8 b".into();
        assert_eq!(chosen(&notes), Some(SessionId(2)));
        // The chosen one left: the other mark wins, then the line.
        notes.retain(|n| n.session != SessionId(2));
        assert_eq!(chosen(&notes), Some(SessionId(3)));
        notes.retain(|n| n.session != SessionId(3));
        assert_eq!(chosen(&notes), Some(SessionId(1)));
        assert_eq!(chosen_by_a_leader(&notes), None);
        assert_eq!(chosen(&[]), None);
    }

    #[test]
    fn an_id_may_hold_spaces_and_a_note_without_a_mark_is_skipped() {
        let notes = [
            note(1, CANDIDATE, 1, "0 - web 3"),
            note(2, CANDIDATE, 2, "0 9 db 1 "),
            note(3, CANDIDATE, 3, "0 no mark"),
            note(4, CANDIDATE, 4, "0 x"),
        ];
        let line: Vec<(String, Option<FencingToken>)> = standbys(&notes)
            .into_iter()
            .map(|w| (w.candidate.to_string(), w.chosen_by))
            .collect();
        assert_eq!(
            line,
            [
                ("web 3".to_owned(), None),
                ("db 1 ".to_owned(), Some(FencingToken(9))),
            ]
        );
        let spaced = &standbys(&notes)[0];
        assert_eq!(chosen_note(spaced, Some(FencingToken(4))), "0 4 web 3");
        assert_eq!(chosen_note(spaced, None), "0 - web 3");
    }

    #[test]
    fn a_standby_knows_who_is_just_ahead_of_it() {
        let notes = [
            note(1, CANDIDATE, 1, "0 - a"),
            note(2, CANDIDATE, 2, "5 - b"),
            note(3, CANDIDATE, 3, "0 - c"),
        ];
        let line = standbys(&notes);
        assert_eq!(place(&line, SessionId(2)), Some(None));
        assert_eq!(
            place(&line, SessionId(1)).map(|w| w.map(|w| w.session)),
            Some(Some(SessionId(2)))
        );
        assert_eq!(
            place(&line, SessionId(3)).map(|w| w.map(|w| w.session)),
            Some(Some(SessionId(1)))
        );
        assert_eq!(place(&line, SessionId(9)), None);
        let marked = chosen_note(&line[0], Some(FencingToken(4)));
        assert_eq!(marked, "5 4 b");
        assert_eq!(chosen_note(&line[0], None), "5 - b");
    }

    #[test]
    fn transfer_requests_are_for_one_token() {
        let notes = [
            note(7, TRANSFER, 1, "4 12"),
            note(8, TRANSFER, 2, "5 *"),
            note(9, TRANSFER, 3, "bad"),
        ];
        assert_eq!(
            transfer_request(&notes, FencingToken(4)),
            Some(Some(SessionId(12)))
        );
        assert_eq!(transfer_request(&notes, FencingToken(5)), Some(None));
        assert_eq!(transfer_request(&notes, FencingToken(6)), None);
    }

    #[test]
    fn a_newer_leader_answers_each_older_request_once() {
        let mut notes = vec![
            note(7, TRANSFER, 1, "4 12"),
            note(8, TRANSFER, 2, "5 *"),
            note(9, TRANSFER, 3, "bad"),
            note(12, CANDIDATE, 4, "0 4 b"),
        ];
        // A leader answers the requests to older grants, never its own.
        assert_eq!(
            answers(&notes, FencingToken(5)),
            [(SessionId(7), "4 12 5".to_owned())]
        );
        let answered = answers(&notes, FencingToken(6));
        assert_eq!(
            answered,
            [
                (SessionId(7), "4 12 6".to_owned()),
                (SessionId(8), "5 * 6".to_owned())
            ]
        );
        assert_eq!(taken_up(&notes, SessionId(7)), None);
        notes[0].text = "4 12 6".into();
        notes[1].text = "5 * 6".into();
        assert_eq!(taken_up(&notes, SessionId(7)), Some(FencingToken(6)));
        assert_eq!(taken_up(&notes, SessionId(8)), Some(FencingToken(6)));
        assert_eq!(taken_up(&notes, SessionId(12)), None);
        // Answered: not again by the same leader, again by a newer one.
        assert!(answers(&notes, FencingToken(6)).is_empty());
        assert_eq!(answers(&notes, FencingToken(9)).len(), 2);
        // An answered request still names its leader and its standby.
        assert_eq!(
            transfer_request(&notes, FencingToken(4)),
            Some(Some(SessionId(12)))
        );
        assert_eq!(transfer_request(&notes, FencingToken(5)), Some(None));
        notes[0].text = "4 12 6 7".into();
        assert_eq!(transfer_request(&notes, FencingToken(4)), None);
        assert_eq!(taken_up(&notes, SessionId(7)), None);
    }
}
