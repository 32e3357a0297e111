//! One step of one component, against the cluster. Every step may be cut
//! short by a restart and run again from its beginning, so each is written
//! to be repeatable: creates fall back to updates, deletes treat "not found"
//! as done, updates are skipped when the object already says what they
//! would write, and waits just look again.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;

use super::Context;
use super::plan::{self, PlanError};
use crate::db;
use crate::domain::upgrade::{Component, Step};
use crate::k8s::{CallError, ClusterApi};

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
    #[error("storing the job's progress failed")]
    Db(#[from] sqlx::Error),
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
    fn original(&self) -> Result<&DaemonSet, StepError> {
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
}

impl StepRunner<'_> {
    #[tracing::instrument(skip_all, fields(job = t.job, component = %t.component, step = step.name()))]
    pub async fn run(&self, t: &Target, step: Step) -> Result<(), StepError> {
        let c = t.component;
        match step {
            Step::CheckPods => self.check_pods(t).await,
            Step::CreateTemp => {
                Ok(self.api.create_or_update_daemonset(&plan::temp_daemonset(t.original()?, c)).await?)
            }
            Step::WaitTempRunning => {
                let sel = c.temp_pod_selector();
                self.wait_pods(t, &format!("the pods matching {sel} are Running"), &sel, None, None, true).await
            }
            Step::UpdateDaemonSet => {
                let image = t.new_image.clone();
                let change = move |current: &DaemonSet| {
                    if plan::daemonset_image(current, c).as_deref() == Some(image.as_str()) {
                        return Ok(None);
                    }
                    plan::with_image(current, c, &image).map(Some).map_err(|e| e.to_string())
                };
                Ok(self.api.update_daemonset(&c.daemonset(), change).await?)
            }
            Step::WaitOldPodGone => {
                let old = t.old_pod()?;
                let api = self.api;
                self.wait(t, &format!("pod {old} is gone"), false, || async move {
                    Ok(if api.pod_exists(old).await? { Err("the pod still exists".into()) } else { Ok(()) })
                })
                .await
            }
            Step::WaitNewRunning => {
                let (sel, old) = (c.pod_selector(), t.old_pod()?);
                let what = format!("the pods matching {sel} run {} and are Running", t.new_image);
                self.wait_pods(t, &what, &sel, Some(old), Some(&t.new_image), false).await
            }
            Step::DeleteTemp | Step::Cleanup => self.delete_temp(t).await,
            Step::WaitHealthy => {
                let api = self.api;
                self.wait(
                    t,
                    "the API server's /healthz answers ok",
                    false,
                    || async move { Ok(api.healthz_once().await) },
                )
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
        db::upgrades::save_observation(&self.ctx.db, t.job, t.position, &pod, image.as_deref(), &saved).await?;
        Ok(())
    }

    async fn delete_temp(&self, t: &Target) -> Result<(), StepError> {
        let temp = t.component.temp_daemonset();
        self.api.delete_daemonset_foreground(&temp).await?;
        // Foreground deletion keeps the object until its pods are gone;
        // the step is done only once nothing of the copy is left.
        let (api, temp) = (self.api, temp.as_str());
        self.wait(t, &format!("DaemonSet {temp} is gone"), false, || async move {
            Ok(match api.get_daemonset(temp).await? {
                Some(_) => Err("the DaemonSet still exists".into()),
                None => Ok(()),
            })
        })
        .await
    }

    /// Puts the saved spec back, waits for the old image to run again, and
    /// removes the temporary copy.
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
        self.delete_temp(t).await
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
        self.wait(t, what, cancellable, || async move {
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
    async fn wait<F, Fut>(&self, t: &Target, what: &str, cancellable: bool, mut check: F) -> Result<(), StepError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Result<(), String>, StepError>>,
    {
        let settings = &self.ctx.settings;
        let deadline = tokio::time::Instant::now() + settings.wait_timeout;
        loop {
            let last = match check().await? {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            if cancellable && db::upgrades::cancel_requested(&self.ctx.db, t.job).await? {
                return Err(StepError::Cancelled);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StepError::Timeout { what: what.to_owned(), after: settings.wait_timeout, last });
            }
            tokio::time::sleep(settings.poll_interval).await;
        }
    }
}
