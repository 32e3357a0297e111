//! W3C trace context at drover's edges: a client's `traceparent` continued,
//! the `traceresponse` header on answers, and the trace id users paste into
//! bug reports. Without an exporter no span carries a trace id and every
//! function here answers `None`.

use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The response header naming the trace of the request (W3C Trace Context
/// Level 2).
pub const TRACERESPONSE: &str = "traceresponse";

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Makes `span` a child of the client's `traceparent`, when it sent a
/// valid one (an invalid one is ignored: the request starts a trace).
pub fn continue_from(headers: &HeaderMap, span: &tracing::Span) {
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if parent.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed.
        let _ = span.set_parent(parent);
    }
}

/// The OpenTelemetry span context of `span`, when it has a valid one.
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Renames the OpenTelemetry span of `span` (once it has started, its
/// `otel.name` field no longer renames it): a request's span is named
/// after its route, known only once the router matched it.
pub fn rename(span: &tracing::Span, name: String) {
    span.context().span().update_name(name);
}

/// The trace id of the current span, as 32 hex digits.
pub fn current_trace_id() -> Option<String> {
    span_context(&tracing::Span::current()).map(|sc| format!("{:032x}", sc.trace_id()))
}

/// `traceresponse` for the request whose span is `span`:
/// `00-<trace id>-<span id>-<flags>`.
pub fn traceresponse(span: &tracing::Span) -> Option<HeaderValue> {
    let sc = span_context(span)?;
    let value = format!("00-{:032x}-{:016x}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
    HeaderValue::from_str(&value).ok()
}
