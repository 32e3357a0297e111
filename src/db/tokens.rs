//! The `tokens` and `token_grants` tables: API tokens, stored as hashes
//! only, each with its grants.

use std::collections::HashMap;

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};

use crate::domain::grant::{Grant, Grants, Scope};
use crate::domain::object::Namespace;
use crate::domain::role::Role;

/// A token as the API shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub name: String,
    /// The namespace whose admins manage it; `None`: a global token.
    pub namespace: Option<Namespace>,
    pub grants: Grants,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A stored token with its hash.
#[derive(Debug, Clone)]
pub struct Stored {
    pub name: String,
    pub grants: Grants,
    pub hash: String,
    pub last_used_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    name: String,
    namespace: Option<String>,
    hash: String,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct GrantRow {
    token_name: String,
    namespace: String,
    role: Role,
}

/// A new token: its name, its managing namespace, its grants and its hash.
pub struct NewToken<'a> {
    pub name: &'a str,
    pub namespace: Option<&'a Namespace>,
    pub grants: &'a Grants,
    pub hash: &'a str,
}

/// Inserts a token and its grants; a duplicate name fails with a unique
/// violation.
pub async fn insert(db: &mut WriteTx, new: &NewToken<'_>, now: DateTime<Utc>) -> sqlx::Result<TokenInfo> {
    on_store!(db.exec(), |e| sqlx::query(
        "insert into tokens (name, namespace, hash, created_at) values ($1, $2, $3, $4)"
    )
    .bind(new.name)
    .bind(new.namespace.map(Namespace::as_str))
    .bind(new.hash)
    .bind(now)
    .execute(e)
    .await
    .affected())?;
    for grant in &new.grants.0 {
        on_store!(db.exec(), |e| sqlx::query(
            "insert into token_grants (token_name, namespace, role) values ($1, $2, $3)"
        )
        .bind(new.name)
        .bind(grant.namespace.as_str())
        .bind(grant.role)
        .execute(e)
        .await
        .affected())?;
    }
    Ok(TokenInfo {
        name: new.name.to_owned(),
        namespace: new.namespace.cloned(),
        grants: new.grants.clone(),
        created_at: now,
        last_used_at: None,
    })
}

/// Every token's grants, by token name.
async fn grants(db: Exec<'_>) -> sqlx::Result<HashMap<String, Grants>> {
    let rows: Vec<GrantRow> = on_store!(db, |e| sqlx::query_as(
        "select token_name, namespace, role from token_grants order by token_name, namespace"
    )
    .fetch_all(e)
    .await)?;
    let mut out: HashMap<String, Grants> = HashMap::new();
    for r in rows {
        let scope = Scope::parse(&r.namespace).map_err(|e| {
            sqlx::Error::Decode(
                format!("token {:?}: stored grant {:?} is not valid: {e}", r.token_name, r.namespace).into(),
            )
        })?;
        out.entry(r.token_name).or_default().0.push(Grant::new(scope, r.role));
    }
    Ok(out)
}

/// Every token with its hash and grants: what the in-memory token cache
/// holds. Two reads: a token created or revoked between them has no
/// grants in the second, and is left out (looked up by its hash when it
/// is used, found at the next reload); every stored token holds a grant.
pub async fn all(db: &super::store::Db) -> sqlx::Result<Vec<Stored>> {
    let rows: Vec<TokenRow> =
        on_store!(db.read(), |e| sqlx::query_as("select name, namespace, hash, created_at, last_used_at from tokens")
            .fetch_all(e)
            .await)?;
    let mut grants = grants(db.read()).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let grants = grants.remove(&r.name)?;
            Some(Stored { grants, name: r.name, hash: r.hash, last_used_at: r.last_used_at })
        })
        .collect())
}

/// Stamps the last use of a token.
pub async fn touch(db: &mut WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query("update tokens set last_used_at = $1 where name = $2")
        .bind(now)
        .bind(name)
        .execute(e)
        .await
        .affected())?;
    Ok(())
}

/// Inside a write transaction: whether any token exists, with the table
/// locked against other writers (PostgreSQL) until the transaction ends:
/// replicas starting together on an empty store agree on which of them
/// makes the first admin token. (SQLite's writer is one already.)
pub async fn any_locked(tx: &mut WriteTx) -> sqlx::Result<bool> {
    if let Exec::Pg(c) = tx.exec() {
        sqlx::query("lock table tokens in share row exclusive mode").execute(c).await?;
    }
    on_store!(tx.exec(), |e| sqlx::query_scalar("select exists (select 1 from tokens)").fetch_one(e).await)
}

/// A token by the hash of its secret.
pub async fn by_hash(db: &super::store::Db, hash: &str) -> sqlx::Result<Option<Stored>> {
    let row: Option<TokenRow> = on_store!(db.read(), |e| sqlx::query_as(
        "select name, namespace, hash, created_at, last_used_at from tokens where hash = $1"
    )
    .bind(hash)
    .fetch_optional(e)
    .await)?;
    let Some(row) = row else { return Ok(None) };
    let rows: Vec<GrantRow> = on_store!(db.read(), |e| sqlx::query_as(
        "select token_name, namespace, role from token_grants where token_name = $1"
    )
    .bind(&row.name)
    .fetch_all(e)
    .await)?;
    let mut grants = Grants::default();
    for r in rows {
        if let Ok(scope) = Scope::parse(&r.namespace) {
            grants.0.push(Grant::new(scope, r.role));
        }
    }
    // Revoked between the two reads (every stored token holds a grant):
    // gone, not a token that may do nothing.
    if grants.0.is_empty() {
        return Ok(None);
    }
    Ok(Some(Stored { name: row.name, grants, hash: row.hash, last_used_at: row.last_used_at }))
}

/// The tokens managed in `namespace` (`None`: every token), by name.
pub async fn list(db: &super::store::Db, namespace: Option<&Namespace>) -> sqlx::Result<Vec<TokenInfo>> {
    let rows: Vec<TokenRow> = on_store!(db.read(), |e| sqlx::query_as(
        "select name, namespace, hash, created_at, last_used_at from tokens
         where $1 is null or namespace = $1 order by name"
    )
    .bind(namespace.map(Namespace::as_str))
    .fetch_all(e)
    .await)?;
    let mut grants = grants(db.read()).await?;
    Ok(rows
        .into_iter()
        .map(|r| TokenInfo {
            grants: grants.remove(&r.name).unwrap_or_default(),
            namespace: r.namespace.map(Namespace::stored),
            name: r.name,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
        })
        .collect())
}

/// The namespace a token is managed in: `Some(None)` for a global token,
/// `None` when there is no such token.
pub async fn namespace_of(db: Exec<'_>, name: &str) -> sqlx::Result<Option<Option<Namespace>>> {
    let row: Option<Option<String>> =
        on_store!(db, |e| sqlx::query_scalar("select namespace from tokens where name = $1")
            .bind(name)
            .fetch_optional(e)
            .await)?;
    Ok(row.map(|ns| ns.map(Namespace::stored)))
}

/// Deletes a token unless it is the last one with the admin role over
/// everything (`*`), which would lock everyone out of what only such a
/// token manages. `Ok(None)`: no such token.
/// `managed_in` is the namespace the caller was authorized for: a token
/// made again elsewhere meanwhile is not this one.
pub async fn delete(
    tx: &mut WriteTx,
    name: &str,
    managed_in: Option<&Namespace>,
) -> sqlx::Result<Option<DeleteOutcome>> {
    let found: Option<String> = on_store!(tx.exec(), |e| sqlx::query_scalar(
        "select name from tokens where name = $1 and namespace is not distinct from $2"
    )
    .bind(name)
    .bind(managed_in.map(Namespace::as_str))
    .fetch_optional(e)
    .await)?;
    if found.is_none() {
        return Ok(None);
    }
    // Every root token's row is locked (PostgreSQL) before they are
    // counted: two revocations at once, through two replicas, count one
    // after the other, and the second sees the first one's delete.
    let exec = tx.exec();
    let sql = exec.dialect().pick(
        "select t.name from tokens t join token_grants g on g.token_name = t.name
         where g.namespace = '*' and g.role = $1",
        "select t.name from tokens t join token_grants g on g.token_name = t.name
         where g.namespace = '*' and g.role = $1 for update of t",
    );
    let roots: Vec<String> = on_store!(exec, |e| sqlx::query_scalar(sql).bind(Role::Admin).fetch_all(e).await)?;
    if roots.iter().any(|r| r == name) && roots.len() <= 1 {
        return Ok(Some(DeleteOutcome::LastAdmin));
    }
    let done = on_store!(tx.exec(), |e| sqlx::query("delete from tokens where name = $1")
        .bind(name)
        .execute(e)
        .await
        .affected())?;
    // Revoked meanwhile, by another request.
    if done == 0 {
        return Ok(None);
    }
    Ok(Some(DeleteOutcome::Deleted))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    LastAdmin,
}
