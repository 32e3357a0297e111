//! The `apply_sets` and `apply_objects` tables: apply sets, their
//! revisions, and which objects each owns with their stamps.

use chrono::{DateTime, Utc};

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use crate::domain::object::{Namespace, SetRef};

/// An object as the ownership records name it: its kind, its namespace
/// (`None` for an engine, which belongs to none) and its name.
pub type Owned<'a> = (&'a str, Option<&'a Namespace>, &'a str);

fn namespace_of(namespace: Option<&Namespace>) -> &str {
    namespace.map_or("", Namespace::as_str)
}

/// One object an apply set owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    pub kind: String,
    pub name: String,
    pub set: SetRef,
    pub stamp: String,
}

#[derive(sqlx::FromRow)]
struct Row {
    kind: String,
    name: String,
    set_namespace: String,
    apply_set: String,
    stamp: String,
}

/// The set's revision; `None` for a set never applied.
pub async fn revision(db: Exec<'_>, set: &SetRef) -> sqlx::Result<Option<i64>> {
    on_store!(db, |e| sqlx::query_scalar("select revision from apply_sets where namespace = $2 and name = $1")
        .bind(&set.name)
        .bind(set.namespace.as_str())
        .fetch_optional(e)
        .await)
}

/// Every owned object an apply in `namespace` may name: the namespace's
/// pools and clusters, and every engine (an apply needs its set's and
/// those of the objects its documents name; thousands read in
/// milliseconds).
pub async fn owners(db: Exec<'_>, namespace: &Namespace) -> sqlx::Result<Vec<OwnerRow>> {
    let rows: Vec<Row> = on_store!(db, |e| sqlx::query_as(
        "select kind, name, set_namespace, apply_set, stamp from apply_objects
         where namespace = $1 or kind = 'Engine' order by kind, name"
    )
    .bind(namespace.as_str())
    .fetch_all(e)
    .await)?;
    Ok(rows
        .into_iter()
        .map(|r| OwnerRow {
            kind: r.kind,
            name: r.name,
            set: SetRef { namespace: Namespace::stored(r.set_namespace), name: r.apply_set },
            stamp: r.stamp,
        })
        .collect())
}

/// Moves the set from revision `expected` (`None`: a new set) to the next
/// one, first thing in the apply's transaction. `None` when the set is no
/// longer at `expected`: another apply of it committed meanwhile (on
/// PostgreSQL the transaction is then unusable, and is dropped).
pub async fn advance(
    tx: &mut WriteTx,
    set: &SetRef,
    expected: Option<i64>,
    by: Option<&str>,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<i64>> {
    let Some(expected) = expected else {
        let inserted = on_store!(tx.exec(), |e| sqlx::query(
            "insert into apply_sets (name, revision, updated_at, updated_by, namespace) values ($1, 1, $2, $3, $4)"
        )
        .bind(&set.name)
        .bind(now)
        .bind(by)
        .bind(set.namespace.as_str())
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
         where namespace = $5 and name = $3 and revision = $4 returning revision"
    )
    .bind(now)
    .bind(by)
    .bind(&set.name)
    .bind(expected)
    .bind(set.namespace.as_str())
    .fetch_optional(e)
    .await)
}

/// Records the object as the set's with `stamp`. `seen` is the owner the
/// apply planned with: the row is written only if that is still so (no row
/// for `None`). `false` when it is not.
pub async fn record(
    tx: &mut WriteTx,
    (kind, namespace, name): Owned<'_>,
    set: &SetRef,
    stamp: &str,
    seen: Option<&SetRef>,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let namespace = namespace_of(namespace);
    let Some(seen) = seen else {
        let inserted = on_store!(tx.exec(), |e| sqlx::query(
            "insert into apply_objects (kind, namespace, name, set_namespace, apply_set, stamp, applied_at)
             values ($1, $2, $3, $4, $5, $6, $7)"
        )
        .bind(kind)
        .bind(namespace)
        .bind(name)
        .bind(set.namespace.as_str())
        .bind(&set.name)
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
        "update apply_objects set set_namespace = $1, apply_set = $2, stamp = $3, applied_at = $4
         where kind = $5 and namespace = $6 and name = $7 and set_namespace = $8 and apply_set = $9"
    )
    .bind(set.namespace.as_str())
    .bind(&set.name)
    .bind(stamp)
    .bind(now)
    .bind(kind)
    .bind(namespace)
    .bind(name)
    .bind(seen.namespace.as_str())
    .bind(&seen.name)
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
}

/// The set lets go of an object (pruned, or found gone).
pub async fn release(tx: &mut WriteTx, (kind, namespace, name): Owned<'_>, set: &SetRef) -> sqlx::Result<()> {
    on_store!(tx.exec(), |e| sqlx::query(
        "delete from apply_objects
         where kind = $1 and namespace = $2 and name = $3 and set_namespace = $4 and apply_set = $5"
    )
    .bind(kind)
    .bind(namespace_of(namespace))
    .bind(name)
    .bind(set.namespace.as_str())
    .bind(&set.name)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}
