//! How a connection to a remote store proves who it is and keeps its
//! traffic private: a user name and password, TLS files. Nothing here is
//! ever shown: a [`Secret`]'s `Debug` is `***`, and errors name the file a
//! password came from, never what it holds.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A password. `Debug` shows `***`; only [`Secret::expose`] gives it out.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Secret(password.into())
    }

    /// The password itself, for the one call that sends it to the store.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a password comes from.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Password {
    /// Given in the URL (`user:password@`) or by `LEASEHOLD_STORE_PASSWORD`.
    Given(Secret),
    /// Read from this file (`?password_file=PATH`) at each connection.
    File(PathBuf),
}

/// The longest password file read, in bytes.
const MAX_PASSWORD_FILE: u64 = 64 * 1024;

impl Password {
    /// The password: given, or read from its file now (one trailing line
    /// break dropped). Errors name the file, never its contents.
    pub fn read(&self) -> Result<Secret> {
        match self {
            Password::Given(secret) => Ok(secret.clone()),
            Password::File(path) => read_password_file(path),
        }
    }
}

fn read_password_file(path: &Path) -> Result<Secret> {
    let refuse = |why: String| Error::invalid("password file", why);
    let shown = path.display();
    let mut bytes =
        read_bounded(path, MAX_PASSWORD_FILE).map_err(|why| refuse(format!("{shown}: {why}")))?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    let password =
        String::from_utf8(bytes).map_err(|_| refuse(format!("{shown} is not UTF-8 text")))?;
    if password.is_empty() {
        return Err(refuse(format!("{shown} is empty")));
    }
    if password.contains('\n') {
        return Err(refuse(format!(
            "{shown} holds more than one line; it should hold the password alone"
        )));
    }
    Ok(Secret(password))
}

/// The authentication and TLS settings of an etcd or ZooKeeper URL.
///
/// `Debug` never shows a password.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub struct Security {
    /// The user name (`USER@` or `USER:PASSWORD@`), percent-decoded.
    pub user: Option<String>,
    /// The password, if any.
    pub password: Option<Password>,
    /// The CA certificates (PEM) the server's certificate must chain to
    /// (`?cacert=PATH`); TLS is on when this is set.
    pub cacert: Option<PathBuf>,
    /// This client's certificate chain (PEM, `?cert=PATH`).
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM, `?key=PATH`).
    pub key: Option<PathBuf>,
}

impl Security {
    /// No authentication, no TLS.
    pub fn none() -> Self {
        Security::default()
    }

    /// Whether the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.cacert.is_some()
    }

    /// Whether nothing is set.
    pub fn is_none(&self) -> bool {
        *self == Security::default()
    }

    /// The user name and password, the password read now (from its file,
    /// if it comes from one).
    pub fn credentials(&self) -> Result<Option<(String, Secret)>> {
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => Ok(Some((user.clone(), password.read()?))),
            _ => Ok(None),
        }
    }

    /// The client certificate chain and key, read now, so that files
    /// replaced on disk take effect at the next connection.
    pub fn read_identity(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.read_identity_named("cert", "key")
    }

    /// As [`Security::read_identity`], errors naming the two files as the
    /// URL does (PostgreSQL: `sslcert`, `sslkey`).
    pub(crate) fn read_identity_named(
        &self,
        cert_setting: &'static str,
        key_setting: &'static str,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some((
                read_pem(cert_setting, cert)?,
                read_pem(key_setting, key)?,
            ))),
            _ => Ok(None),
        }
    }

    /// The CA certificates, read now.
    pub fn read_cacert(&self) -> Result<Option<Vec<u8>>> {
        self.read_cacert_named("cacert")
    }

    /// As [`Security::read_cacert`], the error naming the file as the URL
    /// does (PostgreSQL: `sslrootcert`).
    pub(crate) fn read_cacert_named(&self, setting: &'static str) -> Result<Option<Vec<u8>>> {
        self.cacert
            .as_deref()
            .map(|path| read_pem(setting, path))
            .transpose()
    }
}

/// The longest TLS file read (a CA bundle may hold many certificates).
const MAX_TLS_FILE: u64 = 4 * 1024 * 1024;

/// A regular file's bytes, at most `max`: a FIFO, a device (`/dev/zero`)
/// or a directory is refused before anything is read, so that a wrong
/// path can neither block nor fill memory. Errors name the file and say
/// why, never quoting it.
fn read_bounded(path: &Path, max: u64) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so that opening a FIFO does not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let metadata = file
        .metadata()
        .map_err(|e| format!("cannot read: {}", e.kind()))?;
    if !metadata.is_file() {
        return Err("not a regular file".into());
    }
    let too_long = || format!("longer than {max} bytes");
    if metadata.len() > max {
        return Err(too_long());
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {}", e.kind()))?;
    if bytes.len() as u64 > max {
        return Err(too_long());
    }
    Ok(bytes)
}

/// A PEM file's bytes; the error names the setting and the file, and says
/// why, never quoting the contents. A private key (a setting named
/// `key` or `sslkey`) that every user may read is refused, as libpq and
/// ssh refuse one, and so is an encrypted one, which leasehold cannot
/// decrypt.
pub(crate) fn read_pem(setting: &'static str, path: &Path) -> Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let refuse = |why: String| Error::invalid("TLS file", format!("{setting}={why}"));
    let bytes =
        read_bounded(path, MAX_TLS_FILE).map_err(|why| refuse(format!("{shown}: {why}")))?;
    if setting.ends_with("key") {
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode())
            .unwrap_or(0);
        if mode & 0o007 != 0 {
            return Err(refuse(format!(
                "{shown}: a private key open to every user (mode {:04o}); \
                 chmod o-rwx it",
                mode & 0o7777
            )));
        }
        const ENCRYPTED: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
        if bytes.windows(ENCRYPTED.len()).any(|w| w == ENCRYPTED) {
            return Err(refuse(format!(
                "{shown}: the private key is encrypted with a passphrase, which leasehold \
                 cannot give; store it decrypted (openssl pkey -in KEY -out KEY.plain) \
                 and protect the file instead"
            )));
        }
    }
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(Error::invalid(
            "TLS file",
            format!("{setting}={shown} holds no PEM block (-----BEGIN …)"),
        ));
    }
    Ok(bytes)
}

/// Why this client refused the server's certificate, in words: `ca` is
/// the option and path of the CA file as the URL names it
/// (`cacert=PATH`, `sslrootcert=PATH`), `not_named` what to say when the
/// certificate does not name the host.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) fn server_certificate_refused(
    error: &rustls::CertificateError,
    ca: &str,
    not_named: &str,
) -> String {
    use rustls::CertificateError as E;
    match error {
        E::UnknownIssuer | E::BadSignature => format!("it is not signed by a CA in {ca}"),
        E::Expired | E::ExpiredContext { .. } => "it has expired".to_owned(),
        E::NotValidYet | E::NotValidYetContext { .. } => "it is not valid yet".to_owned(),
        E::NotValidForName | E::NotValidForNameContext { .. } => not_named.to_owned(),
        E::Revoked => "it was revoked".to_owned(),
        other => format!("it cannot be used ({other:?})"),
    }
}

/// Why rustls refused a client certificate and key as a pair, in words
/// (its own `Display` of these is debug text).
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) fn identity_refused(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the key does not go with the certificate".into()
        }
        rustls::Error::InconsistentKeys(_) => {
            "the key and the certificate cannot be checked against each other".into()
        }
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
            if format!("{other:?}").contains("UnsupportedCertVersion") =>
        {
            "the certificate is not an X.509 version 3 certificate (made without \
             extensions?); issue it with v3 extensions"
                .into()
        }
        rustls::Error::InvalidCertificate(_) => "the certificate cannot be used".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_not_shown() {
        let security = Security {
            user: Some("u".into()),
            password: Some(Password::Given(Secret::new("Sup3rSecret"))),
            ..Security::none()
        };
        assert!(!format!("{security:?}").contains("Sup3r"));
    }

    #[test]
    fn a_password_file_is_read_without_its_line_break_and_never_quoted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("pw");
        std::fs::write(&file, "Sup3rSecret\n").expect("write");
        let password = Password::File(file.clone());
        assert_eq!(password.read().expect("read").expose(), "Sup3rSecret");
        for (contents, needle) in [
            ("", "is empty"),
            ("\n", "is empty"),
            ("Sup3r\nSecret\n", "more than one line"),
        ] {
            std::fs::write(&file, contents).expect("write");
            let error = password.read().expect_err(contents).to_string();
            assert!(error.contains(needle), "{error}");
            assert!(!error.contains("Sup3r"), "{error}");
        }
        std::fs::write(&file, b"\xffSup3r").expect("write");
        let error = password.read().expect_err("not UTF-8").to_string();
        assert!(error.contains("not UTF-8") && !error.contains("Sup3r"));
        for (special, needle) in [
            (std::path::PathBuf::from("/dev/zero"), "not a regular file"),
            (dir.path().to_owned(), "not a regular file"),
        ] {
            let error = Password::File(special.clone())
                .read()
                .expect_err("special")
                .to_string();
            assert!(error.contains(needle), "{error}");
            let error = read_pem("cacert", &special)
                .expect_err("special")
                .to_string();
            assert!(error.contains(needle), "{error}");
        }
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let error = Password::File(fifo.clone())
            .read()
            .expect_err("a FIFO")
            .to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let error = read_pem("key", &fifo).expect_err("a FIFO").to_string();
        assert!(error.contains("not a regular file"), "{error}");
        std::fs::write(&file, vec![b'x'; 70_000]).expect("write");
        let error = password.read().expect_err("long").to_string();
        assert!(error.contains("longer than 65536 bytes"), "{error}");
        let missing = Password::File(dir.path().join("missing"));
        let error = missing.read().expect_err("missing").to_string();
        assert!(
            error.contains("cannot open") && error.contains("missing"),
            "{error}"
        );
    }

    #[test]
    fn a_tls_file_without_pem_is_refused_without_quoting_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("key.pem");
        let chmod = |mode| {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        std::fs::write(&file, "Sup3rSecret").expect("write");
        chmod(0o600);
        let error = read_pem("key", &file).expect_err("no PEM").to_string();
        assert!(
            error.contains("no PEM block") && !error.contains("Sup3r"),
            "{error}"
        );
        // A key every user may read, and an encrypted one, are refused.
        std::fs::write(&file, "-----BEGIN PRIVATE KEY-----\nSup3r\n").expect("write");
        assert!(read_pem("sslkey", &file).is_ok());
        chmod(0o644);
        let error = read_pem("sslkey", &file)
            .expect_err("world-readable")
            .to_string();
        assert!(error.contains("open to every user (mode 0644)"), "{error}");
        assert!(read_pem("cacert", &file).is_ok(), "only keys are private");
        chmod(0o640);
        std::fs::write(&file, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nSup3r\n").expect("write");
        let error = read_pem("key", &file).expect_err("encrypted").to_string();
        assert!(
            error.contains("encrypted with a passphrase") && !error.contains("Sup3r"),
            "{error}"
        );
    }
}
