//! One step of one component, against the cluster. Every step may be cut
//! short by a crash and run again from its beginning, so each first looks
//! at the cluster and decides from what it sees: the copy is applied
//! (server-side, idempotent), the real DaemonSet is changed only when it
//! does not already say what the step would write and only while its copy
//! runs, the copy is removed only once the real pods run the real template
//! and only when it is this job's, and waits just look again.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::claim::{JobClaim, JobError};
use super::plan::{self, PlanError};
use crate::db;
use crate::domain::upgrade::{Component, Step};
use crate::k8s::{CallError, ClusterApi, Deletion};

/// Why a step did not finish.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("timed out after {after:?} waiting until {what} (last seen: {last})")]
    Timeout { what: String, after: Duration, last: String },
    /// The cluster is not in a shape this upgrade can handle.
    #[error("{0}")]
    Check(String),
    /// A cancel was requested while the step could still stop cleanly.
    #[error("cancelled on request")]
    Cancelled,
    /// drover is shutting down; the step stopped while it only looked, and
    /// runs again from its beginning on the next start.
    #[error("interrupted by shutdown")]
    Interrupted,
    #[error(transparent)]
    Job(#[from] JobError),
}

impl From<sqlx::Error> for StepError {
    fn from(e: sqlx::Error) -> Self {
        Self::Job(JobError::Store(e))
    }
}

impl From<PlanError> for StepError {
    fn from(e: PlanError) -> Self {
        Self::Check(e.to_string())
    }
}

/// The component a step works on, with what step 0 saved about it.
pub struct Target {
    pub job: i64,
    pub position: usize,
    pub component: Component,
    pub new_image: String,
    pub old_pod: Option<String>,
    pub old_image: Option<String>,
    pub original: Option<DaemonSet>,
}

impl Target {
    pub fn original(&self) -> Result<&DaemonSet, StepError> {
        // Step 0 always saves it; a missing one means the row was tampered with.
        self.original
            .as_ref()
            .ok_or_else(|| StepError::Check("the saved DaemonSet is missing; step 0 did not run".into()))
    }

    fn old_pod(&self) -> Result<&str, StepError> {
        self.old_pod
            .as_deref()
            .ok_or_else(|| StepError::Check("the old pod's name is missing; step 0 did not run".into()))
    }
}

/// Runs steps of one job on one cluster.
pub struct StepRunner<'a> {
    pub ctx: &'a Context,
    pub api: &'a ClusterApi,
    pub lease: &'a JobClaim,
    /// Fires on shutdown: waits stop at once (they only look).
    pub stop: &'a CancellationToken,
}

impl StepRunner<'_> {
    /// Runs `step`. On shutdown, a step that only looks stops at once; one
    /// that writes finishes its write (its waits stop at once).
    #[tracing::instrument(skip_all, fields(job = t.job, component = %t.component, step = step.name()))]
    pub async fn run(&self, t: &Target, step: Step) -> Result<(), StepError> {
        if step.writes_cluster() {
            return self.run_step(t, step).await;
        }
        tokio::select! {
            _ = self.stop.cancelled() => Err(StepError::Interrupted),
            r = self.run_step(t, step) => r,
        }
    }

    async fn run_step(&self, t: &Target, step: Step) -> Result<(), StepError> {
        let c = t.component;
        match step {
            Step::CheckPods => self.check_pods(t).await,
            Step::CreateTemp => Ok(self.api.apply_daemonset(&plan::temp_daemonset(t.original()?, c, t.job)).await?),
            Step::WaitTempRunning => {
                let sel = c.temp_pod_selector();
                self.wait_pods(t, &format!("the pods matching {sel} are Running"), &sel, None, None, true).await
            }
            Step::UpdateDaemonSet => self.update_real(t).await,
            Step::WaitOldPodGone => {
                let old = t.old_pod()?;
                let api = self.api;
                self.wait(&format!("pod {old} is gone"), false, || async move {
                    Ok(if api.pod_exists(old).await? { Err("the pod still exists".into()) } else { Ok(()) })
                })
                .await
            }
            Step::WaitNewRunning => {
                let (sel, old) = (c.pod_selector(), t.old_pod()?);
                let what = format!("the pods matching {sel} run {} and are Running", t.new_image);
                self.wait_pods(t, &what, &sel, Some(old), Some(&t.new_image), false).await
            }
            Step::DeleteTemp | Step::Cleanup => self.remove_temp(t).await,
            Step::WaitHealthy => {
                let api = self.api;
                self.wait("the API server's /healthz answers ok", false, || async move { Ok(api.healthz_once().await) })
                    .await
            }
            Step::Rollback => self.rollback(t).await,
        }
    }

    /// Step 0: exactly one pod runs the component, and its DaemonSet can be
    /// upgraded. Saves the pod's name and the DaemonSet before anything
    /// changes, for step 4 and for a rollback.
    async fn check_pods(&self, t: &Target) -> Result<(), StepError> {
        let c = t.component;
        let sel = c.pod_selector();
        let pods = self.api.list_pods(&sel).await?;
        let pod = match pods.as_slice() {
            [one] => one.metadata.name.clone().unwrap_or_default(),
            [] => {
                return Err(StepError::Check(format!(
                    "no pod matches {sel} in kube-system, so {c} does not look self-hosted; expected exactly one"
                )));
            }
            many => {
                let names: Vec<&str> = many.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
                return Err(StepError::Check(format!(
                    "{} pods match {sel} in kube-system ({}); expected exactly one, so it is unclear which one the upgrade replaces",
                    many.len(),
                    names.join(", ")
                )));
            }
        };
        let ds =
            self.api.get_daemonset(&c.daemonset()).await?.ok_or_else(|| {
                StepError::Check(format!("DaemonSet {} does not exist in kube-system", c.daemonset()))
            })?;
        plan::with_image(&ds, c, &t.new_image)?;
        let saved =
            serde_json::to_string(&ds).map_err(|e| StepError::Check(format!("cannot save the DaemonSet: {e}")))?;
        let image = plan::daemonset_image(&ds, c);
        let mut tx = self.lease.begin().await?;
        db::upgrade_components::save_observation(&mut tx, t.job, t.position, &pod, image.as_deref(), &saved).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Step 3: the real DaemonSet gets the new image, unless it already has
    /// it (a redo after a crash). It is changed only while the copy runs:
    /// without its copy, the component would have no working instance
    /// while the real one rolls.
    async fn update_real(&self, t: &Target) -> Result<(), StepError> {
        let c = t.component;
        let real = self.api.get_daemonset(&c.daemonset()).await?;
        if real.as_ref().and_then(|d| plan::daemonset_image(d, c)).as_deref() == Some(t.new_image.as_str()) {
            return Ok(());
        }
        let temp = self.api.get_daemonset(&c.temp_daemonset()).await?;
        let temp_pods = self.api.list_pods(&c.temp_pod_selector()).await?;
        let copy_runs =
            temp.as_ref().is_some_and(|d| d.metadata.deletion_timestamp.is_none() && plan::temp_job(d) == Some(t.job))
                && plan::pods_up(&temp_pods, c, None, None);
        if !copy_runs {
            return Err(StepError::Check(format!(
                "the temporary DaemonSet {} of this job is not running, so {} is left unchanged",
                c.temp_daemonset(),
                c.daemonset()
            )));
        }
        let image = t.new_image.clone();
        let change = move |current: &DaemonSet| {
            if plan::daemonset_image(current, c).as_deref() == Some(image.as_str()) {
                return Ok(None);
            }
            plan::with_image(current, c, &image).map(Some).map_err(|e| e.to_string())
        };
        Ok(self.api.update_daemonset(&c.daemonset(), change).await?)
    }

    /// Removes this job's temporary copy, once the real DaemonSet's pods
    /// run its template (whichever it is now): never while it rolls.
    async fn remove_temp(&self, t: &Target) -> Result<(), StepError> {
        let c = t.component;
        let api = self.api;
        let real_name = c.daemonset();
        let sel = c.pod_selector();
        let (real_name, sel) = (real_name.as_str(), sel.as_str());
        self.wait(
            &format!("the pods of {real_name} run its template, so that the copy may go"),
            false,
            || async move {
                let real = api.get_daemonset(real_name).await?;
                let pods = api.list_pods(sel).await?;
                Ok(match plan::not_settled(real.as_ref(), &pods, c) {
                    None => Ok(()),
                    Some(why) => Err(why),
                })
            },
        )
        .await?;
        let temp = c.temp_daemonset();
        let job = t.job;
        let deletion = self
            .api
            .delete_daemonset_unless(&temp, |d| match plan::temp_job(d) {
                Some(j) if j == job => None,
                other => Some(match other {
                    Some(j) => format!("it belongs to upgrade job {j}"),
                    None => "no upgrade job claims it".to_owned(),
                }),
            })
            .await?;
        if let Deletion::Kept(why) = deletion {
            tracing::warn!(job, daemonset = %temp, %why, "temporary DaemonSet left in place");
            return Ok(());
        }
        // Foreground deletion keeps the object until its pods are gone;
        // the step is done only once nothing of the copy is left.
        let temp = temp.as_str();
        self.wait(&format!("DaemonSet {temp} is gone"), false, || async move {
            Ok(match api.get_daemonset(temp).await? {
                Some(d) if plan::temp_job(&d) == Some(job) => Err("the DaemonSet still exists".into()),
                // Gone, or another job's copy now: ours is gone either way.
                _ => Ok(()),
            })
        })
        .await
    }

    /// Puts the saved spec back unless the real DaemonSet already has it,
    /// waits for the saved image to run again, and removes the copy.
    async fn rollback(&self, t: &Target) -> Result<(), StepError> {
        let c = t.component;
        let saved = t.original()?.clone();
        let change = move |current: &DaemonSet| {
            Ok((!plan::has_template_of(current, &saved)).then(|| plan::restored(current, &saved)))
        };
        self.api.update_daemonset(&c.daemonset(), change).await?;
        let sel = c.pod_selector();
        let old_image = t.old_image.clone();
        let what = format!("the pods matching {sel} run the saved spec and are Running");
        self.wait_pods(t, &what, &sel, None, old_image.as_deref(), false).await?;
        self.remove_temp(t).await
    }

    async fn wait_pods(
        &self,
        t: &Target,
        what: &str,
        selector: &str,
        exclude: Option<&str>,
        image: Option<&str>,
        cancellable: bool,
    ) -> Result<(), StepError> {
        let (c, api) = (t.component, self.api);
        self.wait(what, cancellable, || async move {
            let pods = api.list_pods(selector).await?;
            if plan::pods_up(&pods, c, exclude, image) {
                return Ok(Ok(()));
            }
            let seen: Vec<String> = pods
                .iter()
                .map(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Unknown".into());
                    format!("{} {phase}", p.metadata.name.as_deref().unwrap_or("?"))
                })
                .collect();
            Ok(Err(if seen.is_empty() { "no pods".into() } else { seen.join(", ") }))
        })
        .await
    }

    /// Looks until `check` says done (`Ok(Ok(()))`), the wait times out, or,
    /// when `cancellable`, a cancel is requested. `Ok(Err(state))` means
    /// "not yet" and describes what was seen, for the timeout message.
    /// Between looks it makes sure the job is still this runner's, and it
    /// stops at once on shutdown: a wait changes nothing, so it is redone.
    async fn wait<F, Fut>(&self, what: &str, cancellable: bool, mut check: F) -> Result<(), StepError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Result<(), String>, StepError>>,
    {
        let settings = &self.ctx.settings;
        let deadline = tokio::time::Instant::now() + settings.wait_timeout;
        loop {
            let look = tokio::select! {
                _ = self.stop.cancelled() => return Err(StepError::Interrupted),
                look = check() => look?,
            };
            let last = match look {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            let standing = self.lease.check().await?;
            if cancellable && standing.cancel_requested {
                return Err(StepError::Cancelled);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StepError::Timeout { what: what.to_owned(), after: settings.wait_timeout, last });
            }
            tokio::select! {
                _ = self.stop.cancelled() => return Err(StepError::Interrupted),
                _ = tokio::time::sleep(settings.poll_interval) => {}
            }
        }
    }
}
