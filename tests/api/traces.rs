//! OpenTelemetry traces, end to end: drover as a child process configured
//! by the standard `OTEL_*` variables (the tracer is process-wide, and the
//! variables are what operators set), exporting over OTLP/HTTP to a
//! collector of this test's own that decodes every request with
//! `opentelemetry-proto` and keeps the spans.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::{Value, json};

use crate::helpers::{admin_token, client_with_token, metric, wait_for};
use crate::process::Process;

/// One exported span and the `service.name` of the resource it came with.
#[derive(Clone, Debug)]
struct Exported {
    service: String,
    span: Span,
}

impl Exported {
    fn attr(&self, key: &str) -> Option<&Any> {
        attr(&self.span.attributes, key)
    }
    fn str_attr(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            Any::StringValue(s) => Some(s),
            _ => None,
        }
    }
    fn int_attr(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            Any::IntValue(i) => Some(*i),
            Any::StringValue(s) => s.parse().ok(),
            _ => None,
        }
    }
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every string an attribute, event or link of a span carries.
fn strings(span: &Span) -> Vec<String> {
    fn of(v: &AnyValue, out: &mut Vec<String>) {
        match &v.value {
            Some(Any::StringValue(s)) => out.push(s.clone()),
            Some(Any::ArrayValue(a)) => a.values.iter().for_each(|v| of(v, out)),
            Some(Any::KvlistValue(l)) => l.values.iter().filter_map(|kv| kv.value.as_ref()).for_each(|v| of(v, out)),
            Some(other) => out.push(format!("{other:?}")),
            None => {}
        }
    }
    let mut out = vec![span.name.clone()];
    let kvs = span
        .attributes
        .iter()
        .chain(span.events.iter().flat_map(|e| e.attributes.iter()))
        .chain(span.links.iter().flat_map(|l| l.attributes.iter()));
    for kv in kvs {
        out.push(kv.key.clone());
        if let Some(v) = &kv.value {
            of(v, &mut out);
        }
    }
    out.extend(span.events.iter().map(|e| e.name.clone()));
    out
}

/// An OTLP/HTTP (protobuf) trace receiver on loopback.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Collector {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
                    let mut kept = kept.lock().expect("collector lock");
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .as_ref()
                            .and_then(|r| match attr(&r.attributes, "service.name") {
                                Some(Any::StringValue(s)) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                            kept.push(Exported { service: service.clone(), span });
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the collector");
        let url = format!("http://{}", listener.local_addr().expect("collector address"));
        let stop = tokio_util::sync::CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(until.cancelled_owned()).await;
        });
        Self { url, spans, stop }
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().expect("collector lock").clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn traced_drover(dir: &std::path::Path, endpoint: &str) -> Process {
    Process::spawn_env(
        dir,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "drover-under-test"),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test"),
        ],
        &["--runtime", "simulated"],
    )
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// Whether `span` descends from `ancestor` through parent ids among `all`.
fn descends(all: &HashMap<Vec<u8>, &Exported>, span: &Exported, ancestor: &[u8]) -> bool {
    let mut parent = span.span.parent_span_id.clone();
    for _ in 0..32 {
        if parent == ancestor {
            return true;
        }
        match all.get(&parent) {
            Some(p) => parent = p.span.parent_span_id.clone(),
            None => return false,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_created_under_a_traceparent_leads_to_the_pass_it_woke_and_its_engine_calls() {
    let collector = Collector::start().await;
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = traced_drover(dir.path(), &collector.url);
    drover.wait_up().await;
    let token = admin_token(dir.path());
    let client = client_with_token(&token);
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");

    let body = json!({"name": "traced", "replicas": 2, "version": "v1.29.2"});
    let res = client
        .post(format!("{}/v1/pools", drover.addr))
        .header("traceparent", &traceparent)
        .json(&body)
        .send()
        .await
        .expect("creating the pool");
    assert_eq!(res.status(), 201, "{}", drover.output());
    let answered = res.headers().get("traceresponse").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(answered.starts_with(&format!("00-{TRACE_ID}-")), "traceresponse continues the trace: {answered:?}");

    // A problem names the trace, for bug reports.
    let res = client
        .get(format!("{}/v1/pools/nothing-here", drover.addr))
        .header("traceparent", &traceparent)
        .send()
        .await
        .expect("reading a missing pool");
    assert_eq!(res.status(), 404);
    let problem: Value = res.json().await.expect("problem JSON");
    assert_eq!(problem["trace_id"], TRACE_ID, "{problem:#}");

    drover
        .wait_pool(&client, "traced", Duration::from_secs(20), "two ready machines", |p| {
            p["status"]["ready_replicas"] == 2
        })
        .await;

    // The request span, continuing the client's trace.
    let mut request = None;
    wait_for(Duration::from_secs(15), "the POST /v1/pools span at the collector", async || {
        request = collector.spans().into_iter().find(|s| {
            s.span.kind == SpanKind::Server as i32
                && s.str_attr("http.route") == Some("/v1/pools")
                && s.str_attr("http.request.method") == Some("POST")
        });
        request.is_some()
    })
    .await;
    let request = request.expect("found above");
    assert_eq!(request.trace_id(), TRACE_ID);
    assert_eq!(hex(&request.span.parent_span_id), PARENT_ID, "the client's span is the parent");
    assert_eq!(request.int_attr("http.response.status_code"), Some(201));
    assert_eq!(request.span.name, "POST /v1/pools");
    for log_only in ["path", "method", "trace_id"] {
        assert!(request.attr(log_only).is_none(), "the request span exports no {log_only:?}");
    }
    assert!(request.attr("request_id").is_some(), "the request id ties the span to the log lines");
    assert_eq!(request.service, "drover-under-test");

    // The pass it woke: a trace of its own, linked to the request's, and
    // the engine's create of each machine under that pass.
    let mut pass = None;
    wait_for(Duration::from_secs(15), "a pass linked to the request, with two creates", async || {
        let spans = collector.spans();
        let by_id: HashMap<Vec<u8>, &Exported> = spans.iter().map(|s| (s.span.span_id.clone(), s)).collect();
        pass = spans
            .iter()
            .filter(|s| s.span.name == "reconcile pass" && s.str_attr("pool") == Some("traced"))
            .find(|s| s.span.links.iter().any(|l| hex(&l.trace_id) == TRACE_ID))
            .filter(|p| {
                let under = |name: &str| {
                    spans.iter().filter(|s| s.span.name == name && descends(&by_id, s, &p.span.span_id)).count()
                };
                // The simulated engine creates and starts in one call; the
                // starts are the Docker test's below.
                under("engine create") == 2
            })
            .cloned();
        pass.is_some()
    })
    .await;
    let pass = pass.expect("found above");
    let spans = collector.spans();
    let by_id: HashMap<Vec<u8>, &Exported> = spans.iter().map(|s| (s.span.span_id.clone(), s)).collect();
    // The service call under the request (and its handler's span), and
    // the transaction under the service call.
    let service = spans
        .iter()
        .find(|s| s.span.name == "pools.create" && descends(&by_id, s, &request.span.span_id))
        .expect("the service call's span, under the request's");
    let committed = spans.iter().find(|s| {
        s.span.name == "db transaction"
            && s.str_attr("outcome") == Some("committed")
            && descends(&by_id, s, &service.span.span_id)
    });
    // The store the run selected (scripts/test.sh runs the suite on both).
    let system = if crate::postgres::selected() { "postgresql" } else { "sqlite" };
    assert!(committed.is_some_and(|t| t.str_attr("db.system.name") == Some(system)), "the request's transaction");
    let reconcile = spans
        .iter()
        .find(|s| s.span.name == "reconcile" && s.span.parent_span_id == pass.span.span_id)
        .expect("the pass's reconcile span");
    assert_eq!(reconcile.int_attr("pool.generation"), Some(1), "{:?}", reconcile.span.attributes);
    assert_eq!(reconcile.int_attr("plan.create"), Some(2), "{:?}", reconcile.span.attributes);
    let machines = drover.machine_names(&client, "traced").await;
    for create in spans.iter().filter(|s| s.span.name == "engine create" && descends(&by_id, s, &pass.span.span_id)) {
        assert_eq!(create.str_attr("engine.kind"), Some("simulated"));
        assert_eq!(create.str_attr("outcome"), Some("ok"));
        let name = create.str_attr("container.name").unwrap_or_default();
        assert!(machines.contains(name), "{name:?} is one of the pool's machines {machines:?}");
    }

    // Exemplars: a scrape that asks for OpenMetrics leads from a latency
    // bucket to a trace, of a request or of a pass.
    let res = client
        .get(format!("{}/metrics", drover.addr))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .expect("scraping /metrics");
    let kind = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let scraped = res.text().await.expect("metrics text");
    assert!(scraped.ends_with("# EOF\n"), "{scraped}");
    let exemplars = |family: &str| -> Vec<(String, String)> {
        scraped
            .lines()
            .filter(|l| l.starts_with(&format!("{family}_bucket{{")))
            .filter_map(|l| {
                let (labels, exemplar) = l.split_once(" # {trace_id=\"")?;
                Some((labels.to_owned(), exemplar.split('"').next()?.to_owned()))
            })
            .collect()
    };
    assert!(
        exemplars("drover_http_request_duration_seconds")
            .iter()
            .any(|(labels, trace)| labels.contains("method=\"POST\",route=\"/v1/pools\"") && trace == TRACE_ID),
        "the create's bucket names its trace: {scraped}"
    );
    let of_passes = exemplars("drover_reconcile_duration_seconds");
    assert!(!of_passes.is_empty(), "{scraped}");
    // A pass's span reaches the collector up to a second after it ended.
    wait_for(Duration::from_secs(10), "the passes the exemplars name, at the collector", async || {
        let passes: HashSet<String> =
            collector.spans().iter().filter(|s| s.span.name == "reconcile pass").map(Exported::trace_id).collect();
        of_passes.iter().all(|(_, t)| passes.contains(t))
    })
    .await;

    // A token minted and used: its secret is in an answer and a header,
    // never in a span.
    let body = json!({"name": "ci", "grants": [{"namespace": "default", "role": "viewer"}]});
    let made: Value = client
        .post(format!("{}/v1/tokens", drover.addr))
        .json(&body)
        .send()
        .await
        .expect("minting a token")
        .json()
        .await
        .expect("the token JSON");
    let minted = made["token"].as_str().expect("the new token's secret").to_owned();
    let res = client_with_token(&minted).get(format!("{}/v1/pools", drover.addr)).send().await.expect("listing");
    assert_eq!(res.status(), 200);
    wait_for(Duration::from_secs(10), "the span of the minted token's request", async || {
        collector.spans().iter().any(|s| s.span.name == "GET /v1/pools")
    })
    .await;

    // No span carries a secret, whatever it describes.
    for s in &collector.spans() {
        for text in strings(&s.span) {
            assert!(!text.contains(&token), "span {:?} carries the admin token", s.span.name);
            assert!(!text.contains(&minted), "span {:?} carries the minted token", s.span.name);
        }
    }
}

/// A request whose trace the head drops (the client's `traceparent` says
/// not sampled, and the sampler follows parents) exports no span, neither
/// its own nor its children's (the service call, the transactions), which
/// would otherwise be roots of their own under `parentbased_always_on`;
/// it still names its trace in `traceresponse` and in problems. The pass
/// it woke decides for itself and is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_at_the_head_exports_no_span_of_its_own_or_its_childrens() {
    let collector = Collector::start().await;
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = traced_drover(dir.path(), &collector.url);
    drover.wait_up().await;
    let client = client_with_token(&admin_token(dir.path()));
    let dropped = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    let body = json!({"name": "unsampled", "replicas": 1, "version": "v1.29.2"});
    let res = client.post(format!("{}/v1/pools", drover.addr)).header("traceparent", &dropped).json(&body);
    let res = res.send().await.expect("creating the pool");
    assert_eq!(res.status(), 201, "{}", drover.output());
    let answered = res.headers().get("traceresponse").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(answered.starts_with(&format!("00-{TRACE_ID}-")) && answered.ends_with("-00"), "{answered:?}");
    let res = client.get(format!("{}/v1/pools/nothing-here", drover.addr)).header("traceparent", &dropped);
    let problem: Value = res.send().await.expect("reading a missing pool").json().await.expect("problem JSON");
    assert_eq!(problem["trace_id"], TRACE_ID, "{problem:#}");

    // The pass the create woke is a root, kept: once it and a later kept
    // request are at the collector, whatever the dropped ones made is too.
    drover
        .wait_pool(&client, "unsampled", Duration::from_secs(20), "a ready machine", |p| {
            p["status"]["ready_replicas"] == 1
        })
        .await;
    let res = client.get(format!("{}/v1/pools", drover.addr)).send().await.expect("listing pools");
    assert_eq!(res.status(), 200);
    wait_for(Duration::from_secs(15), "the kept request and the pass at the collector", async || {
        let spans = collector.spans();
        spans.iter().any(|s| s.span.name == "GET /v1/pools") && spans.iter().any(|s| s.span.name == "reconcile pass")
    })
    .await;
    let spans = collector.spans();
    let made: Vec<&str> = spans.iter().map(|s| s.span.name.as_str()).collect();
    assert!(spans.iter().all(|s| s.trace_id() != TRACE_ID), "a span of the dropped trace was exported: {made:?}");
    // (The kept GETs of the pool's status above are not the dropped one.)
    for child in ["POST /v1/pools", "create_pool", "pools.create"] {
        assert!(!made.contains(&child), "{child:?} of a dropped request was exported: {made:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_requests_answer_and_dropped_spans_are_counted() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = traced_drover(dir.path(), &format!("http://127.0.0.1:{port}"));
    drover.wait_up().await;
    let client = client_with_token(&admin_token(dir.path()));
    for _ in 0..20 {
        let res = client.get(format!("{}/v1/pools", drover.addr)).send().await.expect("listing pools");
        assert_eq!(res.status(), 200);
    }
    let metrics = format!("{}/metrics", drover.addr);
    wait_for(Duration::from_secs(15), "drover_trace_spans_dropped to count the lost spans", async || {
        let text = client.get(&metrics).send().await.expect("/metrics").text().await.unwrap_or_default();
        metric(&text, "drover_trace_spans_dropped") >= 20.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_over_grpc_is_refused_at_startup_with_the_reason() {
    let dir = tempfile::TempDir::new().expect("data dir");
    let mut drover = Process::spawn_env(
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
        &["--runtime", "simulated"],
    );
    let status = drover.wait_exit(Duration::from_secs(20)).await.expect("drover exits");
    assert!(!status.success());
    assert!(drover.output().contains("gRPC is not supported"), "{}", drover.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_id_ratio_sampler_keeps_its_share_of_1000_requests() {
    let collector = Collector::start().await;
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = Process::spawn_env(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str()),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ],
        &["--runtime", "simulated"],
    );
    drover.wait_up().await;
    let client = client_with_token(&admin_token(dir.path()));
    for _ in 0..1000 {
        let res = client.get(format!("{}/v1/pools", drover.addr)).send().await.expect("listing pools");
        assert_eq!(res.status(), 200);
    }
    let listed = |spans: &[Exported]| {
        spans.iter().filter(|s| s.str_attr("http.route") == Some("/v1/pools") && s.span.name == "GET /v1/pools").count()
    };
    // 250 expected; the binomial's standard deviation is about 14, so
    // five of them either way fail only on a broken sampler. Export is
    // once a second, so wait until the count settles.
    let mut last = usize::MAX;
    wait_for(Duration::from_secs(15), "the sampled spans to stop arriving", async || {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = listed(&collector.spans());
        std::mem::replace(&mut last, now) == now && now > 0
    })
    .await;
    assert!((180..=320).contains(&last), "{last} of 1000 requests sampled at 0.25");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_job_exports_its_steps_with_their_kubernetes_calls_and_never_the_cluster_token() {
    use crate::kube_sim::{KubeSim, SimSettings};
    use crate::upgrade_env::{CLUSTER, FROM, SIM_TOKEN};
    let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
    sim.seed_control_plane(FROM);
    let collector = Collector::start().await;
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = Process::spawn_env(
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())],
        &[
            "--runtime",
            "simulated",
            "--upgrade-retry-backoff",
            "5ms",
            "--upgrade-wait-timeout",
            "4s",
            "--upgrade-poll-interval",
            "15ms",
        ],
    );
    drover.wait_up().await;
    let client = client_with_token(&admin_token(dir.path()));
    let at = |path: &str| format!("{}{path}", drover.addr);
    let body = json!({"name": CLUSTER, "server": sim.url(), "token": SIM_TOKEN});
    assert_eq!(client.post(at("/v1/clusters")).json(&body).send().await.expect("registering").status(), 201);
    let res = client.post(at(&format!("/v1/clusters/{CLUSTER}/upgrades"))).json(&json!({"version": "v1.30.0"})).send();
    let job: Value = res.await.expect("starting the upgrade").json().await.expect("job JSON");
    let url = at(&format!("/v1/upgrades/{}", job["id"]));
    let mut state = Value::Null;
    wait_for(Duration::from_secs(60), "the upgrade job to end", async || {
        let job: Value = client.get(&url).send().await.expect("reading the job").json().await.unwrap_or_default();
        state = job["state"].clone();
        !matches!(state.as_str(), Some("pending" | "running"))
    })
    .await;
    assert_eq!(state, "succeeded", "{}", drover.output());

    // The job's span, its steps below it, and Kubernetes calls below the steps.
    wait_for(Duration::from_secs(15), "the job's steps and their Kubernetes calls at the collector", async || {
        let spans = collector.spans();
        let by_id: HashMap<Vec<u8>, &Exported> = spans.iter().map(|s| (s.span.span_id.clone(), s)).collect();
        let Some(job) = spans.iter().find(|s| s.span.name == "upgrade job") else { return false };
        let steps: Vec<&Exported> =
            spans.iter().filter(|s| s.span.name == "upgrade step" && descends(&by_id, s, &job.span.span_id)).collect();
        let calls = spans
            .iter()
            .filter(|s| s.span.name == "kubernetes call")
            .filter(|c| steps.iter().any(|st| descends(&by_id, c, &st.span.span_id)))
            .count();
        // Eight steps for each of the three components.
        steps.len() >= 24 && calls >= 24
    })
    .await;
    for s in collector.spans() {
        for text in strings(&s.span) {
            assert!(!text.contains(SIM_TOKEN), "span {:?} carries the cluster's token", s.span.name);
        }
    }
}

/// One story across replicas: a rolling update accepted by replica A of a
/// pool replica B drives. B's pass links to A's request (the row notice of
/// A's commit carries its trace context), and the new machines' creates
/// are under that pass; the old machines' removals follow on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_across_replicas_links_the_drivers_pass_to_the_request() {
    use crate::rig::{LIMIT, Replica, names_split, patch, token};
    let collector = Collector::start().await;
    let db = crate::rig::database();
    let a = Replica::start(&db, false, &["--otlp-endpoint", &collector.url, "--otel-service-name", "replica-a"]).await;
    let b = Replica::start(&db, false, &["--otlp-endpoint", &collector.url, "--otel-service-name", "replica-b"]).await;
    let client = client_with_token(&token(&[&a, &b]));
    let (_, of_b) = names_split(&client, &a, &b, "xr", 2).await;
    let name = of_b[0].clone();
    let spec = json!({"name": name, "replicas": 2, "version": "v1.29.2", "image": "sim/node:1"});
    assert_eq!(client.post(a.url("/v1/pools")).json(&spec).send().await.expect("creating").status(), 201);
    let before = a
        .proc
        .wait_pool(&client, &name, LIMIT, "two ready machines, driven by b", |p| {
            p["status"]["ready_replicas"] == 2 && b.is(&p["status"]["driver"])
        })
        .await;
    let old = a.proc.machine_names(&client, &name).await;
    assert_eq!(old.len(), 2, "{before:#}");

    const ROLLOUT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let res = patch(&client, a.url(&format!("/v1/pools/{name}")), json!({"image": "sim/node:2"}))
        .header("traceparent", format!("00-{ROLLOUT_TRACE}-{PARENT_ID}-01"))
        .send()
        .await
        .expect("updating the image through a");
    assert_eq!(res.status(), 200, "{}", a.proc.output());
    a.proc
        .wait_pool(&client, &name, LIMIT, "the rollout to finish", |p| {
            p["status"]["updated_replicas"] == 2 && p["status"]["ready_replicas"] == 2 && p["status"]["replicas"] == 2
        })
        .await;

    wait_for(
        Duration::from_secs(20),
        "a's request, and b's pass linked to it with the new machines' creates",
        async || {
            let spans = collector.spans();
            let by_id: HashMap<Vec<u8>, &Exported> = spans.iter().map(|s| (s.span.span_id.clone(), s)).collect();
            let request = spans.iter().any(|s| {
                s.service == "replica-a" && s.span.name == "PATCH /v1/pools/{name}" && s.trace_id() == ROLLOUT_TRACE
            });
            let linked: Vec<&Exported> = spans
                .iter()
                .filter(|s| {
                    s.service == "replica-b" && s.span.name == "reconcile pass" && s.str_attr("pool") == Some(&name)
                })
                .filter(|s| s.span.links.iter().any(|l| hex(&l.trace_id) == ROLLOUT_TRACE))
                .collect();
            let creates = spans
                .iter()
                .filter(|s| s.span.name == "engine create" && s.str_attr("outcome") == Some("ok"))
                .filter(|s| linked.iter().any(|p| descends(&by_id, s, &p.span.span_id)))
                .count();
            request && creates >= 1
        },
    )
    .await;
    // A's side of the story stays on A: it drove nothing of the pool.
    let spans = collector.spans();
    assert!(
        !spans.iter().any(|s| s.service == "replica-a" && s.span.name == "engine create"),
        "replica a created no machine"
    );
    // The old machines went, each by an engine call of b.
    let mut removed = HashSet::new();
    wait_for(Duration::from_secs(20), "b's removals of the old machines at the collector", async || {
        removed = collector
            .spans()
            .iter()
            .filter(|s| {
                s.service == "replica-b" && s.span.name == "engine remove" && s.str_attr("outcome") == Some("ok")
            })
            .filter_map(|s| s.str_attr("container.name").map(str::to_owned))
            .collect();
        old.is_subset(&removed)
    })
    .await;
}

/// On the Docker engine, where a machine is created and then started: the
/// pass a create woke holds each machine's create and start (the starts
/// run in the background, still in the pass's trace), and a removal holds
/// the stop of its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn on_docker_the_pass_holds_each_machines_create_and_start_and_a_removal_its_stop() {
    use crate::docker::{Cleanup, V1, require_docker};
    require_docker();
    let pool = crate::helpers::unique("traced-docker");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let collector = Collector::start().await;
    let dir = tempfile::TempDir::new().expect("data dir");
    let drover = Process::spawn_env(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())], &[]);
    drover.wait_up().await;
    let client = client_with_token(&admin_token(dir.path()));
    let spec = json!({"name": pool, "replicas": 2, "version": V1});
    let res = client.post(format!("{}/v1/pools", drover.addr)).json(&spec).send().await.expect("creating");
    assert_eq!(res.status(), 201, "{}", drover.output());
    let trace = res.headers().get("traceresponse").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let trace = trace.split('-').nth(1).expect("a traceresponse").to_owned();
    drover
        .wait_pool(&client, &pool, Duration::from_secs(60), "two ready machines", |p| {
            p["status"]["ready_replicas"] == 2
        })
        .await;
    let machines = drover.machine_names(&client, &pool).await;

    wait_for(Duration::from_secs(15), "the pass the create woke, with two creates and two starts", async || {
        let spans = collector.spans();
        let by_id: HashMap<Vec<u8>, &Exported> = spans.iter().map(|s| (s.span.span_id.clone(), s)).collect();
        spans
            .iter()
            .filter(|s| s.span.name == "reconcile pass" && s.span.links.iter().any(|l| hex(&l.trace_id) == trace))
            .any(|pass| {
                let under = |name: &str| -> HashSet<String> {
                    spans
                        .iter()
                        .filter(|s| s.span.name == name && descends(&by_id, s, &pass.span.span_id))
                        .filter(|s| s.str_attr("engine.kind") == Some("docker") && s.str_attr("outcome") == Some("ok"))
                        .filter_map(|s| s.str_attr("container.name").map(str::to_owned))
                        .collect()
                };
                under("engine create") == machines && under("engine start") == machines
            })
    })
    .await;

    let res = client
        .patch(format!("{}/v1/pools/{pool}", drover.addr))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"replicas": 0}).to_string())
        .send()
        .await
        .expect("scaling to 0");
    assert_eq!(res.status(), 200);
    wait_for(Duration::from_secs(60), "each machine's removal, with the stop under it", async || {
        let spans = collector.spans();
        let removed: Vec<&Exported> = spans
            .iter()
            .filter(|s| s.span.name == "engine remove" && s.str_attr("outcome") == Some("ok"))
            .filter(|s| s.str_attr("container.name").is_some_and(|n| machines.contains(n)))
            .collect();
        removed.len() == 2
            && removed
                .iter()
                .all(|r| spans.iter().any(|s| s.span.name == "engine stop" && s.span.parent_span_id == r.span.span_id))
    })
    .await;
}
