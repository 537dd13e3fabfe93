//! The PostgreSQL URL: libpq's grammar checked in full, leasehold's own
//! parameters taken out, and the rest parsed by tokio-postgres.

use super::*;

/// A PostgreSQL URL split the way tokio-postgres reads it: the credentials
/// end at the first `@`, the hosts at the next `/` or `?`, the database
/// name at `?`; parameters are `KEY=VALUE` joined by `&`. All parts are as
/// written (percent-encoded).
#[derive(Debug)]
pub(super) struct PgUrl<'a> {
    pub(super) scheme: &'a str,
    pub(super) user: Option<&'a str>,
    pub(super) password: Option<&'a str>,
    pub(super) hosts: &'a str,
    pub(super) dbname: Option<&'a str>,
    pub(super) params: Vec<(&'a str, &'a str)>,
}

/// A PostgreSQL schema leasehold may create its tables in.
pub(super) fn check_schema(schema: &str) -> Result<(), String> {
    let valid = !schema.is_empty()
        && schema.len() <= 53
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(format!(
            "schema {} must be 1–53 characters of a-z, 0-9 and _, not starting with a digit (its notices go on the channel leasehold_SCHEMA, and PostgreSQL's names end at 63)",
            quoted(schema)
        ));
    }
    // The same names the store refuses when connecting (postgres.rs).
    if schema.starts_with("pg_") || schema == "information_schema" || schema == "public" {
        return Err(format!(
            "schema {schema:?} is one of PostgreSQL's own (pg_*, information_schema, public), \
             shared with other applications; choose another (default {DEFAULT_POSTGRES_SCHEMA})"
        ));
    }
    Ok(())
}

impl<'a> PgUrl<'a> {
    const GRAMMAR: &'static str =
        "expected postgres://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]…][/DB][?KEY=VALUE&…]";

    /// Splits and checks `url`; the errors never quote the credentials or
    /// a parameter's value.
    pub(super) fn parse(url: &'a str) -> Result<Self, String> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("postgres://") {
            ("postgres", rest)
        } else if let Some(rest) = url.strip_prefix("postgresql://") {
            ("postgresql", rest)
        } else {
            return Err(Self::GRAMMAR.into());
        };
        let (user, password, rest) = Self::credentials(rest)?;
        if rest.contains('#') {
            return Err("a '#' must be written percent-encoded (%23)".into());
        }
        let hosts_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (hosts, rest) = rest.split_at(hosts_end);
        let (dbname, rest) = match rest.strip_prefix('/') {
            Some(path) => {
                let end = path.find('?').unwrap_or(path.len());
                (Some(&path[..end]), &path[end..])
            }
            None => (None, rest),
        };
        if let Some(db) = dbname
            && std::str::from_utf8(&percent_decode(db)).is_err()
        {
            return Err("the database name is not UTF-8 once percent-decoded".into());
        }
        let known_key = |key: &str| {
            if LEASEHOLD_POSTGRES_PARAMETERS.contains(&key) || POSTGRES_PARAMETERS.contains(&key) {
                return Ok(());
            }
            Err(format!(
                "unknown parameter {} in the PostgreSQL URL; known are schema, \
                 sslrootcert, sslcert, sslkey, password_file and {}",
                quoted(key),
                POSTGRES_PARAMETERS.join(", ")
            ))
        };
        let params = match rest.strip_prefix('?') {
            Some(query) => query_pairs(query, "parameter", known_key)?,
            None => Vec::new(),
        };
        let pg = PgUrl {
            scheme,
            user,
            password,
            hosts,
            dbname,
            params,
        };
        pg.check()?;
        Ok(pg)
    }

    /// `[USER[:PASSWORD]@]` at the start of `rest`, as written, and the
    /// rest.
    fn credentials(rest: &'a str) -> Result<(Option<&'a str>, Option<&'a str>, &'a str), String> {
        let Some((credentials, rest)) = rest.split_once('@') else {
            return Ok((None, None, rest));
        };
        let (user, password) = split_credentials(credentials)?;
        if rest.contains('@') {
            return Err(
                "the URL holds more than one '@': write an '@' in the user name \
                 or password, or after the host, as %40"
                    .into(),
            );
        }
        if user.is_empty() {
            return Err("the user name before '@' is empty".into());
        }
        if std::str::from_utf8(&percent_decode(user)).is_err() {
            return Err("the user name is not UTF-8 once percent-decoded".into());
        }
        Ok((Some(user), password, rest))
    }

    pub(super) fn param(&self, key: &str) -> Option<&'a str> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    pub(super) fn check(&self) -> Result<(), String> {
        self.check_given_once()?;
        for chunk in self.hosts.split(',').filter(|_| !self.hosts.is_empty()) {
            let (host, port) = split_host_port(chunk)?;
            check_pg_host(host, chunk)?;
            if let Some(port) = port {
                check_port(port, chunk)?;
            }
        }
        self.check_host_params()?;
        self.check_lengths()?;
        self.check_tls()?;
        if let Some(schema) = self.param("schema") {
            check_schema(schema)?;
        }
        Ok(())
    }

    /// Refuses a name longer than PostgreSQL keeps (63 bytes: it would cut
    /// it), and any other value longer than a path can be, saying how long
    /// it is rather than repeating it.
    fn check_lengths(&self) -> Result<(), String> {
        const NAME_LEN: usize = 63;
        let names = [("user name", self.user), ("database name", self.dbname)]
            .into_iter()
            .chain(
                ["user", "dbname", "application_name"]
                    .into_iter()
                    .map(|key| (key, self.param(key))),
            );
        for (what, value) in names {
            // Counted once percent-decoded, as the server gets it.
            let name = value.map(percent_decode).unwrap_or_default();
            if name.contains(&0) {
                return Err(format!(
                    "the {what} holds a NUL byte (%00), which PostgreSQL cannot take"
                ));
            }
            check_len(what, name.len(), NAME_LEN)
                .map_err(|refused| format!("{refused} (PostgreSQL's limit for names)"))?;
        }
        for (key, value) in &self.params {
            check_len(
                &format!("parameter {}", quoted(key)),
                value.len(),
                MAX_FILE_PATH_LEN,
            )?;
        }
        Ok(())
    }

    /// Refuses what is given both in the URL and as a parameter, and a URL
    /// without a host.
    pub(super) fn check_given_once(&self) -> Result<(), String> {
        let twice = |what: &str, key: &str| {
            Err(format!(
                "the {what} is given twice: in the URL and as ?{key}="
            ))
        };
        if self.user.is_some() && self.param("user").is_some() {
            return twice("user name", "user");
        }
        if self.password.is_some() && self.param("password").is_some() {
            return twice("password", "password");
        }
        if self.dbname.is_some_and(|d| !d.is_empty()) && self.param("dbname").is_some() {
            return twice("database name", "dbname");
        }
        if !self.hosts.is_empty() && (self.param("host").is_some() || self.param("port").is_some())
        {
            return Err(
                "hosts are given twice: after postgres:// and as ?host= or ?port=; \
                 give them in one place"
                    .into(),
            );
        }
        if self.hosts.is_empty() && self.param("host").is_none() && self.param("hostaddr").is_none()
        {
            return Err(
                "names no host: give HOST[:PORT] after postgres:// (or ?host=, ?hostaddr=)".into(),
            );
        }
        Ok(())
    }

    /// Checks `?host=` and `?port=`.
    pub(super) fn check_host_params(&self) -> Result<(), String> {
        // tokio-postgres takes ?host= as one host (unlike ?port= and
        // ?hostaddr=, which it splits at commas).
        if let Some(host) = self.param("host") {
            if host.contains(',') {
                return Err("?host= takes one host; give several after postgres://, \
                     as postgres://h1,h2/db"
                    .into());
            }
            check_pg_host(host, host)?;
        }
        if let Some(ports) = self.param("port") {
            for port in ports.split(',').filter(|p| !p.is_empty()) {
                check_port(port, port)?;
            }
        }
        Ok(())
    }

    /// The TLS and password-file settings: `sslmode` among libpq's five,
    /// `sslrootcert` for the verifying modes, `sslcert` with `sslkey`.
    pub(super) fn check_tls(&self) -> Result<(), String> {
        let mode = match self.param("sslmode") {
            None => PgSslMode::Prefer,
            Some(value) => PgSslMode::parse(value).ok_or_else(|| {
                "invalid value for option `sslmode`: expected disable, prefer, require, \
                 verify-ca or verify-full"
                    .to_owned()
            })?,
        };
        for key in ["sslrootcert", "sslcert", "sslkey", "password_file"] {
            if self.param(key).is_some_and(str::is_empty) {
                return Err(format!("parameter {key:?} names no file"));
            }
            if let Some(path) = self.param(key) {
                check_file_path_len(key, path)?;
            }
        }
        if self.param("sslcert").is_some() != self.param("sslkey").is_some() {
            return Err("sslcert= and sslkey= go together: give both, or neither".into());
        }
        if matches!(mode, PgSslMode::VerifyCa | PgSslMode::VerifyFull)
            && self.param("sslrootcert").is_none()
        {
            return Err(format!(
                "sslmode={} needs sslrootcert=PATH, the CA certificate that signed the \
                 server's",
                mode.as_str()
            ));
        }
        if mode == PgSslMode::Disable
            && ["sslrootcert", "sslcert", "sslkey"]
                .iter()
                .any(|key| self.param(key).is_some())
        {
            return Err(
                "sslmode=disable turns TLS off, but sslrootcert=, sslcert= or \
                 sslkey= is given"
                    .into(),
            );
        }
        if self.param("password_file").is_some()
            && (self.password.is_some() || self.param("password").is_some())
        {
            return Err("the password is given twice: in the URL and as password_file=".into());
        }
        for (key, value) in &self.params {
            if ["sslrootcert", "sslcert", "sslkey", "password_file"].contains(key) {
                decoded(&format!("{key} path"), value)?;
            }
        }
        Ok(())
    }

    /// What tokio-postgres is given: the URL without leasehold's own
    /// parameters, `sslmode` mapped onto its three (the verifying modes
    /// are `require` plus the connector's checks).
    pub(super) fn tokio_postgres_url(&self) -> String {
        let mut pg = PgUrl {
            params: Vec::new(),
            ..*self
        };
        for &(key, value) in &self.params {
            if LEASEHOLD_POSTGRES_PARAMETERS.contains(&key) {
                continue;
            }
            if key == "sslmode" {
                let mode = PgSslMode::parse(value).unwrap_or(PgSslMode::Prefer);
                pg.params.push((key, mode.tokio_postgres()));
            } else {
                pg.params.push((key, value));
            }
        }
        pg.render(false, false)
    }

    /// The URL again; with `redact`, every password is `***`; without
    /// `schema`, leasehold's parameter is left out.
    pub(super) fn render(&self, redact: bool, with_schema: bool) -> String {
        let mut out = format!("{}://", self.scheme);
        if let Some(user) = self.user {
            out.push_str(user);
            if let Some(password) = self.password {
                out.push(':');
                out.push_str(if redact { "***" } else { password });
            }
            out.push('@');
        }
        out.push_str(self.hosts);
        if let Some(db) = self.dbname {
            out.push('/');
            out.push_str(db);
        }
        let mut separator = '?';
        for (key, value) in &self.params {
            if *key == "schema" && !with_schema {
                continue;
            }
            out.push(separator);
            separator = '&';
            out.push_str(key);
            out.push('=');
            out.push_str(if redact && *key == "password" {
                "***"
            } else {
                value
            });
        }
        out
    }
}

/// One host of a PostgreSQL URL, `HOST[:PORT]` or `[IPV6][:PORT]`, split
/// into its host and port.
pub(super) fn split_host_port(chunk: &str) -> Result<(&str, Option<&str>), String> {
    let (host, port) = if chunk.starts_with('[') {
        match chunk.find(']') {
            Some(end) => {
                let port = &chunk[end + 1..];
                if !(port.is_empty() || port.starts_with(':')) {
                    return Err(format!(
                        "host {} is not [IPV6][:PORT]",
                        quote_endpoint(chunk)
                    ));
                }
                (&chunk[..=end], port.strip_prefix(':'))
            }
            None => {
                return Err(format!(
                    "host {} is not [IPV6][:PORT]",
                    quote_endpoint(chunk)
                ));
            }
        }
    } else if chunk.matches(':').count() > 1 {
        return Err(format!(
            "host {} is not HOST[:PORT] (write an IPv6 address in brackets: [::1]:5432)",
            quote_endpoint(chunk)
        ));
    } else {
        match chunk.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (chunk, None),
        }
    };
    Ok((host, port))
}

/// A PostgreSQL host: a host name or address, or (percent-encoded, as
/// `%2Frun%2Fpostgresql`) the directory of a Unix socket.
pub(super) fn check_pg_host(host: &str, chunk: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err(format!("host {} is empty", quote_endpoint(chunk)));
    }
    let decoded = percent_decode(host);
    if decoded.first() == Some(&b'/') {
        return Ok(());
    }
    match std::str::from_utf8(&decoded) {
        Ok(name) => check_host(name),
        Err(_) => Err("a host name is not UTF-8 once percent-decoded".into()),
    }
}

/// The parameters of a PostgreSQL URL that leasehold reads itself and
/// does not pass on to tokio-postgres.
pub(super) const LEASEHOLD_POSTGRES_PARAMETERS: &[&str] = &[
    "schema",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "password_file",
];

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgSslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, without verifying its certificate;
    /// plaintext otherwise (libpq's default).
    Prefer,
    /// TLS or no connection; the certificate is verified against
    /// `sslrootcert` if given (as libpq does), not otherwise.
    Require,
    /// TLS; the certificate must chain to `sslrootcert`.
    VerifyCa,
    /// TLS; the certificate must chain to `sslrootcert` and name the host.
    VerifyFull,
}

impl PgSslMode {
    pub(super) fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "disable" => PgSslMode::Disable,
            "prefer" => PgSslMode::Prefer,
            "require" => PgSslMode::Require,
            "verify-ca" => PgSslMode::VerifyCa,
            "verify-full" => PgSslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The value as written in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Prefer => "prefer",
            PgSslMode::Require => "require",
            PgSslMode::VerifyCa => "verify-ca",
            PgSslMode::VerifyFull => "verify-full",
        }
    }

    pub(super) fn tokio_postgres(self) -> &'static str {
        match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Prefer => "prefer",
            _ => "require",
        }
    }
}

/// A PostgreSQL URL as the store connects with it: the URL tokio-postgres
/// parses, and the settings leasehold applies itself.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct PgConnect {
    /// For tokio-postgres: without leasehold's parameters, `sslmode`
    /// mapped onto disable, prefer and require. May hold a password:
    /// never show it.
    pub tokio_postgres_url: Secret,
    /// libpq's `sslmode` as written (default `prefer`).
    pub sslmode: PgSslMode,
    /// `sslrootcert`, `sslcert`, `sslkey`: TLS files, read at each
    /// connection.
    pub tls: Security,
}

/// Splits a PostgreSQL store URL (as [`StoreUrl::Postgres`] holds it)
/// into what tokio-postgres gets and what leasehold applies.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn postgres_connect(url: &str) -> Result<PgConnect> {
    let pg = PgUrl::parse(url).map_err(invalid)?;
    let path = |key: &str| {
        pg.param(key)
            .map(|value| PathBuf::from(String::from_utf8_lossy(&percent_decode(value)).as_ref()))
    };
    let tls = Security {
        user: None,
        password: path("password_file").map(Password::File),
        cacert: path("sslrootcert"),
        cert: path("sslcert"),
        key: path("sslkey"),
    };
    Ok(PgConnect {
        tokio_postgres_url: Secret::new(pg.tokio_postgres_url()),
        sslmode: pg
            .param("sslmode")
            .and_then(PgSslMode::parse)
            .unwrap_or(PgSslMode::Prefer),
        tls,
    })
}

/// What tokio-postgres itself makes of the URL: its errors name the
/// option, never a value.
#[cfg(feature = "postgres")]
pub(super) fn check_with_tokio_postgres(url: &str) -> Result<(), String> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| crate::error::with_causes(&e))?;
    let (hosts, addrs, ports) = (
        config.get_hosts().len(),
        config.get_hostaddrs().len(),
        config.get_ports().len(),
    );
    if hosts > 0 && addrs > 0 && hosts != addrs {
        return Err(format!(
            "{hosts} host(s) but {addrs} ?hostaddr= address(es); give one address per host"
        ));
    }
    if ports > 1 && ports != hosts.max(addrs) {
        return Err(format!(
            "{ports} ports for {} host(s); give one port, or one per host",
            hosts.max(addrs)
        ));
    }
    Ok(())
}

#[cfg(not(feature = "postgres"))]
pub(super) fn check_with_tokio_postgres(_: &str) -> Result<(), String> {
    Ok(())
}

/// Takes leasehold's `schema` parameter out of a PostgreSQL URL; the rest
/// goes to tokio-postgres unchanged.
pub(super) fn parse_postgres(url: &str) -> Result<StoreUrl, String> {
    let pg = PgUrl::parse(url)?;
    let schema = pg
        .param("schema")
        .unwrap_or(DEFAULT_POSTGRES_SCHEMA)
        .to_owned();
    let url = pg.render(false, false);
    check_with_tokio_postgres(&pg.tokio_postgres_url())?;
    Ok(StoreUrl::Postgres(PostgresUrl { url, schema }))
}
