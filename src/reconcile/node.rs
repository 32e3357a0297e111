//! A machine of a pool that belongs to a cluster is a Kubernetes node, and it leaves the cluster before its
//! container goes: cordon, drain, then (after the container) the Node
//! object. A drain that fails keeps the machine; the pass fails and the
//! worker tries again with backoff. The node stays cordoned meanwhile, as
//! after a failed `kubectl drain`.

use super::context::{Context, ReconcileError};
use crate::clusters::ConnectError;
use crate::domain::event::{EventType, NewEvent};
use crate::domain::pool::Pool;
use crate::k8s::drain::NodeDrain;
use crate::k8s::{ClusterApi, DrainError};

fn drain_failed(pool: &Pool, machine: &str, source: DrainError) -> ReconcileError {
    let cluster = pool.spec.cluster().unwrap_or_default().to_owned();
    ReconcileError::Drain { machine: machine.to_owned(), cluster, source }
}

async fn record(ctx: &Context, pool: &Pool, reason: &'static str, message: String) {
    let ev = NewEvent::pool(&pool.id, EventType::Normal, reason, message);
    ctx.record(&ev).await;
}

/// Cordons and drains the machine's node when the pool belongs to a
/// cluster. Answers the cluster's API (to delete the Node once the
/// container is gone), or `None` when the pool belongs to no cluster.
#[tracing::instrument(skip(ctx, pool), fields(pool = %pool.id, cluster = ?pool.spec.cluster()))]
pub(super) async fn leave_cluster(
    ctx: &Context,
    pool: &Pool,
    machine: &str,
) -> Result<Option<ClusterApi>, ReconcileError> {
    let Some(cluster) = pool.cluster() else { return Ok(None) };
    let settings = ctx.nodes;
    let api = match crate::clusters::connect(ctx.db.background(), &cluster, settings.retry).await {
        Ok(api) => api.with_metrics(ctx.metrics.clone()),
        Err(ConnectError::NotRegistered(_)) => {
            return Err(drain_failed(pool, machine, DrainError::UnknownCluster(cluster.name.clone())));
        }
        // Unusable stored credentials fail the pass (Reconciled=False), never the process.
        Err(ConnectError::Unusable { source, .. }) => {
            return Err(drain_failed(pool, machine, DrainError::Credentials(source)));
        }
        Err(ConnectError::Store(e)) => return Err(e.into()),
    };
    // The node is named like the machine: kind names its nodes after their containers.
    let drain = NodeDrain::new(&api, machine, settings.drain);
    if !drain.cordon().await.map_err(|e| drain_failed(pool, machine, e))? {
        let why = format!("cluster {cluster:?} has no node {machine}; nothing to drain");
        record(ctx, pool, "MachineDrained", why).await;
        return Ok(Some(api));
    }
    record(ctx, pool, "MachineCordoned", format!("cordoned node {machine} of cluster {cluster:?}")).await;
    let done = drain.drain().await.map_err(|e| drain_failed(pool, machine, e))?;
    let message = format!(
        "drained node {machine}: {} pod(s) evicted, {} DaemonSet or mirror pod(s) left to go with it",
        done.evicted, done.kept
    );
    record(ctx, pool, "MachineDrained", message).await;
    tracing::info!(machine, evicted = done.evicted, kept = done.kept, "node drained");
    Ok(Some(api))
}

/// Deletes the Node of a machine whose container is gone, so that the
/// cluster keeps no NotReady node. The machine is gone either way, and no
/// later pass would see it, so a failure here is reported, not retried.
#[tracing::instrument(skip(ctx, pool, api), fields(pool = %pool.id))]
pub(super) async fn forget_node(ctx: &Context, pool: &Pool, api: &ClusterApi, machine: &str) {
    let outcome = tokio::time::timeout(ctx.nodes.drain.timeout, api.delete_node(machine)).await;
    let failure = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {:?}", ctx.nodes.drain.timeout),
    };
    tracing::warn!(machine, error = %failure, "deleting the node failed");
    let ev = NewEvent::pool(
        &pool.id,
        EventType::Warning,
        "NodeDeleteFailed",
        format!("node {machine} stays in the cluster; delete it by hand: {failure}"),
    );
    ctx.record(&ev).await;
}
