//! Views of upgrade jobs, shared by the upgrades routes and the event
//! streams: what `GET /v1/upgrades/{id}` answers and a stream's `status`
//! message carries.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::{self, upgrades::Job};
use crate::domain::upgrade::{Component, JobState};
use crate::domain::version::KubeVersion;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Where a running job is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Position {
    pub component: Component,
    /// 0-7.
    pub step: i64,
    pub step_name: String,
}

fn step_state_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(&["running", "succeeded", "failed"], "running, succeeded or failed")
}

fn component_state_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(
        &["pending", "upgrading", "upgraded", "rolled_back", "cancelled", "failed", "skipped"],
        "pending, upgrading, upgraded, rolled_back, cancelled, failed or skipped (the job ended before it)",
    )
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StepView {
    pub step: i64,
    pub name: String,
    /// running, succeeded or failed.
    #[schema(schema_with = step_state_schema)]
    pub state: String,
    /// Times the step was started; more than one after a restart resumed it.
    pub attempts: i64,
    /// API calls of the step that failed and were tried again.
    pub api_retries: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ComponentProgress {
    #[schema(value_type = Component)]
    pub component: String,
    /// pending, upgrading, upgraded, rolled_back, cancelled, failed or skipped (the job ended before it).
    #[schema(schema_with = component_state_schema)]
    pub state: String,
    pub old_image: Option<String>,
    pub new_image: String,
    /// The pod the upgrade replaces, found by step 0.
    pub old_pod: Option<String>,
    pub steps: Vec<StepView>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradeView {
    pub id: i64,
    pub cluster: String,
    pub version: KubeVersion,
    /// The version the cluster ran when the job was accepted.
    pub from_version: Option<String>,
    pub components: Vec<Component>,
    pub image_repository: String,
    pub force: bool,
    pub state: JobState,
    /// The component and step being worked on; absent once the job ended.
    pub current: Option<Position>,
    pub cancel_requested: bool,
    /// Why the job failed, or what a cancel left; names upgraded components.
    pub error: Option<String>,
    /// Components that run the target version because of this job.
    #[schema(value_type = Vec<Component>)]
    pub upgraded_components: Vec<String>,
    pub progress: Vec<ComponentProgress>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl From<&db::upgrades::StepRecord> for StepView {
    fn from(s: &db::upgrades::StepRecord) -> Self {
        StepView {
            step: s.step,
            name: s.name.clone(),
            state: s.state.clone(),
            attempts: s.attempts,
            api_retries: s.api_retries,
            started_at: s.started_at,
            finished_at: s.finished_at,
            error: s.error.clone(),
        }
    }
}

/// The job as the API shows it: its components' progress and steps read
/// from the store.
pub async fn view(state: &AppState, job: Job) -> ApiResult<UpgradeView> {
    let comps = db::upgrades::components(state.db.read(), job.id).await?;
    let steps = db::upgrades::steps(state.db.read(), job.id).await?;
    let version = job.version.parse().map_err(|e| ApiError::Internal(anyhow::anyhow!("stored version: {e}")))?;
    let current = job.state.is_active().then(|| Position {
        component: job.components.get(job.component_index).copied().unwrap_or(Component::KubeApiserver),
        step: job.step.number(),
        step_name: job.step.name().to_owned(),
    });
    let progress = comps
        .into_iter()
        .map(|c| ComponentProgress {
            steps: steps.iter().filter(|s| s.position == c.position).map(StepView::from).collect(),
            component: c.component,
            state: c.state,
            old_image: c.old_image,
            new_image: c.new_image,
            old_pod: c.old_pod,
        })
        .collect::<Vec<_>>();
    Ok(UpgradeView {
        upgraded_components: progress.iter().filter(|p| p.state == "upgraded").map(|p| p.component.clone()).collect(),
        id: job.id,
        cluster: job.cluster,
        version,
        from_version: job.from_version,
        components: job.components,
        image_repository: job.image_repository,
        force: job.force,
        state: job.state,
        current,
        cancel_requested: job.cancel_requested,
        error: job.error,
        progress,
        created_at: job.created_at,
        started_at: job.started_at,
        finished_at: job.finished_at,
        updated_at: job.updated_at,
    })
}

pub fn parse_id(id: &str) -> ApiResult<i64> {
    id.parse().map_err(|_| ApiError::not_found("upgrade job", id))
}

pub async fn load(state: &AppState, id: &str) -> ApiResult<Job> {
    db::upgrades::get(state.db.read(), parse_id(id)?).await?.ok_or_else(|| ApiError::not_found("upgrade job", id))
}
