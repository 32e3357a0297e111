//! The upgrade runner: a background task that finds every pending or
//! running job and drives each on its own task. A job runs on one task at
//! a time, and only once its claim (see [`super::claim`]) is this
//! runner's; the store allows one active job per cluster.
//!
//! Shutdown: the stop signal reaches every job. A job between two steps
//! stops there; a job in a wait stops at once (a wait only looks); a job
//! in a write lets that one call, with its retries, finish and stops after
//! it. Whatever is still running after [`SHUTDOWN_GRACE`] is dropped where
//! it stands, exactly as a crash would leave it, which every step is built
//! to survive: the step runs again from its beginning on the next start,
//! and looks at the cluster before it acts.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::claim::JobError;
use super::{Context, UpgradeQueue, job};

/// How often the store is scanned even when nobody woke the runner.
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// How long a job whose run failed on a store error waits before the next try.
const COOLDOWN: Duration = Duration::from_secs(2);
/// This process holds the data directory's lock (SQLite): whoever owned a
/// job before is gone, and its jobs are this runner's to resume. (With
/// replicas, other owners are alive: their claims go stale on their own.)
async fn release_previous(ctx: &Context) {
    let released = async {
        let mut tx = ctx.db.begin_background().await?;
        let n = crate::db::upgrades::release_others(&mut tx, &ctx.owner).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(n)
    };
    match released.await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "released the claims of a previous drover process"),
        Err(e) => tracing::warn!(error = %e, "could not release old claims; they expire on their own"),
    }
}

/// How long jobs get to reach a safe point after the stop signal; within
/// the application's own drain timeout.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

pub async fn run(ctx: Context, queue: UpgradeQueue, cancel: CancellationToken) {
    if !ctx.settings.claims.shared {
        release_previous(&ctx).await;
    }
    let mut tasks: JoinSet<(i64, Result<(), JobError>)> = JoinSet::new();
    let mut running: HashSet<i64> = HashSet::new();
    let mut cooldown: HashMap<i64, Instant> = HashMap::new();
    // Which job a task drives, to free the job when its task panics.
    let mut task_jobs: HashMap<tokio::task::Id, i64> = HashMap::new();
    loop {
        match crate::db::upgrades::active_ids(ctx.db.background()).await {
            Ok(ids) => {
                let now = Instant::now();
                cooldown.retain(|_, until| *until > now);
                for id in ids {
                    if running.contains(&id) || cooldown.contains_key(&id) {
                        continue;
                    }
                    running.insert(id);
                    let (ctx, stop) = (ctx.clone(), cancel.clone());
                    let handle = tasks.spawn(async move { (id, job::run_job(&ctx, id, &stop).await) });
                    task_jobs.insert(handle.id(), id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing upgrade jobs failed"),
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = queue.woken() => {}
            Some(done) = tasks.join_next_with_id() => {
                match done {
                    Ok((task, (id, result))) => {
                        task_jobs.remove(&task);
                        running.remove(&id);
                        match result {
                            Ok(()) => {}
                            Err(JobError::Lost(_)) => {
                                tracing::warn!(job = id, "upgrade job is no longer this runner's; stopped driving it");
                            }
                            Err(e) => {
                                tracing::warn!(job = id, error = %crate::error::error_chain(&e), "upgrade job interrupted by a store error; trying again soon");
                                cooldown.insert(id, Instant::now() + COOLDOWN);
                            }
                        }
                    }
                    Err(e) => {
                        let id = task_jobs.remove(&e.id());
                        tracing::error!(job = ?id, error = %e, "upgrade job task panicked");
                        if let Some(id) = id {
                            running.remove(&id);
                            cooldown.insert(id, Instant::now() + COOLDOWN);
                        }
                    }
                }
            }
            _ = tokio::time::sleep(SCAN_INTERVAL) => {}
        }
    }
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            jobs = tasks.len(),
            "upgrade jobs did not reach a safe point in time; leaving them to be redone"
        );
        tasks.shutdown().await;
    }
}
