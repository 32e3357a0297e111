//! What the upgrade API does, apart from HTTP: check a request against
//! the cluster and kubeadm's version policy (the plan), store a job from a
//! plan, and cancel a job. Each state change is stored together with the
//! event that explains it.

use chrono::Utc;

use super::plan::{self, ComponentPlan};
use crate::db::{self, Db, upgrades::CancelOutcome, upgrades::Job};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::upgrade::{Component, PolicyViolation, check_version_policy, image_version, release_version};
use crate::domain::version::KubeVersion;
use crate::k8s::{CallError, ClusterApi};

/// A request that passed its field checks.
#[derive(Debug, Clone)]
pub struct UpgradeRequest {
    pub cluster: String,
    pub target: KubeVersion,
    /// In upgrade order, without repeats.
    pub components: Vec<Component>,
    pub image_repository: String,
    pub force: bool,
}

/// What a job would do, from what the cluster runs now.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub request: UpgradeRequest,
    /// The oldest of the API server's version and the component images.
    pub current: Option<KubeVersion>,
    pub components: Vec<ComponentPlan>,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cluster {cluster:?} did not answer: {source}")]
    Unreachable {
        cluster: String,
        #[source]
        source: CallError,
    },
    #[error("{}", .0.message)]
    Policy(PolicyViolation),
}

/// Reads what the cluster runs and checks the request against the version
/// policy, which compares with the oldest of the API server's version and
/// the component images. Changes nothing.
pub async fn prepare(api: &ClusterApi, request: UpgradeRequest) -> Result<Prepared, PrepareError> {
    let unreachable = |source| PrepareError::Unreachable { cluster: request.cluster.clone(), source };
    let info = api.version().await.map_err(unreachable)?;
    let mut current = release_version(&info.git_version);
    let mut components = Vec::new();
    for c in &request.components {
        let ds = api.get_daemonset(&c.daemonset()).await.map_err(unreachable)?;
        let image = ds.as_ref().and_then(|d| plan::daemonset_image(d, *c));
        if let Some(v) = image.as_deref().and_then(image_version) {
            current = Some(current.map_or(v, |cur| cur.min(v)));
        }
        components.push(plan::plan_component(*c, image, c.image(&request.image_repository, request.target)));
    }
    if let Some(cur) = current {
        check_version_policy(cur, request.target, request.force).map_err(PrepareError::Policy)?;
    }
    Ok(Prepared { request, current, components })
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another job is pending or running on the cluster.
    #[error("upgrade job {0} is already active on the cluster")]
    Active(i64),
    #[error("storing the job failed")]
    Store(#[from] sqlx::Error),
}

/// Stores a pending job for the plan, with its "Accepted" event. The store
/// allows one active job per cluster; a second one is [`StartError::Active`].
pub async fn start(db: &Db, prepared: &Prepared) -> Result<Job, StartError> {
    let r = &prepared.request;
    let images: Vec<String> = prepared.components.iter().map(|p| p.new_image.clone()).collect();
    let version = r.target.to_string();
    let new = db::upgrades::NewJob {
        cluster: &r.cluster,
        version: &version,
        components: &r.components,
        new_images: &images,
        image_repository: &r.image_repository,
        force: r.force,
        from_version: prepared.current.map(|v| v.to_string()),
    };
    let mut tx = db.begin_background().await?;
    let now = Utc::now();
    let job = match db::upgrades::insert(&mut tx, &new, now).await {
        Ok(job) => job,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            drop(tx);
            let id = db::upgrades::active_for_cluster(db.read(), &r.cluster).await?.unwrap_or_default();
            return Err(StartError::Active(id));
        }
        Err(e) => return Err(e.into()),
    };
    let from = new.from_version.as_deref().unwrap_or("an unknown version");
    let msg = format!("upgrade from {from} to {version} accepted (force: {})", r.force);
    db::events::record(&mut tx, &NewEvent::job(job.id, EventType::Normal, "Accepted", msg), now).await?;
    tx.commit().await?;
    tracing::info!(job = job.id, cluster = %r.cluster, version = %version, "upgrade job accepted");
    Ok(job)
}

/// Cancels job `id`, with its event, in one transaction: a pending job at
/// once (no runner will ever claim it), a running one at its runner's next
/// safe point. `None` when there is no such job.
pub async fn cancel(db: &Db, id: i64) -> sqlx::Result<Option<(Job, CancelOutcome)>> {
    let event = |outcome| {
        let msg = match outcome {
            CancelOutcome::CancelledNow => "cancelled before it started",
            CancelOutcome::Requested => "cancel requested",
            CancelOutcome::AlreadyRequested | CancelOutcome::Ended => return None,
        };
        Some(NewEvent::job(id, EventType::Normal, "CancelRequested", msg.to_owned()))
    };
    db::upgrades::request_cancel(db, id, event).await
}
