//! W3C trace context at drover's edges: the `traceresponse` header on
//! answers, and the trace id users paste into bug reports (a client's
//! `traceparent` is continued by [`super::head`]). Without an exporter no span carries a trace id and every
//! function here answers `None`.

use axum::http::HeaderValue;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The response header naming the trace of the request (W3C Trace Context
/// Level 2).
pub const TRACERESPONSE: &str = "traceresponse";

/// The OpenTelemetry span context of `span`, when it has a valid one.
/// A request dropped at the head ([`super::head`]) has no OpenTelemetry
/// span: its context is the one the head gave it.
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() { Some(sc) } else { super::head::request_context() }
}

/// Records the trace id of `span` in its `trace_id` field (declared
/// empty), so that every JSON log line written inside it names the trace.
/// Call it after the span's parent and links are set: it starts the span.
pub fn record_trace_id(span: &tracing::Span) -> Option<SpanContext> {
    let sc = span_context(span)?;
    span.record("trace_id", tracing::field::display(TraceId(sc.trace_id().to_bytes())));
    Some(sc)
}

/// Starts the span of a request ([`record_trace_id`]) and keeps its
/// context as the request's ([`super::head::remember`]).
pub fn start_request(span: &tracing::Span) {
    if let Some(sc) = record_trace_id(span) {
        super::head::remember(&sc);
    }
}

/// The context of the request the current task serves, else of `span`.
fn request_or(span: &tracing::Span) -> Option<SpanContext> {
    super::head::request_context().or_else(|| span_context(span))
}

/// Renames the OpenTelemetry span of `span` (once it has started, its
/// `otel.name` field no longer renames it): a request's span is named
/// after its route, known only once the router matched it.
pub fn rename(span: &tracing::Span, name: String) {
    span.context().span().update_name(name);
}

/// A W3C trace id, written (and read) as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Written at every request with export on: one write, not 16.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            text[2 * i] = HEX[usize::from(b >> 4)];
            text[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

impl std::str::FromStr for TraceId {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let valid = s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let mut id = [0u8; 16];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = s.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or(())?;
        }
        if valid { Ok(Self(id)) } else { Err(()) }
    }
}

impl serde::Serialize for TraceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Reads a trace id leniently: a value that is not one (an older or a
/// foreign server's) is `None`, not a failure to read the whole document.
pub fn lenient_trace_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TraceId>, D::Error> {
    let text: Option<String> = serde::Deserialize::deserialize(d)?;
    Ok(text.and_then(|t| t.parse().ok()))
}

/// The trace id of the current span.
pub fn current_trace_id() -> Option<TraceId> {
    request_or(&tracing::Span::current()).map(|sc| TraceId(sc.trace_id().to_bytes()))
}

/// The trace id of `span` when its trace is sampled (exported): what a
/// histogram's exemplar names, since one naming a trace no collector holds
/// would lead nowhere. In a request's task, the request's trace.
pub fn sampled_trace_id(span: &tracing::Span) -> Option<TraceId> {
    request_or(span).filter(SpanContext::is_sampled).map(|sc| TraceId(sc.trace_id().to_bytes()))
}

/// `traceresponse` for the request whose span is `span`:
/// `00-<trace id>-<span id>-<flags>`.
pub fn traceresponse(span: &tracing::Span) -> Option<HeaderValue> {
    let sc = request_or(span)?;
    let trace = TraceId(sc.trace_id().to_bytes());
    let value = format!("00-{trace}-{:016x}-{:02x}", sc.span_id(), sc.trace_flags().to_u8());
    HeaderValue::from_str(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_reads_back_what_it_writes_and_refuses_anything_else() {
        let text = "4bf92f3577b34da6a3ce929d0e0e4736";
        let id: TraceId = text.parse().unwrap();
        assert_eq!(id.to_string(), text);
        for bad in [
            "",
            "4BF92F3577B34DA6A3CE929D0E0E4736",
            "4bf92f3577b34da6a3ce929d0e0e473",
            "+bf92f3577b34da6a3ce929d0e0e4736",
        ] {
            assert!(bad.parse::<TraceId>().is_err(), "{bad:?}");
        }
    }
}
