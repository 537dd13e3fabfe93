//! What an operator's tool reads and asks of elections besides
//! campaigning, as the `leasehold` command's `status`, `list`, `transfer`
//! and its guard do: the line of standbys ([`line()`], [`standbys`]), the
//! members of a group of shards or slots ([`members`], [`kind_of`]), a
//! transfer of leadership from outside the leader's process
//! ([`request_transfer`]), and the release of a dead holder's grant
//! ([`release_orphaned`]).
//!
//! A replica that campaigns needs none of it: the [`Elector`](crate::Elector),
//! its [`Leadership`](crate::Leadership) and the group types
//! ([`Shards`](crate::Shards), [`Slot`](crate::Slot)) are the library's API
//! for that. What follows says how the store keeps both.
//!
//! # The line of standbys
//!
//! The line of standbys and planned handovers (transfers, priorities,
//! lock-delay) are kept as notes in the store
//! ([`Store::put_note`](crate::Store::put_note)), so that replicas never
//! need a connection to each other.
//!
//! Two notes, on the election they concern:
//!
//! - `cand` = `{priority} - {candidate id}`: kept by every candidate that
//!   waits for the election, from the start of its campaign until it is
//!   granted (or gives up). The line is these notes, highest priority
//!   first, then earliest first ([`standbys`]). A leader that hands over
//!   marks the standby it chose by amending that standby's note to
//!   `{priority} {token} {candidate id}` ([`Store::amend_note`](crate::Store::amend_note)), `token`
//!   being its own grant's. The id comes last: it may hold spaces.
//! - `transfer` = `{token} {session}` or `{token} *`: a request, kept by the
//!   session of whoever asked ([`request_transfer`]), that the leader
//!   holding `token` hand over to that standby, or to the first in line.
//!   A leader holding a newer grant answers it, once its elector has taken
//!   that grant up, by amending it to `{token} {to} {taken}`, `taken`
//!   being its own grant's token : the request succeeds only
//!   then. The store alone does not tell: on etcd and ZooKeeper the next
//!   key in line holds as soon as the leader's goes, whether or not its
//!   process is there to act (stopped, or killed before its session
//!   expired).
//!
//! Only the *chosen* standby campaigns in the store: the one a
//! leader marked while it waits, or else the first in line. So the store's
//! own compare-and-swap still decides who holds (every safety rule is the
//! store's, as before), and the notes decide only who asks.
//!
//! No herd: only the first in line and the chosen one watch the whole
//! line. Every other standby watches two notes, its own (a leader marks
//! it there) and the one of the standby just ahead of it (it can be first
//! only once that one has left), so a handover or a change elsewhere in
//! the line wakes a fixed number of candidates, however long the line.
//!
//! # Groups of shards and slots
//!
//! Many responsibilities on one name: a group of `n` **shards**, each
//! owned by exactly one member and spread evenly over the members
//! ([`Shards`](crate::Shards)), or `k` **slots**, at most `k` holders at once
//! ([`Elector::campaign_slot`](crate::Elector::campaign_slot)).
//!
//! Each shard and each slot is an election of its own, named below the
//! group's (`jobs/shard/7`, `jobs/slot/2`), with its own grant, deadline
//! and strictly increasing fencing token: every safety rule of one
//! election holds for each of them, decided by the same compare-and-swap.
//! All of a process's grants hang on its one session, so a process renews
//! every shard it owns with one request.
//!
//! The members of a group are the live sessions that keep a `member` note
//! on the group's own name (`shards 12 <id>` or `slots 3 <id>`): the store
//! removes a member with its session, so a dead member leaves the group by
//! itself. The first member to join fixes the group's kind and count; a
//! member that asks for another is refused ([`crate::Error::Conflict`]).

pub use crate::group::{
    GroupKind, GroupView, MAX_SHARDS, Member, group_of, kind_of, members, release_orphaned,
};
pub use crate::line::{Standby, line, standbys};
pub use crate::transfer::{Transferred, request_transfer};
