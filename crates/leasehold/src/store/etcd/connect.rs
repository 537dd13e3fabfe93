//! How a connection to one etcd member is made: TCP, then TLS when the URL
//! gives a `cacert`. leasehold makes the TLS connection itself rather than
//! give tonic a fixed TLS configuration, so that the CA, certificate and
//! key files are read anew at **every** connection and reconnection: files
//! replaced on disk (a rotation) take effect at the next reconnect, with
//! no restart. tonic only sees the stream (its endpoint URI stays
//! `http://`; the HTTP/2 scheme is not checked by etcd).
//!
//! Also here: turning a TLS failure into one line naming its cause, and
//! naming a member that speaks plaintext where the URL asks for TLS, or
//! TLS where it does not. etcd (Go) closes such a connection without a
//! word either way, so after such a close the member is asked, on a
//! connection of its own, which protocol it speaks.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::Uri;

use crate::error::Error;
use crate::store::security::Security;

/// A connection's byte stream, plain or TLS.
pub(super) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// What tonic gets from [`Connector::connect`].
pub(super) type Io = TokioIo<Box<dyn Stream>>;

/// Why a connection could not be made. It travels to the caller inside
/// tonic's transport error, where [`super::client`] finds it again.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectFailure {
    /// TCP failed (refused, unreachable).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A TLS file is missing or unusable: [`Error::InvalidInput`].
    #[error("invalid {what}: {reason}")]
    Files {
        /// What was invalid.
        what: &'static str,
        /// Why, naming the option and the file.
        reason: String,
    },
    /// The TLS handshake failed, or the member speaks TLS where the URL
    /// asks for plaintext or the reverse; the line says why
    /// ([`Error::Denied`]).
    #[error("{0}")]
    Tls(String),
}

impl From<Error> for ConnectFailure {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidInput { what, reason } => ConnectFailure::Files { what, reason },
            other => ConnectFailure::Files {
                what: "TLS file",
                reason: other.to_string(),
            },
        }
    }
}

/// Makes the connections of one member.
#[derive(Clone, Debug)]
pub(super) struct Connector {
    security: Arc<Security>,
    /// A plaintext connection to this member was closed before the member
    /// answered anything, as a member serving TLS alone does: the next
    /// connection first asks the member whether it speaks TLS.
    unanswered: Arc<AtomicBool>,
}

impl Connector {
    pub(super) fn new(security: Arc<Security>) -> Self {
        Connector {
            security,
            unanswered: Arc::default(),
        }
    }

    /// Connects to `uri`'s host and port; with TLS, reads the files now.
    /// A member that speaks the other protocol (TLS or plaintext) than the
    /// URL asks for is a [`ConnectFailure::Tls`] naming the mismatch.
    pub(super) async fn connect(self, uri: Uri) -> Result<Io, ConnectFailure> {
        let host = uri
            .host()
            .ok_or_else(|| std::io::Error::other("endpoint without a host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(2379);
        let endpoint = uri
            .authority()
            .map_or_else(|| format!("{host}:{port}"), |a| a.as_str().to_owned());
        if !self.security.tls()
            && self.unanswered.swap(false, Ordering::Relaxed)
            && speaks_tls(&host, port).await
        {
            return Err(ConnectFailure::Tls(format!(
                "etcd at {endpoint} requires TLS, and the URL gives no cacert=: add \
                 cacert=PATH (the CA that signed the member's certificate) to the URL"
            )));
        }
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        if !self.security.tls() {
            return Ok(TokioIo::new(Box::new(Watched {
                inner: tcp,
                answered: false,
                unanswered: Arc::clone(&self.unanswered),
            })));
        }
        self.tls(tcp, &host, port, &endpoint).await
    }

    /// The TLS handshake on `tcp`, then the member's first bytes.
    async fn tls(
        &self,
        tcp: TcpStream,
        host: &str,
        port: u16,
        endpoint: &str,
    ) -> Result<Io, ConnectFailure> {
        let config = tls_config(&self.security)?;
        let name = ServerName::try_from(host.to_owned()).map_err(|_| ConnectFailure::Files {
            what: "etcd endpoint",
            reason: format!("{host:?} is not a host name or address TLS can verify"),
        })?;
        let tls_failure = |e: std::io::Error| match rustls_error_in(&e) {
            Some(tls) => ConnectFailure::Tls(explain(tls, &self.security, host)),
            None => ConnectFailure::Io(e),
        };
        let handshake = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await;
        let mut tls = match handshake {
            Ok(tls) => tls,
            Err(e) if not_tls_answer(&e) && answers_in_plaintext(host, port).await => {
                return Err(ConnectFailure::Tls(format!(
                    "etcd at {endpoint} does not offer TLS (it answered in plaintext), and \
                     cacert= in the URL requires it: for a plaintext member remove cacert= \
                     (and cert=, key=) from the URL"
                )));
            }
            Err(e) => return Err(tls_failure(e)),
        };
        // With TLS 1.3 the server checks this client's certificate after
        // the handshake is over here; a refusal would only show as a closed
        // connection later. etcd (Go) speaks first once it accepted the
        // client (HTTP/2 settings), so wait briefly for its first bytes:
        // an alert fails the connection now, with its cause.
        let mut first = vec![0; 4096];
        let first = match tokio::time::timeout(FIRST_BYTES, tls.read(&mut first)).await {
            Ok(Ok(0)) => {
                return Err(ConnectFailure::Tls(format!(
                    "etcd at {host} closed the connection after the TLS handshake"
                )));
            }
            Ok(Ok(n)) => {
                first.truncate(n);
                first
            }
            Ok(Err(e)) => return Err(tls_failure(e)),
            Err(_) => Vec::new(),
        };
        Ok(TokioIo::new(Box::new(Primed {
            first,
            at: 0,
            inner: tls,
        })))
    }
}

/// How long a new TLS connection waits for the server's first bytes.
const FIRST_BYTES: std::time::Duration = std::time::Duration::from_millis(500);

/// A stream whose first bytes were read already: they come first.
struct Primed<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Primed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = buf.remaining().min(self.first.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Primed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A plaintext connection that notes in `unanswered` when it is closed
/// (reset, broken pipe, end of stream) before the member sent a byte.
struct Watched {
    inner: TcpStream,
    answered: bool,
    unanswered: Arc<AtomicBool>,
}

impl Watched {
    /// Notes `error` if it closed the connection before any answer.
    fn failed<T>(&self, result: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(e)) = &result
            && !self.answered
            && closed(e.kind())
        {
            self.unanswered.store(true, Ordering::Relaxed);
        }
        result
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining());
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            if buf.filled().len() > before {
                self.answered = true;
            } else if room > 0 && !self.answered {
                self.unanswered.store(true, Ordering::Relaxed);
            }
        }
        self.failed(result)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.failed(result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.failed(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.failed(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Whether an I/O error of `kind` is the peer closing the connection.
fn closed(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(
        kind,
        BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
    )
}

/// How long asking a member which protocol it speaks may take. Asked
/// only after a connection the member closed unanswered (or answered with
/// bytes that are not TLS), so a member that is slow or down is never
/// asked: its connection times out or is refused.
const PROBE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the TLS handshake failed because the member closed the
/// connection without a word of TLS, or answered with bytes that are not
/// TLS: as a member serving plaintext does.
fn not_tls_answer(error: &std::io::Error) -> bool {
    match rustls_error_in(error) {
        Some(rustls::Error::InvalidMessage(_)) => true,
        Some(_) => false,
        None => closed(error.kind()),
    }
}

/// Whether the member at `host:port` answers HTTP/2's plaintext preface
/// with its settings (or plain HTTP/1): it serves plaintext.
async fn answers_in_plaintext(host: &str, port: u16) -> bool {
    /// The client preface and an empty SETTINGS frame.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    let Some(answer) = first_answer(host, port, PREFACE.to_vec()).await else {
        return false;
    };
    // A frame header: length (3 bytes), type 4 (SETTINGS), flags, stream 0.
    let settings = answer[3] == 4 && answer[5..9] == [0; 4];
    settings || answer.starts_with(b"HTTP/")
}

/// Whether the member at `host:port` answers a TLS ClientHello with a TLS
/// record (a ServerHello, or an alert): it speaks TLS.
async fn speaks_tls(host: &str, port: u16) -> bool {
    let Some(hello) = client_hello(host) else {
        return false;
    };
    // A record header: type 22 (handshake) or 21 (alert), version 3.x.
    matches!(
        first_answer(host, port, hello).await,
        Some([21 | 22, 3, 0..=4, ..])
    )
}

/// The first 9 bytes the member at `host:port` answers `hello` with, on a
/// connection of its own, within [`PROBE`]; `None` if it answers fewer.
async fn first_answer(host: &str, port: u16, hello: Vec<u8>) -> Option<[u8; 9]> {
    let ask = async {
        let mut tcp = TcpStream::connect((host, port)).await.ok()?;
        tcp.write_all(&hello).await.ok()?;
        let mut answer = [0; 9];
        tcp.read_exact(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(PROBE, ask).await.ok().flatten()
}

/// A TLS ClientHello for `host`, of a client that trusts nothing (it is
/// only to hear whether the member answers in TLS).
fn client_hello(host: &str) -> Option<Vec<u8>> {
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut hello = Vec::new();
    connection.write_tls(&mut hello).ok()?;
    Some(hello)
}

/// The rustls error an I/O error carries, if any.
pub(super) fn rustls_error_in(error: &std::io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The client's TLS settings, from the files as they are now. The crypto
/// provider is ring's, given explicitly (no process default is needed).
fn tls_config(security: &Security) -> Result<ClientConfig, ConnectFailure> {
    let files = |option: &str, path: Option<&std::path::Path>, why: String| {
        let shown = path.map_or_else(String::new, |p| p.display().to_string());
        ConnectFailure::Files {
            what: "TLS file",
            reason: format!("{option}={shown}: {why}"),
        }
    };
    let ca = security.read_cacert()?.unwrap_or_default();
    let cacert = security.cacert.as_deref();
    let anchors = rustls_pemfile::certs(&mut ca.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| files("cacert", cacert, format!("cannot parse: {e}")))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(anchors);
    if added == 0 {
        return Err(files(
            "cacert",
            cacert,
            "holds no usable CA certificate".into(),
        ));
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| ConnectFailure::Tls(format!("TLS setup failed: {e}")))?
            .with_root_certificates(roots);
    let mut config = match security.read_identity()? {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certpath = security.cert.as_deref();
            let keypath = security.key.as_deref();
            let chain = rustls_pemfile::certs(&mut cert.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| files("cert", certpath, format!("cannot parse: {e}")))?;
            if chain.is_empty() {
                return Err(files("cert", certpath, "holds no certificate".into()));
            }
            let key = rustls_pemfile::private_key(&mut key.as_slice())
                .ok()
                .flatten()
                .ok_or_else(|| files("key", keypath, "holds no private key".into()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                files(
                    "key",
                    keypath,
                    format!(
                        "with cert={}: {}",
                        shown(certpath),
                        crate::store::security::identity_refused(&e)
                    ),
                )
            })?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn shown(path: Option<&std::path::Path>) -> String {
    path.map_or_else(String::new, |p| p.display().to_string())
}

/// One line naming why TLS with `host` failed: the server's certificate
/// did not verify against `cacert`, or the server refused this client's
/// certificate (or its absence). Never quotes a file's contents.
pub(super) fn explain(error: &rustls::Error, security: &Security, host: &str) -> String {
    let cacert = shown(security.cacert.as_deref());
    match error {
        rustls::Error::InvalidCertificate(cert) => {
            let why = crate::store::security::server_certificate_refused(
                cert,
                &format!("cacert={cacert}"),
                &format!("it does not name {host}"),
            );
            format!("certificate verify failed: the certificate of etcd at {host}: {why}")
        }
        rustls::Error::AlertReceived(alert) => refused_alert(&format!("{alert:?}"), security, host),
        other => format!("TLS with etcd at {host} failed: {other}"),
    }
}

/// The server ended the handshake with `alert` (as rustls names it:
/// `BadCertificate`, `CertificateExpired`, `CertificateRequired`, …).
/// A server refusing a client certificate says little (Go's TLS answers
/// `BadCertificate` whatever the reason), so the line says what this
/// side knows: no certificate was given, or the one given has expired.
pub(super) fn refused_alert(alert: &str, security: &Security, host: &str) -> String {
    let client_cert_alert = matches!(
        alert,
        "BadCertificate"
            | "CertificateRequired"
            | "CertificateExpired"
            | "UnknownCA"
            | "UnsupportedCertificate"
            | "CertificateRevoked"
            | "CertificateUnknown"
            | "AccessDenied"
    );
    if !client_cert_alert {
        return format!("TLS with etcd at {host} failed: the server sent the alert {alert}");
    }
    let Some(cert) = &security.cert else {
        return format!(
            "etcd at {host} requires a client certificate (TLS alert {alert}); give cert= and key="
        );
    };
    let path = cert.display();
    if client_cert_expired(security) {
        format!("certificate expired: the client certificate cert={path} has expired")
    } else {
        format!("etcd at {host} refused the client certificate cert={path} (TLS alert {alert})")
    }
}

/// Whether the client certificate on disk now has expired. webpki checks
/// a certificate's validity period before it looks for an issuer, so a
/// chain check against no trust anchor fails with `CertExpired` for an
/// expired certificate and with another error (no issuer) for one in
/// date.
fn client_cert_expired(security: &Security) -> bool {
    let Ok(Some((cert, _))) = security.read_identity() else {
        return false;
    };
    let Some(Ok(first)) = rustls_pemfile::certs(&mut cert.as_slice()).next() else {
        return false;
    };
    let Ok(end_entity) = webpki::EndEntityCert::try_from(&first) else {
        return false;
    };
    let algorithms = rustls::crypto::ring::default_provider()
        .signature_verification_algorithms
        .all;
    matches!(
        end_entity.verify_for_usage(
            algorithms,
            &[],
            &[],
            rustls::pki_types::UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        ),
        Err(webpki::Error::CertExpired { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener on loopback that closes each connection at once, or
    /// (`silent`) keeps it and says nothing; its address.
    async fn unanswering(silent: bool) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                if silent {
                    kept.push(tcp);
                }
            }
        });
        address
    }

    /// A member that closes connections unanswered (going down, a proxy
    /// without its backend) or answers nothing speaks neither protocol:
    /// it is not named a mismatch, and a plaintext connection to it after
    /// such a close is made as before.
    #[tokio::test]
    async fn a_member_that_closes_or_says_nothing_is_no_mismatch() {
        for silent in [false, true] {
            let address = unanswering(silent).await;
            let (host, port) = ("127.0.0.1", address.port());
            assert!(!speaks_tls(host, port).await, "silent: {silent}");
            assert!(!answers_in_plaintext(host, port).await, "silent: {silent}");
        }
        let address = unanswering(false).await;
        let connector = Connector::new(Arc::new(Security::none()));
        let uri: Uri = format!("http://{address}").parse().expect("uri");
        let mut first = connector.clone().connect(uri.clone()).await.expect("tcp");
        let mut byte = [0; 1];
        let read = tokio::io::AsyncReadExt::read(first.inner_mut(), &mut byte).await;
        assert!(matches!(read, Ok(0)) || read.is_err(), "{read:?}");
        assert!(connector.unanswered.load(Ordering::Relaxed));
        let again = connector.clone().connect(uri).await;
        assert!(again.is_ok(), "{:?}", again.err());
    }
}
