//! Groups of shards and slots over elections (described in
//! [`crate::admin`]).

mod assign;
mod many;
mod ownership;
mod shards;
mod slots;

use std::fmt;

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{Grant, Leader, Note, SessionId, Store, StoreUrl};

pub use assign::assign;
pub(crate) use many::LeaderWatches;
pub use shards::{GroupView, Shard, Shards};
pub use slots::Slot;

/// The most shards (or slots) a group may have.
pub const MAX_SHARDS: u32 = 65_536;

/// The note a member keeps on its group's name.
pub(crate) const MEMBER: &str = "member";

/// What a group is: its kind and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// `n` shards, each owned by one member.
    Shards(u32),
    /// At most `k` holders at once.
    Slots(u32),
}

impl GroupKind {
    /// How many shards or slots.
    pub fn count(self) -> u32 {
        match self {
            GroupKind::Shards(n) | GroupKind::Slots(n) => n,
        }
    }

    /// The election of shard or slot `index`.
    pub fn election(self, group: &ElectionName, index: u32) -> Result<ElectionName> {
        let kind = match self {
            GroupKind::Shards(_) => "shard",
            GroupKind::Slots(_) => "slot",
        };
        ElectionName::new(format!("{group}/{kind}/{index}"))
    }

    /// Checks the count (1 to [`MAX_SHARDS`]) and that every election of
    /// the group has a valid name.
    pub fn check(self, group: &ElectionName) -> Result<()> {
        let n = self.count();
        if n == 0 || n > MAX_SHARDS {
            let what = match self {
                GroupKind::Shards(_) => "shard count",
                GroupKind::Slots(_) => "slot count",
            };
            return Err(Error::invalid(
                what,
                format!("{n}: between 1 and {MAX_SHARDS}"),
            ));
        }
        let longest = self.election(group, n - 1);
        let limit = crate::names::MAX_NAME_LEN;
        longest.and(slot_queue(group)).map(drop).map_err(|_| {
            let kind = match self {
                GroupKind::Shards(_) => "shard",
                GroupKind::Slots(_) => "slot",
            };
            Error::invalid(
                "election name",
                format!(
                    "{group:?} is too long for a group of {self}: its elections are named \
                     {group}/{kind}/N, at most {limit} bytes"
                ),
            )
        })
    }

    fn text(self, candidate: &CandidateId) -> String {
        match self {
            GroupKind::Shards(n) => format!("shards {n} {candidate}"),
            GroupKind::Slots(n) => format!("slots {n} {candidate}"),
        }
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupKind::Shards(1) => f.write_str("1 shard"),
            GroupKind::Shards(n) => write!(f, "{n} shards"),
            GroupKind::Slots(1) => f.write_str("1 slot"),
            GroupKind::Slots(n) => write!(f, "{n} slots"),
        }
    }
}

/// The group whose shard or slot `election` may be (`jobs` for
/// `jobs/shard/7`, `pool` for `pool/slot/2` and `pool/slot/queue`).
pub fn group_of(election: &ElectionName) -> Option<ElectionName> {
    group_of_shard(election).or_else(|| {
        let (group, index) = election.as_str().rsplit_once("/slot/")?;
        (index == "queue" || index.parse::<u32>().is_ok()).then_some(())?;
        ElectionName::new(group).ok()
    })
}

/// The group whose shard `election` is (`jobs` for `jobs/shard/7`).
pub(crate) fn group_of_shard(election: &ElectionName) -> Option<ElectionName> {
    let (group, index) = election.as_str().rsplit_once("/shard/")?;
    index.parse::<u32>().ok()?;
    ElectionName::new(group).ok()
}

/// Releases `grant`, whose holder's process is known to be dead, as
/// [`Store::release_orphaned`] does, on a store opened for it alone
/// ([`crate::store::Access::ReleaseOnly`]); when it is a shard's, its
/// holder also leaves the group, so that the other members take its
/// shards now rather than once its session expires (each still waits for
/// its grant's release, which that shard's own guard makes once its
/// command is gone). A runner's guard calls this after its runner died.
pub async fn release_orphaned(url: &StoreUrl, grant: &Grant) -> Result<()> {
    let store = crate::store::open(url, crate::store::Access::ReleaseOnly).await?;
    let released = store.release_orphaned(grant).await;
    if matches!(released, Ok(()) | Err(Error::NotHolder { .. }))
        && let Some(group) = group_of_shard(&grant.election)
        && let Err(error) = store.delete_note(grant.session, &group, MEMBER).await
    {
        tracing::debug!(%group, %error, "could not remove a dead member from its group");
    }
    released
}

/// The election the waiters for a group's slots line up on: its holder is
/// the one waiter that watches the slots and takes the next free one.
pub(crate) fn slot_queue(group: &ElectionName) -> Result<ElectionName> {
    ElectionName::new(format!("{group}/slot/queue"))
}

/// A member of a group, as its note says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its candidate id.
    pub candidate: CandidateId,
    /// The session it is a member with.
    pub session: SessionId,
    /// When it joined, in the store's order of notes.
    pub order: u64,
    /// The group it asked for.
    pub kind: GroupKind,
}

impl Member {
    /// Whether `holder` is this member's grant: on its session, where the
    /// store tells the holder's, else under its candidate id. A single
    /// election's leader of a shard's name (taken before the group had
    /// members) is no member's, whatever its id.
    pub fn holds(&self, holder: &Leader) -> bool {
        match holder.session {
            Some(session) => session == self.session,
            None => holder.candidate == self.candidate,
        }
    }
}

fn parse_member(note: &Note) -> Option<Member> {
    if note.name != MEMBER {
        return None;
    }
    let mut parts = note.text.splitn(3, ' ');
    let kind = parts.next()?;
    let count: u32 = parts.next()?.parse().ok()?;
    let candidate = CandidateId::new(parts.next()?).ok()?;
    let kind = match kind {
        "shards" => GroupKind::Shards(count),
        "slots" => GroupKind::Slots(count),
        _ => return None,
    };
    Some(Member {
        candidate,
        session: note.session,
        order: note.order,
        kind,
    })
}

/// The members of a group among an election's notes, in the order they
/// joined; a candidate id that is a member twice (a restarted process
/// whose earlier session has not expired yet) counts once, at its first
/// place.
pub fn members(notes: &[Note]) -> Vec<Member> {
    let mut members: Vec<Member> = notes.iter().filter_map(parse_member).collect();
    members.sort_by_key(|m| m.order);
    let mut seen = std::collections::HashSet::new();
    members.retain(|m| seen.insert(m.candidate.clone()));
    members
}

/// The group's kind as its first member fixed it, if it has members.
pub fn kind_of(notes: &[Note]) -> Option<GroupKind> {
    members(notes).first().map(|m| m.kind)
}

fn conflict(group: &ElectionName, found: &Member, asked: GroupKind) -> Error {
    Error::Conflict(format!(
        "group {group} already uses {} (member {}), not {asked}; every member must ask for the same",
        found.kind, found.candidate
    ))
}

/// Makes `session` a member of `group`: refuses, writing nothing, if the
/// group already is of another kind or count, and withdraws again if a
/// member of another kind joined first meanwhile.
pub(crate) async fn join(
    store: &dyn Store,
    session: SessionId,
    group: &ElectionName,
    kind: GroupKind,
    candidate: &CandidateId,
) -> Result<()> {
    kind.check(group)?;
    refuse_inside_group(store, group).await?;
    let notes = store.notes(group).await?;
    if let Some(first) = members(&notes).first().filter(|m| m.kind != kind) {
        return Err(conflict(group, first, kind));
    }
    // A single election refuses a group's name likewise.
    if let Some(refusal) = single_election(store, group, kind, &notes).await? {
        return Err(refusal);
    }
    store
        .put_note(session, group, MEMBER, &kind.text(candidate))
        .await?;
    // Two members of different kinds that joined at once: the first to
    // have joined fixes the group, the other withdraws. Likewise a single
    // election's candidate that came meanwhile (it checked before this
    // note was there, and checks again once granted): this member
    // withdraws, so that the two never both go on.
    let notes = store.notes(group).await?;
    let refusal = match members(&notes).first().filter(|m| m.kind != kind) {
        Some(first) => Some(conflict(group, first, kind)),
        None => single_election(store, group, kind, &notes).await?,
    };
    if let Some(refusal) = refusal {
        store.delete_note(session, group, MEMBER).await?;
        return Err(refusal);
    }
    if members(&notes)
        .iter()
        .any(|m| &m.candidate == candidate && m.session != session)
    {
        tracing::warn!(%group, id = %candidate,
            "another replica with this candidate id is a member of the group (ids must be unique: give each replica its own); this one waits while the other lives");
    }
    Ok(())
}

/// The refusal of a group of `kind` on `group` when that name is a single
/// election's, led or waited for (`notes` being its notes): its command
/// would run beside the group's, under the same name.
async fn single_election(
    store: &dyn Store,
    group: &ElectionName,
    kind: GroupKind,
    notes: &[Note],
) -> Result<Option<Error>> {
    if let Some(leader) = store.leader(group).await? {
        return Ok(Some(Error::Conflict(format!(
            "{group} is a single election, led by {} (token {}): a group of {kind} cannot use its name",
            leader.candidate, leader.token.0
        ))));
    }
    Ok(crate::line::standbys(notes).first().map(|standby| {
        Error::Conflict(format!(
            "{group} is a single election, which {} waits for: a group of {kind} cannot use its name",
            standby.candidate
        ))
    }))
}

/// Refuses a single election, or a group, on `election` when it is the
/// name of a shard or slot of a group that has members: only they take
/// it. A store that keeps no notes has no groups.
pub(crate) async fn refuse_inside_group(store: &dyn Store, election: &ElectionName) -> Result<()> {
    let Some(parent) = group_of(election) else {
        return Ok(());
    };
    let notes = match store.notes(&parent).await {
        Err(Error::Unsupported(_)) => return Ok(()),
        notes => notes?,
    };
    match kind_of(&notes) {
        Some(kind) => Err(Error::Conflict(format!(
            "{election} belongs to the group {parent} of {kind}: only its members take it"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(session: u64, order: u64, text: &str) -> Note {
        Note {
            session: SessionId(session),
            name: MEMBER.into(),
            order,
            text: text.into(),
        }
    }

    #[test]
    fn members_in_join_order_once_each() {
        let notes = [
            note(3, 9, "shards 12 c"),
            note(1, 2, "shards 12 a b"),
            note(2, 5, "shards 12 c"),
            note(4, 1, "garbage"),
        ];
        let found = members(&notes);
        let ids: Vec<_> = found.iter().map(|m| m.candidate.as_str()).collect();
        assert_eq!(ids, ["a b", "c"]);
        assert_eq!(found[1].session, SessionId(2));
        assert_eq!(kind_of(&notes), Some(GroupKind::Shards(12)));
    }

    #[test]
    fn counts_and_names_are_checked() {
        let group = ElectionName::new("jobs").expect("valid");
        assert!(GroupKind::Shards(0).check(&group).is_err());
        assert!(GroupKind::Slots(MAX_SHARDS + 1).check(&group).is_err());
        assert!(GroupKind::Shards(MAX_SHARDS).check(&group).is_ok());
        let long = ElectionName::new("x".repeat(195)).expect("valid");
        assert!(GroupKind::Shards(3).check(&long).is_err());
        assert_eq!(
            GroupKind::Shards(3)
                .election(&group, 2)
                .expect("valid")
                .as_str(),
            "jobs/shard/2"
        );
    }

    /// Who arrives in the middle of a call ([`Arrives`]).
    #[derive(Debug)]
    enum Arrival {
        /// A single election's candidate, on this session, is granted the
        /// group's name `jobs` just before a member's note is written: after
        /// the member's first look, before its note.
        Plain(SessionId),
        /// A member, on this session, joins group `jobs` just before a
        /// single election's candidate is granted without a note: after the
        /// candidate's first look.
        Member(SessionId),
    }

    /// The memory store, with someone arriving in the middle of a call.
    #[derive(Debug)]
    struct Arrives {
        store: crate::store::memory::MemoryStore,
        who: Arrival,
    }

    impl crate::backend::Wrapper for Arrives {
        fn inner(&self) -> &dyn Store {
            &self.store
        }

        fn around<'a, T: Send + 'a>(
            &'a self,
            call: crate::backend::Call,
            request: crate::backend::Request<'a, T>,
        ) -> crate::backend::Request<'a, T> {
            use crate::backend::Call;
            let group = ElectionName::new("jobs").expect("valid");
            match self.who {
                Arrival::Plain(plain) if call == Call::PutNote => Box::pin(async move {
                    let id = CandidateId::new("plain").expect("valid");
                    self.store.campaign(plain, &group, &id).await?;
                    request.await
                }),
                Arrival::Member(member) if call == Call::TryCampaignUnwaited => {
                    Box::pin(async move {
                        let id = CandidateId::new("member").expect("valid");
                        join(&self.store, member, &group, GroupKind::Shards(2), &id).await?;
                        request.await
                    })
                }
                _ => request,
            }
        }
    }

    /// A single election's candidate granted the name while a member
    /// joins (both looked before either wrote): the member withdraws its
    /// note and is refused, so that the two never both go on (before, it
    /// joined, and a plain `run` and a group ran under one name).
    #[tokio::test]
    async fn a_member_withdraws_when_a_single_election_took_the_name_meanwhile() {
        let store = crate::store::memory::MemoryStore::new();
        let ttl = std::time::Duration::from_secs(30);
        let plain = store.open_session(ttl).await.expect("open").id;
        let member = store.open_session(ttl).await.expect("open").id;
        let racing = Arrives {
            store: store.clone(),
            who: Arrival::Plain(plain),
        };
        let group = ElectionName::new("jobs").expect("valid");
        let me = CandidateId::new("member").expect("valid");
        let joined = join(&racing, member, &group, GroupKind::Shards(2), &me).await;
        assert!(
            matches!(&joined, Err(Error::Conflict(why)) if why.contains("jobs is a single election, led by plain")),
            "{joined:?}"
        );
        assert_eq!(members(&store.notes(&group).await.expect("read")), []);
    }

    /// A single election that leads a shard's name, taken before its group
    /// had members, is no member's, though its id is a member's: the
    /// member neither counts that shard as its own nor lets it go as a
    /// grant of its own (before, its load counted it). A later single
    /// election on another shard's name is refused.
    #[tokio::test]
    async fn a_single_elections_leader_of_a_shard_is_no_members() {
        use crate::{Elector, LeaseConfig};
        use std::sync::Arc;
        let store: Arc<dyn Store> = Arc::new(crate::store::memory::MemoryStore::new());
        let ttl = std::time::Duration::from_secs(30);
        let a = CandidateId::new("a").expect("valid");
        let config = LeaseConfig::new(ttl);
        let plain = Elector::new(Arc::clone(&store), a.clone(), config).expect("config");
        let shard = ElectionName::new("jobs/shard/1").expect("valid");
        let held = plain.campaign(&shard).await.expect("granted");
        let member = Arc::new(Elector::new(Arc::clone(&store), a, config).expect("config"));
        let group = ElectionName::new("jobs").expect("valid");
        let shards = Shards::join(Arc::clone(&member), group, 2)
            .await
            .expect("joins");
        let mut view = shards.view();
        let settled = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let now = view.borrow_and_update().clone();
                if now.mine == [0] && now.holders.iter().all(Option::is_some) {
                    return now;
                }
                view.changed().await.expect("view");
            }
        })
        .await
        .expect("shard 0 handed out");
        assert_eq!(settled.loads(), [1], "{settled:?}");
        // Still the single election's: nobody let it go.
        let holder = store.leader(&shard).await.expect("read");
        assert_eq!(holder.map(|l| l.token), Some(held.token()));
        let other = ElectionName::new("jobs/shard/0").expect("valid");
        let refused = plain.campaign(&other).await;
        assert!(
            matches!(&refused, Err(Error::Conflict(why)) if why.contains("belongs to the group jobs")),
            "{:?}",
            refused.err()
        );
        drop(held);
        shards.leave().await;
    }

    /// A single election on a shard's name is refused while the group
    /// has members, and, granted just as a member joined, resigns and is
    /// refused (before, it held the shard and ran beside the group).
    #[tokio::test]
    async fn a_single_election_on_a_shard_of_a_group_with_members_is_refused() {
        use crate::{Elector, LeaseConfig};
        use std::sync::Arc;
        let store = crate::store::memory::MemoryStore::new();
        let ttl = std::time::Duration::from_secs(30);
        let member = store.open_session(ttl).await.expect("open").id;
        let racing: Arc<dyn Store> = Arc::new(Arrives {
            store: store.clone(),
            who: Arrival::Member(member),
        });
        let shard = ElectionName::new("jobs/shard/0").expect("valid");
        let plain = CandidateId::new("plain").expect("valid");
        let elector = Elector::new(racing, plain.clone(), LeaseConfig::new(ttl)).expect("config");
        let refused = |outcome: &Result<crate::Leadership>| {
            matches!(outcome, Err(Error::Conflict(why))
                if why.contains("jobs/shard/0 belongs to the group jobs of 2 shards"))
        };
        let raced = elector.campaign(&shard).await;
        assert!(refused(&raced), "{:?}", raced.err());
        assert_eq!(store.leader(&shard).await.expect("read"), None, "kept");
        let plain_store: Arc<dyn Store> = Arc::new(store.clone());
        let elector = Elector::new(plain_store, plain, LeaseConfig::new(ttl)).expect("config");
        let later = elector.campaign(&shard).await;
        assert!(refused(&later), "{:?}", later.err());
        assert_eq!(store.leader(&shard).await.expect("read"), None, "taken");
    }
}
