//! Store selection by URL (`--store`, `LEASEHOLD_STORE`): one grammar,
//! checked in full before anything connects.
//!
//! ```text
//! memory:
//! sqlite:PATH                         PATH taken literally; sqlite:///ABS/PATH is sqlite:/ABS/PATH
//! etcd://HOST:PORT[,HOST:PORT…][/PREFIX]
//! zk://HOST:PORT[,HOST:PORT…][/CHROOT]
//! postgres://[USER[:PASSWORD]@][HOST[:PORT][,…]][/DB][?KEY=VALUE&…]   (or postgresql://)
//! ```
//!
//! Everything else is refused with [`Error::InvalidInput`] naming what is
//! wrong: SQLite's `:memory:`, `file:` URIs and `?` parameters; a user name
//! or password, `?` options or `#` on etcd and ZooKeeper (not supported
//! yet); a port outside 1–65535; a host that is not an ASCII host name or
//! an IP address; `.`, `..` or empty segments in a prefix or chroot; an
//! unknown or repeated PostgreSQL parameter; a system schema. An error
//! never quotes the URL as a whole, and never a password.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

// `quoted` is only ever called on parts of a URL that cannot hold a
// password.
use crate::error::{Error, Result, quoted};
use crate::store::Store;
use crate::store::layout::Layout;
use crate::store::memory::MemoryStore;
use crate::store::security::{Password, Secret, Security};

/// The environment variable that may hold the store's password, so that
/// the URL (and so a command line or a configuration file) holds none:
/// [`open`], [`open_read_only`] and [`release_orphaned`] take it
/// ([`StoreUrl::with_password_from_env`]).
pub const PASSWORD_ENV: &str = "LEASEHOLD_STORE_PASSWORD";

/// A parsed store URL.
///
/// Its `Debug` and `Display` never show a password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory:` — in-process; every [`open`] creates a new, empty store.
    Memory,
    /// `sqlite:PATH` — the embedded store in the file at `PATH`.
    Sqlite(PathBuf),
    /// `etcd://[user[:password]@]host:port[,host:port…][/prefix][?options]`
    /// — an etcd v3 cluster.
    Etcd {
        /// `host:port` of each member to try.
        endpoints: Vec<String>,
        /// Where leasehold's keys live (default `/leasehold`; with
        /// `?layout=concurrency`, the prefix elections are joined below,
        /// default none).
        prefix: String,
        /// User, password and TLS files.
        security: Security,
        /// How elections are laid out (`?layout=`).
        layout: Layout,
    },
    /// `zk://[user[:password]@]host:port[,host:port…][/chroot][?password_file=PATH]`
    /// — a ZooKeeper ensemble.
    ZooKeeper {
        /// `host:port` of each server to try.
        endpoints: Vec<String>,
        /// The node under which leasehold's nodes live (default `/leasehold`;
        /// with `?layout=curator|kazoo`, the path elections are joined
        /// below, default none).
        root: String,
        /// User and password (digest authentication).
        security: Security,
        /// How elections are laid out (`?layout=`).
        layout: Layout,
    },
    /// `postgres://…` or `postgresql://…` — a PostgreSQL database.
    Postgres {
        /// The connection URL as given, without leasehold's own `schema`
        /// parameter.
        url: String,
        /// The schema leasehold's tables live in (`?schema=NAME`, default
        /// `leasehold`).
        schema: String,
    },
}

impl Layout {
    fn parse(cluster: Cluster, value: &str) -> Result<Layout, String> {
        let (known, expected): (&[Layout], &str) = match cluster {
            Cluster::Etcd => (
                &[Layout::Leasehold, Layout::Concurrency],
                "leasehold or concurrency (etcd's concurrency.Election, etcdctl elect)",
            ),
            Cluster::ZooKeeper => (
                &[Layout::Leasehold, Layout::Curator, Layout::Kazoo],
                "leasehold, curator (Curator's LeaderLatch) or kazoo (kazoo's Election)",
            ),
        };
        known
            .iter()
            .copied()
            .find(|l| l.as_str() == value)
            .ok_or_else(|| {
                format!(
                    "{}:// URLs take ?layout={expected}, not {}",
                    cluster.scheme(),
                    quoted(value)
                )
            })
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const SCHEMES: &str = "sqlite:PATH, etcd://HOST:PORT[,HOST:PORT…][/PREFIX], \
     zk://HOST:PORT[,HOST:PORT…][/CHROOT], postgres://USER@HOST[:PORT]/DB[?schema=NAME] or memory:";

/// The default PostgreSQL schema.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "leasehold";

/// The longest prefix or chroot, in bytes.
const MAX_PATH_LEN: usize = 200;

/// The longest file path, in bytes: Linux's `PATH_MAX` (4096) counts the
/// NUL at its end.
pub const MAX_FILE_PATH_LEN: usize = 4095;

/// The parameters tokio-postgres understands in a URL (0.7: its
/// `Config::param`), passed on to it unchanged. leasehold's own `schema`
/// is taken out before.
const POSTGRES_PARAMETERS: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

fn invalid(reason: impl Into<String>) -> Error {
    Error::invalid("store URL", reason)
}

/// An endpoint (`HOST:PORT`) quoted for a message with all after its
/// host hidden: in a URL whose credentials lack their `@`, `USER:PASSWORD`
/// reads as an endpoint, and its "port" is the password.
fn quote_endpoint(endpoint: &str) -> String {
    let host_end = if endpoint.starts_with('[') {
        endpoint.find(']').map(|end| end + 1)
    } else {
        endpoint.find(':')
    };
    match host_end {
        Some(end) if end < endpoint.len() => quoted(&format!("{}:…", &endpoint[..end])),
        _ => quoted(endpoint),
    }
}

/// `%XX` decoded as tokio-postgres (percent-encoding) does: a `%` not
/// followed by two hex digits stays as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            // Two hex digits are at most 0xff.
            out.push(u8::try_from(h * 16 + l).unwrap_or(u8::MAX));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// A port: 1–65535, digits only.
fn check_port(port: &str, endpoint: &str) -> Result<(), String> {
    if port.is_empty() {
        return Err(format!(
            "endpoint {} has an empty port",
            quote_endpoint(endpoint)
        ));
    }
    let number = port
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse::<u32>().ok())
        .flatten();
    match number {
        Some(1..=65535) => Ok(()),
        _ => Err(format!(
            "the port of endpoint {} is not a number from 1 to 65535 \
             (a user and password go before an @: USER:PASSWORD@HOST:PORT)",
            quote_endpoint(endpoint)
        )),
    }
}

/// A host: an IPv4 address, an IPv6 address in brackets, or an ASCII host
/// name (labels of A-Z a-z 0-9 - _ separated by dots).
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("a host name is empty".into());
    }
    if let Some(inner) = host.strip_prefix('[') {
        return match inner.strip_suffix(']').map(str::parse::<Ipv6Addr>) {
            Some(Ok(_)) => Ok(()),
            _ => Err(format!("host {} is not an IPv6 address", quoted(host))),
        };
    }
    if !host.is_ascii() {
        return Err(format!(
            "host {} is not an ASCII host name; write an internationalized name in its \
             xn-- (punycode) form",
            quoted(host)
        ));
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if host.len() <= 253 && host.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!(
            "host {} is not a host name (letters, digits, - and _ in dot-separated labels) \
             or an IP address (IPv6 in brackets: [::1])",
            quoted(host)
        ))
    }
}

/// `HOST:PORT` or `[IPV6]:PORT`.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.is_empty() {
        return Err("an endpoint is empty (two commas in a row, or a comma at an end)".into());
    }
    let (host, port) = if endpoint.starts_with('[') {
        match endpoint.split_once("]:") {
            Some((v6, port)) => (&endpoint[..=v6.len()], port),
            None => {
                return Err(format!(
                    "endpoint {} is not [IPV6]:PORT",
                    quote_endpoint(endpoint)
                ));
            }
        }
    } else {
        let Some((host, port)) = endpoint.rsplit_once(':') else {
            return Err(format!("endpoint {} has no :PORT", quoted(endpoint)));
        };
        if host.contains(':') {
            return Err(format!(
                "endpoint {} is not HOST:PORT (write an IPv6 address in brackets: [::1]:2379; \
                 a user and password go before an @: USER:PASSWORD@HOST:PORT)",
                quote_endpoint(endpoint)
            ));
        }
        (host, port)
    };
    check_host(host)?;
    check_port(port, endpoint)
}

/// The two stores addressed by `scheme://HOST:PORT[,…][/PATH]`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cluster {
    Etcd,
    ZooKeeper,
}

impl Cluster {
    fn scheme(self) -> &'static str {
        match self {
            Cluster::Etcd => "etcd",
            Cluster::ZooKeeper => "zk",
        }
    }

    fn path_name(self) -> &'static str {
        match self {
            Cluster::Etcd => "prefix",
            Cluster::ZooKeeper => "chroot",
        }
    }

    fn grammar(self) -> String {
        format!(
            "{}://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…][/{}][?{}]",
            self.scheme(),
            self.path_name().to_uppercase(),
            match self {
                Cluster::Etcd =>
                    "cacert=PATH&cert=PATH&key=PATH&password_file=PATH&layout=leasehold|concurrency",
                Cluster::ZooKeeper => "password_file=PATH&layout=leasehold|curator|kazoo",
            }
        )
    }
}

/// A prefix or chroot: `/SEGMENT[/SEGMENT…]`, each segment of A-Z a-z 0-9
/// . _ - and neither `.` nor `..`; one trailing `/` is dropped; `/` alone
/// or nothing is the default.
fn check_path(cluster: Cluster, path: &str) -> Result<String, String> {
    let what = cluster.path_name();
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() {
        return Ok(crate::store::etcd_default_prefix().to_owned());
    }
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "the {what} is {} bytes long, at most {MAX_PATH_LEN} allowed",
            path.len()
        ));
    }
    for segment in path.split('/').skip(1) {
        if segment.is_empty() {
            return Err(format!("the {what} {} has an empty segment", quoted(path)));
        }
        if segment == "." || segment == ".." {
            return Err(format!(
                "the {what} {} has a {segment:?} segment; give the path without . and ..",
                quoted(path)
            ));
        }
        if let Some(bad) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "the {what} {} contains {bad:?}; its segments may only have A-Z a-z 0-9 . _ -",
                quoted(path)
            ));
        }
    }
    if cluster == Cluster::ZooKeeper && (path == "/zookeeper" || path.starts_with("/zookeeper/")) {
        return Err("the chroot /zookeeper is ZooKeeper's own node; choose another".into());
    }
    Ok(path.to_owned())
}

/// The `?KEY=VALUE` options of an etcd or ZooKeeper URL.
const CLUSTER_OPTIONS: &[&str] = &["cacert", "cert", "key", "password_file"];

/// A percent-decoded part of a URL that must be UTF-8 text.
fn decoded(what: &str, s: &str) -> Result<String, String> {
    String::from_utf8(percent_decode(s))
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

/// `s` percent-encoded but for unreserved characters and the ones in
/// `keep`: what reads back through [`percent_decode`] as `s`.
fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `USER[:PASSWORD]` before the `@` of an etcd or ZooKeeper URL; errors
/// never quote either.
fn parse_credentials(credentials: &str) -> Result<(String, Option<Password>), String> {
    if credentials.contains(['/', '?', '#']) {
        return Err(
            "the user name or password holds '/', '?' or '#': write them \
             percent-encoded (%2F, %3F, %23)"
                .into(),
        );
    }
    let (user, password) = match credentials.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (credentials, None),
    };
    // Strict where tokio-postgres is lenient: a '%' not followed by two
    // hex digits is refused rather than taken literally, since a password
    // that happens to contain "%2F" would otherwise be silently changed.
    for (what, part) in [("user name", Some(user)), ("password", password)] {
        if let Some(part) = part
            && part.split('%').skip(1).any(|after| {
                after.len() < 2 || !after.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit)
            })
        {
            return Err(format!(
                "the {what} holds a '%' not followed by two hex digits: write a '%' as %25"
            ));
        }
    }
    if password == Some("") {
        return Err(
            "the password after ':' is empty; leave out the ':' (and give the \
             password by LEASEHOLD_STORE_PASSWORD or ?password_file=PATH), or give one"
                .into(),
        );
    }
    let user = decoded("user name", user)?;
    let password = password
        .map(|p| decoded("password", p).map(|p| Password::Given(Secret::new(p))))
        .transpose()?;
    Ok((user, password))
}

/// The `?cacert=…&cert=…&key=…&password_file=…` of an etcd or ZooKeeper
/// URL, into `security`.
fn parse_cluster_options(
    cluster: Cluster,
    query: &str,
    security: &mut Security,
    layout: &mut Layout,
) -> Result<(), String> {
    let known: &[&str] = match cluster {
        Cluster::Etcd => &["cacert", "cert", "key", "password_file", "layout"],
        Cluster::ZooKeeper => &["password_file", "layout"],
    };
    let mut seen: Vec<&str> = Vec::new();
    for pair in query.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(if pair.is_empty() {
                "an option is empty (&& or & at an end, or ? with nothing after)".into()
            } else {
                format!("option {} has no =VALUE", quoted(pair))
            });
        };
        if cluster == Cluster::ZooKeeper && CLUSTER_OPTIONS.contains(&key) && key != "password_file"
        {
            return Err(format!(
                "zk:// URLs take no ?{key}=: leasehold's ZooKeeper store does not speak TLS"
            ));
        }
        if !known.contains(&key) {
            return Err(format!(
                "unknown option {}; known are {}",
                quoted(key),
                known.join(", ")
            ));
        }
        if seen.contains(&key) {
            return Err(format!("option {key:?} is given twice"));
        }
        seen.push(key);
        if key == "layout" {
            *layout = Layout::parse(cluster, value)?;
            continue;
        }
        if value.is_empty() {
            return Err(format!("option {key:?} names no file"));
        }
        let path = PathBuf::from(decoded(&format!("{key} path"), value)?);
        match key {
            "cacert" => security.cacert = Some(path),
            "cert" => security.cert = Some(path),
            "key" => security.key = Some(path),
            _ => {
                if security.password.is_some() {
                    return Err(
                        "the password is given twice: in the URL and as ?password_file=".into(),
                    );
                }
                security.password = Some(Password::File(path));
            }
        }
    }
    Ok(())
}

/// `//[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…][/PATH][?OPTIONS]` after
/// `scheme:`: the endpoints, the path (the default if none) and the
/// security settings.
fn parse_cluster(
    cluster: Cluster,
    rest: &str,
) -> Result<(Vec<String>, String, Security, Layout), String> {
    let scheme = cluster.scheme();
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(format!("expected {}", cluster.grammar()));
    };
    if rest.contains('#') {
        return Err(format!(
            "{scheme}:// URLs take no #fragment (write a '#' in a password as %23)"
        ));
    }
    let mut security = Security::none();
    // Before anything is quoted: a password may be anywhere up to its '@'.
    let rest = match rest.split_once('@') {
        Some((credentials, rest)) => {
            if rest.contains('@') {
                return Err(
                    "the URL holds more than one '@': write an '@' in the user name \
                     or password as %40"
                        .into(),
                );
            }
            let (user, password) = parse_credentials(credentials)?;
            security.user = Some(user);
            security.password = password;
            rest
        }
        None => rest,
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let mut layout = Layout::Leasehold;
    if let Some(query) = query {
        parse_cluster_options(cluster, query, &mut security, &mut layout)?;
    }
    let (hosts, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if hosts.is_empty() {
        return Err(format!(
            "names no HOST:PORT; expected {}",
            cluster.grammar()
        ));
    }
    let mut endpoints = Vec::new();
    for endpoint in hosts.split(',') {
        check_endpoint(endpoint)?;
        endpoints.push(endpoint.to_owned());
    }
    // Another recipe's elections are joined below the path as its own
    // clients name them: no path means none, not leasehold's default; on
    // etcd, `/` alone is the root, so that `/E/` (an election a recipe's
    // client names `/E`) can be reached as well as `E/`.
    let path = if layout.is_foreign() && path.trim_end_matches('/').is_empty() {
        if cluster == Cluster::Etcd && path == "/" {
            "/".to_owned()
        } else {
            String::new()
        }
    } else {
        check_path(cluster, path)?
    };
    check_security(cluster, &security)?;
    Ok((endpoints, path, security, layout))
}

/// The rules on a URL's security settings that hold for every kind of
/// store addressed by `scheme://HOST:PORT`.
fn check_security(cluster: Cluster, security: &Security) -> Result<(), String> {
    let scheme = cluster.scheme();
    if let Some(user) = &security.user {
        if user.is_empty() {
            return Err("the user name before '@' is empty".into());
        }
        if cluster == Cluster::ZooKeeper && user.contains(':') {
            return Err(
                "a ZooKeeper digest user name cannot hold ':' (it separates the password)".into(),
            );
        }
    } else if security.password.is_some() {
        return Err(format!(
            "a password needs a user name: {scheme}://USER@HOST:PORT…"
        ));
    }
    let files = [
        ("cacert", &security.cacert),
        ("cert", &security.cert),
        ("key", &security.key),
    ];
    if let Some(Password::File(path)) = &security.password
        && path.as_os_str().is_empty()
    {
        return Err("option \"password_file\" names no file".into());
    }
    for (key, path) in files {
        if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(format!("option {key:?} names no file"));
        }
    }
    match cluster {
        Cluster::ZooKeeper => {
            if security.cacert.is_some() || security.cert.is_some() || security.key.is_some() {
                return Err("zk:// URLs take no ?cacert=, ?cert= or ?key=: leasehold's \
                     ZooKeeper store does not speak TLS"
                    .into());
            }
        }
        Cluster::Etcd => {
            if security.cert.is_some() != security.key.is_some() {
                return Err("?cert= and ?key= go together: give both, or neither".into());
            }
            if security.cert.is_some() && security.cacert.is_none() {
                return Err(
                    "?cert= and ?key= need ?cacert=PATH, the CA certificate that \
                     signed the server's (TLS is on when ?cacert= is given)"
                        .into(),
                );
            }
        }
    }
    Ok(())
}

/// `?cacert=…&cert=…&key=…&password_file=…` as parsed back by
/// [`parse_cluster_options`], or nothing.
fn render_cluster_options(security: &Security, layout: Layout) -> String {
    let password_file = match &security.password {
        Some(Password::File(path)) => Some(path),
        _ => None,
    };
    let mut out = String::new();
    for (key, path) in [
        ("cacert", security.cacert.as_ref()),
        ("cert", security.cert.as_ref()),
        ("key", security.key.as_ref()),
        ("password_file", password_file),
    ] {
        if let Some(path) = path {
            out.push(if out.is_empty() { '?' } else { '&' });
            out.push_str(key);
            out.push('=');
            out.push_str(&percent_encode(&path.to_string_lossy(), b"/"));
        }
    }
    if layout.is_foreign() {
        out.push(if out.is_empty() { '?' } else { '&' });
        out.push_str("layout=");
        out.push_str(layout.as_str());
    }
    out
}

/// `USER:***@`, `USER@` or nothing.
fn render_credentials(security: &Security) -> String {
    match &security.user {
        Some(user) => {
            let user = percent_encode(user, b"");
            match security.password {
                Some(Password::Given(_)) => format!("{user}:***@"),
                _ => format!("{user}@"),
            }
        }
        None => String::new(),
    }
}

fn check_cluster(
    cluster: Cluster,
    endpoints: &[String],
    path: &str,
    security: &Security,
    layout: Layout,
) -> Result<(), String> {
    if endpoints.is_empty() {
        return Err(format!(
            "names no HOST:PORT; expected {}",
            cluster.grammar()
        ));
    }
    for endpoint in endpoints {
        if endpoint.contains(['@', '?', '#', ',', '/']) {
            return Err(format!(
                "an endpoint holds one of @ ? # , /; expected {}",
                cluster.grammar()
            ));
        }
        check_endpoint(endpoint)?;
    }
    Layout::parse(cluster, layout.as_str())?;
    if layout.is_foreign() && (path.is_empty() || (cluster == Cluster::Etcd && path == "/")) {
        return check_security(cluster, security);
    }
    if !path.starts_with('/') || path.ends_with('/') {
        return Err(format!(
            "the {} must start with / and not end with /",
            cluster.path_name()
        ));
    }
    check_path(cluster, path)?;
    check_security(cluster, security)
}

/// A SQLite path: a plain file name, taken literally.
fn check_sqlite_path(path: &[u8]) -> Result<(), String> {
    if path.is_empty() {
        return Err("names no file; expected sqlite:PATH".into());
    }
    if path == b":memory:" {
        return Err(
            "\":memory:\" is SQLite's private in-memory database, which no other process \
             sees; use memory: for an in-process store, or a file"
                .into(),
        );
    }
    if path.starts_with(b"file:") {
        return Err(
            "SQLite URI file names (sqlite:file:…) are not supported; give a plain path".into(),
        );
    }
    if path.contains(&b'?') {
        return Err(
            "the SQLite path holds a '?': SQLite parameters (?mode=…, ?nolock=…) are not \
             supported, and leasehold does not take '?' in a file name"
                .into(),
        );
    }
    if path.contains(&0) {
        return Err("the SQLite path holds a NUL byte".into());
    }
    if path.len() > MAX_FILE_PATH_LEN {
        return Err(format!(
            "the SQLite path is {} bytes long, at most {MAX_FILE_PATH_LEN} allowed",
            path.len()
        ));
    }
    if path.ends_with(b"/") {
        return Err("the SQLite path ends with '/', which names a directory, not a file".into());
    }
    Ok(())
}

fn parse_sqlite(rest: &str) -> Result<StoreUrl, String> {
    let path = match rest.strip_prefix("//") {
        Some(absolute) if absolute.starts_with('/') => absolute,
        Some(_) => {
            return Err("sqlite:// must be followed by an absolute path, as in \
                 sqlite:///var/lib/leasehold.db; for a relative path write sqlite:PATH"
                .into());
        }
        None => rest,
    };
    check_sqlite_path(path.as_bytes())?;
    Ok(StoreUrl::Sqlite(PathBuf::from(path)))
}

/// A PostgreSQL URL split the way tokio-postgres reads it: the credentials
/// end at the first `@`, the hosts at the next `/` or `?`, the database
/// name at `?`; parameters are `KEY=VALUE` joined by `&`. All parts are as
/// written (percent-encoded).
#[derive(Debug)]
struct PgUrl<'a> {
    scheme: &'a str,
    user: Option<&'a str>,
    password: Option<&'a str>,
    hosts: &'a str,
    dbname: Option<&'a str>,
    params: Vec<(&'a str, &'a str)>,
}

/// A PostgreSQL schema leasehold may create its tables in.
fn check_schema(schema: &str) -> Result<(), String> {
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(format!(
            "schema {} must be 1–63 characters of a-z, 0-9 and _, not starting with a digit",
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
    fn parse(url: &'a str) -> Result<Self, String> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("postgres://") {
            ("postgres", rest)
        } else if let Some(rest) = url.strip_prefix("postgresql://") {
            ("postgresql", rest)
        } else {
            return Err(Self::GRAMMAR.into());
        };
        let (user, password, rest) = match rest.split_once('@') {
            Some((credentials, rest)) => {
                if credentials.contains(['/', '?', '#']) {
                    return Err(
                        "the user name or password holds '/', '?' or '#': write them \
                         percent-encoded (%2F, %3F, %23)"
                            .into(),
                    );
                }
                if rest.contains('@') {
                    return Err(
                        "the URL holds more than one '@': write an '@' in the user name \
                         or password, or after the host, as %40"
                            .into(),
                    );
                }
                let (user, password) = match credentials.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (credentials, None),
                };
                if password == Some("") {
                    return Err(
                        "the password after ':' is empty; leave out the ':' (and give \
                         the password by LEASEHOLD_STORE_PASSWORD or password_file=PATH), or \
                         give one"
                            .into(),
                    );
                }
                if user.is_empty() {
                    return Err("the user name before '@' is empty".into());
                }
                if std::str::from_utf8(&percent_decode(user)).is_err() {
                    return Err("the user name is not UTF-8 once percent-decoded".into());
                }
                (Some(user), password, rest)
            }
            None => (None, None, rest),
        };
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
        let mut params: Vec<(&str, &str)> = Vec::new();
        if let Some(query) = rest.strip_prefix('?') {
            for pair in query.split('&') {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(if pair.is_empty() {
                        "a parameter is empty (&& or & at an end, or ? with nothing after)".into()
                    } else {
                        format!("parameter {} has no =VALUE", quoted(pair))
                    });
                };
                if !(LEASEHOLD_POSTGRES_PARAMETERS.contains(&key)
                    || POSTGRES_PARAMETERS.contains(&key))
                {
                    return Err(format!(
                        "unknown parameter {} in the PostgreSQL URL; known are schema, \
                         sslrootcert, sslcert, sslkey, password_file and {}",
                        quoted(key),
                        POSTGRES_PARAMETERS.join(", ")
                    ));
                }
                if params.iter().any(|(k, _)| *k == key) {
                    return Err(format!("parameter {key:?} is given twice"));
                }
                params.push((key, value));
            }
        }
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

    fn param(&self, key: &str) -> Option<&'a str> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn check(&self) -> Result<(), String> {
        self.check_given_once()?;
        for chunk in self.hosts.split(',').filter(|_| !self.hosts.is_empty()) {
            let (host, port) = split_host_port(chunk)?;
            check_pg_host(host, chunk)?;
            if let Some(port) = port {
                check_port(port, chunk)?;
            }
        }
        self.check_host_params()?;
        self.check_tls()?;
        if let Some(schema) = self.param("schema") {
            check_schema(schema)?;
        }
        Ok(())
    }

    /// Refuses what is given both in the URL and as a parameter, and a URL
    /// without a host.
    fn check_given_once(&self) -> Result<(), String> {
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
    fn check_host_params(&self) -> Result<(), String> {
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
    fn check_tls(&self) -> Result<(), String> {
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
    fn tokio_postgres_url(&self) -> String {
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
    fn render(&self, redact: bool, with_schema: bool) -> String {
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
fn split_host_port(chunk: &str) -> Result<(&str, Option<&str>), String> {
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
fn check_pg_host(host: &str, chunk: &str) -> Result<(), String> {
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
const LEASEHOLD_POSTGRES_PARAMETERS: &[&str] = &[
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
    fn parse(value: &str) -> Option<Self> {
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

    fn tokio_postgres(self) -> &'static str {
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
fn check_with_tokio_postgres(url: &str) -> Result<(), String> {
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
fn check_with_tokio_postgres(_: &str) -> Result<(), String> {
    Ok(())
}

/// Takes leasehold's `schema` parameter out of a PostgreSQL URL; the rest
/// goes to tokio-postgres unchanged.
fn parse_postgres(url: &str) -> Result<StoreUrl, String> {
    let pg = PgUrl::parse(url)?;
    let schema = pg
        .param("schema")
        .unwrap_or(DEFAULT_POSTGRES_SCHEMA)
        .to_owned();
    let url = pg.render(false, false);
    check_with_tokio_postgres(&pg.tokio_postgres_url())?;
    Ok(StoreUrl::Postgres { url, schema })
}

/// The scheme of `url` if it looks like one (`[a-z][a-z0-9+.-]*`, short):
/// what an error may quote about an unknown scheme.
fn shown_scheme(scheme: &str) -> Option<&str> {
    let mut chars = scheme.chars();
    let looks_like_one = scheme.len() <= 32
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    looks_like_one.then_some(scheme)
}

impl StoreUrl {
    /// The default store: `sqlite:$XDG_STATE_HOME/leasehold/leasehold.db`,
    /// falling back to `~/.local/state/leasehold/leasehold.db`.
    pub fn default_sqlite() -> Result<Self> {
        let state_home = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|home| PathBuf::from(home).join(".local/state"))
            })
            .ok_or_else(|| {
                Error::invalid(
                    "store",
                    "no --store given and neither XDG_STATE_HOME nor HOME is set",
                )
            })?;
        Ok(StoreUrl::Sqlite(
            state_home.join("leasehold").join("leasehold.db"),
        ))
    }

    /// The URL with the password in [`PASSWORD_ENV`]
    /// (`LEASEHOLD_STORE_PASSWORD`) if that is set, as [`open`],
    /// [`open_read_only`] and [`release_orphaned`] take it: refused as
    /// [`StoreUrl::with_password`] refuses it, and when the variable is
    /// empty or not UTF-8 text. Unchanged when it is not set.
    pub fn with_password_from_env(self) -> Result<StoreUrl> {
        let Some(password) = std::env::var_os(PASSWORD_ENV) else {
            return Ok(self);
        };
        let Some(password) = password.to_str().filter(|p| !p.is_empty()) else {
            return Err(Error::invalid(
                "store password",
                format!(
                    "{PASSWORD_ENV} is empty or not UTF-8 text; unset it, or give the password"
                ),
            ));
        };
        self.with_password(Secret::new(password))
    }

    /// The URL with `password` as its password, as `LEASEHOLD_STORE_PASSWORD`
    /// gives it: refused if the URL already has one (in the URL or as a
    /// password file), names no user (etcd, ZooKeeper), or is a store that
    /// takes no password.
    pub fn with_password(self, password: Secret) -> Result<StoreUrl> {
        let refuse = |reason: &str| Err(Error::invalid("store password", reason.to_owned()));
        match self {
            StoreUrl::Etcd {
                endpoints,
                prefix,
                mut security,
                layout,
            } => {
                Self::add_password(&mut security, password).map_err(invalid)?;
                Ok(StoreUrl::Etcd {
                    endpoints,
                    prefix,
                    security,
                    layout,
                })
            }
            StoreUrl::ZooKeeper {
                endpoints,
                root,
                mut security,
                layout,
            } => {
                Self::add_password(&mut security, password).map_err(invalid)?;
                Ok(StoreUrl::ZooKeeper {
                    endpoints,
                    root,
                    security,
                    layout,
                })
            }
            StoreUrl::Postgres { url, schema } => {
                let pg = PgUrl::parse(&url).map_err(invalid)?;
                if pg.param("password_file").is_some() {
                    return refuse(
                        "a password is given twice: by password_file= and by \
                         LEASEHOLD_STORE_PASSWORD",
                    );
                }
                if pg.password.is_some() || pg.param("password").is_some() {
                    return refuse(
                        "a password is given twice: in the store URL and by \
                         LEASEHOLD_STORE_PASSWORD",
                    );
                }
                let separator = if pg.params.is_empty() { '?' } else { '&' };
                let url = format!(
                    "{url}{separator}password={}",
                    percent_encode(password.expose(), b"")
                );
                Ok(StoreUrl::Postgres { url, schema })
            }
            StoreUrl::Memory | StoreUrl::Sqlite(_) => refuse(
                "LEASEHOLD_STORE_PASSWORD is set, but memory: and sqlite: stores take no password",
            ),
        }
    }

    fn add_password(security: &mut Security, password: Secret) -> Result<(), String> {
        match security.password {
            Some(Password::File(_)) => {
                return Err("a password is given twice: by ?password_file= and by \
                     LEASEHOLD_STORE_PASSWORD"
                    .into());
            }
            Some(Password::Given(_)) => {
                return Err("a password is given twice: in the store URL and by \
                     LEASEHOLD_STORE_PASSWORD"
                    .into());
            }
            None => {}
        }
        if security.user.is_none() {
            return Err(
                "LEASEHOLD_STORE_PASSWORD is set, but the store URL names no user \
                 (USER@HOST:PORT)"
                    .into(),
            );
        }
        security.password = Some(Password::Given(password));
        Ok(())
    }

    /// How the store lays out its elections: `?layout=` of an etcd or
    /// ZooKeeper URL, leasehold's own for every other store.
    pub fn layout(&self) -> Layout {
        match self {
            StoreUrl::Etcd { layout, .. } | StoreUrl::ZooKeeper { layout, .. } => *layout,
            _ => Layout::Leasehold,
        }
    }

    /// Checks a URL built in code (rather than parsed) against the same
    /// grammar; [`open`] calls it before connecting.
    pub fn validate(&self) -> Result<()> {
        let checked = match self {
            StoreUrl::Memory => Ok(()),
            StoreUrl::Sqlite(path) => check_sqlite_path(path.as_os_str().as_encoded_bytes()),
            StoreUrl::Etcd {
                endpoints,
                prefix,
                security,
                layout,
            } => check_cluster(Cluster::Etcd, endpoints, prefix, security, *layout),
            StoreUrl::ZooKeeper {
                endpoints,
                root,
                security,
                layout,
            } => check_cluster(Cluster::ZooKeeper, endpoints, root, security, *layout),
            StoreUrl::Postgres { url, schema } => PgUrl::parse(url).and_then(|pg| {
                if pg.param("schema").is_some() {
                    return Err("the schema belongs in the schema field, not in the URL".into());
                }
                check_schema(schema)?;
                check_with_tokio_postgres(&pg.tokio_postgres_url())
            }),
        };
        checked.map_err(invalid)
    }
}

impl FromStr for StoreUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let Some((scheme, rest)) = url.split_once(':') else {
            let hint = if url.starts_with(['/', '.', '~']) {
                "; for a SQLite file write sqlite:PATH"
            } else {
                ""
            };
            return Err(invalid(format!("no scheme{hint}; expected {SCHEMES}")));
        };
        let parsed =
            match scheme {
                "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
                "memory" => Err("memory: takes nothing after the colon".to_owned()),
                "sqlite" => parse_sqlite(rest),
                "etcd" => parse_cluster(Cluster::Etcd, rest).map(
                    |(endpoints, prefix, security, layout)| StoreUrl::Etcd {
                        endpoints,
                        prefix,
                        security,
                        layout,
                    },
                ),
                "zk" => parse_cluster(Cluster::ZooKeeper, rest).map(
                    |(endpoints, root, security, layout)| StoreUrl::ZooKeeper {
                        endpoints,
                        root,
                        security,
                        layout,
                    },
                ),
                "postgres" | "postgresql" => parse_postgres(url),
                other => Err(match shown_scheme(other) {
                    Some(scheme) => format!("unknown scheme {scheme:?}; expected {SCHEMES}"),
                    None => format!("no valid scheme; expected {SCHEMES}"),
                }),
            }
            .map_err(invalid)?;
        parsed.validate()?;
        Ok(parsed)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => {
                let path = path.display().to_string();
                // `sqlite://x` would read back as `sqlite:` and `x`.
                let slashes = if path.starts_with("//") { "//" } else { "" };
                write!(f, "sqlite:{slashes}{path}")
            }
            StoreUrl::Etcd {
                endpoints,
                prefix,
                security,
                layout,
            } => write!(
                f,
                "etcd://{}{}{prefix}{}",
                render_credentials(security),
                shown_endpoints(endpoints).join(","),
                render_cluster_options(security, *layout)
            ),
            StoreUrl::ZooKeeper {
                endpoints,
                root,
                security,
                layout,
            } => write!(
                f,
                "zk://{}{}{root}{}",
                render_credentials(security),
                shown_endpoints(endpoints).join(","),
                render_cluster_options(security, *layout)
            ),
            // Without the password, if the URL has one.
            StoreUrl::Postgres { url, schema } => {
                let Ok(pg) = PgUrl::parse(url) else {
                    // Not a URL this module made; it may hold a password
                    // anywhere.
                    return f.write_str("postgres://(an invalid URL)");
                };
                f.write_str(&pg.render(true, true))?;
                if schema != DEFAULT_POSTGRES_SCHEMA && pg.param("schema").is_none() {
                    let sep = if pg.params.is_empty() { '?' } else { '&' };
                    write!(f, "{sep}schema={schema}")?;
                }
                Ok(())
            }
        }
    }
}

/// Endpoints as shown: one built in code with a user name or password
/// (which [`StoreUrl::validate`] refuses) shows `***@` instead.
fn shown_endpoints(endpoints: &[String]) -> Vec<String> {
    endpoints
        .iter()
        .map(|e| match e.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => e.clone(),
        })
        .collect()
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("Memory"),
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Etcd {
                endpoints,
                prefix,
                security,
                layout,
            } => f
                .debug_struct("Etcd")
                .field("endpoints", &shown_endpoints(endpoints))
                .field("prefix", prefix)
                .field("security", security)
                .field("layout", layout)
                .finish(),
            StoreUrl::ZooKeeper {
                endpoints,
                root,
                security,
                layout,
            } => f
                .debug_struct("ZooKeeper")
                .field("endpoints", &shown_endpoints(endpoints))
                .field("root", root)
                .field("security", security)
                .field("layout", layout)
                .finish(),
            StoreUrl::Postgres { schema, .. } => f
                .debug_struct("Postgres")
                .field("url", &self.to_string())
                .field("schema", schema)
                .finish(),
        }
    }
}

/// Fails when no endpoint's host name resolves: that is the cause to name,
/// rather than the client library's "no available hosts" later.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
async fn resolve_any(what: &str, endpoints: &[String]) -> Result<()> {
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match tokio::net::lookup_host(endpoint.as_str()).await {
            Ok(mut addrs) => {
                if addrs.next().is_some() {
                    return Ok(());
                }
                failures.push(format!("{endpoint}: no address"));
            }
            Err(error) => failures.push(format!("{endpoint}: {error}")),
        }
    }
    Err(Error::Unavailable {
        reason: format!(
            "cannot resolve the host name of any {what} endpoint ({})",
            failures.join("; ")
        ),
        source: None,
    })
}

/// Opens the store a URL names (connecting to it, for a remote store),
/// after checking the URL against the grammar ([`StoreUrl::validate`]).
///
/// The password may come from the environment variable
/// `LEASEHOLD_STORE_PASSWORD` ([`PASSWORD_ENV`]) instead of the URL, as
/// for the command line: the URL then names only the user (etcd,
/// ZooKeeper; PostgreSQL may take its user from elsewhere too). While it
/// is set, a URL that holds a password (or a `password_file`) and a store
/// that takes none (`memory:`, `sqlite:`) are refused
/// ([`StoreUrl::with_password_from_env`]).
pub async fn open(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    open_checked(&url.clone().with_password_from_env()?).await
}

/// [`open`] of a URL already checked, its password from the environment
/// already taken.
async fn open_checked(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => Ok(Arc::new(crate::store::sqlite::SqliteStore::open(path)?)),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no sqlite support (cargo feature \"sqlite\")",
        )),
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd {
            endpoints,
            prefix,
            security,
            layout,
        } => {
            resolve_any("etcd", endpoints).await?;
            Ok(Arc::new(
                crate::store::etcd::EtcdStore::connect_with_layout(
                    endpoints, prefix, security, *layout,
                )
                .await?,
            ))
        }
        #[cfg(not(feature = "etcd"))]
        StoreUrl::Etcd { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no etcd support (cargo feature \"etcd\")",
        )),
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper {
            endpoints,
            root,
            security,
            layout,
        } => {
            resolve_any("ZooKeeper", endpoints).await?;
            Ok(Arc::new(
                crate::store::zookeeper::ZkStore::connect_with_layout(
                    endpoints, root, security, *layout,
                )
                .await?,
            ))
        }
        #[cfg(not(feature = "zookeeper"))]
        StoreUrl::ZooKeeper { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no ZooKeeper support (cargo feature \"zookeeper\")",
        )),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres { url, schema } => Ok(Arc::new(
            crate::store::postgres::PostgresStore::connect(url, schema).await?,
        )),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no PostgreSQL support (cargo feature \"postgres\")",
        )),
    }
}

/// Releases `grant`, whose holder's process is known to be dead (a
/// runner's guard does this after its runner died), through a connection
/// opened for this alone: guarded by the token as [`Store::resign`] is, it
/// never removes a successor's grant. PostgreSQL and ZooKeeper skip the
/// checks of a first use (the holder's process made them when it opened
/// the store) and start no watch, so the release goes out after one
/// connection; SQLite and etcd open as [`open`] does.
pub async fn release_orphaned(url: &StoreUrl, grant: &crate::store::Grant) -> Result<()> {
    open_to_release(url).await?.release_orphaned(grant).await
}

/// Opens the store a URL names for [`release_orphaned`] and nothing else
/// (see there): on PostgreSQL and ZooKeeper, without the checks of a first
/// use and without watches.
pub async fn open_to_release(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    let url = &url.clone().with_password_from_env()?;
    Ok(match url {
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper {
            endpoints,
            root,
            security,
            layout,
        } => {
            resolve_any("ZooKeeper", endpoints).await?;
            Arc::new(crate::store::zookeeper::ZkStore::to_release(
                endpoints, root, security, *layout,
            )?)
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres { url, schema } => {
            Arc::new(crate::store::postgres::PostgresStore::connect_to_release(url, schema).await?)
        }
        _ => open_checked(url).await?,
    })
}

/// Opens the store a URL names for reading only — what `status`, `list`
/// and `observe` need — as [`open`] does, but creating nothing and writing
/// nothing: no file, folder, schema, node, key or marker. A store that does
/// not exist yet is [`Error::NotFound`]; on the store returned, sessions
/// and campaigns fail with [`Error::InvalidInput`].
///
/// SQLite (`SqliteStore::open_read_only`), etcd
/// (`EtcdStore::connect_read_only`), ZooKeeper
/// (`ZkStore::connect_read_only`) and PostgreSQL
/// (`PostgresStore::connect_read_only`) open read-only; `memory:` is a
/// new, empty store either way.
pub async fn open_read_only(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    let url = &url.clone().with_password_from_env()?;
    #[cfg(feature = "sqlite")]
    if let StoreUrl::Sqlite(path) = url {
        return Ok(Arc::new(crate::store::sqlite::SqliteStore::open_read_only(
            path,
        )?));
    }
    #[cfg(feature = "etcd")]
    if let StoreUrl::Etcd {
        endpoints,
        prefix,
        security,
        layout,
    } = url
    {
        resolve_any("etcd", endpoints).await?;
        return Ok(Arc::new(
            crate::store::etcd::EtcdStore::connect_read_only_with_layout(
                endpoints, prefix, security, *layout,
            )
            .await?,
        ));
    }
    #[cfg(feature = "zookeeper")]
    if let StoreUrl::ZooKeeper {
        endpoints,
        root,
        security,
        layout,
    } = url
    {
        resolve_any("ZooKeeper", endpoints).await?;
        return Ok(Arc::new(
            crate::store::zookeeper::ZkStore::connect_read_only_with_layout(
                endpoints, root, security, *layout,
            )
            .await?,
        ));
    }
    #[cfg(feature = "postgres")]
    if let StoreUrl::Postgres { url, schema } = url {
        return Ok(Arc::new(
            crate::store::postgres::PostgresStore::connect_read_only(url, schema).await?,
        ));
    }
    open(url).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refused(url: &str) -> String {
        match url.parse::<StoreUrl>() {
            Err(Error::InvalidInput { what, reason }) => {
                assert_eq!(what, "store URL", "{url:?}");
                format!("invalid {what}: {reason}")
            }
            other => panic!("{url:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn parses_known_schemes() {
        assert_eq!("memory:".parse::<StoreUrl>().ok(), Some(StoreUrl::Memory));
        assert_eq!(
            "sqlite:/var/lib/x.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("/var/lib/x.db".into()))
        );
        assert_eq!(
            "sqlite:///var/lib/x.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("/var/lib/x.db".into()))
        );
        assert_eq!(
            "sqlite:rel.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("rel.db".into()))
        );
        assert_eq!(
            "etcd://10.0.0.1:2379,10.0.0.2:2379/team/jobs/"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                prefix: "/team/jobs".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            })
        );
        assert_eq!(
            "etcd://localhost:2379".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Etcd {
                endpoints: vec!["localhost:2379".into()],
                prefix: "/leasehold".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            })
        );
        assert_eq!(
            "etcd://[::1]:2379,db-1.example_x.org:65535/"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Etcd {
                endpoints: vec!["[::1]:2379".into(), "db-1.example_x.org:65535".into()],
                prefix: "/leasehold".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            })
        );
    }

    #[test]
    fn parses_a_recipes_layout_and_shows_it_back() {
        let parsed: StoreUrl = "etcd://h:1?layout=concurrency".parse().expect("valid");
        assert_eq!(
            parsed,
            StoreUrl::Etcd {
                endpoints: vec!["h:1".into()],
                prefix: String::new(),
                security: Security::none(),
                layout: Layout::Concurrency,
            },
            "no path is no prefix in a recipe's layout, not leasehold's default"
        );
        assert_eq!(parsed.to_string(), "etcd://h:1?layout=concurrency");
        // The root: elections `/E/`, as `etcdctl elect /E` names them.
        let root: StoreUrl = "etcd://h:1/?layout=concurrency".parse().expect("valid");
        assert!(matches!(&root, StoreUrl::Etcd { prefix, .. } if prefix == "/"));
        assert_eq!(root.to_string(), "etcd://h:1/?layout=concurrency");
        for url in [
            "etcd://h:1/team/svc?layout=concurrency",
            "etcd://h:1/p?cacert=/ca.pem&layout=concurrency",
            "zk://h:1/app?layout=curator",
            "zk://h:1?layout=kazoo",
            "zk://h:1/app",
        ] {
            let parsed: StoreUrl = url.parse().expect(url);
            assert_eq!(parsed.to_string(), url);
            assert_eq!(parsed.to_string().parse::<StoreUrl>().ok(), Some(parsed));
        }
        assert_eq!(
            "zk://h:1/app?layout=leasehold"
                .parse::<StoreUrl>()
                .map(|u| u.layout())
                .ok(),
            Some(Layout::Leasehold)
        );
        for bad in [
            "etcd://h:1?layout=curator",
            "etcd://h:1?layout=kazoo",
            "zk://h:1?layout=concurrency",
            "zk://h:1?layout=",
            "zk://h:1?layout=Curator",
            "etcd://h:1?layout=concurrency&layout=concurrency",
        ] {
            assert!(
                matches!(bad.parse::<StoreUrl>(), Err(Error::InvalidInput { .. })),
                "{bad} must be refused"
            );
        }
        // Built in code: a recipe's layout for the wrong store is refused.
        let wrong = StoreUrl::ZooKeeper {
            endpoints: vec!["h:1".into()],
            root: String::new(),
            security: Security::none(),
            layout: Layout::Concurrency,
        };
        assert!(wrong.validate().is_err());
    }

    #[test]
    fn parses_zookeeper_and_postgres() {
        assert_eq!(
            "zk://a:2181,b:2181".parse::<StoreUrl>().ok(),
            Some(StoreUrl::ZooKeeper {
                endpoints: vec!["a:2181".into(), "b:2181".into()],
                root: "/leasehold".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            })
        );
        assert_eq!(
            "postgres://u@h/db?schema=jobs&sslmode=disable"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Postgres {
                url: "postgres://u@h/db?sslmode=disable".into(),
                schema: "jobs".into()
            })
        );
        let with_password: StoreUrl = "postgres://u:secret@h/db".parse().expect("valid");
        assert_eq!(with_password.to_string(), "postgres://u:***@h/db");
        assert!(!format!("{with_password:?}").contains("secret"));
        // What tokio-postgres understands is passed on.
        for url in [
            "postgresql://u:p%40ss@h1:5432,[::1]:5433/db?application_name=x&connect_timeout=5",
            "postgres:///db?host=%2Frun%2Fpostgresql&user=me",
            "postgres:///db?host=%2Frun%2Fpostgresql&port=5433&target_session_attrs=read-write",
            "postgres://a,b:5433/db?hostaddr=10.0.0.1,10.0.0.2",
            "postgres://h/db?password=secret&sslmode=prefer&keepalives_idle=30",
        ] {
            let parsed: StoreUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(!parsed.to_string().contains("secret"), "{parsed}");
            assert!(!format!("{parsed:?}").contains("secret"), "{parsed:?}");
        }
    }

    #[test]
    fn rejects_bad_urls_with_reason() {
        for (url, needle) in [
            ("", "no scheme"),
            ("/tmp/x.db", "for a SQLite file write sqlite:PATH"),
            ("redis://x", "unknown scheme \"redis\""),
            ("sqlite:", "names no file"),
            ("memory:foo", "takes nothing after the colon"),
            ("zk:127.0.0.1:2181", "expected zk://"),
            ("zk://127.0.0.1", "no :PORT"),
            ("zk://h:1/a//b", "empty segment"),
            ("zk://", "names no HOST:PORT"),
            ("postgres://h/db?schema=Bad-Name", "schema \"Bad-Name\""),
            ("postgresql://h/db?schema=", "schema \"\""),
            ("postgres://h/db?schema=9lives", "not starting with a digit"),
            ("postgres:h/db", "expected postgres://"),
            ("postgres:///db", "names no host"),
            ("postgres://h/db?", "a parameter is empty"),
            ("postgres://h/db?sslmode", "has no =VALUE"),
            (
                "postgres://h/db?sslmode=bogus",
                "invalid value for option `sslmode`",
            ),
            (
                "postgres://h/db?sslmode=verify-full",
                "needs sslrootcert=PATH",
            ),
            (
                "postgres://h/db?sslmode=verify-ca",
                "needs sslrootcert=PATH",
            ),
            ("postgres://h/db?sslcert=/c.pem", "go together"),
            (
                "postgres://h/db?sslmode=disable&sslrootcert=/ca",
                "turns TLS off",
            ),
            ("postgres://h/db?sslrootcert=", "names no file"),
            (
                "postgres://u:pw@h/db?password_file=/pw",
                "password is given twice",
            ),
            (
                "postgres://h/db?password=pw&password_file=/pw",
                "password is given twice",
            ),
            ("postgres://u@h/db?user=v", "user name is given twice"),
            ("postgres://h/db?port=5433", "hosts are given twice"),
            (
                "postgres://a,b/db?hostaddr=10.0.0.1",
                "2 host(s) but 1 ?hostaddr=",
            ),
            (
                "postgres:///db?hostaddr=10.0.0.1,10.0.0.2&port=1,2,3",
                "3 ports for 2 host(s)",
            ),
            ("postgres:///db?host=a,b", "?host= takes one host"),
            (
                "postgres:///db?host=h&port=5432,5433",
                "2 ports for 1 host(s)",
            ),
            ("postgres://h:/db", "empty port"),
            ("etcd:127.0.0.1:2379", "expected etcd://"),
            ("etcd://127.0.0.1", "no :PORT"),
            ("etcd://127.0.0.1:x", "not a number from 1 to 65535"),
            ("etcd://127.0.0.1:+1", "not a number from 1 to 65535"),
            ("etcd://a:1,,b:2", "an endpoint is empty"),
            ("etcd://::1:2379", "write an IPv6 address in brackets"),
            ("etcd://[::g]:2379", "not an IPv6 address"),
            ("etcd://a..b:2379", "is not a host name"),
            ("etcd://h:1/p#x", "no #fragment"),
            ("etcd://h:1/has space", "contains ' '"),
            ("SQLITE:/x.db", "unknown scheme \"SQLITE\""),
        ] {
            let err = refused(url);
            assert!(err.contains(needle), "{url:?}: {err}");
        }
    }

    /// Issue 13 item 3: every case is either supported or refused with a
    /// reason, the same in every form, never quoting a password.
    #[test]
    fn issue_13_urls_are_one_grammar() {
        for (url, needle) in [
            ("sqlite::memory:", "in-memory database"),
            ("sqlite:file:/tmp/a.db?nolock=1", "URI file names"),
            ("sqlite:file:a.db", "URI file names"),
            ("sqlite:/tmp/q.db?mode=ro", "SQLite parameters"),
            ("sqlite://tmp/q.db", "absolute path"),
            ("sqlite:/tmp/dir/", "names a directory"),
            ("etcd://127.0.0.1:2379/p?x=1", "unknown option \"x\""),
            ("etcd://h:1?cert=/c.pem&key=/k.pem", "need ?cacert=PATH"),
            ("etcd://h:1?cacert=/ca&cert=/c.pem", "go together"),
            ("etcd://h:1?cacert=", "names no file"),
            ("etcd://h:1?cacert=/a&cacert=/b", "given twice"),
            ("etcd://h:1?cacert", "has no =VALUE"),
            ("etcd://h:1?", "an option is empty"),
            ("etcd://:Sup3rSecret@h:1", "user name before '@' is empty"),
            ("etcd://u:Sup3r/Secret@h:1", "percent-encoded"),
            ("etcd://u:Sup3r@Secret@h:1", "more than one '@'"),
            ("etcd://u:Sup3r#Secret@h:1", "no #fragment"),
            ("etcd://u:Sup3rSecret@h:1?password_file=/p", "given twice"),
            ("etcd://h:1?password_file=/p", "needs a user name"),
            ("etcd://u:%FFSup3rSecret@h:1", "not UTF-8"),
            (
                "zk://u:Sup3rSecret@h:2181/x?cacert=/ca.pem",
                "does not speak TLS",
            ),
            ("zk://h:2181/x?bogus=1", "known are password_file"),
            ("zk://a%3Ab:Sup3rSecret@h:2181", "cannot hold ':'"),
            ("etcd://app:@h:1", "the password after ':' is empty"),
            ("postgres://app:@h/db", "the password after ':' is empty"),
            (
                "etcd://app:Sup3r%zzSecret@h:1",
                "not followed by two hex digits",
            ),
            (
                "zk://app:Sup3rSecret%2@h:1",
                "not followed by two hex digits",
            ),
            (
                "etcd://127.0.0.1:0",
                "port of endpoint \"127.0.0.1:…\" is not a number",
            ),
            ("etcd://127.0.0.1:65536", "not a number from 1 to 65535"),
            (
                "zk://h:99999999999999999999999",
                "not a number from 1 to 65535",
            ),
            ("memory://", "takes nothing after the colon"),
            ("memory:foo", "takes nothing after the colon"),
            (
                "postgres://h/db?schema=a&schema=b",
                "\"schema\" is given twice",
            ),
            (
                "postgres://postgres:Sup3rSecret@h:99999/db",
                "port of endpoint \"h:…\"",
            ),
            ("postgres://h/db?foo=bar", "unknown parameter \"foo\""),
            (
                "postgres://u:Sup3rSecret@h/db?foo=bar",
                "unknown parameter \"foo\"",
            ),
            ("postgres://u:Sup3r/Secret@h/db", "percent-encoded"),
            ("postgres://u:Sup3r@Secret@h/db", "more than one '@'"),
            (
                "postgres://h/db?password=Sup3rSecret&password=x",
                "given twice",
            ),
            ("zk://h:1/a/../b", "\"..\" segment"),
            ("etcd://h:1/a/./b", "\".\" segment"),
            ("zk://h:1/zookeeper", "ZooKeeper's own"),
            ("zk://h:1/zookeeper/quota", "ZooKeeper's own"),
            (
                "postgres://h/db?schema=pg_catalog",
                "one of PostgreSQL's own",
            ),
            (
                "postgres://h/db?schema=information_schema",
                "one of PostgreSQL's own",
            ),
            ("postgres://h/db?schema=public", "one of PostgreSQL's own"),
            ("zk://hôst:2181", "not an ASCII host name"),
            ("u:Sup3rSecret@host/db", "unknown scheme \"u\""),
        ] {
            let err = refused(url);
            assert!(err.contains(needle), "{url:?}: {err}");
            assert!(!err.contains("Sup3r"), "{url:?} shows the password: {err}");
            assert!(!err.contains(url), "{url:?} is quoted whole: {err}");
        }
    }

    #[test]
    fn parses_credentials_and_tls_options() {
        let parsed: StoreUrl =
            "etcd://ro%40ot:p%3Aw%2Fd@h:1/jobs?cacert=/etc/ca%20x.pem&cert=/c.pem&key=/k.pem"
                .parse()
                .expect("valid");
        let StoreUrl::Etcd {
            endpoints,
            prefix,
            security,
            layout: Layout::Leasehold,
        } = &parsed
        else {
            panic!("{parsed:?}");
        };
        assert_eq!(
            (endpoints.as_slice(), prefix.as_str()),
            (&["h:1".to_owned()][..], "/jobs")
        );
        assert_eq!(security.user.as_deref(), Some("ro@ot"));
        assert_eq!(
            security.password,
            Some(Password::Given(Secret::new("p:w/d")))
        );
        assert_eq!(security.cacert, Some(PathBuf::from("/etc/ca x.pem")));
        assert!(security.tls());
        assert_eq!(
            parsed.to_string(),
            "etcd://ro%40ot:***@h:1/jobs?cacert=/etc/ca%20x.pem&cert=/c.pem&key=/k.pem"
        );
        let from_file: StoreUrl = "zk://app@h:2181/x?password_file=/run/secrets/zk"
            .parse()
            .expect("valid");
        let StoreUrl::ZooKeeper { security, .. } = &from_file else {
            panic!("{from_file:?}");
        };
        assert_eq!(
            security.password,
            Some(Password::File("/run/secrets/zk".into()))
        );
        // A user alone is valid (a certificate may authenticate, or the
        // password may come from LEASEHOLD_STORE_PASSWORD).
        assert!("etcd://app@h:1".parse::<StoreUrl>().is_ok());
        let pg: StoreUrl = "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem&password_file=/pw"
            .parse()
            .expect("valid");
        let StoreUrl::Postgres { url, .. } = &pg else {
            panic!("{pg:?}");
        };
        let connect = postgres_connect(url).expect("splits");
        assert_eq!(connect.sslmode, PgSslMode::VerifyFull);
        assert_eq!(
            connect.tokio_postgres_url.expose(),
            "postgres://u@h/db?sslmode=require"
        );
        assert_eq!(connect.tls.cacert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(connect.tls.password, Some(Password::File("/pw".into())));
    }

    #[test]
    fn a_password_from_the_environment_joins_the_url_unseen() {
        let secret = || Secret::new("Sup3r&Secret");
        let etcd: StoreUrl = "etcd://app@h:1".parse().expect("valid");
        let with = etcd.with_password(secret()).expect("takes it");
        assert!(!format!("{with} {with:?}").contains("Sup3r"), "{with}");
        assert_eq!(with.to_string(), "etcd://app:***@h:1/leasehold");
        let pg: StoreUrl = "postgres://app@h/db?sslmode=disable"
            .parse()
            .expect("valid");
        let with = pg.with_password(secret()).expect("takes it");
        let StoreUrl::Postgres { url, .. } = &with else {
            panic!("{with:?}");
        };
        let config: tokio_postgres::Config = postgres_connect(url)
            .expect("splits")
            .tokio_postgres_url
            .expose()
            .parse()
            .expect("tokio-postgres reads it");
        assert_eq!(config.get_password(), Some(&b"Sup3r&Secret"[..]));
        assert!(!format!("{with} {with:?}").contains("Sup3r"));
        for (url, needle) in [
            ("etcd://h:1", "names no user"),
            ("etcd://app:other@h:1", "given twice"),
            (
                "zk://app@h:1?password_file=/pw",
                "by ?password_file= and by",
            ),
            ("postgres://app:other@h/db", "given twice"),
            (
                "postgres://app@h/db?password_file=/pw",
                "by password_file= and by",
            ),
            ("sqlite:/x.db", "take no password"),
            ("memory:", "take no password"),
        ] {
            let parsed: StoreUrl = url.parse().expect("valid");
            let error = parsed.with_password(secret()).expect_err(url).to_string();
            assert!(error.contains(needle), "{url}: {error}");
            assert!(!error.contains("Sup3r"), "{error}");
        }
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "memory:",
            "sqlite:/a/b.db",
            "sqlite:rel/b.db",
            "sqlite:////twice/b.db",
            "etcd://h:1,k:2/p",
            "etcd://[::1]:2379/leasehold",
            "etcd://app@h:1/p?cacert=/ca.pem&cert=/c.pem&key=/k.pem&password_file=/run/pw",
            "etcd://h:1/leasehold?cacert=/a%26b.pem",
            "zk://app@h:1/jobs?password_file=/pw",
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c&sslkey=/k",
            "zk://h:1,k:2/jobs",
            "postgres://u@h:5432/db",
            "postgresql://u@h/db?sslmode=disable&schema=jobs",
            "postgres:///db?host=%2Frun%2Fpostgresql",
        ] {
            let parsed: StoreUrl = url.parse().expect("valid");
            assert_eq!(parsed.to_string(), url);
        }
    }

    /// A URL built in code meets the same grammar: `open` refuses it before
    /// connecting or creating anything.
    #[tokio::test]
    async fn open_checks_urls_built_in_code_before_connecting() {
        let dir = tempfile::tempdir().expect("temp dir");
        let memory = dir.path().join(":memory:");
        for url in [
            StoreUrl::Sqlite(":memory:".into()),
            StoreUrl::Sqlite("file:x.db?nolock=1".into()),
            StoreUrl::Sqlite(dir.path().join("q.db?mode=ro")),
            StoreUrl::Etcd {
                endpoints: vec!["127.0.0.1:0".into()],
                prefix: "/p".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            },
            StoreUrl::Etcd {
                endpoints: vec!["u:Sup3rSecret@h:1".into()],
                prefix: "/p".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            },
            StoreUrl::Etcd {
                endpoints: vec![],
                prefix: "/p".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            },
            StoreUrl::ZooKeeper {
                endpoints: vec!["h:1".into()],
                root: "/a/../b".into(),
                security: Security::none(),
                layout: Layout::Leasehold,
            },
            StoreUrl::Postgres {
                url: "postgres://u:Sup3rSecret@h/db?foo=bar".into(),
                schema: "leasehold".into(),
            },
            StoreUrl::Postgres {
                url: "postgres://h/db".into(),
                schema: "pg_toast".into(),
            },
        ] {
            let shown = format!("{url:?} {url}");
            assert!(!shown.contains("Sup3r"), "{shown}");
            match open(&url).await {
                Err(Error::InvalidInput { reason, .. }) => {
                    assert!(!reason.contains("Sup3r"), "{reason}");
                }
                Err(other) => panic!("{shown}: {other}"),
                Ok(_) => panic!("{shown} was opened"),
            }
        }
        assert!(!memory.exists());
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        assert!(!std::path::Path::new(":memory:-notify").exists());
    }

    /// Issue 13 item 7: an unresolvable host is named as such, before the
    /// client library's "no available hosts".
    #[tokio::test]
    async fn an_unresolvable_host_is_named() {
        for url in [
            "zk://no-such-host.invalid:2181",
            "etcd://no-such-host.invalid:2379",
        ] {
            let url: StoreUrl = url.parse().expect("valid");
            let Err(error) = open(&url).await else {
                panic!("{url} opened");
            };
            let text = error.to_string();
            assert!(error.is_transient(), "{text}");
            assert!(
                text.contains("cannot resolve the host name")
                    && text.contains("no-such-host.invalid:"),
                "{text}"
            );
        }
    }

    /// A password-bearing URL with the password made distinctive: `PW` and
    /// at least four more characters, none of them `@`.
    fn with_password() -> impl Strategy<Value = (String, String)> {
        (
            prop::sample::select(vec![
                "postgres",
                "postgresql",
                "etcd",
                "zk",
                "sqlite",
                "memory",
                "redis",
                "",
            ]),
            "[a-z]{0,6}",
            "PW[A-Za-z0-9!$&'()*+,;=:/?#%._~-]{4,16}",
            "[a-z0-9.:/?=&,@%\\[\\]_-]{0,30}",
        )
            .prop_map(|(scheme, user, password, rest)| {
                (format!("{scheme}://{user}:{password}@{rest}"), password)
            })
    }

    /// Credentials whose `@` was forgotten: `USER:PASSWORD` then reads
    /// as an endpoint, its password as a port.
    fn with_password_and_no_at() -> impl Strategy<Value = (String, String)> {
        (
            prop::sample::select(vec!["postgres", "postgresql", "etcd", "zk"]),
            "[a-z]{0,6}",
            "PW[A-Za-z0-9!$&'()*+;=._~-]{4,16}",
            prop::sample::select(vec!["", ":2379", ",h:1", "/p", "/db?sslmode=require", "?x"]),
        )
            .prop_map(|(scheme, user, password, rest)| {
                (format!("{scheme}://{user}:{password}{rest}"), password)
            })
    }

    fn with_password_parameter() -> impl Strategy<Value = (String, String)> {
        (
            "[a-z0-9.:/,@%_-]{0,20}",
            "PW[A-Za-z0-9!$'()*+,;:/?%._~-]{4,16}",
            "[a-z0-9.:/?=&,@%_-]{0,20}",
        )
            .prop_map(|(before, password, after)| {
                (
                    format!("postgres://{before}?password={password}&{after}"),
                    password,
                )
            })
    }

    /// What a parse gives: a valid URL that reads back as itself, or an
    /// `InvalidInput` about the store URL.
    fn parses_or_is_refused(url: &str) -> std::result::Result<(), TestCaseError> {
        match url.parse::<StoreUrl>() {
            Ok(parsed) => {
                prop_assert!(parsed.validate().is_ok(), "{:?}", parsed);
                let shown = parsed.to_string();
                if !shown.contains("***") {
                    prop_assert_eq!(shown.parse::<StoreUrl>().ok(), Some(parsed));
                }
            }
            Err(Error::InvalidInput { what, reason }) => {
                prop_assert_eq!(what, "store URL");
                prop_assert!(!reason.is_empty());
                prop_assert!(!reason.contains('\n'), "{}", reason);
            }
            Err(other) => prop_assert!(false, "{url:?}: {other:?}"),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any string at all: no panic; a valid store URL or a one-line
        /// InvalidInput.
        #[test]
        fn any_string_is_a_valid_url_or_refused(url in ".*") {
            parses_or_is_refused(&url)?;
        }

        /// Strings made of URL characters after each scheme, to reach
        /// deeper into each grammar.
        #[test]
        fn url_like_strings_are_valid_or_refused(
            scheme in prop::sample::select(vec![
                "memory:", "sqlite:", "sqlite://", "etcd://", "zk://", "postgres://", "postgresql://",
            ]),
            rest in "[a-zA-Z0-9.:/?=&,@%#\\[\\]_ ~-]{0,40}",
        ) {
            parses_or_is_refused(&format!("{scheme}{rest}"))?;
        }

        /// Never a password in an error, in `Display` or in `Debug`.
        #[test]
        fn a_password_is_never_shown(
            (url, password) in prop_oneof![
                with_password(),
                with_password_and_no_at(),
                with_password_parameter(),
            ],
        ) {
            parses_or_is_refused(&url)?;
            let shown = match url.parse::<StoreUrl>() {
                Ok(parsed) => format!("{parsed} {parsed:?}"),
                Err(error) => error.to_string(),
            };
            prop_assert!(!shown.contains(&password), "{} shows {}: {}", url, password, shown);
        }
    }
}
