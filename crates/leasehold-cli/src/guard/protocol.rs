//! The lines `run` and its guard exchange over their socket: one JSON
//! value per line (serde), so that a line is always one line and a value
//! (arguments, environment values and paths are any bytes) is never
//! mangled. The socket is private to the two processes: the store URL and
//! its secrets never appear on a command line.

use std::ffi::OsString;
use std::path::PathBuf;

use leasehold::{CandidateId, ElectionName, FencingToken, Grant, SessionId, StoreUrl};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `run` → guard.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Where the grant lives, to release it if `run` dies.
    Store(#[serde(with = "wire_store")] StoreUrl),
    /// The grant this term holds.
    Grant(#[serde(with = "wire_grant")] Grant),
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
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuardKill {
    /// The lease deadline passed without `run` confirming a renewal.
    Deadline,
    /// The SQLite store's database file is no longer at its path.
    StoreGone,
}

impl GuardKill {
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

/// One line: a value of these types always serializes (its maps have
/// string keys), and JSON escapes every line break.
fn line(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl Order {
    pub fn line(&self) -> String {
        line(self)
    }

    pub fn parse(line: &str) -> Option<Order> {
        serde_json::from_str(line).ok()
    }
}

impl Report {
    pub fn line(&self) -> String {
        line(self)
    }

    pub fn parse(line: &str) -> Option<Report> {
        serde_json::from_str(line).ok()
    }
}

/// A store URL on the wire: a SQLite path as its bytes (it may not be
/// UTF-8), any other URL as text with its password, parsed again (and so
/// checked again) by the guard.
mod wire_store {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Wire {
        Sqlite(OsString),
        Url(String),
    }

    pub fn serialize<S: Serializer>(url: &StoreUrl, s: S) -> Result<S::Ok, S::Error> {
        match url {
            StoreUrl::Sqlite(path) => Wire::Sqlite(path.clone().into_os_string()),
            other => Wire::Url(other.exposed().expose().to_owned()),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<StoreUrl, D::Error> {
        match Wire::deserialize(d)? {
            Wire::Sqlite(path) => Ok(StoreUrl::Sqlite(PathBuf::from(path))),
            Wire::Url(url) => url.parse().map_err(D::Error::custom),
        }
    }
}

/// A grant on the wire; its names are checked again when read.
mod wire_grant {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Wire {
        election: String,
        candidate: String,
        session: u64,
        token: u64,
    }

    pub fn serialize<S: Serializer>(g: &Grant, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            election: g.election.as_str().to_owned(),
            candidate: g.candidate.as_str().to_owned(),
            session: g.session.0,
            token: g.token.0,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Grant, D::Error> {
        let wire = Wire::deserialize(d)?;
        Ok(Grant {
            election: ElectionName::new(wire.election).map_err(D::Error::custom)?,
            candidate: CandidateId::new(wire.candidate).map_err(D::Error::custom)?,
            session: SessionId(wire.session),
            token: FencingToken(wire.token),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn round_trip(order: Order) {
        assert_eq!(Order::parse(&order.line()), Some(order));
    }

    fn url(text: &str) -> StoreUrl {
        text.parse().expect("valid")
    }

    #[test]
    fn orders_read_back_as_written() {
        round_trip(Order::Store(StoreUrl::Memory));
        round_trip(Order::Store(StoreUrl::Sqlite(PathBuf::from(
            OsString::from_vec(b"/tmp/a b\n\xff.db".to_vec()),
        ))));
        round_trip(Order::Store(url("etcd://127.0.0.1:1,127.0.0.1:2/p")));
        round_trip(Order::Store(url(
            "etcd://u%20-:p%20w%0A@127.0.0.1:1?cacert=/ca%20b.pem&cert=/c&key=/k&layout=concurrency",
        )));
        round_trip(Order::Store(url(
            "zk://u@h:1/leasehold?password_file=/run/pw&layout=kazoo",
        )));
        round_trip(Order::Store(url("postgres://u:secret@h/db?schema=s")));
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

    /// The password travels (the guard must connect with it); the line
    /// stays one line.
    #[test]
    fn a_store_password_travels_in_one_line() {
        let order = Order::Store(url("etcd://u:p%0Aw@h:1/p"));
        let line = order.line();
        assert!(!line.contains('\n'), "{line}");
        let Some(Order::Store(StoreUrl::Etcd(c))) = Order::parse(&line) else {
            panic!("{line}");
        };
        let password = c.security().password.as_ref().and_then(|p| p.read().ok());
        assert_eq!(password.as_ref().map(|p| p.expose()), Some("p\nw"));
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
            "start",
            "\"start now\"",
            r#"{"deadline":"x"}"#,
            r#"{"arg":0}"#,
            r#"{"grant":{"election":"","candidate":"a","session":1,"token":1}}"#,
            r#"{"store":{"url":"nope"}}"#,
            r#"{"store":{"url":"etcd://h:1/a/../b"}}"#,
            r#"{"exited":{"status":1,"killed":"later"}}"#,
        ] {
            assert!(
                Order::parse(line).is_none() && Report::parse(line).is_none(),
                "{line:?}"
            );
        }
    }
}
