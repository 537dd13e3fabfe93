//! `run --http ADDR` and `sidecar --http ADDR`: the page for people on
//! `/`, `/status`, `/healthz`, `/metrics` and `/watch`, and the listeners
//! they are served on.

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

use crate::cli::HttpAddr;
use crate::inspect::{CandidateJson, LeaderJson};
use crate::metrics::RunnerMetrics;
use crate::watch::Changes;

/// How long `/status` waits for the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
struct Shared {
    election: ElectionName,
    store: Arc<dyn Store>,
    metrics: Arc<RunnerMetrics>,
}

/// Binds every address of `addr` now (so that a taken port fails `run`
/// before it campaigns) and serves in the background; the bound addresses
/// (the caller logs them, after its first line about the lease).
///
/// A host name may resolve to an address family this host cannot bind (say,
/// `::1` with IPv6 disabled): such an address is skipped while another one
/// binds. Any other failure, such as a port in use, is an error.
pub async fn serve(addr: &HttpAddr, app: Router) -> anyhow::Result<Vec<SocketAddr>> {
    let mut listeners = Vec::new();
    let mut unavailable = Vec::new();
    for &one in &addr.addrs {
        match tokio::net::TcpListener::bind(one).await {
            Ok(listener) => listeners.push(listener),
            Err(error) if addr.addrs.len() > 1 && cannot_bind_here(&error) => {
                unavailable.push((one, error));
            }
            Err(error) => return Err(bind_error(addr, one, &error)),
        }
    }
    if listeners.is_empty() {
        let (one, error) = unavailable
            .first()
            .ok_or_else(|| anyhow::anyhow!("--http {addr}: no address to serve on"))?;
        return Err(bind_error(addr, *one, error));
    }
    for (one, error) in &unavailable {
        tracing::warn!(addr = %one, %error, "not serving HTTP on this address of --http {addr}");
    }
    let mut bound = Vec::with_capacity(listeners.len());
    for listener in listeners {
        bound.push(listener.local_addr()?);
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(error) = axum::serve(crate::capped::Capped::new(listener), app).await {
                tracing::error!(%error, "the HTTP server stopped");
            }
        });
    }
    Ok(bound)
}

/// The page, `/status`, `/healthz`, `/metrics` and `/watch` of a runner
/// (or a sidecar) of `election`.
pub fn routes(
    election: ElectionName,
    store: Arc<dyn Store>,
    metrics: Arc<RunnerMetrics>,
    changes: Changes,
) -> Router {
    let watch = Router::new()
        .route("/watch", get(crate::watch::watch))
        .with_state(changes);
    Router::new()
        .route("/", get(page))
        .route("/status", get(status))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .with_state(Shared {
            election,
            store,
            metrics,
        })
        .merge(watch)
}

/// The page: one HTML file with its style and script inline, nothing
/// fetched from elsewhere (the policy header forbids it).
async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        include_str!("page.html"),
    )
        .into_response()
}

/// Whether binding failed because this host has no such address or family,
/// rather than because of a conflict.
fn cannot_bind_here(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::AddrNotAvailable
        || error.raw_os_error() == Some(nix::libc::EAFNOSUPPORT)
}

fn bind_error(addr: &HttpAddr, one: SocketAddr, error: &std::io::Error) -> anyhow::Error {
    let hint = match error.kind() {
        std::io::ErrorKind::AddrInUse => "; another process listens there, choose another port",
        std::io::ErrorKind::AddrNotAvailable => "; that IP is not an address of this host",
        _ => "",
    };
    let given = if addr.given == one.to_string() {
        String::new()
    } else {
        format!(" ({addr})")
    };
    anyhow::anyhow!("cannot serve HTTP on {one}{given} (--http): {error}{hint}")
}

/// docs/DESIGN.md's status object plus `id` and `is_leader` (this
/// runner's own view).
#[derive(Debug, Serialize)]
struct StatusJson {
    election: String,
    /// This runner's candidate id.
    id: String,
    leader: Option<LeaderJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidates: Option<Vec<CandidateJson>>,
    is_leader: bool,
    /// With `run --shards`: the group as this runner sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<crate::inspect::GroupJson>,
    /// With `run --shards`: the shards this runner owns.
    #[serde(skip_serializing_if = "Option::is_none")]
    mine: Option<Vec<u32>>,
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
    let candidates = if error.is_none() {
        match tokio::time::timeout(
            STORE_TIMEOUT,
            crate::inspect::read_line(&*shared.store, &shared.election, leader.as_ref()),
        )
        .await
        {
            Ok(Ok(line)) => line.as_deref().map(CandidateJson::line),
            _ => None,
        }
    } else {
        None
    };
    let view = shared.metrics.group();
    let mine = view.as_ref().map(|v| v.mine.clone());
    let group = view.and_then(|view| {
        let kind = leasehold::admin::GroupKind::Shards(u32::try_from(view.holders.len()).ok()?);
        let holders = view
            .holders
            .into_iter()
            .zip(0..)
            .map(|(holder, k)| Some((kind.election(&shared.election, k).ok()?, holder)))
            .collect::<Option<Vec<_>>>()?;
        Some(crate::inspect::GroupJson::new(kind, &view.members, holders))
    });
    let body = StatusJson {
        election: shared.election.to_string(),
        id: shared.metrics.candidate().to_owned(),
        leader: leader.as_ref().map(LeaderJson::new),
        candidates,
        is_leader: is_leader || mine.as_ref().is_some_and(|m| !m.is_empty()),
        group,
        mine,
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
