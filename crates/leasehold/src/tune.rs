//! Choosing a TTL: failover speed against false failovers (worked example 3
//! of docs/DESIGN.md).
//!
//! A holder renews every `R`; a renewal's round trip takes up to `J`
//! (jitter); the holder's and the store's clocks disagree by up to `S`
//! (skew) and drift apart by up to `drift`. After a successful renewal was
//! *sent*, the holder may act for `V = ttl·(1 − drift) − S` (DESIGN rule 3).
//! The renewals it sends `R, 2R, 3R, …` later each confirm in time if
//! `k·R + J < V`; so the number of them that can land before the deadline is
//! `n = #{k ≥ 1 : k·R + J < V}`, and a holder rides out `n − 1` renewals in a
//! row that are lost (dropped, refused, timed out) without a false failover.
//!
//! - The renewal period breaks [`RENEWAL_RULE`](crate::RENEWAL_RULE) (`2·R ≥ V`): refused by
//!   [`LeaseConfig::validate`], so `leasehold run` would not start. **Unsafe.**
//! - `n = 0`: even an on-time renewal lands too late; every term ends in a
//!   false failover. **Unsafe.**
//! - `n = 1`: one lost renewal ends leadership: a network blip causes a
//!   handover, under load the leadership flaps. **Fragile.**
//! - `n ≥ 2`: tolerant; the recommendation asks for `n ≥ 3` (two lost
//!   renewals in a row absorbed), which for `R = 3s, J = 1s, S = 500ms` is
//!   11 s — inside the 10–15 s the worked example argues for.
//!
//! The price is the ownership gap after a real crash: the store expires the
//! lease TTL after it received the last renewal, which may have been in
//! flight for up to `J`, and the successor's grant takes up to another `J`:
//! worst case `TTL + 2·J`, plus however late the store itself notices an
//! expiry ([`Conditions::store_expiry_check`]: etcd's lessor checks every
//! 500 ms, [`ETCD_EXPIRY_CHECK`]).

use std::time::Duration;

use crate::config::{DEFAULT_DRIFT, LeaseConfig, MAX_DRIFT, MAX_TTL, humanize};
use crate::error::{Error, Result};
use crate::store::StoreUrl;

/// How late etcd may notice that a lease expired: its lessor checks for
/// expired leases every 500 ms.
pub const ETCD_EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// How late a store may notice an expiry after the TTL has run out:
/// [`ETCD_EXPIRY_CHECK`] on etcd; zero on the others, whose waiters wake at
/// the holder's known expiry (SQLite, PostgreSQL, memory) or which expire a
/// session when its timeout passes (ZooKeeper).
pub fn store_expiry_check(url: &StoreUrl) -> Duration {
    match url {
        StoreUrl::Etcd(_) => ETCD_EXPIRY_CHECK,
        _ => Duration::ZERO,
    }
}

/// How many lost renewals in a row the recommended TTL absorbs.
pub const RECOMMENDED_LOST_RENEWALS: u32 = 2;

/// The conditions a TTL has to work under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conditions {
    /// How often the holder renews (`R`).
    pub renew_every: Duration,
    /// Largest renewal round trip to ride out (`J`): network jitter, store
    /// latency under load.
    pub jitter: Duration,
    /// Bound on the skew between the holder's and the store's clocks (`S`).
    pub skew: Duration,
    /// Bound on the holder's clock running slow (fraction).
    pub drift: f64,
    /// How late the store itself may notice an expired lease (etcd:
    /// [`ETCD_EXPIRY_CHECK`]); added to the worst-case failover.
    pub store_expiry_check: Duration,
}

impl Conditions {
    /// `R`, `J` and `S` with the default drift bound; `R` must be positive,
    /// and some TTL up to [`MAX_TTL`] must be safe under them (else
    /// [`Error::InvalidInput`] says why).
    pub fn new(renew_every: Duration, jitter: Duration, skew: Duration) -> Result<Self> {
        let conditions = Conditions {
            renew_every,
            jitter,
            skew,
            drift: DEFAULT_DRIFT,
            store_expiry_check: Duration::ZERO,
        };
        conditions.validate()?;
        Ok(conditions)
    }

    /// The same conditions on a store that notices expiries up to `check`
    /// late (see [`store_expiry_check`]).
    #[must_use]
    pub fn with_store_expiry_check(mut self, check: Duration) -> Self {
        self.store_expiry_check = check;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.renew_every.is_zero() {
            return Err(Error::invalid(
                "renewal period",
                "must be greater than zero",
            ));
        }
        if !(self.drift.is_finite() && (0.0..MAX_DRIFT).contains(&self.drift)) {
            return Err(Error::invalid(
                "drift bound",
                format!("{} must be at least 0 and below {MAX_DRIFT}", self.drift),
            ));
        }
        // Safety only grows with the TTL up to the maximum: if the longest
        // TTL `run` accepts is unsafe, every TTL is.
        if let Verdict::Unsafe { reason } = self.assess(MAX_TTL).verdict {
            return Err(Error::invalid(
                "conditions",
                format!(
                    "no TTL up to the maximum, {}, is safe with renewals every {}, jitter {} \
                     and skew {}: at {} {reason}",
                    humanize(MAX_TTL),
                    humanize(self.renew_every),
                    humanize(self.jitter),
                    humanize(self.skew),
                    humanize(MAX_TTL),
                ),
            ));
        }
        Ok(())
    }

    fn lease(&self, ttl: Duration) -> LeaseConfig {
        LeaseConfig {
            ttl,
            renew_every: self.renew_every,
            drift: self.drift,
            skew: self.skew,
        }
    }

    /// How `ttl` fares under these conditions.
    pub fn assess(&self, ttl: Duration) -> Assessment {
        let lease = self.lease(ttl);
        let validity = lease.validity(ttl).unwrap_or(Duration::ZERO);
        // Renewals k = 1, 2, … that confirm before the deadline: k·R + J < V.
        let renewals_in_time = match validity.checked_sub(self.jitter) {
            Some(room) if !room.is_zero() => {
                let room = room.as_nanos() - 1;
                u32::try_from(room / self.renew_every.as_nanos().max(1)).unwrap_or(u32::MAX)
            }
            _ => 0,
        };
        // The rule `leasehold run` enforces comes first, in its words.
        let verdict = if let Err(error) = lease.validate() {
            Verdict::Unsafe {
                reason: match error {
                    Error::InvalidInput { reason, .. } => reason,
                    other => other.to_string(),
                },
            }
        } else if renewals_in_time == 0 {
            Verdict::Unsafe {
                reason: format!(
                    "a renewal sent {} after the last one and taking the jitter {} confirms after \
                     the holder's deadline ({} after the last renewal): every term would end in a \
                     false failover",
                    humanize(self.renew_every),
                    humanize(self.jitter),
                    humanize(validity)
                ),
            }
        } else if renewals_in_time == 1 {
            Verdict::Fragile
        } else {
            Verdict::Tolerant
        };
        Assessment {
            ttl,
            renew_every: self.renew_every,
            round_trip_absorbed: validity.saturating_sub(self.renew_every),
            lost_renewals_absorbed: renewals_in_time.saturating_sub(1),
            worst_case_failover: ttl
                .saturating_add(self.jitter.saturating_mul(2))
                .saturating_add(self.store_expiry_check),
            verdict,
        }
    }

    /// The shortest TTL, rounded up to a readable step, that absorbs
    /// `lost` renewals in a row; [`MAX_TTL`] if no TTL up to it does.
    ///
    /// Computed, not searched step by step: any input is answered at once.
    pub fn ttl_absorbing(&self, lost: u32) -> Duration {
        let n = lost.saturating_add(1);
        // Absorbing: V > n·R + J; the renewal rule: V > 2·R; with
        // V = ttl·(1 − drift) − S, ttl > (max(n·R + J, 2·R) + S) / (1 − drift).
        let needed = self
            .renew_every
            .saturating_mul(n)
            .saturating_add(self.jitter)
            .max(self.renew_every.saturating_mul(2))
            .saturating_add(self.skew);
        let drift = if self.drift.is_finite() {
            self.drift.clamp(0.0, MAX_DRIFT)
        } else {
            MAX_DRIFT
        };
        let raw = Duration::try_from_secs_f64(needed.as_secs_f64() / (1.0 - drift))
            .unwrap_or(Duration::MAX)
            .saturating_add(Duration::from_nanos(1));
        if raw >= MAX_TTL {
            return MAX_TTL;
        }
        let step = step_for(raw);
        let absorbs = |ttl: Duration| {
            let a = self.assess(ttl);
            a.is_safe() && a.lost_renewals_absorbed >= lost
        };
        let first = round_up(raw, step);
        if absorbs(first) {
            return first;
        }
        // Float rounding left the estimate short: bisect over the multiples
        // of `step` up to MAX_TTL (a multiple of every step), as absorbing
        // only grows with the TTL.
        let steps = |d: Duration| d.as_nanos() / step.as_nanos();
        let (mut short, mut long) = (steps(first), steps(MAX_TTL));
        if !absorbs(MAX_TTL) {
            return MAX_TTL;
        }
        let at =
            |k: u128| Duration::from_nanos(u64::try_from(k * step.as_nanos()).unwrap_or(u64::MAX));
        while long - short > 1 {
            let mid = short + (long - short) / 2;
            if absorbs(at(mid)) {
                long = mid;
            } else {
                short = mid;
            }
        }
        at(long)
    }

    /// The recommended TTL and the trade-off around it.
    pub fn recommend(&self) -> Recommendation {
        let recommended = self.assess(self.ttl_absorbing(RECOMMENDED_LOST_RENEWALS));
        let mut alternatives: Vec<Assessment> = (0..=RECOMMENDED_LOST_RENEWALS + 2)
            .map(|lost| self.assess(self.ttl_absorbing(lost)))
            .collect();
        // The aggressive end of the worked example: TTL just above R + J + S.
        let aggressive = self
            .renew_every
            .saturating_add(self.jitter)
            .saturating_add(self.skew);
        alternatives.push(self.assess(round_up(aggressive, step_for(aggressive)).min(MAX_TTL)));
        alternatives.sort_by_key(|a| a.ttl);
        alternatives.dedup_by_key(|a| a.ttl);
        Recommendation {
            conditions: *self,
            recommended,
            alternatives,
        }
    }
}

/// A readable rounding step: whole seconds from 2 s up, 100 ms from 200 ms,
/// else 10 ms.
fn step_for(d: Duration) -> Duration {
    if d >= Duration::from_secs(2) {
        Duration::from_secs(1)
    } else if d >= Duration::from_millis(200) {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(10)
    }
}

fn round_up(d: Duration, step: Duration) -> Duration {
    let steps = d.as_nanos().div_ceil(step.as_nanos());
    let nanos = steps.saturating_mul(step.as_nanos());
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// How a TTL fares under given conditions.
#[derive(Clone, Debug, PartialEq)]
pub struct Assessment {
    /// The TTL assessed.
    pub ttl: Duration,
    /// The renewal period it was assessed with.
    pub renew_every: Duration,
    /// The slowest single renewal round trip that still confirms before the
    /// holder's deadline (`V − R`).
    pub round_trip_absorbed: Duration,
    /// Renewals in a row that may be lost (taking the jitter each) without
    /// a false failover.
    pub lost_renewals_absorbed: u32,
    /// Longest time the election can stay unowned after the holder crashes:
    /// `TTL + 2·J` plus the store's own expiry-detection delay
    /// ([`Conditions::store_expiry_check`]).
    pub worst_case_failover: Duration,
    /// Safe, fragile or unsafe.
    pub verdict: Verdict,
}

impl Assessment {
    /// Whether a holder can keep leadership at all under these conditions.
    pub fn is_safe(&self) -> bool {
        !matches!(self.verdict, Verdict::Unsafe { .. })
    }
}

/// The verdict on a TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Rides out at least one lost renewal.
    Tolerant,
    /// Works, but one lost or slow renewal ends leadership: false failovers
    /// and flapping under load.
    Fragile,
    /// Cannot work: the renewal period breaks [`RENEWAL_RULE`](crate::RENEWAL_RULE) (so
    /// [`LeaseConfig::validate`] refuses it), or renewals cannot confirm
    /// before the deadline.
    Unsafe {
        /// Why, with the numbers.
        reason: String,
    },
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Tolerant => f.write_str("tolerant"),
            Verdict::Fragile => f.write_str("fragile"),
            Verdict::Unsafe { .. } => f.write_str("unsafe"),
        }
    }
}

/// A recommended TTL with alternatives around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    /// The conditions it was computed for.
    pub conditions: Conditions,
    /// The recommended TTL (absorbs [`RECOMMENDED_LOST_RENEWALS`]).
    pub recommended: Assessment,
    /// Shorter and longer TTLs, sorted by TTL.
    pub alternatives: Vec<Assessment>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RENEWAL_RULE;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn worked_example_three() {
        // R = 3 s, J = 1 s, S = 500 ms: "set TTL safely above R + J + S plus
        // headroom — here maybe 10–15 s".
        let c = Conditions::new(ms(3000), ms(1000), ms(500)).expect("valid");
        let r = c.recommend();
        assert!(
            (ms(10_000)..=ms(15_000)).contains(&r.recommended.ttl),
            "{r:?}"
        );
        assert_eq!(r.recommended.ttl, ms(11_000));
        assert_eq!(r.recommended.lost_renewals_absorbed, 2);
        assert_eq!(r.recommended.worst_case_failover, ms(13_000));
        // "Aggressive TTL = 4 s … a false failover": unsafe.
        assert!(!c.assess(ms(4000)).is_safe());
        // "Conservative TTL = 15 s: a delayed renewal of a few seconds is
        // easily absorbed".
        let conservative = c.assess(ms(15_000));
        assert_eq!(conservative.verdict, Verdict::Tolerant);
        assert!(conservative.round_trip_absorbed > ms(10_000));
        assert!(conservative.lost_renewals_absorbed >= 3);
    }

    #[test]
    fn renewal_period_of_half_the_ttl_is_unsafe() {
        let c = Conditions::new(ms(5000), ms(0), ms(0)).expect("valid");
        let a = c.assess(ms(10_000));
        assert!(!a.is_safe(), "{a:?}");
    }

    /// Issue 12: `--ttl 1s --renew-every 450ms` was valid for `run`, which
    /// then renewed every 296 ms, while `tune` called 450 ms fragile. Now
    /// `tune` refuses it with the validation error's words.
    #[test]
    fn the_renewal_rule_is_the_validation_rule() {
        let c = Conditions::new(ms(450), ms(0), ms(100)).expect("valid");
        let a = c.assess(ms(1000));
        let Verdict::Unsafe { reason } = &a.verdict else {
            panic!("{a:?}")
        };
        assert!(reason.contains(RENEWAL_RULE), "{reason}");
        let lease = c.lease(ms(1000));
        let Err(Error::InvalidInput {
            reason: refused, ..
        }) = lease.validate()
        else {
            panic!("valid")
        };
        assert_eq!(reason, &refused);
        // Just inside the rule, with no jitter: one lost renewal absorbed.
        let c = Conditions::new(ms(444), ms(0), ms(100)).expect("valid");
        assert_eq!(c.assess(ms(1000)).verdict, Verdict::Tolerant);
    }

    #[test]
    fn etcd_adds_its_expiry_check_to_the_worst_case_failover() {
        let c = Conditions::new(ms(3000), ms(1000), ms(500)).expect("valid");
        let etcd: StoreUrl = "etcd://127.0.0.1:2379".parse().expect("url");
        let sqlite: StoreUrl = "sqlite:/tmp/x.db".parse().expect("url");
        assert_eq!(store_expiry_check(&etcd), ms(500));
        assert_eq!(store_expiry_check(&sqlite), Duration::ZERO);
        let on_etcd = c.with_store_expiry_check(store_expiry_check(&etcd));
        assert_eq!(on_etcd.assess(ms(11_000)).worst_case_failover, ms(13_500));
        assert_eq!(c.assess(ms(11_000)).worst_case_failover, ms(13_000));
        // The TTL itself does not change: the check delays the successor,
        // not the holder.
        assert_eq!(on_etcd.recommend().recommended.ttl, ms(11_000));
    }

    #[test]
    fn one_renewal_in_time_is_fragile() {
        // V = 8.91 s − 0.1 s = 8.81 s; 4 s + 1 s < 8.81 s but 8 s + 1 s ≥ 8.81 s.
        let c = Conditions::new(ms(4000), ms(1000), ms(100)).expect("valid");
        assert_eq!(c.assess(ms(9000)).verdict, Verdict::Fragile);
        assert_eq!(c.assess(ms(10_000)).verdict, Verdict::Tolerant);
    }

    #[test]
    fn zero_renewal_period_is_refused() {
        assert!(matches!(
            Conditions::new(Duration::ZERO, ms(1), ms(1)),
            Err(Error::InvalidInput { .. })
        ));
    }

    #[test]
    fn alternatives_are_sorted_and_include_an_unsafe_short_ttl() {
        let c = Conditions::new(ms(3000), ms(1000), ms(500)).expect("valid");
        let r = c.recommend();
        assert!(r.alternatives.windows(2).all(|w| w[0].ttl < w[1].ttl));
        assert!(r.alternatives.iter().any(|a| !a.is_safe()));
        assert!(r.alternatives.contains(&r.recommended));
        assert!(r.alternatives.iter().any(|a| a.ttl > r.recommended.ttl));
    }

    /// Issue 13 item 4: `tune` panicked on `--renew-every
    /// 18446744073709551615s` and spun for minutes on `100y` (a loop of
    /// one-second steps). Conditions no TTL up to the maximum survives are
    /// refused, and every answer is computed at once.
    #[test]
    fn huge_inputs_are_refused_or_answered_at_once() {
        let started = std::time::Instant::now();
        let year = Duration::from_secs(365 * 86_400);
        for (r, j, s) in [
            (Duration::from_secs(u64::MAX), ms(1000), ms(100)),
            (Duration::MAX, Duration::MAX, Duration::MAX),
            (year * 100, ms(1000), ms(100)),
            (year, ms(1000), ms(100)),
            (ms(1000), year, ms(100)),
            (ms(1000), ms(1000), year),
            (MAX_TTL / 2, ms(0), ms(0)),
        ] {
            let Err(Error::InvalidInput { reason, .. }) = Conditions::new(r, j, s) else {
                panic!("{r:?} {j:?} {s:?} accepted");
            };
            assert!(reason.contains("no TTL up to the maximum, 24h"), "{reason}");
        }
        // Just inside: the recommendation stays within the maximum, even
        // where it cannot absorb two lost renewals.
        for r in [ms(28_000_000), ms(40_000_000), MAX_TTL / 3] {
            let c = Conditions::new(r, ms(1000), ms(100)).expect("a TTL up to 24h is safe");
            let rec = c.recommend();
            assert!(rec.recommended.ttl <= MAX_TTL, "{rec:?}");
            assert!(rec.recommended.is_safe(), "{rec:?}");
            assert!(rec.alternatives.iter().all(|a| a.ttl <= MAX_TTL));
        }
        // Conditions built by hand, unchecked: answered, never a panic.
        let wild = Conditions {
            renew_every: Duration::MAX,
            jitter: Duration::MAX,
            skew: Duration::MAX,
            drift: f64::NAN,
            store_expiry_check: Duration::MAX,
        };
        let rec = wild.recommend();
        assert!(!rec.recommended.is_safe());
        let zero = Conditions {
            renew_every: Duration::ZERO,
            ..wild
        };
        let _ = zero.recommend();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    proptest! {
        /// The TTL said to absorb `lost` renewals does, is accepted by the
        /// lease rules, and is the shortest such on its rounding step.
        #[test]
        fn ttl_absorbing_is_minimal_and_sufficient(
            r in 1u64..60_000, j in 0u64..10_000, s in 0u64..5_000, lost in 0u32..5,
        ) {
            let c = Conditions::new(ms(r), ms(j), ms(s)).expect("valid");
            let ttl = c.ttl_absorbing(lost);
            let a = c.assess(ttl);
            prop_assert!(a.is_safe(), "{a:?}");
            prop_assert!(a.lost_renewals_absorbed >= lost);
            prop_assert!(c.lease(ttl).validate().is_ok());
            let shorter = ttl - step_for(ttl).min(ttl);
            let b = c.assess(shorter);
            prop_assert!(shorter.is_zero() || step_for(shorter) != step_for(ttl)
                || b.lost_renewals_absorbed < lost || !b.is_safe(), "{b:?}");
        }

        /// The tune model and the lease rules agree: with no jitter, a TTL is
        /// safe exactly when `leasehold run` accepts it.
        #[test]
        fn safe_without_jitter_exactly_when_valid(
            r in 1u64..10_000, s in 0u64..2_000, t in 1u64..100_000,
        ) {
            let c = Conditions::new(ms(r), Duration::ZERO, ms(s)).expect("valid");
            prop_assert_eq!(c.assess(ms(t)).is_safe(), c.lease(ms(t)).validate().is_ok());
        }

        /// Any durations and drift, checked or not: `recommend` and
        /// `assess` answer without a panic, within the maximum TTL; what
        /// `Conditions::new` accepts gets a safe recommendation.
        #[test]
        fn any_conditions_are_answered(
            renew_every in any::<Duration>(),
            jitter in any::<Duration>(),
            skew in any::<Duration>(),
            drift in any::<f64>(),
            ttl in any::<Duration>(),
        ) {
            let raw = Conditions { renew_every, jitter, skew, drift, store_expiry_check: ETCD_EXPIRY_CHECK };
            let rec = raw.recommend();
            prop_assert!(rec.recommended.ttl <= MAX_TTL);
            let _ = raw.assess(ttl);
            match Conditions::new(renew_every, jitter, skew) {
                Ok(c) => {
                    let rec = c.recommend();
                    prop_assert!(rec.recommended.is_safe(), "{:?}", rec);
                    prop_assert!(c.lease(rec.recommended.ttl).validate().is_ok());
                }
                Err(e) => {
                    let invalid_input = matches!(e, Error::InvalidInput { .. });
                    prop_assert!(invalid_input, "{}", e);
                }
            }
        }

        /// A longer TTL never absorbs less and never fails over sooner.
        #[test]
        fn longer_ttl_is_monotone(
            r in 1u64..10_000, j in 0u64..5_000, s in 0u64..2_000, t in 1u64..100_000, extra in 0u64..50_000,
        ) {
            let c = Conditions::new(ms(r), ms(j), ms(s)).expect("valid");
            let a = c.assess(ms(t));
            let b = c.assess(ms(t + extra));
            prop_assert!(b.lost_renewals_absorbed >= a.lost_renewals_absorbed);
            prop_assert!(b.worst_case_failover >= a.worst_case_failover);
            prop_assert!(!a.is_safe() || b.is_safe());
        }
    }
}
