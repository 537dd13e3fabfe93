//! The values the command line takes, parsed and checked: durations,
//! addresses, names, store URLs; and the help that shows defaults.

use super::*;

/// `run --help` and `campaign --help` for --renew-every: the renewal rule
/// in the library's words, with what it means for two TTLs.
pub(super) fn renew_every_help() -> String {
    let limit = |ttl: Duration| {
        let config = LeaseConfig::new(ttl);
        let half = config.validity(ttl).map(|v| v / 2).unwrap_or_default();
        format!(
            "under {} for --ttl {}",
            show_ms(half),
            humantime::format_duration(ttl)
        )
    };
    format!(
        "How often the lease is renewed; {rule} (clock drift bound {drift}%, skew bound {skew}): {a}, {b}. \
         Should the store grant a shorter TTL than asked (ZooKeeper clamps it), the period is \
         shortened to a third of what that TTL leaves, and the log says so. [default: a third of --ttl]",
        rule = leasehold::RENEWAL_RULE,
        drift = leasehold::DEFAULT_DRIFT * 100.0,
        skew = humantime::format_duration(leasehold::DEFAULT_SKEW),
        a = limit(leasehold::DEFAULT_TTL),
        b = limit(Duration::from_secs(2)),
    )
}

/// A duration as whole or fractional seconds (`7.375s`) or milliseconds.
pub(super) fn show_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms >= 1000 {
        format!("{}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

/// A duration flag's value: `500ms`, `15s`, `2m`…, at most
/// [`leasehold::MAX_TTL`] (a day), so no later arithmetic can overflow and
/// no store is asked for more than it keeps.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err("durations cannot be negative".into());
    }
    let duration = humantime::parse_duration(s).map_err(|e| {
        let e = match &e {
            // humantime quotes the unit whole, however long.
            humantime::DurationError::UnknownUnit { unit, .. } => e
                .to_string()
                .replace(&format!("{unit:?}"), &leasehold::quoted(unit)),
            _ => e.to_string(),
        };
        format!("{e} (examples: 500ms, 15s, 2m)")
    })?;
    if duration > leasehold::MAX_TTL {
        return Err(format!(
            "longer than the maximum, {}h (the longest TTL leasehold accepts)",
            leasehold::MAX_TTL.as_secs() / 3600
        ));
    }
    Ok(duration)
}

/// `transfer --timeout`: a duration more than zero (with none, no
/// handover could ever be seen to finish).
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let duration = parse_duration(s)?;
    if duration.is_zero() {
        return Err("must be more than zero (a handover takes a few store round trips)".into());
    }
    Ok(duration)
}

/// Where `run --http` serves: what the user gave, and the addresses it
/// stands for (a host name may resolve to several, such as 127.0.0.1 and ::1
/// for localhost).
#[derive(Clone, Debug)]
pub struct HttpAddr {
    /// As given.
    pub given: String,
    /// Every address to listen on; never empty.
    pub addrs: Vec<SocketAddr>,
}

impl std::fmt::Display for HttpAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.given)
    }
}

/// The longest host name DNS has, in bytes.
pub(super) const MAX_HOST_LEN: usize = 253;

/// `IP:PORT`, `HOST:PORT` (resolved now) or `:PORT` (all interfaces).
pub(crate) fn parse_http_addr(s: &str) -> Result<HttpAddr, String> {
    use std::net::ToSocketAddrs;
    const EXPECTED: &str =
        "expected HOST:PORT or :PORT, such as 127.0.0.1:9464, localhost:9464 or :9464";
    let full = match s.strip_prefix(':') {
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("0.0.0.0:{port}")
        }
        _ => s.to_owned(),
    };
    if let Ok(addr) = full.parse::<SocketAddr>() {
        return Ok(HttpAddr {
            given: s.to_owned(),
            addrs: vec![addr],
        });
    }
    let Some((host, port)) = full.rsplit_once(':') else {
        return Err(EXPECTED.to_owned());
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(EXPECTED.to_owned());
    };
    if host.contains(':') {
        return Err(format!(
            "write an IPv6 address in brackets, such as [::1]:9464 ({EXPECTED})"
        ));
    }
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(EXPECTED.to_owned());
    }
    if host.len() > MAX_HOST_LEN {
        return Err(format!(
            "the host name is {} bytes long, at most {MAX_HOST_LEN} allowed",
            host.len()
        ));
    }
    let resolved = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e} ({EXPECTED})"))?;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for addr in resolved {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    if addrs.is_empty() {
        return Err(format!("{host} resolves to no address ({EXPECTED})"));
    }
    Ok(HttpAddr {
        given: s.to_owned(),
        addrs,
    })
}

pub(super) fn parse_election(s: &str) -> Result<ElectionName, String> {
    ElectionName::new(s).map_err(|e| e.to_string())
}

pub(super) fn parse_candidate(s: &str) -> Result<CandidateId, String> {
    CandidateId::new(s).map_err(|e| e.to_string())
}

/// `--store`: parsed by the library's one URL grammar. The error is
/// clap's "raw" kind, so that clap does not quote the value as it does
/// for other flags: a store URL may hold a password.
#[derive(Clone, Copy, Debug)]
pub(super) struct StoreUrlParser;

impl clap::builder::TypedValueParser for StoreUrlParser {
    type Value = StoreUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreUrl, clap::Error> {
        use clap::error::ErrorKind;
        let Some(text) = value.to_str() else {
            return Err(clap::Error::raw(
                ErrorKind::InvalidUtf8,
                "the value of --store (or LEASEHOLD_STORE) is not valid UTF-8\n",
            )
            .with_cmd(cmd));
        };
        text.parse().map_err(|e: leasehold::Error| {
            clap::Error::raw(ErrorKind::ValueValidation, format!("--store: {e}\n")).with_cmd(cmd)
        })
    }
}

/// Which argument (or `LEASEHOLD_*` variable) is not valid UTF-8, for the
/// error clap reports without naming it. The value itself is not shown: it
/// may be a password.
pub fn invalid_utf8_culprit() -> String {
    let mut command = Args::command();
    // Built, so that every argument knows whether it takes a value.
    command.build();
    let takes_value = |flag: &str| {
        std::iter::once(&command)
            .chain(command.get_subcommands())
            .flat_map(clap::Command::get_arguments)
            .any(|arg| {
                let named = flag
                    .strip_prefix("--")
                    .map(|long| arg.get_long() == Some(long))
                    .or_else(|| {
                        let mut short = flag.strip_prefix('-')?.chars();
                        short.next().map(|c| arg.get_short() == Some(c))
                    })
                    .unwrap_or(false);
                named && arg.get_num_args().is_some_and(|n| n.takes_values())
            })
    };
    let mut previous: Option<String> = None;
    for (i, arg) in std::env::args_os().enumerate().skip(1) {
        if arg == "--" {
            break;
        }
        if let Some(text) = arg.to_str() {
            previous = Some(text.to_owned());
            continue;
        }
        let bytes = arg.as_encoded_bytes();
        let inline = bytes
            .iter()
            .position(|&b| b == b'=')
            .filter(|_| bytes.starts_with(b"--"))
            .and_then(|eq| std::str::from_utf8(&bytes[..eq]).ok());
        let flag = inline.map(str::to_owned).or_else(|| {
            bytes
                .get(..2)
                .filter(|short| short[0] == b'-' && short[1] != b'-' && bytes.len() > 2)
                .and_then(|short| std::str::from_utf8(short).ok())
                .filter(|short| takes_value(short))
                .map(str::to_owned)
                .or_else(|| {
                    previous
                        .clone()
                        .filter(|p| p.starts_with('-') && takes_value(p))
                })
        });
        return match flag {
            Some(flag) => format!("the value of {flag} (argument {i}) is not valid UTF-8"),
            None => format!("argument {i} is not valid UTF-8"),
        };
    }
    invalid_utf8_variable(&command).unwrap_or_else(|| "an argument is not valid UTF-8".to_owned())
}

/// Which environment variable that `command` reads is not UTF-8, said.
fn invalid_utf8_variable(command: &clap::Command) -> Option<String> {
    let variables = std::iter::once(command)
        .chain(command.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .filter_map(clap::Arg::get_env);
    for variable in variables {
        if std::env::var_os(variable).is_some_and(|v| v.to_str().is_none()) {
            return Some(format!(
                "the environment variable {} is not valid UTF-8",
                variable.to_string_lossy()
            ));
        }
    }
    None
}
