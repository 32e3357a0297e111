//! Upgrade jobs with several replicas: claimed with leases on the
//! database's clock, like pools, so that a replica's own clock does not
//! matter. Real processes of the real binary on a real PostgreSQL, one of
//! them with its wall clock a minute off through Debian's `faketime`, and
//! the Kubernetes API simulator of this test process as the cluster.
//!
//! A job is kept waiting in step 5 (the new image never runs, and the wait
//! lasts ten minutes) so that whoever holds it keeps acting on it: looking
//! at the cluster, renewing its lease, stamping its heartbeat.

use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::time::Instant;

use crate::helpers::{admin_token, client_with_token, hold_for, wait_for};
use crate::kube_sim::{KubeSim, SimSettings};
use crate::postgres;
use crate::process::Process;
use crate::upgrade_env::{CLUSTER, FROM, SIM_TOKEN, TO};

const LEASE: &str = "6s";
const LEASE_DURATION: Duration = Duration::from_secs(6);
const LIMIT: Duration = Duration::from_secs(60);

/// `drover serve` on `url`, its clock moved by `offset` when given.
async fn replica(dir: &Path, url: &str, offset: Option<&str>) -> Process {
    let args = [
        "--database-url",
        url,
        "--lease-duration",
        LEASE,
        "--runtime",
        "simulated",
        "--upgrade-wait-timeout",
        "10m",
        "--upgrade-poll-interval",
        "200ms",
        "--upgrade-retry-backoff",
        "50ms",
    ];
    let p = match offset {
        None => Process::spawn_with(dir, &args),
        Some(offset) => Process::spawn_faked(dir, offset, &args),
    };
    p.wait_up().await;
    p
}

/// How far the process's wall clock is from this one's, by the `Date`
/// header of its answers (whole seconds).
async fn clock_offset(p: &Process) -> i64 {
    let res = reqwest::get(format!("{}/healthz", p.addr)).await.expect("healthz");
    let date = res.headers()["date"].to_str().expect("a Date header").to_owned();
    let theirs = chrono::DateTime::parse_from_rfc2822(&date.replace("GMT", "+0000")).expect("an HTTP date");
    let ours = chrono::DateTime::<chrono::Utc>::from(SystemTime::now());
    theirs.timestamp() - ours.timestamp()
}

/// Who drives the job, as the store says: the owner recorded on the job,
/// and its lease's token (0 without one).
async fn lease(db: &mut sqlx::PgConnection, job: i64) -> Option<(String, i64)> {
    let row: (Option<String>, i64) = sqlx::query_as(
        "select j.owner, coalesce(l.token, 0) from upgrade_jobs j
         left join leases l on l.kind = 'job' and l.name = cast(j.id as text) and l.holder = j.owner
         where j.id = $1",
    )
    .bind(job)
    .fetch_one(db)
    .await
    .expect("reading the job's owner");
    row.0.map(|owner| (owner, row.1))
}

/// What the job's runner has written: the job row's heartbeat and update
/// times, its steps and its events.
async fn written(db: &mut sqlx::PgConnection, job: i64) -> String {
    let row: (Option<String>, String, i64, i64) = sqlx::query_as(
        "select heartbeat_at::text, updated_at::text,
                (select count(*) from upgrade_steps where job_id = $1),
                (select count(*) from events where subject_kind = 'job' and subject = $1::text)
         from upgrade_jobs where id = $1",
    )
    .bind(job)
    .fetch_one(db)
    .await
    .expect("reading the job");
    format!("{row:?}")
}

/// The replica the job's view says drives it (`driver`), asked through `p`.
async fn shown_driver(client: &reqwest::Client, p: &Process, job: i64) -> Option<String> {
    let res = client.get(format!("{}/v1/upgrades/{job}", p.addr)).send().await.expect("reading the job");
    let view: Value = res.json().await.expect("job JSON");
    view["driver"].as_str().map(str::to_owned)
}

fn holds(p: &Process, lease: &Option<(String, i64)>) -> bool {
    lease.as_ref().is_some_and(|(holder, _)| holder.contains(&format!("-{}-", p.pid())))
}

/// A simulated cluster whose API server upgrade never comes up, registered
/// through `p`; then an upgrade of it, started through `p`: its id.
async fn stuck_upgrade(sim: &KubeSim, p: &Process, client: &reqwest::Client) -> i64 {
    sim.break_image(&format!("registry.k8s.io/kube-apiserver:{TO}"));
    let res = client
        .post(format!("{}/v1/clusters", p.addr))
        .json(&json!({"name": CLUSTER, "server": sim.url(), "token": SIM_TOKEN}))
        .send()
        .await
        .expect("registering the cluster");
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = client
        .post(format!("{}/v1/clusters/{CLUSTER}/upgrades", p.addr))
        .json(&json!({"version": TO}))
        .send()
        .await
        .expect("starting the upgrade");
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let job: Value = res.json().await.expect("job JSON");
    job["id"].as_i64().expect("job id")
}

async fn connect(url: &str) -> sqlx::PgConnection {
    <sqlx::PgConnection as sqlx::Connection>::connect(url).await.expect("connecting to the store")
}

async fn sim() -> KubeSim {
    let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
    sim.seed_control_plane(FROM);
    sim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_a_minute_ahead_never_takes_a_live_job() {
    let url = postgres::shared().fresh_database();
    let mut db = connect(&url).await;
    let sim = sim().await;
    let (dir_a, dir_b) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let a = replica(dir_a.path(), &url, None).await;
    let client = client_with_token(&admin_token(dir_a.path()));
    let job = stuck_upgrade(&sim, &a, &client).await;
    wait_for(LIMIT, "a to claim the job", async || holds(&a, &lease(&mut db, job).await)).await;

    let claimed = lease(&mut db, job).await;
    let owner = claimed.as_ref().map(|(owner, _)| owner.clone());
    assert_eq!(shown_driver(&client, &a, job).await, owner, "the job shows the replica that drives it");
    let b = replica(dir_b.path(), &url, Some("+60s")).await;
    assert_eq!(shown_driver(&client, &b, job).await, owner, "every replica shows the same driver");
    let offset = clock_offset(&b).await;
    assert!((55..=65).contains(&offset), "b's clock runs a minute ahead: {offset} s");
    // Three leases' time with both alive: b's clock says a's claim is a
    // minute old, the store's says it is current.
    hold_for(3 * LEASE_DURATION, "the job stays a's, under the same token", async || {
        let now = lease(&mut db, job).await;
        if now == claimed { Ok(()) } else { Err(format!("the lease moved from {claimed:?} to {now:?}")) }
    })
    .await;

    // b works: once a is gone, b takes the job over, with the next token.
    let killed = Instant::now();
    a.kill();
    let token = claimed.map_or(0, |(_, t)| t);
    wait_for(LIMIT, "b to take the job over once a's lease ran out", async || {
        let now = lease(&mut db, job).await;
        holds(&b, &now) && now.is_some_and(|(_, t)| t == token + 1)
    })
    .await;
    let driver = shown_driver(&client, &b, job).await;
    assert!(holds(&b, &driver.map(|d| (d, 0))), "the job shows its new driver");
    assert!(killed.elapsed() >= LEASE_DURATION / 2, "not before a's lease could have run out: {:?}", killed.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_a_minute_behind_stops_acting_on_a_job_it_lost() {
    let url = postgres::shared().fresh_database();
    let mut db = connect(&url).await;
    let sim = sim().await;
    let (dir_a, dir_b) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let b = replica(dir_b.path(), &url, Some("-60s")).await;
    let offset = clock_offset(&b).await;
    assert!((-65..=-55).contains(&offset), "b's clock runs a minute behind: {offset} s");
    let client = client_with_token(&admin_token(dir_b.path()));
    let job = stuck_upgrade(&sim, &b, &client).await;
    wait_for(LIMIT, "b to claim the job", async || holds(&b, &lease(&mut db, job).await)).await;
    // a joins: its clock says b's heartbeats are a minute old; the store's
    // says b's lease is current.
    let claimed = lease(&mut db, job).await;
    let a = replica(dir_a.path(), &url, None).await;
    hold_for(2 * LEASE_DURATION, "the job stays b's while b lives", async || {
        let now = lease(&mut db, job).await;
        if now == claimed { Ok(()) } else { Err(format!("the lease moved from {claimed:?} to {now:?}")) }
    })
    .await;

    // b freezes past its lease; a takes the job over, then freezes too, so
    // that anything the cluster or the store sees next is b's.
    b.signal(libc::SIGSTOP);
    wait_for(LIMIT, "a to take the job over", async || holds(&a, &lease(&mut db, job).await)).await;
    a.signal(libc::SIGSTOP);
    // A call a sent just before it froze may still reach the cluster: what
    // comes next is counted once nothing has arrived for 300 ms (b is
    // frozen too, so all of it is a's).
    let mut calls = sim.ops().len();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = sim.ops().len();
        if now == calls {
            break;
        }
        calls = now;
    }
    let rows = written(&mut db, job).await;
    b.signal(libc::SIGCONT);
    // Half a lease: well within a's lease, which a renewed at most a third
    // of a lease before it froze, so b has no way to hold the job again.
    hold_for(LEASE_DURATION / 2, "b sends nothing to the cluster and writes nothing of the job", async || {
        let (now_calls, now_rows) = (sim.ops().len(), written(&mut db, job).await);
        if now_calls != calls {
            return Err(format!("b made {} Kubernetes calls: {:?}", now_calls - calls, &sim.ops()[calls..]));
        }
        if now_rows != rows { Err(format!("b wrote to the job: {rows} -> {now_rows}")) } else { Ok(()) }
    })
    .await;
    a.signal(libc::SIGCONT);
    let mut b = b;
    assert!(b.is_running(), "b resumed and runs on; it only stopped acting");
}
