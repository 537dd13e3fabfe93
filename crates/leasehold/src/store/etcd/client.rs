//! The gRPC side of the etcd store: one connection per cluster member, the
//! pinned member and failover between them, and the two streams leasehold
//! keeps open (a lease's keep-alives and a watch).
//!
//! The messages and client stubs are generated from `proto/etcd.proto` and
//! checked in (see that file), so building needs no protobuf compiler.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use super::pb;
use crate::error::{Error, Result};

/// How long one request may take, over every endpoint tried, before the
/// store counts as unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one attempt on one endpoint may take before the next is tried.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(750);

/// An etcd request that failed, kept with etcd's gRPC status where etcd
/// refused it, so that callers tell its answers apart by code; as an
/// [`Error`] it is [`Error::Unavailable`], naming the request.
#[derive(Debug)]
pub(super) enum EtcdError {
    /// etcd answered with an error that another endpoint would answer too.
    Refused {
        /// The request, for messages.
        what: String,
        /// etcd's answer.
        status: Status,
    },
    /// No endpoint answered in time, or each failed as a member that is
    /// down, partitioned or without a leader does.
    Unreachable {
        /// The request, for messages.
        what: String,
        /// How the last endpoint tried failed.
        last: String,
    },
}

impl EtcdError {
    /// Whether etcd refused the request because the lease is gone (the
    /// session expired or was revoked).
    pub(super) fn is_lease_not_found(&self) -> bool {
        matches!(self, EtcdError::Refused { status, .. } if lease_not_found(status))
    }
}

impl From<EtcdError> for Error {
    fn from(error: EtcdError) -> Self {
        let reason = match error {
            EtcdError::Refused { what, status } => {
                format!("etcd {what} failed: {}", describe(&status))
            }
            EtcdError::Unreachable { what, last } => {
                format!("etcd {what} failed on every endpoint (last: {last})")
            }
        };
        Error::Unavailable {
            reason,
            source: None,
        }
    }
}

/// Whether `status` says that the lease a request named is gone. etcd
/// answers `NOT_FOUND` (`etcdserver: requested lease not found`) for that
/// alone among the lease and key-value requests leasehold makes.
pub(super) fn lease_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound
}

/// One connection per endpoint, and which one answered last.
pub(super) struct Members {
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    active: AtomicUsize,
}

/// Wraps a message in a request that a member without a raft leader
/// refuses (etcd's `hasleader` metadata), so that a partitioned member
/// cannot serve stale reads or keep a watch open that will never fire.
pub(super) fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    request
}

impl Members {
    /// Prepares a connection to each `host:port`; connecting is lazy, so a
    /// member that is down now does not stop the store from opening.
    pub(super) fn new(endpoints: &[String]) -> Result<Self> {
        let mut channels = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let channel = Endpoint::from_shared(format!("http://{endpoint}"))
                .map_err(|_| {
                    Error::invalid("etcd endpoint", format!("{endpoint:?} is not host:port"))
                })?
                .connect_timeout(Duration::from_secs(1))
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(1))
                .keep_alive_while_idle(true)
                .connect_lazy();
            channels.push(channel);
        }
        Ok(Members {
            endpoints: endpoints.to_vec(),
            channels,
            active: AtomicUsize::new(0),
        })
    }

    /// `host:port` of every member, for messages.
    pub(super) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub(super) fn len(&self) -> usize {
        self.channels.len()
    }

    pub(super) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed) % self.channels.len()
    }

    /// Moves the pin to the member after the current one.
    pub(super) fn skip_active(&self) {
        self.active
            .store((self.active() + 1) % self.channels.len(), Ordering::Relaxed);
    }

    /// The connection `offset` members after the pinned one.
    pub(super) fn channel(&self, offset: usize) -> Channel {
        self.channels[(self.active() + offset) % self.channels.len()].clone()
    }

    /// Runs `op` on the pinned member, failing over to the next ones on
    /// transient errors and timeouts, within [`REQUEST_TIMEOUT`].
    pub(super) async fn call<T, F, Fut>(&self, what: &str, op: F) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = tokio::time::Instant::now();
        let first = self.active();
        let mut last = String::new();
        // Until the request's time is up: every endpoint in turn, pausing
        // after each full round (a cluster electing a new leader answers
        // "no leader" at once for about an election timeout).
        let mut pause = Duration::from_millis(25);
        for attempt in 0.. {
            let i = (first + attempt) % self.channels.len();
            if attempt > 0 && i == first {
                tokio::time::sleep(pause.min(REQUEST_TIMEOUT.saturating_sub(started.elapsed())))
                    .await;
                pause = (pause * 2).min(Duration::from_millis(400));
            }
            let left = REQUEST_TIMEOUT.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(ATTEMPT_TIMEOUT.min(left), op(self.channels[i].clone()))
                .await
            {
                Ok(Ok(reply)) => {
                    self.active.store(i, Ordering::Relaxed);
                    return Ok(reply.into_inner());
                }
                Ok(Err(status)) if !is_transient(&status) => {
                    return Err(EtcdError::Refused {
                        what: what.to_owned(),
                        status,
                    });
                }
                Ok(Err(status)) => last = format!("{}: {}", self.endpoints[i], describe(&status)),
                Err(_) => {
                    last = format!(
                        "{}: no answer within {}",
                        self.endpoints[i],
                        humanize(ATTEMPT_TIMEOUT.min(left))
                    );
                }
            }
            tracing::debug!(what, endpoint = %self.endpoints[i], %last, "etcd request failed; trying the next endpoint");
        }
        Err(EtcdError::Unreachable {
            what: what.to_owned(),
            last,
        })
    }
}

fn humanize(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Errors worth another endpoint: the member is down, partitioned, or
/// without a leader.
fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Cancelled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Unavailable
    )
}

/// One line: etcd's own message (`etcdserver: requested lease not found`),
/// then each cause the transport gives that it does not already say
/// (`tcp connect error: Connection refused (os error 111)`); never Debug
/// output.
pub(super) fn describe(status: &Status) -> String {
    let mut line = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        let text = error.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = error.source();
    }
    if line.is_empty() {
        line = status.code().description().to_owned();
    }
    line
}

/// One past the last key that starts with `prefix` (etcd's prefix range).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

/// A lease's keep-alive stream: requests go out on `requests`, replies come
/// back on `replies`, one for one.
pub(super) struct KeepAlive {
    id: i64,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    replies: Streaming<pb::LeaseKeepAliveResponse>,
    /// The request sent with the stream's opening awaits its reply.
    primed: bool,
}

impl KeepAlive {
    /// Opens the stream for lease `id`. The first request goes out with the
    /// opening: etcd answers the call only once it has one to answer.
    pub(super) async fn open(channel: Channel, id: i64) -> Result<Self, Status> {
        let (requests, outgoing) = mpsc::channel(1);
        // The channel has room for this one request and its receiver is alive.
        let _ = requests.try_send(pb::LeaseKeepAliveRequest { id });
        let replies = pb::lease_client::LeaseClient::new(channel)
            .lease_keep_alive(request(ReceiverStream::new(outgoing)))
            .await?
            .into_inner();
        Ok(KeepAlive {
            id,
            requests,
            replies,
            primed: true,
        })
    }

    /// One round trip; the TTL etcd reports (0 or less: the lease is gone),
    /// or `None` if the stream broke.
    pub(super) async fn once(&mut self) -> Option<i64> {
        if !std::mem::take(&mut self.primed) {
            self.requests
                .send(pb::LeaseKeepAliveRequest { id: self.id })
                .await
                .ok()?;
        }
        match self.replies.message().await {
            Ok(Some(reply)) => Some(reply.ttl),
            Ok(None) | Err(_) => None,
        }
    }
}

/// A watch on a key or a prefix from a revision on. Dropping it ends the
/// watch (the request stream closes).
pub(super) struct Watch {
    _requests: mpsc::Sender<pb::WatchRequest>,
    events: Streaming<pb::WatchResponse>,
}

impl Watch {
    pub(super) async fn open(
        channel: Channel,
        key: Vec<u8>,
        range_end: Vec<u8>,
        start_revision: i64,
    ) -> Result<Self, Status> {
        let (requests, outgoing) = mpsc::channel(1);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision,
                    progress_notify: false,
                },
            )),
        };
        // The channel has room for the one request; it cannot be closed yet.
        let _ = requests.try_send(create);
        let events = pb::watch_client::WatchClient::new(channel)
            .watch(request(ReceiverStream::new(outgoing)))
            .await?
            .into_inner();
        Ok(Watch {
            _requests: requests,
            events,
        })
    }

    /// The next reply that carries events; `None` when the watch was
    /// cancelled, compacted away or broke (the caller re-reads).
    pub(super) async fn changed(&mut self) -> Option<Vec<pb::Event>> {
        loop {
            match self.events.message().await {
                Ok(Some(reply)) if reply.canceled || reply.compact_revision > 0 => return None,
                Ok(Some(reply)) if reply.events.is_empty() => {}
                Ok(Some(reply)) => return Some(reply.events),
                Ok(None) | Err(_) => return None,
            }
        }
    }
}
