//! The group bench: S shards over four members, from a cold start, as a
//! member joins and as one is killed (see the bench's documentation).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::store::{Store, StoreUrl};
use leasehold::testing::FaultyStore;
use leasehold::{ElectionName, Elector, Shards};
use tokio::task::JoinSet;

use super::{CAP, elector, ms};

/// Who acts on each shard, as the members say, and how many grants.
#[derive(Default)]
struct Owners {
    owners: Mutex<HashMap<u32, String>>,
    gains: Mutex<usize>,
}

impl Owners {
    fn loads(&self, names: &[&str]) -> Vec<usize> {
        let owners = self.owners.lock().expect("owners");
        names
            .iter()
            .map(|n| owners.values().filter(|o| o == n).count())
            .collect()
    }
    fn gains(&self) -> usize {
        *self.gains.lock().expect("gains")
    }
}

struct GroupMember {
    elector: Arc<Elector>,
    faults: Arc<FaultyStore>,
    task: tokio::task::JoinHandle<()>,
}

/// Opens `url`, trying again for up to 30 s: a store can be slow to
/// answer just after the held phase let go of 10,000 elections at once
/// (etcd deleting their keys with the lease).
pub(super) async fn open_patiently(url: &StoreUrl) -> Arc<dyn Store> {
    let start = Instant::now();
    loop {
        match leasehold::store::open(url, leasehold::store::Access::ReadWrite).await {
            Ok(store) => return store,
            Err(error) if start.elapsed() < Duration::from_secs(30) => {
                eprintln!("opening the store failed, trying again: {error}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => panic!("open: {error}"),
        }
    }
}

async fn group_member(
    url: &StoreUrl,
    name: &'static str,
    group: &ElectionName,
    count: u32,
    owners: &Arc<Owners>,
) -> GroupMember {
    let faults = Arc::new(FaultyStore::new(
        open_patiently(url).await,
        Arc::new(leasehold::clock::TokioClock),
    ));
    let elector = Arc::new(elector(Arc::clone(&faults) as Arc<dyn Store>, name));
    let (elector2, group, owners) = (Arc::clone(&elector), group.clone(), Arc::clone(owners));
    let task = tokio::spawn(async move {
        let mut shards = Shards::join(elector2, group, count).await.expect("join");
        let mut held = JoinSet::new();
        loop {
            let Ok(shard) = shards.next().await else {
                continue;
            };
            owners
                .owners
                .lock()
                .expect("owners")
                .insert(shard.index(), name.to_owned());
            *owners.gains.lock().expect("gains") += 1;
            let owners = Arc::clone(&owners);
            held.spawn(async move {
                tokio::select! {
                    () = shard.revoked() => {}
                    _ = shard.leadership().lost() => {}
                }
                {
                    let mut map = owners.owners.lock().expect("owners");
                    if map.get(&shard.index()).is_some_and(|o| o == name) {
                        map.remove(&shard.index());
                    }
                }
                let _ = shard.resign().await;
            });
        }
    });
    GroupMember {
        elector,
        faults,
        task,
    }
}

/// Waits until `names` own `want` each; the time it took.
async fn settle(owners: &Owners, names: &[&str], want: &[usize], from: Instant) -> String {
    let reached = tokio::time::timeout(CAP, async {
        loop {
            if owners.loads(names) == want {
                return from.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    match reached {
        Ok(took) => format!("{} ms", ms(took)),
        Err(_) => format!("not in {CAP:?}: {:?}", owners.loads(names)),
    }
}

fn shares(count: u32, members: usize) -> Vec<usize> {
    let count = count as usize;
    (0..members)
        .map(|i| count / members + usize::from(i < count % members))
        .collect()
}

pub(super) struct Grouped {
    pub(super) cold: String,
    pub(super) join: String,
    pub(super) kill: String,
}

pub(super) async fn group(url: &StoreUrl, count: u32) -> Grouped {
    // Cold start: four at once.
    let owners = Arc::new(Owners::default());
    let cold_group = ElectionName::new(format!("cold-{count}")).expect("name");
    let started = Instant::now();
    let mut members = Vec::new();
    for name in ["m0", "m1", "m2", "m3"] {
        members.push(group_member(url, name, &cold_group, count, &owners).await);
    }
    let cold = settle(
        &owners,
        &["m0", "m1", "m2", "m3"],
        &shares(count, 4),
        started,
    )
    .await;
    for m in members.drain(..) {
        m.task.abort();
        let _ = m.task.await;
        let _ = m.elector.close().await;
    }

    // Three settled, then a fourth joins.
    let owners = Arc::new(Owners::default());
    let g = ElectionName::new(format!("moves-{count}")).expect("name");
    for name in ["m0", "m1", "m2"] {
        members.push(group_member(url, name, &g, count, &owners).await);
    }
    let mut three = shares(count, 3);
    three.sort_unstable_by(|a, b| b.cmp(a));
    let mut loads_settled = false;
    for _ in 0..2000 {
        let mut l = owners.loads(&["m0", "m1", "m2"]);
        l.sort_unstable_by(|a, b| b.cmp(a));
        if l == three {
            loads_settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(loads_settled, "three members did not settle");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let gains = owners.gains();
    let started = Instant::now();
    members.push(group_member(url, "m3", &g, count, &owners).await);
    let took = settle(
        &owners,
        &["m0", "m1", "m2", "m3"],
        &shares(count, 4),
        started,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let join = format!("{took}, {} moved", owners.gains() - gains);

    // m3 killed as `run` is: cut off; its grants released and its
    // membership removed from another handle, as its guards do.
    let gains = owners.gains();
    let started = Instant::now();
    let dead = members.pop().expect("m3");
    dead.faults.set_unavailable(true);
    dead.task.abort();
    let session = dead.elector.session().await.ok().map(|s| s.id());
    owners
        .owners
        .lock()
        .expect("owners")
        .retain(|_, o| o != "m3");
    let other = open_patiently(url).await;
    if let Some(session) = session {
        for k in 0..count {
            let election = ElectionName::new(format!("{g}/shard/{k}")).expect("name");
            if let Ok(Some(leader)) = other.leader(&election).await
                && leader.candidate.as_str() == "m3"
            {
                let grant = leasehold::Grant {
                    election,
                    candidate: leader.candidate,
                    session,
                    token: leader.token,
                };
                let _ = other.release_orphaned(&grant).await;
            }
        }
        let _ = other.delete_note(session, &g, "member").await;
    }
    let mut three = shares(count, 3);
    // Which of the three has the extra shard depends on who held most.
    let took = tokio::time::timeout(CAP, async {
        loop {
            let mut l = owners.loads(&["m0", "m1", "m2"]);
            l.sort_unstable_by(|a, b| b.cmp(a));
            three.sort_unstable_by(|a, b| b.cmp(a));
            if l == three {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kill = match took {
        Ok(took) => format!("{} ms, {} moved", ms(took), owners.gains() - gains),
        Err(_) => "not settled".into(),
    };
    for m in members {
        m.task.abort();
        let _ = m.task.await;
        let _ = m.elector.close().await;
    }
    Grouped {
        cold: format!("{cold} ({} shards)", count),
        join,
        kill,
    }
}
