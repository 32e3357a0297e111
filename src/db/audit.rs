//! The `audit` table: who changed what, and whether they were allowed.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use crate::domain::object::Namespace;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct AuditRecord {
    pub id: i64,
    pub time: DateTime<Utc>,
    /// The token's name; absent when the request had no valid token.
    pub token_name: Option<String>,
    #[schema(value_type = Option<crate::domain::role::Role>)]
    pub role: Option<String>,
    pub method: String,
    pub path: String,
    /// What the request was about, e.g. `pools/workers`.
    pub resource: Option<String>,
    /// The namespace of the object, when it has one.
    pub namespace: Option<String>,
    /// What the caller asked to do to it (`read`, `operate`, `change`,
    /// `manage`): for refusals, what was refused.
    pub action: Option<String>,
    /// The HTTP status of the answer.
    pub status: i64,
    /// `allowed`, `unauthenticated` or `forbidden`.
    #[schema(schema_with = outcome_schema)]
    pub outcome: String,
    /// How many requests this record stands for: refusals of requests
    /// without a valid token are recorded once per burst, with their count.
    pub repeats: i64,
}

/// The outcomes `auth` records.
pub const OUTCOMES: [&str; 3] = ["allowed", "unauthenticated", "forbidden"];

fn outcome_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(OUTCOMES))
        .description(Some("`allowed`, `unauthenticated` or `forbidden`"))
        .build()
}

/// A record to append; owned, so that it can be handed to the tasks that
/// write records in batches (`audit::log`, `audit::refusals`).
#[derive(Debug, Clone)]
pub struct NewAudit {
    pub token_name: Option<String>,
    pub role: Option<&'static str>,
    pub method: String,
    pub path: String,
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub action: Option<&'static str>,
    pub status: u16,
    pub outcome: &'static str,
}

/// Appends a record; returns its id.
pub async fn record(db: &mut WriteTx, a: &NewAudit, now: DateTime<Utc>) -> sqlx::Result<i64> {
    on_store!(db.exec(), |e| sqlx::query_scalar(
        "insert into audit (time, token_name, role, method, path, resource, status, outcome, namespace, action)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) returning id",
    )
    .bind(now)
    .bind(&a.token_name)
    .bind(a.role)
    .bind(&a.method)
    .bind(&a.path)
    .bind(&a.resource)
    .bind(i64::from(a.status))
    .bind(a.outcome)
    .bind(&a.namespace)
    .bind(a.action)
    .fetch_one(e)
    .await)
}

/// Counts `more` requests into an existing record (a burst of refusals).
pub async fn add_repeats(db: &mut WriteTx, id: i64, more: i64) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query("update audit set repeats = repeats + $1 where id = $2")
        .bind(more)
        .bind(id)
        .execute(e)
        .await
        .affected())?;
    Ok(())
}

/// Newest first, ids below `before`.
pub async fn page(
    db: Exec<'_>,
    namespace: Option<&Namespace>,
    before: Option<i64>,
    limit: u32,
) -> sqlx::Result<Vec<AuditRecord>> {
    on_store!(db, |e| sqlx::query_as(
        "select id, time, token_name, role, method, path, resource, namespace, action, status, outcome, repeats
         from audit
         where id < $1 and ($3 is null or namespace = $3) order by id desc limit $2",
    )
    .bind(before.unwrap_or(i64::MAX))
    .bind(i64::from(limit))
    .bind(namespace.map(Namespace::as_str))
    .fetch_all(e)
    .await)
}
