//! The elector's notion of time, injectable so that its decisions can run
//! under simulated time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use tokio::time::Instant;

/// A monotonic clock the elector reads and sleeps on.
///
/// Deadlines are only ever computed from this clock (DESIGN rule 3): never
/// from wall time. A simulation can supply a clock that drifts or is skewed.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current monotonic instant.
    fn now(&self) -> Instant;

    /// Completes once [`Clock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>>;

    /// Completes after `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.sleep_until(self.now() + duration)
    }
}

/// The host's monotonic clock, through tokio's timer.
///
/// Under `tokio::time::pause()` (tokio's `test-util`) it becomes a simulated
/// clock that advances only when every task is idle, which makes elector
/// tests exact and fast.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

/// Nanoseconds on the host's `CLOCK_MONOTONIC`: the clock every process on
/// the host shares (tokio's and std's `Instant` follow it too), so values
/// from different processes can be compared. Never wall time.
pub fn host_monotonic_ns() -> i64 {
    // CLOCK_MONOTONIC cannot fail on Linux for a valid clock id; if it ever
    // did, 0 would make every SQLite session look expired (safe: nobody
    // leads).
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
        .unwrap_or(0)
}
