//! `run_job` called directly, without a server: one job, one store, the
//! Kubernetes API simulator, and runners with ids of their own. What the
//! claim guarantees (a cancelled or someone else's job is never driven, a
//! runner that lost its job stops before its next write) and what a stop
//! does to a step in a wait.

use std::sync::Arc;
use std::time::Duration;

use drover::clusters::Clusters;
use drover::db::{self, Db};
use drover::domain::object::{ClusterRef, Namespace, ObjectRef};
use drover::domain::upgrade::{JobState, Step};
use drover::identity::Access;
use drover::k8s::{Credentials, RetryPolicy};
use drover::upgrade::claim::JobError;
use drover::upgrade::service::{NewUpgrade, Upgrades};
use drover::upgrade::{Context, Settings, job::run_job};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::kube_sim::{KubeSim, Matcher, SimSettings};
use crate::upgrade_env::{CLUSTER, FROM, SIM_TOKEN, TO, assert_consistent};

const LIMIT: Duration = Duration::from_secs(20);

struct Bench {
    sim: KubeSim,
    db: Db,
    settings: Settings,
    _dir: TempDir,
}

fn credentials(sim: &KubeSim) -> Credentials {
    Credentials::Token { server: sim.url(), token: SIM_TOKEN.into(), ca_certificate: None }
}

async fn bench() -> Bench {
    let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
    sim.seed_control_plane(FROM);
    let dir = TempDir::new().expect("temporary directory");
    let db = crate::helpers::test_store(dir.path()).await;
    let mut tx = db.begin_write().await.expect("a write");
    let cluster = ClusterRef::new(Namespace::default(), CLUSTER);
    db::clusters::insert(&mut tx, &cluster, &sim.url(), &credentials(&sim), chrono::Utc::now()).await.expect("cluster");
    tx.commit().await.expect("commit");
    let retry = RetryPolicy { tries: 10, backoff: Duration::from_millis(5), call_timeout: Duration::from_secs(3) };
    let settings = Settings {
        retry,
        wait_timeout: Duration::from_secs(4),
        poll_interval: Duration::from_millis(15),
        claims: Default::default(),
    };
    Bench { sim, db, settings, _dir: dir }
}

impl Bench {
    /// A runner with an id of its own.
    fn runner(&self) -> Context {
        let metrics = Arc::new(drover::metrics::Metrics::default());
        Context::new(self.db.clone(), self.settings, metrics, Default::default(), drover::replicas::replica_id().into())
    }

    async fn new_job(&self) -> i64 {
        let body = NewUpgrade { version: TO.into(), ..NewUpgrade::default() };
        self.upgrades().create(&Access::unrestricted(Namespace::default()), CLUSTER, &body).await.expect("job").job.id
    }

    /// The API's service of upgrade jobs.
    fn upgrades(&self) -> Upgrades {
        let clusters = Clusters::new(self.db.clone(), self.settings.retry);
        Upgrades::new(self.db.clone(), clusters, Default::default())
    }

    async fn job(&self, id: i64) -> db::upgrades::Job {
        db::upgrades::get(self.db.read(), id).await.expect("store").expect("job")
    }

    async fn reasons(&self, id: i64) -> Vec<String> {
        let events = db::events::list(self.db.read(), &ObjectRef::Job(id), None, 500).await;
        events.expect("events").into_iter().map(|e| e.reason).collect()
    }

    fn writes(&self) -> Vec<String> {
        self.sim.ops().iter().filter(|o| o.is_write()).map(|o| o.to_string()).collect()
    }
}

#[tokio::test]
async fn run_job_drives_a_job_to_its_end_and_running_it_again_changes_nothing() {
    let b = bench().await;
    let id = b.new_job().await;
    let stop = CancellationToken::new();
    tokio::time::timeout(LIMIT, run_job(&b.runner(), id, &stop)).await.expect("run_job hung").expect("run_job");
    let job = b.job(id).await;
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert!(job.owner.is_none(), "an ended job has no owner");
    b.sim.clear_ops();
    run_job(&b.runner(), id, &stop).await.expect("run_job on an ended job");
    assert!(b.sim.ops().is_empty(), "an ended job is never touched: {:?}", b.sim.ops());
}

#[tokio::test]
async fn run_job_never_touches_a_job_cancelled_before_its_claim() {
    let b = bench().await;
    let id = b.new_job().await;
    let cancelled =
        b.upgrades().cancel(&Access::unrestricted(Namespace::default()), &id.to_string()).await.expect("cancel");
    assert_eq!(cancelled.job.state, JobState::Cancelled, "a pending job is cancelled at once");
    b.sim.clear_ops();
    run_job(&b.runner(), id, &CancellationToken::new()).await.expect("run_job");
    assert!(b.sim.ops().is_empty(), "a cancelled job's runner called the cluster: {:?}", b.sim.ops());
    let job = b.job(id).await;
    assert_eq!(job.state, JobState::Cancelled);
    assert!(job.started_at.is_none() && job.owner.is_none(), "{job:?}");
    assert_eq!(b.reasons(id).await, ["CancelRequested", "Accepted"], "newest first, and no Started");
}

#[tokio::test]
async fn a_runner_that_lost_its_job_stops_before_its_next_write_or_call() {
    let b = bench().await;
    let id = b.new_job().await;
    let hold = b.sim.hold(Matcher::new("apply", "daemonsets"));
    let ctx = b.runner();
    let running = tokio::spawn(async move { run_job(&ctx, id, &CancellationToken::new()).await });
    hold.reached(LIMIT, "step 1").await;
    // Someone else takes the job over while step 1's write is in flight.
    let takeover = format!("update upgrade_jobs set owner = 'another-runner' where id = {id}");
    crate::helpers::test_raw_store(b._dir.path()).await.execute(&takeover, &[]).await;
    b.sim.clear_ops();
    hold.release();
    let result = tokio::time::timeout(LIMIT, running).await.expect("the runner hung").expect("the runner panicked");
    assert!(matches!(result, Err(JobError::Lost(j)) if j == id), "{result:?}");
    let seen: Vec<String> = b.sim.ops().iter().map(|o| o.to_string()).collect();
    assert_eq!(seen, ["apply daemonsets temp-upgrade-self-hosted-kube-apiserver"], "only the write in flight went out");
    let job = b.job(id).await;
    assert_eq!(job.owner.as_deref(), Some("another-runner"));
    assert_eq!(job.step, Step::CreateTemp, "the lost runner did not move the job on");
}

#[tokio::test]
async fn a_second_runner_cannot_claim_a_job_that_a_live_runner_holds() {
    let b = bench().await;
    let id = b.new_job().await;
    let hold = b.sim.hold(Matcher::new("apply", "daemonsets"));
    let first = b.runner();
    let owner = first.owner.to_string();
    let running = tokio::spawn(async move { run_job(&first, id, &CancellationToken::new()).await });
    hold.reached(LIMIT, "step 1").await;
    b.sim.clear_ops();
    tokio::time::timeout(Duration::from_secs(2), run_job(&b.runner(), id, &CancellationToken::new()))
        .await
        .expect("the second runner should give up at once")
        .expect("run_job");
    assert!(b.sim.ops().is_empty(), "the second runner called the cluster: {:?}", b.sim.ops());
    assert_eq!(b.job(id).await.owner.as_deref(), Some(owner.as_str()));
    hold.release();
    tokio::time::timeout(LIMIT, running).await.expect("hung").expect("panicked").expect("run_job");
    let job = b.job(id).await;
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(b.reasons(id).await.iter().filter(|r| *r == "Started" || *r == "Resumed").count(), 1);
}

#[tokio::test]
async fn a_stop_in_a_wait_returns_at_once_and_the_step_is_redone_on_the_next_run() {
    let b = bench().await;
    let id = b.new_job().await;
    // Step 2's first look hangs: the runner is in its wait. (The first list
    // of the copy's pods is always step 2's; a later one could be step 3's,
    // which writes and is not cut short, when the copy already runs at
    // step 2's first look.)
    let hold = b.sim.hold(Matcher::new("list", "pods").selector("temp-upgrade-component=kube-apiserver"));
    let (ctx, stop) = (b.runner(), CancellationToken::new());
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { run_job(&ctx, id, &stop).await }
    });
    hold.reached(LIMIT, "step 2's wait").await;
    stop.cancel();
    // The held look never answers: only the stop can end the run, and the
    // limit is just generous for a loaded machine.
    let stopped = tokio::time::timeout(Duration::from_secs(5), running).await;
    stopped.expect("a stop in a wait must return at once, not wait for the look").expect("panicked").expect("run_job");
    let job = b.job(id).await;
    assert_eq!((job.state, job.step), (JobState::Running, Step::WaitTempRunning), "{job:?}");
    assert!(job.owner.is_none(), "a runner that stops gives its job up: {job:?}");
    let writes_before = b.writes();
    hold.release();

    tokio::time::timeout(LIMIT, run_job(&b.runner(), id, &CancellationToken::new())).await.expect("hung").expect("run");
    let job = b.job(id).await;
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let steps = db::upgrades::steps(b.db.read(), id).await.unwrap();
    let step2 = steps.iter().find(|s| s.position == 0 && s.step == 2).expect("step 2");
    assert_eq!(step2.attempts, 2, "the interrupted wait ran again");
    assert_eq!(writes_before, ["apply daemonsets temp-upgrade-self-hosted-kube-apiserver"], "a wait writes nothing");
    let view =
        serde_json::json!({"upgraded_components": ["kube-apiserver", "kube-controller-manager", "kube-scheduler"]});
    assert_consistent(&b.sim, &view);
}
