//! A pool's spec and the rules it must satisfy. A `PoolSpec` exists only
//! once its rules have passed: its fields are private, and every way to
//! make one (a new pool, a patch, a scale, a rollback's target, a row read
//! back from the store) goes through [`PoolSpec::parse`].

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::document::{PoolSpecInput, PoolSpecView};
use super::host::{SpecLimits, check_mounts};
use crate::domain::ValidationErrors;
use crate::domain::image::check_image_reference;
use crate::domain::names::check_dns_label;
use crate::domain::strategy::RolloutStrategy;
use crate::domain::version::{KubeVersion, node_image};

pub use crate::domain::labels::RESERVED_LABEL_PREFIX;
pub const MAX_MOUNTS: usize = 64;
pub const MAX_FAILURE_DOMAINS: usize = 64;
/// Longest duration setting: one day.
pub const MAX_SECONDS: i64 = 86_400;

/// Five minutes: long enough for a slow node image to boot and pass its
/// health check (kind nodes take 10-60 s), short enough that a machine hung
/// in start-up is replaced well within a rollout's progress deadline (600 s).
pub const DEFAULT_MACHINE_READY_TIMEOUT_SECONDS: u32 = 300;

pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;

/// A host path bind-mounted into every machine of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Absolute path inside the container; no `,` or `:`.
    #[schema(pattern = "^/[^,:]*$")]
    pub container_path: String,
    /// Absolute path on the Docker host, without `..`, inside a directory
    /// the server allows mounting from; no `,` or `:`.
    #[schema(pattern = "^/[^,:]*$")]
    pub host_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// What a pool should look like: its document as the API shows it and the
/// store keeps it ([`PoolSpecView`], every default filled in), once every
/// rule has passed; the field docs are `PoolSpecInput`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    doc: PoolSpecView,
    /// `doc.version`, parsed.
    version: KubeVersion,
}

impl PoolSpec {
    /// Checks every rule and returns the spec, or every broken rule.
    pub fn parse(input: PoolSpecInput, limits: &SpecLimits) -> Result<Self, ValidationErrors> {
        parse(input, limits)
    }

    /// A spec read back from the store. It passed the settings of its day
    /// (today's are checked on every pass), so only the rules that do not
    /// come from settings apply; a stored spec that breaks one is corrupt.
    pub fn from_stored(input: PoolSpecInput) -> Result<Self, ValidationErrors> {
        parse(input, &SpecLimits::unrestricted())
    }

    /// This spec with `replicas` changed, by the same rules as any spec.
    pub fn with_replicas(&self, replicas: i64, limits: &SpecLimits) -> Result<Self, ValidationErrors> {
        self.patched(&serde_json::json!({ "replicas": replicas }), limits)
    }

    /// This spec with a JSON merge patch (RFC 7396) applied to its
    /// document: a field left out keeps its value, `null` takes it back to
    /// its default, maps merge key by key, lists are replaced. The merged
    /// document is read as new input and checked by every rule.
    pub fn patched(&self, patch: &Value, limits: &SpecLimits) -> Result<Self, ValidationErrors> {
        let mut document = self.doc.to_json();
        json_patch::merge(&mut document, patch);
        parse(crate::domain::json::document(document)?, limits)
    }

    /// The spec as the API shows it and the store keeps it: every field,
    /// read as `spec.doc().field`.
    pub fn doc(&self) -> &PoolSpecView {
        &self.doc
    }

    /// The spec's document, owned.
    pub fn view(&self) -> PoolSpecView {
        self.doc.clone()
    }

    /// Desired number of machines.
    pub fn replicas(&self) -> u32 {
        self.doc.replicas
    }

    pub fn version(&self) -> KubeVersion {
        self.version
    }

    /// The custom image, when one is set.
    pub fn image(&self) -> Option<&str> {
        self.doc.image.as_deref()
    }

    pub fn failure_domains(&self) -> &[String] {
        &self.doc.failure_domains
    }

    pub fn extra_mounts(&self) -> &[Mount] {
        &self.doc.extra_mounts
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.doc.labels
    }

    pub fn strategy(&self) -> &RolloutStrategy {
        &self.doc.strategy
    }

    pub fn paused(&self) -> bool {
        self.doc.paused
    }

    pub fn cluster(&self) -> Option<&str> {
        self.doc.cluster.as_deref()
    }

    pub fn engines(&self) -> &[String] {
        &self.doc.engines
    }

    pub fn engine_selector(&self) -> &BTreeMap<String, String> {
        &self.doc.engine_selector
    }

    pub fn min_ready_seconds(&self) -> u32 {
        self.doc.min_ready_seconds
    }

    pub fn progress_deadline_seconds(&self) -> u32 {
        self.doc.progress_deadline_seconds
    }

    pub fn machine_ready_timeout_seconds(&self) -> u32 {
        self.doc.machine_ready_timeout_seconds
    }

    /// The time a deleted machine gets to stop, when the pool sets one.
    pub fn stop_grace_period_seconds(&self) -> Option<u32> {
        self.doc.stop_grace_period_seconds
    }

    /// May the pool's machines run on this engine (by the pool's placement;
    /// draining is the engine's business)?
    pub fn places_on(&self, engine: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.doc.engines.is_empty() || self.doc.engines.iter().any(|e| e == engine))
            && crate::domain::labels::matches(&self.doc.engine_selector, labels)
    }

    /// The image every machine should run: the custom image when set,
    /// otherwise the version's node image.
    pub fn desired_image(&self) -> String {
        self.doc.image.clone().unwrap_or_else(|| node_image(self.version))
    }
}

/// One line naming what changed between two specs, for the event log:
/// each field of their documents that differs, a value with its old and
/// new value, a list or a map by its name.
pub fn describe_change(old: &PoolSpec, new: &PoolSpec) -> String {
    let (Value::Object(old), Value::Object(new)) = (old.view().to_json(), new.view().to_json()) else {
        return "spec changed".to_owned();
    };
    let changed: Vec<String> = old
        .iter()
        .filter_map(|(field, before)| {
            let after = new.get(field).unwrap_or(&Value::Null);
            let scalar = |v: &Value| !matches!(v, Value::Array(_) | Value::Object(_));
            match (before == after, scalar(before) && scalar(after)) {
                (true, _) => None,
                (false, true) => Some(format!("{field}: {before} -> {after}")),
                (false, false) => Some(field.clone()),
            }
        })
        .collect();
    format!("spec changed ({})", changed.join(", "))
}

fn parse(input: PoolSpecInput, limits: &SpecLimits) -> Result<PoolSpec, ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let PoolSpecInput {
        replicas,
        version,
        image,
        failure_domains,
        extra_mounts,
        labels,
        strategy,
        paused,
        cluster,
        engines,
        engine_selector,
        min_ready_seconds,
        progress_deadline_seconds,
        machine_ready_timeout_seconds,
        stop_grace_period_seconds,
    } = input;

    let replicas_in = replicas;
    let replicas = match u32::try_from(replicas_in) {
        Ok(r) if r <= limits.max_replicas => r,
        _ => {
            errs.push(
                "replicas",
                "range",
                format!("must be between 0 and {} (got {replicas_in})", limits.max_replicas),
            );
            0
        }
    };
    let parsed = version.parse::<KubeVersion>();
    let version = parsed.clone().unwrap_or_else(|e| {
        errs.push("version", "version", e);
        KubeVersion { major: 0, minor: 0, patch: 0 }
    });
    match (image.as_deref().map(check_image_reference), &parsed) {
        (Some(Err(e)), _) => errs.push("image", "image_reference", e),
        // No image can be named while the version it would come from is bad.
        (None, Err(_)) => {}
        (Some(Ok(())), _) | (None, Ok(_)) => {
            let desired = image.clone().unwrap_or_else(|| node_image(version));
            let field = if image.is_some() { "image" } else { "version" };
            limits.host.check_image(&desired, field, &mut errs);
        }
    }
    check_failure_domains(&failure_domains, &mut errs);
    check_mounts(&extra_mounts, &limits.host, &mut errs);
    crate::domain::labels::check(&labels, "labels", &mut errs);
    let strategy = strategy.unwrap_or_default().resolve();
    let mut seconds = |field: &str, v: Option<i64>, min: i64| -> Option<u32> {
        let v = v?;
        if (min..=MAX_SECONDS).contains(&v) {
            u32::try_from(v).ok()
        } else {
            errs.push(field, "range", format!("must be between {min} and {MAX_SECONDS} seconds (got {v})"));
            None
        }
    };
    let min_ready_seconds = seconds("min_ready_seconds", min_ready_seconds, 0).unwrap_or(0);
    let progress_deadline_seconds =
        seconds("progress_deadline_seconds", progress_deadline_seconds, 1).unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    let machine_ready_timeout_seconds = seconds("machine_ready_timeout_seconds", machine_ready_timeout_seconds, 1)
        .unwrap_or(DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
    let stop_grace_period_seconds = seconds("stop_grace_period_seconds", stop_grace_period_seconds, 0);
    if progress_deadline_seconds <= min_ready_seconds {
        errs.push(
            "progress_deadline_seconds",
            "greater_than_min_ready",
            "must be greater than min_ready_seconds, or no rollout could ever show progress in time",
        );
    }
    if strategy.max_surge.is_zero() && strategy.max_unavailable.is_zero() {
        errs.push(
            "strategy",
            "strategy_bounds",
            "max_surge and max_unavailable must not both be zero, or no machine could ever be replaced",
        );
    }
    if let Some(Err(e)) = cluster.as_deref().map(check_dns_label) {
        errs.push("cluster", "dns_label", e);
    }
    check_placement(&engines, &engine_selector, &mut errs);

    let doc = PoolSpecView {
        replicas,
        version: version.to_string(),
        image,
        failure_domains,
        extra_mounts,
        labels,
        strategy,
        paused,
        cluster,
        engines,
        engine_selector,
        min_ready_seconds,
        progress_deadline_seconds,
        machine_ready_timeout_seconds,
        stop_grace_period_seconds,
    };
    errs.into_result(PoolSpec { doc, version })
}

/// Engines by name or by labels, not both: one way to read a placement.
fn check_placement(engines: &[String], selector: &BTreeMap<String, String>, errs: &mut ValidationErrors) {
    if engines.len() > MAX_FAILURE_DOMAINS {
        errs.push("engines", "max_items", format!("at most {MAX_FAILURE_DOMAINS} engines"));
    }
    let mut seen = HashSet::new();
    for (i, e) in engines.iter().enumerate() {
        if let Err(why) = check_dns_label(e) {
            errs.push(format!("engines[{i}]"), "dns_label", why);
        } else if !seen.insert(e.as_str()) {
            errs.push(format!("engines[{i}]"), "unique", format!("duplicate engine {e:?}"));
        }
    }
    crate::domain::labels::check(selector, "engine_selector", errs);
    if !engines.is_empty() && !selector.is_empty() {
        errs.push("engine_selector", "one_placement", "name the engines or select them by labels, not both");
    }
}

fn check_failure_domains(domains: &[String], errs: &mut ValidationErrors) {
    if domains.len() > MAX_FAILURE_DOMAINS {
        errs.push("failure_domains", "max_items", format!("at most {MAX_FAILURE_DOMAINS} failure domains"));
    }
    let mut seen = HashSet::new();
    for (i, d) in domains.iter().enumerate() {
        let field = format!("failure_domains[{i}]");
        if d.is_empty() {
            errs.push(field, "non_empty", "must not be empty");
        } else if !crate::domain::labels::is_label_value(d) {
            errs.push(
                field,
                "label_value",
                "must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            );
        } else if !seen.insert(d.as_str()) {
            errs.push(field, "unique", format!("duplicate failure domain {d:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::pool::{HostPolicy, StrategyInput};
    use crate::domain::strategy::{IntOrPercent, ReplacementPolicy};

    fn raw() -> PoolSpecInput {
        PoolSpecInput::minimal(3, "v1.29.2")
    }

    fn validate(input: PoolSpecInput, limits: &SpecLimits) -> Result<PoolSpec, ValidationErrors> {
        PoolSpec::parse(input, limits)
    }

    fn fields(r: Result<PoolSpec, ValidationErrors>) -> Vec<(String, &'static str)> {
        r.expect_err("spec was accepted")
            .0
            .into_iter()
            .map(|e| (e.static_rule(), e.field))
            .map(|(r, f)| (f, r))
            .collect()
    }

    #[test]
    fn a_minimal_spec_gets_the_defaults() {
        let spec = validate(raw(), &SpecLimits::default()).unwrap();
        assert_eq!(*spec.strategy(), RolloutStrategy::default());
        assert_eq!(spec.desired_image(), "kindest/node:v1.29.2");
        let spec = validate(PoolSpecInput { image: Some("app:1".into()), ..raw() }, &SpecLimits::default()).unwrap();
        assert_eq!(spec.desired_image(), "app:1");
    }

    #[test]
    fn replicas_edges() {
        let limits = &SpecLimits { max_replicas: 1000, ..SpecLimits::default() };
        for ok in [0, 1, 1000] {
            assert!(validate(PoolSpecInput { replicas: ok, ..raw() }, limits).is_ok(), "{ok}");
        }
        for bad in [-1, 1001, i64::MAX, i64::MIN] {
            assert_eq!(
                fields(validate(PoolSpecInput { replicas: bad, ..raw() }, limits)),
                [("replicas".into(), "range")]
            );
        }
        let small = &SpecLimits { max_replicas: 5, ..SpecLimits::default() };
        assert!(validate(PoolSpecInput { replicas: 6, ..raw() }, small).is_err());
    }

    #[test]
    fn version_and_image_are_checked() {
        let r = validate(
            PoolSpecInput { version: "1.29".into(), image: Some("Bad Image".into()), ..raw() },
            &SpecLimits::default(),
        );
        assert_eq!(fields(r), [("version".into(), "version"), ("image".into(), "image_reference")]);
    }

    #[test]
    fn failure_domains_must_be_unique_and_non_empty() {
        let fd = |v: &[&str]| PoolSpecInput { failure_domains: v.iter().map(|s| s.to_string()).collect(), ..raw() };
        assert!(validate(fd(&["a", "b", "zone-1.x_y"]), &SpecLimits::default()).is_ok());
        assert_eq!(
            fields(validate(fd(&["a", ""]), &SpecLimits::default())),
            [("failure_domains[1]".into(), "non_empty")]
        );
        assert_eq!(
            fields(validate(fd(&["a", "b", "a"]), &SpecLimits::default())),
            [("failure_domains[2]".into(), "unique")]
        );
        assert_eq!(
            fields(validate(fd(&["-a"]), &SpecLimits::default())),
            [("failure_domains[0]".into(), "label_value")]
        );
        assert_eq!(
            fields(validate(fd(&[&"a".repeat(64)]), &SpecLimits::default())),
            [("failure_domains[0]".into(), "label_value")]
        );
    }

    #[test]
    fn mounts_must_be_absolute_and_distinct() {
        let m = |c: &str, h: &str| Mount { container_path: c.into(), host_path: h.into(), read_only: false };
        let spec = |ms: Vec<Mount>| PoolSpecInput { extra_mounts: ms, ..raw() };
        let srv = &SpecLimits { host: HostPolicy::new(&["/srv".into()], &["*".into()], &[]), ..SpecLimits::default() };
        assert!(validate(spec(vec![m("/data", "/srv/data")]), srv).is_ok());
        assert_eq!(
            fields(validate(spec(vec![m("/d", "/srv/../etc")]), srv)),
            [("extra_mounts[0].host_path".into(), "parent_reference")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("data", "/srv")]), &SpecLimits::default())),
            [("extra_mounts[0].container_path".into(), "absolute_path")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/data", "./srv")]), &SpecLimits::default())),
            [("extra_mounts[0].host_path".into(), "absolute_path")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/a:b", "/srv")]), srv)),
            [("extra_mounts[0].container_path".into(), "path_chars")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/d", "/srv/a"), m("/d", "/srv/b")]), srv)),
            [("extra_mounts[1].container_path".into(), "unique")]
        );
    }

    #[test]
    fn labels_follow_kubernetes_rules_and_keep_drover_prefix_reserved() {
        let l = |k: &str, v: &str| PoolSpecInput { labels: [(k.to_string(), v.to_string())].into(), ..raw() };
        assert!(validate(l("team", "infra"), &SpecLimits::default()).is_ok());
        assert!(validate(l("example.com/tier", ""), &SpecLimits::default()).is_ok());
        assert_eq!(
            fields(validate(l("drover.dev/pool", "x"), &SpecLimits::default())),
            [("labels.drover.dev/pool".into(), "reserved_label")]
        );
        assert_eq!(
            fields(validate(l("bad key", "x"), &SpecLimits::default())),
            [("labels.bad key".into(), "label_key")]
        );
        assert_eq!(fields(validate(l("/x", "x"), &SpecLimits::default())), [("labels./x".into(), "label_key")]);
        assert_eq!(fields(validate(l("k", "-v"), &SpecLimits::default())), [("labels.k".into(), "label_value")]);
    }

    #[test]
    fn strategy_with_both_bounds_zero_is_refused() {
        let strategy = |max_surge, max_unavailable| PoolSpecInput {
            strategy: Some(StrategyInput {
                max_surge: Some(max_surge),
                max_unavailable: Some(max_unavailable),
                ..Default::default()
            }),
            ..raw()
        };
        let s = strategy(IntOrPercent::Count(0), IntOrPercent::Percent(0));
        assert_eq!(fields(validate(s, &SpecLimits::default())), [("strategy".into(), "strategy_bounds")]);
        let seed = strategy(IntOrPercent::Percent(100), IntOrPercent::Count(0));
        assert!(validate(seed, &SpecLimits::default()).is_ok());
    }

    #[test]
    fn durations_have_ranges_and_the_deadline_exceeds_min_ready() {
        let ok = PoolSpecInput {
            min_ready_seconds: Some(5),
            progress_deadline_seconds: Some(6),
            machine_ready_timeout_seconds: Some(1),
            ..raw()
        };
        let spec = validate(ok, &SpecLimits::default()).unwrap();
        assert_eq!(
            (spec.min_ready_seconds(), spec.progress_deadline_seconds(), spec.machine_ready_timeout_seconds()),
            (5, 6, 1)
        );
        let d = validate(raw(), &SpecLimits::default()).unwrap();
        assert_eq!(
            (d.min_ready_seconds(), d.progress_deadline_seconds(), d.machine_ready_timeout_seconds()),
            (0, 600, 300)
        );
        let r = |s: PoolSpecInput| fields(validate(s, &SpecLimits::default()));
        assert_eq!(r(PoolSpecInput { min_ready_seconds: Some(-1), ..raw() }), [("min_ready_seconds".into(), "range")]);
        assert_eq!(
            r(PoolSpecInput { progress_deadline_seconds: Some(0), ..raw() }),
            [("progress_deadline_seconds".into(), "range")]
        );
        assert_eq!(
            r(PoolSpecInput { machine_ready_timeout_seconds: Some(86_401), ..raw() }),
            [("machine_ready_timeout_seconds".into(), "range")]
        );
        assert_eq!(
            r(PoolSpecInput { min_ready_seconds: Some(60), progress_deadline_seconds: Some(60), ..raw() }),
            [("progress_deadline_seconds".into(), "greater_than_min_ready")]
        );
    }

    #[test]
    fn a_stop_grace_period_is_the_server_s_unless_set_and_has_a_range() {
        assert_eq!(validate(raw(), &SpecLimits::default()).unwrap().stop_grace_period_seconds(), None);
        for ok in [0, 1, 86_400] {
            let spec = validate(PoolSpecInput { stop_grace_period_seconds: Some(ok), ..raw() }, &SpecLimits::default());
            assert_eq!(spec.unwrap().stop_grace_period_seconds(), Some(ok as u32));
        }
        for bad in [-1, 86_401] {
            let r = validate(PoolSpecInput { stop_grace_period_seconds: Some(bad), ..raw() }, &SpecLimits::default());
            assert_eq!(fields(r), [("stop_grace_period_seconds".into(), "range")]);
        }
    }

    #[test]
    fn a_spec_turned_back_into_input_validates_to_itself() {
        let rich = PoolSpecInput {
            image: Some("app:1".into()),
            failure_domains: vec!["a".into(), "b".into()],
            labels: [("team".to_owned(), "infra".to_owned())].into(),
            strategy: Some(StrategyInput {
                max_surge: Some(IntOrPercent::Percent(25)),
                batch_approval: true,
                replacement: Some(ReplacementPolicy::TerminationComplete),
                ..Default::default()
            }),
            paused: true,
            min_ready_seconds: Some(3),
            machine_ready_timeout_seconds: Some(60),
            engines: vec!["local".into()],
            ..raw()
        };
        let spec = validate(rich, &SpecLimits::default()).unwrap();
        let document: PoolSpecInput = crate::domain::json::document(spec.view().to_json()).unwrap();
        assert_eq!(validate(document, &SpecLimits::default()).unwrap(), spec);
        assert_eq!(PoolSpec::from_stored(crate::domain::json::document(spec.view().to_json()).unwrap()).unwrap(), spec);
    }

    #[test]
    fn a_stored_document_from_the_first_release_still_reads() {
        let old = serde_json::json!({"replicas": 2, "version": "v1.29.2", "image": null, "failure_domains": [],
            "extra_mounts": [], "labels": {}, "strategy": {"max_surge": 1, "max_unavailable": 0}, "paused": false,
            "cluster": null, "machine_ready_timeout_seconds": null});
        let spec = PoolSpec::from_stored(crate::domain::json::document(old).unwrap()).unwrap();
        assert_eq!(spec.progress_deadline_seconds(), DEFAULT_PROGRESS_DEADLINE_SECONDS);
        assert_eq!(spec.machine_ready_timeout_seconds(), DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
        assert_eq!(*spec.strategy(), RolloutStrategy::default());
    }

    #[test]
    fn a_stored_spec_is_read_without_todays_settings() {
        let big = validate(PoolSpecInput { replicas: 5000, ..raw() }, &SpecLimits::unrestricted()).unwrap();
        let stored = crate::domain::json::document(big.view().to_json()).unwrap();
        assert_eq!(PoolSpec::from_stored(stored).unwrap().replicas(), 5000, "over today's --max-replicas");
        let broken = serde_json::json!({"replicas": 1, "version": "1.29"});
        let refused = PoolSpec::from_stored(crate::domain::json::document(broken).unwrap()).expect_err("corrupt");
        assert_eq!(refused.0[0].rule, "version");
    }

    #[test]
    fn describe_change_names_values_with_both_sides_and_collections_by_name() {
        let old = validate(raw(), &SpecLimits::default()).unwrap();
        let new = old
            .patched(
                &serde_json::json!({"replicas": 5, "image": "app:2", "labels": {"a": "b"}}),
                &SpecLimits::default(),
            )
            .unwrap();
        // Fields in name order.
        assert_eq!(describe_change(&old, &new), r#"spec changed (image: null -> "app:2", labels, replicas: 3 -> 5)"#);
    }

    #[test]
    fn cluster_must_be_a_dns_label() {
        assert_eq!(
            fields(validate(PoolSpecInput { cluster: Some("Prod".into()), ..raw() }, &SpecLimits::default())),
            [("cluster".into(), "dns_label")]
        );
    }

    fn limits() -> SpecLimits {
        SpecLimits { host: HostPolicy::new(&["/srv".into()], &["*".into()], &[]), ..SpecLimits::default() }
    }

    fn spec(body: serde_json::Value) -> PoolSpec {
        PoolSpec::parse(crate::domain::json::document(body).unwrap(), &limits()).unwrap()
    }

    /// Every spec field set away from its default.
    fn rich() -> PoolSpec {
        spec(serde_json::json!({
            "replicas": 7, "version": "v1.30.1", "image": "app:2", "failure_domains": ["a", "b"],
            "extra_mounts": [{"container_path": "/d", "host_path": "/srv/d", "read_only": true}],
            "labels": {"team": "infra"}, "paused": true, "engines": ["local"],
            "strategy": {"max_surge": "50%", "max_unavailable": 1, "batch_approval": true, "auto_rollback": true,
                         "replacement": "termination_complete"},
            "min_ready_seconds": 5, "progress_deadline_seconds": 60, "machine_ready_timeout_seconds": 30,
        }))
    }

    /// The view of any spec, sent back as a patch, makes that spec: every
    /// field the API shows can be patched.
    #[test]
    fn a_patch_of_every_field_round_trips() {
        let base = spec(serde_json::json!({"replicas": 1, "version": "v1.29.2"}));
        let target = rich();
        assert_eq!(base.patched(&target.view().to_json(), &limits()).unwrap(), target);
        // Maps merge, so emptying one takes a `null`.
        let mut back = base.view().to_json();
        back["labels"] = serde_json::Value::Null;
        assert_eq!(target.patched(&back, &limits()).unwrap(), base);
        assert_eq!(
            target.patched(&serde_json::json!({}), &limits()).unwrap(),
            target,
            "an empty patch changes nothing"
        );
    }

    #[test]
    fn null_resets_maps_merge_and_lists_are_replaced() {
        let current = rich();
        let got = current
            .patched(
                &serde_json::json!({"labels": {"tier": "edge", "team": null}, "image": null, "failure_domains": ["c"],
                       "strategy": {"max_surge": null}, "machine_ready_timeout_seconds": null, "paused": null}),
                &limits(),
            )
            .unwrap();
        assert_eq!(*got.labels(), [("tier".to_owned(), "edge".to_owned())].into());
        assert_eq!((got.image(), got.failure_domains()), (None, &["c".to_owned()][..]));
        assert_eq!(got.strategy().max_surge, RolloutStrategy::default().max_surge);
        assert_eq!(got.strategy().max_unavailable, IntOrPercent::Count(1), "other strategy fields stay");
        assert_eq!(got.machine_ready_timeout_seconds(), DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
        assert!(!got.paused());
        let reset = current.patched(&serde_json::json!({"strategy": null, "labels": null}), &limits()).unwrap();
        assert_eq!(*reset.strategy(), RolloutStrategy::default());
        assert!(reset.labels().is_empty());
    }

    #[test]
    fn a_patched_spec_is_checked_by_every_rule() {
        let e = rich().patched(&serde_json::json!({"replicas": 1001, "cluster": "Bad"}), &limits()).expect_err("ok");
        let rules: Vec<(&str, &str)> = e.0.iter().map(|e| (e.field.as_str(), e.static_rule())).collect();
        assert_eq!(rules, [("replicas", "range"), ("cluster", "dns_label")]);
        let e = rich().with_replicas(-1, &limits()).expect_err("ok");
        assert_eq!((e.0[0].field.as_str(), e.0[0].static_rule()), ("replicas", "range"));
        assert_eq!(rich().with_replicas(3, &limits()).unwrap().replicas(), 3);
    }
}
