//! Campaign, act with the fencing token, resign.
//!
//! ```sh
//! cargo run -p leasehold --example campaign                  # a SQLite store in the temp dir
//! cargo run -p leasehold --example campaign -- memory:       # in-process store
//! cargo run -p leasehold --example campaign -- STORE_URL [RESOURCE_DB]
//! ```
//!
//! The candidate campaigns for the election `example` (store URL as for
//! `leasehold --store`; default `sqlite:$TMPDIR/leasehold-examples.db`).
//! Once it leads, it appends five entries to a journal table in a SQLite file
//! (default `$TMPDIR/leasehold-examples-resource.db`), each write **fenced**:
//! in the same transaction as the insert, `leasehold::fence::sqlite`
//! refuses the token if a higher one was accepted before. Then it resigns,
//! and the next candidate takes over at once.
//!
//! Start it in two terminals at once: one leads, the other waits, then leads
//! with the next token. Run `follow` in a third to watch. A refused write
//! (`stale`) means a newer leader has written: the example stops acting at
//! once. You can see one by running against `memory:` (whose tokens start at
//! 1 again) after a run against the SQLite store: the journal has already
//! accepted a higher token.

use std::path::PathBuf;
use std::time::Duration;

use leasehold::fence::sqlite::{check_and_advance, create_table};
use leasehold::{
    CandidateId, ElectionName, Elector, Error, FencingToken, Leadership, LeaseConfig, StoreUrl,
};
use rusqlite::{Connection, TransactionBehavior, params};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The protected resource's name in the fence table.
const RESOURCE: &str = "journal";
const WRITES: u64 = 5;

/// What one fenced write came to.
enum Outcome {
    Written,
    /// The resource has accepted a higher token: someone newer leads.
    Stale {
        highest: FencingToken,
    },
}

/// Appends one journal entry, fenced: the token check and the insert commit
/// together or not at all. `BEGIN IMMEDIATE` makes concurrent writers
/// serialize on the check.
fn fenced_append(
    db: &mut Connection,
    token: FencingToken,
    writer: &str,
    seq: u64,
) -> Result<Outcome, BoxError> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match check_and_advance(&tx, RESOURCE, token) {
        Ok(()) => {}
        // Dropping `tx` rolls back: nothing of this write lands.
        Err(Error::Stale { highest, .. }) => return Ok(Outcome::Stale { highest }),
        Err(error) => return Err(error.into()),
    }
    tx.execute(
        "INSERT INTO journal (token, writer, seq) VALUES (?1, ?2, ?3)",
        params![i64::try_from(token.0)?, writer, i64::try_from(seq)?],
    )?;
    tx.commit()?;
    Ok(Outcome::Written)
}

fn open_resource(path: &PathBuf) -> Result<Connection, BoxError> {
    let db = Connection::open(path)?;
    db.busy_timeout(Duration::from_secs(5))?;
    create_table(&db)?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS journal (
             token  INTEGER NOT NULL,
             writer TEXT    NOT NULL,
             seq    INTEGER NOT NULL
         )",
    )?;
    Ok(db)
}

/// The exclusive work: fenced writes while leading. Returns early when
/// leadership is lost or the resource refuses the token.
async fn work(leadership: &Leadership, db: &mut Connection, me: &str) -> Result<(), BoxError> {
    let token = leadership.token();
    for seq in 1..=WRITES {
        // A cheap local check before each action; the fence is what makes
        // the action safe even if this process was paused just after it.
        if let Some(reason) = leadership.lost_reason() {
            println!("leadership lost ({reason}); stopping");
            return Ok(());
        }
        match fenced_append(db, token, me, seq)? {
            Outcome::Written => println!("wrote journal entry {seq} with token {token}"),
            Outcome::Stale { highest } => {
                // Someone newer has written: this process is no longer
                // leader, whatever its lease says.
                leadership.end_as_stale();
                println!("stale: the journal has accepted token {highest} > {token}; stopping");
                return Ok(());
            }
        }
        tokio::select! {
            reason = leadership.lost() => {
                println!("leadership lost ({reason}); stopping");
                return Ok(());
            }
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let url: StoreUrl = match args.next() {
        Some(url) => url.parse()?,
        None => StoreUrl::Sqlite(std::env::temp_dir().join("leasehold-examples.db")),
    };
    let resource = args.next().map_or_else(
        || std::env::temp_dir().join("leasehold-examples-resource.db"),
        PathBuf::from,
    );

    let store = leasehold::store::open(&url, leasehold::store::Access::ReadWrite).await?;
    let me = CandidateId::default_for_process();
    let elector = Elector::new(store, me.clone(), LeaseConfig::new(Duration::from_secs(5)))?;
    let election = ElectionName::new("example")?;
    let mut db = open_resource(&resource)?;

    println!("{me} campaigning for {election} on {url}");
    let leadership = tokio::select! {
        leadership = elector.campaign(&election) => leadership?,
        _ = tokio::signal::ctrl_c() => {
            println!("interrupted while waiting");
            return Ok(());
        }
    };
    println!(
        "leading {election} with fencing token {}",
        leadership.token()
    );

    tokio::select! {
        done = work(&leadership, &mut db, me.as_str()) => done?,
        _ = tokio::signal::ctrl_c() => println!("interrupted"),
    }

    // Guarded release: removes the grant only if it still carries our token.
    leadership.resign().await?;
    elector.close().await?;
    println!("resigned; the next candidate takes over now");
    Ok(())
}
