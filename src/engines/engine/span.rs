//! One span per engine call (create, start, unpause, inspect, remove), with
//! the engine, the container and the outcome, so that a slow rollout's trace
//! shows which engine call took the time.

use tracing::Instrument as _;

use crate::runtime::RuntimeError;

/// The engine calls that get a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineOp {
    Create,
    Start,
    Unpause,
    Inspect,
    Remove,
}

impl EngineOp {
    fn span_name(self) -> &'static str {
        match self {
            Self::Create => "engine create",
            Self::Start => "engine start",
            Self::Unpause => "engine unpause",
            Self::Inspect => "engine inspect",
            Self::Remove => "engine remove",
        }
    }
}

/// How an engine call ended, as its span's `outcome`.
fn outcome<T>(r: &Result<T, RuntimeError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(RuntimeError::Fenced) => "fenced",
        Err(RuntimeError::Unavailable(_)) => "unavailable",
        Err(_) => "error",
    }
}

/// Runs `call` inside the span of one engine call and records its outcome.
pub async fn traced<T>(
    op: EngineOp,
    engine: &str,
    kind: &'static str,
    container: &str,
    call: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    let span = tracing::info_span!(
        "engine",
        otel.name = op.span_name(),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        engine.name = %engine,
        engine.kind = kind,
        container.name = %container,
        outcome = tracing::field::Empty,
    );
    let result = call.instrument(span.clone()).await;
    let outcome = outcome(&result);
    span.record("outcome", outcome);
    if !matches!(outcome, "ok" | "fenced") {
        span.record("otel.status_code", "ERROR");
    }
    result
}
