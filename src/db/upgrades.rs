//! The `upgrade_jobs` table: each job's request, state and position, and
//! which runner drives it. Its components and the history of its steps
//! are tables of their own ([`upgrade_components`], [`upgrade_steps`]).
//!
//! The runner's writes take a connection, not the pool: it makes each of
//! them inside a transaction that first checks it still owns the job
//! ([`touch`]), together with the event that explains it.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use crate::domain::object::{ClusterRef, Namespace};
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::upgrade_components;
use crate::domain::upgrade::{Component, JobState, Step, WindDown};
use crate::domain::version::KubeVersion;

pub use super::upgrade_components::{JobComponent, components};
pub use super::upgrade_steps::{StepRecord, steps};

/// A stored job.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: i64,
    /// The cluster, and so the job's namespace.
    pub cluster: ClusterRef,
    pub version: KubeVersion,
    pub components: Vec<Component>,
    pub image_repository: String,
    pub force: bool,
    pub from_version: Option<String>,
    pub state: JobState,
    pub component_index: usize,
    pub step: Step,
    pub cancel_requested: bool,
    /// Set while the job winds down.
    pub wind_down: Option<WindDown>,
    pub wind_down_state: Option<JobState>,
    pub error: Option<String>,
    /// The runner that drives the job, while one does.
    pub owner: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: i64,
    namespace: String,
    cluster: String,
    version: String,
    components: String,
    image_repository: String,
    force: bool,
    from_version: Option<String>,
    state: JobState,
    component_index: i64,
    step: i64,
    cancel_requested: bool,
    wind_down: Option<WindDown>,
    wind_down_state: Option<JobState>,
    error: Option<String>,
    owner: Option<String>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<JobRow> for Job {
    type Error = sqlx::Error;

    fn try_from(r: JobRow) -> Result<Self, Self::Error> {
        let bad = |what: &str| sqlx::Error::Decode(format!("upgrade job {}: stored {what} is not valid", r.id).into());
        Ok(Job {
            components: serde_json::from_str(&r.components).map_err(|_| bad("components"))?,
            state: r.state,
            wind_down_state: r.wind_down_state,
            component_index: usize::try_from(r.component_index).map_err(|_| bad("component_index"))?,
            step: Step::from_number(r.step).ok_or_else(|| bad("step"))?,
            id: r.id,
            cluster: ClusterRef::new(Namespace::stored(r.namespace), r.cluster),
            version: r.version.parse().map_err(|_| bad("version"))?,
            image_repository: r.image_repository,
            force: r.force,
            from_version: r.from_version,
            cancel_requested: r.cancel_requested,
            wind_down: r.wind_down,
            error: r.error,
            owner: r.owner,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            updated_at: r.updated_at,
        })
    }
}

const COLUMNS: &str = "id, namespace, cluster, version, components, image_repository, force, from_version, state,
    component_index, step, cancel_requested, wind_down, wind_down_state, error, owner,
    created_at, started_at, finished_at, updated_at";

/// What a new job starts with.
pub struct NewJob<'a> {
    pub cluster: &'a ClusterRef,
    pub version: &'a str,
    pub components: &'a [Component],
    /// The image each component moves to, in `components` order.
    pub new_images: &'a [String],
    pub image_repository: &'a str,
    pub force: bool,
    pub from_version: Option<String>,
}

/// Inserts a pending job and its components. A second active job on the
/// cluster fails with a unique violation (see the migration).
pub async fn insert(tx: &mut WriteTx, job: &NewJob<'_>, now: DateTime<Utc>) -> sqlx::Result<Job> {
    let components = serde_json::to_string(job.components).map_err(|e| sqlx::Error::Encode(e.into()))?;
    let row: JobRow = on_store!(tx.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "insert into upgrade_jobs (cluster, version, components, image_repository, force, from_version, state,
                                   created_at, updated_at, namespace)
         values ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9) returning {COLUMNS}"
    )))
    .bind(&job.cluster.name)
    .bind(job.version)
    .bind(components)
    .bind(job.image_repository)
    .bind(job.force)
    .bind(&job.from_version)
    .bind(now)
    .bind(now)
    .bind(job.cluster.namespace.as_str())
    .fetch_one(e)
    .await)?;
    upgrade_components::insert_all(tx, row.id, job.components, job.new_images).await?;
    row.try_into()
}

pub async fn get(db: Exec<'_>, id: i64) -> sqlx::Result<Option<Job>> {
    let row: Option<JobRow> =
        on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from upgrade_jobs where id = $1")))
            .bind(id)
            .fetch_optional(e)
            .await)?;
    row.map(Job::try_from).transpose()
}

/// Up to `limit` jobs of `namespace` with ids below `before`, newest first,
/// optionally of one cluster and in one state.
pub async fn list(
    db: Exec<'_>,
    namespace: &Namespace,
    cluster: Option<&str>,
    state: Option<JobState>,
    before: Option<i64>,
    limit: u32,
) -> sqlx::Result<Vec<Job>> {
    let rows: Vec<JobRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from upgrade_jobs
         where namespace = $5 and id < $1 and ($2 is null or cluster = $2) and ($3 is null or state = $3)
         order by id desc limit $4"
    )))
    .bind(before.unwrap_or(i64::MAX))
    .bind(cluster)
    .bind(state)
    .bind(i64::from(limit))
    .bind(namespace.as_str())
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(Job::try_from).collect()
}

/// Ids of the jobs the runner has to drive, oldest first.
pub async fn active_ids(db: Exec<'_>) -> sqlx::Result<Vec<i64>> {
    on_store!(db, |e| sqlx::query_scalar(
        "select id from upgrade_jobs where state in ('pending', 'running') order by id"
    )
    .fetch_all(e)
    .await)
}

pub async fn active_for_cluster(db: Exec<'_>, cluster: &ClusterRef) -> sqlx::Result<Option<i64>> {
    on_store!(db, |e| sqlx::query_scalar(
        "select id from upgrade_jobs where namespace = $2 and cluster = $1 and state in ('pending', 'running')"
    )
    .bind(&cluster.name)
    .bind(cluster.namespace.as_str())
    .fetch_optional(e)
    .await)
}

/// Claims job `id` for `owner`: moves it to running and records the owner,
/// only while the job is pending or running and, with `stale_before`,
/// nobody else holds a live claim (one refreshed since then; `None`: the
/// caller holds the job's lease, which is the claim). Answers the job as
/// claimed, and whether it was pending (a start, not a resume); `None`
/// when the job is not there to take. Runs inside the caller's write
/// transaction, so the read and the claim are one step.
pub async fn claim(
    tx: &mut WriteTx,
    id: i64,
    owner: &str,
    now: DateTime<Utc>,
    stale_before: Option<DateTime<Utc>>,
) -> sqlx::Result<Option<(Job, bool)>> {
    let was_pending: Option<bool> =
        on_store!(tx.exec(), |e| sqlx::query_scalar("select state = 'pending' from upgrade_jobs where id = $1")
            .bind(id)
            .fetch_optional(e)
            .await)?;
    let row: Option<JobRow> = on_store!(tx.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "update upgrade_jobs set
            state = 'running', owner = $1, heartbeat_at = $2, updated_at = $2,
            started_at = coalesce(started_at, $2)
         where id = $3 and state in ('pending', 'running')
           and ($4 is null or owner is null or owner = $1 or heartbeat_at is null or heartbeat_at < $4)
         returning {COLUMNS}"
    )))
    .bind(owner)
    .bind(now)
    .bind(id)
    .bind(stale_before)
    .fetch_optional(e)
    .await)?;
    row.map(|r| Ok((Job::try_from(r)?, was_pending.unwrap_or(false)))).transpose()
}

/// Proves that `owner` still drives job `id`, and stamps the heartbeat.
/// `false` once the job ended, was taken over or is gone: the caller must
/// stop at once. Made first in every transaction that writes the job.
pub async fn touch(tx: &mut WriteTx, id: i64, owner: &str, now: DateTime<Utc>) -> sqlx::Result<bool> {
    let n = on_store!(tx.exec(), |e| sqlx::query(
        "update upgrade_jobs set heartbeat_at = $1 where id = $2 and owner = $3 and state = 'running'"
    )
    .bind(now)
    .bind(id)
    .bind(owner)
    .execute(e)
    .await
    .affected())?;
    Ok(n == 1)
}

/// Gives up `owner`'s claim on job `id`.
pub async fn release(tx: &mut WriteTx, id: i64, owner: &str) -> sqlx::Result<()> {
    on_store!(tx.exec(), |e| sqlx::query("update upgrade_jobs set owner = null where id = $1 and owner = $2")
        .bind(id)
        .bind(owner)
        .execute(e)
        .await
        .affected())?;
    Ok(())
}

/// Forgets every claim not held by `owner`. Called once when the runner
/// starts: this process holds the data directory's lock, so any other
/// recorded owner is a process that is gone.
pub async fn release_others(db: &mut WriteTx, owner: &str) -> sqlx::Result<u64> {
    Ok(on_store!(db.exec(), |e| sqlx::query(
        "update upgrade_jobs set owner = null where owner is not null and owner != $1"
    )
    .bind(owner)
    .execute(e)
    .await
    .affected())?)
}

/// What the runner needs to know between two looks at the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The job is still running and this owner still drives it.
    pub held: bool,
    pub cancel_requested: bool,
}

/// Whether `owner` still drives job `id`, and whether a cancel was asked for.
pub async fn claim_of(db: Exec<'_>, id: i64, owner: &str) -> sqlx::Result<Claim> {
    let row: Option<(bool, bool)> = on_store!(db, |e| {
        sqlx::query_as(
        "select state = 'running' and owner is not distinct from $1, cancel_requested from upgrade_jobs where id = $2"
    )
    .bind(owner)
    .bind(id)
    .fetch_optional(e)
    .await
    })?;
    let (held, cancel_requested) = row.unwrap_or((false, false));
    Ok(Claim { held, cancel_requested })
}

/// Moves the job to component `index`, step `step`.
pub async fn set_position(db: &mut WriteTx, id: i64, index: usize, step: Step, now: DateTime<Utc>) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update upgrade_jobs set component_index = $1, step = $2, updated_at = $3 where id = $4"
    )
    .bind(index as i64)
    .bind(step.number())
    .bind(now)
    .bind(id)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// What a cancel request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Pending: cancelled at once, before any runner claimed it.
    CancelledNow,
    /// Running: the runner stops at its next safe point.
    Requested,
    /// Asked before, or already cancelled: nothing changed.
    AlreadyRequested,
    /// Succeeded or failed: nothing to cancel.
    Ended,
}

/// Records a cancel of job `id` and its event, in one transaction. A
/// pending job is cancelled at once: the runner's claim only takes pending
/// or running jobs, so whichever of the two statements comes first wins,
/// and a runner never drives a job cancelled before it started. `None`
/// when the job does not exist. The time is read once the write lock is
/// held, so that the end is never stamped before a write that preceded it.
pub async fn request_cancel(
    db: &super::store::Db,
    id: i64,
    event: impl FnOnce(CancelOutcome) -> Option<crate::domain::event::NewEvent>,
) -> sqlx::Result<Option<(Job, CancelOutcome)>> {
    let mut tx = db.begin_write().await?;
    let now = crate::clock::wall();
    // Locked (PostgreSQL) so that the outcome is decided on the state the
    // update will change: a runner ending the job on another replica waits,
    // or has already ended it.
    let exec = tx.exec();
    let sql = format!("select {COLUMNS} from upgrade_jobs where id = $1{}", exec.dialect().pick("", " for update"));
    let row: Option<JobRow> = on_store!(exec, |e| sqlx::query_as(AssertSqlSafe(sql)).bind(id).fetch_optional(e).await)?;
    let Some(before) = row.map(Job::try_from).transpose()? else { return Ok(None) };
    let outcome = match before.state {
        JobState::Succeeded | JobState::Failed => CancelOutcome::Ended,
        JobState::Cancelled => CancelOutcome::AlreadyRequested,
        JobState::Running if before.cancel_requested => CancelOutcome::AlreadyRequested,
        JobState::Running => CancelOutcome::Requested,
        JobState::Pending => CancelOutcome::CancelledNow,
    };
    if matches!(outcome, CancelOutcome::Requested | CancelOutcome::CancelledNow) {
        on_store!(tx.exec(), |e| sqlx::query(
            "update upgrade_jobs set
                cancel_requested = true,
                state = case state when 'pending' then 'cancelled' else state end,
                finished_at = case state when 'pending' then $1 else finished_at end,
                updated_at = $1
             where id = $2 and state in ('pending', 'running')",
        )
        .bind(now)
        .bind(id)
        .execute(e)
        .await
        .affected())?;
        if outcome == CancelOutcome::CancelledNow {
            upgrade_components::skip_pending(&mut tx, id).await?;
        }
        if let Some(ev) = event(outcome) {
            crate::db::events::record(&mut tx, &ev, now).await?;
        }
    }
    let job = get(tx.exec(), id).await?;
    tx.commit().await?;
    Ok(job.map(|j| (j, outcome)))
}

/// Starts winding the job down; `finish` ends it once that is done.
pub async fn start_wind_down(
    db: &mut WriteTx,
    id: i64,
    kind: WindDown,
    end_state: JobState,
    error: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update upgrade_jobs set wind_down = $1, wind_down_state = $2, error = $3, updated_at = $4
         where id = $5 and wind_down is null",
    )
    .bind(kind)
    .bind(end_state)
    .bind(error)
    .bind(now)
    .bind(id)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

pub async fn finish(
    db: &mut WriteTx,
    id: i64,
    state: JobState,
    error: Option<&str>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| {
        sqlx::query(
        "update upgrade_jobs set state = $1, error = $2, wind_down = null, owner = null, finished_at = $3, updated_at = $4
         where id = $5",
    )
    .bind(state)
    .bind(error)
    .bind(now)
    .bind(now)
    .bind(id)
    .execute(e).await.affected()
    })?;
    if state != JobState::Succeeded {
        upgrade_components::skip_pending(db, id).await?;
    }
    Ok(())
}
