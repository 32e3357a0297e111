//! The `apply_sets` and `apply_objects` tables: apply sets, their
//! revisions, and which objects each owns with their stamps.

use chrono::{DateTime, Utc};

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;

/// One object an apply set owns.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OwnerRow {
    pub kind: String,
    pub name: String,
    pub apply_set: String,
    pub stamp: String,
}

/// The set's revision; `None` for a set never applied.
pub async fn revision(db: Exec<'_>, set: &str) -> sqlx::Result<Option<i64>> {
    on_store!(db, |e| sqlx::query_scalar("select revision from apply_sets where name = $1")
        .bind(set)
        .fetch_optional(e)
        .await)
}

/// Every owned object: this set's and those of the objects the documents
/// name (an apply needs both; a fleet of thousands reads in milliseconds).
pub async fn owners(db: Exec<'_>) -> sqlx::Result<Vec<OwnerRow>> {
    on_store!(db, |e| sqlx::query_as("select kind, name, apply_set, stamp from apply_objects order by kind, name")
        .fetch_all(e)
        .await)
}

/// Moves the set from revision `expected` (`None`: a new set) to the next
/// one, first thing in the apply's transaction. `None` when the set is no
/// longer at `expected`: another apply of it committed meanwhile (on
/// PostgreSQL the transaction is then unusable, and is dropped).
pub async fn advance(
    tx: &mut WriteTx,
    set: &str,
    expected: Option<i64>,
    by: Option<&str>,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<i64>> {
    let Some(expected) = expected else {
        let inserted = on_store!(tx.exec(), |e| sqlx::query(
            "insert into apply_sets (name, revision, updated_at, updated_by) values ($1, 1, $2, $3)"
        )
        .bind(set)
        .bind(now)
        .bind(by)
        .execute(e)
        .await
        .affected());
        return match inserted {
            Ok(_) => Ok(Some(1)),
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Ok(None),
            Err(e) => Err(e),
        };
    };
    on_store!(tx.exec(), |e| sqlx::query_scalar(
        "update apply_sets set revision = revision + 1, updated_at = $1, updated_by = $2
         where name = $3 and revision = $4 returning revision"
    )
    .bind(now)
    .bind(by)
    .bind(set)
    .bind(expected)
    .fetch_optional(e)
    .await)
}

/// Records `kind`/`name` as the set's with `stamp`. `seen` is the owner the
/// apply planned with: the row is written only if that is still so (no row
/// for `None`). `false` when it is not.
pub async fn record(
    tx: &mut WriteTx,
    (kind, name): (&str, &str),
    set: &str,
    stamp: &str,
    seen: Option<&str>,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let Some(seen) = seen else {
        let inserted = on_store!(tx.exec(), |e| sqlx::query(
            "insert into apply_objects (kind, name, apply_set, stamp, applied_at) values ($1, $2, $3, $4, $5)"
        )
        .bind(kind)
        .bind(name)
        .bind(set)
        .bind(stamp)
        .bind(now)
        .execute(e)
        .await
        .affected());
        return match inserted {
            Ok(n) => Ok(n == 1),
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Ok(false),
            Err(e) => Err(e),
        };
    };
    let done = on_store!(tx.exec(), |e| sqlx::query(
        "update apply_objects set apply_set = $1, stamp = $2, applied_at = $3
         where kind = $4 and name = $5 and apply_set = $6"
    )
    .bind(set)
    .bind(stamp)
    .bind(now)
    .bind(kind)
    .bind(name)
    .bind(seen)
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
}

/// The set lets go of an object (pruned, or found gone).
pub async fn release(tx: &mut WriteTx, (kind, name): (&str, &str), set: &str) -> sqlx::Result<()> {
    on_store!(tx.exec(), |e| sqlx::query(
        "delete from apply_objects where kind = $1 and name = $2 and apply_set = $3"
    )
    .bind(kind)
    .bind(name)
    .bind(set)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}
