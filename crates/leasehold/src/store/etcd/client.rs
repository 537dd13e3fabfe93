//! The gRPC side of the etcd store: one connection per cluster member, the
//! pinned member and failover between them, and the two streams leasehold
//! keeps open (a lease's keep-alives and a watch).
//!
//! The messages and client stubs are generated from `proto/etcd.proto` and
//! checked in (see that file), so building needs no protobuf compiler.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::connect::{ConnectFailure, Connector, explain, refused_alert, rustls_error_in};
use super::pb;
use crate::error::{Error, Result};
use crate::store::security::Security;

mod request;

/// How long one request may take, over every endpoint tried, before the
/// store counts as unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one attempt on one endpoint may take before the next is tried.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(750);
/// How long a connection may carry nothing before an HTTP/2 ping asks
/// whether the member still answers. etcd refuses pings closer together
/// than its `--grpc-keepalive-min-time` (5 s unless set): after a few, it
/// closes the connection, and with it the watch stream that every wait
/// of the handle shares, so that every wait read the store again. Pings
/// a second apart did that to a process whose renewals were 5 s apart
/// (the default TTL), every renewal period.
const PING_AFTER: Duration = Duration::from_secs(6);
/// How long a ping may go unanswered before the connection counts as lost.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// etcd or its TLS refused this client: [`Error::Denied`], one line.
    Denied(String),
    /// etcd answered `permission denied`: [`Error::Denied`], one line.
    PermissionDenied(String),
    /// A TLS file is missing or unusable: [`Error::InvalidInput`].
    Invalid {
        /// What was invalid.
        what: &'static str,
        /// Why, naming the option and the file.
        reason: String,
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
            EtcdError::Denied(line) | EtcdError::PermissionDenied(line) => {
                return Error::Denied(line);
            }
            EtcdError::Invalid { what, reason } => return Error::InvalidInput { what, reason },
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
    /// When each member last answered a request, in milliseconds since
    /// `epoch`, plus one (0: never).
    answered: Vec<AtomicU64>,
    epoch: tokio::time::Instant,
    /// How often each member was left for silence (a request it did not
    /// answer, nor any other, within [`ATTEMPT_TIMEOUT`]); the channel
    /// changes at each such silence and each move of the pin, and the
    /// watch stream then leaves a silent member once the pin has moved on
    /// to another.
    silences: Vec<AtomicU64>,
    silenced: tokio::sync::watch::Sender<()>,
    /// How often the watch stream was moved off a silent member.
    streams_moved: AtomicU64,
    security: Arc<Security>,
    /// `{prefix}/`, for messages.
    scope: String,
    /// With a user name and password: the token etcd gave for them.
    auth: Option<Auth>,
    /// The id of the cluster whose members answered (0: none yet).
    cluster: AtomicU64,
}

/// A reply of etcd's, which names the cluster that made it.
pub(super) trait Reply {
    /// The cluster's id (0 where the reply has no header).
    fn cluster_id(&self) -> u64;
}

macro_rules! replies {
    ($($reply:ty),* $(,)?) => {
        $(impl Reply for $reply {
            fn cluster_id(&self) -> u64 {
                self.header.as_ref().map_or(0, |h| h.cluster_id)
            }
        })*
    };
}

replies!(
    pb::RangeResponse,
    pb::TxnResponse,
    pb::LeaseGrantResponse,
    pb::LeaseRevokeResponse,
    pb::LeaseTimeToLiveResponse,
);

/// etcd's password authentication: `Auth/Authenticate` gives a token that
/// every request then carries (metadata `token`). etcd forgets a token it
/// has not seen for `--auth-token-ttl` (300 s by default) and answers
/// `invalid auth token`; the store then authenticates again, reading a
/// `password_file` anew. Without a password (a client certificate only),
/// nothing is sent: etcd takes the certificate's common name as the user
/// (`--client-cert-auth`).
struct Auth {
    user: String,
    /// `None`: not authenticated yet (or the token was refused);
    /// `Some(None)`: etcd has authentication off, requests go without.
    token: std::sync::Mutex<Option<Option<AsciiMetadataValue>>>,
    /// One authentication at a time.
    authenticating: tokio::sync::Mutex<()>,
    /// How many tokens etcd gave, for tests and diagnostics.
    count: AtomicU64,
}

impl Auth {
    fn current(&self) -> Option<Option<AsciiMetadataValue>> {
        self.token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, token: Option<Option<AsciiMetadataValue>>) {
        *self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = token;
    }

    /// Forgets `used` if it is still the current token (another request
    /// may have replaced it already).
    fn refused(&self, used: Option<&AsciiMetadataValue>) {
        let mut token = self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if token.as_ref().is_some_and(|t| t.as_ref() == used) {
            *token = None;
        }
    }
}

/// A member's connection and the token to send on it.
#[derive(Clone)]
pub(super) struct Link {
    channel: Channel,
    token: Option<AsciiMetadataValue>,
}

impl Link {
    pub(super) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Wraps a message in a request that carries the token, and that a
    /// member without a raft leader refuses (etcd's `hasleader`
    /// metadata), so that a partitioned member cannot serve stale reads or
    /// keep a watch open that will never fire.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        metadata.insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        if let Some(token) = &self.token {
            metadata.insert("token", token.clone());
        }
        request
    }
}

/// What a failed request says about what to do next.
enum Verdict {
    /// Worth another endpoint (down, partitioned, no leader); described.
    Transient(String),
    /// The TLS handshake with this member failed: another may still take
    /// this client (a rotation in progress); one line.
    TlsDenied(String),
    /// etcd (the cluster, not one member) refused this client.
    Denied(String),
    /// etcd answered `permission denied`.
    PermissionDenied(String),
    /// A TLS file is unusable.
    Invalid(&'static str, String),
    /// etcd did not take the token: authenticate again.
    Reauthenticate,
    /// Any other answer of etcd's.
    Refused(Status),
}

impl Members {
    /// Prepares a connection to each `host:port`; connecting is lazy, so a
    /// member that is down now does not stop the store from opening. Every
    /// connection and reconnection goes through a [`Connector`], which
    /// reads the TLS files anew. `scope` is `{prefix}/`, for messages.
    pub(super) fn new(endpoints: &[String], security: &Security, scope: &str) -> Result<Self> {
        let security = Arc::new(security.clone());
        let mut channels = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let connector = Connector::new(Arc::clone(&security));
            let channel = Endpoint::from_shared(format!("http://{endpoint}"))
                .map_err(|_| {
                    Error::invalid("etcd endpoint", format!("{endpoint:?} is not host:port"))
                })?
                .connect_timeout(Duration::from_secs(1))
                .http2_keep_alive_interval(PING_AFTER)
                .keep_alive_timeout(PING_TIMEOUT)
                .keep_alive_while_idle(true)
                .connect_with_connector_lazy(tower::service_fn(move |uri| {
                    connector.clone().connect(uri)
                }));
            channels.push(channel);
        }
        let auth = match (&security.user, &security.password) {
            (Some(user), Some(_)) => Some(Auth {
                user: user.clone(),
                token: std::sync::Mutex::new(None),
                authenticating: tokio::sync::Mutex::new(()),
                count: AtomicU64::new(0),
            }),
            _ => None,
        };
        Ok(Members {
            endpoints: endpoints.to_vec(),
            channels,
            active: AtomicUsize::new(0),
            answered: endpoints.iter().map(|_| AtomicU64::new(0)).collect(),
            epoch: tokio::time::Instant::now(),
            silences: endpoints.iter().map(|_| AtomicU64::new(0)).collect(),
            silenced: tokio::sync::watch::Sender::new(()),
            streams_moved: AtomicU64::new(0),
            security,
            scope: scope.to_owned(),
            auth,
            cluster: AtomicU64::new(0),
        })
    }

    /// How many tokens etcd gave this store's connections.
    pub(super) fn authentications(&self) -> u64 {
        self.auth
            .as_ref()
            .map_or(0, |auth| auth.count.load(Ordering::Relaxed))
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

    /// Member `i` answered a request just now.
    pub(super) fn answered(&self, i: usize) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.answered[i].fetch_max(now.saturating_add(1), Ordering::Relaxed);
    }

    /// Member `i` answered nothing for an attempt's time: requests leave
    /// it, and a watch stream on it follows once another member answers.
    pub(super) fn silent(&self, i: usize) {
        self.silences[i].fetch_add(1, Ordering::Relaxed);
        self.silenced.send_replace(());
    }

    /// How often member `i` was left for silence.
    pub(super) fn silences(&self, i: usize) -> u64 {
        self.silences[i].load(Ordering::Relaxed)
    }

    /// Changes whenever a member is left for silence or the pin moves.
    pub(super) fn silenced(&self) -> tokio::sync::watch::Receiver<()> {
        self.silenced.subscribe()
    }

    /// The watch stream left a silent member.
    pub(super) fn stream_moved(&self) {
        self.streams_moved.fetch_add(1, Ordering::Relaxed);
    }

    /// How often the watch stream left a silent member.
    pub(super) fn streams_moved(&self) -> u64 {
        self.streams_moved.load(Ordering::Relaxed)
    }

    /// Whether member `i` answered any request at or after `since`.
    pub(super) fn answered_since(&self, i: usize, since: tokio::time::Instant) -> bool {
        let since = u64::try_from(since.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX);
        self.answered[i].load(Ordering::Relaxed) > since
    }

    /// Waits for `reply` from member `i` for up to `limit`. It is given up
    /// after [`ATTEMPT_TIMEOUT`] without an answer, unless the member
    /// answered other requests meanwhile: a member that answers is busy,
    /// not gone, and sending the request to another one as well would
    /// only add to the load that slows it (each grant or write sent again
    /// is one more entry for the cluster to agree on). With one member
    /// there is no other to turn to, and it is waited for up to `limit`.
    /// When given up, `Err` with how long it waited.
    pub(super) async fn patiently<T>(
        &self,
        i: usize,
        limit: Duration,
        reply: impl Future<Output = T>,
    ) -> Result<T, Duration> {
        let started = tokio::time::Instant::now();
        let deadline = started + limit;
        tokio::pin!(reply);
        loop {
            let window = tokio::time::Instant::now();
            let wait = ATTEMPT_TIMEOUT.min(deadline.saturating_duration_since(window));
            match tokio::time::timeout(wait, &mut reply).await {
                Ok(answer) => return Ok(answer),
                Err(_)
                    if (self.channels.len() == 1 || self.answered_since(i, window))
                        && tokio::time::Instant::now() < deadline => {}
                Err(_) => return Err(started.elapsed()),
            }
        }
    }

    /// The index of the member `offset` after the pinned one.
    pub(super) fn member(&self, offset: usize) -> usize {
        (self.active() + offset) % self.channels.len()
    }

    /// Moves the pin to the member after the current one.
    pub(super) fn skip_active(&self) {
        self.pin((self.active() + 1) % self.channels.len());
    }

    /// Pins member `i`; a watch stream on a silent member it left learns
    /// of the move.
    fn pin(&self, i: usize) {
        if self.active.swap(i, Ordering::Relaxed) != i {
            self.silenced.send_replace(());
        }
    }

    /// Member `i`'s connection, with a token.
    pub(super) async fn link_of(&self, i: usize) -> Result<Link, EtcdError> {
        self.link_to(i)
            .await
            .map_err(|verdict| verdict.into_error("authenticate"))
    }

    /// Member `i`'s connection, with a token (authenticating on that
    /// member first if there is none).
    async fn link_to(&self, i: usize) -> Result<Link, Verdict> {
        let channel = self.channels[i].clone();
        let Some(auth) = &self.auth else {
            return Ok(Link {
                channel,
                token: None,
            });
        };
        if let Some(token) = auth.current() {
            return Ok(Link { channel, token });
        }
        let _one = auth.authenticating.lock().await;
        if let Some(token) = auth.current() {
            return Ok(Link { channel, token });
        }
        let token = self.authenticate(auth, i).await?;
        auth.set(Some(token.clone()));
        Ok(Link { channel, token })
    }

    /// `Auth/Authenticate` on member `i`, the password read now. `None`
    /// when etcd has authentication off.
    async fn authenticate(
        &self,
        auth: &Auth,
        i: usize,
    ) -> Result<Option<AsciiMetadataValue>, Verdict> {
        let Some((name, password)) = self.security.credentials().map_err(|e| match e {
            Error::InvalidInput { what, reason } => Verdict::Invalid(what, reason),
            other => Verdict::Invalid("password", other.to_string()),
        })?
        else {
            return Ok(None);
        };
        let request = pb::AuthenticateRequest {
            name,
            password: password.expose().to_owned(),
        };
        // etcd checks the password with bcrypt, which a busy member takes
        // long over; asking again would only start the work again. A
        // request's own patience (`patiently`) still leaves a member that
        // answers nothing after [`ATTEMPT_TIMEOUT`].
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            pb::auth_client::AuthClient::new(self.channels[i].clone())
                .authenticate(tonic::Request::new(request)),
        )
        .await;
        let status = match answer {
            Err(_) => {
                return Err(Verdict::Transient(format!(
                    "{}: no answer within {}",
                    self.endpoints[i],
                    humanize(REQUEST_TIMEOUT)
                )));
            }
            Ok(Ok(reply)) => {
                let token = reply.into_inner().token;
                auth.count.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(user = %auth.user, endpoint = %self.endpoints[i], "authenticated to etcd");
                return AsciiMetadataValue::try_from(token.as_str())
                    .map(Some)
                    .map_err(|_| Verdict::Denied("etcd gave a token that is not text".into()));
            }
            Ok(Err(status)) => status,
        };
        self.authentication_refused(auth, status, i)
    }

    /// What etcd's refusal of an authentication comes to: none needed
    /// (authentication is off), or the verdict.
    fn authentication_refused(
        &self,
        auth: &Auth,
        status: Status,
        i: usize,
    ) -> Result<Option<AsciiMetadataValue>, Verdict> {
        if status.code() == Code::FailedPrecondition
            && status.message().contains("authentication is not enabled")
        {
            tracing::warn!(user = %auth.user, "etcd has authentication off; the password is not used");
            return Ok(None);
        }
        if status.message().contains("authentication failed") {
            return Err(Verdict::Denied(format!(
                "authentication failed for user {:?}",
                auth.user
            )));
        }
        Err(match self.judge(&status, i) {
            // Authenticate carries no token: a refusal is not about one.
            Verdict::Reauthenticate => Verdict::Refused(status),
            verdict => verdict,
        })
    }

    /// Forgets the token `link` carried, which etcd refused.
    pub(super) fn token_refused(&self, link: &Link) {
        if let Some(auth) = &self.auth {
            auth.refused(link.token.as_ref());
        }
    }

    /// What `status`, an answer of member `i`, says about what to do.
    fn judge(&self, status: &Status, i: usize) -> Verdict {
        if let Some(verdict) = self.connection_refused(status, i) {
            return verdict;
        }
        let message = status.message();
        match status.code() {
            Code::Unauthenticated => return self.reauthenticate_or(message),
            Code::InvalidArgument
                if message.contains("user name is empty")
                    || message.contains("revision of auth store is old") =>
            {
                return self.reauthenticate_or(message);
            }
            Code::InvalidArgument if message.contains("authentication failed") => {
                return Verdict::Denied(match &self.security.user {
                    Some(user) => format!("authentication failed for user {user:?}"),
                    None => "authentication failed".to_owned(),
                });
            }
            Code::PermissionDenied => {
                return Verdict::PermissionDenied(match &self.security.user {
                    Some(user) => format!("permission denied on {} for user {user:?}", self.scope),
                    None => format!("permission denied on {}", self.scope),
                });
            }
            _ => {}
        }
        if is_transient(status) {
            Verdict::Transient(format!("{}: {}", self.endpoints[i], describe(status)))
        } else {
            Verdict::Refused(status.clone())
        }
    }

    /// The verdict on a failure to connect to member `i` at all, from the
    /// causes under `status`: files that cannot be used, or TLS refused
    /// (either side).
    fn connection_refused(&self, status: &Status, i: usize) -> Option<Verdict> {
        let host = self.endpoints[i]
            .rsplit_once(':')
            .map_or(self.endpoints[i].as_str(), |(host, _)| host);
        let mut cause: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(status);
        while let Some(error) = cause {
            if let Some(failure) = error.downcast_ref::<ConnectFailure>() {
                match failure {
                    ConnectFailure::Files { what, reason } => {
                        return Some(Verdict::Invalid(what, reason.clone()));
                    }
                    ConnectFailure::Tls(line) => return Some(Verdict::TlsDenied(line.clone())),
                    ConnectFailure::Io(_) => {}
                }
            }
            let tls = error
                .downcast_ref::<std::io::Error>()
                .and_then(rustls_error_in)
                .or_else(|| error.downcast_ref::<rustls::Error>());
            if let Some(tls) = tls {
                return Some(Verdict::TlsDenied(explain(tls, &self.security, host)));
            }
            // After a TLS 1.3 handshake, the server's refusal of this
            // client's certificate arrives with the first read, and HTTP/2
            // keeps only the text of the I/O error.
            let text = error.to_string();
            if let Some((_, alert)) = text.split_once("received fatal alert: ") {
                let alert = alert
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap_or("");
                return Some(Verdict::TlsDenied(refused_alert(
                    alert,
                    &self.security,
                    host,
                )));
            }
            cause = error.source();
        }
        None
    }

    /// etcd wants a (new) token: authenticate again if there is a
    /// password; otherwise the client is not known to etcd.
    fn reauthenticate_or(&self, message: &str) -> Verdict {
        if self.auth.is_some() {
            return Verdict::Reauthenticate;
        }
        let why = message.trim_start_matches("etcdserver: ");
        Verdict::Denied(format!(
            "etcd requires authentication ({why}): give USER:PASSWORD@ in the URL, \
             or a client certificate (cert=, key=) whose common name is an etcd user"
        ))
    }

    /// Refuses a reply of member `i` made by another cluster than the
    /// members that answered before: endpoints of two clusters in one URL
    /// would grant from two histories, and a failover would take tokens
    /// back (found by a review: token 5 after token 648).
    pub(super) fn one_cluster(&self, i: usize, id: u64) -> Result<(), EtcdError> {
        if id == 0 {
            return Ok(());
        }
        match self
            .cluster
            .compare_exchange(0, id, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => Ok(()),
            Err(known) if known == id => Ok(()),
            Err(known) => Err(EtcdError::Invalid {
                what: "store URL",
                reason: format!(
                    "endpoint {} belongs to another etcd cluster (id {id:x}) than the endpoints \
                     that answered before (id {known:x}); list the members of one cluster",
                    self.endpoints[i]
                ),
            }),
        }
    }
}

impl Verdict {
    fn into_error(self, what: &str) -> EtcdError {
        match self {
            Verdict::Transient(last) => EtcdError::Unreachable {
                what: what.to_owned(),
                last,
            },
            Verdict::TlsDenied(line) | Verdict::Denied(line) => EtcdError::Denied(line),
            Verdict::PermissionDenied(line) => EtcdError::PermissionDenied(line),
            Verdict::Invalid(what, reason) => EtcdError::Invalid { what, reason },
            Verdict::Reauthenticate => EtcdError::Denied(format!(
                "etcd keeps refusing the token it gives (during {what})"
            )),
            Verdict::Refused(status) => EtcdError::Refused {
                what: what.to_owned(),
                status,
            },
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply is awaited past one attempt's time only while its member
    /// answers other requests (busy, not gone), and never past the limit;
    /// another member's answers do not count.
    #[tokio::test(start_paused = true)]
    async fn a_busy_member_is_waited_for_and_a_silent_one_is_not() {
        let endpoints = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let members =
            Arc::new(Members::new(&endpoints, &Security::none(), "/t/").expect("members"));
        let slow = || tokio::time::sleep(Duration::from_secs(2));

        assert_eq!(
            members.patiently(0, REQUEST_TIMEOUT, slow()).await,
            Err(ATTEMPT_TIMEOUT),
            "a silent member is given up after one attempt"
        );

        let answering = |i: usize| {
            let members = Arc::clone(&members);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    members.answered(i);
                }
            })
        };
        let other = answering(1);
        assert_eq!(
            members.patiently(0, REQUEST_TIMEOUT, slow()).await,
            Err(ATTEMPT_TIMEOUT),
            "another member's answers made this one look busy"
        );
        other.abort();

        let busy = answering(0);
        assert_eq!(
            members.patiently(0, REQUEST_TIMEOUT, slow()).await,
            Ok(()),
            "a busy member's slow reply was given up"
        );
        assert_eq!(
            members
                .patiently(
                    0,
                    REQUEST_TIMEOUT,
                    tokio::time::sleep(Duration::from_secs(10))
                )
                .await,
            Err(REQUEST_TIMEOUT),
            "waited past the limit"
        );
        busy.abort();
    }

    /// With one member there is no other to try: a slow reply is waited
    /// for up to the limit, not given up and asked for again.
    #[tokio::test(start_paused = true)]
    async fn the_only_member_is_waited_for_up_to_the_limit() {
        let members =
            Members::new(&["127.0.0.1:1".to_owned()], &Security::none(), "/t/").expect("members");
        assert_eq!(
            members
                .patiently(
                    0,
                    REQUEST_TIMEOUT,
                    tokio::time::sleep(Duration::from_secs(2))
                )
                .await,
            Ok(()),
            "the only member's slow reply was given up"
        );
        assert_eq!(
            members
                .patiently(
                    0,
                    REQUEST_TIMEOUT,
                    tokio::time::sleep(Duration::from_secs(10))
                )
                .await,
            Err(REQUEST_TIMEOUT),
            "waited past the limit"
        );
    }
}
