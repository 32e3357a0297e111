//! `Idempotency-Key` on POST: the same key with the same body within 24
//! hours gets the first response again, without the work being redone; the
//! same key with another request is refused. Keys belong to the token that
//! sent them.
//!
//! Three rules keep the store honest:
//! - **No secret is kept.** Routes whose answer holds a secret (a new
//!   token) refuse keyed requests: replaying them would mean storing the
//!   secret for a day.
//! - **A claim does not outlive its request.** The key is claimed before
//!   the request runs; if the request is dropped (its client went away, or
//!   it timed out) the claim is released at once, and a claim left by a
//!   process that died is taken over once it is older than the request
//!   timeout. A retry is never blocked for longer than that.
//! - **Expiry is an indexed delete** run by the retention pruner
//!   ([`crate::retention`]); a key older than 24 hours is free again even
//!   before the pruner comes by.

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::http::extract::MAX_BODY_BYTES;
use crate::idempotency::{Claimed, Entry, Request as KeyedRequest, Stored};
use crate::identity::Caller;
use crate::state::AppState;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";
const MAX_KEY_LEN: usize = 255;
/// The longest key, as the OpenAPI document states it.
pub const IDEMPOTENCY_KEY_MAX: usize = MAX_KEY_LEN;

/// Routes (method, pattern) whose answers hold a secret.
pub const SECRET_ANSWERS: &[(&str, &str)] = &[("POST", "/v1/tokens")];

/// Answers a keyed POST from its record, or runs it with `next` and keeps
/// the answer; any other request goes straight to `next`. Runs after
/// authentication: a key belongs to the caller.
pub async fn guard(state: &AppState, route: Option<&str>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(key) = req.headers().get(IDEMPOTENCY_KEY).cloned() else {
        return next.run(req).await;
    };
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let route = route.unwrap_or("");
    if SECRET_ANSWERS.contains(&(req.method().as_str(), route)) {
        return ApiError::invalid(
            "Idempotency-Key",
            "idempotency_secret",
            "is not accepted here: this answer holds a secret, which drover does not keep for replays; \
             retry without the key (a retry of a request that got through answers 409)",
        )
        .into_response();
    }
    match run(state, &caller, key, req, next).await {
        Ok(res) | Err(res) => res,
    }
}

async fn run(
    state: &AppState,
    caller: &Caller,
    key: HeaderValue,
    req: Request,
    next: Next,
) -> Result<Response, Response> {
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
        .ok_or_else(|| {
            ApiError::invalid(
                "Idempotency-Key",
                "idempotency_key",
                format!("must be 1-{MAX_KEY_LEN} visible ASCII characters"),
            )
            .into_response()
        })?
        .to_owned();
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }.into_response())?;
    let body_hash: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    // With the query: the same key on another namespace is another request.
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let method = parts.method.as_str().to_owned();

    let request = KeyedRequest { token: &caller.name, key: &key, method: &method, path: &path, body_hash: &body_hash };
    // From a first claim on, the key is ours until the answer is stored. If
    // this future is dropped first (client gone, timeout), the claim frees it.
    let claim = match state.keys.claim(&request).await.map_err(|e| ApiError::Database(e).into_response())? {
        Claimed::Seen(first) => return Err(replay(first, &method, &path, &body_hash)),
        Claimed::First(claim) => claim,
    };
    let res = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    let (parts, body) = res.into_parts();
    // Responses of keyed POSTs are small JSON documents; a body too large to
    // keep is served but not remembered.
    let Ok(bytes) = to_bytes(body, MAX_BODY_BYTES * 4).await else {
        return Ok(ApiError::Internal(anyhow::anyhow!("response body too large to remember")).into_response());
    };
    let text = |n: header::HeaderName| parts.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    // A server-side failure is not an answer to remember: let a retry run.
    if !parts.status.is_server_error() {
        let (ct, loc, etag) = (text(header::CONTENT_TYPE), text(header::LOCATION), text(header::ETAG));
        let record = Stored {
            status: parts.status.as_u16(),
            content_type: ct.as_deref(),
            location: loc.as_deref(),
            etag: etag.as_deref(),
            body: &bytes,
        };
        if let Err(e) = claim.complete(&record).await {
            tracing::error!(error = %e, "could not record the idempotent response");
        }
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// The answer to a key seen before: the first response, a refusal of
/// another request under the same key, or "still running".
fn replay(first: Entry, method: &str, path: &str, body_hash: &str) -> Response {
    if first.method != method || first.path != path || first.body_hash != body_hash {
        return ApiError::invalid(
            "Idempotency-Key",
            "idempotency_key_reuse",
            "this key was used for a different request in the last 24 hours; use a new key",
        )
        .into_response();
    }
    let Some(status) = first.status.and_then(|s| u16::try_from(s).ok()).and_then(|s| StatusCode::from_u16(s).ok())
    else {
        return ApiError::Conflict("a request with this Idempotency-Key is still being served; retry shortly".into())
            .into_response();
    };
    let mut res = (status, first.body.unwrap_or_default()).into_response();
    let h = res.headers_mut();
    for (name, value) in
        [(header::CONTENT_TYPE, first.content_type), (header::LOCATION, first.location), (header::ETAG, first.etag)]
    {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            h.insert(name, v);
        }
    }
    h.insert(HeaderName::from_static(REPLAYED), HeaderValue::from_static("true"));
    res
}
