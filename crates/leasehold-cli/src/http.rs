//! `run --http ADDR`: `/status`, `/healthz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leasehold::{ElectionName, Store};
use serde::Serialize;

use crate::inspect::LeaderJson;
use crate::metrics::RunnerMetrics;

/// How long `/status` waits for the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
struct Shared {
    election: ElectionName,
    store: Arc<dyn Store>,
    metrics: Arc<RunnerMetrics>,
}

/// Binds `addr` now (so that a taken port fails `run` before it campaigns)
/// and serves in the background.
pub async fn serve(
    addr: SocketAddr,
    election: ElectionName,
    store: Arc<dyn Store>,
    metrics: Arc<RunnerMetrics>,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|error| {
        let hint = match error.kind() {
            std::io::ErrorKind::AddrInUse => "; another process listens there, choose another port",
            std::io::ErrorKind::AddrNotAvailable => "; that IP is not an address of this host",
            _ => "",
        };
        anyhow::anyhow!("cannot serve HTTP on {addr} (--http): {error}{hint}")
    })?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/status", get(status))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .with_state(Shared {
            election,
            store,
            metrics,
        });
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the HTTP server stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /status, /healthz and /metrics");
    Ok(bound)
}

/// DESIGN.md's status object plus `is_leader` (this runner's own view).
#[derive(Debug, Serialize)]
struct StatusJson {
    election: String,
    leader: Option<LeaderJson>,
    is_leader: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn status(State(shared): State<Shared>) -> Response {
    let is_leader = shared.metrics.leading().is_some();
    let answer = tokio::time::timeout(STORE_TIMEOUT, shared.store.leader(&shared.election)).await;
    let (code, leader, error) = match answer {
        Ok(Ok(leader)) => (StatusCode::OK, leader, None),
        Ok(Err(error)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            Some(error.to_string()),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            Some(format!("the store did not answer within {STORE_TIMEOUT:?}")),
        ),
    };
    let body = StatusJson {
        election: shared.election.to_string(),
        leader: leader.as_ref().map(LeaderJson::new),
        is_leader,
        error,
    };
    match serde_json::to_string(&body) {
        Ok(json) => (code, [(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Liveness: answers while `run` serves. It does not fail while the store is
/// unreachable — restarting every replica then would not help — and the
/// runner itself stops its command when its lease cannot be renewed.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn metrics_text(State(shared): State<Shared>) -> Response {
    match shared.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
