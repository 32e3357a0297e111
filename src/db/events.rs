//! The `events` table: append, and read a subject's events newest first.

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use sqlx::SqliteExecutor;

use crate::domain::event::{Event, EventType, NewEvent, SubjectKind};

/// Records one event in a background write of its own.
pub async fn record_alone(db: &super::store::Db, ev: &NewEvent, now: DateTime<Utc>) -> sqlx::Result<()> {
    let mut tx = db.begin_background().await?;
    record(&mut tx, ev, now).await?;
    tx.commit().await
}

pub async fn record(db: &mut SqliteConnection, ev: &NewEvent, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query("insert into events (subject_kind, subject, time, type, reason, message) values (?, ?, ?, ?, ?, ?)")
        .bind(ev.kind.as_str())
        .bind(&ev.subject)
        .bind(now)
        .bind(ev.type_.as_str())
        .bind(ev.reason)
        .bind(&ev.message)
        .execute(db)
        .await?;
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

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Self {
        let type_ = if r.type_ == "Warning" { EventType::Warning } else { EventType::Normal };
        Event { id: r.id, subject: r.subject, time: r.time, type_, reason: r.reason, message: r.message }
    }
}

/// Up to `limit` events of a subject with ids below `before`, newest first.
pub async fn list(
    db: impl SqliteExecutor<'_>,
    kind: SubjectKind,
    subject: &str,
    before: Option<i64>,
    limit: u32,
) -> sqlx::Result<Vec<Event>> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "select id, subject, time, type, reason, message from events
         where subject_kind = ? and subject = ? and id < ?
         order by id desc limit ?",
    )
    .bind(kind.as_str())
    .bind(subject)
    .bind(before.unwrap_or(i64::MAX))
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Event::from).collect())
}

/// Removes a subject's history once the subject itself is gone, so that a
/// new pool of the same name starts with a clean log.
pub async fn purge(db: &mut SqliteConnection, kind: SubjectKind, subject: &str) -> sqlx::Result<()> {
    sqlx::query("delete from events where subject_kind = ? and subject = ?")
        .bind(kind.as_str())
        .bind(subject)
        .execute(db)
        .await?;
    Ok(())
}

/// Up to `limit` events of a subject with ids above `after`, oldest first:
/// what an event stream has not sent yet.
pub async fn after(
    db: impl SqliteExecutor<'_>,
    kind: SubjectKind,
    subject: &str,
    after: i64,
    limit: u32,
) -> sqlx::Result<Vec<Event>> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "select id, subject, time, type, reason, message from events
         where subject_kind = ? and subject = ? and id > ?
         order by id limit ?",
    )
    .bind(kind.as_str())
    .bind(subject)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Event::from).collect())
}

/// The id of a subject's newest event (0 when it has none): where a stream
/// that only wants new events starts.
pub async fn last_id(db: impl SqliteExecutor<'_>, kind: SubjectKind, subject: &str) -> sqlx::Result<i64> {
    let id: Option<i64> = sqlx::query_scalar("select max(id) from events where subject_kind = ? and subject = ?")
        .bind(kind.as_str())
        .bind(subject)
        .fetch_one(db)
        .await?;
    Ok(id.unwrap_or(0))
}
