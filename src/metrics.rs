//! Prometheus metrics: counters and histograms the code records as it
//! works, plus gauges read from the store when `/metrics` is scraped (so
//! they are right after a restart, and cost nothing between scrapes).
//!
//! A small registry of our own rather than a global recorder: each server
//! (and each test's server) has its own, passed around like the database.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Upper bounds of the duration histograms, in seconds.
const BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

type Labels = Vec<(&'static str, String)>;

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Registry {
    counters: BTreeMap<(&'static str, Labels), u64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

impl Metrics {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain numbers behind; they
        // are still worth serving.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn inc(&self, name: &'static str, pairs: &[(&'static str, &str)]) {
        *self.registry().counters.entry((name, labels(pairs))).or_default() += 1;
    }

    pub fn observe(&self, name: &'static str, pairs: &[(&'static str, &str)], took: Duration) {
        let secs = took.as_secs_f64();
        let mut reg = self.registry();
        let h = reg.histograms.entry((name, labels(pairs))).or_default();
        if h.counts.is_empty() {
            h.counts = vec![0; BUCKETS.len()];
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    /// The recorded counters and histograms in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let reg = self.registry();
        let mut last = "";
        for ((name, l), v) in &reg.counters {
            if *name != last {
                header(out, name, "counter");
                last = name;
            }
            let _ = writeln!(out, "{name}{} {v}", fmt_labels(l, None));
        }
        for ((name, l), h) in &reg.histograms {
            if *name != last {
                header(out, name, "histogram");
                last = name;
            }
            for (bound, n) in BUCKETS.iter().zip(&h.counts) {
                let _ = writeln!(out, "{name}_bucket{} {n}", fmt_labels(l, Some(&bound.to_string())));
            }
            let _ = writeln!(out, "{name}_bucket{} {}", fmt_labels(l, Some("+Inf")), h.count);
            let _ = writeln!(out, "{name}_sum{} {}", fmt_labels(l, None), h.sum);
            let _ = writeln!(out, "{name}_count{} {}", fmt_labels(l, None), h.count);
        }
    }
}

/// One gauge family, for the scrape-time values.
pub fn gauge(out: &mut String, name: &'static str, samples: &[(Labels, f64)]) {
    header(out, name, "gauge");
    for (l, v) in samples {
        let _ = writeln!(out, "{name}{} {v}", fmt_labels(l, None));
    }
}

fn header(out: &mut String, name: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", help(name));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn help(name: &str) -> &'static str {
    match name {
        "drover_http_requests_total" => "HTTP requests answered, by method, route and status.",
        "drover_http_request_duration_seconds" => "Time to answer HTTP requests, by method and route.",
        "drover_reconcile_passes_total" => "Reconcile passes, by pool and outcome.",
        "drover_reconcile_duration_seconds" => "Duration of reconcile passes, by pool.",
        "drover_runtime_calls_total" => "Container runtime (Docker) calls, by operation and result.",
        "drover_kube_calls_total" => "Kubernetes API calls (each try), by operation and result.",
        "drover_machines" => "Machines, by pool and state.",
        "drover_pool_replicas_desired" => "The replicas each pool asks for.",
        "drover_rollout_updated_machines" => "Machines running the pool's desired image.",
        "drover_rollout_outdated_machines" => "Machines still running another image.",
        "drover_upgrade_jobs" => "Upgrade jobs, by state.",
        "drover_upgrade_step_duration_seconds_sum" => "Total time of finished upgrade steps, by step.",
        "drover_upgrade_step_duration_seconds_count" => "Finished upgrade steps, by step.",
        _ => "drover metric.",
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn fmt_labels(l: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = l.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() { String::new() } else { format!("{{{}}}", parts.join(",")) }
}

pub fn pairs(l: &[(&'static str, &str)]) -> Labels {
    labels(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.inc("drover_http_requests_total", &[("method", "GET"), ("route", "/v1/pools"), ("status", "200")]);
        m.inc("drover_http_requests_total", &[("method", "GET"), ("route", "/v1/pools"), ("status", "200")]);
        m.observe("drover_reconcile_duration_seconds", &[("pool", "a\"b")], Duration::from_millis(30));
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("# TYPE drover_http_requests_total counter"));
        assert!(out.contains("drover_http_requests_total{method=\"GET\",route=\"/v1/pools\",status=\"200\"} 2"));
        assert!(out.contains("drover_reconcile_duration_seconds_bucket{pool=\"a\\\"b\",le=\"0.05\"} 1"));
        assert!(out.contains("drover_reconcile_duration_seconds_bucket{pool=\"a\\\"b\",le=\"0.025\"} 0"));
        assert!(out.contains("drover_reconcile_duration_seconds_count{pool=\"a\\\"b\"} 1"));
    }
}
