//! Trace export over OTLP/HTTP (protobuf), configured the way every
//! OpenTelemetry SDK is: off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `--otlp-endpoint`) names a collector; the sampler, the service name and
//! the resource from the standard variables.
//!
//! Only `http/protobuf` is spoken: drover ships no gRPC stack, so asking
//! for `grpc` is refused at startup rather than silently ignored.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};
use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::export::QueueProcessor;

/// Trace export settings (`drover serve`); each flag reads the standard
/// OpenTelemetry variable of the same meaning.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceSettings {
    /// Base URL of an OTLP/HTTP collector (spans go to `<url>/v1/traces`),
    /// e.g. `http://otel-collector:4318`. Unset: no trace is exported.
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub endpoint: Option<String>,

    /// OTLP transport; only `http/protobuf` (drover ships no gRPC stack).
    #[arg(long = "otlp-protocol", env = "OTEL_EXPORTER_OTLP_PROTOCOL", default_value = "http/protobuf", value_parser = parse_protocol)]
    pub protocol: OtlpProtocol,

    /// `service.name` of the exported spans.
    #[arg(long = "otel-service-name", env = "OTEL_SERVICE_NAME", default_value = "drover")]
    pub service_name: String,

    /// Which traces are kept: always_on, always_off, traceidratio,
    /// parentbased_always_on, parentbased_always_off, parentbased_traceidratio.
    #[arg(long = "traces-sampler", env = "OTEL_TRACES_SAMPLER", default_value = "parentbased_always_on", value_parser = parse_sampler)]
    pub sampler: SamplerName,

    /// The ratio of the `traceidratio` samplers, from 0 to 1 (default 1).
    #[arg(long = "traces-sampler-arg", env = "OTEL_TRACES_SAMPLER_ARG", value_parser = parse_ratio)]
    pub sampler_arg: Option<f64>,

    /// Extra resource attributes, `key=value,key=value` (values
    /// percent-encoded), e.g. `deployment.environment.name=prod`.
    #[arg(long = "otel-resource-attributes", env = "OTEL_RESOURCE_ATTRIBUTES", value_parser = parse_attributes)]
    pub resource_attributes: Option<ResourceAttributes>,

    /// Finished spans waiting for export; beyond it spans are dropped (and
    /// counted in `drover_trace_spans_dropped`), never waited for.
    #[arg(long = "otlp-queue-size", env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub queue_size: u32,
}

/// The OTLP transports drover speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    HttpProtobuf,
}

fn parse_protocol(s: &str) -> Result<OtlpProtocol, String> {
    match s {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        "grpc" => Err("OTLP over gRPC is not supported (drover ships no gRPC stack): use http/protobuf and \
                       the collector's OTLP/HTTP port (4318)"
            .into()),
        other => Err(format!("unknown OTLP protocol {other:?}: drover speaks http/protobuf")),
    }
}

/// `OTEL_TRACES_SAMPLER`'s values that drover knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerName {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio,
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio,
}

fn parse_sampler(s: &str) -> Result<SamplerName, String> {
    Ok(match s {
        "always_on" => SamplerName::AlwaysOn,
        "always_off" => SamplerName::AlwaysOff,
        "traceidratio" => SamplerName::TraceIdRatio,
        "parentbased_always_on" => SamplerName::ParentBasedAlwaysOn,
        "parentbased_always_off" => SamplerName::ParentBasedAlwaysOff,
        "parentbased_traceidratio" => SamplerName::ParentBasedTraceIdRatio,
        other => return Err(format!("unsupported sampler {other:?}")),
    })
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a ratio from 0 to 1")),
    }
}

/// `key=value` pairs of `OTEL_RESOURCE_ATTRIBUTES`, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceAttributes(pub Vec<(String, String)>);

fn parse_attributes(s: &str) -> Result<ResourceAttributes, String> {
    let decode = |v: &str| percent_encoding::percent_decode_str(v.trim()).decode_utf8_lossy().into_owned();
    let pairs = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((decode(k), decode(v))),
            _ => Err(format!("resource attribute {p:?} is not key=value")),
        })
        .collect::<Result<_, _>>()?;
    Ok(ResourceAttributes(pairs))
}

impl TraceSettings {
    /// The sampler of requests at the head ([`super::head`]); `None` when
    /// export is off.
    pub fn head_sampler(&self) -> Option<Sampler> {
        self.collector().map(|_| self.sampler())
    }

    /// The collector's base URL, when export is on (an empty one is off).
    fn collector(&self) -> Option<&str> {
        self.endpoint.as_deref().filter(|e| !e.trim().is_empty())
    }

    fn sampler(&self) -> Sampler {
        let ratio = || Sampler::TraceIdRatioBased(self.sampler_arg.unwrap_or(1.0));
        match self.sampler {
            SamplerName::AlwaysOn => Sampler::AlwaysOn,
            SamplerName::AlwaysOff => Sampler::AlwaysOff,
            SamplerName::TraceIdRatio => ratio(),
            SamplerName::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerName::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            SamplerName::ParentBasedTraceIdRatio => Sampler::ParentBased(Box::new(ratio())),
        }
    }

    fn resource(&self) -> Resource {
        let extra = self.resource_attributes.iter().flat_map(|a| a.0.iter());
        // OTEL_SERVICE_NAME wins over a service.name in the attributes.
        let extra = extra.filter(|(k, _)| k != "service.name").map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
        Resource::builder_empty()
            .with_attributes(extra)
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .with_service_name(self.service_name.clone())
            .build()
    }

    /// The URL spans are posted to: the base endpoint plus `/v1/traces`,
    /// as the specification says of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    fn traces_url(endpoint: &str) -> String {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    }
}

/// Spans dropped instead of exported, process-wide like the tracer:
/// the queue was full, or the collector refused or did not answer.
pub fn spans_dropped() -> Counter {
    static DROPPED: OnceLock<Counter> = OnceLock::new();
    DROPPED.get_or_init(Counter::default).clone()
}

/// The running export: its provider and the task that posts batches.
pub struct Export {
    provider: SdkTracerProvider,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// How long shutdown waits for the last batch to reach the collector.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl Export {
    /// Builds the exporter and its queue; `None` when export is off. Must
    /// run inside the tokio runtime (the export task runs on it).
    pub fn start(settings: &TraceSettings) -> anyhow::Result<Option<(Self, Tracer)>> {
        let Some(endpoint) = settings.collector() else {
            return Ok(None);
        };
        let OtlpProtocol::HttpProtobuf = settings.protocol;
        let url = TraceSettings::traces_url(endpoint);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(super::export::EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("building the OTLP exporter for {url}: {e}"))?;
        // The exporter sends the resource with every batch; the provider
        // would hand it over through the processor, which owns the
        // exporter's task by then.
        let resource = settings.resource();
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let queue = usize::try_from(settings.queue_size).unwrap_or(usize::MAX);
        let processor = QueueProcessor::start(exporter, queue, spans_dropped(), &tasks, cancel.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(super::head::HeadDecided(settings.sampler()))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("drover");
        tasks.close();
        Ok(Some((Self { provider, cancel, tasks }, tracer)))
    }

    /// Stops taking spans, posts what is queued, and waits (a bounded
    /// time) for it to reach the collector.
    pub async fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "shutting down the tracer provider");
        }
        self.cancel.cancel();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.tasks.wait()).await.is_err() {
            tracing::warn!("the last spans did not reach the collector before shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_refused_with_a_reason_and_http_protobuf_accepted() {
        assert_eq!(parse_protocol("http/protobuf"), Ok(OtlpProtocol::HttpProtobuf));
        let err = parse_protocol("grpc").unwrap_err();
        assert!(err.contains("gRPC") && err.contains("http/protobuf"), "{err}");
        assert!(parse_protocol("http/json").is_err());
    }

    #[test]
    fn resource_attributes_are_decoded_pairs_and_the_ratio_is_bounded() {
        let a = parse_attributes("deployment.environment.name=prod, team=a%2Cb").unwrap();
        assert_eq!(a.0, vec![("deployment.environment.name".into(), "prod".into()), ("team".into(), "a,b".into())]);
        assert!(parse_attributes("novalue").is_err());
        assert_eq!(parse_ratio("0.25"), Ok(0.25));
        assert!(parse_ratio("1.5").is_err());
        assert_eq!(TraceSettings::traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    }
}
