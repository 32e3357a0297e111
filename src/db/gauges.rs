//! What the scrape-time gauges of `/metrics` read: counts of what exists
//! now, so that a pool's series end with the pool.

use sqlx::AssertSqlSafe;

use super::exec::{Dialect, on_store};
use super::store::Db;
use crate::metrics::ScrapeGauges;

impl Db {
    /// The scrape-time gauges of `/metrics`: what exists now.
    pub async fn gauges(&self) -> sqlx::Result<ScrapeGauges> {
        scrape(self).await
    }
}

/// The store's counts at one scrape.
pub struct Counts {
    /// (namespace, pool, `ready` or the phase of a machine not ready, machines)
    pub machines: Vec<(String, String, String, i64)>,
    /// (namespace, pool, desired replicas, updated machines, outdated machines)
    pub pools: Vec<(String, String, i64, i64, i64)>,
    /// (state, jobs)
    pub jobs: Vec<(String, i64)>,
    /// (step name, seconds of finished steps, finished steps)
    pub steps: Vec<(String, f64, i64)>,
}

async fn counts(db: &Db) -> sqlx::Result<Counts> {
    let dialect = db.dialect();
    let machines = on_store!(db.read(), |e| {
        sqlx::query_as(
            "select namespace, pool, case when ready then 'ready' else phase end, count(*) from machines
         group by 1, 2, 3 order by 1, 2, 3",
        )
        .fetch_all(e)
        .await
    })?;
    let number = |document: &str, field: &str| match dialect {
        Dialect::Sqlite => format!("coalesce(json_extract({document}, '$.{field}'), 0)"),
        Dialect::Postgres => format!("coalesce(({document}::jsonb ->> '{field}')::bigint, 0)"),
    };
    let (replicas, updated, current) =
        (number("spec", "replicas"), number("status", "updated_replicas"), number("status", "replicas"));
    let sql = format!(
        "select namespace, name, {replicas}, {updated}, {current} - {updated} from pools order by namespace, name"
    );
    let pools = on_store!(db.read(), |e| sqlx::query_as(AssertSqlSafe(sql)).fetch_all(e).await)?;
    let jobs = on_store!(db.read(), |e| sqlx::query_as(
        "select state, count(*) from upgrade_jobs group by state order by state"
    )
    .fetch_all(e)
    .await)?;
    let seconds = dialect.pick(
        "(julianday(finished_at) - julianday(started_at)) * 86400.0",
        "extract(epoch from finished_at - started_at)::double precision",
    );
    let sql = format!(
        "select name, sum({seconds}), count(*)
         from upgrade_steps where finished_at is not null group by name order by name"
    );
    let steps = on_store!(db.read(), |e| sqlx::query_as(AssertSqlSafe(sql)).fetch_all(e).await)?;
    Ok(Counts { machines, pools, jobs, steps })
}

/// Gauges read from the store at scrape time: they describe what exists
/// now, so a pool's series end with the pool.
async fn scrape(db: &Db) -> sqlx::Result<ScrapeGauges> {
    let counts = counts(db).await?;
    let mut g = ScrapeGauges::default();
    let samples: Vec<_> = counts.machines.into_iter().map(|(ns, p, s, n)| (vec![ns, p, s], n as f64)).collect();
    g.family(
        "drover_machines",
        "Machines, by namespace, pool and phase (`ready`, or the phase of those not ready)",
        &["namespace", "pool", "phase"],
        &samples,
    );
    let rows = counts.pools;
    let per_pool = |f: fn(&(String, String, i64, i64, i64)) -> i64| -> Vec<_> {
        rows.iter().map(|r| (vec![r.0.clone(), r.1.clone()], f(r) as f64)).collect()
    };
    let labels = &["namespace", "pool"];
    g.family("drover_pool_replicas_desired", "The replicas each pool asks for", labels, &per_pool(|r| r.2));
    g.family(
        "drover_rollout_updated_machines",
        "Machines running the pool's desired image",
        labels,
        &per_pool(|r| r.3),
    );
    g.family("drover_rollout_outdated_machines", "Machines still running another image", labels, &per_pool(|r| r.4));
    let samples: Vec<_> = counts.jobs.into_iter().map(|(s, n)| (vec![s], n as f64)).collect();
    g.family("drover_upgrade_jobs", "Upgrade jobs, by state", &["state"], &samples);
    let sums: Vec<_> = counts.steps.iter().map(|(s, secs, _)| (vec![s.clone()], *secs)).collect();
    let finished: Vec<_> = counts.steps.iter().map(|(s, _, n)| (vec![s.clone()], *n as f64)).collect();
    g.family(
        "drover_upgrade_step_duration_seconds_sum",
        "Total time of finished upgrade steps, by step",
        &["step"],
        &sums,
    );
    g.family("drover_upgrade_step_duration_seconds_count", "Finished upgrade steps, by step", &["step"], &finished);
    Ok(g)
}
