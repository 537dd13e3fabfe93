//! The HTTP fencing convention: a writer sends its token in the
//! `Fencing-Token` header; the service refuses a write whose token is lower
//! than the highest it has accepted for the same path (percent-decoded, as
//! axum's `Path` extractor gives it to handlers) with `409 Conflict` and a
//! JSON body naming both tokens.
//!
//! [`fence_router`] adds the check in front of an axum [`Router`]. Writes to
//! one path are serialized and the check runs in the same critical section
//! as the handler, so no lower token can land between an accepted check and
//! its write. Reads (GET, HEAD, OPTIONS) pass unfenced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode};

use super::Fence;
use crate::error::{Error, Result};
use crate::grant::FencingToken;

/// The request header that carries the writer's fencing token.
pub const FENCING_TOKEN: &str = "fencing-token";

struct Fenced {
    fence: Arc<dyn Fence>,
    /// One lock per path: a write's check and its handler run under it.
    paths: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Enforces the `Fencing-Token` header on every write that reaches `router`,
/// recording accepted tokens in `fence` (per request path).
pub fn fence_router<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    fence: Arc<dyn Fence>,
) -> Router<S> {
    let state = Arc::new(Fenced {
        fence,
        paths: Mutex::new(HashMap::new()),
    });
    router.layer(middleware::from_fn_with_state(state, enforce))
}

async fn enforce(State(fenced): State<Arc<Fenced>>, request: Request, next: Next) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let (resource, token) = match resource_and_token(&request) {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    let lock = {
        let mut paths = crate::mutex::lock(&fenced.paths);
        Arc::clone(paths.entry(resource.clone()).or_default())
    };
    let _serialized = lock.lock().await;
    match fenced.fence.check_and_advance(&resource, token).await {
        Ok(()) => next.run(request).await,
        Err(Error::Stale {
            presented, highest, ..
        }) => reply(
            StatusCode::CONFLICT,
            error_body(
                "stale fencing token",
                &resource,
                Some(presented),
                Some(highest),
            ),
        ),
        Err(error) => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            error_body(&error.to_string(), &resource, Some(token), None),
        ),
    }
}

/// The resource a write names and the token it presents, or the reply
/// that refuses it. The resource is the path as the handlers see it,
/// percent-decoded: `/objects/%70robe` is `/objects/probe`, and must meet
/// its highest token rather than start a record of its own.
fn resource_and_token(request: &Request) -> Result<(String, FencingToken), Box<Response>> {
    let Ok(path) = percent_encoding::percent_decode_str(request.uri().path()).decode_utf8() else {
        return Err(Box::new(reply(
            StatusCode::BAD_REQUEST,
            error_body("the path is not UTF-8 once percent-decoded", "", None, None),
        )));
    };
    let resource = path.into_owned();
    let token = request
        .headers()
        .get(FENCING_TOKEN)
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
    let refused = match token {
        Some(Some(token)) => return Ok((resource, FencingToken(token))),
        Some(None) => reply(
            StatusCode::BAD_REQUEST,
            error_body("Fencing-Token must be a decimal u64", &resource, None, None),
        ),
        None => reply(
            StatusCode::PRECONDITION_REQUIRED,
            error_body(
                "a write needs a Fencing-Token header",
                &resource,
                None,
                None,
            ),
        ),
    };
    Err(Box::new(refused))
}

fn error_body(
    message: &str,
    resource: &str,
    presented: Option<FencingToken>,
    highest: Option<FencingToken>,
) -> String {
    serde_json::json!({
        "error": message,
        "resource": resource,
        "presented": presented.map(|t| t.0),
        "highest": highest.map(|t| t.0),
    })
    .to_string()
}

fn reply(status: StatusCode, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// For clients: turns a fenced service's answer into a result. A 409 with
/// the body above becomes [`Error::Stale`]; other statuses pass as `Ok`.
pub fn check_reply(status: u16, body: &str, resource: &str, presented: FencingToken) -> Result<()> {
    if status != StatusCode::CONFLICT.as_u16() {
        return Ok(());
    }
    let highest = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["highest"].as_u64())
        .unwrap_or(presented.0.saturating_add(1));
    Err(Error::Stale {
        resource: resource.to_owned(),
        presented,
        highest: FencingToken(highest),
    })
}
