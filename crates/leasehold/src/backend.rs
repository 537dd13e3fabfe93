//! For backend implementers, tests and tools: the store primitive a new
//! store implements ([`Keys`]; its rules are below), the elections written once over it ([`KeyedStore`]),
//! the wrappers of a store ([`Wrapper`]), and the stores leasehold ships,
//! by their own types (each store's module). An application needs none of
//! it: it opens a store from its URL ([`crate::store::open`]) and gives it
//! to an [`crate::Elector`].
//!
//! ## The store primitive
//!
//! Sessions, and keys that may be attached to one, each with a store-wide creation revision,
//! changed only by guarded commits, read and watched by prefix.
//!
//! It is the whole of what a store has to offer for elections to be
//! decided on it: the election (the live key of lowest creation revision
//! leads, and that revision is its fencing token), the notes of the line
//! of standbys and the release record are written once above it
//! ([`KeyedStore`]). Each backend maps it onto its own
//! atomic operations: etcd's leases, keys and transactions; ZooKeeper's
//! sessions, ephemeral nodes and `multi`; one table and a sequence in SQL.
//! [`memory::MemoryKeys`] is the reference, in one process.
//!
//! The rules a backend keeps (the primitive's conformance suite checks
//! them):
//! - **Revisions** are store-wide and strictly increasing, also across
//!   restarts: every commit that writes gets a greater one than every
//!   earlier commit, and every key it creates has it as its creation
//!   revision, which later puts keep.
//! - **Atomic commits**: a commit's writes all happen, at one revision,
//!   if and only if all its checks hold at that revision.
//! - **Sessions** expire by the store's own clock, their TTL after the
//!   store processed their opening or last renewal, never earlier; a key
//!   attached to a session lives exactly as long as the session.
//! - **Watches** tell every change made by a commit or by closing a
//!   session under their prefix after the revision they started from, or
//!   that the store does not answer. An expiry may go untold (a SQL store
//!   learns of it only by reading its clock; [`Properties::tells_expiries`]
//!   says): a key attached to a session then comes with the time its
//!   session had left when read, and whoever needs to know reads again
//!   then.

pub use crate::store::keyed::KeyedStore;
pub use crate::store::keys::{
    Check, Entry, Heard, KeyWatch, Keys, Properties, Range, Revision, Write,
};
pub use crate::store::wrap::{Call, Request, Wrapper};

/// `memory:`: the elections over the primitive's reference in one process.
pub mod memory {
    pub use crate::store::keys::memory::*;
    pub use crate::store::memory::*;
}

/// `sqlite:PATH`: the embedded store (see [`sqlite::SqliteKeys`]).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use crate::store::sqlite::*;
}

/// `etcd://…`: the etcd v3 store (see [`etcd::EtcdKeys`]).
#[cfg(feature = "etcd")]
pub mod etcd {
    pub use crate::store::etcd::*;
}

/// `postgres://…`: the PostgreSQL store (see [`postgres::PgKeys`]).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use crate::store::postgres::*;
}

/// `zk://…`: the ZooKeeper store (see [`zookeeper::ZkKeys`]).
#[cfg(feature = "zookeeper")]
pub mod zookeeper {
    pub use crate::store::zookeeper::*;
}
