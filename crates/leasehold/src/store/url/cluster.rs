//! The etcd and ZooKeeper URL grammar: endpoints, credentials, the path,
//! options, and the security they give.

use super::*;

/// A port: 1–65535, digits only.
pub(super) fn check_port(port: &str, endpoint: &str) -> Result<(), String> {
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
pub(super) fn check_host(host: &str) -> Result<(), String> {
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
pub(super) fn check_endpoint(endpoint: &str) -> Result<(), String> {
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
pub(super) enum Cluster {
    Etcd,
    ZooKeeper,
}

impl Cluster {
    pub(super) fn scheme(self) -> &'static str {
        match self {
            Cluster::Etcd => "etcd",
            Cluster::ZooKeeper => "zk",
        }
    }

    pub(super) fn path_name(self) -> &'static str {
        match self {
            Cluster::Etcd => "prefix",
            Cluster::ZooKeeper => "chroot",
        }
    }

    pub(super) fn grammar(self) -> String {
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
pub(super) fn check_path(cluster: Cluster, path: &str) -> Result<String, String> {
    let what = cluster.path_name();
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() {
        return Ok(crate::store::etcd_default_prefix().to_owned());
    }
    check_len(what, path.len(), MAX_PATH_LEN)?;
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

/// A percent-decoded part of a URL that must be UTF-8 text.
pub(super) fn decoded(what: &str, s: &str) -> Result<String, String> {
    String::from_utf8(percent_decode(s))
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

/// `USER[:PASSWORD]` before the `@` of an etcd or ZooKeeper URL; errors
/// never quote either.
/// Refuses a user name or password holding a '%' not followed by two hex
/// digits. Strict where tokio-postgres is lenient: such a '%' is not taken
/// literally, since a password that happens to contain "%2F" would
/// otherwise be silently changed. Every store's URL is read so.
pub(super) fn check_escapes(user: &str, password: Option<&str>) -> Result<(), String> {
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
    Ok(())
}

pub(super) fn parse_credentials(credentials: &str) -> Result<(String, Option<Password>), String> {
    let (user, password) = split_credentials(credentials)?;
    let user = decoded("user name", user)?;
    let password = password
        .map(|p| decoded("password", p).map(|p| Password::Given(Secret::new(p))))
        .transpose()?;
    Ok((user, password))
}

/// `USER[:PASSWORD]` before a URL's `@`, split as written (percent-encoded):
/// refused if it holds what must be escaped, or a `:` before no password.
pub(super) fn split_credentials(credentials: &str) -> Result<(&str, Option<&str>), String> {
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
    check_escapes(user, password)?;
    if password == Some("") {
        return Err(
            "the password after ':' is empty; leave out the ':' (and give the \
             password by LEASEHOLD_STORE_PASSWORD or ?password_file=PATH), or give one"
                .into(),
        );
    }
    Ok((user, password))
}

/// The `?cacert=…&cert=…&key=…&password_file=…` of an etcd or ZooKeeper
/// URL, into `security`.
pub(super) fn parse_cluster_options(
    cluster: Cluster,
    query: &str,
    security: &mut Security,
    layout: &mut Layout,
) -> Result<(), String> {
    let known: &[&str] = match cluster {
        Cluster::Etcd => &["cacert", "cert", "key", "password_file", "layout"],
        Cluster::ZooKeeper => &["password_file", "layout"],
    };
    let known_key = |key: &str| {
        if cluster == Cluster::ZooKeeper && ["cacert", "cert", "key"].contains(&key) {
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
        Ok(())
    };
    for (key, value) in query_pairs(query, "option", known_key)? {
        if key == "layout" {
            *layout = Layout::parse(cluster, value)?;
            continue;
        }
        if value.is_empty() {
            return Err(format!("option {key:?} names no file"));
        }
        let path = decoded(&format!("{key} path"), value)?;
        check_file_path_len(key, &path)?;
        let path = PathBuf::from(path);
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

/// `[USER[:PASSWORD]@]` at the start of `rest` into `security`; the rest.
fn take_credentials<'a>(rest: &'a str, security: &mut Security) -> Result<&'a str, String> {
    let Some((credentials, rest)) = rest.split_once('@') else {
        return Ok(rest);
    };
    if rest.contains('@') {
        return Err(
            "the URL holds more than one '@': write an '@' in the user name \
             or password as %40"
                .into(),
        );
    }
    let (user, password) = parse_credentials(credentials)?;
    check_len("user name", user.len(), MAX_PATH_LEN)?;
    security.user = Some(user);
    security.password = password;
    Ok(rest)
}

/// `//[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…][/PATH][?OPTIONS]` after
/// `scheme:`: the endpoints, the path (the default if none) and the
/// security settings.
pub(super) fn parse_cluster(cluster: Cluster, rest: &str) -> Result<ClusterUrl, String> {
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
    let rest = take_credentials(rest, &mut security)?;
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
    Ok(ClusterUrl {
        endpoints,
        path,
        security,
        layout,
    })
}

/// The rules on a URL's security settings that hold for every kind of
/// store addressed by `scheme://HOST:PORT`.
pub(super) fn check_security(cluster: Cluster, security: &Security) -> Result<(), String> {
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
    // ZooKeeper's URLs take no TLS files (parse_cluster_options refuses them).
    if cluster == Cluster::Etcd {
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
    Ok(())
}

impl ClusterUrl {
    /// `scheme://[USER[:***]@]HOST:PORT,…[PATH][?OPTIONS]`, as
    /// [`parse_cluster`] reads it back; with `expose`, the password itself
    /// rather than `***`.
    pub(super) fn render(&self, scheme: &str, expose: bool) -> String {
        let mut out = format!("{scheme}://");
        let security = &self.security;
        if let Some(user) = &security.user {
            out.push_str(&encode(user, COMPONENT));
            if let Some(Password::Given(secret)) = &security.password {
                out.push(':');
                out.push_str(&if expose {
                    encode(secret.expose(), COMPONENT)
                } else {
                    "***".to_owned()
                });
            }
            out.push('@');
        }
        out.push_str(&self.endpoints.join(","));
        out.push_str(&self.path);
        let password_file = match &security.password {
            Some(Password::File(path)) => Some(path),
            _ => None,
        };
        let files = [
            ("cacert", security.cacert.as_ref()),
            ("cert", security.cert.as_ref()),
            ("key", security.key.as_ref()),
            ("password_file", password_file),
        ];
        let mut options: Vec<String> = files
            .into_iter()
            .filter_map(|(key, path)| {
                path.map(|p| format!("{key}={}", encode(&p.to_string_lossy(), PATH)))
            })
            .collect();
        if self.layout.is_foreign() {
            options.push(format!("layout={}", self.layout));
        }
        if !options.is_empty() {
            out.push('?');
            out.push_str(&options.join("&"));
        }
        out
    }
}
