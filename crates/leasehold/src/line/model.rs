//! The line's rules checked over every interleaving of a small handover:
//! a model of the store (its notes, and its election: the live campaign
//! key of lowest revision holds), a leader that hands over to a chosen
//! standby, and two standbys whose steps are the line's pure rules
//! ([`front_step`], [`gives_back`], [`chosen`], [`Unmarking`]), each step
//! one atomic read or write of the store as the async shells make them;
//! either standby may die at any moment (its session ends, its note and
//! campaign key with it). Every reachable state is visited once; in each,
//! nobody but the chosen standby takes over while it lives, and where no
//! step is left a live standby leads.
//!
//! The check is not blind: with the rule that once withdrew the leader's
//! mark as soon as a successor held (CI saw "b leads now (token 26); a
//! (token 13) led before, not c"), it finds that very interleaving.

use std::collections::HashSet;
use std::time::Duration;

use super::{UnmarkStep, Unmarking, chosen, chosen_note, front_step, gives_back, standbys};
use crate::grant::{FencingToken, Leader, SessionId};
use crate::names::CandidateId;
use crate::store::Note;

/// The old leader, and the two standbys: `B` first in line, `C` the one
/// the leader chooses.
const L: usize = 0;
const B: usize = 1;
const C: usize = 2;
const NAMES: [&str; 3] = ["l", "b", "c"];

/// Where a standby's campaign is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    /// In line, not asking the store.
    Waiting,
    /// It read the line and found it may ask: it asks in its next step,
    /// whatever the line says by then (its watch may lag).
    WillAsk,
    /// Its campaign key is in the store; its campaign has not yet read
    /// whether the store granted it.
    Asking,
    /// It took the grant up and leads.
    Leading,
    /// Its process died: its session ended, and its notes and campaign
    /// key with it.
    Gone,
}

/// Where the old leader's handover is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Handover {
    /// Leading, nothing done yet.
    Holding,
    /// Its mark is on `C`'s note.
    Marked,
    /// It released; it watches for the successor and withdraws its mark
    /// by the rule, `true` once it saw the successor.
    Released(bool),
}

/// One state of the store and of the three parties.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct World {
    /// The notes: (session, order, text).
    notes: Vec<(u64, u64, String)>,
    /// The campaign keys: (party, creation revision).
    keys: Vec<(usize, u64)>,
    revision: u64,
    phases: [Phase; 3],
    handover: Handover,
    /// Whoever took a grant up after the leader released, in order, and
    /// whether `C` was alive then.
    took_over: Vec<(usize, bool)>,
}

/// The rules the parties follow: the line's, or one with a seeded bug.
#[derive(Clone, Copy)]
struct Rules {
    /// When the old leader's mark goes ([`Unmarking::step`]).
    unmark: fn(&Unmarking, &[Note], tokio::time::Instant) -> UnmarkStep,
    /// Whether a standby granted gives the grant back ([`gives_back`]).
    gives_back: fn(&[Note], SessionId) -> bool,
}

const THE_LINES: Rules = Rules {
    unmark: Unmarking::step,
    gives_back,
};

fn session(party: usize) -> SessionId {
    SessionId(party as u64 + 1)
}

fn candidate(party: usize) -> CandidateId {
    CandidateId::new(NAMES[party]).expect("valid id")
}

impl World {
    /// `L` holds (token 1); `B` and `C` wait in line, in that order.
    fn start() -> World {
        let note = |party: usize, order: u64| {
            let text = super::candidate_note(0, &candidate(party));
            (session(party).0, order, text)
        };
        World {
            notes: vec![note(B, 2), note(C, 3)],
            keys: vec![(L, 1)],
            revision: 3,
            phases: [Phase::Leading, Phase::Waiting, Phase::Waiting],
            handover: Handover::Holding,
            took_over: Vec::new(),
        }
    }

    fn notes(&self) -> Vec<Note> {
        self.notes
            .iter()
            .map(|(session, order, text)| Note {
                session: SessionId(*session),
                name: super::CANDIDATE.into(),
                order: *order,
                text: text.clone(),
            })
            .collect()
    }

    /// The holder: the live key of lowest revision.
    fn holder(&self) -> Option<(usize, u64)> {
        self.keys.iter().min_by_key(|(_, rev)| *rev).copied()
    }

    fn leader(&self) -> Option<Leader> {
        self.holder().map(|(party, rev)| Leader {
            candidate: candidate(party),
            token: FencingToken(rev),
            expires_in: Duration::from_secs(60),
            session: Some(session(party)),
        })
    }

    fn delete_key(&mut self, party: usize) {
        self.keys.retain(|(p, _)| *p != party);
    }

    fn set_mark(&mut self, party: usize, token: Option<FencingToken>) {
        let notes = self.notes();
        let Some(standby) = standbys(&notes)
            .into_iter()
            .find(|w| w.session == session(party))
        else {
            return;
        };
        let text = chosen_note(&standby, token);
        for note in &mut self.notes {
            if note.0 == session(party).0 {
                note.2 = text.clone();
            }
        }
    }

    /// Every state one step of the three parties away, by `rules`.
    fn steps(&self, rules: Rules) -> Vec<World> {
        let mut next = Vec::new();
        self.leader_steps(rules, &mut next);
        for party in [B, C] {
            self.standby_steps(party, rules, &mut next);
        }
        next
    }

    /// Every state one standby's death away: any standby may die at any
    /// moment, once.
    fn deaths(&self) -> Vec<World> {
        let mut next = Vec::new();
        for party in [B, C] {
            if self.phases[party] != Phase::Gone {
                let mut w = self.clone();
                w.notes.retain(|n| n.0 != session(party).0);
                w.delete_key(party);
                w.phases[party] = Phase::Gone;
                next.push(w);
            }
        }
        next
    }

    fn leader_steps(&self, rules: Rules, next: &mut Vec<World>) {
        let notes = self.notes();
        match self.handover {
            Handover::Holding => {
                let mut w = self.clone();
                w.set_mark(C, Some(FencingToken(1)));
                w.handover = Handover::Marked;
                next.push(w);
            }
            Handover::Marked => {
                let mut w = self.clone();
                w.delete_key(L);
                w.phases[L] = Phase::Waiting;
                w.handover = Handover::Released(false);
                next.push(w);
            }
            Handover::Released(seen) => {
                let mut unmarking = unmarking();
                // The successor it waits for: the one its mark names while
                // the mark is there, any newer holder once it is not.
                let marked = standbys(&notes)
                    .into_iter()
                    .find(|w| w.chosen_by == Some(FencingToken(1)));
                let successor = self.leader().filter(|l| {
                    l.token > FencingToken(1)
                        && marked.as_ref().is_none_or(|m| m.candidate == l.candidate)
                });
                if let Some(successor) = &successor {
                    unmarking.succeeded(successor);
                    if !seen {
                        let mut w = self.clone();
                        w.handover = Handover::Released(true);
                        next.push(w);
                    }
                }
                if seen
                    && marked.is_some()
                    && (rules.unmark)(&unmarking, &notes, now()) == UnmarkStep::Unmark
                {
                    let mut w = self.clone();
                    w.set_mark(C, None);
                    next.push(w);
                }
            }
        }
    }

    fn standby_steps(&self, party: usize, rules: Rules, next: &mut Vec<World>) {
        let notes = self.notes();
        let me = session(party);
        match self.phases[party] {
            Phase::Waiting => {
                if front_step(&notes, me, None, None) == super::FrontStep::Campaign {
                    let mut w = self.clone();
                    w.phases[party] = Phase::WillAsk;
                    next.push(w);
                }
            }
            Phase::WillAsk => {
                let mut w = self.clone();
                w.revision += 1;
                w.keys.push((party, w.revision));
                w.phases[party] = Phase::Asking;
                next.push(w);
            }
            Phase::Asking => {
                // Its campaign reads its grant: it gives it back to a
                // leader's other choice, else takes it up and leaves the
                // line.
                if self.holder().map(|(p, _)| p) == Some(party) {
                    let mut w = self.clone();
                    if (rules.gives_back)(&notes, me) {
                        w.delete_key(party);
                        w.phases[party] = Phase::Waiting;
                    } else {
                        w.phases[party] = Phase::Leading;
                        w.notes.retain(|n| n.0 != me.0);
                        w.took_over.push((party, self.phases[C] != Phase::Gone));
                    }
                    next.push(w);
                }
                // Its watch of the line: another was chosen, so it
                // withdraws from the store (a grant it had not read yet
                // with it).
                if chosen(&notes) != Some(me) {
                    let mut w = self.clone();
                    w.delete_key(party);
                    w.phases[party] = Phase::Waiting;
                    next.push(w);
                }
            }
            Phase::Leading | Phase::Gone => {}
        }
    }
}

fn now() -> tokio::time::Instant {
    static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(tokio::time::Instant::now)
}

/// The old leader's mark, withdrawn by the rule alone: its patience (for
/// a chosen standby that died) never runs out here.
fn unmarking() -> Unmarking {
    Unmarking::new(FencingToken(1), now(), Duration::from_secs(3600))
}

/// What [`explore`] found.
#[derive(Debug)]
enum Found {
    /// Every reachable state visited: how many, and the states where no
    /// step is left.
    All(usize, Vec<World>),
    /// The path to a state where someone else than `C` took over.
    Violation(Vec<World>),
}

/// Visits every state reachable from the start once, depth first; the
/// ends are the states where no party has a step left (deaths aside).
fn explore(rules: Rules) -> Found {
    let start = World::start();
    let mut seen = HashSet::from([start.clone()]);
    let mut stack = vec![vec![start]];
    let mut ends = Vec::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path is never empty");
        if last.took_over.iter().any(|&(p, c_alive)| p != C && c_alive) {
            return Found::Violation(path);
        }
        let steps = last.steps(rules);
        if steps.is_empty() {
            ends.push(last.clone());
        }
        for next in steps.into_iter().chain(last.deaths()) {
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next);
                stack.push(longer);
            }
        }
    }
    Found::All(seen.len(), ends)
}

/// Every interleaving of the handover, with either standby dying at any
/// moment, ends with `C` leading while it lives: `B`, first in line but
/// not chosen, takes over only once `C` died. And never with nobody while
/// a standby lives: every state where no step is left has a live leader,
/// `C` if it lives.
#[test]
fn a_handover_ends_with_the_chosen_standby_in_every_interleaving() {
    let (explored, ends) = match explore(THE_LINES) {
        Found::All(explored, ends) => (explored, ends),
        Found::Violation(path) => panic!("b took over while c lived: {path:#?}"),
    };
    // 172 states when this was written: fewer means steps went missing.
    assert!(explored >= 160, "only {explored} states");
    let mut c_led = false;
    for end in ends {
        let alive = |p: usize| end.phases[p] != Phase::Gone;
        let holder = end.holder().map(|(p, _)| p);
        let expected = [C, B].into_iter().find(|&p| alive(p));
        assert_eq!(holder, expected, "{end:#?}");
        if let Some(p) = holder {
            assert_eq!(end.phases[p], Phase::Leading, "{end:#?}");
        }
        c_led |= holder == Some(C);
    }
    assert!(c_led, "no interleaving ended with c leading");
}

/// The check is not blind: the old rule (the mark goes as soon as a
/// successor holds) lets `B` take over, in the interleaving CI once hit;
/// and so does a standby that never gives a grant back to a leader's
/// choice.
#[test]
fn seeded_bugs_in_the_line_s_rules_are_caught() {
    fn old_unmark(u: &Unmarking, _: &[Note], _: tokio::time::Instant) -> UnmarkStep {
        match u.successor {
            Some(_) => UnmarkStep::Unmark,
            None => UnmarkStep::Keep,
        }
    }
    fn never_gives_back(_: &[Note], _: SessionId) -> bool {
        false
    }
    for rules in [
        Rules {
            unmark: old_unmark,
            ..THE_LINES
        },
        Rules {
            gives_back: never_gives_back,
            ..THE_LINES
        },
    ] {
        let Found::Violation(path) = explore(rules) else {
            panic!("a seeded bug passed");
        };
        let last = path.last().expect("a path");
        assert_eq!(last.took_over, [(B, true)], "{path:#?}");
    }
}
