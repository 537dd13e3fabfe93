//! The leader's work in worked example 2: writes an object to the fenced
//! store every 50 ms, carrying the fencing token `leasehold run` gave it.
//!
//! ```sh
//! leasehold run --election writer -- \
//!     target/debug/examples/fenced_writer 127.0.0.1:8080 object-x /tmp/writer.log
//! ```
//!
//! Logs `pid PID` once, then `TOKEN STATUS` per write (204 accepted, 409
//! refused as stale). A refusal means a newer leader has written: this
//! writer is a zombie, so it stops writing and waits for its supervisor to
//! end it — the store's refusal, not the lease, is what stopped its writes.

use std::io::Write;
use std::time::Duration;

#[path = "shared/fenced_put.rs"]
mod fenced_put;
use fenced_put::put;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, object, log] = args.as_slice() else {
        return Err(
            "usage: fenced_writer STORE_ADDR OBJECT LOG_FILE (run under leasehold run)".into(),
        );
    };
    let token = std::env::var("LEASEHOLD_TOKEN")
        .map_err(|_| "LEASEHOLD_TOKEN is not set: run me under `leasehold run`")?;
    let id = std::env::var("LEASEHOLD_ID").unwrap_or_default();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    writeln!(log, "pid {}", std::process::id())?;
    for seq in 0u64.. {
        let status = put(
            addr,
            &format!("/objects/{object}"),
            &token,
            &format!("{id}:{token}:{seq}"),
        )?;
        writeln!(log, "{token} {status}")?;
        if status == 409 {
            writeln!(log, "stale; stopped writing")?;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
