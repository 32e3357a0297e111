//! One reconcile pass at a time, called directly, on a simulated engine and
//! a clock the test moves by hand: settling, restart backoff, replacement
//! and the progress deadline, tested in milliseconds rather than against
//! the wall clock through HTTP.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use drover::clock::Clock;
use drover::config::ServeConfig;
use drover::db::{self, Db};
use drover::domain::object::{ObjectRef, PoolRef};
use drover::domain::pool::{HostPolicy, PoolSpec, PoolSpecInput, SpecLimits};
use drover::domain::status::{ConditionType, Reason};
use drover::engines::{Engine, EngineSet, EngineSettings};
use drover::reconcile::observe::Timing;
use drover::reconcile::starter::Starter;
use drover::reconcile::terminator::Terminator;
use drover::reconcile::{Context, NodeSettings, Outcome, reconcile_once};
use drover::runtime::Backend;
use drover::runtime::ContainerState;
use drover::runtime::simulated::SimulatedBackend;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A pool of `default`, as the rig names them.
fn id(name: &str) -> PoolRef {
    PoolRef::in_default(name)
}

struct Rig {
    ctx: Context,
    engine: Arc<Engine>,
    clock: Clock,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let db: Db = crate::helpers::test_store(dir.path()).await;
    let (wakes, _rx) = tokio::sync::mpsc::unbounded_channel();
    let settings = EngineSettings { max_parallel: 8, lost_after: Duration::from_secs(30) };
    let engines = EngineSet::new(wakes.clone(), settings);
    let clock = Clock::manual(Utc::now());
    let engine =
        engines.add("local", Default::default(), Backend::Simulated(SimulatedBackend::with_clock(clock.clone())));
    let ctx = Context {
        db,
        engines,
        timing: Timing::default(),
        stop_timeout_secs: 1,
        metrics: Arc::new(drover::metrics::Metrics::default()),
        nodes: NodeSettings::from_config(&ServeConfig::for_data_dir(dir.path().to_path_buf())),
        terminator: Arc::new(Terminator::new(TaskTracker::new(), CancellationToken::new())),
        starter: Arc::new(Starter::new(TaskTracker::new(), CancellationToken::new())),
        wakes,
        clock: clock.clone(),
        changes: Default::default(),
        limits: Arc::new(SpecLimits::default()),
        tasks: TaskTracker::new(),
        leases: None,
        fence: drover::replicas::Fence::Sole,
        writes_began: Default::default(),
    };
    Rig { ctx, engine, clock, _dir: dir }
}

impl Rig {
    async fn pool(&self, name: &str, replicas: i64, image: &str, deadline: i64) {
        let input = PoolSpecInput {
            image: Some(image.into()),
            progress_deadline_seconds: Some(deadline),
            ..PoolSpecInput::minimal(replicas, "v1.29.2")
        };
        let spec = PoolSpec::parse(input, &SpecLimits::default()).expect("valid spec");
        let mut tx = self.ctx.db.begin_write().await.expect("a write");
        db::pools::insert(&mut tx, &id(name), &spec, self.clock.now()).await.expect("insert pool");
        tx.commit().await.expect("commit");
    }

    /// One pass, then the deletions it handed over, to their end.
    async fn pass(&self, pool: &str) -> Outcome {
        let outcome = reconcile_once(&self.ctx, &id(pool)).await.expect("pass");
        let what = "the deletions the pass handed to the terminator to end (a simulated stop is immediate)";
        crate::helpers::wait_for(Duration::from_secs(5), what, async || self.ctx.terminator.in_flight() == 0).await;
        outcome
    }

    /// Writes the pool's spec with a merge `patch`, as an API change would
    /// (whatever the rig's current settings allow).
    async fn change_spec(&self, pool: &str, patch: Value) {
        let current = db::pools::get(self.ctx.db.read(), &id(pool)).await.expect("read").expect("pool");
        let spec = current.spec.patched(&patch, &SpecLimits::unrestricted()).expect("a valid patch");
        let mut tx = self.ctx.db.begin_write().await.expect("a write");
        db::pools::update_spec(&mut tx, &id(pool), current.generation, &spec, self.clock.now())
            .await
            .expect("update spec");
        tx.commit().await.expect("commit");
    }

    async fn status(&self, pool: &str) -> drover::domain::status::PoolStatus {
        db::pools::get(self.ctx.db.read(), &id(pool)).await.expect("read").expect("pool").status
    }

    async fn reasons(&self, pool: &str) -> Vec<String> {
        let events = db::events::list(self.ctx.db.read(), &ObjectRef::Pool(id(pool)), None, 500).await.expect("events");
        events.into_iter().rev().map(|e| format!("{}: {}", e.reason, e.message)).collect()
    }

    /// The one container of the pool exits now, as a crash would.
    fn crash(&self, pool: &str) {
        let now = self.clock.now();
        for c in self.engine.containers(&id(pool)) {
            self.engine.simulation().expect("a simulated engine").change(&c.id, |c| {
                c.state = ContainerState::Exited;
                c.exit_code = Some(1);
                c.finished_at = Some(now);
            });
        }
    }
}

#[tokio::test]
async fn a_machine_counts_as_ready_only_once_it_has_settled() {
    let rig = rig().await;
    rig.pool("p", 2, "app:1", 600).await;
    let outcome = rig.pass("p").await;
    assert_eq!(rig.engine.containers(&id("p")).len(), 2);
    assert_eq!(rig.status("p").await.ready_replicas, 0, "just started: not ready");
    assert!(matches!(outcome, Outcome::Requeue(d) if d <= Duration::from_secs(2)), "{outcome:?}");
    let settle = Timing::default().settle;
    rig.clock.advance(settle - Duration::from_millis(1));
    rig.pass("p").await;
    assert_eq!(rig.status("p").await.ready_replicas, 0, "1 ms short of the settle time: still settling");
    rig.clock.advance(Duration::from_millis(2));
    let outcome = rig.pass("p").await;
    assert_eq!(rig.status("p").await.ready_replicas, 2, "the settle time without a break: ready");
    assert_eq!(outcome, Outcome::Idle, "nothing changes by the clock any more");
}

#[tokio::test]
async fn an_exited_machine_is_restarted_at_once_then_with_growing_backoff_then_replaced() {
    let rig = rig().await;
    rig.pool("p", 1, "app:1", 600).await;
    rig.pass("p").await;
    rig.clock.advance(Duration::from_secs(1));
    rig.pass("p").await;
    let first = rig.engine.containers(&id("p"))[0].name.clone();

    // Stopped by hand once: back at once.
    rig.crash("p");
    rig.pass("p").await;
    assert_eq!(rig.engine.containers(&id("p"))[0].state, ContainerState::Running, "restarted at once");
    // It keeps dying before it settles: each restart waits twice as long.
    for wait in [1u64, 2, 4, 8] {
        rig.crash("p");
        rig.clock.advance(Duration::from_millis(wait * 1000 - 10));
        rig.pass("p").await;
        assert_eq!(
            rig.engine.containers(&id("p"))[0].state,
            ContainerState::Exited,
            "not yet: the backoff is {wait} s"
        );
        rig.clock.advance(Duration::from_millis(10));
        rig.pass("p").await;
        assert_eq!(rig.engine.containers(&id("p"))[0].state, ContainerState::Running, "restarted after {wait} s");
    }
    // The fifth failure: replaced by a new machine instead.
    rig.crash("p");
    rig.clock.advance(Duration::from_secs(16));
    rig.pass("p").await;
    rig.pass("p").await;
    let now: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.name.clone()).collect();
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], first, "the broken machine was replaced");
    let story = rig.reasons("p").await;
    assert_eq!(story.iter().filter(|e| e.starts_with("MachineRestarted")).count(), 5, "{story:#?}");
    assert!(story.iter().any(|e| e.starts_with("MachineDeleting") && e.contains("kept failing")), "{story:#?}");
}

#[tokio::test]
async fn a_rollout_that_never_becomes_ready_stalls_at_its_deadline_and_keeps_the_old_machines() {
    let rig = rig().await;
    rig.pool("p", 2, "app:1", 30).await;
    rig.pass("p").await;
    rig.clock.advance(Duration::from_secs(1));
    rig.pass("p").await;
    let old: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.name.clone()).collect();
    rig.change_spec("p", json!({"image": "app-crash:2"})).await;
    for _ in 0..40 {
        rig.clock.advance(Duration::from_secs(1));
        rig.pass("p").await;
    }
    let status = rig.status("p").await;
    let progressing = status.condition(ConditionType::Progressing).cloned().expect("Progressing");
    assert_eq!(progressing.reason, Reason::ProgressDeadlineExceeded, "{status:#?}");
    let names: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.name.clone()).collect();
    assert!(old.iter().all(|o| names.contains(o)), "no healthy old machine was removed: {names:?}");
    assert_eq!(status.ready_replicas, 2);
}

#[tokio::test]
async fn settings_tightened_after_the_spec_was_accepted_stop_new_machines_but_keep_the_old() {
    let mut rig = rig().await;
    rig.pool("p", 2, "app:1", 600).await;
    rig.pass("p").await;
    rig.clock.advance(Duration::from_secs(1));
    rig.pass("p").await;
    let before: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.name.clone()).collect();
    assert_eq!(before.len(), 2);

    // A restart with a narrower --allowed-images; then a rollout to an image
    // it refuses and a scale-up, both written before (or around) the change.
    rig.ctx.limits =
        Arc::new(SpecLimits { host: HostPolicy::new(&[], &["app:1".into()], &[]), ..SpecLimits::default() });
    rig.change_spec("p", json!({"image": "other:2", "replicas": 3})).await;
    for _ in 0..5 {
        rig.clock.advance(Duration::from_secs(1));
        rig.pass("p").await;
    }
    let now: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.name.clone()).collect();
    assert_eq!(now, before, "no machine created, none deleted for a replacement");
    let status = rig.status("p").await;
    let reconciled = status.condition(ConditionType::Reconciled).cloned().expect("Reconciled");
    assert_eq!(reconciled.reason, Reason::HostPolicyRefused, "{status:#?}");
    assert!(reconciled.message.contains("other:2"), "names what is refused: {}", reconciled.message);

    // Scaling down still works.
    rig.change_spec("p", json!({"replicas": 1})).await;
    rig.pass("p").await;
    rig.pass("p").await;
    assert_eq!(rig.engine.containers(&id("p")).len(), 1);

    // The settings allow it again: the rollout goes on.
    rig.ctx.limits = Arc::new(SpecLimits::default());
    for _ in 0..5 {
        rig.clock.advance(Duration::from_secs(1));
        rig.pass("p").await;
    }
    let images: Vec<String> = rig.engine.containers(&id("p")).iter().map(|c| c.image.clone()).collect();
    assert_eq!(images, ["other:2"]);
    let status = rig.status("p").await;
    assert_eq!(
        status.condition(ConditionType::Reconciled).map(|c| c.reason),
        Some(Reason::PassSucceeded),
        "{status:#?}"
    );
}
