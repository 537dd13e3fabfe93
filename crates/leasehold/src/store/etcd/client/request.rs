//! One request over the members: the pinned member first, then the
//! others in turn on transient errors and silence, within the request's
//! time, a refused token replaced on the way.

use std::time::Duration;

use tonic::Status;

use super::{EtcdError, Link, Members, REQUEST_TIMEOUT, Reply, Verdict, humanize};

impl Members {
    /// Runs `op` on the pinned member, failing over to the next ones on
    /// transient errors and timeouts, within [`REQUEST_TIMEOUT`]. A token
    /// etcd refuses is replaced (authenticating again) and the request
    /// sent again. A TLS handshake that fails on every member ends the
    /// request at once, as does a refusal by etcd itself.
    pub(in crate::store::etcd) async fn call<T: Reply, F, Fut>(
        &self,
        what: &str,
        op: F,
    ) -> Result<T, EtcdError>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = tokio::time::Instant::now();
        let n = self.channels.len();
        let first = self.active();
        let mut last = String::new();
        let mut denied: Vec<Option<String>> = vec![None; n];
        let mut reauthentications = 0;
        // Until the request's time is up: every endpoint in turn, pausing
        // after each full round (a cluster electing a new leader answers
        // "no leader" at once for about an election timeout).
        let mut pause = Duration::from_millis(25);
        let mut attempt = 0;
        loop {
            let i = (first + attempt) % n;
            if attempt > 0 && i == first {
                tokio::time::sleep(pause.min(REQUEST_TIMEOUT.saturating_sub(started.elapsed())))
                    .await;
                pause = (pause * 2).min(Duration::from_millis(400));
            }
            let left = REQUEST_TIMEOUT.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let verdict = match self
                .attempt(what, i, left, &op, &mut reauthentications)
                .await?
            {
                Attempt::Answered(reply) => return Ok(reply),
                // The same endpoint again, with a new token.
                Attempt::Again => continue,
                Attempt::Failed(verdict) => verdict,
            };
            last = next_member(verdict, &mut denied[..], i, what)?;
            tracing::debug!(what, endpoint = %self.endpoints[i], %last, "etcd request failed; trying the next endpoint");
            attempt += 1;
        }
        Err(EtcdError::Unreachable {
            what: what.to_owned(),
            last,
        })
    }

    /// One attempt of `op` on member `i`, for up to `left`; a token etcd
    /// refuses is replaced, at most twice a request.
    async fn attempt<T: Reply, F, Fut>(
        &self,
        what: &str,
        i: usize,
        left: Duration,
        op: &F,
        reauthentications: &mut u32,
    ) -> Result<Attempt<T>, EtcdError>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let outcome = self
            .patiently(i, left, async {
                let link = self.link_to(i).await?;
                Ok((op(link.clone()).await, link))
            })
            .await;
        Ok(Attempt::Failed(match outcome {
            Ok(Ok((Ok(reply), _))) => {
                let reply = reply.into_inner();
                self.one_cluster(i, reply.cluster_id())?;
                self.answered(i);
                self.pin(i);
                return Ok(Attempt::Answered(reply));
            }
            Ok(Ok((Err(status), link))) => match self.judge(&status, i) {
                Verdict::Reauthenticate if *reauthentications < 2 => {
                    tracing::debug!(what, "etcd refused the token; authenticating again");
                    self.token_refused(&link);
                    *reauthentications += 1;
                    return Ok(Attempt::Again);
                }
                verdict => verdict,
            },
            Ok(Err(verdict)) => verdict,
            Err(waited) => {
                self.silent(i);
                Verdict::Transient(format!(
                    "{}: no answer within {}",
                    self.endpoints[i],
                    humanize(waited)
                ))
            }
        }))
    }
}

/// How one attempt of a request ended.
enum Attempt<T> {
    Answered(T),
    /// A refused token was replaced: the same endpoint again.
    Again,
    Failed(Verdict),
}

/// Whether a request that failed on member `i` with `verdict` goes on to
/// the next member (with the line to report if none answers), or fails:
/// a refusal that is not about this member, or TLS refused by every
/// member (`denied` keeps, per member, its last TLS refusal).
fn next_member(
    verdict: Verdict,
    denied: &mut [Option<String>],
    i: usize,
    what: &str,
) -> Result<String, EtcdError> {
    match verdict {
        Verdict::Transient(line) => {
            denied[i] = None;
            Ok(line)
        }
        Verdict::TlsDenied(line) => {
            denied[i] = Some(line.clone());
            if denied.iter().all(Option::is_some) {
                return Err(EtcdError::Denied(line));
            }
            Ok(line)
        }
        other => Err(other.into_error(what)),
    }
}
