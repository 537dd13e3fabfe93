//! Elections laid out as another ZooKeeper client's recipe
//! (`?layout=curator|kazoo`), so that leasehold candidates and that
//! client's contend in one election: the node names, the data, the order
//! and the node each waiter watches are the recipe's own (see the module
//! documentation of [`super`]). Nothing of leasehold's own is written
//! there: no marker, no notes, no record of releases.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use zookeeper_client::{Client, CreateMode};

use super::{
    ATTEMPTS, Inner, ZkSession, granted_token, not_holder, request, token_of, unavailable,
};
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::cleanup::OnDrop;
use crate::store::layout::Layout;
use crate::store::{Grant, Leader, SessionId};

/// The election recipe whose wire layout a store speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recipe {
    /// Apache Curator's `LeaderLatch`.
    Curator,
    /// kazoo's `Election` (its `Lock`).
    Kazoo,
}

/// What Curator's `LeaderLatch` names its nodes after the protection
/// prefix, and what its sorting looks for.
const LATCH: &str = "latch-";
/// What kazoo's `Lock` names its nodes after the contender's uuid.
const LOCK: &str = "__lock__";
/// Curator's protection prefix: `_c_{uuid}-`.
const PROTECTED: &str = "_c_";

impl Recipe {
    /// The recipe `layout` names; `None` for leasehold's own layout.
    pub(super) fn of(layout: Layout) -> Option<Recipe> {
        match layout {
            Layout::Curator => Some(Recipe::Curator),
            Layout::Kazoo => Some(Recipe::Kazoo),
            _ => None,
        }
    }

    pub(super) fn layout(self) -> Layout {
        match self {
            Recipe::Curator => Layout::Curator,
            Recipe::Kazoo => Layout::Kazoo,
        }
    }

    /// A new prefix for a candidate node's name, unique to its creator, to
    /// which ZooKeeper appends the sequence: Curator's protected name
    /// `_c_{uuid}-latch-`, kazoo's `{uuid hex}__lock__`.
    fn new_prefix(self) -> String {
        let uuid = random_uuid();
        match self {
            Recipe::Curator => format!("{PROTECTED}{}-{LATCH}", hyphenated(uuid)),
            Recipe::Kazoo => format!("{uuid:032x}{LOCK}"),
        }
    }

    /// The election's contenders among an election node's `children`, in
    /// the recipe's order: the first leads, and each waiter watches the one
    /// just ahead of it.
    ///
    /// - Curator sorts every child (it skips none) by the text after the
    ///   last `latch-` in its name, or by the whole name if there is none.
    /// - kazoo (2.8, as Debian ships it) counts only the children whose
    ///   name ends in `__lock__` and ten digits, with an optional `-` before
    ///   them (a wrapped sequence), and sorts them by that sequence; a
    ///   `__rlock__` (a read lock's) or any other node is no contender of an
    ///   election and never makes anyone wait. Earlier kazoo releases sort
    ///   by the text after `__lock__` or `__rlock__`, unknown names last,
    ///   and wait only on `__lock__` nodes: the same leader and the same
    ///   predecessors for every node either client writes.
    ///
    /// Children the recipe sorts alike (only a name that is no recipe's
    /// can tie) are put in the order of their names, where the recipes
    /// keep the order the server listed them in.
    pub(super) fn line(self, children: &[String]) -> Vec<String> {
        let mut keyed: Vec<(&str, &String)> = match self {
            Recipe::Curator => children.iter().map(|c| (curator_key(c), c)).collect(),
            Recipe::Kazoo => children
                .iter()
                .filter_map(|c| Some((kazoo_key(c)?, c)))
                .collect(),
        };
        keyed.sort();
        keyed.into_iter().map(|(_, c)| c.clone()).collect()
    }

    /// How the recipe creates the missing nodes of an election's path:
    /// Curator as containers (which the server deletes once they are
    /// empty again), kazoo as persistent nodes.
    fn parent_mode(self) -> CreateMode {
        match self {
            Recipe::Curator => CreateMode::Container,
            Recipe::Kazoo => CreateMode::Persistent,
        }
    }
}

/// Curator's sorting key (`StandardLockInternalsDriver.fixForSorting`):
/// the text after the last `latch-`, or the whole name. (Java compares
/// keys by UTF-16 code units, which orders the characters ZooKeeper admits
/// in a name, none a surrogate, as Rust's comparison of `str` does.)
fn curator_key(name: &str) -> &str {
    match name.rfind(LATCH) {
        Some(at) => &name[at + LATCH.len()..],
        None => name,
    }
}

/// kazoo's sorting key for a contender of its `Lock` — the sequence at the
/// end of `…__lock__NNNNNNNNNN` (or `…__lock__-NNNNNNNNNN`) — or `None` for
/// a node that is none. (kazoo's pattern takes any Unicode decimal digit;
/// ZooKeeper writes ASCII ones, the only ones taken here.)
fn kazoo_key(name: &str) -> Option<&str> {
    let bytes = name.as_bytes();
    let digits = bytes.len().checked_sub(10)?;
    if !bytes[digits..].iter().all(u8::is_ascii_digit) {
        return None;
    }
    // `digits` is a character boundary: the byte there is an ASCII digit.
    let head = &name[..digits];
    if head.ends_with(LOCK) {
        Some(&name[digits..])
    } else if head.ends_with('-') && head[..head.len() - 1].ends_with(LOCK) {
        Some(&name[digits - 1..])
    } else {
        None
    }
}

/// 128 random bits as a version-4 UUID: from the kernel's random source,
/// else from the standard library's per-process random hash keys, the
/// clock and a counter (unique, if less random).
fn random_uuid() -> u128 {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(n);
            hasher.write_usize(i);
            hasher.write_u128(now);
            hasher.write_u32(std::process::id());
            chunk.copy_from_slice(&hasher.finish().to_le_bytes());
        }
    }
    // Version 4 (random), variant 10 (RFC 4122).
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    u128::from_be_bytes(bytes)
}

/// A UUID as Java's `UUID.toString` writes it: lowercase, 8-4-4-4-12.
fn hyphenated(uuid: u128) -> String {
    let hex = format!("{uuid:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The candidate id a node's data shows: the recipes write the
/// participant's id (Curator) or identifier (kazoo) as UTF-8, which
/// another client may make anything; shown as well as it can be —
/// invalid UTF-8 and control characters replaced, cut to
/// [`crate::names::MAX_NAME_LEN`] bytes, `(empty id)` when empty.
fn shown_id(data: &[u8]) -> CandidateId {
    CandidateId::shown(data, "(empty id)")
}

impl ZkSession {
    /// Starts a campaign in `election`: the prefix of the session's
    /// candidate node there, and the campaign's number. The prefix is made
    /// at the session's first campaign in the election and kept for the
    /// session's life, so that a campaign again after a lost reply finds
    /// the node the server created (as Curator's protected mode and kazoo
    /// do) rather than make a second; the number tells a dropped campaign's
    /// withdrawal that a later campaign took the node over.
    fn start_recipe_campaign(&self, recipe: Recipe, election: &ElectionName) -> (String, u64) {
        let mut campaigns = crate::mutex::lock(&self.recipe_campaigns);
        let (prefix, number) = campaigns
            .entry(election.clone())
            .or_insert_with(|| (recipe.new_prefix(), 0));
        *number += 1;
        (prefix.clone(), *number)
    }

    /// The prefix of this session's candidate node in `election`, if it
    /// ever campaigned there.
    pub(super) fn known_recipe_prefix(&self, election: &ElectionName) -> Option<String> {
        crate::mutex::lock(&self.recipe_campaigns)
            .get(election)
            .map(|(prefix, _)| prefix.clone())
    }

    fn holds(&self, election: &ElectionName) -> bool {
        crate::mutex::lock(&self.held).contains(election)
    }
}

/// What [`ZkSession::start_recipe_campaign`] keeps: per election, the
/// prefix of the session's node and the number of its latest campaign.
pub(super) type RecipeCampaigns = HashMap<ElectionName, (String, u64)>;

impl Inner {
    /// The node of `election` in a recipe's layout: `{root}/{election}`
    /// (`/{election}` without a root), a `/` in the name making a nested
    /// path, as the recipe's own clients name it. A name ZooKeeper would
    /// refuse as a path, or inside ZooKeeper's own `/zookeeper`, is bad
    /// input.
    pub(super) fn recipe_dir(&self, election: &ElectionName) -> Result<String> {
        let name = election.as_str();
        if name
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(Error::invalid(
                "election name",
                format!(
                    "{name:?} is no ZooKeeper path (an empty, . or .. segment); with \
                     ?layout=curator or kazoo an election is the path its clients join"
                ),
            ));
        }
        let dir = format!("{}/{name}", self.root);
        if dir == "/zookeeper" || dir.starts_with("/zookeeper/") {
            return Err(Error::invalid(
                "election name",
                format!("{dir} is inside ZooKeeper's own node /zookeeper"),
            ));
        }
        Ok(dir)
    }

    /// How long the holder of the node `stat` describes has left, as well
    /// as the store can tell: the TTL of this store's session when the
    /// node is ephemeral to one, else (another client's session, whose
    /// timeout ZooKeeper does not tell, or a node that is not ephemeral)
    /// the session timeout the server negotiated with `client`, an
    /// estimate.
    fn expiry_estimate(&self, client: &Client, stat: &zookeeper_client::Stat) -> Duration {
        match self.session(SessionId::from_bits(stat.ephemeral_owner)) {
            Some(session) => session.ttl,
            None => client.session_timeout(),
        }
    }

    /// The leader of `election` in `recipe`'s layout as `client` reads it:
    /// the first of the recipe's line, whoever made it.
    pub(super) async fn recipe_leader_via(
        &self,
        recipe: Recipe,
        client: &Client,
        election: &ElectionName,
    ) -> Result<Option<Leader>> {
        let dir = self.recipe_dir(election)?;
        loop {
            let children = match request("list candidates", client.list_children(&dir)).await? {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => return Ok(None),
                Err(error) => return Err(self.failed("list candidates", &dir, error)),
            };
            let Some(first) = recipe.line(&children).into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{dir}/{first}");
            match request("read the leader", client.get_data(&path)).await? {
                Ok((data, stat)) => {
                    return Ok(Some(Leader {
                        candidate: shown_id(&data),
                        token: token_of(&stat),
                        expires_in: self.expiry_estimate(client, &stat),
                        session: Some(SessionId::from_bits(stat.ephemeral_owner)),
                    }));
                }
                // Gone between the list and the read: list again.
                Err(zookeeper_client::Error::NoNode) => continue,
                Err(error) => return Err(self.failed("read the leader", &path, error)),
            }
        }
    }

    /// Deletes `grant`'s candidate node through `client`: the node in the
    /// election that is ephemeral to the grant's session and was created
    /// by the grant's transaction (its token), if it is still there —
    /// never another node. `prefix`, if known, narrows the search to the
    /// session's own names. [`Error::NotHolder`] if there is none.
    pub(super) async fn recipe_delete_grant_node(
        &self,
        recipe: Recipe,
        client: &Client,
        grant: &Grant,
        prefix: Option<&str>,
    ) -> Result<()> {
        const WHAT: &str = "delete the candidate node";
        let dir = self.recipe_dir(&grant.election)?;
        let children = match request("list candidates", client.list_children(&dir)).await? {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Err(not_holder(grant)),
            Err(error) => return Err(self.failed("list candidates", &dir, error)),
        };
        // The recipe's line first: the grant's node normally leads it.
        let mut names = recipe.line(&children);
        let others: Vec<String> = children
            .into_iter()
            .filter(|c| !names.contains(c))
            .collect();
        names.extend(others);
        names.retain(|name| prefix.is_none_or(|p| name.starts_with(p)));
        for name in names {
            let path = format!("{dir}/{name}");
            let stat = match request("read a candidate node", client.check_stat(&path)).await? {
                Ok(Some(stat)) => stat,
                Ok(None) => continue,
                Err(error) => return Err(self.failed("read a candidate node", &path, error)),
            };
            if SessionId::from_bits(stat.ephemeral_owner) != grant.session
                || token_of(&stat) != grant.token
            {
                continue;
            }
            // Checked against the version read: the node as it was seen.
            return match request(WHAT, client.delete(&path, Some(stat.version))).await? {
                Ok(()) => Ok(()),
                Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => {
                    Err(not_holder(grant))
                }
                Err(error) => Err(self.failed(WHAT, &path, error)),
            };
        }
        Err(not_holder(grant))
    }

    /// How many candidate nodes in `election` are ephemeral to `session`
    /// (tests).
    #[cfg(feature = "testing")]
    pub(super) async fn recipe_candidate_nodes(
        &self,
        session: SessionId,
        election: &ElectionName,
    ) -> Result<usize> {
        let client = self.reader().await?;
        let dir = self.recipe_dir(election)?;
        let children = match request("list candidates", client.list_children(&dir)).await? {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(0),
            Err(error) => return Err(self.failed("list candidates", &dir, error)),
        };
        let mut count = 0;
        for child in children {
            let path = format!("{dir}/{child}");
            if let Ok(Some(stat)) =
                request("read a candidate node", client.check_stat(&path)).await?
                && SessionId::from_bits(stat.ephemeral_owner) == session
            {
                count += 1;
            }
        }
        Ok(count)
    }

    /// [`crate::store::Store::campaign`] in `recipe`'s layout: the
    /// session's node joins the recipe's line, as one of the recipe's own
    /// clients would, and waits for the node just ahead of it to go until
    /// it is first.
    pub(super) async fn recipe_campaign(
        &self,
        recipe: Recipe,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        let (zk, client) = self.live_session(session)?;
        let dir = self.recipe_dir(election)?;
        let (prefix, number) = zk.start_recipe_campaign(recipe, election);
        let guard = {
            let (zk, election, dir, prefix) = (
                Arc::clone(&zk),
                election.clone(),
                dir.clone(),
                prefix.clone(),
            );
            OnDrop::new((), move |()| withdraw(zk, election, dir, prefix, number))
        };
        let campaign = RecipeCampaign {
            inner: self,
            recipe,
            zk: &zk,
            client: &client,
            dir: &dir,
            prefix: &prefix,
        };
        loop {
            let line = campaign.line().await?;
            let Some(position) = campaign.own_position(&line).await? else {
                campaign.join(candidate).await?;
                continue;
            };
            if position == 0 {
                let Some(stat) = campaign.read_own_node(&line[0]).await? else {
                    continue;
                };
                // Checked while the guard would still withdraw the node.
                let token = granted_token(election, &stat)?;
                crate::mutex::lock(&zk.held).insert(election.clone());
                guard.disarm();
                tracing::debug!(%election, %session, node = %line[0], recipe = %recipe.layout(), "granted by zookeeper");
                return Ok(Grant {
                    election: election.clone(),
                    candidate: candidate.clone(),
                    session,
                    token,
                });
            }
            campaign.wait_for(&line[position - 1]).await?;
        }
    }
}

/// Withdraws a candidacy whose campaign (the session's campaign `number`
/// in the election) was dropped before it completed: deletes the session's
/// nodes named with `prefix` in the election's node `dir`, unless the
/// session holds the election or campaigns there again, taking the node
/// over. The list is sent after any create of the dropped campaign on the
/// same session, so ZooKeeper answers it after that create; each delete is
/// sent while no later campaign can start, so a later campaign's requests
/// on the session, which ZooKeeper answers in order, see the node gone.
///
/// Tried again while ZooKeeper does not answer, as in leasehold's layout.
async fn withdraw(
    session: Arc<ZkSession>,
    election: ElectionName,
    dir: String,
    prefix: String,
    number: u64,
) {
    crate::store::cleanup::until_done("withdraw a cancelled campaign", || {
        let (session, election) = (Arc::clone(&session), election.clone());
        let (dir, prefix) = (dir.clone(), prefix.clone());
        async move { withdraw_once(&session, &election, &dir, &prefix, number).await }
    })
    .await;
}

async fn withdraw_once(
    session: &ZkSession,
    election: &ElectionName,
    dir: &str,
    prefix: &str,
    number: u64,
) -> Result<()> {
    use zookeeper_client::Error::{NoNode, SessionExpired};
    let Some(client) = session.client() else {
        return Ok(());
    };
    let children = match request("list candidates", client.list_children(dir)).await? {
        Ok(children) => children,
        Err(NoNode | SessionExpired) => return Ok(()),
        Err(error) => return Err(unavailable("list candidates", error)),
    };
    for node in children.iter().filter(|c| c.starts_with(prefix)) {
        let delete = {
            let campaigns = crate::mutex::lock(&session.recipe_campaigns);
            let latest = campaigns.get(election).map(|(_, n)| *n);
            if latest != Some(number) || session.holds(election) {
                return Ok(());
            }
            // Sent now, under the lock.
            client.delete(&format!("{dir}/{node}"), None)
        };
        match request("withdraw", delete).await? {
            Ok(()) | Err(NoNode | SessionExpired) => {}
            Err(error) => return Err(unavailable("withdraw", error)),
        }
    }
    Ok(())
}

/// One campaign's steps in a recipe's layout. Every request fails with
/// [`Error::SessionExpired`] once the session ends.
struct RecipeCampaign<'a> {
    inner: &'a Inner,
    recipe: Recipe,
    zk: &'a ZkSession,
    client: &'a Client,
    /// The election's node.
    dir: &'a str,
    /// How this session's node in the election is named.
    prefix: &'a str,
}

impl RecipeCampaign<'_> {
    /// The recipe's line in the election now (empty if its node is not
    /// there yet). A node of the session's that the recipe would not count
    /// (a sequence ZooKeeper wrote past ten digits) is refused rather than
    /// joined again and again.
    async fn line(&self) -> Result<Vec<String>> {
        const WHAT: &str = "list candidates";
        let listed = self
            .zk
            .ask(WHAT, self.client.list_children(self.dir))
            .await?;
        let children = match listed {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
            Err(error) => return Err(self.zk.refused(WHAT, self.dir, error)),
        };
        let line = self.recipe.line(&children);
        let outside = children
            .iter()
            .find(|c| c.starts_with(self.prefix) && !line.contains(c));
        if let Some(node) = outside {
            return Err(Error::Unavailable {
                reason: format!(
                    "zookeeper node {}/{node} is not in the line of ?layout={}",
                    self.dir,
                    self.recipe.layout()
                ),
                source: None,
            });
        }
        Ok(line)
    }

    /// Where in `line` the session's node is, if it has one. Deletes any
    /// second node of the session.
    async fn own_position(&self, line: &[String]) -> Result<Option<usize>> {
        let mut mine = line
            .iter()
            .enumerate()
            .filter(|(_, name)| name.starts_with(self.prefix));
        let Some((position, _)) = mine.next() else {
            return Ok(None);
        };
        for (_, extra) in mine {
            let _ = request(
                "delete a duplicate candidate",
                self.client.delete(&format!("{}/{extra}", self.dir), None),
            )
            .await;
        }
        Ok(Some(position))
    }

    /// Joins the line: creates the session's node as the recipe's clients
    /// do — ephemeral and sequential, holding the candidate id — after the
    /// missing nodes of the election's path.
    async fn join(&self, candidate: &CandidateId) -> Result<()> {
        const WHAT: &str = "create a candidate node";
        let ephemeral = CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        let path = format!("{}/{}", self.dir, self.prefix);
        for _ in 0..ATTEMPTS {
            let created = (self.zk)
                .ask(
                    WHAT,
                    self.client
                        .create(&path, candidate.as_str().as_bytes(), &ephemeral),
                )
                .await?;
            match created {
                Ok(_) => return Ok(()),
                // Not made yet, or a container the server deleted once it
                // was empty.
                Err(zookeeper_client::Error::NoNode) => self.make_path().await?,
                Err(error) => return Err(self.zk.refused(WHAT, self.dir, error)),
            }
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper {WHAT}: node {} kept disappearing", self.dir),
            source: None,
        })
    }

    /// Creates the election's node and its missing parents as the recipe
    /// does, with the store's ACL; nodes already there are left as they
    /// are.
    async fn make_path(&self) -> Result<()> {
        const WHAT: &str = "create the election node";
        let mut mode = self.recipe.parent_mode();
        loop {
            let options = mode.with_acls(self.inner.acls);
            match self
                .zk
                .ask(WHAT, self.client.mkdir(self.dir, &options))
                .await?
            {
                Ok(()) => return Ok(()),
                // A server without containers (before 3.5.3): persistent
                // nodes, as Curator falls back to.
                Err(zookeeper_client::Error::Unimplemented) if mode == CreateMode::Container => {
                    mode = CreateMode::Persistent;
                }
                Err(error) => return Err(self.zk.refused(WHAT, self.dir, error)),
            }
        }
    }

    /// The stat of the session's node `name`, first in line (its creation
    /// is the grant's token), or `None` if it is gone.
    async fn read_own_node(&self, name: &str) -> Result<Option<zookeeper_client::Stat>> {
        const WHAT: &str = "read the candidate node";
        let path = format!("{}/{name}", self.dir);
        match self.zk.ask(WHAT, self.client.check_stat(&path)).await? {
            Ok(stat) => Ok(stat),
            Err(error) => Err(self.zk.refused(WHAT, &path, error)),
        }
    }

    /// Waits until the node `ahead` of the session's is gone (or changes):
    /// the only node a waiter watches, as in both recipes. A data watch, as
    /// theirs: one on a node already gone is never set, so none is left
    /// behind on the server.
    async fn wait_for(&self, ahead: &str) -> Result<()> {
        const WHAT: &str = "watch the predecessor";
        let predecessor = format!("{}/{ahead}", self.dir);
        let watched = (self.zk)
            .ask(WHAT, self.client.get_and_watch_data(&predecessor))
            .await?;
        match watched {
            Ok((_, _, watcher)) => {
                self.zk.unless_ended(watcher.changed()).await?;
                Ok(())
            }
            Err(zookeeper_client::Error::NoNode) => Ok(()),
            Err(error) => Err(self.zk.refused(WHAT, &predecessor, error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn curator_sorts_by_the_text_after_the_last_latch() {
        let children = names(&[
            "_c_2b1a4c8e-0000-4000-8000-000000000002-latch-0000000007",
            "_c_9f0e5d3a-0000-4000-8000-000000000001-latch-0000000003",
            "latch-0000000005",
            // After the last `latch-`: "0000000004".
            "x-latch-9-latch-0000000004",
        ]);
        assert_eq!(
            Recipe::Curator.line(&children),
            names(&[
                "_c_9f0e5d3a-0000-4000-8000-000000000001-latch-0000000003",
                "x-latch-9-latch-0000000004",
                "latch-0000000005",
                "_c_2b1a4c8e-0000-4000-8000-000000000002-latch-0000000007",
            ])
        );
    }

    #[test]
    fn curator_counts_a_node_without_latch_by_its_whole_name() {
        // Curator skips no child: one without `latch-` sorts by its whole
        // name, here after the sequences ("l" > "9")…
        let children = names(&["lock", "_c_a-latch-0000000002", "_c_b-latch-0000000001"]);
        assert_eq!(
            Recipe::Curator.line(&children),
            names(&["_c_b-latch-0000000001", "_c_a-latch-0000000002", "lock"])
        );
        // …and here before them ("-" < "0"), so it leads, as it does for
        // Curator's own clients.
        let children = names(&["_c_b-latch-0000000001", "0-first"]);
        assert_eq!(
            Recipe::Curator.line(&children),
            names(&["0-first", "_c_b-latch-0000000001"])
        );
        // Equal keys: by name.
        let children = names(&["b-latch-0000000001", "0000000001", "a-latch-0000000001"]);
        assert_eq!(
            Recipe::Curator.line(&children),
            names(&["0000000001", "a-latch-0000000001", "b-latch-0000000001"])
        );
    }

    #[test]
    fn kazoo_counts_only_lock_nodes_by_their_sequence() {
        let children = names(&[
            "d3b07384d113edec49eaa6238ad5ff00__lock__0000000009",
            "c157a79031e1c40f85931829bc5fc552__rlock__0000000001",
            "lease_holder",
            "0000000000",
            "x__lock__12345",
            "x__lock__00000000001",
            "9e107d9d372bb6826bd81d3542a419d6__lock__0000000002",
            "a__lock__-0000000005",
        ]);
        assert_eq!(
            Recipe::Kazoo.line(&children),
            names(&[
                // A wrapped sequence sorts first ("-" < "0"), as in kazoo.
                "a__lock__-0000000005",
                "9e107d9d372bb6826bd81d3542a419d6__lock__0000000002",
                "d3b07384d113edec49eaa6238ad5ff00__lock__0000000009",
            ])
        );
        assert_eq!(kazoo_key("__lock__0000000001"), Some("0000000001"));
        assert_eq!(kazoo_key("é__lock__0000000001"), Some("0000000001"));
        assert_eq!(kazoo_key("é0000000001"), None);
        assert_eq!(kazoo_key("__lock__"), None);
        assert_eq!(kazoo_key("-0000000001"), None);
    }

    #[test]
    fn names_are_those_the_recipes_make() {
        let curator = Recipe::Curator.new_prefix();
        // `_c_` + a canonical UUID (36 characters) + `-` + `latch-`.
        assert_eq!(curator.len(), 3 + 36 + 1 + LATCH.len(), "{curator}");
        assert!(curator.starts_with("_c_") && curator.ends_with("-latch-"));
        let uuid = &curator[3..39];
        let dashes: Vec<usize> = uuid.match_indices('-').map(|(i, _)| i).collect();
        assert_eq!(dashes, [8, 13, 18, 23], "{uuid}");
        assert_eq!(&uuid[14..15], "4", "version 4: {uuid}");
        assert!(
            uuid.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        let kazoo = Recipe::Kazoo.new_prefix();
        assert_eq!(kazoo.len(), 32 + LOCK.len(), "{kazoo}");
        assert!(kazoo.ends_with(LOCK));
        assert!(
            kazoo[..32]
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        assert_ne!(Recipe::Kazoo.new_prefix(), kazoo, "a new uuid each time");
        // What the server then names the node is a contender of the recipe.
        let node = format!("{kazoo}0000000042");
        let line = Recipe::Kazoo.line(std::slice::from_ref(&node));
        assert_eq!(line, std::slice::from_ref(&node));
        assert_eq!(curator_key(&format!("{curator}0000000042")), "0000000042");
    }

    #[test]
    fn ids_are_shown_as_well_as_they_can_be() {
        assert_eq!(shown_id(b"java-1").as_str(), "java-1");
        assert_eq!(shown_id(b"").as_str(), "(empty id)");
        assert_eq!(shown_id(b"a\nb\xff").as_str(), "a\u{fffd}b\u{fffd}");
        let long = "é".repeat(150);
        let shown = shown_id(long.as_bytes());
        assert_eq!(shown.as_str().len(), crate::names::MAX_NAME_LEN);
    }
}
