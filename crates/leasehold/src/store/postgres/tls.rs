//! How the PostgreSQL store connects: libpq's `sslmode` on rustls (ring),
//! the password from `password_file`, and the refusals of either side as
//! one-line [`Error::Denied`]s.
//!
//! Everything a connection needs from files (`sslrootcert`, `sslcert`,
//! `sslkey`, `password_file`) is read again for every connection, so a
//! file replaced on disk takes effect at the next (re)connection: a
//! certificate rotation needs no restart.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | if the server offers it | not verified |
//! | `require` | always | not verified; with `sslrootcert`, as `verify-ca` (as libpq) |
//! | `verify-ca` | always | chains to `sslrootcert`; the host name is not checked |
//! | `verify-full` | always | chains to `sslrootcert` and names the host |

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore,
    SignatureScheme,
};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};
use crate::store::PgSslMode;
use crate::store::security::Security;

/// A connection's driver, to be polled (spawned) for the client to work.
pub(super) type Connection =
    tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// What opens a connection: the parsed URL and the settings leasehold
/// applies itself. `Debug` shows no password (tokio-postgres's `Config`
/// redacts it; the files are paths).
#[derive(Clone, Debug)]
pub(super) struct Connector {
    pub(super) config: tokio_postgres::Config,
    pub(super) sslmode: PgSslMode,
    pub(super) files: Security,
}

impl Connector {
    /// Opens one connection, reading the TLS files and the password file
    /// now. Errors: a file that cannot be read or used is
    /// [`Error::InvalidInput`]; a refusal (certificate, password,
    /// `pg_hba.conf`) is [`Error::Denied`]; anything else
    /// [`Error::Unavailable`].
    pub(super) async fn connect(&self, what: &str) -> Result<(Client, Connection)> {
        let mut config = self.config.clone();
        if let Some(password) = &self.files.password {
            config.password(password.read()?.expose());
        }
        let tls = MakeRustlsConnect::new(self.client_config()?);
        match tokio::time::timeout(super::REQUEST_TIMEOUT, config.connect(tls)).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(error)) => Err(match self.refusal(&error) {
                Some(cause) => Error::Denied(format!("postgres {what}: {cause}")),
                // tokio-postgres's own words when the server asks for a
                // password and the configuration has none.
                None if crate::error::with_causes(&error).contains("password missing") => {
                    Error::invalid(
                        "store credentials",
                        format!(
                            "postgres {what}: the server asks for a password and none is given: \
                             give it by LEASEHOLD_STORE_PASSWORD, password_file=PATH or \
                             USER:PASSWORD@"
                        ),
                    )
                }
                None => super::unavailable(what, error),
            }),
            Err(_) => Err(Error::no_answer(
                &format!("postgres {what}"),
                super::REQUEST_TIMEOUT,
            )),
        }
    }

    /// The rustls configuration for one connection, from the files as
    /// they are now.
    fn client_config(&self) -> Result<ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid("PostgreSQL TLS", e.to_string()))?;
        let roots = match self.sslmode {
            // prefer never verifies (as libpq); disable never uses TLS.
            PgSslMode::Disable | PgSslMode::Prefer => None,
            _ => self
                .files
                .read_cacert_named("sslrootcert")?
                .map(|pem| roots(&pem, &self.files))
                .transpose()?,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match roots {
            None => Arc::new(NoVerification(provider)),
            Some(roots) => {
                let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| Error::invalid("TLS file", format!("sslrootcert: {e}")))?;
                if self.sslmode == PgSslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        match self.files.read_identity_named("sslcert", "sslkey")? {
            None => Ok(builder.with_no_client_auth()),
            Some((chain, key)) => {
                let chain = certificates("sslcert", &chain, self.files.cert.as_deref())?;
                let key = private_key(&key, self.files.key.as_deref())?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    Error::invalid(
                        "TLS file",
                        format!(
                            "sslcert={} with sslkey={}: {}",
                            shown(self.files.cert.as_deref()),
                            shown(self.files.key.as_deref()),
                            crate::store::security::identity_refused(&e)
                        ),
                    )
                })
            }
        }
    }

    /// Why the server or this client refused the connection, in one line
    /// without secrets; `None` when it was not a refusal (unreachable,
    /// timed out: worth retrying).
    fn refusal(&self, error: &tokio_postgres::Error) -> Option<String> {
        use tokio_postgres::error::SqlState;
        if let Some(db) = error.as_db_error() {
            let code = db.code();
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                let hint =
                    if db.message().contains("client certificate") && self.files.cert.is_none() {
                        " (no sslcert= given)"
                    } else {
                        ""
                    };
                return Some(format!("{} ({}){hint}", db.message(), code.code()));
            }
            return None;
        }
        if let Some(tls) = rustls_error(error) {
            return Some(self.tls_refusal(tls));
        }
        let said = crate::error::with_causes(error);
        said.contains("server does not support TLS").then(|| {
            format!(
                "the server does not offer TLS, and sslmode={} requires it",
                self.sslmode.as_str()
            )
        })
    }

    fn tls_refusal(&self, error: &rustls::Error) -> String {
        let ca = shown(self.files.cacert.as_deref());
        let cert = shown(self.files.cert.as_deref());
        match error {
            rustls::Error::InvalidCertificate(why) => {
                let why = crate::store::security::server_certificate_refused(
                    why,
                    &format!("sslrootcert={ca}"),
                    "it does not name the host connected to (sslmode=verify-full checks the \
                     name; verify-ca does not)",
                );
                format!("certificate verify failed: the server's certificate: {why}")
            }
            rustls::Error::AlertReceived(alert) => {
                let why = match alert {
                    AlertDescription::CertificateExpired => "it has expired",
                    AlertDescription::CertificateRequired => {
                        "none was given (give sslcert= and sslkey=)"
                    }
                    AlertDescription::UnknownCA => "it is not signed by a CA the server trusts",
                    AlertDescription::CertificateRevoked => "it was revoked",
                    AlertDescription::BadCertificate
                    | AlertDescription::UnsupportedCertificate
                    | AlertDescription::CertificateUnknown
                    | AlertDescription::AccessDenied
                    | AlertDescription::DecryptError => "the server did not accept it",
                    _ => return format!("TLS: the server ended the handshake: {alert:?}"),
                };
                format!(
                    "certificate verify failed: the server refused the client certificate sslcert={cert}: {why} (TLS alert {alert:?})"
                )
            }
            other => format!("TLS: {other}"),
        }
    }
}

/// The rustls error in `error`'s causes, if any: tokio-rustls reports it
/// inside an `io::Error`, whose `source()` skips it, so each cause that is
/// an `io::Error` is opened as well.
fn rustls_error(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(found) = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(found);
        }
        cause = current.source();
    }
    None
}

fn shown(path: Option<&Path>) -> String {
    path.map_or_else(String::new, |p| p.display().to_string())
}

/// The CA certificates of `sslrootcert`.
fn roots(pem: &[u8], files: &Security) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("sslrootcert", pem, files.cacert.as_deref())? {
        roots.add(cert).map_err(|e| {
            Error::invalid(
                "TLS file",
                format!("sslrootcert={}: {e}", shown(files.cacert.as_deref())),
            )
        })?;
    }
    Ok(roots)
}

/// The certificates in a PEM file; at least one.
fn certificates(
    setting: &str,
    pem: &[u8],
    path: Option<&Path>,
) -> Result<Vec<CertificateDer<'static>>> {
    let bad = |why: String| Error::invalid("TLS file", format!("{setting}={}: {why}", shown(path)));
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate ({})", e.kind())))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no certificate (-----BEGIN CERTIFICATE-----)".into()
        ));
    }
    Ok(certs)
}

/// The private key in `sslkey`; errors never quote it.
fn private_key(pem: &[u8], path: Option<&Path>) -> Result<PrivateKeyDer<'static>> {
    let bad = |why: &str| Error::invalid("TLS file", format!("sslkey={}: {why}", shown(path)));
    match rustls_pemfile::private_key(&mut &pem[..]) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => Err(bad("holds no private key (PKCS#8, PKCS#1 or SEC1 PEM)")),
        Err(_) => Err(bad("not a readable PEM private key")),
    }
}

/// `sslmode=prefer` and `require` without `sslrootcert`: any certificate
/// is accepted (as libpq does), but the handshake's signatures are still
/// checked, so the connection is bound to the key the server presented.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca` (and `require` with `sslrootcert`): webpki's
/// verification — chain, validity, key usage — of which only a name
/// mismatch is forgiven. webpki checks the name last, after the chain, so
/// a certificate refused for its name has passed every other check.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
