//! The chaos run's command (`cargo bench -p leasehold-cli --bench chaos`):
//! the fenced writer of worked example 2 that also records its own
//! lifetime on the host's monotonic clock, so that the chaos checker knows
//! within a millisecond when each command lived — not just when a poller
//! happened to look.
//!
//! ```sh
//! leasehold run --election chaos -- \
//!     target/debug/examples/chaos_writer 127.0.0.1:8080 object-x /tmp/lives/r0
//! ```
//!
//! In LIVES_DIR it writes, for its own process id PID:
//! - `PID.start`: `START_NS TOKEN`, once, before its first write;
//! - `PID.end`: `alive NS` rewritten in place every millisecond, and
//!   `stop NS` when SIGTERM (or SIGINT) ends it. After a SIGKILL the last
//!   `alive` stamp is the last moment it was known to run;
//! - `PID.writes`: `NS TOKEN STATUS` per write (204 accepted, 409 refused
//!   as stale). After a refusal it writes no more, as the fenced writer.
//!
//! Its lifetime is thus `[START_NS, end]`, never longer than it really
//! ran: an overlap the checker finds between two commands happened.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::clock::host_monotonic_ns;
use nix::sys::signal::{SigSet, Signal};

#[path = "shared/fenced_put.rs"]
mod fenced_put;
use fenced_put::put;

/// The end stamp, rewritten in place: fixed width, so a later stamp
/// always covers an earlier one entirely.
fn stamp(end: &File, word: &str, ns: i64) -> std::io::Result<()> {
    end.write_all_at(format!("{word:<5} {ns:020}\n").as_bytes(), 0)
}

fn writes(addr: &str, object: &str, token: &str, id: &str, log: &Path) -> std::io::Result<()> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    for seq in 0u64.. {
        let status = put(
            addr,
            &format!("/objects/{object}"),
            token,
            &format!("{id}:{token}:{seq}"),
        )?;
        writeln!(log, "{} {token} {status}", host_monotonic_ns())?;
        if status == 409 {
            // A newer leader has written: this one is a zombie; it waits
            // for its supervisor to end it.
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, object, dir] = args.as_slice() else {
        return Err(
            "usage: chaos_writer STORE_ADDR OBJECT LIVES_DIR (run under leasehold run)".into(),
        );
    };
    let token = std::env::var("LEASEHOLD_TOKEN")
        .map_err(|_| "LEASEHOLD_TOKEN is not set: run me under `leasehold run`")?;
    let id = std::env::var("LEASEHOLD_ID").unwrap_or_default();
    // SIGTERM and SIGINT are taken by `wait` below, in this thread; the
    // threads spawned after this inherit the mask.
    let mut ending = SigSet::empty();
    ending.add(Signal::SIGTERM);
    ending.add(Signal::SIGINT);
    ending.thread_block()?;

    let dir = Path::new(dir);
    std::fs::create_dir_all(dir)?;
    let pid = std::process::id();
    let end = File::create(dir.join(format!("{pid}.end")))?;
    let start = host_monotonic_ns();
    stamp(&end, "alive", start)?;
    std::fs::write(
        dir.join(format!("{pid}.start")),
        format!("{start} {token}\n"),
    )?;
    let end = Arc::new(Mutex::new(Some(end)));

    let ticker = Arc::clone(&end);
    std::thread::spawn(move || {
        loop {
            {
                let guard = ticker.lock().unwrap_or_else(|p| p.into_inner());
                let Some(end) = guard.as_ref() else { return };
                if stamp(end, "alive", host_monotonic_ns()).is_err() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let (addr, object, log) = (
        addr.clone(),
        object.clone(),
        dir.join(format!("{pid}.writes")),
    );
    std::thread::spawn(move || {
        if let Err(e) = writes(&addr, &object, &token, &id, &log) {
            eprintln!("chaos_writer: {e}");
        }
    });

    ending.wait()?;
    let mut guard = end.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(end) = guard.take() {
        stamp(&end, "stop", host_monotonic_ns())?;
    }
    std::process::exit(0)
}
