//! The HTTP API: routes, middleware and the OpenAPI document they share.

pub mod apply;
pub mod clusters;
pub mod engines;
pub mod extract;
pub mod health;
pub mod idempotency;
pub mod machines;
pub mod metrics;
pub mod namespaces;
pub mod openapi;
pub mod pagination;
pub mod pools;
pub mod rollouts;
pub mod serve;
pub mod streams;
pub mod tokens;
pub mod ui;
pub mod upgrades;
pub mod wire;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath};
use axum::http::{HeaderName, HeaderValue, Request, Uri};
use axum::response::IntoResponse;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::head::{Head, HeadSamplingLayer};

pub const REQUEST_ID: &str = "x-request-id";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "drover",
        description = "Keeps Docker machine pools at their desired size and image, and upgrades self-hosted Kubernetes control planes.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    // Relative first: the Swagger UI at /docs, and any page the server
    // serves, call the server that served this document wherever it
    // listens. Then the default listener, an absolute URL for tools that
    // want one (generated clients take their base URL as a setting; some,
    // such as openapi-generator's, read a relative one as http://localhost).
    servers(
        (url = "/", description = "The server that serves this document"),
        (url = "http://127.0.0.1:8080", description = "`drover serve` on its default listener"),
    ),
    components(schemas(streams::StreamDeleted, streams::StreamEventName)),
    tags(
        (name = "pools", description = "Machine pools: desired state, scaling, events"),
        (name = "machines", description = "The machines (containers) of a pool"),
        (name = "rollouts", description = "Rolling updates: progress, revisions, rollback, batch approval, dry-run plans"),
        (name = "health", description = "Liveness and readiness probes"),
        (name = "engines", description = "Docker engines pools may use, each a failure domain; credentials are write-only"),
        (name = "clusters", description = "Registered Kubernetes clusters; credentials are write-only"),
        (name = "upgrades", description = "Control-plane upgrade jobs: one component at a time, resumable, cancellable"),
        (name = "apply", description = "Declarative fleets: a set of documents applied as one change, with a dry-run plan, prune and conflicts"),
        (name = "access", description = "API tokens (shown once, stored hashed) and the audit trail; admin only"),
    )
)]
struct ApiDoc;

fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::router())
        .merge(pools::router())
        .merge(machines::router())
        .merge(rollouts::router())
        .merge(tokens::router())
        .merge(metrics::router())
        .merge(clusters::router())
        .merge(engines::router())
        .merge(upgrades::router())
        .merge(streams::router())
        .merge(apply::router())
        .merge(namespaces::router())
}

/// The OpenAPI document, as served at `/openapi.json` and committed at
/// `openapi/openapi.json`.
pub fn openapi() -> anyhow::Result<utoipa::openapi::OpenApi> {
    openapi::finish(api().into_openapi())
}

/// The one middleware of every route, in this order:
/// 1. answers 503 with `Retry-After` when `max_concurrent_requests` are
///    already being served, rather than queueing without bound (one shared
///    semaphore: a tower concurrency layer would be one per route);
/// 2. counts and times the request by its route pattern (not its path,
///    which would make one series per pool);
/// 3. authenticates, authorizes and audits it ([`crate::identity::guard`]);
/// 4. answers a retried keyed POST from its record ([`idempotency::guard`]).
///
/// One layer rather than four: each `from_fn` layer costs a clone of the
/// boxed inner service and a boxed future on every request.
async fn guard(
    axum::extract::State(state): axum::extract::State<AppState>,
    matched: Option<MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let route = matched.as_ref().map(MatchedPath::as_str);
    if let Some(route) = route {
        let span = tracing::Span::current();
        span.record("http.route", route);
        crate::telemetry::context::rename(&span, format!("{method} {route}"));
    }
    // Probes must answer even under load, or an orchestrator would restart
    // a busy but healthy server. They also get a short deadline of their
    // own: a probe that hangs is a failed probe.
    let probe = matches!(route, Some("/healthz" | "/readyz"));
    let permit = if probe { None } else { state.inflight.clone().try_acquire_owned().ok() };
    let res = if !probe && permit.is_none() {
        ApiError::Unavailable("the server is at its limit of concurrent requests; retry shortly".into()).into_response()
    } else {
        let gate = state.gate();
        let run = crate::identity::guard(&gate, route, req, |req| idempotency::guard(&state, route, req, next));
        if probe {
            tokio::time::timeout(PROBE_TIMEOUT, run).await.unwrap_or_else(|_| ApiError::Timeout.into_response())
        } else {
            run.await
        }
    };
    drop(permit);
    let trace = crate::telemetry::context::sampled_trace_id(&tracing::Span::current());
    state.metrics.http_request(&method, route, res.status(), started.elapsed(), trace);
    res
}

/// Deadline of `/healthz` and `/readyz`; every other route has
/// `--request-timeout`.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest `X-Request-Id` kept from a client.
const MAX_REQUEST_ID: usize = 64;

/// Drops a client's `X-Request-Id` unless it is short and printable (ASCII
/// letters, digits and punctuation, no spaces), so that the id stamped on
/// every log line of the request is never a vehicle for log injection; a
/// dropped id is replaced by a random one.
fn keep_sane_request_id<B>(mut req: Request<B>) -> Request<B> {
    let sane = req.headers().get(REQUEST_ID).is_none_or(|v| {
        let b = v.as_bytes();
        !b.is_empty() && b.len() <= MAX_REQUEST_ID && b.iter().all(|c| c.is_ascii_graphic())
    });
    if !sane {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}

/// The span of one request, with OpenTelemetry's HTTP server attributes
/// (the route and status are recorded by [`guard`] and [`stamp_trace`]),
/// continuing the client's `traceparent` if it sent one and the head kept
/// the trace ([`crate::telemetry::head`]). The path goes to logs only: it
/// may name objects, and the route says the same with less. No header but
/// `traceparent` is read, so no token reaches a span.
fn request_span<B>(req: &Request<B>) -> tracing::Span {
    let id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-");
    let path = crate::telemetry::Clipped(req.uri().path(), MAX_LOGGED_PATH);
    let method = req.method().as_str();
    let span = tracing::info_span!(
        "http",
        request_id = %id,
        method = %method,
        path = %path,
        otel.name = %method,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    // The head set a parent only when the client sent one and it was kept.
    if let Some(Head::Sampled(parent)) = req.extensions().get::<Head>() {
        // Fails only when no OpenTelemetry layer is installed.
        let _ = tracing_opentelemetry::OpenTelemetrySpanExt::set_parent(&span, parent.clone());
    }
    crate::telemetry::context::start_request(&span);
    span
}

/// Records the answer's status on the request span and names its trace in
/// `traceresponse`.
fn stamp_trace<B>(mut res: axum::http::Response<B>) -> axum::http::Response<B> {
    let span = tracing::Span::current();
    let status = res.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    if let Some(value) = crate::telemetry::context::traceresponse(&span) {
        res.headers_mut().insert(crate::telemetry::context::TRACERESPONSE, value);
    }
    res
}

/// Longest path written in a log line; the rest is counted, not written.
const MAX_LOGGED_PATH: usize = 200;

/// Request ids: 16 random hex digits, unless the client sent a sane one.
#[derive(Clone, Copy, Default)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = rand::random::<u64>();
        let id: [u8; 16] = std::array::from_fn(|i| HEX[((n >> (60 - 4 * i)) & 0xf) as usize]);
        HeaderValue::from_bytes(&id).ok().map(RequestId::new)
    }
}

/// Headers a browser page may send: those drover reads.
const CORS_REQUEST_HEADERS: [&str; 7] =
    ["authorization", "content-type", "if-match", "idempotency-key", "last-event-id", REQUEST_ID, "traceparent"];
/// Headers a browser page may read: those drover's answers carry.
const CORS_EXPOSED_HEADERS: [&str; 6] =
    ["etag", "location", "retry-after", REQUEST_ID, "idempotent-replayed", crate::telemetry::context::TRACERESPONSE];
/// How long a browser may reuse a preflight answer.
const CORS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Cross-origin access for the pages of `origins` (exact origins), per the
/// Fetch standard: preflights are answered here, before authentication
/// (they carry no token), with the methods and headers drover uses. No
/// credentials mode: drover's tokens travel in the `Authorization` header,
/// never in cookies. `None` when no origin is allowed: then no CORS header
/// is ever sent, and browsers keep other origins out.
fn cors(origins: &[String]) -> anyhow::Result<Option<tower_http::cors::CorsLayer>> {
    use axum::http::Method;
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|o| {
            HeaderValue::from_str(o).map_err(|_| anyhow::anyhow!("--cors-allowed-origins: {o:?} is not a header value"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names = |list: &[&'static str]| list.iter().map(|h| HeaderName::from_static(h)).collect::<Vec<_>>();
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
            .allow_headers(names(&CORS_REQUEST_HEADERS))
            .expose_headers(names(&CORS_EXPOSED_HEADERS))
            .max_age(CORS_MAX_AGE),
    ))
}

/// The whole application router with its middleware.
pub fn router(state: AppState) -> anyhow::Result<Router> {
    let (routes, doc) = api().split_for_parts();
    let doc = openapi::finish(doc)?;
    let config = state.config.clone();
    let cors = cors(&config.cors_allowed_origins)?;
    let request_id = HeaderName::from_static(REQUEST_ID);
    let middleware = ServiceBuilder::new()
        .layer(HeadSamplingLayer::new(config.traces.head_sampler()))
        .map_request(keep_sane_request_id)
        .layer(SetRequestIdLayer::new(request_id.clone(), RandomRequestId))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .map_response(stamp_trace)
        .layer(PropagateRequestIdLayer::new(request_id))
        .layer(HandleErrorLayer::new(|err: tower::BoxError| async move {
            if err.is::<tower::timeout::error::Elapsed>() {
                ApiError::Timeout
            } else {
                ApiError::Internal(anyhow::anyhow!(err))
            }
        }))
        .timeout(config.request_timeout);
    let router = routes
        // The dashboard's files go through the same middleware as the API
        // (metrics, and `auth`, which lets them pass as public).
        .merge(ui::router())
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .merge(SwaggerUi::new("/docs").url("/openapi.json", doc))
        .fallback(|uri: Uri| async move { ApiError::NoRoute(uri.path().to_owned()).into_response() })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed.into_response() })
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .with_state(state)
        .layer(middleware);
    // Outermost, so that a preflight is answered before anything else
    // looks at it, and every answer (errors included) carries the headers.
    Ok(match cors {
        Some(cors) => router.layer(cors),
        None => router,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::Sampler;
    use tracing_subscriber::layer::SubscriberExt as _;

    use crate::telemetry::head::HeadSamplingLayer;

    #[test]
    fn json_log_lines_inside_a_request_carry_the_trace_id_it_continued() {
        let lines: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = lines.clone();
        let writer = move || SharedBuffer(sink.clone());
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(
                tracing_subscriber::fmt::layer().json().flatten_event(true).with_current_span(true).with_writer(writer),
            );
        let req = axum::http::Request::builder()
            .uri("/v1/pools")
            .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .body(())
            .unwrap();
        // As in the router: the head decides, then the request span is
        // made inside the call.
        let request = tower::service_fn(|req: axum::http::Request<()>| {
            let _in = super::request_span(&req).entered();
            tracing::info!("inside the request");
            std::future::ready(Ok::<_, std::convert::Infallible>(()))
        });
        let sampler = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let mut service = tower::Layer::layer(&HeadSamplingLayer::new(Some(sampler)), request);
        tracing::subscriber::with_default(subscriber, || {
            let answered = futures_util::FutureExt::now_or_never(tower::Service::call(&mut service, req));
            assert!(matches!(answered, Some(Ok(()))));
        });
        let out = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        assert!(out.contains(r#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736""#), "{out}");
    }

    #[derive(Clone)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
