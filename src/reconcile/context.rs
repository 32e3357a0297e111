//! What every pass and its helpers share: the context a pass runs in, its
//! error, and the small helpers that count and log engine calls. Apart
//! from the pass itself (`mod.rs`), so that the pass's parts depend on
//! this and not on the pass.

use crate::domain::object::PoolRef;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::observe::Timing;
use super::starter::Starter;
use super::terminator::Terminator;
use crate::db::{Db, WriteTx};
use crate::engines::EngineSet;
use crate::k8s::NodeSettings;
use crate::replicas::Fence;
use crate::runtime::{RuntimeError, Wake};

/// What every pass needs, shared by the worker and the API's dry runs.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub engines: EngineSet,
    pub timing: Timing,
    pub stop_timeout_secs: i64,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Tells event streams that a pool changed.
    pub changes: crate::events::changes::Changes,
    /// Cordon and drain of a machine's node, for pools that belong to a cluster.
    pub nodes: NodeSettings,
    /// Deletions in flight, in the background.
    pub terminator: Arc<Terminator>,
    /// Starts of new machines in flight, in the background.
    pub starter: Arc<Starter>,
    /// Wakes a pool (a deletion finished); the engines' events use it too.
    pub wakes: mpsc::UnboundedSender<Wake>,
    /// What time it is, for settling, backoff and deadlines.
    pub clock: crate::clock::Clock,
    /// Rules of pool specs from the settings (what machines may mount and
    /// run), shared with the API.
    pub limits: Arc<crate::domain::pool::SpecLimits>,
    /// Small writes off the worker's loop (an engine's events), tracked so
    /// that shutdown waits for them.
    pub tasks: tokio_util::task::TaskTracker,
    /// The pools this replica drives, with several replicas (PostgreSQL);
    /// `None`: this process drives every pool.
    pub leases: Option<Arc<crate::replicas::Leases>>,
    /// Where this pass may act: checked before every engine operation,
    /// proven in every write transaction. [`Fence::Sole`] outside a pass.
    pub fence: Fence,
    /// Set when a write transaction of this pass begins (each pass gets its
    /// own, from [`Context::for_pool`]): whether anyone must hear of the
    /// pool after it.
    pub writes_began: Arc<std::sync::atomic::AtomicBool>,
}

impl Context {
    /// Records an event on its own, at the clock's time; a failure is
    /// logged, not fatal (the next pass tells the story again).
    pub(crate) async fn record(&self, ev: &crate::domain::event::NewEvent) {
        let recorded = async {
            let mut tx = self.begin().await?;
            crate::db::events::record(&mut tx, ev, self.clock.now()).await?;
            tx.commit().await?;
            Ok::<_, ReconcileError>(())
        };
        match recorded.await {
            Ok(()) => {}
            Err(ReconcileError::Lost(lost)) => tracing::debug!(%lost, "event not recorded"),
            Err(e) => tracing::warn!(error = %crate::error::error_chain(&e), "recording an event failed"),
        }
    }

    /// A write transaction of the pass: its fence proven first, so nothing
    /// is written for a pool this replica no longer drives.
    pub(crate) async fn begin(&self) -> Result<WriteTx, ReconcileError> {
        self.writes_began.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut tx = self.db.begin_background().await?;
        self.fence.prove(&mut tx).await?;
        Ok(tx)
    }

    /// Whether this pass began a write transaction (it may have changed
    /// what `GET` shows of the pool).
    pub(crate) fn wrote(&self) -> bool {
        self.writes_began.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The replica's name for `status.driver`, with several replicas.
    pub(crate) fn driver(&self) -> Option<String> {
        self.leases.as_ref().map(|l| l.me.to_string())
    }

    /// Before work that leads to an engine operation of the pass.
    pub(crate) fn may_act(&self) -> Result<(), crate::replicas::Lost> {
        self.fence.check()
    }

    /// What an engine operation of the pass asks once it has its turn,
    /// right before it is sent (a check before a wait for an engine's slot
    /// would let an expired lease act).
    pub(crate) fn gate(&self) -> impl Fn() -> bool + Sync + '_ {
        || self.fence.check().is_ok()
    }

    /// An engine operation's result, with one the [`gate`](Self::gate)
    /// left unsent turned into the lease's loss: the pass stops, as it
    /// does for a write the store refuses.
    pub(crate) fn sent<T>(&self, r: Result<T, RuntimeError>) -> Result<Result<T, RuntimeError>, crate::replicas::Lost> {
        match r {
            Err(RuntimeError::Fenced) => Err(self.fence.lost()),
            r => Ok(r),
        }
    }

    /// This context for a pass of `pool`: fenced by its lease, or `None`
    /// when another replica drives it. Every pool is this process's
    /// without leases.
    pub fn for_pool(&self, pool: &PoolRef) -> Option<Context> {
        let fence = match &self.leases {
            None => self.fence.clone(),
            Some(leases) => leases.fence(pool)?,
        };
        Some(Context { fence, writes_began: Default::default(), ..self.clone() })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Another replica drives the pool now: the pass stops, unrecorded.
    #[error(transparent)]
    Lost(#[from] crate::replicas::Lost),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("{failed} of {total} container operations failed; first: {first}")]
    Partial { failed: usize, total: usize, first: Box<ReconcileError> },
    /// The machine's node was not cordoned and drained, so its
    /// container is kept.
    #[error("machine {machine} kept: its node in cluster {cluster:?} was not drained")]
    Drain {
        machine: String,
        cluster: String,
        #[source]
        source: crate::k8s::DrainError,
    },
}

impl From<crate::replicas::FenceError> for ReconcileError {
    fn from(e: crate::replicas::FenceError) -> Self {
        match e {
            crate::replicas::FenceError::Lost(lost) => Self::Lost(lost),
            crate::replicas::FenceError::Store(e) => Self::Store(e),
        }
    }
}

impl ReconcileError {
    /// The error behind a `Partial`, or this one.
    pub(super) fn first(&self) -> &ReconcileError {
        match self {
            Self::Partial { first, .. } => first,
            other => other,
        }
    }
}

/// Counts one engine call by its result.
pub(crate) fn count_call<T>(ctx: &Context, engine: &str, op: &'static str, r: &Result<T, RuntimeError>) {
    use crate::metrics::CallResult;
    let result = match r {
        Ok(_) => CallResult::Ok,
        Err(RuntimeError::Unavailable(_)) => CallResult::Unavailable,
        Err(_) => CallResult::Error,
    };
    ctx.metrics.runtime_call(engine, op, result);
}
