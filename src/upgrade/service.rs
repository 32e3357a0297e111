//! The upgrades service, what the API asks of upgrade jobs: check a
//! request against its fields, the caller's role, the cluster and kubeadm's
//! version policy (the plan), store a job from a plan, read jobs with their
//! components and steps, cancel one. Each state change is stored together
//! with the event that explains it; the runner does the work.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::UpgradeQueue;
use super::plan::{self, ComponentPlan};
use crate::clusters::{ClusterError, Clusters};
use crate::db::page::{Page, PageRequest};
use crate::db::upgrade_components::ComponentSteps;
use crate::db::{self, Db, upgrades::CancelOutcome, upgrades::Job};
use crate::domain::ValidationErrors;
use crate::domain::event::{Event, EventType, NewEvent};
use crate::domain::image::check_image_reference;
use crate::domain::object::{ClusterRef, ObjectRef};
use crate::domain::upgrade::{
    Component, DEFAULT_IMAGE_REPOSITORY, JobState, PolicyViolation, check_version_policy, image_version,
    order_components, release_version,
};
use crate::domain::version::KubeVersion;
use crate::identity::{Access, Action, Target};
use crate::k8s::{CallError, ClusterApi};

/// Body of `POST /v1/clusters/{name}/upgrades` (start a job) and of
/// `POST /v1/clusters/{name}/upgrades/plan` (its plan): the same request,
/// so that a plan shows what that very start would do.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateUpgrade)]
pub struct NewUpgrade {
    /// Target version, `vMAJOR.MINOR.PATCH`.
    #[schema(example = "v1.30.0", pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")]
    pub version: String,
    /// Components to upgrade; all three by default. They are always
    /// upgraded in the order kube-apiserver, kube-controller-manager, kube-scheduler.
    pub components: Option<Vec<Component>>,
    /// Registry the images come from (`<repository>/<component>:<version>`).
    /// Any value but the default (`registry.k8s.io`) needs the admin role.
    #[schema(example = "registry.k8s.io")]
    pub image_repository: Option<String>,
    /// Bypass the version policy (downgrades, skipped minor versions).
    /// Needs the admin role.
    #[serde(default)]
    pub force: bool,
    /// Deprecated: leave it out. The route says what is asked for
    /// (`.../upgrades` starts a job, `.../upgrades/plan` answers its plan);
    /// a `dry_run` that contradicts the route is refused (422) rather than
    /// obeyed, so that a request meant as a dry run never starts a job.
    // Kept so that clients written before the plan had its own route (the
    // CLI sent `"dry_run": false` on every start) keep working.
    #[schema(deprecated)]
    pub dry_run: Option<bool>,
}

/// What a request asks for, as its route says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// `POST .../upgrades/plan`: what a job would do.
    Plan,
    /// `POST .../upgrades`: a job.
    Job,
}

/// The answer of `POST .../upgrades/plan`: what a job would do.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradePlan {
    pub cluster: String,
    pub current_version: Option<String>,
    pub target_version: KubeVersion,
    pub components: Vec<ComponentPlan>,
}

/// A job with its components, each with the history of its steps.
#[derive(Debug, Clone)]
pub struct JobDetail {
    pub job: Job,
    pub components: Vec<ComponentSteps>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("no upgrade job {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// The authorizer's refusal.
    #[error(transparent)]
    Denied(#[from] crate::identity::Denied),
    #[error("upgrade job {job} is already active on cluster {cluster:?}; follow /v1/upgrades/{job} or cancel it first")]
    Active { cluster: String, job: i64 },
    #[error("upgrade job {id} already ended ({})", state.as_str())]
    Ended { id: i64, state: JobState },
    /// The cluster did not answer the plan's reads.
    #[error("{0}")]
    Unreachable(String),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

#[derive(Clone)]
pub struct Upgrades {
    db: Db,
    clusters: Clusters,
    queue: UpgradeQueue,
}

impl Upgrades {
    pub fn new(db: Db, clusters: Clusters, queue: UpgradeQueue) -> Self {
        Self { db, clusters, queue }
    }

    /// What an upgrade of `cluster` (of the request's namespace) would do:
    /// the checks of a start, against what the cluster runs now. Stores
    /// and changes nothing.
    pub async fn plan(&self, access: &Access, cluster: &str, body: &NewUpgrade) -> Result<UpgradePlan, UpgradeError> {
        let prepared = self.checked(access, cluster, body, Asked::Plan).await?;
        Ok(UpgradePlan {
            cluster: cluster.to_owned(),
            current_version: prepared.current.map(|v| v.to_string()),
            target_version: prepared.request.target,
            components: prepared.components,
        })
    }

    /// Starts an upgrade of `cluster` (of the request's namespace): a
    /// pending job, which a runner claims.
    #[tracing::instrument(name = "upgrades.create", skip_all)]
    pub async fn create(&self, access: &Access, cluster: &str, body: &NewUpgrade) -> Result<JobDetail, UpgradeError> {
        let prepared = self.checked(access, cluster, body, Asked::Job).await?;
        let job = start(&self.db, &prepared).await.map_err(|e| match e {
            StartError::Active(job) => UpgradeError::Active { cluster: cluster.to_owned(), job },
            StartError::ClusterGone => UpgradeError::Cluster(ClusterError::NotFound(cluster.to_owned())),
            StartError::Store(e) => e.into(),
        })?;
        self.queue.wake();
        self.detail(job).await
    }

    /// The checks a plan and a start share: the cluster and the caller's
    /// role in its namespace (a start needs an operator, a plan a viewer;
    /// a registry other than the default, or `force`, decide what runs as
    /// the control plane, so they need an admin: SECURITY.md), the fields,
    /// no other active job (for a start), and the version policy against
    /// what the cluster runs.
    async fn checked(
        &self,
        access: &Access,
        cluster: &str,
        body: &NewUpgrade,
        asked: Asked,
    ) -> Result<Prepared, UpgradeError> {
        let action = if asked == Asked::Job { Action::OPERATE } else { Action::READ };
        let found = self.clusters.get(access, action, cluster).await?;
        let id = ClusterRef::new(found.namespace, found.name);
        if let Some(field) = admin_field(body) {
            tracing::info!(field, "a request for an admin's upgrade parameter");
            access.may(Action::CHANGE, &crate::clusters::target(&id))?;
        }
        let request = parse(&id, body, asked)?;
        if asked == Asked::Job
            && let Some(job) = db::upgrades::active_for_cluster(self.db.read(), &id).await?
        {
            return Err(UpgradeError::Active { cluster: cluster.to_owned(), job });
        }
        let api = self.clusters.connect(&id, 2).await?;
        prepare(&api, request).await.map_err(|e| match e {
            PrepareError::Unreachable { .. } => UpgradeError::Unreachable(e.to_string()),
            PrepareError::Policy(v) => UpgradeError::Invalid(ValidationErrors::single("version", v.rule, v.message)),
        })
    }

    /// A page of the request's namespace's jobs, newest first, optionally
    /// of one cluster and in one state.
    pub async fn list(
        &self,
        access: &Access,
        cluster: Option<&str>,
        state: Option<JobState>,
        req: &PageRequest<i64>,
    ) -> Result<Page<JobDetail>, UpgradeError> {
        let found = db::namespaces::get(self.db.read(), &access.namespace).await?;
        access.may(Action::READ, &Target::namespace(&access.namespace))?;
        if found.is_none() {
            return Err(ClusterError::NamespaceNotFound(access.namespace.as_str().to_owned()).into());
        }
        let jobs =
            db::upgrades::list(self.db.read(), &access.namespace, cluster, state, req.after, req.fetch()).await?;
        let page = Page::from_rows(jobs, req.limit, |j| j.id.to_string());
        let ids: Vec<i64> = page.items.iter().map(|j| j.id).collect();
        let mut components = db::upgrade_components::with_steps(self.db.read(), &ids).await?;
        Ok(page.map(|job| JobDetail { components: components.remove(&job.id).unwrap_or_default(), job }))
    }

    /// A job of the request's namespace by its id as the API names it (a
    /// number; anything else is no job).
    pub async fn get(&self, access: &Access, id: &str) -> Result<JobDetail, UpgradeError> {
        let job = self.job(access, Action::READ, id).await?;
        self.detail(job).await
    }

    /// Job `id`, or `None` once it is gone (an event stream's end).
    pub async fn find(&self, id: i64) -> Result<Option<JobDetail>, UpgradeError> {
        match db::upgrades::get(self.db.read(), id).await? {
            Some(job) => Ok(Some(self.detail(job).await?)),
            None => Ok(None),
        }
    }

    /// Job `id` of the request's namespace, if the caller may do `action`
    /// to it (looked up first: one of another namespace, or one the caller
    /// may not see, answers as a missing one).
    async fn job(&self, access: &Access, action: Action, id: &str) -> Result<Job, UpgradeError> {
        let missing = || UpgradeError::NotFound(id.to_owned());
        let number: Option<i64> = id.parse().ok();
        let found = match number {
            Some(n) => db::upgrades::get(self.db.read(), n).await?,
            None => None,
        };
        access.may(action, &Target::in_namespace(&access.namespace, "upgrade job", id))?;
        found.filter(|j| j.cluster.namespace == access.namespace).ok_or_else(missing)
    }

    async fn detail(&self, job: Job) -> Result<JobDetail, UpgradeError> {
        let mut components = db::upgrade_components::with_steps(self.db.read(), &[job.id]).await?;
        Ok(JobDetail { components: components.remove(&job.id).unwrap_or_default(), job })
    }

    /// A page of the job's events, newest first.
    pub async fn events(&self, access: &Access, id: &str, req: &PageRequest<i64>) -> Result<Page<Event>, UpgradeError> {
        let job = self.job(access, Action::READ, id).await?;
        Ok(db::events::page(self.db.read(), &ObjectRef::Job(job.id), req).await?)
    }

    /// Cancels a job: a pending one at once, a running one at its next safe
    /// point. Answers the job as it now stands.
    #[tracing::instrument(name = "upgrades.cancel", skip_all)]
    pub async fn cancel(&self, access: &Access, id: &str) -> Result<JobDetail, UpgradeError> {
        let number = self.job(access, Action::OPERATE, id).await?.id;
        let (job, outcome) = cancel(&self.db, number).await?.ok_or_else(|| UpgradeError::NotFound(id.to_owned()))?;
        if outcome == CancelOutcome::Ended {
            return Err(UpgradeError::Ended { id: number, state: job.state });
        }
        self.detail(job).await
    }
}

/// The field of a request that only an admin may ask for, if any.
fn admin_field(body: &NewUpgrade) -> Option<&'static str> {
    if body.image_repository.as_deref().is_some_and(|r| r != DEFAULT_IMAGE_REPOSITORY) {
        Some("image_repository")
    } else {
        body.force.then_some("force")
    }
}

/// The upgrade a create body asks for, with every field checked.
fn parse(cluster: &ClusterRef, body: &NewUpgrade, asked: Asked) -> Result<UpgradeRequest, UpgradeError> {
    let invalid = |field, rule, e: String| UpgradeError::Invalid(ValidationErrors::single(field, rule, e));
    check_dry_run(&cluster.name, body.dry_run, asked).map_err(|e| invalid("dry_run", "dry_run", e))?;
    let target: KubeVersion = body.version.parse().map_err(|e| invalid("version", "version_format", format!("{e}")))?;
    let components = order_components(body.components.as_deref().unwrap_or(&Component::ALL))
        .map_err(|e| invalid("components", "components", e))?;
    let repo = body.image_repository.clone().unwrap_or_else(|| DEFAULT_IMAGE_REPOSITORY.to_owned());
    check_image_reference(&format!("{repo}/kube-apiserver:{target}"))
        .map_err(|e| invalid("image_repository", "image_repository", e.to_string()))?;
    Ok(UpgradeRequest { cluster: cluster.clone(), target, components, image_repository: repo, force: body.force })
}

/// The deprecated `dry_run` agrees with the route, or is left out.
fn check_dry_run(cluster: &str, dry_run: Option<bool>, asked: Asked) -> Result<(), String> {
    let route = format!("/v1/clusters/{cluster}/upgrades");
    match (dry_run, asked) {
        (Some(true), Asked::Job) => Err(format!(
            "nothing was started: a dry run has its own route, POST {route}/plan (the same body, without `dry_run`)"
        )),
        (Some(false), Asked::Plan) => {
            Err(format!("this route only plans; POST {route} starts a job (leave `dry_run` out)"))
        }
        _ => Ok(()),
    }
}

/// A request that passed its field checks.
#[derive(Debug, Clone)]
pub struct UpgradeRequest {
    pub cluster: ClusterRef,
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
async fn prepare(api: &ClusterApi, request: UpgradeRequest) -> Result<Prepared, PrepareError> {
    let unreachable = |source| PrepareError::Unreachable { cluster: request.cluster.name.clone(), source };
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
    /// The cluster was deleted while the job was being planned.
    #[error("the cluster is no longer registered")]
    ClusterGone,
    #[error("storing the job failed")]
    Store(#[from] sqlx::Error),
}

/// Stores a pending job for the plan, with its "Accepted" event. The store
/// allows one active job per cluster; a second one is [`StartError::Active`].
async fn start(db: &Db, prepared: &Prepared) -> Result<Job, StartError> {
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
    let now = crate::clock::wall();
    // Held until the job commits: a concurrent delete of the cluster waits
    // for it, then finds the job active and refuses.
    if !db::clusters::hold(&mut tx, &r.cluster).await? {
        return Err(StartError::ClusterGone);
    }
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
async fn cancel(db: &Db, id: i64) -> sqlx::Result<Option<(Job, CancelOutcome)>> {
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
