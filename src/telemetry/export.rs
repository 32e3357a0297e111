//! The span queue between the code that finishes spans and the collector.
//!
//! A bounded queue and one export task on the runtime, in place of the
//! SDK's batch processor: the SDK's counts the spans it drops but does not
//! say so to anyone, and an operator needs to see it. Finishing a span
//! never waits: a full queue drops the span, a collector that refuses or
//! does not answer within [`EXPORT_TIMEOUT`] drops its batch, and every
//! dropped span is counted (`drover_trace_spans_dropped`).

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Most spans in one request to the collector (the SDK's default).
const MAX_BATCH: usize = 512;
/// Longest a finished span waits for its batch to fill.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Longest one export may take before its batch counts as dropped.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct QueueProcessor {
    tx: mpsc::Sender<SpanData>,
    dropped: Counter,
}

impl QueueProcessor {
    /// Starts the export task on `tasks`; it stops (after posting what is
    /// queued) once `cancel` fires.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        queue: usize,
        dropped: Counter,
        tasks: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(queue.max(1));
        tasks.spawn(run(exporter, rx, dropped.clone(), cancel));
        Self { tx, dropped }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        // The export task drains the queue once its token is cancelled
        // (Export::shutdown), on the runtime: nothing here may block it.
        Ok(())
    }
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    dropped: Counter,
    cancel: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            span = rx.recv() => span,
            () = cancel.cancelled() => None,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let deadline = tokio::time::sleep(BATCH_DELAY);
        tokio::pin!(deadline);
        while batch.len() < MAX_BATCH {
            tokio::select! {
                span = rx.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
                () = &mut deadline => break,
                () = cancel.cancelled() => break,
            }
        }
        export(&exporter, batch, &dropped).await;
    }
    rx.close();
    let mut rest = Vec::new();
    while let Ok(span) = rx.try_recv() {
        rest.push(span);
        if rest.len() == MAX_BATCH {
            export(&exporter, std::mem::take(&mut rest), &dropped).await;
        }
    }
    if !rest.is_empty() {
        export(&exporter, rest, &dropped).await;
    }
}

/// Span fields written for the logs only: the path (the route says the
/// same with less, and a path may name objects), and what repeats an
/// attribute or the span's own ids. Dropped here, in the export task,
/// rather than kept out of the span, which the log lines read too.
const LOG_ONLY: [&str; 3] = ["path", "method", "trace_id"];

async fn export<E: SpanExporter>(exporter: &E, mut batch: Vec<SpanData>, dropped: &Counter) {
    for span in &mut batch {
        span.attributes.retain(|kv| !LOG_ONLY.contains(&kv.key.as_str()));
    }
    let n = batch.len() as u64;
    let failure = match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(batch)).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {EXPORT_TIMEOUT:?}"),
    };
    dropped.inc_by(n);
    tracing::debug!(spans = n, error = %failure, "exporting spans failed; they are dropped");
}
