//! The pools API's wire types: what clients send and what they get back.
//! Request types are loose (so every broken rule can be reported at once);
//! `domain::pool::validate` turns them into a `PoolSpec`. Responses are
//! views built from the domain type, so neither the store's format nor the
//! domain's fields leak into the API by accident.

use std::collections::BTreeMap;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::db::pools::Pool;
use crate::domain::event::Event;
use crate::domain::pool::{Mount, PoolSpec, RawSpec, SpecLimits, validate};
use crate::domain::rollout::RolloutProgress;
use crate::domain::status::{Condition, EngineReplicas, PoolStatus};
use crate::domain::strategy::{IntOrPercent, ReplacementPolicy, RolloutStrategy};
use crate::error::{ApiError, ApiResult};

/// A DNS-1123 label (`domain::names::check_dns_label`).
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A pool's spec as clients send it. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSpecInput {
    /// Desired number of machines, 0 to the server's maximum (default 1000).
    #[schema(minimum = 0, maximum = 1000)]
    pub replicas: i64,
    /// Kubernetes version, `vMAJOR.MINOR.PATCH`.
    #[schema(example = "v1.29.2", pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")]
    pub version: String,
    /// Custom image; overrides `kindest/node:<version>`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255)]
    pub image: Option<String>,
    #[serde(default)]
    #[schema(max_items = 64)]
    pub failure_domains: Vec<String>,
    #[serde(default)]
    #[schema(max_items = 64)]
    pub extra_mounts: Vec<Mount>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub strategy: Option<StrategyInput>,
    /// No rollout changes while set; status keeps updating.
    #[serde(default)]
    pub paused: bool,
    /// Registered cluster whose nodes the machines are; their nodes are
    /// cordoned and drained before they are removed.
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length = 63)]
    pub cluster: Option<String>,
    /// Engines the machines may run on, by name (default: every engine).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub engines: Vec<String>,
    /// Engines the machines may run on, by label (default: every engine);
    /// not together with `engines`.
    #[serde(default)]
    pub engine_selector: BTreeMap<String, String>,
    /// Seconds a new machine must be ready before it counts as available (default 0).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400)]
    pub min_ready_seconds: Option<i64>,
    /// Seconds without progress before a rollout is reported stalled
    /// (default 600); more than `min_ready_seconds`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub progress_deadline_seconds: Option<i64>,
    /// Seconds after which an up-to-date machine that runs but never became ready is replaced (default 300).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub machine_ready_timeout_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyInput {
    /// Machines allowed above `replicas` during a rollout (default 1).
    pub max_surge: Option<IntOrPercent>,
    /// Machines allowed below `replicas` available during a rollout (default 0).
    pub max_unavailable: Option<IntOrPercent>,
    /// Pause after each batch until `POST .../rollout/continue` (default false).
    #[serde(default)]
    pub batch_approval: bool,
    /// Roll back by itself when the progress deadline passes (default false).
    #[serde(default)]
    pub auto_rollback: bool,
    /// Whether a machine being deleted counts toward `replicas + max_surge`
    /// (default `termination_started`: it does not).
    #[serde(default)]
    pub replacement: Option<ReplacementPolicy>,
}

impl From<PoolSpecInput> for RawSpec {
    fn from(i: PoolSpecInput) -> Self {
        let strategy = i.strategy.unwrap_or_default();
        RawSpec {
            replicas: i.replicas,
            version: i.version,
            image: i.image,
            failure_domains: i.failure_domains,
            extra_mounts: i.extra_mounts,
            labels: i.labels,
            max_surge: strategy.max_surge,
            max_unavailable: strategy.max_unavailable,
            batch_approval: strategy.batch_approval,
            auto_rollback: strategy.auto_rollback,
            replacement: strategy.replacement,
            paused: i.paused,
            cluster: i.cluster,
            min_ready_seconds: i.min_ready_seconds,
            progress_deadline_seconds: i.progress_deadline_seconds,
            machine_ready_timeout_seconds: i.machine_ready_timeout_seconds,
            engines: i.engines,
            engine_selector: i.engine_selector,
        }
    }
}

/// Body of `POST /v1/pools`: a `name` beside the spec's fields. Only its
/// schema exists; the handler splits the body into name and spec.
pub struct CreatePool;

impl utoipa::PartialSchema for CreatePool {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        // The spec's own schema plus `name`: an `allOf` of the two could
        // never validate, since the spec refuses unknown fields.
        let mut schema = <PoolSpecInput as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(obj)) = &mut schema {
            let name = ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("DNS-1123 label, at most 63 characters; unique"))
                .min_length(Some(1))
                .max_length(Some(63))
                .pattern(Some(DNS_LABEL_PATTERN))
                .examples(["workers"]);
            obj.properties.insert("name".into(), name.into());
            obj.required.insert(0, "name".into());
            obj.description = Some("A pool's name and spec".into());
        }
        schema
    }
}

impl ToSchema for CreatePool {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        <PoolSpecInput as ToSchema>::schemas(schemas);
    }
}

/// Body of the scale endpoint.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// 0 to the server's maximum (default 1000).
    #[schema(minimum = 0, maximum = 1000)]
    pub replicas: i64,
}

// ---- PATCH -----------------------------------------------------------------

/// A JSON merge patch (RFC 7396) of a pool's spec: every field optional;
/// a field left out keeps its value, `null` resets it to its default
/// (`replicas` and `version` have none and may not be `null`). Maps
/// (`labels`, `engine_selector`) merge key by key, a `null` value removing
/// the key; lists are replaced whole. `strategy` merges field by field.
///
/// Field for field the spec of `PoolSpecView`: a test fails when the two
/// part ways.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolPatch {
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = i64, minimum = 0, maximum = 1000)]
    pub replicas: Option<i64>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = String, pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$", example = "v1.29.2")]
    pub version: Option<String>,
    /// `null`: the version's node image.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, min_length = 1, max_length = 255)]
    pub image: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<String>>, max_items = 64)]
    pub failure_domains: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<Mount>>, max_items = 64)]
    pub extra_mounts: Option<Option<Vec<Mount>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pub labels: Option<Option<BTreeMap<String, Option<String>>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<StrategyPatch>)]
    pub strategy: Option<Option<StrategyPatch>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub paused: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length = 63)]
    pub cluster: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<String>>, max_items = 64)]
    pub engines: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pub engine_selector: Option<Option<BTreeMap<String, Option<String>>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 86400)]
    pub min_ready_seconds: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 86400)]
    pub progress_deadline_seconds: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 86400)]
    pub machine_ready_timeout_seconds: Option<Option<i64>>,
}

/// A merge patch of `strategy`; `null` resets a field to its default.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyPatch {
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<IntOrPercent>)]
    pub max_surge: Option<Option<IntOrPercent>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<IntOrPercent>)]
    pub max_unavailable: Option<Option<IntOrPercent>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub batch_approval: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub auto_rollback: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<ReplacementPolicy>)]
    pub replacement: Option<Option<ReplacementPolicy>>,
}

/// A field that may be left out but, when present, may not be `null`.
fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A field that may be left out (`None`) or sent as `null` (`Some(None)`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Merges a patch of a string map: `null` clears it, a `null` value removes its key.
fn merge_map(target: &mut BTreeMap<String, String>, patch: &Option<BTreeMap<String, Option<String>>>) {
    let Some(changes) = patch else {
        target.clear();
        return;
    };
    for (key, value) in changes {
        match value {
            Some(v) => target.insert(key.clone(), v.clone()),
            None => target.remove(key),
        };
    }
}

impl PoolPatch {
    /// The fields this patch sends, as named on the wire.
    pub fn fields(&self) -> Vec<&'static str> {
        let PoolPatch {
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
        } = self;
        [
            ("replicas", replicas.is_some()),
            ("version", version.is_some()),
            ("image", image.is_some()),
            ("failure_domains", failure_domains.is_some()),
            ("extra_mounts", extra_mounts.is_some()),
            ("labels", labels.is_some()),
            ("strategy", strategy.is_some()),
            ("paused", paused.is_some()),
            ("cluster", cluster.is_some()),
            ("engines", engines.is_some()),
            ("engine_selector", engine_selector.is_some()),
            ("min_ready_seconds", min_ready_seconds.is_some()),
            ("progress_deadline_seconds", progress_deadline_seconds.is_some()),
            ("machine_ready_timeout_seconds", machine_ready_timeout_seconds.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, sent)| sent.then_some(name))
        .collect()
    }

    /// The spec this patch makes of `current`, with every rule checked.
    pub fn to_spec(&self, current: &PoolSpec, limits: &SpecLimits) -> ApiResult<PoolSpec> {
        validate(self.apply(current), limits).map_err(ApiError::Validation)
    }

    /// The spec as input with this patch applied, field by field, ready for
    /// `domain::pool::validate`. A `None` left in `raw` means "the default".
    pub fn apply(&self, current: &PoolSpec) -> RawSpec {
        let mut raw = RawSpec::from(current);
        let PoolPatch {
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
        } = self.clone();
        if let Some(v) = replicas {
            raw.replicas = v;
        }
        if let Some(v) = version {
            raw.version = v;
        }
        if let Some(v) = image {
            raw.image = v;
        }
        if let Some(v) = failure_domains {
            raw.failure_domains = v.unwrap_or_default();
        }
        if let Some(v) = extra_mounts {
            raw.extra_mounts = v.unwrap_or_default();
        }
        if let Some(v) = &labels {
            merge_map(&mut raw.labels, v);
        }
        match strategy {
            None => {}
            Some(None) => StrategyPatch::reset(&mut raw),
            Some(Some(v)) => v.apply(&mut raw),
        }
        if let Some(v) = paused {
            raw.paused = v.unwrap_or_default();
        }
        if let Some(v) = cluster {
            raw.cluster = v;
        }
        if let Some(v) = engines {
            raw.engines = v.unwrap_or_default();
        }
        if let Some(v) = &engine_selector {
            merge_map(&mut raw.engine_selector, v);
        }
        if let Some(v) = min_ready_seconds {
            raw.min_ready_seconds = v;
        }
        if let Some(v) = progress_deadline_seconds {
            raw.progress_deadline_seconds = v;
        }
        if let Some(v) = machine_ready_timeout_seconds {
            raw.machine_ready_timeout_seconds = v;
        }
        raw
    }
}

impl StrategyPatch {
    /// `strategy: null`: every strategy field back to its default.
    fn reset(raw: &mut RawSpec) {
        Self {
            max_surge: Some(None),
            max_unavailable: Some(None),
            batch_approval: Some(None),
            auto_rollback: Some(None),
            replacement: Some(None),
        }
        .apply(raw);
    }

    fn apply(self, raw: &mut RawSpec) {
        let StrategyPatch { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = self;
        if let Some(v) = max_surge {
            raw.max_surge = v;
        }
        if let Some(v) = max_unavailable {
            raw.max_unavailable = v;
        }
        if let Some(v) = batch_approval {
            raw.batch_approval = v.unwrap_or_default();
        }
        if let Some(v) = auto_rollback {
            raw.auto_rollback = v.unwrap_or_default();
        }
        if let Some(v) = replacement {
            raw.replacement = v;
        }
    }
}

// ---- responses -------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolPhase {
    /// The reconciler keeps the pool at its spec.
    Active,
    /// The reconciler is removing the machines; then the pool disappears.
    Deleting,
}

/// A pool's spec as the API shows it, every default filled in.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolSpecView {
    pub replicas: u32,
    #[schema(value_type = String, example = "v1.29.2")]
    pub version: String,
    /// The custom image, when one is set.
    pub image: Option<String>,
    pub failure_domains: Vec<String>,
    pub extra_mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub strategy: StrategyView,
    pub paused: bool,
    pub cluster: Option<String>,
    pub engines: Vec<String>,
    pub engine_selector: BTreeMap<String, String>,
    pub min_ready_seconds: u32,
    pub progress_deadline_seconds: u32,
    pub machine_ready_timeout_seconds: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StrategyView {
    pub max_surge: IntOrPercent,
    pub max_unavailable: IntOrPercent,
    pub batch_approval: bool,
    pub auto_rollback: bool,
    pub replacement: ReplacementPolicy,
}

impl From<&PoolSpec> for PoolSpecView {
    fn from(s: &PoolSpec) -> Self {
        let PoolSpec {
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
        } = s.clone();
        let RolloutStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = strategy;
        PoolSpecView {
            replicas,
            version: version.to_string(),
            image,
            failure_domains,
            extra_mounts,
            labels,
            strategy: StrategyView { max_surge, max_unavailable, batch_approval, auto_rollback, replacement },
            paused,
            cluster,
            engines,
            engine_selector,
            min_ready_seconds,
            progress_deadline_seconds,
            machine_ready_timeout_seconds,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolView {
    pub name: String,
    #[serde(flatten)]
    pub spec: PoolSpecView,
    /// The image machines run: `image`, else `kindest/node:<version>`.
    pub desired_image: String,
    /// Bumped by every spec change; sent as the `ETag`.
    pub generation: i64,
    /// Revision of the desired image; see `GET /v1/pools/{name}/revisions`.
    pub revision: i64,
    pub phase: PoolPhase,
    pub status: PoolStatusView,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Pool> for PoolView {
    fn from(p: Pool) -> Self {
        PoolView {
            desired_image: p.spec.desired_image(),
            spec: PoolSpecView::from(&p.spec),
            name: p.name,
            generation: p.generation,
            revision: p.revision,
            phase: if p.deleting { PoolPhase::Deleting } else { PoolPhase::Active },
            status: p.status.into(),
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

// The stored `PoolStatus` field for field, but without its defaults (which
// let old rows load): a client reading an answer finds a missing field.
/// Observed state of a pool, written after every reconcile pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = PoolStatus)]
pub struct PoolStatusView {
    /// The `generation` the last pass worked from; behind `generation`
    /// while a change has not been acted on yet.
    pub observed_generation: i64,
    /// Machines that exist.
    pub replicas: u32,
    /// Machines whose container runs (and is healthy, where it has a check).
    pub ready_replicas: u32,
    /// Machines that run the desired image.
    pub updated_replicas: u32,
    /// Machines ready for at least `min_ready_seconds`.
    pub available_replicas: u32,
    /// Machines being deleted (stopping within their grace period, or
    /// waiting for their engine); not counted in `replicas`.
    pub terminating_replicas: u32,
    /// Machines on each engine (those counted in `replicas`).
    pub engines: BTreeMap<String, EngineReplicas>,
    pub conditions: Vec<Condition>,
    /// The error of the last failed pass, cleared by a good one.
    pub last_error: Option<String>,
    /// When a pass last changed this status (passes that change nothing
    /// write nothing).
    pub last_reconciled_at: Option<DateTime<Utc>>,
    /// Progress of the current (or last) rollout.
    pub rollout: Option<RolloutProgress>,
}

impl From<PoolStatus> for PoolStatusView {
    fn from(s: PoolStatus) -> Self {
        let PoolStatus {
            observed_generation,
            replicas,
            ready_replicas,
            updated_replicas,
            available_replicas,
            terminating_replicas,
            engines,
            conditions,
            last_error,
            last_reconciled_at,
            rollout,
        } = s;
        PoolStatusView {
            observed_generation,
            replicas,
            ready_replicas,
            updated_replicas,
            available_replicas,
            terminating_replicas,
            engines,
            conditions,
            last_error,
            last_reconciled_at,
            rollout,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub items: Vec<PoolView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    /// Newest first.
    pub items: Vec<Event>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The `ETag` of a pool at `generation`.
pub fn etag(generation: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{generation}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

fn location(name: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("/v1/pools/{name}")).unwrap_or(HeaderValue::from_static("/v1/pools"))
}

/// The pool answered with its ETag (and its `Location`, for 201 and 202).
pub fn pool_response(status: StatusCode, pool: Pool, with_location: bool) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(pool.generation));
    if with_location {
        headers.insert(header::LOCATION, location(&pool.name));
    }
    (status, headers, Json(PoolView::from(pool))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::pool::HostPolicy;
    use serde_json::{Value, json};

    fn limits() -> SpecLimits {
        SpecLimits { host: HostPolicy::new(&["/srv".into()], &["*".into()], &[]), ..SpecLimits::default() }
    }

    fn spec(body: Value) -> PoolSpec {
        let input: PoolSpecInput = serde_json::from_value(body).unwrap();
        validate(input.into(), &limits()).unwrap()
    }

    fn patched(current: &PoolSpec, patch: Value) -> ApiResult<PoolSpec> {
        let patch: PoolPatch = crate::http::extract::from_json_value(patch)?;
        patch.to_spec(current, &limits())
    }

    /// Every spec field set away from its default.
    fn rich() -> PoolSpec {
        spec(json!({
            "replicas": 7, "version": "v1.30.1", "image": "app:2", "failure_domains": ["a", "b"],
            "extra_mounts": [{"container_path": "/d", "host_path": "/srv/d", "read_only": true}],
            "labels": {"team": "infra"}, "paused": true, "engines": ["local"],
            "strategy": {"max_surge": "50%", "max_unavailable": 1, "batch_approval": true, "auto_rollback": true,
                         "replacement": "termination_complete"},
            "min_ready_seconds": 5, "progress_deadline_seconds": 60, "machine_ready_timeout_seconds": 30,
        }))
    }

    fn properties<T: utoipa::PartialSchema>() -> Vec<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        let mut names: Vec<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
        names.sort();
        names
    }

    /// Fails when a field is added to the spec's view (or input) but not to
    /// the patch, or the other way round.
    #[test]
    fn the_patch_the_view_and_the_input_name_the_same_fields() {
        assert_eq!(properties::<PoolPatch>(), properties::<PoolSpecView>());
        assert_eq!(properties::<PoolPatch>(), properties::<PoolSpecInput>());
        assert_eq!(properties::<StrategyPatch>(), properties::<StrategyView>());
        assert_eq!(properties::<StrategyPatch>(), properties::<StrategyInput>());
        let schema = serde_json::to_value(<PoolPatch as utoipa::PartialSchema>::schema()).unwrap();
        assert_eq!(schema["additionalProperties"], json!(false), "unknown fields are refused: {schema}");
        assert!(schema.get("required").is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)), "{schema}");
    }

    /// The view of any spec, sent back as a patch, makes that spec: every
    /// field the API shows can be patched, and a new field that cannot is a
    /// failure here (the patch refuses unknown fields).
    #[test]
    fn a_patch_of_every_field_round_trips() {
        let base = spec(json!({"replicas": 1, "version": "v1.29.2"}));
        let target = rich();
        let view = serde_json::to_value(PoolSpecView::from(&target)).unwrap();
        assert_eq!(patched(&base, view.clone()).unwrap(), target);
        // Maps merge, so emptying one takes a `null`.
        let mut back = serde_json::to_value(PoolSpecView::from(&base)).unwrap();
        back["labels"] = Value::Null;
        assert_eq!(patched(&target, back).unwrap(), base);
        assert_eq!(patched(&target, json!({})).unwrap(), target, "an empty patch changes nothing");
    }

    #[test]
    fn null_resets_maps_merge_and_lists_are_replaced() {
        let current = rich();
        let got = patched(
            &current,
            json!({"labels": {"tier": "edge", "team": null}, "image": null, "failure_domains": ["c"],
                   "strategy": {"max_surge": null}, "machine_ready_timeout_seconds": null, "paused": null}),
        )
        .unwrap();
        assert_eq!(got.labels, [("tier".to_owned(), "edge".to_owned())].into());
        assert_eq!((got.image, got.failure_domains), (None, vec!["c".to_owned()]));
        assert_eq!(got.strategy.max_surge, RolloutStrategy::default().max_surge);
        assert_eq!(got.strategy.max_unavailable, IntOrPercent::Count(1), "other strategy fields stay");
        assert_eq!(got.machine_ready_timeout_seconds, crate::domain::pool::DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
        assert!(!got.paused);
        let reset = patched(&current, json!({"strategy": null, "labels": null})).unwrap();
        assert_eq!(reset.strategy, RolloutStrategy::default());
        assert!(reset.labels.is_empty());
    }

    #[test]
    fn required_fields_refuse_null_and_unknown_fields_are_refused() {
        let field = |patch: Value| match patched(&rich(), patch) {
            Err(ApiError::Validation(e)) => (e.0[0].field.clone(), e.0[0].rule),
            other => panic!("expected a validation error, got {other:?}"),
        };
        assert_eq!(field(json!({"replicas": null})), ("replicas".into(), "type"));
        assert_eq!(field(json!({"version": null})), ("version".into(), "type"));
        assert_eq!(field(json!({"name": "x"})), ("name".into(), "unknown_field"));
        assert_eq!(field(json!({"strategy": {"surge": 1}})), ("strategy.surge".into(), "unknown_field"));
        assert_eq!(field(json!({"replicas": 1001})), ("replicas".into(), "range"));
    }

    #[test]
    fn fields_names_what_the_patch_sends() {
        let patch: PoolPatch = serde_json::from_value(json!({"replicas": 2, "labels": null})).unwrap();
        assert_eq!(patch.fields(), ["replicas", "labels"]);
    }
}
