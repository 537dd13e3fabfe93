//! Follow an election's leader: print a line whenever it changes.
//!
//! ```sh
//! cargo run -p leasehold --example follow                  # a SQLite store in the temp dir
//! cargo run -p leasehold --example follow -- memory:       # a self-contained demo
//! cargo run -p leasehold --example follow -- STORE_URL
//! ```
//!
//! Followers often need to know who leads — to forward requests to it, or
//! to show it — without campaigning themselves. `Elector::observe` gives a
//! watch that always holds the latest status (a slow reader may skip
//! intermediate states, never the last one): the leader, or that the store
//! cannot be read, when the last leader may have stepped down meanwhile.
//! The store pushes changes
//! (inotify for SQLite, watches for etcd and ZooKeeper, `NOTIFY` for
//! PostgreSQL), nothing polls.
//!
//! On the default store (`sqlite:$TMPDIR/leasehold-examples.db`, shared with
//! the `campaign` example) it runs until Ctrl-C: start `campaign` in other
//! terminals to see leaders come and go. On `memory:` the store lives in
//! this process, so the example starts three candidates of its own that
//! take turns, and exits once the last one has resigned.

use std::sync::Arc;
use std::time::Duration;

use leasehold::store::Store;
use leasehold::{CandidateId, ElectionName, Elector, LeaderStatus, LeaseConfig, StoreUrl};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn describe(status: &LeaderStatus) -> String {
    match status {
        LeaderStatus::Known(Some(l)) => format!(
            "leader: {} with token {} (lease expires in {} ms)",
            l.candidate,
            l.token,
            l.expires_in.as_millis()
        ),
        LeaderStatus::Known(None) => "no leader".to_owned(),
        LeaderStatus::Unknown { error } => format!("leader unknown: {error}"),
    }
}

/// Whether `a` and `b` differ: another holder (renewals do not count), or
/// known against unknown.
fn changed(a: &LeaderStatus, b: &LeaderStatus) -> bool {
    match (a, b) {
        (LeaderStatus::Known(Some(a)), LeaderStatus::Known(Some(b))) => !a.same_grant(b),
        (LeaderStatus::Known(None), LeaderStatus::Known(None)) => false,
        (LeaderStatus::Unknown { .. }, LeaderStatus::Unknown { .. }) => false,
        _ => true,
    }
}

/// The `memory:` demo: three candidates campaign at once; each leads for
/// 300 ms and resigns, and the next in line takes over.
async fn take_turns(store: Arc<dyn Store>, election: ElectionName) -> Result<(), BoxError> {
    let mut turns = tokio::task::JoinSet::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let elector = Elector::new(
            Arc::clone(&store),
            CandidateId::new(name)?,
            LeaseConfig::new(Duration::from_secs(2)),
        )?;
        let election = election.clone();
        turns.spawn(async move {
            let leadership = elector.campaign(&election).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            leadership.resign().await?;
            elector.close().await
        });
    }
    while let Some(turn) = turns.join_next().await {
        turn??;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url: StoreUrl = match std::env::args().nth(1) {
        Some(url) => url.parse()?,
        None => StoreUrl::Sqlite(std::env::temp_dir().join("leasehold-examples.db")),
    };
    let store = leasehold::store::open(&url, leasehold::store::Access::ReadWrite).await?;
    let election = ElectionName::new("example")?;
    // Observing needs no session: this elector never campaigns.
    let follower = Elector::new(
        Arc::clone(&store),
        CandidateId::default_for_process(),
        LeaseConfig::default(),
    )?;
    let mut watch = follower.observe(&election).await?;

    let mut demo =
        (url == StoreUrl::Memory).then(|| tokio::spawn(take_turns(store, election.clone())));
    let mut demo_done = demo.is_none();

    println!("following {election} on {url}");
    let mut shown = watch.borrow_and_update().clone();
    println!("{}", describe(&shown));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            update = watch.changed() => {
                update?;
                let now = watch.borrow_and_update().clone();
                if changed(&shown, &now) {
                    println!("{}", describe(&now));
                }
                shown = now;
            }
            finished = async { demo.as_mut().expect("demo running").await }, if !demo_done => {
                finished??;
                demo_done = true;
            }
            _ = &mut ctrl_c => break,
        }
        // The demo is over once its last candidate has resigned and the
        // watch shows that.
        if demo.is_some() && demo_done && shown == LeaderStatus::Known(None) {
            break;
        }
    }
    Ok(())
}
