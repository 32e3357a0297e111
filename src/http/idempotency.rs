//! `Idempotency-Key` on POST: the same key with the same body within 24
//! hours gets the first response again, without the work being redone; the
//! same key with another request is refused. Keys belong to the token that
//! sent them.

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::auth::Caller;
use crate::db;
use crate::error::ApiError;
use crate::http::extract::MAX_BODY_BYTES;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on a replayed response.
pub const REPLAYED: &str = "idempotent-replayed";
const MAX_KEY_LEN: usize = 255;

pub async fn middleware(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(key) = req.headers().get(IDEMPOTENCY_KEY).cloned() else {
        return next.run(req).await;
    };
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    match run(&state, &caller, key, req, next).await {
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
    let path = parts.uri.path().to_owned();
    let method = parts.method.as_str().to_owned();

    let claimed = async {
        let mut tx = crate::db::begin_write(&state.db).await?;
        let found = db::idempotency::claim(&mut tx, &caller.name, &key, &method, &path, &body_hash, Utc::now()).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(found)
    }
    .await
    .map_err(|e| ApiError::Database(e).into_response())?;

    if let Some(first) = claimed {
        if first.method != method || first.path != path || first.body_hash != body_hash {
            return Err(ApiError::invalid(
                "Idempotency-Key",
                "idempotency_key_reuse",
                "this key was used for a different request in the last 24 hours; use a new key",
            )
            .into_response());
        }
        let Some(status) = first.status.and_then(|s| u16::try_from(s).ok()).and_then(|s| StatusCode::from_u16(s).ok())
        else {
            return Err(ApiError::Conflict(
                "a request with this Idempotency-Key is still being served; retry shortly".into(),
            )
            .into_response());
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
        return Ok(res);
    }

    let res = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    let (parts, body) = res.into_parts();
    // Responses of keyed POSTs are small JSON documents; a body too large to
    // keep is served but not remembered.
    let Ok(bytes) = to_bytes(body, MAX_BODY_BYTES * 4).await else {
        let _ = db::idempotency::release(&state.db, &caller.name, &key).await;
        return Ok(ApiError::Internal(anyhow::anyhow!("response body too large to remember")).into_response());
    };
    let text = |n: header::HeaderName| parts.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let stored = if parts.status.is_server_error() {
        // A server-side failure is not an answer to remember: let a retry run.
        db::idempotency::release(&state.db, &caller.name, &key).await
    } else {
        let (ct, loc, etag) = (text(header::CONTENT_TYPE), text(header::LOCATION), text(header::ETAG));
        let record = db::idempotency::Stored {
            status: parts.status.as_u16(),
            content_type: ct.as_deref(),
            location: loc.as_deref(),
            etag: etag.as_deref(),
            body: &bytes,
        };
        db::idempotency::complete(&state.db, &caller.name, &key, &record).await
    };
    if let Err(e) = stored {
        tracing::error!(error = %e, key = %key, "could not record the idempotent response");
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}
