//! The pools API's wire types: what clients send and what they get back.
//! Request types are loose (so every broken rule can be reported at once);
//! `domain::pool::validate` turns them into a `PoolSpec`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::pools::Pool;
use crate::domain::event::Event;
use crate::domain::pool::{Mount, PoolSpec, RawSpec};
use crate::domain::status::PoolStatus;
use crate::domain::strategy::{IntOrPercent, ReplacementPolicy};

/// A pool's spec as clients send it. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSpecInput {
    /// Desired number of machines, 0 to the server's maximum (default 1000).
    pub replicas: i64,
    /// Kubernetes version, `vMAJOR.MINOR.PATCH`.
    #[schema(example = "v1.29.2")]
    pub version: String,
    /// Custom image; overrides `kindest/node:<version>`.
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub failure_domains: Vec<String>,
    #[serde(default)]
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
    pub cluster: Option<String>,
    /// Engines the machines may run on, by name (default: every engine).
    #[serde(default)]
    pub engines: Vec<String>,
    /// Engines the machines may run on, by label (default: every engine);
    /// not together with `engines`.
    #[serde(default)]
    pub engine_selector: BTreeMap<String, String>,
    /// Seconds a new machine must be ready before it counts as available (default 0).
    #[serde(default)]
    pub min_ready_seconds: Option<i64>,
    /// Seconds without progress before a rollout is reported stalled (default 600).
    #[serde(default)]
    pub progress_deadline_seconds: Option<i64>,
    /// Seconds after which an up-to-date machine that runs but never became ready is replaced (default 300).
    #[serde(default)]
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
/// schema exists; `parse_create` reads the body.
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
                .pattern(Some("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
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
    pub replicas: i64,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolPhase {
    /// The reconciler keeps the pool at its spec.
    Active,
    /// The reconciler is removing the machines; then the pool disappears.
    Deleting,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PoolView {
    pub name: String,
    #[serde(flatten)]
    pub spec: PoolSpec,
    /// The image machines run: `image`, else `kindest/node:<version>`.
    pub desired_image: String,
    /// Bumped by every spec change; sent as the `ETag`.
    pub generation: i64,
    /// Revision of the desired image; see `GET /v1/pools/{name}/revisions`.
    pub revision: i64,
    pub phase: PoolPhase,
    pub status: PoolStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Pool> for PoolView {
    fn from(p: Pool) -> Self {
        PoolView {
            desired_image: p.spec.desired_image(),
            name: p.name,
            spec: p.spec,
            generation: p.generation,
            revision: p.revision,
            phase: if p.deleting { PoolPhase::Deleting } else { PoolPhase::Active },
            status: p.status,
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PoolList {
    pub items: Vec<PoolView>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    /// Newest first.
    pub items: Vec<Event>,
    pub next_cursor: Option<String>,
}
