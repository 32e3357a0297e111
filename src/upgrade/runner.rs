//! The upgrade runner: a background task that finds every pending or
//! running job and drives each on its own task. A job runs on one task at
//! a time; the store allows one active job per cluster. On shutdown every
//! job task is dropped where it stands; its stored position brings it back
//! to the same step on the next start.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Context, UpgradeQueue, job};

/// How often the store is scanned even when nobody woke the runner.
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// How long a job whose run failed on a store error waits before the next try.
const COOLDOWN: Duration = Duration::from_secs(2);

pub async fn run(ctx: Context, queue: UpgradeQueue, cancel: CancellationToken) {
    let mut tasks: JoinSet<(i64, sqlx::Result<()>)> = JoinSet::new();
    let mut running: HashSet<i64> = HashSet::new();
    let mut cooldown: HashMap<i64, Instant> = HashMap::new();
    // Which job a task drives, to free the job when its task panics.
    let mut task_jobs: HashMap<tokio::task::Id, i64> = HashMap::new();
    loop {
        match crate::db::upgrades::active_ids(&ctx.db).await {
            Ok(ids) => {
                let now = Instant::now();
                cooldown.retain(|_, until| *until > now);
                for id in ids {
                    if running.contains(&id) || cooldown.contains_key(&id) {
                        continue;
                    }
                    running.insert(id);
                    let (ctx, stop) = (ctx.clone(), cancel.clone());
                    let handle = tasks.spawn(async move {
                        tokio::select! {
                            // Dropping the job mid-step is safe: it resumes at that step.
                            _ = stop.cancelled() => (id, Ok(())),
                            r = job::run_job(&ctx, id) => (id, r),
                        }
                    });
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
                        if let Err(e) = result {
                            tracing::warn!(job = id, error = %crate::error::error_chain(&e), "upgrade job interrupted by a store error; trying again soon");
                            cooldown.insert(id, Instant::now() + COOLDOWN);
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
    while tasks.join_next().await.is_some() {}
}
