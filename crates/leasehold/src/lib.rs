//! leasehold: lease-based ownership (leader) election with fencing tokens.
//!
//! Exactly one replica of a group owns a responsibility at a time. Ownership
//! is a *grant* attached to a *session* (a lease with a TTL, renewed in the
//! background); the store's atomic compare-and-swap decides who gets it, and
//! every grant carries a strictly increasing [`FencingToken`].
//!
//! ```
//! # use std::time::Duration;
//! # use leasehold::{CandidateId, ElectionName, Elector, LeaseConfig};
//! # use leasehold::store::{Access, StoreUrl};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> leasehold::Result<()> {
//! // `sqlite:PATH`, `etcd://…`, `zk://…` or `postgres://…` in production.
//! let url: StoreUrl = "memory:".parse()?;
//! let store = leasehold::store::open(&url, Access::ReadWrite).await?;
//! let elector = Elector::new(store, CandidateId::new("replica-a")?, LeaseConfig::new(Duration::from_secs(2)))?;
//! let election = ElectionName::new("nightly-billing")?;
//!
//! let leadership = elector.campaign(&election).await?;
//! println!("leading with token {}", leadership.token());
//! assert!(leadership.is_leader());
//! leadership.resign().await?;
//! # Ok(())
//! # }
//! ```
//!
//! `docs/DESIGN.md` in the repository explains the model and the seven
//! safety rules every backend and code path obeys (cited in these docs as
//! "DESIGN rule N"), and names the tests that enforce each.
//! `examples/campaign.rs` (campaign, fenced writes, resign) and
//! `examples/follow.rs` (watch the leader) are complete programs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod backend;
pub mod clock;
mod config;
mod elector;
mod error;
pub mod fence;
mod grant;
mod group;
mod ids;
mod lease;
mod line;
mod mutex;
mod names;
mod session;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod transfer;
pub mod tune;
pub mod watch;

pub use config::{DEFAULT_DRIFT, DEFAULT_SKEW, DEFAULT_TTL, LeaseConfig, MAX_TTL, RENEWAL_RULE};
pub use elector::{Elector, Handover, HandoverCause, Leadership};
pub use error::{Error, QUOTED_CHARS, Result, SHORTENED_CHARS, quoted, shortened};
pub use group::{Shard, Shards, Slot};
pub use lease::LostReason;
pub use names::{CandidateId, ElectionName, MAX_NAME_LEN};
/// The `rusqlite` whose `Connection` and `Transaction` the SQLite fence
/// helpers ([`fence::sqlite`]) take: use this one (or the same version,
/// 0.37) for the connections you pass them.
#[cfg(feature = "sqlite")]
pub use rusqlite;
pub use session::{RenewalEvent, RenewalObserver, Session};
pub use store::{
    ElectionState, FencingToken, Grant, Leader, LeaderStatus, LeaderWatch, Note, NoteWatch,
    SessionId, SessionLease, StatusWatch, Store, StoreUrl,
};
/// The `tokio-postgres` whose clients and transactions the PostgreSQL fence
/// helpers ([`fence::postgres`]) take: use this one (or the same version,
/// 0.7) for the connections you pass them.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

// The README's Rust blocks are compiled and run as doc tests
// (`cargo test -p leasehold --doc`), so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
