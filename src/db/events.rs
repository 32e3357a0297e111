//! The `events` table: append, and read a subject's events newest first.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};

use crate::domain::event::{Event, EventType, NewEvent};
use crate::domain::object::ObjectRef;

/// How the store keeps a subject: its kind, its namespace (`''` for one of
/// none) and its name.
fn columns(subject: &ObjectRef) -> (&'static str, &str, String) {
    match subject {
        ObjectRef::Pool(pool) => ("pool", pool.namespace.as_str(), pool.name.clone()),
        ObjectRef::Job(id) => ("job", "", id.to_string()),
        ObjectRef::Engine(name) => ("engine", "", name.clone()),
    }
}

/// Records one event in a background write of its own.
pub async fn record_alone(db: &super::store::Db, ev: &NewEvent, now: DateTime<Utc>) -> sqlx::Result<()> {
    let mut tx = db.begin_background().await?;
    record(&mut tx, ev, now).await?;
    tx.commit().await
}

pub async fn record(db: &mut WriteTx, ev: &NewEvent, now: DateTime<Utc>) -> sqlx::Result<()> {
    let (kind, namespace, subject) = columns(&ev.subject);
    on_store!(db.exec(), |e| sqlx::query(
        "insert into events (subject_kind, subject, time, type, reason, message, namespace)
         values ($1, $2, $3, $4, $5, $6, $7)"
    )
    .bind(kind)
    .bind(subject)
    .bind(now)
    .bind(ev.type_.as_str())
    .bind(ev.reason)
    .bind(&ev.message)
    .bind(namespace)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct EventRow {
    id: i64,
    subject: String,
    time: DateTime<Utc>,
    #[sqlx(rename = "type")]
    type_: String,
    reason: String,
    message: String,
}

impl TryFrom<EventRow> for Event {
    type Error = sqlx::Error;

    fn try_from(r: EventRow) -> sqlx::Result<Self> {
        let type_ = match r.type_.as_str() {
            "Normal" => EventType::Normal,
            "Warning" => EventType::Warning,
            other => {
                let why = format!("event {}: stored type {other:?} is neither Normal nor Warning", r.id);
                return Err(sqlx::Error::Decode(why.into()));
            }
        };
        Ok(Event { id: r.id, subject: r.subject, time: r.time, type_, reason: r.reason, message: r.message })
    }
}

/// Up to `limit` events of a subject with ids below `before`, newest first.
pub async fn list(db: Exec<'_>, of: &ObjectRef, before: Option<i64>, limit: u32) -> sqlx::Result<Vec<Event>> {
    let (kind, namespace, subject) = columns(of);
    let rows: Vec<EventRow> = on_store!(db, |e| sqlx::query_as(
        "select id, subject, time, type, reason, message from events
         where subject_kind = $1 and namespace = $5 and subject = $2 and id < $3
         order by id desc limit $4",
    )
    .bind(kind)
    .bind(&subject)
    .bind(before.unwrap_or(i64::MAX))
    .bind(i64::from(limit))
    .bind(namespace)
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(Event::try_from).collect()
}

/// A page of a subject's events, newest first.
pub async fn page(
    db: Exec<'_>,
    of: &ObjectRef,
    req: &super::page::PageRequest<i64>,
) -> sqlx::Result<super::page::Page<Event>> {
    let rows = list(db, of, req.after, req.fetch()).await?;
    Ok(super::page::Page::from_rows(rows, req.limit, |e| e.id.to_string()))
}

/// Removes a subject's history once the subject itself is gone, so that a
/// new pool of the same name starts with a clean log.
pub async fn purge(db: &mut WriteTx, of: &ObjectRef) -> sqlx::Result<()> {
    let (kind, namespace, subject) = columns(of);
    on_store!(db.exec(), |e| sqlx::query(
        "delete from events where subject_kind = $1 and namespace = $3 and subject = $2"
    )
    .bind(kind)
    .bind(&subject)
    .bind(namespace)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Up to `limit` events of a subject with ids above `after`, oldest first:
/// what an event stream has not sent yet.
pub async fn after(db: Exec<'_>, of: &ObjectRef, after: i64, limit: u32) -> sqlx::Result<Vec<Event>> {
    let (kind, namespace, subject) = columns(of);
    let rows: Vec<EventRow> = on_store!(db, |e| sqlx::query_as(
        "select id, subject, time, type, reason, message from events
         where subject_kind = $1 and namespace = $5 and subject = $2 and id > $3
         order by id limit $4",
    )
    .bind(kind)
    .bind(&subject)
    .bind(after)
    .bind(i64::from(limit))
    .bind(namespace)
    .fetch_all(e)
    .await)?;
    rows.into_iter().map(Event::try_from).collect()
}

/// The id of a subject's newest event (0 when it has none): where a stream
/// that only wants new events starts.
pub async fn last_id(db: Exec<'_>, of: &ObjectRef) -> sqlx::Result<i64> {
    let (kind, namespace, subject) = columns(of);
    let id: Option<i64> = on_store!(db, |e| sqlx::query_scalar(
        "select max(id) from events where subject_kind = $1 and namespace = $3 and subject = $2"
    )
    .bind(kind)
    .bind(&subject)
    .bind(namespace)
    .fetch_one(e)
    .await)?;
    Ok(id.unwrap_or(0))
}
