//! The one writer's gate: write transactions take turns in process, and a
//! request's turn comes before any waiting background worker's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sqlx::SqlitePool;
use tokio::sync::oneshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// An API request: someone is waiting for the answer.
    Request,
    /// A reconcile pass, the upgrade runner, the pruner.
    Background,
}

#[derive(Default)]
pub struct WriteGate {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: bool,
    requests: VecDeque<oneshot::Sender<Permit>>,
    background: VecDeque<oneshot::Sender<Permit>>,
}

/// The right to write; released (to the next in line) on drop.
pub struct Permit {
    gate: Option<Arc<WriteGate>>,
}

impl WriteGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        let waiting = {
            let mut s = self.lock();
            if !s.held {
                s.held = true;
                return Permit { gate: Some(self.clone()) };
            }
            let (tx, rx) = oneshot::channel();
            match priority {
                Priority::Request => s.requests.push_back(tx),
                Priority::Background => s.background.push_back(tx),
            }
            rx
        };
        match waiting.await {
            Ok(permit) => permit,
            // The gate hands a permit to every live waiter before it is
            // dropped; a closed channel cannot happen while we wait. Taking
            // no permit would be unsound, so wait for a fresh one.
            Err(_) => Box::pin(self.acquire(priority)).await,
        }
    }

    /// Hands the turn to the next live waiter, requests first.
    fn release(self: &Arc<Self>) {
        let mut s = self.lock();
        loop {
            let next = s.requests.pop_front().or_else(|| s.background.pop_front());
            let Some(tx) = next else {
                s.held = false;
                return;
            };
            // A waiter that gave up (its future dropped) is skipped; the
            // permit comes back and goes to the next one.
            match tx.send(Permit { gate: Some(self.clone()) }) {
                Ok(()) => return,
                Err(mut unsent) => unsent.gate = None,
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release();
        }
    }
}

/// A write transaction: on SQLite it holds the gate; on PostgreSQL it is
/// a plain transaction that tells the other replicas, as it commits, which
/// pools it wrote ([`super::notices`]). Either way the pools it touched are
/// invalidated in this replica's cache once it commits. [`WriteTx::exec`]
/// runs statements in it.
pub struct WriteTx {
    inner: Inner,
    /// Pools this transaction wrote, invalidated in the cache once it commits.
    touched: Vec<crate::domain::object::PoolRef>,
    cache: Option<Arc<super::pool_cache::PoolCache>>,
    /// The transaction's span, from the wait for the writer to the commit
    /// (or the rollback of a drop): ends when the transaction does.
    span: tracing::Span,
    /// The span whose work this is (a request's, a pass's), named in the
    /// row notices of the commit: another replica's pass links to it.
    by: Option<opentelemetry::trace::SpanContext>,
}

enum Inner {
    Sqlite {
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        /// Dropped after the transaction (field order), so the next writer
        /// starts once this one has committed or rolled back.
        _permit: Permit,
    },
    Postgres {
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        /// This replica's id, the origin of the notices the commit sends.
        origin: Arc<str>,
    },
}

impl WriteTx {
    pub(super) fn postgres(
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        origin: Arc<str>,
        cache: Arc<super::pool_cache::PoolCache>,
    ) -> Self {
        Self {
            inner: Inner::Postgres { tx, origin },
            touched: Vec::new(),
            cache: Some(cache),
            span: tracing::Span::none(),
            by: None,
        }
    }

    /// The transaction's connection, to run statements in.
    pub fn exec(&mut self) -> super::exec::Exec<'_> {
        match &mut self.inner {
            Inner::Sqlite { tx, .. } => super::exec::Exec::Sqlite(tx),
            Inner::Postgres { tx, .. } => super::exec::Exec::Pg(tx),
        }
    }

    /// Makes `span` the transaction's span, for the work of span `by`.
    pub(super) fn in_span(mut self, span: tracing::Span, by: Option<opentelemetry::trace::SpanContext>) -> Self {
        self.span = span;
        self.by = by;
        self
    }

    pub async fn commit(self) -> sqlx::Result<()> {
        let span = self.span.clone();
        let result = tracing::Instrument::instrument(self.commit_untraced(), span.clone()).await;
        span.record("outcome", if result.is_ok() { "committed" } else { "error" });
        result
    }

    async fn commit_untraced(self) -> sqlx::Result<()> {
        let Self { inner, touched, cache, span: _, by } = self;
        match inner {
            Inner::Sqlite { tx, _permit } => tx.commit().await?,
            Inner::Postgres { mut tx, origin } => {
                // Sent inside the transaction: delivered when it commits,
                // in commit order, and never for a write rolled back.
                if !touched.is_empty() {
                    super::notify::rows(&mut tx, &origin, &touched, by.as_ref()).await?;
                }
                tx.commit().await?
            }
        }
        if let Some(cache) = cache {
            cache.invalidate(&touched);
        }
        Ok(())
    }

    /// The store's clock: PostgreSQL's (the same for every replica,
    /// whatever their own clocks say), or this process's on SQLite (the one
    /// process that writes it). For times that other replicas compare.
    pub async fn now(&mut self) -> sqlx::Result<chrono::DateTime<chrono::Utc>> {
        match &mut self.inner {
            Inner::Sqlite { .. } => Ok(crate::clock::wall()),
            Inner::Postgres { tx, .. } => sqlx::query_scalar("select now()").fetch_one(&mut **tx).await,
        }
    }

    /// Notes that this transaction writes `pool`'s row.
    pub fn touched_pool(&mut self, pool: &crate::domain::object::PoolRef) {
        if self.cache.is_some() && !self.touched.contains(pool) {
            self.touched.push(pool.clone());
        }
    }
}

/// Takes the gate, then `BEGIN IMMEDIATE` on the writer: the write lock at
/// once, so that a transaction that reads first and writes later never
/// meets another process's commit in between (`SQLITE_BUSY` at once).
pub async fn begin(
    gate: &Arc<WriteGate>,
    writer: &SqlitePool,
    cache: Arc<super::pool_cache::PoolCache>,
    priority: Priority,
) -> sqlx::Result<WriteTx> {
    let permit = gate.acquire(priority).await;
    let tx = writer.begin_with("BEGIN IMMEDIATE").await?;
    Ok(WriteTx {
        inner: Inner::Sqlite { tx, _permit: permit },
        touched: Vec::new(),
        cache: Some(cache),
        span: tracing::Span::none(),
        by: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_request_goes_before_waiting_workers() {
        let gate = Arc::new(WriteGate::default());
        let held = gate.acquire(Priority::Background).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (who, priority) in
            [("bg1", Priority::Background), ("bg2", Priority::Background), ("req", Priority::Request)]
        {
            let (gate, order) = (gate.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _p = gate.acquire(priority).await;
                order.lock().unwrap().push(who);
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(held);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["req", "bg1", "bg2"]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_does_not_keep_the_gate() {
        let gate = Arc::new(WriteGate::default());
        let held = gate.acquire(Priority::Request).await;
        let given_up = tokio::time::timeout(Duration::from_millis(10), gate.acquire(Priority::Request)).await;
        assert!(given_up.is_err());
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), gate.acquire(Priority::Background))
            .await
            .expect("the gate is free again");
    }
}
