//! A small object store over HTTP that refuses stale writers — the
//! protected resource of worked example 2.
//!
//! ```sh
//! cargo run -p leasehold-cli --example fenced_store -- 127.0.0.1:8080 /tmp/fence.db /tmp/store.log
//! ```
//!
//! `PUT /objects/NAME` with a `Fencing-Token` header stores the body;
//! a token lower than the highest this store has accepted for that object
//! gets `409 Conflict`. The highest tokens live in the SQLite file, so a
//! restarted store still refuses old writers. Every accepted write is
//! appended to the log as `accepted TOKEN NAME BODY`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::put;
use leasehold::fence::http::{FENCING_TOKEN, fence_router};
use leasehold::fence::sqlite::SqliteFence;

struct Objects {
    data: Mutex<HashMap<String, String>>,
    log: Mutex<std::fs::File>,
}

async fn store(
    State(objects): State<Arc<Objects>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    // The fencing layer has already checked the token; it is logged here.
    let token = headers
        .get(FENCING_TOKEN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned();
    let line = format!("accepted {token} {name} {}\n", body.trim());
    let logged = objects
        .log
        .lock()
        .map(|mut log| log.write_all(line.as_bytes()).and_then(|()| log.flush()));
    if !matches!(logged, Ok(Ok(()))) {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if let Ok(mut data) = objects.data.lock() {
        data.insert(name, body);
    }
    StatusCode::NO_CONTENT
}

async fn fetch(
    State(objects): State<Arc<Objects>>,
    Path(name): Path<String>,
) -> Result<String, StatusCode> {
    let data = objects
        .data
        .lock()
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    data.get(&name).cloned().ok_or(StatusCode::NOT_FOUND)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, fence_db, log] = args.as_slice() else {
        return Err("usage: fenced_store LISTEN_ADDR FENCE_DB LOG_FILE".into());
    };
    let objects = Arc::new(Objects {
        data: Mutex::new(HashMap::new()),
        log: Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?,
        ),
    });
    let fence = Arc::new(SqliteFence::open(fence_db)?);
    let app = fence_router(
        Router::new()
            .route("/objects/{name}", put(store).get(fetch))
            .with_state(objects),
        fence,
    );
    let listener = tokio::net::TcpListener::bind(listen.as_str()).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
