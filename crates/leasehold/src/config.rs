//! Lease timing: TTL, renewal period, clock bounds, and the conservative
//! deadline arithmetic of DESIGN rule 3.

use std::time::Duration;

use crate::clock::Instant;
use crate::error::{Error, Result};

/// Default bound on how much slower the holder's clock may run than the
/// store's, as a fraction (1 %).
pub const DEFAULT_DRIFT: f64 = 0.01;
/// Default bound on the skew between the holder's and the store's clocks.
pub const DEFAULT_SKEW: Duration = Duration::from_millis(100);
/// Default TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// The largest drift bound accepted.
pub const MAX_DRIFT: f64 = 0.5;
/// The longest TTL accepted: one day. A lease is also how long a crashed
/// leader leaves its responsibility unowned, and every store keeps a lease
/// this long (ZooKeeper's session timeout is an `int` of milliseconds, at
/// most 24.8 days; etcd's lease TTL at most 9,000,000,000 s; PostgreSQL
/// keeps it as milliseconds in a `bigint`; SQLite as nanoseconds in an
/// `i64`, about 292 years). [`LeaseConfig::validate`] and every store's
/// `open_session` refuse a longer one, and the command-line tool refuses
/// any duration flag above it.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The one rule for the renewal period, in the words that
/// [`LeaseConfig::validate`]'s error, `leasehold run --help` and `leasehold
/// tune` all use. `TTL·(1 − drift) − skew` is how long a holder may act after
/// sending a renewal (DESIGN rule 3); renewing more often than every half of
/// it means that when one renewal is lost, the next is still sent before the
/// deadline. [`LeaseConfig::validate`] refuses a period that breaks it, and a
/// session whose store granted a shorter TTL than requested renews every
/// third of that time instead ([`LeaseConfig::renew_period_for`]).
pub const RENEWAL_RULE: &str =
    "the renewal period must be shorter than half of TTL·(1 − drift) − skew";

/// How a session's lease is timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseConfig {
    /// The TTL requested from the store.
    pub ttl: Duration,
    /// How often the session is renewed.
    pub renew_every: Duration,
    /// Bound on the holder's clock running slow relative to the store's
    /// (fraction, `0.0 ≤ drift < 0.5`).
    pub drift: f64,
    /// Bound on the skew between the holder's and the store's clocks.
    pub skew: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::new(DEFAULT_TTL)
    }
}

impl LeaseConfig {
    /// `ttl`, renewed every third of it, with the default clock bounds.
    pub fn new(ttl: Duration) -> Self {
        LeaseConfig {
            ttl,
            renew_every: ttl / 3,
            drift: DEFAULT_DRIFT,
            skew: DEFAULT_SKEW,
        }
    }

    /// Checks that the TTL and renewal period obey [`RENEWAL_RULE`] (so a
    /// holder can lose a renewal and still renew before its conservative
    /// deadline); every violation names the numbers involved.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::invalid("lease configuration", reason));
        if let Err(Error::InvalidInput { reason, .. }) = check_ttl(self.ttl) {
            return bad(format!("TTL {reason}"));
        }
        if self.renew_every.is_zero() {
            return bad("renewal period must be greater than zero".into());
        }
        if !(self.drift.is_finite() && (0.0..MAX_DRIFT).contains(&self.drift)) {
            return bad(format!(
                "drift bound {} must be at least 0 and below {MAX_DRIFT}",
                self.drift
            ));
        }
        if self.renewal_rule_holds(self.ttl) {
            return Ok(());
        }
        let arithmetic = format!(
            "({}·{} − {})/2",
            show(self.ttl),
            1.0 - self.drift,
            show(self.skew)
        );
        match self.validity(self.ttl) {
            Some(validity) => bad(format!(
                "renewal period {} is too long for TTL {}: {RENEWAL_RULE}, here {arithmetic} = {}",
                show(self.renew_every),
                show(self.ttl),
                show(validity / 2)
            )),
            None => bad(format!(
                "TTL {} is too short: {RENEWAL_RULE}, and here {arithmetic} is not positive",
                show(self.ttl)
            )),
        }
    }

    /// Whether [`RENEWAL_RULE`] holds for this renewal period and a TTL:
    /// `2·renew_every < ttl·(1 − drift) − skew`.
    pub fn renewal_rule_holds(&self, ttl: Duration) -> bool {
        self.validity(ttl)
            .is_some_and(|validity| self.renew_every.saturating_mul(2) < validity)
    }

    /// How long after sending a successful create or renewal request the
    /// holder may consider itself leader: `ttl·(1 − drift) − skew`, or
    /// `None` when that is not positive.
    ///
    /// A granted TTL above [`MAX_TTL`] counts as [`MAX_TTL`], and a drift
    /// bound that is not a number as its largest allowed value (0.5): both only make the
    /// deadline earlier, and no input makes this panic.
    pub fn validity(&self, granted_ttl: Duration) -> Option<Duration> {
        let drift = if self.drift.is_nan() {
            MAX_DRIFT
        } else {
            self.drift.clamp(0.0, MAX_DRIFT)
        };
        let ttl = granted_ttl.min(MAX_TTL);
        // At most `ttl`, so it fits; `from_secs_f64` cannot fail here.
        let slowed = Duration::try_from_secs_f64(ttl.as_secs_f64() * (1.0 - drift))
            .map_or(ttl, |slowed| slowed.min(ttl));
        slowed.checked_sub(self.skew).filter(|v| !v.is_zero())
    }

    /// The conservative deadline of DESIGN rule 3: `sent + ttl·(1 − drift) −
    /// skew`, where `sent` is when the request was *sent*.
    pub fn deadline(&self, sent: Instant, granted_ttl: Duration) -> Option<Instant> {
        self.validity(granted_ttl).map(|v| sent + v)
    }

    /// The renewal period to use with the TTL the store actually granted:
    /// the configured one while [`RENEWAL_RULE`] holds for the granted TTL
    /// (always so for a valid configuration granted the TTL it asked for);
    /// else, when the store granted less than was asked, a third of
    /// `granted·(1 − drift) − skew`, which obeys the rule.
    pub fn renew_period_for(&self, granted_ttl: Duration) -> Duration {
        match self.validity(granted_ttl) {
            Some(validity) if !self.renewal_rule_holds(granted_ttl) => {
                (validity / 3).max(Duration::from_nanos(1))
            }
            _ => self.renew_every,
        }
    }
}

/// The TTL a store may be asked for: more than zero, at most [`MAX_TTL`].
/// Every store's `open_session` checks it first, through [`StoreTtl::check`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid("TTL", "must be greater than zero"));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(
            "TTL",
            format!(
                "{} is longer than the maximum, {}",
                show(ttl),
                show(MAX_TTL)
            ),
        ));
    }
    Ok(())
}

/// How a store keeps a lease's TTL: in whole `unit`s, at most `max`. Each
/// store states its own, and its `open_session` passes it to
/// [`StoreTtl::check`], the one check of a requested TTL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreTtl {
    /// The store, for messages ("etcd").
    pub(crate) store: &'static str,
    /// The store counts the TTL in whole units of this.
    pub(crate) unit: Duration,
    /// The longest TTL the store keeps.
    pub(crate) max: Duration,
}

/// A TTL as a store keeps it: the requested one rounded up to the store's
/// unit, and how many units that is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckedTtl {
    /// The TTL, rounded up to whole units.
    pub(crate) ttl: Duration,
    /// The TTL in units.
    pub(crate) units: i64,
}

impl StoreTtl {
    /// Checks a requested TTL (more than zero, at most [`MAX_TTL`], at most
    /// what the store keeps) and rounds it up, never down, to the store's
    /// unit.
    pub(crate) fn check(self, ttl: Duration) -> Result<CheckedTtl> {
        check_ttl(ttl)?;
        let too_long = || {
            Error::invalid(
                "TTL",
                format!(
                    "{} is longer than {} keeps a lease, {}",
                    show(ttl),
                    self.store,
                    show(self.max)
                ),
            )
        };
        if ttl > self.max {
            return Err(too_long());
        }
        let unit = self.unit.as_nanos().max(1);
        let units = ttl.as_nanos().div_ceil(unit);
        let rounded = u64::try_from(units * unit).map_err(|_| too_long())?;
        Ok(CheckedTtl {
            ttl: Duration::from_nanos(rounded),
            units: i64::try_from(units).map_err(|_| too_long())?,
        })
    }
}

fn show(d: Duration) -> String {
    humanize(d)
}

/// Formats a duration the way a user typed it (`1.5s`, `250ms`).
pub(crate) fn humanize(d: Duration) -> String {
    if d.subsec_nanos() == 0 && d.as_secs() >= 3600 && d.as_secs().is_multiple_of(3600) {
        format!("{}h", d.as_secs() / 3600)
    } else if d.as_millis() >= 1000 && d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        let ms = d.as_millis();
        if ms >= 1000 {
            format!("{}s", d.as_secs_f64())
        } else {
            format!("{ms}ms")
        }
    } else {
        format!("{d:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_valid() {
        LeaseConfig::default()
            .validate()
            .expect("default config is valid");
        LeaseConfig::new(ms(2000))
            .validate()
            .expect("--ttl 2s alone is valid");
    }

    #[test]
    fn rejects_with_numbers() {
        let mut c = LeaseConfig::new(ms(2000));
        c.renew_every = ms(1000);
        let err = c.validate().expect_err("2r ≥ ttl·0.99 − s").to_string();
        assert!(
            err.contains(
                "renewal period 1s is too long for TTL 2s: the renewal period must be shorter \
                 than half of TTL·(1 − drift) − skew, here (2s·0.99 − 100ms)/2 = 940ms"
            ),
            "{err}"
        );
        assert!(err.contains(RENEWAL_RULE), "{err}");
        // Issue 12: 450 ms passed validation with TTL 1 s although the
        // runner then renewed every 296 ms and `tune` called it fragile.
        let mut c = LeaseConfig::new(ms(1000));
        c.renew_every = ms(450);
        let err = c.validate().expect_err("900ms ≥ 890ms").to_string();
        assert!(err.contains("= 445ms"), "{err}");
        c.renew_every = ms(444);
        c.validate().expect("888ms < 890ms");
        let mut c = LeaseConfig::new(ms(100));
        let err = c.validate().expect_err("no validity").to_string();
        assert!(err.contains("is not positive"), "{err}");
        assert!(err.contains(RENEWAL_RULE), "{err}");
        c.renew_every = ms(1);
        assert!(
            c.validate().is_err(),
            "TTL 100ms leaves no time after the skew"
        );
        assert!(LeaseConfig::new(Duration::ZERO).validate().is_err());
        let mut c = LeaseConfig::new(ms(2000));
        c.renew_every = Duration::ZERO;
        assert!(c.validate().is_err());
        for drift in [-0.1, 0.5, f64::NAN, f64::INFINITY] {
            let mut c = LeaseConfig::new(ms(2000));
            c.drift = drift;
            assert!(c.validate().is_err(), "drift {drift}");
        }
    }

    /// Issue 13 item 4: a TTL above the one every store can keep is
    /// refused up front, naming the maximum (it reached the stores before:
    /// etcd and PostgreSQL failed every campaign, SQLite capped it).
    #[test]
    fn rejects_a_ttl_above_the_maximum() {
        assert!(LeaseConfig::new(MAX_TTL).validate().is_ok());
        for ttl in [
            MAX_TTL + Duration::from_nanos(1),
            Duration::from_secs(1000 * 365 * 86_400),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            let err = LeaseConfig::new(ttl)
                .validate()
                .expect_err("too long")
                .to_string();
            assert!(err.contains("is longer than the maximum, 24h"), "{err}");
            assert!(check_ttl(ttl).is_err());
        }
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(MAX_TTL).is_ok());
        assert_eq!(humanize(MAX_TTL), "24h");
    }

    #[test]
    fn a_store_ttl_is_checked_and_rounded_up_to_its_unit() {
        let etcd = StoreTtl {
            store: "etcd",
            unit: Duration::from_secs(1),
            max: Duration::from_secs(9_000_000_000),
        };
        assert_eq!(
            etcd.check(ms(1500)).expect("valid"),
            CheckedTtl {
                ttl: Duration::from_secs(2),
                units: 2
            }
        );
        assert_eq!(etcd.check(MAX_TTL).expect("valid").units, 86_400);
        assert!(etcd.check(Duration::ZERO).is_err());
        assert!(etcd.check(MAX_TTL + Duration::from_nanos(1)).is_err());
        let short = StoreTtl {
            store: "a small store",
            unit: Duration::from_millis(1),
            max: Duration::from_secs(10),
        };
        let error = short.check(Duration::from_secs(11)).expect_err("too long");
        assert_eq!(
            error.to_string(),
            "invalid TTL: 11s is longer than a small store keeps a lease, 10s"
        );
    }

    #[test]
    fn deadline_uses_drift_and_skew() {
        let c = LeaseConfig::new(ms(10_000));
        let sent = Instant::now();
        // 10s * 0.99 - 100ms = 9.8s
        assert_eq!(c.deadline(sent, ms(10_000)), Some(sent + ms(9_800)));
        assert_eq!(c.validity(ms(100)), None);
    }

    #[test]
    fn renew_period_shrinks_when_store_grants_less() {
        let c = LeaseConfig::new(ms(3000));
        assert_eq!(c.renew_period_for(ms(3000)), ms(1000));
        assert_eq!(c.renew_period_for(ms(5000)), ms(1000));
        let shorter = c.renew_period_for(ms(1000));
        assert!(
            shorter < ms(1000) && shorter > Duration::ZERO,
            "{shorter:?}"
        );
        let shortened = LeaseConfig {
            renew_every: shorter,
            ..c
        };
        assert!(shortened.renewal_rule_holds(ms(1000)), "{shorter:?}");
    }

    proptest! {
        /// The deadline never reaches the store's earliest possible expiry
        /// (`sent + ttl`, since the store processes the request after it is
        /// sent), and a valid config always leaves time to renew.
        #[test]
        fn deadline_is_conservative(
            ttl_ms in 1u64..100_000,
            renew_ms in 1u64..50_000,
            skew_ms in 0u64..5_000,
            drift in 0.0f64..0.5,
            granted_ms in 1u64..200_000,
        ) {
            let c = LeaseConfig { ttl: ms(ttl_ms), renew_every: ms(renew_ms), drift, skew: ms(skew_ms) };
            let sent = Instant::now();
            if let Some(deadline) = c.deadline(sent, ms(granted_ms)) {
                prop_assert!(deadline < sent + ms(granted_ms));
                prop_assert!(deadline > sent);
            }
                // One rule: a configuration is valid exactly when the session
            // renews at the configured period with the TTL it asked for.
            prop_assert_eq!(
                c.validate().is_ok(),
                c.validity(c.ttl).is_some() && c.renew_period_for(c.ttl) == c.renew_every
                    && (0.0..MAX_DRIFT).contains(&c.drift)
            );
            if c.validate().is_ok() {
                let deadline = c.deadline(sent, c.ttl);
                prop_assert!(deadline.is_some_and(|d| d > sent + c.renew_every));
                prop_assert!(c.ttl >= c.renew_every * 2 + c.skew);
                let period = c.renew_period_for(ms(granted_ms));
                prop_assert!(period > Duration::ZERO);
                if let Some(v) = c.validity(ms(granted_ms)).filter(|v| *v >= ms(3)) {
                    prop_assert!(period < v, "renewal {:?} must come before validity {:?}", period, v);
                }
            }
        }

        /// Any durations and any drift bound: validation answers without a
        /// panic, and what it accepts is within the bounds and computes a
        /// deadline without overflow.
        #[test]
        fn any_durations_validate_without_panic(
            ttl in any::<Duration>(),
            renew_every in any::<Duration>(),
            skew in any::<Duration>(),
            drift in any::<f64>(),
            granted in any::<Duration>(),
        ) {
            let c = LeaseConfig { ttl, renew_every, drift, skew };
            let valid = c.validate();
            // Never a panic, whatever the store grants.
            let validity = c.validity(granted);
            prop_assert!(validity.is_none_or(|v| v <= MAX_TTL && v <= granted));
            let _ = c.renew_period_for(granted);
            if valid.is_ok() {
                prop_assert!(!ttl.is_zero() && ttl <= MAX_TTL);
                prop_assert!(renew_every.saturating_mul(2) < ttl);
                let sent = Instant::now();
                prop_assert!(c.deadline(sent, granted).is_none_or(|d| d >= sent));
            } else {
                let invalid_input = matches!(valid, Err(Error::InvalidInput { .. }));
                prop_assert!(invalid_input);
            }
        }

        #[test]
        fn later_send_never_gives_earlier_deadline(
            ttl_ms in 300u64..100_000, gap_ms in 0u64..10_000,
        ) {
            let c = LeaseConfig::new(ms(ttl_ms));
            let t0 = Instant::now();
            let a = c.deadline(t0, c.ttl);
            let b = c.deadline(t0 + ms(gap_ms), c.ttl);
            prop_assert!(a <= b);
        }
    }
}
