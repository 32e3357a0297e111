//! `POST /v1/apply`: a set of documents (pools, engines, clusters) applied
//! as one change, or planned (`dry_run`). The handler parses, calls
//! `apply::Apply` and answers with the plan and what became of each object.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::apply::document::Kind;
use crate::apply::plan::{Action, Step};
use crate::apply::{Applied, ApplyError, Request};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, IfMatch, NamespaceParam, Scope};
use crate::http::wire::PlanView;
use crate::http::wire::apply::{AppliedObject, ApplyRequest, ApplyResult, ApplySummary};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(apply))
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Invalid(errs) => ApiError::Validation(errs),
            ApplyError::Conflict(why) => ApiError::Conflict(why),
            ApplyError::Precondition(why) => ApiError::PreconditionFailed(why),
            ApplyError::Denied(denied) => denied.into(),
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
    AppliedObject { generation: pool.map(|p| p.generation), revision: pool.map(|p| p.revision), step, rollout }
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
            apply_set: applied.apply_set.name.clone(),
            namespace: applied.apply_set.namespace.clone(),
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
    params(NamespaceParam, ("If-Match" = Option<String>, Header, description = "ETag (revision) of the apply set the apply is based on; `\"0\"` for a set never applied")),
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
    scope: Scope,
    IfMatch(pinned): IfMatch,
    ApiJson(body): ApiJson<ApplyRequest>,
) -> ApiResult<Response> {
    let req = Request {
        apply_set: body.apply_set.into_string(),
        documents: body.documents,
        dry_run: body.dry_run,
        prune: body.prune,
        allow_empty: body.allow_empty,
        force: body.force,
        adopt: body.adopt,
        if_revision: pinned,
        access: scope.single()?,
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
