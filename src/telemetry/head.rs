//! Head sampling of requests: whether a request's trace is kept is decided
//! as it arrives, before any of its spans exists, so that a request whose
//! trace is not kept costs no OpenTelemetry span at all, neither its own
//! nor any of its children's. (Deciding at the span, as the SDK does,
//! builds and finishes every span of every request only to drop 90% of
//! them at 10% sampling: that cost a fifth of the throughput of reads.)
//!
//! - [`HeadSampling`], the outermost HTTP middleware, asks the configured
//!   sampler about the request (continuing its `traceparent`) and runs it
//!   inside the decision: a kept request goes on as before; a dropped one
//!   runs with its trace context in a task-local ([`request_context`]), so
//!   that it still has a trace id for logs, problems and `traceresponse`.
//! - [`Exported`], the span filter of the OpenTelemetry layer, keeps the
//!   layer away from every span and event of a dropped request.
//! - [`HeadDecided`] is the SDK's sampler: a request span reaching it was
//!   kept at the head, and a span follows its parent in this process; any
//!   other root (a reconcile pass, an upgrade job) is asked the configured
//!   sampler, as before.
//!
//! Work a dropped request hands to another task (a pass it wakes) is not
//! in the request's task and decides for itself, linked to the request.

use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};

use axum::http::{HeaderMap, Request};
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{Link, SpanContext, SpanKind, TraceContextExt as _, TraceFlags, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SamplingDecision, SamplingResult, ShouldSample,
};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context as LayerContext, Filter};

/// The trace context of the request a task serves: the head's, when it
/// dropped the trace; the request span's once it started, when it kept it.
/// Kept once per request, so that what names the request's trace (logs,
/// problems, `traceresponse`, exemplars) does not look its span up again.
type RequestContext = Arc<OnceLock<SpanContext>>;

tokio::task_local! {
    static REQUEST: Option<RequestContext>;
}

/// The trace context of the request the current task serves, if any.
pub fn request_context() -> Option<SpanContext> {
    REQUEST.try_with(|r| r.as_ref().and_then(|r| r.get().cloned())).ok().flatten()
}

/// Keeps `sc`, the context of the request span that just started, as the
/// request's (see [`request_context`]).
pub fn remember(sc: &SpanContext) {
    let _ = REQUEST.try_with(|r| r.as_ref().map(|r| r.set(sc.clone())));
}

fn in_unsampled_request() -> bool {
    REQUEST.try_with(|r| r.as_ref().and_then(|r| r.get()).is_some_and(|sc| !sc.is_sampled())).unwrap_or(false)
}

/// What the head decided about a request (kept with a client's parent, it
/// is a request extension, read by the request's span).
#[derive(Clone)]
pub enum Head {
    /// Kept: the span continues `parent` (the client's `traceparent`, or
    /// an empty context).
    Sampled(Context),
    /// Dropped: the request's trace context, never exported.
    Unsampled(SpanContext),
}

/// The middleware that decides ([`HeadSampling`]); without a collector it
/// decides nothing and costs nothing.
#[derive(Clone)]
pub struct HeadSamplingLayer {
    sampler: Option<Sampler>,
}

impl HeadSamplingLayer {
    /// Samples with `sampler`, or not at all when export is off (`None`).
    pub fn new(sampler: Option<Sampler>) -> Self {
        Self { sampler }
    }
}

impl<S> tower::Layer<S> for HeadSamplingLayer {
    type Service = HeadSampling<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HeadSampling { inner, sampler: self.sampler.clone() }
    }
}

#[derive(Clone)]
pub struct HeadSampling<S> {
    inner: S,
    sampler: Option<Sampler>,
}

impl<S, B> tower::Service<Request<B>> for HeadSampling<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tokio::task::futures::TaskLocalFuture<Option<RequestContext>, S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let request = match self.sampler.as_ref().map(|s| decide(s, req.headers())) {
            None => None,
            Some(Head::Unsampled(sc)) => Some(Arc::new(OnceLock::from(sc))),
            Some(Head::Sampled(parent)) => {
                // The span reads its parent here; a root needs nothing.
                if parent.has_active_span() {
                    req.extensions_mut().insert(Head::Sampled(parent));
                }
                Some(Arc::default())
            }
        };
        // The request's span is made in `call`, the rest in the future:
        // both run inside the decision.
        let future = REQUEST.sync_scope(request.clone(), || self.inner.call(req));
        REQUEST.scope(request, future)
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Asks `sampler` about a request with `headers`: a valid `traceparent`
/// is its parent (an invalid one is ignored: the request starts a trace).
fn decide(sampler: &Sampler, headers: &HeaderMap) -> Head {
    let parent = match headers.contains_key("traceparent") {
        true => TraceContextPropagator::new().extract(&Headers(headers)),
        false => Context::new(),
    };
    let remote = parent.span().span_context().clone();
    let (parent, trace_id) = if remote.is_valid() {
        (parent, remote.trace_id())
    } else {
        (Context::new(), RandomIdGenerator::default().new_trace_id())
    };
    let verdict = sampler.should_sample(Some(&parent), trace_id, "http", &SpanKind::Server, &[], &[]);
    match verdict.decision {
        SamplingDecision::RecordAndSample | SamplingDecision::RecordOnly => Head::Sampled(parent),
        SamplingDecision::Drop => {
            let span_id = RandomIdGenerator::default().new_span_id();
            Head::Unsampled(SpanContext::new(trace_id, span_id, TraceFlags::NOT_SAMPLED, false, verdict.trace_state))
        }
    }
}

/// The span filter of the OpenTelemetry layer: drover's spans at `info`
/// and above, none of a request dropped at the head.
pub struct Exported {
    targets: Targets,
}

impl Default for Exported {
    fn default() -> Self {
        Self { targets: Targets::new().with_target("drover", Level::INFO) }
    }
}

impl<S> Filter<S> for Exported {
    fn enabled(&self, meta: &Metadata<'_>, _: &LayerContext<'_, S>) -> bool {
        self.targets.would_enable(meta.target(), meta.level()) && !in_unsampled_request()
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Asked at every span: whether a request was kept is not known
        // per call site.
        if self.targets.would_enable(meta.target(), meta.level()) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::INFO)
    }
}

/// The SDK's sampler (see the module's notes).
#[derive(Debug, Clone)]
pub struct HeadDecided(pub Sampler);

impl ShouldSample for HeadDecided {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let parent_sc = parent.map(|cx| cx.span().span_context().clone()).filter(SpanContext::is_valid);
        let keep = match (&parent_sc, kind) {
            (Some(sc), _) if !sc.is_remote() => sc.is_sampled(),
            // Only requests the head kept have a span in the layer.
            (_, SpanKind::Server) => true,
            _ => return self.0.should_sample(parent, trace_id, name, kind, attributes, links),
        };
        SamplingResult {
            decision: if keep { SamplingDecision::RecordAndSample } else { SamplingDecision::Drop },
            attributes: Vec::new(),
            trace_state: parent_sc.map(|sc| sc.trace_state().clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_traceparent(flags: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let value = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
        h.insert("traceparent", HeaderValue::from_str(&value).unwrap());
        h
    }

    #[test]
    fn the_head_follows_the_clients_decision_and_keeps_its_trace_id_when_it_drops() {
        let parent_based = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let Head::Unsampled(sc) = decide(&parent_based, &with_traceparent("00")) else { panic!("kept") };
        assert_eq!(format!("{:032x}", sc.trace_id()), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(!sc.is_sampled() && sc.is_valid());
        let Head::Sampled(parent) = decide(&parent_based, &with_traceparent("01")) else { panic!("dropped") };
        assert!(parent.span().span_context().is_remote());
        assert!(matches!(decide(&parent_based, &HeaderMap::new()), Head::Sampled(_)));
        let Head::Unsampled(root) = decide(&Sampler::AlwaysOff, &HeaderMap::new()) else { panic!("kept") };
        assert!(root.is_valid(), "a dropped request still has a trace id to report");
    }

    #[test]
    fn a_ratio_at_the_head_keeps_its_share() {
        let sampler = Sampler::TraceIdRatioBased(0.25);
        let kept = (0..4000).filter(|_| matches!(decide(&sampler, &HeaderMap::new()), Head::Sampled(_))).count();
        // 1,000 expected; the standard deviation is about 27.
        assert!((850..=1150).contains(&kept), "{kept} of 4000 at 0.25");
    }

    #[test]
    fn spans_follow_a_local_parent_and_requests_reaching_the_sdk_were_kept() {
        let sampler = HeadDecided(Sampler::AlwaysOff);
        let id = TraceId::from_bytes([7; 16]);
        let decision =
            |parent: Option<&Context>, kind| sampler.should_sample(parent, id, "x", &kind, &[], &[]).decision;
        assert_eq!(decision(None, SpanKind::Server), SamplingDecision::RecordAndSample);
        assert_eq!(decision(None, SpanKind::Internal), SamplingDecision::Drop, "a root asks the configured sampler");
        let local = |flags| {
            let sc = SpanContext::new(
                id,
                opentelemetry::trace::SpanId::from_bytes([1; 8]),
                flags,
                false,
                opentelemetry::trace::TraceState::default(),
            );
            Context::new().with_remote_span_context(sc)
        };
        let kept = local(TraceFlags::SAMPLED);
        assert_eq!(decision(Some(&kept), SpanKind::Client), SamplingDecision::RecordAndSample);
        let dropped = local(TraceFlags::NOT_SAMPLED);
        assert_eq!(decision(Some(&dropped), SpanKind::Internal), SamplingDecision::Drop);
    }
}
