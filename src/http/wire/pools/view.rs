//! A pool as the API answers it: its name, spec document, status and
//! bookkeeping, and its generation as the `ETag`.

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::object::Namespace;
use crate::domain::pool::Pool;
use crate::domain::pool::PoolSpecView;
use crate::domain::status::PoolStatus;
use crate::http::wire::{in_namespace, location};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolPhase {
    /// The reconciler keeps the pool at its spec.
    Active,
    /// The reconciler is removing the machines; then the pool disappears.
    Deleting,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolView {
    pub name: String,
    /// The namespace the pool belongs to.
    pub namespace: Namespace,
    #[serde(flatten)]
    pub spec: PoolSpecView,
    /// The image machines run: `image`, else `kindest/node:<version>`.
    pub desired_image: String,
    /// Bumped by every spec change; sent as the `ETag`.
    pub generation: i64,
    /// Revision of the desired image; see `GET /v1/pools/{name}/revisions`.
    pub revision: i64,
    pub phase: PoolPhase,
    pub status: PoolStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Pool> for PoolView {
    fn from(p: Pool) -> Self {
        PoolView {
            desired_image: p.spec.desired_image(),
            spec: p.spec.view(),
            name: p.id.name,
            namespace: p.id.namespace,
            generation: p.generation,
            revision: p.revision,
            phase: if p.deleting { PoolPhase::Deleting } else { PoolPhase::Active },
            status: p.status,
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub items: Vec<PoolView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The `ETag` of a pool at `generation`.
pub fn etag(generation: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{generation}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// The pool answered with its ETag (and its `Location`, for 201 and 202).
pub fn pool_response(status: StatusCode, pool: Pool, with_location: bool) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(pool.generation));
    if with_location {
        headers.insert(
            header::LOCATION,
            location(&in_namespace(&format!("/v1/pools/{}", pool.id.name), &pool.id.namespace)),
        );
    }
    (status, headers, Json(PoolView::from(pool))).into_response()
}
