//! Certificates for the secured-store tests, made on the spot (rcgen):
//! a CA, server certificates for loopback, client certificates, and the
//! broken ones a test needs (expired, signed by another CA). Nothing is
//! downloaded; keys are written mode 0600.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority whose files live in a folder the caller owns.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("dir", &self.dir)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PKCS#8 PEM), mode 0600.
    pub key: PathBuf,
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A server's: names `localhost` and `127.0.0.1`.
    Server,
    /// A client's, its common name the user name.
    Client,
}

fn write(path: &Path, contents: &str, mode: u32) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

impl TestCa {
    /// A new CA named `name`; its certificate is written to
    /// `dir/{name}-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("leasehold test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let ca = TestCa {
            dir: dir.to_owned(),
            name: name.to_owned(),
            issuer: Issuer::new(params, key),
        };
        write(&ca.ca_path(), &cert.pem(), 0o644);
        ca
    }

    /// The CA certificate's file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a certificate named `common_name` and writes it to
    /// `dir/{stem}.pem` and its key to `dir/{stem}-key.pem`, replacing
    /// what is there (a rotation). An `expired` one ended in 2021.
    pub fn issue(&self, stem: &str, common_name: &str, usage: Usage, expired: bool) -> CertFiles {
        let names: Vec<String> = match usage {
            Usage::Server => vec!["localhost".into(), "127.0.0.1".into()],
            Usage::Client => Vec::new(),
        };
        let mut params = CertificateParams::new(names).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name.to_owned());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Server => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        } else {
            params.not_before = rcgen::date_time_ymd(2024, 1, 1);
            params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}-key.pem")),
        };
        // The key first, then the certificate: a reader between the two
        // writes sees a mismatched pair and fails, as it would on a real
        // rotation done in that order.
        write(&files.key, &key.serialize_pem(), 0o600);
        write(&files.cert, &cert.pem(), 0o644);
        files
    }
}
