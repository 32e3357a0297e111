//! The `machines` table: the store's mirror of each pool's containers, and
//! the few things about a machine only drover knows (a delete request, a
//! deletion under way, restarts in place).

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, SubsecRound, Utc};
use sqlx::AssertSqlSafe;

use crate::domain::machine::MachinePhase;
use crate::domain::object::{Namespace, PoolRef};
use crate::runtime::{ContainerState, HealthState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub pool: PoolRef,
    pub engine: String,
    pub container_id: String,
    pub image: String,
    pub failure_domain: Option<String>,
    pub phase: MachinePhase,
    pub state: ContainerState,
    pub health: HealthState,
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub ready: bool,
    pub delete_requested: bool,
    /// When the machine became ready; `None` while it is not.
    pub ready_since: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub restarts: u32,
    pub failed_restarts: u32,
    pub last_restart_at: Option<DateTime<Utc>>,
    /// Set before the container is stopped: the deletion is under way.
    pub terminating_since: Option<DateTime<Utc>>,
    pub terminating_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Machine {
    /// Same observation, whenever it was written. Times compare at the
    /// microseconds the store keeps (PostgreSQL's `timestamptz`): a record
    /// read back is the same as the observation, to the nanosecond, that
    /// it was written from, so a periodic pass rewrites nothing unchanged.
    /// Field by field, without copies: every pass asks it of every machine.
    pub fn same_as(&self, other: &Machine) -> bool {
        let micros = |t: &DateTime<Utc>| t.trunc_subsecs(6);
        let at =
            |a: &Option<DateTime<Utc>>, b: &Option<DateTime<Utc>>| a.as_ref().map(micros) == b.as_ref().map(micros);
        // Destructured whole, so that a new field cannot be left out.
        let Machine {
            name,
            pool,
            engine,
            container_id,
            image,
            failure_domain,
            phase,
            state,
            health,
            exit_code,
            oom_killed,
            ready,
            delete_requested,
            ready_since,
            started_at,
            finished_at,
            restarts,
            failed_restarts,
            last_restart_at,
            terminating_since,
            terminating_reason,
            created_at,
            updated_at: _,
        } = self;
        (name, pool, engine, container_id, image, failure_domain)
            == (&other.name, &other.pool, &other.engine, &other.container_id, &other.image, &other.failure_domain)
            && (phase, state, health, exit_code, oom_killed, ready, delete_requested)
                == (
                    &other.phase,
                    &other.state,
                    &other.health,
                    &other.exit_code,
                    &other.oom_killed,
                    &other.ready,
                    &other.delete_requested,
                )
            && (restarts, failed_restarts, terminating_reason)
                == (&other.restarts, &other.failed_restarts, &other.terminating_reason)
            && at(ready_since, &other.ready_since)
            && at(started_at, &other.started_at)
            && at(finished_at, &other.finished_at)
            && at(last_restart_at, &other.last_restart_at)
            && at(terminating_since, &other.terminating_since)
            && micros(created_at) == micros(&other.created_at)
    }
}

#[derive(sqlx::FromRow)]
struct MachineRow {
    name: String,
    namespace: String,
    pool: String,
    engine: String,
    container_id: String,
    image: String,
    failure_domain: Option<String>,
    phase: String,
    state: String,
    health: String,
    exit_code: Option<i64>,
    oom_killed: bool,
    ready: bool,
    delete_requested: bool,
    ready_since: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    restarts: i64,
    failed_restarts: i64,
    last_restart_at: Option<DateTime<Utc>>,
    terminating_since: Option<DateTime<Utc>>,
    terminating_reason: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn enum_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// An enum stored as its name; an unknown name is a decode error, naming
/// the machine and the column.
fn text_enum<T: serde::de::DeserializeOwned>(machine: &str, column: &str, s: &str) -> sqlx::Result<T> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| bad(machine, column, s))
}

fn bad(machine: &str, column: &str, value: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("machine {machine:?}: stored {column} {value:?} is not valid").into())
}

impl TryFrom<MachineRow> for Machine {
    type Error = sqlx::Error;

    fn try_from(r: MachineRow) -> sqlx::Result<Self> {
        let count = |column, n: i64| u32::try_from(n).map_err(|_| bad(&r.name, column, &n.to_string()));
        Ok(Machine {
            phase: MachinePhase::parse(&r.phase).ok_or_else(|| bad(&r.name, "phase", &r.phase))?,
            state: text_enum::<ContainerState>(&r.name, "state", &r.state)?,
            health: text_enum::<HealthState>(&r.name, "health", &r.health)?,
            restarts: count("restarts", r.restarts)?,
            failed_restarts: count("failed_restarts", r.failed_restarts)?,
            name: r.name,
            pool: PoolRef::new(Namespace::stored(r.namespace), r.pool),
            engine: r.engine,
            container_id: r.container_id,
            image: r.image,
            failure_domain: r.failure_domain,
            exit_code: r.exit_code,
            oom_killed: r.oom_killed,
            ready: r.ready,
            delete_requested: r.delete_requested,
            ready_since: r.ready_since,
            started_at: r.started_at,
            finished_at: r.finished_at,
            last_restart_at: r.last_restart_at,
            terminating_since: r.terminating_since,
            terminating_reason: r.terminating_reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const COLUMNS: &str = "name, namespace, pool, engine, container_id, image, failure_domain, phase, state, health, exit_code, \
    oom_killed, ready, delete_requested, ready_since, started_at, finished_at, restarts, failed_restarts, \
    last_restart_at, terminating_since, terminating_reason, created_at, updated_at";

pub async fn list_for_pool(db: Exec<'_>, pool: &PoolRef) -> sqlx::Result<Vec<Machine>> {
    let rows: Vec<MachineRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from machines where namespace = $2 and pool = $1 order by name"
    )))
    .bind(&pool.name)
    .bind(pool.namespace.as_str())
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(Machine::try_from).collect()
}

/// A page of a pool's machines in name order.
pub async fn page(db: Exec<'_>, pool: &PoolRef, after: Option<&str>, limit: u32) -> sqlx::Result<Vec<Machine>> {
    let rows: Vec<MachineRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from machines where namespace = $4 and pool = $1 and name > $2 order by name limit $3"
    )))
    .bind(&pool.name)
    .bind(after.unwrap_or(""))
    .bind(i64::from(limit))
    .bind(pool.namespace.as_str())
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(Machine::try_from).collect()
}

pub async fn get(db: Exec<'_>, pool: &PoolRef, name: &str) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from machines where namespace = $3 and pool = $1 and name = $2"
    )))
    .bind(&pool.name)
    .bind(name)
    .bind(pool.namespace.as_str())
    .fetch_optional(e)
    .await)?;
    row.map(Machine::try_from).transpose()
}

/// Writes what a pass observed of a machine. What the API and the executor
/// own (the delete request, the deletion under way, the restart counts) is
/// left as stored, except `failed_restarts`, which the observation resets
/// once the machine is ready again.
pub async fn write_observed(db: &mut WriteTx, m: &Machine) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| {
        sqlx::query(
        "insert into machines (name, pool, engine, container_id, image, failure_domain, phase, state, health,
                               exit_code, oom_killed, ready, delete_requested, ready_since, started_at, finished_at,
                               restarts, failed_restarts, last_restart_at, terminating_since, terminating_reason,
                               created_at, updated_at, namespace)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, false, $13, $14, $15, 0, $16, null, null, null, $17, $18,
                 $19)
         on conflict (name) do update set
            engine = excluded.engine, container_id = excluded.container_id,
            image = excluded.image, failure_domain = excluded.failure_domain, phase = excluded.phase,
            state = excluded.state, health = excluded.health, exit_code = excluded.exit_code,
            oom_killed = excluded.oom_killed, ready = excluded.ready, ready_since = excluded.ready_since,
            started_at = excluded.started_at, finished_at = excluded.finished_at,
            failed_restarts = excluded.failed_restarts, updated_at = excluded.updated_at
         where machines.namespace = excluded.namespace and machines.pool = excluded.pool",
    )
    .bind(&m.name)
    .bind(&m.pool.name)
    .bind(&m.engine)
    .bind(&m.container_id)
    .bind(&m.image)
    .bind(&m.failure_domain)
    .bind(m.phase.as_str())
    .bind(enum_text(&m.state))
    .bind(enum_text(&m.health))
    .bind(m.exit_code)
    .bind(m.oom_killed)
    .bind(m.ready)
    .bind(m.ready_since)
    .bind(m.started_at)
    .bind(m.finished_at)
    .bind(i64::from(m.failed_restarts))
    .bind(m.created_at)
    .bind(m.updated_at)
    .bind(m.pool.namespace.as_str())
    .execute(e).await.affected()
    })?;
    Ok(())
}

/// True when a machine of that name is recorded, in any pool.
pub async fn name_taken(db: Exec<'_>, name: &str) -> sqlx::Result<bool> {
    on_store!(db, |e| sqlx::query_scalar("select exists(select 1 from machines where name = $1)")
        .bind(name)
        .fetch_one(e)
        .await)
}

/// Records that the machine's deletion begins, before the engine is asked
/// to stop it; keeps the first time and reason when it was recorded already.
pub async fn begin_termination(
    db: &mut WriteTx,
    pool: &PoolRef,
    name: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update machines set terminating_since = coalesce(terminating_since, $1),
                             terminating_reason = coalesce(terminating_reason, $2),
                             phase = 'terminating', ready = false, updated_at = $1
         where namespace = $5 and pool = $3 and name = $4",
    )
    .bind(now)
    .bind(reason)
    .bind(&pool.name)
    .bind(name)
    .bind(pool.namespace.as_str())
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Counts a restart in place (or an unpause); a restart of an exited
/// machine also counts as failed until the machine is ready again.
pub async fn record_restart(
    db: &mut WriteTx,
    pool: &PoolRef,
    name: &str,
    counts_as_failed: bool,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update machines set restarts = restarts + 1, failed_restarts = failed_restarts + $1,
                             last_restart_at = $2, updated_at = $2
         where namespace = $5 and pool = $3 and name = $4",
    )
    .bind(i64::from(counts_as_failed))
    .bind(now)
    .bind(&pool.name)
    .bind(name)
    .bind(pool.namespace.as_str())
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

pub async fn delete(db: &mut WriteTx, pool: &PoolRef, name: &str) -> sqlx::Result<bool> {
    let done =
        on_store!(db.exec(), |e| sqlx::query("delete from machines where namespace = $3 and pool = $1 and name = $2")
            .bind(&pool.name)
            .bind(name)
            .bind(pool.namespace.as_str())
            .execute(e)
            .await
            .affected())?;
    Ok(done == 1)
}

/// Sets the delete request; `None` when the machine does not exist.
pub async fn request_delete(
    db: &mut WriteTx,
    pool: &PoolRef,
    name: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> = on_store!(db.exec(), |e| {
        sqlx::query_as(AssertSqlSafe(format!(
        "update machines set delete_requested = true, updated_at = $1 where namespace = $4 and pool = $2 and name = $3 returning {COLUMNS}"
    )))
    .bind(now)
    .bind(&pool.name)
    .bind(name)
 .bind(pool.namespace.as_str())
 .fetch_optional(e).await
    })?;
    row.map(Machine::try_from).transpose()
}

/// Sets the delete request only if it was not set; `None` when the machine
/// is missing or was marked already. Lets a repeated DELETE be harmless.
pub async fn mark_if_unmarked(
    db: &mut WriteTx,
    pool: &PoolRef,
    name: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> = on_store!(db.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "update machines set delete_requested = true, updated_at = $1
         where namespace = $4 and pool = $2 and name = $3 and delete_requested = false returning {COLUMNS}"
    )))
    .bind(now)
    .bind(&pool.name)
    .bind(name)
    .bind(pool.namespace.as_str())
    .fetch_optional(e)
    .await)?;
    row.map(Machine::try_from).transpose()
}
