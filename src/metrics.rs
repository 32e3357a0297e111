//! Prometheus metrics: typed families the code records into as it works,
//! plus gauges read from the store when `/metrics` is scraped (so they are
//! right after a restart, and disappear with what they describe).
//!
//! Every label comes from a closed set: HTTP methods, route patterns,
//! status codes, outcomes and operation kinds written in the code. No label
//! carries the name of a pod, node, selector or machine, so the size of a
//! scrape does not grow with what the clusters hold. The one exception is
//! the pool: `drover_pool_reconcile_failures_total` has a `pool` label, and
//! its series goes when the pool does ([`Metrics::forget_pool`]).
//!
//! The duration histograms keep, for each bucket, the trace id of the
//! last sampled request or pass that fell in it: exemplars, rendered when
//! the scraper asks for OpenMetrics (Prometheus with
//! `--enable-feature=exemplar-storage` does), so that a slow bucket in
//! Grafana leads to a trace of it.
//!
//! Each server (and each test's server) has its own registry, passed
//! around like the database.

use crate::domain::object::PoolRef;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::telemetry::context::TraceId;

/// Upper bounds of the duration histograms, in seconds.
const BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The label of an exemplar: the trace of the observation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Exemplar {
    trace_id: String,
}

impl Exemplar {
    fn of(trace: Option<TraceId>) -> Option<Self> {
        trace.map(|t| Self { trace_id: t.to_string() })
    }
}

type Histogram = HistogramWithExemplars<Exemplar>;

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histograms<L: Clone + std::hash::Hash + Eq>() -> Histograms<L> {
    Family::new_with_constructor(duration_histogram as fn() -> Histogram)
}

/// How `/metrics` is written, as the scraper asked (its `Accept` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus' text format 0.0.4: no exemplars.
    Prometheus,
    /// OpenMetrics 1.0 text: exemplars on the duration histograms.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` names it, else Prometheus' text format.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|t| t.split(';').next().is_some_and(|m| m.trim() == "application/openmetrics-text"))
        });
        if asks { Self::OpenMetrics } else { Self::Prometheus }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// Writes `registry` (without OpenMetrics' `# EOF`: the answer is
    /// several registries, and [`Format::finish`] ends it).
    fn encode(self, out: &mut String, registry: &Registry) -> std::fmt::Result {
        match self {
            Self::Prometheus => prometheus_client::encoding::prometheus_text::encode(out, registry),
            Self::OpenMetrics => prometheus_client::encoding::text::encode_registry(out, registry),
        }
    }

    /// Ends an answer: OpenMetrics' `# EOF` line.
    pub fn finish(self, out: &mut String) -> std::fmt::Result {
        match self {
            Self::Prometheus => Ok(()),
            Self::OpenMetrics => prometheus_client::encoding::text::encode_eof(out),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    namespace: String,
    pool: String,
}

impl PoolLabels {
    fn of(pool: &PoolRef) -> Self {
        Self { namespace: pool.namespace.as_str().to_owned(), pool: pool.name.clone() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    op: &'static str,
    result: &'static str,
}

/// Engines are few and registered by an admin: a bounded label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineCallLabels {
    engine: String,
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: &'static str,
}

/// How a reconcile pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    Converged,
    Progressing,
    /// The pool no longer exists; its series are removed.
    Gone,
    Error,
    /// The pass was dropped before it finished (shutdown).
    Cancelled,
}

impl PassOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Converged => "converged",
            Self::Progressing => "progressing",
            Self::Gone => "gone",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
        }
    }
}

/// How a container runtime call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Ok,
    Error,
    /// The runtime could not be reached at all.
    Unavailable,
}

impl CallResult {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Unavailable => "unavailable",
        }
    }
}

/// Why the server closed a connection or an event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// A request head did not arrive in time.
    HeaderTimeout,
    /// A kept-alive connection stayed idle too long.
    IdleTimeout,
    /// Nothing moved on a connection with a request in flight: its client
    /// stopped reading.
    Stalled,
    /// A stream reached its longest lifetime.
    Lifetime,
    /// A stream's token was revoked or lost its role.
    Revoked,
    Shutdown,
}

impl CloseReason {
    fn as_str(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::Stalled => "stalled",
            Self::Lifetime => "lifetime",
            Self::Revoked => "revoked",
            Self::Shutdown => "shutdown",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Histograms<RouteLabels>,
    connections: Gauge,
    connections_refused: Counter,
    connections_closed: Family<ReasonLabels, Counter>,
    streams: Gauge,
    streams_refused: Counter,
    streams_closed: Family<ReasonLabels, Counter>,
    stream_reads: Counter,
    unauthenticated: Counter,
    reconcile_passes: Family<OutcomeLabels, Counter>,
    reconcile_duration: Histograms<OutcomeLabels>,
    pool_failures: Family<PoolLabels, Counter>,
    runtime_calls: Family<EngineCallLabels, Counter>,
    kube_calls: Family<CallLabels, Counter>,
    pruned: Family<TableLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            http_requests: Family::default(),
            http_duration: histograms(),
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            connections_closed: Family::default(),
            streams: Gauge::default(),
            streams_refused: Counter::default(),
            streams_closed: Family::default(),
            stream_reads: Counter::default(),
            unauthenticated: Counter::default(),
            reconcile_passes: Family::default(),
            reconcile_duration: histograms(),
            pool_failures: Family::default(),
            runtime_calls: Family::default(),
            kube_calls: Family::default(),
            pruned: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "drover_http_requests",
            "HTTP requests answered, by method, route and status",
            m.http_requests.clone(),
        );
        r.register(
            "drover_http_request_duration_seconds",
            "Time to answer HTTP requests (up to the response head), by method and route",
            m.http_duration.clone(),
        );
        r.register("drover_http_connections", "Open client connections", m.connections.clone());
        r.register(
            "drover_trace_spans_dropped",
            "Finished spans not exported: the export queue was full, or the collector failed or did not answer",
            crate::telemetry::otlp::spans_dropped(),
        );
        r.register(
            "drover_http_connections_refused",
            "Connections refused because --max-connections were open",
            m.connections_refused.clone(),
        );
        r.register(
            "drover_http_connections_closed",
            "Connections the server closed on a limit, by reason",
            m.connections_closed.clone(),
        );
        r.register("drover_event_streams", "Open event streams", m.streams.clone());
        r.register(
            "drover_event_streams_refused",
            "Event streams refused because --max-streams were open",
            m.streams_refused.clone(),
        );
        r.register(
            "drover_event_streams_closed",
            "Event streams the server ended, by reason",
            m.streams_closed.clone(),
        );
        r.register(
            "drover_event_stream_reads",
            "Store reads by event streams (on a change notice, or at each re-check)",
            m.stream_reads.clone(),
        );
        r.register(
            "drover_http_unauthenticated",
            "Requests refused for want of a valid token (audited once per burst)",
            m.unauthenticated.clone(),
        );
        r.register("drover_reconcile_passes", "Reconcile passes, by outcome", m.reconcile_passes.clone());
        r.register(
            "drover_reconcile_duration_seconds",
            "Duration of reconcile passes, by outcome",
            m.reconcile_duration.clone(),
        );
        r.register(
            "drover_pool_reconcile_failures",
            "Failed reconcile passes of each existing pool",
            m.pool_failures.clone(),
        );
        r.register(
            "drover_runtime_calls",
            "Container engine (Docker) calls, by engine, operation and result",
            m.runtime_calls.clone(),
        );
        r.register(
            "drover_kube_calls",
            "Kubernetes API calls (each try), by operation and result",
            m.kube_calls.clone(),
        );
        r.register("drover_pruned_rows", "Rows removed by the retention pruner, by table", m.pruned.clone());
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Adds metrics kept elsewhere (their owners register them, so that
    /// this module needs none of them).
    pub fn with(mut self, register: impl FnOnce(&mut Registry)) -> Self {
        register(&mut self.registry);
        self
    }
}

/// A label for an HTTP method: the standard ones by name, any other
/// (clients may invent methods) as `other`.
fn method_label(m: &Method) -> &'static str {
    const KNOWN: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"];
    KNOWN.into_iter().find(|k| *k == m.as_str()).unwrap_or("other")
}

impl Metrics {
    /// One answered request. `route` is the matched route pattern (never
    /// the path, which would make one series per pool); `trace`, the
    /// request's trace when it was sampled (the bucket's exemplar).
    pub fn http_request(
        &self,
        method: &Method,
        route: Option<&str>,
        status: StatusCode,
        took: Duration,
        trace: Option<TraceId>,
    ) {
        let method = method_label(method);
        let route = route.unwrap_or("unmatched").to_owned();
        self.http_requests.get_or_create(&HttpLabels { method, route: route.clone(), status: status.as_u16() }).inc();
        self.http_duration.get_or_create(&RouteLabels { method, route }).observe(
            took.as_secs_f64(),
            Exemplar::of(trace),
            None,
        );
    }

    /// One finished reconcile pass of `pool`, of trace `trace` when it was
    /// sampled.
    pub fn reconcile_pass(&self, pool: &PoolRef, outcome: PassOutcome, took: Duration, trace: Option<TraceId>) {
        let labels = OutcomeLabels { outcome: outcome.as_str() };
        self.reconcile_passes.get_or_create(&labels).inc();
        self.reconcile_duration.get_or_create(&labels).observe(took.as_secs_f64(), Exemplar::of(trace), None);
        match outcome {
            PassOutcome::Error => {
                self.pool_failures.get_or_create(&PoolLabels::of(pool)).inc();
            }
            PassOutcome::Gone => self.forget_pool(pool),
            _ => {}
        }
    }

    /// Times a reconcile pass: call [`PassTimer::finish`] with its outcome;
    /// a timer dropped unfinished counts the pass as cancelled.
    pub fn reconcile_timer(self: &Arc<Self>, pool: &PoolRef) -> PassTimer {
        PassTimer { metrics: Arc::clone(self), pool: pool.clone(), started: Instant::now(), done: false }
    }

    /// Removes every series that names `pool`; for when the pool is deleted.
    pub fn forget_pool(&self, pool: &PoolRef) {
        self.pool_failures.remove(&PoolLabels::of(pool));
    }

    /// One container engine call. `op` is a fixed word (`create`, `start`...).
    pub fn runtime_call(&self, engine: &str, op: &'static str, result: CallResult) {
        let labels = EngineCallLabels { engine: engine.to_owned(), op, result: result.as_str() };
        self.runtime_calls.get_or_create(&labels).inc();
    }

    /// Forgets the series of an engine that was removed.
    pub fn forget_engine(&self, engine: &str) {
        for op in ["create", "start", "unpause", "remove"] {
            for result in [CallResult::Ok, CallResult::Error, CallResult::Unavailable] {
                self.runtime_calls.remove(&EngineCallLabels { engine: engine.to_owned(), op, result: result.as_str() });
            }
        }
    }

    /// One try of a Kubernetes API call, by its kind (`KubeOp::kind`: a
    /// fixed set, never an object's name).
    pub fn kube_call(&self, kind: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.kube_calls.get_or_create(&CallLabels { op: kind, result }).inc();
    }

    /// A new client connection; the guard counts it until dropped.
    pub fn connection_opened(self: &Arc<Self>) -> OpenGuard {
        self.connections.inc();
        OpenGuard { metrics: Arc::clone(self), stream: false }
    }

    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    pub fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed.get_or_create(&ReasonLabels { reason: reason.as_str() }).inc();
    }

    /// A new event stream; the guard counts it until dropped.
    pub fn stream_opened(self: &Arc<Self>) -> OpenGuard {
        self.streams.inc();
        OpenGuard { metrics: Arc::clone(self), stream: true }
    }

    pub fn stream_refused(&self) {
        self.streams_refused.inc();
    }

    pub fn stream_closed(&self, reason: CloseReason) {
        self.streams_closed.get_or_create(&ReasonLabels { reason: reason.as_str() }).inc();
    }

    pub fn stream_read(&self) {
        self.stream_reads.inc();
    }

    pub fn unauthenticated(&self) {
        self.unauthenticated.inc();
    }

    pub fn pruned(&self, table: &'static str, rows: u64) {
        self.pruned.get_or_create(&TableLabels { table }).inc_by(rows);
    }

    /// The recorded families, in `format`.
    pub fn render(&self, out: &mut String, format: Format) -> std::fmt::Result {
        format.encode(out, &self.registry)
    }
}

/// Counts an open connection or stream until dropped.
pub struct OpenGuard {
    metrics: Arc<Metrics>,
    stream: bool,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if self.stream {
            self.metrics.streams.dec();
        } else {
            self.metrics.connections.dec();
        }
    }
}

/// Times one reconcile pass; see [`Metrics::reconcile_timer`].
pub struct PassTimer {
    metrics: Arc<Metrics>,
    pool: PoolRef,
    started: Instant,
    done: bool,
}

impl PassTimer {
    pub fn finish(mut self, outcome: PassOutcome) {
        self.done = true;
        // Inside the pass's span: its trace is the exemplar.
        let trace = crate::telemetry::context::sampled_trace_id(&tracing::Span::current());
        self.metrics.reconcile_pass(&self.pool, outcome, self.started.elapsed(), trace);
    }
}

impl Drop for PassTimer {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.reconcile_pass(&self.pool, PassOutcome::Cancelled, self.started.elapsed(), None);
        }
    }
}

/// Gauges computed at scrape time, rendered after the recorded families.
#[derive(Default)]
pub struct ScrapeGauges {
    registry: Registry,
}

impl ScrapeGauges {
    /// Adds one gauge family; `labels` are the label names, each sample gives
    /// their values in the same order.
    pub fn family(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[&'static str],
        samples: &[(Vec<String>, f64)],
    ) {
        let family: Family<Vec<(&'static str, String)>, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
        for (values, v) in samples {
            let set: Vec<(&'static str, String)> = labels.iter().copied().zip(values.iter().cloned()).collect();
            family.get_or_create(&set).set(*v);
        }
        self.registry.register(name, help, family);
    }

    pub fn render(&self, out: &mut String, format: Format) -> std::fmt::Result {
        format.encode(out, &self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(m: &Metrics) -> String {
        let mut out = String::new();
        m.render(&mut out, Format::Prometheus).unwrap();
        out
    }

    #[test]
    fn renders_prometheus_text_with_bounded_labels() {
        let m = Arc::new(Metrics::default());
        for _ in 0..2 {
            m.http_request(&Method::GET, Some("/v1/pools"), StatusCode::OK, Duration::from_millis(3), None);
        }
        m.http_request(&Method::from_bytes(b"BREW").unwrap(), None, StatusCode::NOT_FOUND, Duration::ZERO, None);
        m.kube_call("list pods on node", true);
        m.kube_call("evict pod", false);
        m.kube_call("list pods", true);
        let out = rendered(&m);
        assert!(out.contains("# TYPE drover_http_requests_total counter"), "{out}");
        assert!(
            out.contains("drover_http_requests_total{method=\"GET\",route=\"/v1/pools\",status=\"200\"} 2"),
            "{out}"
        );
        assert!(out.contains("drover_http_requests_total{method=\"other\",route=\"unmatched\",status=\"404\"} 1"));
        assert!(out.contains("drover_kube_calls_total{op=\"list pods on node\",result=\"ok\"} 1"), "{out}");
        assert!(out.contains("drover_kube_calls_total{op=\"evict pod\",result=\"error\"} 1"), "{out}");
        assert!(out.contains("drover_kube_calls_total{op=\"list pods\",result=\"ok\"} 1"), "{out}");
    }

    #[test]
    fn exemplars_name_the_trace_of_a_buckets_last_sampled_request_in_openmetrics_only() {
        let m = Arc::new(Metrics::default());
        let trace: TraceId = "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap();
        m.http_request(&Method::GET, Some("/v1/pools"), StatusCode::OK, Duration::from_millis(3), Some(trace));
        m.http_request(&Method::GET, Some("/v1/pools"), StatusCode::OK, Duration::from_millis(300), None);
        m.reconcile_pass(&"web".into(), PassOutcome::Converged, Duration::from_millis(40), Some(trace));

        let mut open = String::new();
        m.render(&mut open, Format::OpenMetrics).unwrap();
        Format::OpenMetrics.finish(&mut open).unwrap();
        let bucket = |out: &str, prefix: &str| out.lines().find(|l| l.starts_with(prefix)).unwrap_or("").to_owned();
        let fast = bucket(&open, "drover_http_request_duration_seconds_bucket{le=\"0.005\",method=\"GET\"");
        assert!(fast.ends_with(" 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.003"), "{open}");
        let slow = bucket(&open, "drover_http_request_duration_seconds_bucket{le=\"0.5\",method=\"GET\"");
        assert!(slow.ends_with(" 2"), "a request not sampled leaves no exemplar: {open}");
        let pass = bucket(&open, "drover_reconcile_duration_seconds_bucket{le=\"0.05\"");
        assert!(pass.contains("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.04"), "{open}");
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(Format::negotiate(None), Format::Prometheus);

        let text = rendered(&m);
        assert!(!text.contains("trace_id"), "Prometheus' text format has no exemplars: {text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn a_pools_series_go_with_the_pool() {
        let m = Arc::new(Metrics::default());
        m.reconcile_pass(&"web".into(), PassOutcome::Error, Duration::from_millis(30), None);
        m.reconcile_timer(&"web".into()).finish(PassOutcome::Converged);
        drop(m.reconcile_timer(&"web".into()));
        let out = rendered(&m);
        assert!(out.contains("drover_pool_reconcile_failures_total{namespace=\"default\",pool=\"web\"} 1"), "{out}");
        assert!(out.contains("drover_reconcile_passes_total{outcome=\"cancelled\"} 1"), "{out}");
        assert!(out.contains("drover_reconcile_duration_seconds_bucket{outcome=\"error\",le=\"0.05\"} 1"), "{out}");
        m.reconcile_pass(&"web".into(), PassOutcome::Gone, Duration::ZERO, None);
        assert!(!rendered(&m).contains("pool=\"web\""), "the pool's series outlived it");
    }

    #[test]
    fn guards_count_open_connections_and_streams() {
        let m = Arc::new(Metrics::default());
        let a = m.connection_opened();
        let s = m.stream_opened();
        assert!(rendered(&m).contains("drover_http_connections 1"));
        drop((a, s));
        let out = rendered(&m);
        assert!(out.contains("drover_http_connections 0") && out.contains("drover_event_streams 0"), "{out}");
    }
}
