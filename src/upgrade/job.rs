//! One job, from its stored position to its end.
//!
//! The job row says where the job is (component and step); it moves only
//! after a step has finished, so a restart at any moment resumes with the
//! step that was running, which is safe to run again. Step 0 runs for every
//! component before any component is changed. A failure or a cancel winds
//! the job down (a rollback or a cleanup), and the wind-down is persisted
//! too, so a restart in the middle of it finishes it.

use chrono::Utc;
use k8s_openapi::api::apps::v1::DaemonSet;

use super::Context;
use super::steps::{StepError, StepRunner, Target};
use crate::db::{self, upgrades::Job};
use crate::domain::event::{EventType, NewEvent, SubjectKind};
use crate::domain::upgrade::{Component, JobState, Step};
use crate::k8s::ClusterApi;

const ROLLBACK: &str = "rollback";
const CLEANUP: &str = "cleanup";

/// Drives job `id` until it ends. Errors are the store's only: anything the
/// cluster does ends the job with a reason, while a store error leaves the
/// job where it was, for the runner to try again later.
#[tracing::instrument(skip(ctx))]
pub async fn run_job(ctx: &Context, id: i64) -> sqlx::Result<()> {
    let Some(job) = db::upgrades::get(&ctx.db, id).await? else { return Ok(()) };
    if !job.state.is_active() {
        return Ok(());
    }
    let started = db::upgrades::mark_running(&ctx.db, id, Utc::now()).await?;
    let credentials = db::clusters::credentials(&ctx.db, &job.cluster).await?;
    let mut driver = Driver { ctx, api: None, job };
    if started {
        driver.event(EventType::Normal, "Started", format!("upgrading to {}", driver.job.version)).await?;
    } else {
        let (c, s) = (driver.component(), driver.job.step);
        let at = format!("resuming at step {} ({}) of {c}", s.number(), s.name());
        driver.event(EventType::Normal, "Resumed", at).await?;
    }
    let Some(credentials) = credentials else {
        return driver.finish(JobState::Failed, "the cluster is no longer registered").await;
    };
    match credentials.client(ctx.settings.retry.call_timeout).await {
        Ok(client) => driver.api = Some(ClusterApi::new(client, ctx.settings.retry).with_metrics(ctx.metrics.clone())),
        Err(e) => return driver.finish(JobState::Failed, &format!("cannot use the cluster's credentials: {e}")).await,
    }
    driver.drive().await
}

struct Driver<'a> {
    ctx: &'a Context,
    api: Option<ClusterApi>,
    job: Job,
}

impl Driver<'_> {
    fn component(&self) -> Component {
        // The index only ever comes from positions within `components`.
        self.job.components.get(self.job.component_index).copied().unwrap_or(Component::KubeApiserver)
    }

    async fn drive(&mut self) -> sqlx::Result<()> {
        if self.job.wind_down.is_some() {
            return self.wind_down().await;
        }
        let n = self.job.components.len();
        if self.job.step == Step::CheckPods {
            for i in self.job.component_index..n {
                self.move_to(i, Step::CheckPods).await?;
                match self.step(i, Step::CheckPods).await {
                    Ok(()) => {}
                    Err(StepError::Db(e)) => return Err(e),
                    Err(e) => {
                        db::upgrades::set_component_state(&self.ctx.db, self.job.id, i, "failed").await?;
                        let msg = format!("{}; nothing was changed", self.failure(i, Step::CheckPods, &e));
                        return self.finish(JobState::Failed, &msg).await;
                    }
                }
            }
            self.event(EventType::Normal, "PodsChecked", "every component runs exactly one pod").await?;
            self.move_to(0, Step::CreateTemp).await?;
        }
        loop {
            let (i, step, c) = (self.job.component_index, self.job.step, self.component());
            if step.cancellable_before() && db::upgrades::cancel_requested(&self.ctx.db, self.job.id).await? {
                return self.cancel(i, step).await;
            }
            if step == Step::CreateTemp {
                db::upgrades::set_component_state(&self.ctx.db, self.job.id, i, "upgrading").await?;
            }
            match self.step(i, step).await {
                Ok(()) => {}
                Err(StepError::Db(e)) => return Err(e),
                Err(StepError::Cancelled) => return self.cancel(i, step).await,
                Err(e) => return self.on_failure(i, step, e).await,
            }
            if let Some(next) = step.next() {
                self.move_to(i, next).await?;
                continue;
            }
            db::upgrades::set_component_state(&self.ctx.db, self.job.id, i, "upgraded").await?;
            self.event(EventType::Normal, "ComponentUpgraded", format!("{c} runs {}", self.job.version)).await?;
            if i + 1 == n {
                return self.finish(JobState::Succeeded, "").await;
            }
            self.move_to(i + 1, Step::CreateTemp).await?;
        }
    }

    /// Runs one step and records its start, end, error and retries.
    async fn step(&self, position: usize, step: Step) -> Result<(), StepError> {
        let Some(api) = self.api.as_ref() else { return Err(StepError::Check("no client".into())) };
        let target = self.target(position).await?;
        db::upgrades::begin_step(&self.ctx.db, self.job.id, position, step, Utc::now()).await?;
        self.ctx.changes.job(self.job.id);
        let result = StepRunner { ctx: self.ctx, api }.run(&target, step).await;
        let error = result.as_ref().err().map(|e| e.to_string());
        let retries = api.take_retries();
        db::upgrades::end_step(&self.ctx.db, self.job.id, position, step, error.as_deref(), retries, Utc::now())
            .await?;
        self.ctx.changes.job(self.job.id);
        result
    }

    async fn target(&self, position: usize) -> sqlx::Result<Target> {
        let rows = db::upgrades::components(&self.ctx.db, self.job.id).await?;
        let row = rows.into_iter().find(|r| r.position == position as i64).ok_or_else(|| {
            sqlx::Error::Decode(format!("upgrade job {}: component {position} is missing", self.job.id).into())
        })?;
        let original: Option<DaemonSet> =
            row.original_daemonset.as_deref().map(serde_json::from_str).transpose().map_err(|e| {
                sqlx::Error::Decode(format!("upgrade job {}: saved DaemonSet: {e}", self.job.id).into())
            })?;
        Ok(Target {
            job: self.job.id,
            position,
            component: row.component.parse().map_err(|e: String| sqlx::Error::Decode(e.into()))?,
            new_image: row.new_image,
            old_pod: row.old_pod,
            old_image: row.old_image,
            original,
        })
    }

    async fn move_to(&mut self, index: usize, step: Step) -> sqlx::Result<()> {
        db::upgrades::set_position(&self.ctx.db, self.job.id, index, step, Utc::now()).await?;
        self.ctx.changes.job(self.job.id);
        self.job.component_index = index;
        self.job.step = step;
        Ok(())
    }

    fn failure(&self, i: usize, step: Step, e: &StepError) -> String {
        let c = self.job.components.get(i).copied().unwrap_or(Component::KubeApiserver);
        format!("step {} ({}) of {c} failed: {e}", step.number(), step.name())
    }

    async fn cancel(&mut self, i: usize, step: Step) -> sqlx::Result<()> {
        let c = self.component();
        let msg = format!(
            "cancelled on request before step {} ({}) of {c}; {c} keeps its old spec",
            step.number(),
            step.name()
        );
        db::upgrades::set_component_state(&self.ctx.db, self.job.id, i, "cancelled").await?;
        self.begin_wind_down(CLEANUP, JobState::Cancelled, msg).await
    }

    /// A step failed: undo what can be undone for this component.
    async fn on_failure(&mut self, i: usize, step: Step, e: StepError) -> sqlx::Result<()> {
        let msg = self.failure(i, step, &e);
        self.event(EventType::Warning, "StepFailed", msg.clone()).await?;
        let id = self.job.id;
        match step {
            Step::CreateTemp | Step::WaitTempRunning => self.begin_wind_down(CLEANUP, JobState::Failed, msg).await,
            Step::UpdateDaemonSet | Step::WaitOldPodGone | Step::WaitNewRunning => {
                self.event(EventType::Warning, "RollingBack", format!("restoring {}'s saved spec", self.component()))
                    .await?;
                self.begin_wind_down(ROLLBACK, JobState::Failed, msg).await
            }
            // The new pods run: the component is upgraded, whatever follows.
            Step::DeleteTemp => {
                db::upgrades::set_component_state(&self.ctx.db, id, i, "upgraded").await?;
                self.begin_wind_down(CLEANUP, JobState::Failed, msg).await
            }
            Step::WaitHealthy => {
                db::upgrades::set_component_state(&self.ctx.db, id, i, "upgraded").await?;
                let c = self.component();
                self.finish(JobState::Failed, &format!("{msg}; {c} runs the new image")).await
            }
            Step::CheckPods | Step::Rollback | Step::Cleanup => self.finish(JobState::Failed, &msg).await,
        }
    }

    async fn begin_wind_down(&mut self, kind: &str, end: JobState, msg: String) -> sqlx::Result<()> {
        db::upgrades::start_wind_down(&self.ctx.db, self.job.id, kind, end, &msg, Utc::now()).await?;
        self.job.wind_down = Some(kind.to_owned());
        self.job.wind_down_state = Some(end);
        self.job.error = Some(msg);
        self.wind_down().await
    }

    /// Rollback or cleanup of the current component, then the job's end.
    async fn wind_down(&mut self) -> sqlx::Result<()> {
        let (i, c) = (self.job.component_index, self.component());
        let rollback = self.job.wind_down.as_deref() == Some(ROLLBACK);
        let end = self.job.wind_down_state.unwrap_or(JobState::Failed);
        let base = self.job.error.clone().unwrap_or_default();
        let step = if rollback { Step::Rollback } else { Step::Cleanup };
        match self.step(i, step).await {
            Ok(()) if rollback => {
                db::upgrades::set_component_state(&self.ctx.db, self.job.id, i, "rolled_back").await?;
                self.event(EventType::Normal, "RolledBack", format!("{c} runs its saved spec again")).await?;
                let msg = format!("{base}; {c} was rolled back to its saved spec");
                self.finish(end, &msg).await
            }
            Ok(()) => {
                let msg = format!("{base}; no temporary DaemonSet is left");
                self.finish(end, &msg).await
            }
            Err(StepError::Db(e)) => Err(e),
            Err(e) => {
                let msg = format!(
                    "{base}; the {} failed too ({e}): check DaemonSets {} and {} in kube-system",
                    step.name(),
                    c.daemonset(),
                    c.temp_daemonset()
                );
                self.finish(JobState::Failed, &msg).await
            }
        }
    }

    /// Ends the job, naming the components that were upgraded.
    async fn finish(&mut self, state: JobState, msg: &str) -> sqlx::Result<()> {
        let rows = db::upgrades::components(&self.ctx.db, self.job.id).await?;
        let upgraded: Vec<&str> = rows.iter().filter(|r| r.state == "upgraded").map(|r| r.component.as_str()).collect();
        let error = match state {
            JobState::Succeeded => None,
            _ if upgraded.is_empty() => Some(format!("{msg}; no component was upgraded")),
            _ => Some(format!("{msg}; upgraded: {}", upgraded.join(", "))),
        };
        let now = Utc::now();
        let mut tx = crate::db::begin_write(&self.ctx.db).await?;
        db::upgrades::finish(&mut *tx, self.job.id, state, error.as_deref(), now).await?;
        let (type_, reason) = match state {
            JobState::Succeeded => (EventType::Normal, "Succeeded"),
            JobState::Cancelled => (EventType::Normal, "Cancelled"),
            _ => (EventType::Warning, "Failed"),
        };
        let message = error.clone().unwrap_or_else(|| format!("every component runs {}", self.job.version));
        db::events::record(&mut *tx, &job_event(self.job.id, type_, reason, message), now).await?;
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        tracing::info!(job = self.job.id, cluster = %self.job.cluster, state = state.as_str(), "upgrade job ended");
        self.job.state = state;
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &'static str, message: impl Into<String>) -> sqlx::Result<()> {
        db::events::record(&self.ctx.db, &job_event(self.job.id, type_, reason, message.into()), Utc::now()).await?;
        self.ctx.changes.job(self.job.id);
        Ok(())
    }
}

/// An event about job `id`.
pub fn job_event(id: i64, type_: EventType, reason: &'static str, message: String) -> NewEvent {
    NewEvent { kind: SubjectKind::Job, subject: id.to_string(), type_, reason, message }
}
