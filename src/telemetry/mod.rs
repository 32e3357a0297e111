//! Log output: human-readable lines or JSON, filtered like `RUST_LOG`.
//!
//! Log fields often carry what clients sent (paths, field names, request
//! ids). In text logs every field is escaped, so that a value holding a
//! newline or a terminal escape can neither forge a log line nor reach the
//! reader's terminal; JSON logs are escaped by their encoding.
//!
//! Spans also go to an OpenTelemetry collector when one is configured
//! ([`otlp`]); the log filter does not decide which spans are exported
//! (drover's own, at `info` and above, always are).

pub mod context;
pub mod export;
pub mod head;
pub mod otlp;

use std::fmt::Write as _;

use clap::ValueEnum;
use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

type BoxedLayer = Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>;

/// Installs the log subscriber and, when `traces` names a collector, the
/// span export. Keep the answer until shutdown and call
/// [`Telemetry::shutdown`] so that the last spans are sent.
pub fn init(filter: &str, format: LogFormat, traces: &otlp::TraceSettings) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_new(filter).map_err(|e| anyhow::anyhow!("bad log filter {filter:?}: {e}"))?;
    // Colours only for a person at a terminal; a file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs: BoxedLayer = match format {
        LogFormat::Text => fmt.fmt_fields(escaped_fields()).with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(true).with_filter(filter).boxed(),
    };
    let mut layers = vec![logs];
    let export = otlp::Export::start(traces)?.map(|(export, tracer)| {
        // Per span, only what the spans' own fields say: no source
        // location, thread or target attributes, no busy/idle clock reads
        // at every poll, and no OpenTelemetry context made current at every
        // poll (drover reads a span's context from the span itself). Each
        // costs every request, sampled or not.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false);
        layers.push(layer.with_filter(head::Exported::default()).boxed());
        export
    });
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    Ok(Telemetry { export })
}

/// What [`init`] started that shutdown must finish.
pub struct Telemetry {
    export: Option<otlp::Export>,
}

impl Telemetry {
    /// Sends the spans still queued (a bounded wait).
    pub async fn shutdown(self) {
        if let Some(export) = self.export {
            export.shutdown().await;
        }
    }
}

/// Formats every field of a text log line as `name=value`, with control
/// characters in values written as escapes.
pub fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        let text = escape_controls(&text);
        if field.name() == "message" { write!(w, "{text}") } else { write!(w, "{}={text}", field.name()) }
    })
    .delimited(" ")
}

/// `s` with every control character (C0, DEL, C1) written as `\n`, `\r`,
/// `\t` or `\u{..}`; everything else as it is.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.into()
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A client-supplied string for a log field: escaped by the text format,
/// cut to `max` bytes with a marker so that one request cannot write
/// kilobytes into every line.
pub struct Clipped<'a>(pub &'a str, pub usize);

impl std::fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = truncate(self.0, self.1);
        f.write_str(cut)?;
        if cut.len() < self.0.len() {
            write!(f, "...({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_field_with_a_newline_and_escapes_cannot_forge_a_text_log_line() {
        let buf = Buffer::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(escaped_fields())
            .with_writer(move || writer.clone())
            .finish();
        let evil = "x\n2030-01-01T00:00:00Z  INFO drover: forged line \u{1b}[31mred";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(field = %evil, other = ?evil, "client sent {evil}");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "one event, one line: {out}");
        assert!(!out.contains('\u{1b}'), "no raw escape reaches the terminal: {out:?}");
        assert!(out.contains("field=x\\n2030"), "{out}");
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(Clipped("abcdef", 3).to_string(), "abc...(6 bytes)");
        assert_eq!(escape_controls("a\tb\u{7f}\u{9b}"), "a\\tb\\u{7f}\\u{9b}");
    }
}
