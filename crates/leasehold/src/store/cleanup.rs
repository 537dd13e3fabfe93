//! Cleanups that must run when a future is dropped half-way: a campaign
//! cancelled after the store may have granted or queued it (the [`Store`]
//! cancellation obligation). `Drop` cannot wait, so the cleanup is spawned
//! on the runtime of the thread that drops it.
//!
//! [`Store`]: crate::store::Store

use std::future::Future;
use std::pin::Pin;

type Cleanup<T> = Box<dyn FnOnce(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Holds a value and an async cleanup for it. Dropped while armed, it
/// spawns the cleanup with the value on the current tokio runtime (without
/// a runtime, as when the whole runtime is shutting down, the cleanup does
/// not run; the store's own expiry then ends what it would have ended).
/// [`OnDrop::disarm`] gives the value back without running the cleanup.
pub(crate) struct OnDrop<T: Send + 'static> {
    armed: Option<(T, Cleanup<T>)>,
}

impl<T: Send + 'static> OnDrop<T> {
    /// Arms `cleanup` to run with `value` if this guard is dropped.
    pub(crate) fn new<F, Fut>(value: T, cleanup: F) -> Self
    where
        F: FnOnce(T) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cleanup: Cleanup<T> = Box::new(
            move |value: T| -> Pin<Box<dyn Future<Output = ()> + Send>> {
                Box::pin(cleanup(value))
            },
        );
        OnDrop {
            armed: Some((value, cleanup)),
        }
    }

    /// Gives the value back; the cleanup will not run.
    pub(crate) fn disarm(mut self) -> T {
        match self.armed.take() {
            Some((value, _)) => value,
            None => unreachable!("an OnDrop is armed until it is consumed"),
        }
    }
}

impl<T: Send + 'static> Drop for OnDrop<T> {
    fn drop(&mut self) {
        let Some((value, cleanup)) = self.armed.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(cleanup(value));
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for OnDrop<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDrop")
            .field("armed", &self.armed.is_some())
            .finish()
    }
}

/// How long [`until_done`] keeps trying while the store is out of reach.
const GIVE_UP_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs `attempt` until it succeeds, or fails otherwise than by the store
/// being out of reach ([`Error::Unavailable`], [`Error::Timeout`]), or the
/// store stayed out of reach for ten minutes; pauses 50 ms, doubling to
/// 2 s, between tries. For a cleanup that must land though the session
/// lives on: a standby that leaves the line while its elector (and so its
/// session) lives would otherwise stay in front of every other standby.
/// Its session ends all the same once the store stays out of reach, since
/// its renewals fail too.
///
/// [`Error::Unavailable`]: crate::error::Error::Unavailable
/// [`Error::Timeout`]: crate::error::Error::Timeout
pub(crate) async fn until_done<F, Fut>(what: &'static str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::error::Result<()>>,
{
    use crate::error::Error;
    let give_up = tokio::time::Instant::now() + GIVE_UP_AFTER;
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match attempt().await {
            Ok(()) => return,
            Err(error @ (Error::Unavailable { .. } | Error::Timeout(_)))
                if tokio::time::Instant::now() < give_up =>
            {
                tracing::debug!(what, %error, "failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            Err(error) => {
                tracing::debug!(what, %error, "failed; the session's end undoes it");
                return;
            }
        }
    }
}
