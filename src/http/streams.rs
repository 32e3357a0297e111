//! Live progress as Server-Sent Events: `GET /v1/pools/{name}/stream` and
//! `GET /v1/upgrades/{id}/stream`.
//!
//! A stream sleeps until its subject changes: whoever commits a change to a
//! pool or a job publishes a notice ([`crate::events::changes`]), and the stream
//! then reads the store, which stays the only source of truth, so a client
//! that reconnects with `Last-Event-ID` misses nothing the event log still
//! holds. Every `--stream-recheck` (10 s; at most 30 s) it checks that its
//! token still exists with its role, and reads the store in case a notice
//! was missed.
//!
//! Streams are bounded: at most `--max-streams` are open (more are answered
//! 503), each lives at most `--stream-lifetime`, and each reads the store
//! at most once per [`MIN_READ_GAP`] however often its subject changes. A
//! stream ends when its subject is gone or finished, when its token is
//! revoked, when its lifetime is over, when the client goes away (axum
//! drops the stream), or when the server shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::event::Event;
use crate::domain::object::{Namespace, ObjectRef, PoolRef};
use crate::error::{ApiError, ApiResult, Problem, error_chain};
use crate::events::changes::Watcher;
use crate::http::extract::{NamespaceParam, Scope};
use crate::http::wire::PoolView;
use crate::identity::Access;
use crate::metrics::{CloseReason, OpenGuard};
use crate::state::AppState;

/// Shortest time between two reads of the store by one stream: a subject
/// that changes constantly costs at most ten reads a second per stream.
pub const MIN_READ_GAP: Duration = Duration::from_millis(100);
/// A comment line this often keeps proxies from closing an idle stream and
/// lets the server notice a client that has gone.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events sent per read at most; a backlog drains over several reads.
const EVENT_BATCH: u32 = 200;
/// A stream whose store reads keep failing ends, so that the client falls
/// back to polling (or reconnects) rather than waiting on a silent stream.
const MAX_FAILED_POLLS: u32 = 20;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(pool_stream)).routes(routes!(upgrade_stream))
}

/// What one stream follows.
enum Subject {
    Pool(PoolRef),
    Job { id: i64, namespace: Namespace },
}

impl Subject {
    fn namespace(&self) -> &Namespace {
        match self {
            Self::Pool(pool) => &pool.namespace,
            Self::Job { namespace, .. } => namespace,
        }
    }

    fn object(&self) -> ObjectRef {
        match self {
            Self::Pool(pool) => ObjectRef::Pool(pool.clone()),
            Self::Job { id, .. } => ObjectRef::Job(*id),
        }
    }
}

/// What holds a stream's place among the open ones; released with it.
struct Slot {
    _permit: OwnedSemaphorePermit,
    _counted: OpenGuard,
}

/// The state of one stream between reads.
struct Watch {
    state: AppState,
    subject: Subject,
    /// Who follows: checked again every `--stream-recheck`.
    access: Access,
    changes: Watcher,
    /// Id of the last event sent (or the newest one when the stream began
    /// without `Last-Event-ID`).
    last_event: i64,
    /// The last `status` sent, without its volatile fields, to send only changes.
    last_status: Option<Value>,
    started: bool,
    done: bool,
    failed_polls: u32,
    /// When the stream ends, whatever happens.
    end_of_life: Instant,
    next_check: Instant,
    last_read: Instant,
    _slot: Slot,
}

impl Watch {
    /// Waits for the next non-empty batch of messages; `None` ends the stream.
    async fn next_batch(&mut self) -> Option<Vec<SseEvent>> {
        loop {
            if self.done || self.failed_polls >= MAX_FAILED_POLLS {
                return None;
            }
            if self.started {
                tokio::select! {
                    _ = self.state.shutdown.cancelled() => return self.close(CloseReason::Shutdown),
                    _ = tokio::time::sleep_until(self.end_of_life) => return self.close(CloseReason::Lifetime),
                    _ = tokio::time::sleep_until(self.next_check) => {}
                    _ = self.changes.changed() => {}
                }
                if Instant::now() >= self.next_check {
                    self.next_check = Instant::now() + self.state.config.stream_recheck;
                    if !self.still_allowed() {
                        return self.close(CloseReason::Revoked);
                    }
                }
                tokio::time::sleep_until(self.last_read + MIN_READ_GAP).await;
            }
            self.started = true;
            self.last_read = Instant::now();
            self.state.metrics.stream_read();
            match self.poll().await {
                Ok(batch) => {
                    self.failed_polls = 0;
                    if !batch.is_empty() {
                        return Some(batch);
                    }
                }
                Err(e) => {
                    self.failed_polls += 1;
                    tracing::warn!(error = %error_chain(&e), "event stream could not read the store");
                }
            }
        }
    }

    fn close(&self, reason: CloseReason) -> Option<Vec<SseEvent>> {
        self.state.metrics.stream_closed(reason);
        tracing::debug!(caller = ?self.access.caller_name(), reason = ?reason, "ending an event stream");
        None
    }

    /// Whether the caller still may read the subject's namespace: a token
    /// revoked, a grant taken away or an expired JWT ends the stream.
    fn still_allowed(&self) -> bool {
        let Some(caller) = self.access.caller() else { return true };
        let namespace = self.subject.namespace();
        self.state.tokens.still_allows(caller, |g| g.role_in(namespace).is_some(), crate::clock::wall())
    }

    /// One look at the store. The subject is read before its events, so
    /// that every event written before a final state is sent before it.
    async fn poll(&mut self) -> ApiResult<Vec<SseEvent>> {
        let (subject, status, finished) = match &self.subject {
            Subject::Pool(pool) => {
                let view = match self.state.pools.find(pool).await? {
                    Some(pool) => Some(to_value(PoolView::from(pool))?),
                    None => None,
                };
                (pool.name.clone(), view, false)
            }
            Subject::Job { id, .. } => match self.state.upgrades.find(*id).await? {
                Some(job) => {
                    let finished = !job.job.state.is_active();
                    let view = to_value(crate::http::wire::upgrades::UpgradeView::from(job))?;
                    (id.to_string(), Some(view), finished)
                }
                None => (id.to_string(), None, false),
            },
        };
        let mut out = self.new_events().await?;
        match status {
            Some(view) => {
                let stable = without_volatile(&view);
                if self.last_status.as_ref() != Some(&stable) {
                    out.push(SseEvent::default().event("status").data(view.to_string()));
                    self.last_status = Some(stable);
                }
                self.done = finished;
            }
            None => {
                let gone = to_value(StreamDeleted { subject: subject.clone() })?;
                out.push(SseEvent::default().event("deleted").data(gone.to_string()));
                self.done = true;
            }
        }
        Ok(out)
    }

    async fn new_events(&mut self) -> ApiResult<Vec<SseEvent>> {
        let events = self.state.events.after(&self.subject.object(), self.last_event, EVENT_BATCH).await?;
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            self.last_event = ev.id;
            out.push(event_message(&ev)?);
        }
        Ok(out)
    }
}

fn to_value(v: impl serde::Serialize) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(|e| ApiError::Internal(e.into()))
}

fn event_message(ev: &Event) -> ApiResult<SseEvent> {
    let data = serde_json::to_string(ev).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(SseEvent::default().event("event").id(ev.id.to_string()).data(data))
}

/// The view without the fields that move on every worker pass (the time
/// of the last reconcile, the job's `updated_at`), which are no news.
fn without_volatile(view: &Value) -> Value {
    let mut v = view.clone();
    if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("last_reconciled_at");
    }
    if let Some(fields) = v.as_object_mut() {
        fields.remove("updated_at");
    }
    v
}

/// The id in `Last-Event-ID`, if the client sent one.
fn last_event_id(headers: &HeaderMap) -> ApiResult<Option<i64>> {
    let Some(value) = headers.get("last-event-id") else { return Ok(None) };
    let raw = value.to_str().unwrap_or_default().trim();
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse::<i64>().map(Some).map_err(|_| {
        ApiError::invalid("Last-Event-ID", "event_id", format!("{raw:?} is not an event id this server sent"))
    })
}

/// Where a stream starts: after `Last-Event-ID`, else after the newest event.
async fn start_after(state: &AppState, headers: &HeaderMap, subject: &Subject) -> ApiResult<i64> {
    match last_event_id(headers)? {
        Some(id) => Ok(id),
        None => Ok(state.events.last_id(&subject.object()).await?),
    }
}

/// A place among the open streams, or 503 when all are taken.
fn take_slot(state: &AppState) -> ApiResult<Slot> {
    match state.streams.clone().try_acquire_owned() {
        Ok(permit) => Ok(Slot { _permit: permit, _counted: state.metrics.stream_opened() }),
        Err(_) => {
            state.metrics.stream_refused();
            Err(ApiError::Unavailable(format!(
                "the server is at its limit of {} open event streams; retry shortly",
                state.config.max_streams
            )))
        }
    }
}

fn watch(state: AppState, subject: Subject, access: Access, last_event: i64, slot: Slot) -> Watch {
    let changes = match &subject {
        Subject::Pool(pool) => state.changes.watch_pool(pool),
        Subject::Job { id, .. } => state.changes.watch_job(*id),
    };
    let now = Instant::now();
    Watch {
        end_of_life: now + state.config.stream_lifetime,
        next_check: now + state.config.stream_recheck,
        state,
        subject,
        access,
        changes,
        last_event,
        last_status: None,
        started: false,
        done: false,
        failed_polls: 0,
        last_read: now,
        _slot: slot,
    }
}

fn sse(watch: Watch) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let messages = stream::unfold(watch, |mut w| async move {
        let batch = w.next_batch().await?;
        Some((stream::iter(batch.into_iter().map(Ok)), w))
    })
    .flatten();
    Sse::new(messages).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// The names of an event stream's messages; each has its own payload
/// schema (see the stream operations).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Documents the stream; messages are written by axum's `Sse`.
pub enum StreamEventName {
    /// `data` is the subject as `GET` answers it: a `PoolView` or an `UpgradeView`.
    Status,
    /// `data` is an `Event`; the message's `id` is the event's id.
    Event,
    /// `data` is a `StreamDeleted`: the subject is gone and the stream ends.
    Deleted,
}

/// Payload of a `deleted` message.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct StreamDeleted {
    /// The pool's name (or the job's id) that is gone.
    pub subject: String,
}

/// One message of an event stream, as its fields arrive on the wire.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Documents the stream; messages are written by axum's `Sse`.
pub struct SseMessage {
    event: StreamEventName,
    /// JSON: the pool or job for `status`, an event record for `event`.
    data: String,
    /// The event's id, on `event` messages; send it back as `Last-Event-ID`.
    id: Option<String>,
}

/// Follow a pool live (Server-Sent Events).
///
/// `status` (the pool, as `GET` answers it) first at once and then whenever its spec or status changes;
/// `event` for each new event of the pool, oldest first, with the event's
/// id as the SSE `id` (reconnect with `Last-Event-ID` to resume); `deleted`
/// last, when the pool is gone. A stream also ends after `--stream-lifetime`
/// (10 minutes by default) and when its token is revoked.
#[utoipa::path(get, path = "/v1/pools/{name}/stream", tag = "pools",
    params(
        ("name" = String, Path, description = "Pool name"),
        NamespaceParam,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event id; without it only new events are sent"),
    ),
    responses(
        (status = 200, description = "An event stream of `SseMessage`s; by `event` name, `data` is: `status`: a `PoolView`; `event`: an `Event`; `deleted`: a `StreamDeleted` (see `x-sse-events`)", body = SseMessage, content_type = "text/event-stream"),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`Last-Event-ID` is not an event id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`--max-streams` streams are open; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, headers, scope))]
async fn pool_stream(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let access = scope.single()?;
    let slot = take_slot(&state)?;
    let pool = state.pools.get(&access, crate::identity::Action::READ, &name).await?;
    let subject = Subject::Pool(pool.id);
    let after = start_after(&state, &headers, &subject).await?;
    Ok(sse(watch(state, subject, access, after, slot)))
}

/// Follow an upgrade job live (Server-Sent Events).
///
/// `status` (the job, as `GET` answers it) first at once and then whenever its state or a step
/// changes; `event` for each new event of the job, with its id as the SSE
/// `id`. The stream ends after the job reaches `succeeded`, `failed` or
/// `cancelled`, after `--stream-lifetime`, or when its token is revoked;
/// reconnect with `Last-Event-ID` to resume.
#[utoipa::path(get, path = "/v1/upgrades/{id}/stream", tag = "upgrades",
    params(
        ("id" = i64, Path, description = "Job id"),
        NamespaceParam,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event id; without it only new events are sent"),
    ),
    responses(
        (status = 200, description = "An event stream of `SseMessage`s; by `event` name, `data` is: `status`: an `UpgradeView`; `event`: an `Event` (see `x-sse-events`)", body = SseMessage, content_type = "text/event-stream"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`Last-Event-ID` is not an event id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`--max-streams` streams are open; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, headers, scope))]
async fn upgrade_stream(
    State(state): State<AppState>,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let access = scope.single()?;
    let slot = take_slot(&state)?;
    let job = state.upgrades.get(&access, &id).await?.job;
    let subject = Subject::Job { id: job.id, namespace: job.cluster.namespace };
    let after = start_after(&state, &headers, &subject).await?;
    Ok(sse(watch(state, subject, access, after, slot)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    #[test]
    fn volatile_fields_do_not_count_as_changes() {
        let a = json!({"name": "p", "updated_at": "1", "status": {"ready_replicas": 1, "last_reconciled_at": "1"}});
        let b = json!({"name": "p", "updated_at": "2", "status": {"ready_replicas": 1, "last_reconciled_at": "2"}});
        let c = json!({"name": "p", "updated_at": "2", "status": {"ready_replicas": 2, "last_reconciled_at": "2"}});
        assert_eq!(without_volatile(&a), without_volatile(&b));
        assert_ne!(without_volatile(&b), without_volatile(&c));
    }

    #[test]
    fn last_event_id_is_optional_but_must_be_a_number() {
        let mut h = HeaderMap::new();
        assert_eq!(last_event_id(&h).ok(), Some(None));
        h.insert("last-event-id", HeaderValue::from_static("42"));
        assert_eq!(last_event_id(&h).ok(), Some(Some(42)));
        h.insert("last-event-id", HeaderValue::from_static("forty"));
        assert!(last_event_id(&h).is_err());
    }
}
