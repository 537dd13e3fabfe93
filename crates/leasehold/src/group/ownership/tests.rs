//! The ownership machine's rules as exact sequences of actions, and a
//! property over random sequences of events.

use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// `ms` milliseconds after the origin.
fn t(ms: u64) -> Instant {
    origin() + Duration::from_millis(ms)
}

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("a valid id")
}

fn held_by(name: &str, token: u64) -> Option<Leader> {
    Some(Leader {
        candidate: id(name),
        token: FencingToken(token),
        expires_in: Duration::ZERO,
        session: None,
    })
}

fn granted(token: u64) -> Campaigned {
    Campaigned::Granted {
        token: FencingToken(token),
        leading: true,
    }
}

/// `a`, alone in a group of `n` shards, granted shard `k` with token
/// `10 + k`: every shard handed out.
fn holding_all(n: usize) -> Ownership {
    let mut a = Ownership::new(id("a"), n);
    let campaigns = a.assigned(t(0), true, &[id("a")], &vec![None; n]);
    assert_eq!(campaigns.len(), n);
    for k in 0..n as u32 {
        assert_eq!(
            a.campaigned(k, granted(10 + u64::from(k)), t(0)),
            vec![Action::HandOut(k)]
        );
    }
    a
}

#[test]
fn a_member_alone_campaigns_for_every_shard_and_hands_each_grant_out() {
    let mut a = Ownership::new(id("a"), 3);
    assert_eq!(
        a.assigned(t(0), true, &[id("a")], &[None, None, None]),
        vec![
            Action::Campaign(0),
            Action::Campaign(1),
            Action::Campaign(2)
        ]
    );
    // Asked again, nothing more: one campaign per shard.
    assert_eq!(a.assigned(t(1), true, &[id("a")], &[None, None, None]), []);
    assert_eq!(a.campaigned(1, granted(7), t(2)), vec![Action::HandOut(1)]);
    assert_eq!(a.mine(), vec![1]);
}

#[test]
fn no_campaign_while_the_membership_s_session_is_over() {
    let mut a = Ownership::new(id("a"), 2);
    assert_eq!(a.assigned(t(0), false, &[id("a")], &[None, None]), []);
    assert_eq!(
        a.assigned(t(1), true, &[id("a")], &[None, None]),
        vec![Action::Campaign(0), Action::Campaign(1)]
    );
    // Its campaigns end with the session: asked for again afterwards.
    assert_eq!(a.campaigned(0, Campaigned::SessionEnded, t(2)), []);
    assert_eq!(a.phases()[0], Phase::Idle);
}

#[test]
fn a_shard_moved_to_a_joiner_is_revoked_once_then_left_to_it() {
    let mut a = holding_all(2);
    let holders = [held_by("a", 10), held_by("a", 11)];
    let both = [id("a"), id("b")];
    let revoked = a.assigned(t(5), true, &both, &holders);
    assert_eq!(
        revoked.len(),
        1,
        "one of two shards moves to b: {revoked:?}"
    );
    let Action::Revoke(moved) = revoked[0] else {
        panic!("a held shard that moved is revoked: {revoked:?}");
    };
    assert_eq!(a.assigned(t(6), true, &both, &holders), [], "revoked once");
    let token = FencingToken(10 + u64::from(moved));
    assert_eq!(
        a.given_back(moved, token, Duration::ZERO, Back::Released, t(7)),
        []
    );
    // The holder's watch still shows the released grant: behind, not a
    // grant nothing acts on, and the shard is b's now.
    assert_eq!(a.assigned(t(8), true, &both, &holders), []);
    assert_eq!(a.mine(), vec![1 - moved]);
}

#[test]
fn a_campaign_withdrawn_whose_grant_comes_anyway_is_released() {
    let mut a = Ownership::new(id("a"), 1);
    assert_eq!(
        a.assigned(t(0), true, &[id("a")], &[None]),
        vec![Action::Campaign(0)]
    );
    // The shard moves to b, which joined first.
    let both = [id("b"), id("a")];
    assert_eq!(
        a.assigned(t(1), true, &both, &[None]),
        vec![Action::Withdraw(0)]
    );
    assert_eq!(
        a.campaigned(0, granted(4), t(2)),
        vec![Action::ReleaseLeadership(0)],
        "a grant nobody wants any more is let go, never handed out"
    );
    assert_eq!(a.release_ended(0, FencingToken(4), true, t(3)), []);
    assert_eq!(a.phases()[0], Phase::Idle);
}

#[test]
fn a_grant_of_this_member_that_nothing_acts_on_is_released_before_a_new_campaign() {
    let mut a = Ownership::new(id("a"), 1);
    // A campaign whose reply was lost: the store shows a holding.
    let lost = [held_by("a", 7)];
    assert_eq!(
        a.assigned(t(0), true, &[id("a")], &lost),
        vec![Action::ReleaseGrant(0, FencingToken(7))]
    );
    assert_eq!(a.assigned(t(1), true, &[id("a")], &lost), [], "once");
    assert_eq!(a.release_ended(0, FencingToken(7), true, t(2)), []);
    // The watch still shows it (behind): the fresh campaign goes ahead.
    assert_eq!(
        a.assigned(t(3), true, &[id("a")], &lost),
        vec![Action::Campaign(0)]
    );
}

#[test]
fn a_failed_release_is_tried_again_after_a_pause_the_shard_resting() {
    let mut a = holding_all(1);
    assert_eq!(
        a.given_back(0, FencingToken(10), Duration::ZERO, Back::NotReleased, t(0)),
        vec![Action::ReleaseGrant(0, FencingToken(10))]
    );
    assert_eq!(
        a.release_ended(0, FencingToken(10), false, t(100)),
        vec![Action::ReleaseGrant(0, FencingToken(10))]
    );
    assert_eq!(a.release_ended(0, FencingToken(10), true, t(200)), []);
    let until = t(100) + RETRY;
    assert_eq!(a.phases()[0], Phase::Resting(until));
    assert_eq!(a.wake(), Some(until));
    assert_eq!(a.assigned(t(200), true, &[id("a")], &[None]), []);
    assert_eq!(
        a.assigned(until, true, &[id("a")], &[None]),
        vec![Action::Campaign(0)]
    );
}

#[test]
fn a_shard_given_back_with_a_rest_is_not_asked_for_before_it_ends() {
    let mut a = holding_all(1);
    let rest = Duration::from_secs(5);
    assert_eq!(
        a.given_back(0, FencingToken(10), rest, Back::Released, t(0)),
        []
    );
    assert_eq!(a.assigned(t(4_999), true, &[id("a")], &[None]), []);
    assert_eq!(
        a.assigned(t(5_000), true, &[id("a")], &[None]),
        vec![Action::Campaign(0)]
    );
}

#[test]
fn a_dropped_shard_is_released_by_the_coordinator() {
    let mut a = holding_all(1);
    assert_eq!(
        a.given_back(0, FencingToken(10), Duration::ZERO, Back::Dropped, t(0)),
        vec![Action::ReleaseLeadership(0)]
    );
    assert_eq!(
        a.assigned(t(1), true, &[id("a")], &[held_by("a", 10)]),
        [],
        "nothing is asked while its release is under way"
    );
}

#[test]
fn a_failed_campaign_rests_and_fails_the_member_only_for_good() {
    let mut a = Ownership::new(id("a"), 2);
    a.assigned(t(0), true, &[id("a")], &[None, None]);
    assert_eq!(
        a.campaigned(0, Campaigned::Failed { transient: true }, t(1)),
        []
    );
    assert_eq!(
        a.campaigned(1, Campaigned::Failed { transient: false }, t(1)),
        vec![Action::Fail(1)]
    );
    assert_eq!(a.phases()[0], Phase::Resting(t(1) + RETRY));
}

#[test]
fn reports_about_another_grant_change_nothing() {
    let mut a = holding_all(1);
    let before = a.phases().to_vec();
    assert_eq!(a.release_ended(0, FencingToken(10), true, t(1)), []);
    assert_eq!(
        a.given_back(0, FencingToken(9), Duration::ZERO, Back::Released, t(1)),
        []
    );
    assert_eq!(a.phases(), before);
}

/// What the coordinator may learn next, drawn at random.
#[derive(Clone, Debug)]
enum Event {
    Assigned {
        live: bool,
        members: u8,
        holder: Option<u64>,
    },
    CampaignEnds {
        grant: Option<(u64, bool)>,
        failed: bool,
        transient: bool,
    },
    ReleaseEnds {
        gone: bool,
    },
    GivenBack {
        how: u8,
        rest_ms: u64,
    },
    Later(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (any::<bool>(), 1u8..4, proptest::option::of(1u64..50)).prop_map(
            |(live, members, holder)| Event::Assigned {
                live,
                members,
                holder
            }
        ),
        (
            proptest::option::of((1u64..50, any::<bool>())),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(grant, failed, transient)| Event::CampaignEnds {
                grant,
                failed,
                transient
            }),
        any::<bool>().prop_map(|gone| Event::ReleaseEnds { gone }),
        (0u8..3, 0u64..3_000).prop_map(|(how, rest_ms)| Event::GivenBack { how, rest_ms }),
        (0u64..3_000).prop_map(Event::Later),
    ]
}

/// What is under way for the one shard of a group, as the actions said.
#[derive(Debug, Default)]
struct UnderWay {
    campaign: bool,
    release: Option<FencingToken>,
    held: Option<FencingToken>,
}

proptest! {
    /// For any sequence of events about one shard: at most one campaign,
    /// one handed-out shard and one release are under way at once, never
    /// a campaign beside a release or a handed-out shard, and a shard is
    /// handed out only from a campaign.
    #[test]
    fn one_thing_at_a_time_for_a_shard(events in proptest::collection::vec(event(), 1..60)) {
        let mut a = Ownership::new(id("a"), 1);
        let mut now = t(0);
        let mut on = UnderWay::default();
        let mut granted_token = None;
        for event in events {
            let actions = match event {
                Event::Later(ms) => { now += Duration::from_millis(ms); Vec::new() }
                Event::Assigned { live, members, holder } => {
                    let all = [id("a"), id("b"), id("c")];
                    let holders = [holder.and_then(|token| held_by("a", token))];
                    a.assigned(now, live, &all[..members as usize], &holders)
                }
                Event::CampaignEnds { .. } if !on.campaign => continue,
                Event::CampaignEnds { grant, failed, transient } => {
                    on.campaign = false;
                    let outcome = match grant {
                        Some((token, leading)) if !failed => {
                            granted_token = Some(FencingToken(token));
                            Campaigned::Granted { token: FencingToken(token), leading }
                        }
                        _ if failed => Campaigned::Failed { transient },
                        _ => Campaigned::Withdrawn,
                    };
                    a.campaigned(0, outcome, now)
                }
                Event::ReleaseEnds { gone } => match on.release.take() {
                    Some(token) => a.release_ended(0, token, gone, now),
                    None => continue,
                },
                Event::GivenBack { how, rest_ms } => match on.held.take() {
                    Some(token) => {
                        let how = [Back::Released, Back::NotReleased, Back::Dropped][how as usize];
                        a.given_back(0, token, Duration::from_millis(rest_ms), how, now)
                    }
                    None => continue,
                },
            };
            for action in actions {
                on.follow(action, granted_token)?;
            }
        }
    }
}

impl UnderWay {
    /// Takes up what `action` starts, failing if it starts a second thing
    /// for the shard.
    fn follow(
        &mut self,
        action: Action,
        granted: Option<FencingToken>,
    ) -> Result<(), TestCaseError> {
        match action {
            Action::Campaign(_) => {
                prop_assert!(
                    !self.campaign && self.release.is_none() && self.held.is_none(),
                    "a campaign beside another thing: {self:?}"
                );
                self.campaign = true;
            }
            Action::HandOut(_) => {
                prop_assert!(self.held.is_none() && self.release.is_none(), "{self:?}");
                self.held = granted;
            }
            Action::ReleaseGrant(_, token) => {
                prop_assert!(self.release.is_none() && !self.campaign, "{self:?}");
                self.release = Some(token);
            }
            Action::ReleaseLeadership(_) => {
                prop_assert!(self.release.is_none() && !self.campaign, "{self:?}");
                self.release = granted;
            }
            Action::Withdraw(_) => prop_assert!(self.campaign),
            Action::Revoke(_) => prop_assert!(self.held.is_some()),
            Action::Fail(_) => {}
        }
        Ok(())
    }
}
