//! Simulated clocks over tokio's paused time ("real" simulated time).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use leasehold::clock::{Clock, Instant};

/// A candidate's clock: starts in step with real time and runs at `rate`
/// (below 1.0 = slow). The elector's deadlines are computed on it.
#[derive(Debug)]
pub struct DriftingClock {
    origin: Instant,
    rate: f64,
}

impl DriftingClock {
    pub fn new(rate: f64) -> Self {
        DriftingClock {
            origin: Instant::now(),
            rate,
        }
    }

    /// The real instant at which this clock reads `local`, or a moment
    /// after: rounded up, so that a sleep until it ends with
    /// [`Clock::now`] at or past `local` (the `Clock` contract), never a
    /// nanosecond short.
    pub fn to_real(&self, local: Instant) -> Instant {
        let elapsed = local.saturating_duration_since(self.origin);
        self.origin + elapsed.div_f64(self.rate) + Duration::from_micros(1)
    }
}

impl Clock for DriftingClock {
    fn now(&self) -> Instant {
        let real = Instant::now().saturating_duration_since(self.origin);
        self.origin + real.mul_f64(self.rate)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(self.to_real(deadline)))
    }
}

/// The store's clock: real time plus an offset that can jump forward, as a
/// server's clock does when it is stepped. A forward jump makes every
/// session expire early by that much.
pub struct StoreClock {
    offset: Mutex<Duration>,
}

impl fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClock").finish_non_exhaustive()
    }
}

impl StoreClock {
    pub fn new() -> Self {
        StoreClock {
            offset: Mutex::new(Duration::ZERO),
        }
    }

    fn offset(&self) -> Duration {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn jump(&self, by: Duration) {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner()) += by;
    }
}

impl Default for StoreClock {
    fn default() -> Self {
        StoreClock::new()
    }
}

impl Clock for StoreClock {
    fn now(&self) -> Instant {
        Instant::now() + self.offset()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // If the clock jumps while sleeping, the sleeper wakes late by at
        // most the jump; callers re-read state after waking anyway.
        let real = deadline.checked_sub(self.offset()).unwrap_or(deadline);
        Box::pin(tokio::time::sleep_until(real))
    }
}
