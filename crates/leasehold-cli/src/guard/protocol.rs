//! The lines `run` and its guard exchange over their socket.
//!
//! Every value that may hold arbitrary bytes (arguments, environment
//! values, paths, URLs, names) travels hex-encoded, so that a line is
//! always one line and a value is never mangled. The socket is private to
//! the two processes: the store URL and its secrets never appear on a
//! command line.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use leasehold::store::{Layout, Password, Secret, Security};
use leasehold::{CandidateId, ElectionName, FencingToken, Grant, SessionId, StoreUrl};

/// `run` → guard.
#[derive(Debug, PartialEq, Eq)]
pub enum Order {
    /// Where the grant lives, to release it if `run` dies.
    Store(StoreUrl),
    /// The grant this term holds.
    Grant(Grant),
    /// The lease deadline, as CLOCK_MONOTONIC nanoseconds: the command must
    /// not run past it unless a later one arrives.
    Deadline(u64),
    /// One more argument of the command (the program first).
    Arg(OsString),
    /// One more environment variable for the command.
    Env(OsString, OsString),
    /// Start the command.
    Start,
    /// Send this signal to the command's process group — while the guard
    /// has not reaped the command, so that the group's id is certainly the
    /// command's.
    Signal(i32),
    /// `run` has ended the term itself (released the grant or knows it
    /// lost): nothing is to be released on its behalf.
    Done,
}

/// Guard → `run`.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    /// The command started with this process id, which is also its group.
    Started(i32),
    /// The command could not be started.
    Failed(String),
    /// The command and everything it started are gone. `status` is the
    /// command's wait status (as `waitpid` gives it); `killed` when the
    /// guard killed it on its own, and why.
    Exited {
        status: i32,
        killed: Option<GuardKill>,
    },
}

/// Why the guard killed the command on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardKill {
    /// The lease deadline passed without `run` confirming a renewal.
    Deadline,
    /// The SQLite store's database file is no longer at its path.
    StoreGone,
}

impl GuardKill {
    fn word(self) -> &'static str {
        match self {
            GuardKill::Deadline => "deadline",
            GuardKill::StoreGone => "store-gone",
        }
    }

    /// What `run` says of it when it steps down.
    pub fn reason(self) -> &'static str {
        match self {
            GuardKill::Deadline => {
                "the guard killed the command at the lease deadline: this runner did not tell it of a renewal in time"
            }
            GuardKill::StoreGone => {
                "the guard killed the command: the store's database file is no longer at its path"
            }
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn unhex_string(text: &str) -> Option<String> {
    String::from_utf8(unhex(text)?).ok()
}

fn hex_list(items: &[String]) -> String {
    items
        .iter()
        .map(|i| hex(i.as_bytes()))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Order {
    pub fn line(&self) -> String {
        match self {
            Order::Store(url) => format!("store {}", store_line(url)),
            Order::Grant(g) => format!(
                "grant {} {} {} {}",
                hex(g.election.as_str().as_bytes()),
                hex(g.candidate.as_str().as_bytes()),
                g.session.0,
                g.token.0
            ),
            Order::Deadline(ns) => format!("deadline {ns}"),
            Order::Arg(arg) => format!("arg {}", hex(arg.as_bytes())),
            Order::Env(k, v) => format!("env {} {}", hex(k.as_bytes()), hex(v.as_bytes())),
            Order::Start => "start".into(),
            Order::Signal(number) => format!("signal {number}"),
            Order::Done => "done".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Order> {
        let mut words = line.split(' ');
        let order = match words.next()? {
            "store" => Order::Store(parse_store(&mut words)?),
            "grant" => Order::Grant(Grant {
                election: ElectionName::new(unhex_string(words.next()?)?).ok()?,
                candidate: CandidateId::new(unhex_string(words.next()?)?).ok()?,
                session: SessionId(words.next()?.parse().ok()?),
                token: FencingToken(words.next()?.parse().ok()?),
            }),
            "deadline" => Order::Deadline(words.next()?.parse().ok()?),
            "arg" => Order::Arg(OsString::from_vec(unhex(words.next()?)?)),
            "env" => Order::Env(
                OsString::from_vec(unhex(words.next()?)?),
                OsString::from_vec(unhex(words.next()?)?),
            ),
            "start" => Order::Start,
            "signal" => Order::Signal(words.next()?.parse().ok()?),
            "done" => Order::Done,
            _ => return None,
        };
        words.next().is_none().then_some(order)
    }
}

fn store_line(url: &StoreUrl) -> String {
    match url {
        StoreUrl::Memory => "memory".into(),
        StoreUrl::Sqlite(path) => format!("sqlite {}", hex(path.as_os_str().as_bytes())),
        StoreUrl::Etcd {
            endpoints,
            prefix,
            security,
            layout,
        } => {
            format!(
                "etcd {} {layout} {} {}",
                hex(prefix.as_bytes()),
                security_words(security),
                hex_list(endpoints)
            )
        }
        StoreUrl::ZooKeeper {
            endpoints,
            root,
            security,
            layout,
        } => {
            format!(
                "zk {} {layout} {} {}",
                hex(root.as_bytes()),
                security_words(security),
                hex_list(endpoints)
            )
        }
        StoreUrl::Postgres { url, schema } => {
            format!(
                "postgres {} {}",
                hex(schema.as_bytes()),
                hex(url.as_bytes())
            )
        }
        // A kind of store this guard cannot name: it releases nothing there.
        _ => "unknown".into(),
    }
}

fn parse_layout(word: &str) -> Option<Layout> {
    [
        Layout::Leasehold,
        Layout::Concurrency,
        Layout::Curator,
        Layout::Kazoo,
    ]
    .into_iter()
    .find(|l| l.as_str() == word)
}

fn parse_store<'a>(words: &mut impl Iterator<Item = &'a str>) -> Option<StoreUrl> {
    let url = match words.next()? {
        "memory" => StoreUrl::Memory,
        "sqlite" => StoreUrl::Sqlite(PathBuf::from(OsString::from_vec(unhex(words.next()?)?))),
        "etcd" => {
            let prefix = unhex_string(words.next()?)?;
            let layout = parse_layout(words.next()?)?;
            let security = parse_security(words)?;
            let endpoints = words.map(unhex_string).collect::<Option<Vec<_>>>()?;
            StoreUrl::Etcd {
                endpoints,
                prefix,
                security,
                layout,
            }
        }
        "zk" => {
            let root = unhex_string(words.next()?)?;
            let layout = parse_layout(words.next()?)?;
            let security = parse_security(words)?;
            let endpoints = words.map(unhex_string).collect::<Option<Vec<_>>>()?;
            StoreUrl::ZooKeeper {
                endpoints,
                root,
                security,
                layout,
            }
        }
        "postgres" => {
            let schema = unhex_string(words.next()?)?;
            let url = unhex_string(words.next()?)?;
            StoreUrl::Postgres { url, schema }
        }
        _ => return None,
    };
    Some(url)
}

/// Five words: the user, the password (`g` and the password given, `f`
/// and its file's path), the CA, certificate and key paths; `-` for none.
fn security_words(security: &Security) -> String {
    let word = |value: Option<&[u8]>| value.map_or_else(|| "-".to_owned(), hex);
    let path = |p: &Option<PathBuf>| word(p.as_ref().map(|p| p.as_os_str().as_bytes()));
    let password = match &security.password {
        None => "-".to_owned(),
        Some(Password::Given(secret)) => format!("g{}", hex(secret.expose().as_bytes())),
        Some(Password::File(file)) => format!("f{}", hex(file.as_os_str().as_bytes())),
    };
    format!(
        "{} {password} {} {} {}",
        word(security.user.as_ref().map(|u| u.as_bytes())),
        path(&security.cacert),
        path(&security.cert),
        path(&security.key)
    )
}

fn parse_security<'a>(words: &mut impl Iterator<Item = &'a str>) -> Option<Security> {
    fn optional<T>(word: &str, parse: impl Fn(&str) -> Option<T>) -> Option<Option<T>> {
        if word == "-" {
            Some(None)
        } else {
            parse(word).map(Some)
        }
    }
    let path = |w: &str| unhex(w).map(|b| PathBuf::from(OsString::from_vec(b)));
    let mut security = Security::none();
    security.user = optional(words.next()?, unhex_string)?;
    security.password = optional(words.next()?, |w| match w.split_at_checked(1)? {
        ("g", rest) => Some(Password::Given(Secret::new(unhex_string(rest)?))),
        ("f", rest) => Some(Password::File(path(rest)?)),
        _ => None,
    })?;
    security.cacert = optional(words.next()?, path)?;
    security.cert = optional(words.next()?, path)?;
    security.key = optional(words.next()?, path)?;
    Some(security)
}

impl Report {
    pub fn line(&self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}"),
            Report::Failed(message) => format!("failed {}", hex(message.as_bytes())),
            Report::Exited { status, killed } => match killed {
                Some(kill) => format!("exited {status} {}", kill.word()),
                None => format!("exited {status}"),
            },
        }
    }

    pub fn parse(line: &str) -> Option<Report> {
        let mut words = line.split(' ');
        let report = match words.next()? {
            "started" => Report::Started(words.next()?.parse().ok()?),
            "failed" => Report::Failed(unhex_string(words.next()?)?),
            "exited" => {
                let status = words.next()?.parse().ok()?;
                let killed = match words.next() {
                    None => None,
                    Some(word) => Some(
                        [GuardKill::Deadline, GuardKill::StoreGone]
                            .into_iter()
                            .find(|k| k.word() == word)?,
                    ),
                };
                return words
                    .next()
                    .is_none()
                    .then_some(Report::Exited { status, killed });
            }
            _ => return None,
        };
        words.next().is_none().then_some(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(order: Order) {
        assert_eq!(Order::parse(&order.line()), Some(order));
    }

    #[test]
    fn orders_read_back_as_written() {
        round_trip(Order::Store(StoreUrl::Memory));
        round_trip(Order::Store(StoreUrl::Sqlite(PathBuf::from(
            OsString::from_vec(b"/tmp/a b\n\xff.db".to_vec()),
        ))));
        round_trip(Order::Store(StoreUrl::Etcd {
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            prefix: "/p x".into(),
            security: Security::none(),
            layout: Layout::Leasehold,
        }));
        let mut secured = Security::none();
        secured.user = Some("u -".into());
        secured.password = Some(Password::Given(Secret::new("p w\n")));
        secured.cacert = Some("/ca b.pem".into());
        secured.cert = Some(PathBuf::from(OsString::from_vec(b"/c\xff".to_vec())));
        secured.key = Some("/k".into());
        round_trip(Order::Store(StoreUrl::Etcd {
            endpoints: vec!["127.0.0.1:1".into()],
            prefix: "".into(),
            security: secured,
            layout: Layout::Concurrency,
        }));
        let mut from_file = Security::none();
        from_file.user = Some("u".into());
        from_file.password = Some(Password::File("/run/pw".into()));
        round_trip(Order::Store(StoreUrl::ZooKeeper {
            endpoints: vec!["h:1".into()],
            root: "/leasehold".into(),
            security: from_file,
            layout: Layout::Kazoo,
        }));
        round_trip(Order::Store(StoreUrl::Postgres {
            url: "postgres://u:secret@h/db?x=1 2".into(),
            schema: "s".into(),
        }));
        round_trip(Order::Grant(Grant {
            election: ElectionName::new("a/b.c").expect("valid"),
            candidate: CandidateId::new("host-1 x").expect("valid"),
            session: SessionId(u64::MAX),
            token: FencingToken(7),
        }));
        round_trip(Order::Deadline(123_456_789));
        round_trip(Order::Arg(OsString::from_vec(b"sh\n-c \xfe".to_vec())));
        round_trip(Order::Env("K".into(), "v=1\n2".into()));
        round_trip(Order::Start);
        round_trip(Order::Signal(34));
        round_trip(Order::Done);
    }

    #[test]
    fn reports_read_back_as_written() {
        for report in [
            Report::Started(42),
            Report::Failed("no such file\nor directory".into()),
            Report::Exited {
                status: 9,
                killed: Some(GuardKill::Deadline),
            },
            Report::Exited {
                status: 9,
                killed: Some(GuardKill::StoreGone),
            },
            Report::Exited {
                status: 256,
                killed: None,
            },
        ] {
            assert_eq!(Report::parse(&report.line()), Some(report));
        }
    }

    #[test]
    fn malformed_lines_are_refused() {
        for line in [
            "",
            "start now",
            "deadline x",
            "arg 0",
            "arg zz",
            "grant 61",
            "store nope",
            "exited 1 later",
        ] {
            assert!(
                Order::parse(line).is_none() && Report::parse(line).is_none(),
                "{line:?}"
            );
        }
    }
}
