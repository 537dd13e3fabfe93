//! `status`, `observe` and `list`: what the store says, for people and
//! scripts.

use std::process::ExitCode;

use leasehold::{ElectionName, Leader, LeaderStatus, Store};
use serde::Serialize;

use crate::cli::{ListArgs, ObserveArgs, StatusArgs};
use crate::logfields::shown;

/// The JSON object of docs/DESIGN.md: `{"election":E,"leader":{…}|null}`,
/// the same for `status --json`, each line of `observe` and each element
/// of `list --json`.
///
/// `observe` prints `{"election":E,"leader":null,"unknown":true,"error":"…"}`
/// while the store does not answer: the leader is unknown (the last one
/// printed may have stepped down meanwhile).
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    pub election: &'a str,
    pub leader: Option<LeaderJson>,
    /// The waiting candidates in the order they would be granted; absent
    /// where not kept (a store without notes) or not known (`observe`'s
    /// line while the store does not answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<CandidateJson>>,
    /// When the name is a group's (`run --shards`, `run --slots`): its
    /// members and who owns each shard or slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupJson>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CandidateJson {
    pub id: String,
    pub priority: i64,
}

impl CandidateJson {
    pub fn line(standbys: &[leasehold::admin::Standby]) -> Vec<Self> {
        standbys
            .iter()
            .map(|w| CandidateJson {
                id: w.candidate.to_string(),
                priority: w.priority,
            })
            .collect()
    }
}

/// The line of standbys of `election`, less `leader` (whose note may
/// outlive its grant for a moment); `None` on a store that keeps no notes.
pub async fn read_line(
    store: &dyn leasehold::Store,
    election: &ElectionName,
    leader: Option<&leasehold::Leader>,
) -> anyhow::Result<Option<Vec<leasehold::admin::Standby>>> {
    match leasehold::admin::line(store, election).await {
        Ok(mut line) => {
            line.retain(|w| leader.is_none_or(|l| !w.is_of(l)));
            Ok(Some(line))
        }
        Err(leasehold::Error::Unsupported(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

#[derive(Debug, Serialize)]
pub struct LeaderJson {
    pub id: String,
    pub token: u64,
    pub expires_in_ms: u64,
}

impl LeaderJson {
    pub fn new(l: &Leader) -> Self {
        LeaderJson {
            id: l.candidate.to_string(),
            token: l.token.0,
            expires_in_ms: u64::try_from(l.expires_in.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl<'a> Status<'a> {
    pub fn new(election: &'a ElectionName, leader: Option<&Leader>) -> Self {
        Status {
            election: election.as_str(),
            leader: leader.map(LeaderJson::new),
            candidates: None,
            group: None,
            unknown: false,
            error: None,
        }
    }

    /// The store did not answer: the leader is unknown.
    pub fn unknown(election: &'a ElectionName, error: &str) -> Self {
        Status {
            election: election.as_str(),
            leader: None,
            candidates: None,
            group: None,
            unknown: true,
            error: Some(error.to_owned()),
        }
    }

    fn human(&self) -> String {
        let mut line = match &self.leader {
            Some(l) => format!(
                "{}: led by {} (token {}, lease expires in {} ms unless renewed)",
                self.election,
                shown(&l.id),
                l.token,
                l.expires_in_ms
            ),
            None => format!("{}: no leader", self.election),
        };
        if let Some(group) = &self.group {
            return group.human(self.election);
        }
        match self.candidates.as_deref() {
            Some([]) => line.push_str("; nobody waiting"),
            Some(waiting) => {
                let shown: Vec<String> = waiting
                    .iter()
                    .map(|c| {
                        if c.priority == 0 {
                            shown(&c.id).into_owned()
                        } else {
                            format!("{} (priority {})", shown(&c.id), c.priority)
                        }
                    })
                    .collect();
                line.push_str(&format!("; waiting, in order: {}", shown.join(", ")));
            }
            None => {}
        }
        line
    }
}

/// A group: its kind and count, its members with how many each owns,
/// and each shard's or slot's owner.
#[derive(Debug, Serialize)]
pub struct GroupJson {
    /// `shards` or `slots`.
    pub kind: &'static str,
    pub count: u32,
    /// In the order they joined.
    pub members: Vec<MemberJson>,
    /// One per shard or slot, in order.
    pub owners: Vec<OwnerJson>,
}

#[derive(Debug, Serialize)]
pub struct MemberJson {
    pub id: String,
    pub owns: usize,
}

#[derive(Debug, Serialize)]
pub struct OwnerJson {
    pub index: u32,
    pub election: String,
    pub owner: Option<LeaderJson>,
    /// Whether the owner holds it as a member of the group: not a single
    /// election's leader of the name (from before the group), nor a
    /// member that left and has yet to let go.
    pub member: bool,
}

impl GroupJson {
    /// The group from its members and each election's holder.
    pub fn new(
        kind: leasehold::admin::GroupKind,
        members: &[leasehold::admin::Member],
        holders: Vec<(ElectionName, Option<Leader>)>,
    ) -> Self {
        let member_json = members
            .iter()
            .map(|m| MemberJson {
                id: m.candidate.to_string(),
                owns: holders
                    .iter()
                    .filter(|(_, h)| h.as_ref().is_some_and(|h| m.holds(h)))
                    .count(),
            })
            .collect();
        let owners = holders
            .into_iter()
            .zip(0..)
            .map(|((election, holder), index)| OwnerJson {
                index,
                election: election.to_string(),
                member: holder
                    .as_ref()
                    .is_some_and(|h| members.iter().any(|m| m.holds(h))),
                owner: holder.as_ref().map(LeaderJson::new),
            })
            .collect();
        GroupJson {
            kind: match kind {
                leasehold::admin::GroupKind::Shards(_) => "shards",
                leasehold::admin::GroupKind::Slots(_) => "slots",
            },
            count: kind.count(),
            members: member_json,
            owners,
        }
    }

    fn human(&self, name: &str) -> String {
        let unit = self.kind.trim_end_matches('s');
        let kind = if self.count == 1 { unit } else { self.kind };
        let owned = self.owners.iter().filter(|o| o.member).count();
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{} owns {}", shown(&m.id), m.owns))
            .collect();
        let mut text = format!(
            "{name}: group of {} {kind}, {} member{}{}{}; {owned} of {} owned",
            self.count,
            self.members.len(),
            if self.members.len() == 1 { "" } else { "s" },
            if members.is_empty() { "" } else { ": " },
            members.join(", "),
            self.count
        );
        for o in &self.owners {
            match &o.owner {
                Some(l) => text.push_str(&format!(
                    "\n  {unit} {}: {} (token {}){}",
                    o.index,
                    shown(&l.id),
                    l.token,
                    if o.member { "" } else { ", not as a member" }
                )),
                None => text.push_str(&format!("\n  {unit} {}: no owner", o.index)),
            }
        }
        text
    }
}

/// The group named `election`, if replicas use the name for one: its
/// members (from their notes) and its elections' holders (one listing of
/// the store).
pub async fn read_group(
    store: &dyn leasehold::Store,
    election: &ElectionName,
) -> anyhow::Result<Option<GroupJson>> {
    let notes = match store.notes(election).await {
        Ok(notes) => notes,
        Err(leasehold::Error::Unsupported(_)) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let members = leasehold::admin::members(&notes);
    let Some(kind) = members.first().map(|m| m.kind) else {
        return Ok(None);
    };
    let members: Vec<_> = members.into_iter().filter(|m| m.kind == kind).collect();
    let mut held: std::collections::HashMap<ElectionName, Option<Leader>> = store
        .elections()
        .await?
        .into_iter()
        .map(|e| (e.election, e.leader))
        .collect();
    let holders = (0..kind.count())
        .map(|k| {
            let name = kind.election(election, k)?;
            let holder = held.remove(&name).flatten();
            Ok((name, holder))
        })
        .collect::<leasehold::Result<Vec<_>>>()?;
    Ok(Some(GroupJson::new(kind, &members, holders)))
}

pub fn print_line(line: &str) -> anyhow::Result<()> {
    crate::generate::write_stdout(format!("{line}\n").as_bytes())
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    args.store.check_election(&args.election)?;
    let store = args.store.open_read_only().await?;
    let leader = store.leader(&args.election).await?;
    let line = read_line(&*store, &args.election, leader.as_ref()).await?;
    let mut status = Status::new(&args.election, leader.as_ref());
    status.candidates = line.as_deref().map(CandidateJson::line);
    status.group = read_group(&*store, &args.election).await?;
    if args.json {
        print_line(&serde_json::to_string(&status)?)?;
    } else {
        print_line(&status.human())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A line per change of leader or of the line of waiting replicas (never
/// per renewal), each `status --json`'s object; while the store does
/// not answer, a warning on stderr and a line saying the leader is unknown,
/// then the true state once it answers again. A store that can never be
/// watched again (a SQLite file replaced under it) ends the watch: exit 1,
/// saying why in one line.
///
/// On a group's name (`run --shards`, `run --slots`) each line also holds
/// the group: its members and each shard's or slot's owner, printed again
/// whenever a member joins or leaves or an owner changes.
pub async fn observe(args: ObserveArgs) -> anyhow::Result<ExitCode> {
    args.store.check_election(&args.election)?;
    let store = args.store.open_read_only().await?;
    let mut watch = store.watch_status(&args.election).await?;
    let mut group = GroupWatch::new(&*store, &args.election).await?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let election = &args.election;
    let mut printed: Option<Printed> = None;
    loop {
        if group.ended {
            // No line without its candidates: the watch ends, saying why.
            return Err(watch_ended(&*store, election).await);
        }
        let current = watch.borrow_and_update().clone();
        let seen = group.seen(&*store, election).await?;
        let candidates = group.candidates(current.leader());
        let changed = printed.as_ref().is_none_or(|p| {
            !p.status.same_as(&current)
                || !GroupSeen::same(p.group.as_ref(), seen.as_ref())
                || p.candidates != candidates
        });
        if changed {
            if printed
                .as_ref()
                .is_some_and(|p| p.status.is_unknown() && !current.is_unknown())
            {
                tracing::info!(%election, "the store answers again");
            }
            let line = observed_line(election, &current, seen.as_ref(), &candidates);
            print_line(&serde_json::to_string(&line)?)?;
            printed = Some(Printed {
                status: current,
                group: seen,
                candidates,
            });
        }
        tokio::select! {
            changed = watch.changed() => if changed.is_err() {
                return Err(watch_ended(&*store, election).await);
            },
            () = group.changed() => {}
            _ = interrupt.recv() => return Ok(ExitCode::SUCCESS),
            _ = terminate.recv() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// `observe`'s line for what it saw: the leader, the line and the group;
/// or, while the store does not answer, that the leader is unknown (with
/// a warning on stderr).
fn observed_line<'a>(
    election: &'a ElectionName,
    current: &LeaderStatus,
    seen: Option<&GroupSeen>,
    candidates: &Option<Vec<CandidateJson>>,
) -> Status<'a> {
    let unknown = match current {
        LeaderStatus::Unknown { error } => Some(error.clone()),
        LeaderStatus::Known(_) => seen.and_then(GroupSeen::unknown),
    };
    let mut line = match &unknown {
        Some(error) => {
            tracing::warn!(%election, %error,
                "the store does not answer; the leader is unknown until it does");
            Status::unknown(election, error)
        }
        None => {
            let mut line = Status::new(election, current.leader());
            line.candidates.clone_from(candidates);
            line
        }
    };
    line.group = seen.map(GroupSeen::json);
    line
}

/// The end of `observe`'s watch, for good (a SQLite file replaced under
/// its handle): a last line says the leader is unknown, with the reason
/// the store gives on a read, which is returned.
async fn watch_ended(store: &dyn Store, election: &ElectionName) -> anyhow::Error {
    let error = match store.leader(election).await {
        Err(error) => anyhow::Error::from(error),
        Ok(_) => anyhow::anyhow!("the store stopped reporting changes"),
    };
    let line = Status::unknown(election, &format!("{error:#}"));
    match serde_json::to_string(&line) {
        Ok(line) => match print_line(&line) {
            Ok(()) => error,
            Err(printing) => printing,
        },
        Err(encoding) => encoding.into(),
    }
}

/// What `observe` last printed.
struct Printed {
    status: LeaderStatus,
    group: Option<GroupSeen>,
    candidates: Option<Vec<CandidateJson>>,
}

/// What `observe` watches of a group: its members' notes and, once it has
/// members, each shard's or slot's election. Any change wakes
/// [`GroupWatch::changed`].
struct GroupWatch {
    /// The name's notes: a group's members, or the election's line of
    /// waiting replicas. `None` on a store that keeps no notes, and so no
    /// groups and no line.
    notes: Option<leasehold::NoteWatch>,
    /// The kind the watched elections are for, and their watches.
    owners: Option<(leasehold::admin::GroupKind, Vec<leasehold::StatusWatch>)>,
    /// Woken by the tasks that wait on the elections' watches.
    wake: std::sync::Arc<tokio::sync::Notify>,
    forwarders: tokio::task::JoinSet<()>,
    /// Whether the notes' watch ended for good (a SQLite file replaced):
    /// the line of waiting replicas can no longer be known.
    ended: bool,
}

/// The group as `observe` last saw it.
struct GroupSeen {
    kind: leasehold::admin::GroupKind,
    members: Vec<leasehold::admin::Member>,
    owners: Vec<(ElectionName, LeaderStatus)>,
}

impl GroupSeen {
    fn same(a: Option<&Self>, b: Option<&Self>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.kind == b.kind
                    && a.members.len() == b.members.len()
                    && a.members
                        .iter()
                        .zip(&b.members)
                        .all(|(a, b)| a.candidate == b.candidate)
                    && a.owners.len() == b.owners.len()
                    && a.owners
                        .iter()
                        .zip(&b.owners)
                        .all(|((_, a), (_, b))| a.same_as(b))
            }
            _ => false,
        }
    }

    /// Why an owner is unknown, if one is.
    fn unknown(&self) -> Option<String> {
        self.owners.iter().find_map(|(_, status)| match status {
            LeaderStatus::Unknown { error } => Some(error.clone()),
            LeaderStatus::Known(_) => None,
        })
    }

    fn json(&self) -> GroupJson {
        let holders = self
            .owners
            .iter()
            .map(|(name, status)| (name.clone(), status.leader().cloned()))
            .collect();
        GroupJson::new(self.kind, &self.members, holders)
    }
}

impl GroupWatch {
    async fn new(store: &dyn leasehold::Store, group: &ElectionName) -> anyhow::Result<Self> {
        let notes = match store.watch_notes(group).await {
            Ok(notes) => Some(notes),
            Err(leasehold::Error::Unsupported(_)) => None,
            Err(error) => return Err(error.into()),
        };
        Ok(GroupWatch {
            ended: false,
            notes,
            owners: None,
            wake: std::sync::Arc::default(),
            forwarders: tokio::task::JoinSet::new(),
        })
    }

    /// The group now, if the name has members; watches its elections from
    /// the first time it has, and again if its kind changes (the group
    /// emptied and formed anew).
    async fn seen(
        &mut self,
        store: &dyn leasehold::Store,
        group: &ElectionName,
    ) -> anyhow::Result<Option<GroupSeen>> {
        let Some(notes) = self.notes.as_mut() else {
            return Ok(None);
        };
        let members = leasehold::admin::members(&notes.borrow_and_update());
        let Some(kind) = members.first().map(|m| m.kind) else {
            return Ok(None);
        };
        let members: Vec<_> = members.into_iter().filter(|m| m.kind == kind).collect();
        if self.owners.as_ref().is_none_or(|(k, _)| *k != kind) {
            self.forwarders.abort_all();
            let mut watches = Vec::with_capacity(kind.count() as usize);
            for k in 0..kind.count() {
                let watch = store.watch_status(&kind.election(group, k)?).await?;
                let wake = self.wake.clone();
                let mut forward = watch.clone();
                self.forwarders.spawn(async move {
                    while forward.changed().await.is_ok() {
                        wake.notify_one();
                    }
                });
                watches.push(watch);
            }
            self.owners = Some((kind, watches));
        }
        let owners = match &self.owners {
            Some((_, watches)) => (0..kind.count())
                .zip(watches)
                .map(|(k, w)| Ok((kind.election(group, k)?, w.borrow().clone())))
                .collect::<leasehold::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok(Some(GroupSeen {
            kind,
            members,
            owners,
        }))
    }

    /// The line of waiting replicas as the watched notes show it, less
    /// `leader` (as `status` reads it, [`read_line`]); `None` on a store
    /// that keeps no notes.
    fn candidates(&self, leader: Option<&Leader>) -> Option<Vec<CandidateJson>> {
        let notes = self.notes.as_ref()?;
        let mut line = leasehold::admin::standbys(&notes.borrow());
        line.retain(|w| leader.is_none_or(|l| !w.is_of(l)));
        Some(CandidateJson::line(&line))
    }

    /// Resolves when the members, an owner or the line of waiting replicas
    /// may have changed; never on a store without notes.
    async fn changed(&mut self) {
        let Some(notes) = self.notes.as_mut() else {
            return std::future::pending().await;
        };
        tokio::select! {
            changed = notes.changed() => if changed.is_err() {
                // The notes' watch ended for good; the leader's watch says
                // why.
                self.notes = None;
                self.ended = true;
            },
            () = self.wake.notified() => {}
        }
    }
}

pub async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let layout = args.store.url()?.layout();
    if layout.is_foreign() {
        return Err(crate::cli::foreign_layout_refuses(
            "list (the store holds other programs' elections too; name one with status --election E)",
            layout,
        )
        .into());
    }
    let store = args.store.open_read_only().await?;
    let mut elections = store.elections().await?;
    // Numbers in names in numeric order: shard/2 before shard/10.
    elections.sort_by(|a, b| natural_order(a.election.as_str(), b.election.as_str()));
    let mut statuses: Vec<Status<'_>> = Vec::with_capacity(elections.len());
    for e in &elections {
        let mut status = Status::new(&e.election, e.leader.as_ref());
        status.candidates = read_line(&*store, &e.election, e.leader.as_ref())
            .await?
            .as_deref()
            .map(CandidateJson::line);
        statuses.push(status);
    }
    if args.json {
        print_line(&serde_json::to_string(&statuses)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = format!(
        "{:<40} {:<32} {:>8} {:>14} {:>7}",
        "ELECTION", "LEADER", "TOKEN", "EXPIRES_IN_MS", "WAITING"
    );
    for s in &statuses {
        let (id, token, expires) = match &s.leader {
            Some(l) => (
                shown(&l.id),
                l.token.to_string(),
                l.expires_in_ms.to_string(),
            ),
            None => ("-".into(), "-".to_owned(), "-".to_owned()),
        };
        let waiting = s
            .candidates
            .as_ref()
            .map_or_else(|| "-".to_owned(), |c| c.len().to_string());
        table.push_str(&format!(
            "\n{:<40} {:<32} {:>8} {:>14} {:>7}",
            s.election, id, token, expires, waiting
        ));
    }
    print_line(&table)?;
    Ok(ExitCode::SUCCESS)
}

/// Orders names as a reader expects: runs of digits by their value, the
/// rest byte by byte (`shard/2` before `shard/10`).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (left, right) = (chunks(a), chunks(b));
    for (l, r) in left.iter().zip(&right) {
        let ordering = match (l, r) {
            ((true, l), (true, r)) => {
                let (l, r) = (l.trim_start_matches('0'), r.trim_start_matches('0'));
                l.len().cmp(&r.len()).then_with(|| l.cmp(r))
            }
            ((_, l), (_, r)) => l.cmp(r),
        };
        if ordering.is_ne() {
            return ordering;
        }
    }
    left.len().cmp(&right.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::natural_order;

    #[test]
    fn names_sort_with_their_numbers_by_value() {
        let mut names = vec![
            "jobs/shard/10",
            "jobs/shard/2",
            "jobs",
            "a",
            "jobs/shard/02x",
            "b1",
            "b01",
            "x",
        ];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(
            names,
            [
                "a",
                "b01",
                "b1",
                "jobs",
                "jobs/shard/2",
                "jobs/shard/02x",
                "jobs/shard/10",
                "x"
            ]
        );
    }
}
