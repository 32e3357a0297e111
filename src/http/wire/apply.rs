//! `POST /v1/apply`'s wire types: the request the CLI sends and the server
//! reads, and the answer the server sends and the CLI reads (one type each,
//! both ways).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::PlanView;
use crate::apply::document::ApplyDocument;
use crate::apply::plan::{Key, Step};
use crate::domain::names::DnsLabel;
use crate::domain::object::Namespace;
use crate::identity::Role;

/// Body of `POST /v1/apply`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The apply set: the name under which these documents are applied,
    /// and which owns what they create. DNS-1123 label.
    #[schema(example = "prod-fleet")]
    pub apply_set: DnsLabel,
    /// The objects, each once: every one is checked before anything changes.
    #[schema(value_type = Vec<ApplyDocument>, max_items = 5000)]
    pub documents: Vec<Value>,
    /// Plan only: answer what would change, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Delete the objects of this apply set that `documents` no longer name.
    /// With no document at all this would delete every object of the set,
    /// so it is refused unless `allow_empty` is also given.
    #[serde(default)]
    pub prune: bool,
    /// With `prune` and no document: delete every object of the apply set.
    /// Without it, such a request is refused (an empty directory or a
    /// mistyped path in a pipeline is not a wish to delete a fleet).
    #[serde(default)]
    pub allow_empty: bool,
    /// Overwrite (or prune) objects changed by another hand since this
    /// apply set last wrote them, instead of reporting a conflict.
    #[serde(default)]
    pub force: bool,
    /// Take over objects that exist and belong to no apply set (with
    /// `force`: to another apply set).
    #[serde(default)]
    pub adopt: bool,
}

/// What became of one object: the planner's step, and for a pool what the
/// apply left.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AppliedObject {
    #[serde(flatten)]
    pub step: Step,
    /// A pool whose machines move to another image: what the reconciler
    /// would do first (`POST /v1/pools/{name}/plan` with the new spec).
    #[schema(required = true)]
    pub rollout: Option<PlanView>,
    /// A pool created or changed: its generation and revision after the
    /// apply (its rollout is done when `status.observed_generation` reaches
    /// the generation and the revision's machines are all updated); `null`
    /// in a dry run and for other objects.
    #[schema(required = true)]
    pub generation: Option<i64>,
    #[schema(required = true)]
    pub revision: Option<i64>,
}

/// Counts of objects by action.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ApplySummary {
    pub create: u32,
    pub update: u32,
    pub delete: u32,
    pub unchanged: u32,
    pub conflict: u32,
}

/// The answer of `POST /v1/apply`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyResult {
    pub apply_set: String,
    /// The namespace of the set and of its pools and clusters.
    pub namespace: Namespace,
    pub dry_run: bool,
    /// The apply set's revision after this apply (a dry run: as it is);
    /// `null` for a set never applied. Also the `ETag`.
    pub revision: Option<i64>,
    /// Something was (in a dry run: would be) created, updated or deleted.
    pub changed: bool,
    /// The least role the whole apply needs in the namespace (engines'
    /// changes: on `*`).
    pub needs_role: Role,
    pub summary: ApplySummary,
    /// One per document, in order, then one per object pruned.
    pub objects: Vec<AppliedObject>,
    /// Objects of this apply set that `documents` no longer name, kept
    /// because `prune` was not asked.
    pub unlisted: Vec<Key>,
}
