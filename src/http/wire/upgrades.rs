//! Views of upgrade jobs, shared by the upgrades routes and the event
//! streams: what `GET /v1/upgrades/{id}` answers and a stream's `status`
//! message carries.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::upgrade_components::ComponentSteps;
use crate::db::upgrades::StepRecord;
use crate::domain::object::Namespace;
use crate::domain::upgrade::{Component, ComponentState, JobState, StepState};
use crate::domain::version::KubeVersion;
use crate::upgrade::service::JobDetail;

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
    pub state: StepState,
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
    pub component: Component,
    /// pending, upgrading, upgraded, rolled_back, cancelled, failed or skipped (the job ended before it).
    #[schema(schema_with = component_state_schema)]
    pub state: ComponentState,
    pub old_image: Option<String>,
    pub new_image: String,
    /// The pod the upgrade replaces, found by step 0.
    pub old_pod: Option<String>,
    pub steps: Vec<StepView>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradeView {
    pub id: i64,
    /// The namespace of the job (its cluster's).
    pub namespace: Namespace,
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
    /// The drover replica that runs the job (its id: host, process and a
    /// random part; with several replicas on PostgreSQL, the holder of the
    /// job's lease), as pools show theirs in `status.driver`. `null` until
    /// a runner claims it and once it has ended.
    #[schema(required = true)]
    pub driver: Option<String>,
    /// Components that run the target version because of this job.
    pub upgraded_components: Vec<Component>,
    pub progress: Vec<ComponentProgress>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl From<StepRecord> for StepView {
    fn from(s: StepRecord) -> Self {
        StepView {
            step: s.step,
            name: s.name,
            state: s.state,
            attempts: s.attempts,
            api_retries: s.api_retries,
            started_at: s.started_at,
            finished_at: s.finished_at,
            error: s.error,
        }
    }
}

impl From<ComponentSteps> for ComponentProgress {
    fn from(c: ComponentSteps) -> Self {
        let ComponentSteps { component: record, steps } = c;
        ComponentProgress {
            component: record.component,
            state: record.state,
            old_image: record.old_image,
            new_image: record.new_image,
            old_pod: record.old_pod,
            steps: steps.into_iter().map(StepView::from).collect(),
        }
    }
}

/// The job as the API shows it: where it is, and its components' progress.
impl From<JobDetail> for UpgradeView {
    fn from(d: JobDetail) -> Self {
        let JobDetail { job, components } = d;
        let current = job.state.is_active().then(|| Position {
            component: job.components.get(job.component_index).copied().unwrap_or(Component::KubeApiserver),
            step: job.step.number(),
            step_name: job.step.name().to_owned(),
        });
        let progress: Vec<ComponentProgress> = components.into_iter().map(ComponentProgress::from).collect();
        UpgradeView {
            upgraded_components: progress
                .iter()
                .filter(|p| p.state == ComponentState::Upgraded)
                .map(|p| p.component)
                .collect(),
            id: job.id,
            namespace: job.cluster.namespace,
            cluster: job.cluster.name,
            version: job.version,
            from_version: job.from_version,
            components: job.components,
            image_repository: job.image_repository,
            force: job.force,
            state: job.state,
            current,
            cancel_requested: job.cancel_requested,
            driver: job.owner.filter(|_| job.state.is_active()),
            error: job.error,
            progress,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            updated_at: job.updated_at,
        }
    }
}
