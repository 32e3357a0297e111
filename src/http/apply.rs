//! `POST /v1/apply`: a set of documents (pools, engines, clusters) applied
//! as one change, or planned (`dry_run`). The handler parses, calls
//! `apply::Apply` and answers with the plan and what became of each object.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::apply::diff::Change;
use crate::apply::document::{ApplyDocument, Kind};
use crate::apply::plan::{Action, Conflict, Key, Step};
use crate::apply::{Applied, ApplyError, Request};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, IfMatch};
use crate::http::rollouts::PlanView;
use crate::identity::{Caller, Role};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(apply))
}

/// Body of `POST /v1/apply`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The apply set: the name under which these documents are applied,
    /// and which owns what they create. DNS-1123 label.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length = 1, max_length = 63, example = "prod-fleet")]
    pub apply_set: String,
    /// The objects, each once: every one is checked before anything changes.
    #[schema(value_type = Vec<ApplyDocument>, max_items = 5000)]
    pub documents: Vec<Value>,
    /// Plan only: answer what would change, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Delete the objects of this apply set that `documents` no longer name.
    #[serde(default)]
    pub prune: bool,
    /// Overwrite (or prune) objects changed by another hand since this
    /// apply set last wrote them, instead of reporting a conflict.
    #[serde(default)]
    pub force: bool,
    /// Take over objects that exist and belong to no apply set (with
    /// `force`: to another apply set).
    #[serde(default)]
    pub adopt: bool,
}

/// What became of one object.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AppliedObject {
    pub kind: Kind,
    pub name: String,
    /// Index in `documents`; `null` for an object pruned.
    pub document: Option<u32>,
    pub action: Action,
    /// The fields that change (all of them for a creation or a deletion);
    /// secrets show that they change, never their values.
    pub changes: Vec<Change>,
    /// Why the object was left alone, when `action` is `conflict`.
    pub conflict: Option<Conflict>,
    /// This apply set takes the object over.
    pub adopted: bool,
    /// The least role this change needs.
    pub needs_role: Role,
    /// A pool whose machines move to another image: what the reconciler
    /// would do first (`POST /v1/pools/{name}/plan` with the new spec).
    pub rollout: Option<PlanView>,
    /// A pool created or changed: its generation and revision after the
    /// apply (its rollout is done when `status.observed_generation` reaches
    /// the generation and the revision's machines are all updated); `null`
    /// in a dry run and for other objects.
    pub generation: Option<i64>,
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
    pub dry_run: bool,
    /// The apply set's revision after this apply (a dry run: as it is);
    /// `null` for a set never applied. Also the `ETag`.
    pub revision: Option<i64>,
    /// Something was (in a dry run: would be) created, updated or deleted.
    pub changed: bool,
    /// The least role the whole apply needs.
    pub needs_role: Role,
    pub summary: ApplySummary,
    /// One per document, in order, then one per object pruned.
    pub objects: Vec<AppliedObject>,
    /// Objects of this apply set that `documents` no longer name, kept
    /// because `prune` was not asked.
    pub unlisted: Vec<Key>,
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Invalid(errs) => ApiError::Validation(errs),
            ApplyError::Conflict(why) => ApiError::Conflict(why),
            ApplyError::Precondition(why) => ApiError::PreconditionFailed(why),
            ApplyError::Forbidden(role) => ApiError::Forbidden { need: role.as_str() },
            ApplyError::Store(e) => ApiError::Database(e),
            ApplyError::Internal(e) => ApiError::Internal(e),
        }
    }
}

fn object(step: Step, rollouts: &mut BTreeMap<String, crate::pools::Planned>, applied: &Applied) -> AppliedObject {
    let pool = (step.kind == Kind::Pool).then(|| applied.pools.get(&step.name)).flatten();
    let rollout = (step.kind == Kind::Pool).then(|| rollouts.remove(&step.name)).flatten().map(|planned| PlanView {
        pool: step.name.clone(),
        desired_image: planned.pool.spec.desired_image(),
        plan: planned.plan,
        observed: planned.observed,
    });
    AppliedObject {
        generation: pool.map(|p| p.generation),
        revision: pool.map(|p| p.revision),
        kind: step.kind,
        name: step.name,
        document: step.document,
        action: step.action,
        changes: step.changes,
        conflict: step.conflict,
        adopted: step.adopted,
        needs_role: step.needs_role,
        rollout,
    }
}

impl From<Applied> for ApplyResult {
    fn from(mut applied: Applied) -> Self {
        let mut summary = ApplySummary::default();
        for step in &applied.plan.steps {
            let count = match step.action {
                Action::Create => &mut summary.create,
                Action::Update => &mut summary.update,
                Action::Delete => &mut summary.delete,
                Action::Unchanged => &mut summary.unchanged,
                Action::Conflict => &mut summary.conflict,
            };
            *count += 1;
        }
        let changed = applied.plan.changes_anything();
        let needs_role = applied.plan.needs_role();
        let steps = std::mem::take(&mut applied.plan.steps);
        let mut rollouts = std::mem::take(&mut applied.rollouts);
        let objects = steps.into_iter().map(|s| object(s, &mut rollouts, &applied)).collect();
        ApplyResult {
            apply_set: applied.apply_set.clone(),
            dry_run: applied.dry_run,
            revision: applied.revision,
            changed,
            needs_role,
            summary,
            objects,
            unlisted: std::mem::take(&mut applied.plan.unlisted),
        }
    }
}

/// Apply a set of documents: pools, engines and clusters, as one change.
///
/// Every document is checked first; if any breaks a rule, nothing changes
/// and each error names its document and field (`documents[3].spec.replicas`).
/// Then each object is created, updated, left unchanged or (with `prune`)
/// deleted, in one transaction: all of it happens, or none. An object
/// changed by another hand since this apply set last wrote it, or one the
/// set does not own, is a `conflict` and left alone unless `force` (or
/// `adopt`) is given. `dry_run` answers the same plan and changes nothing;
/// a viewer may ask for it. Each change needs the role its single-object
/// route needs (`needs_role`). `If-Match` pins the apply set's revision.
#[utoipa::path(post, path = "/v1/apply", tag = "apply",
    params(("If-Match" = Option<String>, Header, description = "ETag (revision) of the apply set the apply is based on; `\"0\"` for a set never applied")),
    request_body(content = ApplyRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What was done (or, in a dry run, would be) to each object", body = ApplyResult,
            headers(("ETag" = String, description = "The apply set's revision"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The caller's role is below what the changes need (`needs_role` of a dry run says which)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another apply of this set (or another hand) changed what the plan relied on while it ran; nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` names another revision of the apply set", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A document breaks a rule; `errors` lists each with its path (`documents[N]....`); nothing was changed", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(apply_set = %body.apply_set, dry_run = body.dry_run))]
async fn apply(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    IfMatch(pinned): IfMatch,
    ApiJson(body): ApiJson<ApplyRequest>,
) -> ApiResult<Response> {
    let req = Request {
        apply_set: body.apply_set,
        documents: body.documents,
        dry_run: body.dry_run,
        prune: body.prune,
        force: body.force,
        adopt: body.adopt,
        if_revision: pinned,
        caller: caller.as_deref().map(|c| c.name.clone()),
        role: crate::identity::role_or_admin(caller.as_deref()),
    };
    let result = ApplyResult::from(state.apply.apply(req).await?);
    let etag = crate::http::wire::pools::etag(result.revision.unwrap_or(0));
    Ok((StatusCode::OK, [(header::ETAG, etag)], Json(result)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's bound on `documents` is the one the service enforces.
    #[test]
    fn the_documents_limit_is_stated_as_enforced() {
        let schema = serde_json::to_value(<ApplyRequest as utoipa::PartialSchema>::schema()).expect("schema");
        assert_eq!(schema["properties"]["documents"]["maxItems"], crate::apply::document::MAX_DOCUMENTS);
    }
}
