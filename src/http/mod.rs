//! The HTTP API: routes, middleware and the OpenAPI document they share.

pub mod clusters;
pub mod extract;
pub mod health;
pub mod machines;
pub mod pagination;
pub mod pools;
pub mod rollouts;
pub mod streams;
pub mod upgrades;

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, Request, Uri};
use axum::response::IntoResponse;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::app::AppState;
use crate::error::ApiError;

pub const REQUEST_ID: &str = "x-request-id";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "drover",
        description = "Keeps Docker machine pools at their desired size and image, and upgrades self-hosted Kubernetes control planes.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "pools", description = "Machine pools: desired state, scaling, events"),
        (name = "machines", description = "The machines (containers) of a pool"),
        (name = "rollouts", description = "Rolling updates: progress, revisions, rollback, batch approval, dry-run plans"),
        (name = "health", description = "Liveness and readiness probes"),
        (name = "clusters", description = "Registered Kubernetes clusters; credentials are write-only"),
        (name = "upgrades", description = "Control-plane upgrade jobs: one component at a time, resumable, cancellable"),
    )
)]
struct ApiDoc;

fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::router())
        .merge(pools::router())
        .merge(machines::router())
        .merge(rollouts::router())
        .merge(clusters::router())
        .merge(upgrades::router())
        .merge(streams::router())
}

/// The OpenAPI document, as served at `/openapi.json` and committed at
/// `openapi/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

/// Request ids: 16 random hex digits, unless the client sent one.
#[derive(Clone, Copy, Default)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let id = format!("{:016x}", rand::random::<u64>());
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

/// The whole application router with its middleware.
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let (routes, doc) = api().split_for_parts();
    let request_id = HeaderName::from_static(REQUEST_ID);
    let middleware = ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(request_id.clone(), RandomRequestId))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| {
                    let id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("http", request_id = %id, method = %req.method(), path = %req.uri().path())
                })
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .layer(PropagateRequestIdLayer::new(request_id))
        .layer(HandleErrorLayer::new(|err: tower::BoxError| async move {
            if err.is::<tower::timeout::error::Elapsed>() {
                ApiError::Timeout
            } else {
                ApiError::Internal(anyhow::anyhow!(err))
            }
        }))
        .timeout(request_timeout);
    routes
        .merge(SwaggerUi::new("/docs").url("/openapi.json", doc))
        .fallback(|uri: Uri| async move { ApiError::NoRoute(uri.path().to_owned()).into_response() })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed.into_response() })
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .with_state(state)
        .layer(middleware)
}
