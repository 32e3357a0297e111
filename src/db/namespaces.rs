//! The `namespaces` table. Pools, clusters, apply sets and tokens name
//! theirs by a foreign key, so a namespace that holds anything cannot be
//! deleted, and nothing can be created in a namespace being deleted (the
//! two wait for each other's row lock on PostgreSQL; SQLite's one writer
//! runs them one after the other).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use crate::domain::object::Namespace;

/// A stored namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRecord {
    pub name: Namespace,
    /// Labels every engine its pools use must carry; empty: any engine.
    pub engine_selector: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    engine_selector: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<Row> for NamespaceRecord {
    type Error = sqlx::Error;

    fn try_from(r: Row) -> sqlx::Result<Self> {
        let engine_selector = serde_json::from_str(&r.engine_selector).map_err(|e| {
            sqlx::Error::Decode(format!("namespace {:?}: stored engine_selector is not valid: {e}", r.name).into())
        })?;
        Ok(Self {
            name: Namespace::stored(r.name),
            engine_selector,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const COLUMNS: &str = "name, engine_selector, created_at, updated_at";

/// Inserts a namespace; an existing name fails with a unique violation.
pub async fn insert(
    tx: &mut WriteTx,
    name: &Namespace,
    engine_selector: &BTreeMap<String, String>,
    now: DateTime<Utc>,
) -> sqlx::Result<NamespaceRecord> {
    let selector = serde_json::to_string(engine_selector).map_err(|e| sqlx::Error::Encode(e.into()))?;
    let row: Row = on_store!(tx.exec(), |e| sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "insert into namespaces (name, engine_selector, created_at, updated_at) values ($1, $2, $3, $3)
         returning {COLUMNS}"
    )))
    .bind(name.as_str())
    .bind(selector)
    .bind(now)
    .fetch_one(e)
    .await)?;
    row.try_into()
}

/// Replaces a namespace's engine selector; `None` when it does not exist.
pub async fn set_engine_selector(
    tx: &mut WriteTx,
    name: &Namespace,
    engine_selector: &BTreeMap<String, String>,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<NamespaceRecord>> {
    let selector = serde_json::to_string(engine_selector).map_err(|e| sqlx::Error::Encode(e.into()))?;
    let row: Option<Row> = on_store!(tx.exec(), |e| sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "update namespaces set engine_selector = $1, updated_at = $2 where name = $3 returning {COLUMNS}"
    )))
    .bind(selector)
    .bind(now)
    .bind(name.as_str())
    .fetch_optional(e)
    .await)?;
    row.map(NamespaceRecord::try_from).transpose()
}

pub async fn get(db: Exec<'_>, name: &Namespace) -> sqlx::Result<Option<NamespaceRecord>> {
    let row: Option<Row> = on_store!(db, |e| sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from namespaces where name = $1"
    )))
    .bind(name.as_str())
    .fetch_optional(e)
    .await)?;
    row.map(NamespaceRecord::try_from).transpose()
}

/// Every namespace, by name (they are few: one a team).
pub async fn all(db: Exec<'_>) -> sqlx::Result<Vec<NamespaceRecord>> {
    let rows: Vec<Row> = on_store!(db, |e| sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from namespaces order by name"
    )))
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(NamespaceRecord::try_from).collect()
}

/// What a namespace holds, by kind; what keeps it from being deleted.
pub async fn holdings(db: Exec<'_>, name: &Namespace) -> sqlx::Result<Vec<(&'static str, i64)>> {
    let counts: (i64, i64, i64, i64) = on_store!(db, |e| sqlx::query_as(
        "select (select count(*) from pools where namespace = $1),
                (select count(*) from clusters where namespace = $1),
                (select count(*) from apply_sets where namespace = $1),
                (select count(*) from tokens where namespace = $1)"
    )
    .bind(name.as_str())
    .fetch_one(e)
    .await)?;
    let (pools, clusters, sets, tokens) = counts;
    Ok([("pools", pools), ("clusters", clusters), ("apply sets", sets), ("tokens", tokens)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect())
}

/// Deletes a namespace; `false` when there is none. Something still in it
/// fails with a foreign-key violation ([`is_in_use`]).
pub async fn delete(tx: &mut WriteTx, name: &Namespace) -> sqlx::Result<bool> {
    // Grants on it held by tokens of other namespaces (or global ones) go
    // with it: a namespace made again later under the same name, for
    // another team, starts with no one holding a role in it.
    on_store!(tx.exec(), |e| sqlx::query("delete from token_grants where namespace = $1")
        .bind(name.as_str())
        .execute(e)
        .await
        .affected())?;
    let done = on_store!(tx.exec(), |e| sqlx::query("delete from namespaces where name = $1")
        .bind(name.as_str())
        .execute(e)
        .await
        .affected())?;
    Ok(done == 1)
}

/// Whether a write failed because it names a namespace that does not exist
/// (a create in a namespace deleted meanwhile), or deletes one that still
/// holds something.
pub fn is_in_use(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_foreign_key_violation())
}
