//! The sidecar's endpoints, on `--http` and on its unix socket: `/leader`,
//! `/follower` and `/health` for load balancers and probes, `/status`,
//! `/healthz` and `/metrics` as `run --http` serves them, and the admin
//! calls `POST /resign` and `POST /transfer?to=ID` (on TCP only with
//! `--admin-token-file` and its bearer token).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold::CandidateId;
use tokio::sync::oneshot;

use super::answer::{self, Answer};
use super::shared::{Admin, AdminAccess, AppState, Shared};

/// How long `/health` waits for the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `POST /transfer` waits for the new leader.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

/// The routes both listeners serve; `admin_token` guards the admin calls
/// on TCP (`None` there refuses them), the socket passes `Open`.
pub fn routes(shared: Shared, common: Router, admin: AdminAccess) -> Router {
    let leader = get(leader_answer).options(leader_answer);
    let follower = get(follower_answer).options(follower_answer);
    let state = (shared, Arc::new(admin));
    // The admin calls, behind one check of who may make them.
    let admin = Router::new()
        .route("/resign", post(resign))
        .route("/transfer", post(transfer))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin_gate,
        ));
    Router::new()
        .route("/leader", leader)
        .route("/follower", follower)
        .route("/health", get(health))
        .merge(admin)
        .with_state(state)
        .merge(common)
}

fn json_answer(answer: &Answer) -> Response {
    let code = if answer.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(code, &answer.body)
}

fn json(code: StatusCode, body: &impl serde::Serialize) -> Response {
    match serde_json::to_string(body) {
        Ok(text) => (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            text + "\n",
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn leader_answer(State((shared, _)): AppState) -> Response {
    let snapshot = shared.snapshot();
    json_answer(&answer::leader(&snapshot, std::time::Instant::now()))
}

async fn follower_answer(State((shared, _)): AppState) -> Response {
    let snapshot = shared.snapshot();
    json_answer(&answer::follower(&snapshot, std::time::Instant::now()))
}

/// 200 while the store answers, whoever leads: for a liveness probe that
/// should restart a sidecar cut off from its store.
async fn health(State((shared, _)): AppState) -> Response {
    match tokio::time::timeout(STORE_TIMEOUT, shared.store.leader(&shared.election)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(error)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer: {error}\n"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer within {STORE_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

/// Lets an admin call through only where this listener allows it.
async fn admin_gate(
    State((_, access)): AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match refusal(&access, request.headers()) {
        Some(response) => {
            tracing::warn!(
                status = response.status().as_u16(),
                "an admin call was refused"
            );
            response
        }
        None => next.run(request).await,
    }
}

fn refusal(access: &AdminAccess, headers: &HeaderMap) -> Option<Response> {
    match access {
        AdminAccess::Open => None,
        AdminAccess::Refused => Some(
            (
                StatusCode::FORBIDDEN,
                "admin calls over TCP need --admin-token-file; use the unix socket (--socket)\n",
            )
                .into_response(),
        ),
        AdminAccess::Token(token) => {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim());
            if given.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
                return None;
            }
            Some(
                (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "an admin call needs the bearer token of --admin-token-file\n",
                )
                    .into_response(),
            )
        }
    }
}

/// Compares in time that depends on the lengths alone.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(serde::Serialize)]
struct Done {
    done: String,
}

#[derive(serde::Serialize)]
struct Failed {
    error: String,
}

async fn resign(State((shared, _)): AppState, RawQuery(query): RawQuery) -> Response {
    if query.is_some_and(|q| !q.is_empty()) {
        return json(
            StatusCode::BAD_REQUEST,
            &Failed {
                error: "/resign takes no parameters".into(),
            },
        );
    }
    let (tx, rx) = oneshot::channel();
    if shared.admin.send(Admin::Resign(tx)).await.is_err() {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &Failed {
                error: "the sidecar is stopping".into(),
            },
        );
    }
    match rx.await {
        Ok(Ok(done)) => json(StatusCode::OK, &Done { done }),
        Ok(Err(error)) => json(StatusCode::CONFLICT, &Failed { error }),
        Err(_) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &Failed {
                error: "the sidecar is stopping".into(),
            },
        ),
    }
}

/// `to` of a query `to=ID` (percent-decoded); `Err` for any other query.
fn transfer_to(query: Option<&str>) -> Result<Option<CandidateId>, String> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    let Some(to) = query.strip_prefix("to=").filter(|to| !to.contains('&')) else {
        return Err("the only parameter is to=ID".into());
    };
    if to
        .split('%')
        .skip(1)
        .any(|after| after.len() < 2 || !after.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit))
    {
        return Err("to= holds a '%' not followed by two hex digits".into());
    }
    let to = percent_encoding::percent_decode_str(to)
        .decode_utf8()
        .map_err(|_| "to= is not UTF-8 once percent-decoded".to_owned())?;
    CandidateId::new(to.into_owned())
        .map(Some)
        .map_err(|e| e.to_string())
}

async fn transfer(State((shared, _)): AppState, RawQuery(query): RawQuery) -> Response {
    let to = match transfer_to(query.as_deref()) {
        Ok(to) => to,
        Err(error) => {
            return json(
                StatusCode::BAD_REQUEST,
                &Failed {
                    error: error.to_string(),
                },
            );
        }
    };
    let ttl = Duration::from_secs(30);
    let asked = leasehold::admin::request_transfer(
        &shared.store,
        &shared.election,
        to.as_ref(),
        ttl,
        TRANSFER_TIMEOUT,
    )
    .await;
    match asked {
        Ok(done) => {
            let now_leads = format!(
                "{} leads now (token {}); {} (token {}) led before",
                done.to.candidate, done.to.token, done.from.candidate, done.from.token
            );
            match &done.asked_for {
                // Another move won, or the chosen replica left the line:
                // not what was asked, as `leasehold transfer` says too.
                Some(asked) if asked != &done.to.candidate => json(
                    StatusCode::CONFLICT,
                    &Failed {
                        error: format!("{now_leads}, not {asked}"),
                    },
                ),
                _ => json(StatusCode::OK, &Done { done: now_leads }),
            }
        }
        Err(leasehold::Error::InvalidInput { reason, .. }) => {
            json(StatusCode::CONFLICT, &Failed { error: reason })
        }
        Err(error @ leasehold::Error::Timeout(_)) => json(
            StatusCode::GATEWAY_TIMEOUT,
            &Failed {
                error: error.to_string(),
            },
        ),
        Err(error) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &Failed {
                error: error.to_string(),
            },
        ),
    }
}
