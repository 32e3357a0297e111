//! One job, from its stored position to its end.
//!
//! The job row says where the job is (component and step); it moves only
//! after a step has finished, in the same transaction as the step's end,
//! so a crash at any moment resumes with the step that was running, which
//! looks at the cluster first and is safe to run again. Step 0 runs for
//! every component before any component is changed.
//!
//! A cancel or a failure winds the job down, and what the wind-down does
//! is decided from the real DaemonSet as the runner sees it, not from the
//! stored step (which may lag one write behind the cluster after a crash):
//! a cancel keeps the old spec only while the real DaemonSet is untouched,
//! and otherwise finishes the component first. The wind-down is persisted,
//! so a restart in the middle of it finishes it.
//!
//! Every write goes through the job's [`JobClaim`]: a runner that no longer
//! owns the job stops before it writes or touches the cluster again.

use k8s_openapi::api::apps::v1::DaemonSet;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::claim::{JobClaim, JobError};
use super::plan::{self, OnCancel};
use super::steps::{StepError, StepRunner, Target};
use crate::clusters::ConnectError;
use crate::db::{self, upgrades::Job};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::upgrade::{Component, ComponentState, JobState, Step, WindDown};
use crate::k8s::ClusterApi;

/// Claims job `id` and drives it until it ends, until `stop` fires (then
/// at a step boundary, or in a wait, which is redone on the next start),
/// or until the job is no longer this runner's. Errors are the store's
/// and the lost claim: anything the cluster does ends the job with a
/// reason, while a store error leaves the job where it was, for the runner
/// to try again later.
#[tracing::instrument(skip(ctx, stop), fields(otel.name = "upgrade job", trace_id = tracing::field::Empty))]
pub async fn run_job(ctx: &Context, id: i64, stop: &CancellationToken) -> Result<(), JobError> {
    crate::telemetry::context::record_trace_id(&tracing::Span::current());
    let claimed = JobClaim::claim(&ctx.db, ctx.leases.as_ref(), id, &ctx.owner, ctx.settings.claims).await?;
    let Some((lease, job)) = claimed else { return Ok(()) };
    let mut driver = Driver { ctx, lease, job, api: None, stop };
    match crate::clusters::connect(ctx.db.background(), &driver.job.cluster, ctx.settings.retry).await {
        Ok(api) => {
            let fence = driver.lease.fence.clone();
            let gate: crate::k8s::ops::Gate = std::sync::Arc::new(move || fence.check().err().map(|l| l.to_string()));
            driver.api = Some(api.with_metrics(ctx.metrics.clone()).with_gate(gate));
        }
        Err(ConnectError::Store(e)) => return Err(e.into()),
        Err(e) => {
            let why = match e {
                ConnectError::Unusable { source, .. } => {
                    format!("the cluster's stored credentials cannot be used: {source}")
                }
                _ => "the cluster is no longer registered".to_owned(),
            };
            let msg = format!("{why}; {}", driver.stopped_at());
            return driver.finish(JobState::Failed, &msg).await;
        }
    }
    driver.drive().await?;
    if driver.job.state.is_active() {
        // Stopped at a safe point, not ended: let the next runner take it at once.
        driver.lease.release().await?;
    }
    Ok(())
}

struct Driver<'a> {
    ctx: &'a Context,
    lease: JobClaim,
    api: Option<ClusterApi>,
    job: Job,
    stop: &'a CancellationToken,
}

/// How a step ended, for the driver (a step stopped by shutdown did not end).
enum Ended {
    Done,
    Cancelled,
    Failed(StepError),
}

/// A write transaction of the job, whose claim it has proven.
type Tx = db::WriteTx;

impl Driver<'_> {
    fn component_at(&self, i: usize) -> Component {
        // The index only ever comes from positions within `components`.
        self.job.components.get(i).copied().unwrap_or(Component::KubeApiserver)
    }

    fn component(&self) -> Component {
        self.component_at(self.job.component_index)
    }

    /// Where a job that cannot go on stopped, and what that may have left.
    fn stopped_at(&self) -> String {
        let (c, step) = (self.component(), self.job.step);
        // Step 0 of every component runs before anything is changed.
        if self.job.wind_down.is_none() && step == Step::CheckPods {
            return "nothing was changed".to_owned();
        }
        format!(
            "the job stopped at step {} ({}) of {c}: check DaemonSets {} and {} in kube-system",
            step.number(),
            step.name(),
            c.daemonset(),
            c.temp_daemonset()
        )
    }

    async fn drive(&mut self) -> Result<(), JobError> {
        if self.job.wind_down.is_some() {
            return self.wind_down().await;
        }
        let n = self.job.components.len();
        if self.job.step == Step::CheckPods {
            for i in self.job.component_index..n {
                if self.stop.is_cancelled() {
                    return Ok(());
                }
                let Some((ended, mut tx)) = self.step(i, Step::CheckPods).await? else { return Ok(()) };
                if let Ended::Failed(e) = ended {
                    let msg = format!("{}; nothing was changed", self.failure(i, Step::CheckPods, &e));
                    return self.finish_in(tx, Some((i, ComponentState::Failed)), None, JobState::Failed, &msg).await;
                }
                // Not cancellable: the checks take a moment and change nothing.
                let next = if i + 1 < n { (i + 1, Step::CheckPods) } else { (0, Step::CreateTemp) };
                if i + 1 == n {
                    let ev =
                        self.event(EventType::Normal, "PodsChecked", "every component runs exactly one pod".into());
                    db::events::record(&mut tx, &ev, crate::clock::wall()).await?;
                }
                self.move_to(tx, next).await?;
            }
        }
        loop {
            if self.stop.is_cancelled() {
                return Ok(());
            }
            let (i, step) = (self.job.component_index, self.job.step);
            if self.lease.check().await?.cancel_requested && self.on_cancel(i).await? == OnCancel::RemoveCopy {
                return self.cancel(step).await;
            }
            if step == Step::CreateTemp {
                let mut tx = self.lease.begin().await?;
                db::upgrade_components::set_component_state(&mut tx, self.job.id, i, ComponentState::Upgrading).await?;
                tx.commit().await?;
                self.ctx.changes.job(self.job.id);
            }
            let Some((ended, mut tx)) = self.step(i, step).await? else { return Ok(()) };
            match ended {
                Ended::Done => {}
                Ended::Cancelled => {
                    tx.commit().await?;
                    self.ctx.changes.job(self.job.id);
                    return self.cancel(step).await;
                }
                Ended::Failed(e) => {
                    tx.commit().await?;
                    self.ctx.changes.job(self.job.id);
                    return self.on_failure(i, step, e).await;
                }
            }
            // The step's end and what follows from it are one write.
            if let Some(next) = step.next() {
                self.move_to(tx, (i, next)).await?;
                continue;
            }
            let c = self.component();
            let msg = format!("{c} runs {}", self.job.version);
            db::upgrade_components::set_component_state(&mut tx, self.job.id, i, ComponentState::Upgraded).await?;
            db::events::record(&mut tx, &self.event(EventType::Normal, "ComponentUpgraded", msg), crate::clock::wall())
                .await?;
            if i + 1 == n {
                return self.finish_in(tx, None, None, JobState::Succeeded, "").await;
            }
            self.move_to(tx, (i + 1, Step::CreateTemp)).await?;
        }
    }

    /// What a cancel does at component `i`, from its real DaemonSet as it
    /// is now. When the cluster cannot be read, the decision waits: the
    /// job goes on, and the next look decides.
    async fn on_cancel(&self, i: usize) -> Result<OnCancel, JobError> {
        let Some(api) = self.api.as_ref() else { return Ok(OnCancel::RemoveCopy) };
        let t = self.target(i).await?;
        let Some(saved) = t.original.as_ref() else { return Ok(OnCancel::RemoveCopy) };
        match api.get_daemonset(&t.component.daemonset()).await {
            Ok(real) => Ok(plan::on_cancel(real.map(|r| plan::real_state(&r, saved, t.component, &t.new_image)))),
            Err(e) => {
                tracing::warn!(job = self.job.id, error = %e, "cannot read the real DaemonSet to decide a cancel");
                Ok(OnCancel::FinishComponent)
            }
        }
    }

    /// Runs one step and records its start, and its end, error and
    /// retries in a transaction it answers uncommitted: the caller adds
    /// what follows from the end (the next position, a state, an event).
    /// `None` when shutdown stopped the step: it did not end, and runs
    /// again on the next start.
    #[tracing::instrument(skip(self), fields(otel.name = "upgrade step", job = self.job.id))]
    async fn step(&self, position: usize, step: Step) -> Result<Option<(Ended, Tx)>, JobError> {
        let target = self.target(position).await?;
        let mut tx = self.lease.begin().await?;
        db::upgrade_steps::begin_step(&mut tx, self.job.id, position, step, crate::clock::wall()).await?;
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        let ended = match self.api.as_ref() {
            None => Ended::Failed(StepError::Check("no client".into())),
            Some(api) => {
                match (StepRunner { ctx: self.ctx, api, lease: &self.lease, stop: self.stop }).run(&target, step).await
                {
                    Ok(()) => Ended::Done,
                    Err(StepError::Job(e)) => return Err(e),
                    Err(StepError::Interrupted) => return Ok(None),
                    Err(StepError::Cancelled) => Ended::Cancelled,
                    Err(e) => Ended::Failed(e),
                }
            }
        };
        let error = match &ended {
            Ended::Failed(e) => Some(e.to_string()),
            Ended::Cancelled => Some("cancelled on request".to_owned()),
            Ended::Done => None,
        };
        let retries = self.api.as_ref().map_or(0, ClusterApi::take_retries);
        let mut tx = self.lease.begin().await?;
        db::upgrade_steps::end_step(
            &mut tx,
            self.job.id,
            position,
            step,
            error.as_deref(),
            retries,
            crate::clock::wall(),
        )
        .await?;
        Ok(Some((ended, tx)))
    }

    async fn target(&self, position: usize) -> sqlx::Result<Target> {
        let rows = db::upgrade_components::components(self.ctx.db.background(), self.job.id).await?;
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
            component: row.component,
            new_image: row.new_image,
            old_pod: row.old_pod,
            old_image: row.old_image,
            original,
        })
    }

    /// Moves the job to `(index, step)` in `tx`, and commits it.
    async fn move_to(&mut self, mut tx: Tx, (index, step): (usize, Step)) -> Result<(), JobError> {
        db::upgrades::set_position(&mut tx, self.job.id, index, step, crate::clock::wall()).await?;
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        self.job.component_index = index;
        self.job.step = step;
        Ok(())
    }

    fn failure(&self, i: usize, step: Step, e: &StepError) -> String {
        let c = self.component_at(i);
        format!("step {} ({}) of {c} failed: {e}", step.number(), step.name())
    }

    /// A cancel found the real DaemonSet without the new image: stop here
    /// and remove the copy.
    async fn cancel(&mut self, step: Step) -> Result<(), JobError> {
        let c = self.component();
        let msg = format!("cancelled on request at step {} ({}) of {c}", step.number(), step.name());
        self.begin_wind_down(WindDown::Cleanup, JobState::Cancelled, msg, None, None).await
    }

    /// A step failed: undo what can be undone for this component.
    async fn on_failure(&mut self, i: usize, step: Step, e: StepError) -> Result<(), JobError> {
        let msg = self.failure(i, step, &e);
        let warn = self.event(EventType::Warning, "StepFailed", msg.clone());
        match step {
            Step::CreateTemp | Step::WaitTempRunning => {
                self.begin_wind_down(WindDown::Cleanup, JobState::Failed, msg, Some(warn), None).await
            }
            Step::UpdateDaemonSet | Step::WaitOldPodGone | Step::WaitNewRunning => {
                self.begin_wind_down(WindDown::Rollback, JobState::Failed, msg, Some(warn), None).await
            }
            // The new pods run: the component is upgraded, whatever follows.
            Step::DeleteTemp => {
                self.begin_wind_down(
                    WindDown::Cleanup,
                    JobState::Failed,
                    msg,
                    Some(warn),
                    Some(ComponentState::Upgraded),
                )
                .await
            }
            Step::WaitHealthy => {
                let c = self.component();
                let msg = format!("{msg}; {c} runs the new image");
                let tx = self.lease.begin().await?;
                self.finish_in(tx, Some((i, ComponentState::Upgraded)), Some(warn), JobState::Failed, &msg).await
            }
            Step::CheckPods | Step::Rollback | Step::Cleanup => {
                let tx = self.lease.begin().await?;
                self.finish_in(tx, None, Some(warn), JobState::Failed, &msg).await
            }
        }
    }

    /// Persists the wind-down (with the events and the component state
    /// that go with it), then runs it.
    async fn begin_wind_down(
        &mut self,
        kind: WindDown,
        end: JobState,
        msg: String,
        first: Option<NewEvent>,
        component_state: Option<ComponentState>,
    ) -> Result<(), JobError> {
        let mut tx = self.lease.begin().await?;
        let now = crate::clock::wall();
        if let Some(ev) = &first {
            db::events::record(&mut tx, ev, now).await?;
        }
        if let Some(state) = component_state {
            db::upgrade_components::set_component_state(&mut tx, self.job.id, self.job.component_index, state).await?;
        }
        if kind == WindDown::Rollback {
            let ev =
                self.event(EventType::Warning, "RollingBack", format!("restoring {}'s saved spec", self.component()));
            db::events::record(&mut tx, &ev, now).await?;
        }
        db::upgrades::start_wind_down(&mut tx, self.job.id, kind, end, &msg, now).await?;
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        self.job.wind_down = Some(kind);
        self.job.wind_down_state = Some(end);
        self.job.error = Some(msg);
        self.wind_down().await
    }

    /// Rollback or cleanup of the current component, then the job's end.
    /// Both remove the copy only once the real pods run the real template;
    /// what the component runs at the end is read from the cluster.
    async fn wind_down(&mut self) -> Result<(), JobError> {
        let (i, c) = (self.job.component_index, self.component());
        let rollback = self.job.wind_down == Some(WindDown::Rollback);
        let end = self.job.wind_down_state.unwrap_or(JobState::Failed);
        let base = self.job.error.clone().unwrap_or_default();
        let step = if rollback { Step::Rollback } else { Step::Cleanup };
        let Some((ended, tx)) = self.step(i, step).await? else { return Ok(()) };
        if let (Ended::Done, true) = (&ended, rollback) {
            let msg = format!("{base}; {c} was rolled back to its saved spec");
            let ev = self.event(EventType::Normal, "RolledBack", format!("{c} runs its saved spec again"));
            return self.finish_in(tx, Some((i, ComponentState::RolledBack)), Some(ev), end, &msg).await;
        }
        // What the component runs now is read from the cluster, outside
        // any transaction.
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        let runs_new = self.runs_new_image(i).await;
        let (state, end, msg) = match ended {
            Ended::Done => {
                let (state, runs) = match runs_new {
                    Some(true) => (ComponentState::Upgraded, "runs the new image"),
                    Some(false) if end == JobState::Cancelled => (ComponentState::Cancelled, "keeps its old spec"),
                    Some(false) => (ComponentState::Failed, "keeps its old spec"),
                    None => (ComponentState::Failed, "could not be read"),
                };
                (state, end, format!("{base}; {c} {runs}; no temporary DaemonSet is left"))
            }
            Ended::Cancelled | Ended::Failed(_) => {
                let why = match ended {
                    Ended::Failed(e) => e.to_string(),
                    _ => "cancelled".to_owned(),
                };
                let msg = format!(
                    "{base}; the {} failed too ({why}): check DaemonSets {} and {} in kube-system",
                    step.name(),
                    c.daemonset(),
                    c.temp_daemonset()
                );
                let state = if runs_new == Some(true) { ComponentState::Upgraded } else { ComponentState::Failed };
                (state, JobState::Failed, msg)
            }
        };
        self.end_component_and_job(i, state, end, &msg).await
    }

    /// Whether component `i`'s real DaemonSet has the new image, as read now.
    async fn runs_new_image(&self, i: usize) -> Option<bool> {
        let api = self.api.as_ref()?;
        let t = self.target(i).await.ok()?;
        let real = api.get_daemonset(&t.component.daemonset()).await.ok()??;
        Some(plan::daemonset_image(&real, t.component).as_deref() == Some(t.new_image.as_str()))
    }

    /// Sets component `i`'s state and ends the job, in one transaction.
    async fn end_component_and_job(
        &mut self,
        i: usize,
        state: ComponentState,
        end: JobState,
        msg: &str,
    ) -> Result<(), JobError> {
        let tx = self.lease.begin().await?;
        self.finish_in(tx, Some((i, state)), None, end, msg).await
    }

    async fn finish(&mut self, state: JobState, msg: &str) -> Result<(), JobError> {
        let tx = self.lease.begin().await?;
        self.finish_in(tx, None, None, state, msg).await
    }

    /// Ends the job in `tx`, naming the components that were upgraded,
    /// with its event; sets a component's state and records an event that
    /// explains the end, when given, in the same transaction.
    async fn finish_in(
        &mut self,
        mut tx: Tx,
        component: Option<(usize, ComponentState)>,
        before: Option<NewEvent>,
        state: JobState,
        msg: &str,
    ) -> Result<(), JobError> {
        let now = crate::clock::wall();
        if let Some((i, c_state)) = component {
            db::upgrade_components::set_component_state(&mut tx, self.job.id, i, c_state).await?;
        }
        if let Some(ev) = &before {
            db::events::record(&mut tx, ev, now).await?;
        }
        let rows = db::upgrade_components::components(tx.exec(), self.job.id).await?;
        let upgraded: Vec<&str> =
            rows.iter().filter(|r| r.state == ComponentState::Upgraded).map(|r| r.component.as_str()).collect();
        let error = match state {
            JobState::Succeeded => None,
            _ if upgraded.is_empty() => Some(format!("{msg}; no component was upgraded")),
            _ => Some(format!("{msg}; upgraded: {}", upgraded.join(", "))),
        };
        db::upgrades::finish(&mut tx, self.job.id, state, error.as_deref(), now).await?;
        let (type_, reason) = match state {
            JobState::Succeeded => (EventType::Normal, "Succeeded"),
            JobState::Cancelled => (EventType::Normal, "Cancelled"),
            _ => (EventType::Warning, "Failed"),
        };
        let message = error.clone().unwrap_or_else(|| format!("every component runs {}", self.job.version));
        db::events::record(&mut tx, &self.event(type_, reason, message), now).await?;
        tx.commit().await?;
        self.ctx.changes.job(self.job.id);
        tracing::info!(job = self.job.id, cluster = %self.job.cluster, state = state.as_str(), "upgrade job ended");
        self.job.state = state;
        Ok(())
    }

    fn event(&self, type_: EventType, reason: &'static str, message: String) -> NewEvent {
        NewEvent::job(self.job.id, type_, reason, message)
    }
}
