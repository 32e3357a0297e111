//! The `machines` table: the store's mirror of each pool's containers.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, SqliteExecutor};

use crate::runtime::{Container, ContainerState, HealthState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub pool: String,
    pub container_id: String,
    pub image: String,
    pub failure_domain: Option<String>,
    pub state: ContainerState,
    pub health: HealthState,
    pub ready: bool,
    pub delete_requested: bool,
    pub ready_since: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct MachineRow {
    name: String,
    pool: String,
    container_id: String,
    image: String,
    failure_domain: Option<String>,
    state: String,
    health: String,
    ready: bool,
    delete_requested: bool,
    ready_since: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn enum_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn text_enum<T: serde::de::DeserializeOwned>(s: &str, fallback: T) -> T {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).unwrap_or(fallback)
}

impl From<MachineRow> for Machine {
    fn from(r: MachineRow) -> Self {
        Machine {
            state: text_enum(&r.state, ContainerState::Unknown),
            health: text_enum(&r.health, HealthState::None),
            name: r.name,
            pool: r.pool,
            container_id: r.container_id,
            image: r.image,
            failure_domain: r.failure_domain,
            ready: r.ready,
            delete_requested: r.delete_requested,
            ready_since: r.ready_since,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

const COLUMNS: &str = "name, pool, container_id, image, failure_domain, state, health, ready, delete_requested, ready_since, created_at, updated_at";

pub async fn list_for_pool(db: impl SqliteExecutor<'_>, pool: &str) -> sqlx::Result<Vec<Machine>> {
    let rows: Vec<MachineRow> =
        sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from machines where pool = ? order by name")))
            .bind(pool)
            .fetch_all(db)
            .await?;
    Ok(rows.into_iter().map(Machine::from).collect())
}

/// A page of a pool's machines in name order.
pub async fn page(
    db: impl SqliteExecutor<'_>,
    pool: &str,
    after: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<Machine>> {
    let rows: Vec<MachineRow> = sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from machines where pool = ? and name > ? order by name limit ?"
    )))
    .bind(pool)
    .bind(after.unwrap_or(""))
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Machine::from).collect())
}

pub async fn get(db: impl SqliteExecutor<'_>, pool: &str, name: &str) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> =
        sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from machines where pool = ? and name = ?")))
            .bind(pool)
            .bind(name)
            .fetch_optional(db)
            .await?;
    Ok(row.map(Machine::from))
}

/// Creates or refreshes the record of a container, keeping what only the
/// store knows (the delete request, creation time) and stamping the first
/// time the machine was seen ready.
pub async fn upsert_from_container(
    db: impl SqliteExecutor<'_>,
    pool: &str,
    c: &Container,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let ready = c.ready();
    sqlx::query(
        "insert into machines (name, pool, container_id, image, failure_domain, state, health, ready,
                               delete_requested, ready_since, created_at, updated_at)
         values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, case when ?8 then ?9 end, ?10, ?9)
         on conflict (name) do update set
            pool = excluded.pool,
            container_id = excluded.container_id,
            image = excluded.image,
            failure_domain = excluded.failure_domain,
            state = excluded.state,
            health = excluded.health,
            ready = excluded.ready,
            ready_since = case when excluded.ready then coalesce(machines.ready_since, ?9) end,
            updated_at = ?9
         where machines.container_id != excluded.container_id or machines.image != excluded.image
            or machines.state != excluded.state or machines.health != excluded.health
            or machines.ready != excluded.ready or machines.pool != excluded.pool
            or coalesce(machines.failure_domain, '') != coalesce(excluded.failure_domain, '')",
    )
    .bind(&c.name)
    .bind(pool)
    .bind(&c.id)
    .bind(&c.image)
    .bind(c.failure_domain())
    .bind(enum_text(&c.state))
    .bind(enum_text(&c.health))
    .bind(ready)
    .bind(now)
    .bind(c.created_at)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn delete(db: impl SqliteExecutor<'_>, pool: &str, name: &str) -> sqlx::Result<bool> {
    let done =
        sqlx::query("delete from machines where pool = ? and name = ?").bind(pool).bind(name).execute(db).await?;
    Ok(done.rows_affected() == 1)
}

/// Sets the delete request; `None` when the machine does not exist.
pub async fn request_delete(
    db: impl SqliteExecutor<'_>,
    pool: &str,
    name: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update machines set delete_requested = 1, updated_at = ? where pool = ? and name = ? returning {COLUMNS}"
    )))
    .bind(now)
    .bind(pool)
    .bind(name)
    .fetch_optional(db)
    .await?;
    Ok(row.map(Machine::from))
}

/// Sets the delete request only if it was not set; `None` when the machine
/// is missing or was marked already. Lets a repeated DELETE be harmless.
pub async fn mark_if_unmarked(
    db: impl SqliteExecutor<'_>,
    pool: &str,
    name: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Machine>> {
    let row: Option<MachineRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update machines set delete_requested = 1, updated_at = ?
         where pool = ? and name = ? and delete_requested = 0 returning {COLUMNS}"
    )))
    .bind(now)
    .bind(pool)
    .bind(name)
    .fetch_optional(db)
    .await?;
    Ok(row.map(Machine::from))
}
