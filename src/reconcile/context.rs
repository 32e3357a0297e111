//! What every pass and its helpers share: the context a pass runs in, its
//! error, and the small helpers that count and log engine calls. Apart
//! from the pass itself (`mod.rs`), so that the pass's parts depend on
//! this and not on the pass.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::observe::Timing;
use super::starter::Starter;
use super::terminator::Terminator;
use crate::db::Db;
use crate::k8s::NodeSettings;
use crate::runtime::{Engines, RuntimeError, Wake};

/// What every pass needs, shared by the worker and the API's dry runs.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub engines: Engines,
    pub timing: Timing,
    pub stop_timeout_secs: i64,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Tells event streams that a pool changed.
    pub changes: crate::changes::Changes,
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
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("{failed} of {total} container operations failed; first: {first}")]
    Partial { failed: usize, total: usize, first: Box<ReconcileError> },
    /// Rule 5: the machine's node was not cordoned and drained, so its
    /// container is kept.
    #[error("machine {machine} kept: its node in cluster {cluster:?} was not drained")]
    Drain {
        machine: String,
        cluster: String,
        #[source]
        source: crate::k8s::DrainError,
    },
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

/// The container is already created or gone when its record is written,
/// and the next pass re-derives records from the engines, so a failed
/// write is logged rather than failing the operation.
pub(crate) fn warn_unrecorded(result: sqlx::Result<()>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "recording a machine change failed; the next pass will repair it");
    }
}
