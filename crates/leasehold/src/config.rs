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
        LeaseConfig::with_ttl(DEFAULT_TTL)
    }
}

impl LeaseConfig {
    /// `ttl`, renewed every third of it, with the default clock bounds.
    pub fn with_ttl(ttl: Duration) -> Self {
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
        if self.ttl.is_zero() {
            return bad("TTL must be greater than zero".into());
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
    pub fn validity(&self, granted_ttl: Duration) -> Option<Duration> {
        let slowed = granted_ttl.mul_f64(1.0 - self.drift.clamp(0.0, MAX_DRIFT));
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

fn show(d: Duration) -> String {
    humanize(d)
}

/// Formats a duration the way a user typed it (`1.5s`, `250ms`).
pub(crate) fn humanize(d: Duration) -> String {
    if d.as_millis() >= 1000 && d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
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
        LeaseConfig::with_ttl(ms(2000))
            .validate()
            .expect("--ttl 2s alone is valid");
    }

    #[test]
    fn rejects_with_numbers() {
        let mut c = LeaseConfig::with_ttl(ms(2000));
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
        let mut c = LeaseConfig::with_ttl(ms(1000));
        c.renew_every = ms(450);
        let err = c.validate().expect_err("900ms ≥ 890ms").to_string();
        assert!(err.contains("= 445ms"), "{err}");
        c.renew_every = ms(444);
        c.validate().expect("888ms < 890ms");
        let mut c = LeaseConfig::with_ttl(ms(100));
        let err = c.validate().expect_err("no validity").to_string();
        assert!(err.contains("is not positive"), "{err}");
        assert!(err.contains(RENEWAL_RULE), "{err}");
        c.renew_every = ms(1);
        assert!(
            c.validate().is_err(),
            "TTL 100ms leaves no time after the skew"
        );
        assert!(LeaseConfig::with_ttl(Duration::ZERO).validate().is_err());
        let mut c = LeaseConfig::with_ttl(ms(2000));
        c.renew_every = Duration::ZERO;
        assert!(c.validate().is_err());
        for drift in [-0.1, 0.5, f64::NAN, f64::INFINITY] {
            let mut c = LeaseConfig::with_ttl(ms(2000));
            c.drift = drift;
            assert!(c.validate().is_err(), "drift {drift}");
        }
    }

    #[test]
    fn deadline_uses_drift_and_skew() {
        let c = LeaseConfig::with_ttl(ms(10_000));
        let sent = Instant::now();
        // 10s * 0.99 - 100ms = 9.8s
        assert_eq!(c.deadline(sent, ms(10_000)), Some(sent + ms(9_800)));
        assert_eq!(c.validity(ms(100)), None);
    }

    #[test]
    fn renew_period_shrinks_when_store_grants_less() {
        let c = LeaseConfig::with_ttl(ms(3000));
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

        #[test]
        fn later_send_never_gives_earlier_deadline(
            ttl_ms in 300u64..100_000, gap_ms in 0u64..10_000,
        ) {
            let c = LeaseConfig::with_ttl(ms(ttl_ms));
            let t0 = Instant::now();
            let a = c.deadline(t0, c.ttl);
            let b = c.deadline(t0 + ms(gap_ms), c.ttl);
            prop_assert!(a <= b);
        }
    }
}
