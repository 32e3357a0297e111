use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::domain::pool::HostPolicy;
use crate::engines::breaker::Block;
use crate::reconcile::testing::{engine, pool, t0};

fn machine(name: &str, up_to_date: bool, ready: bool) -> Observed {
    Observed::for_test(name, up_to_date, ready)
}
use crate::engines::Unplaceable;

fn no_failures(_: &str) -> Option<Failure> {
    None
}

/// Decides for `pool` with `observed` on engine `e0`, with default rules.
fn run(pool: &Pool, observed: &[Observed], engines: &[EngineView]) -> Decision {
    run_with(pool, observed, engines, &SpecLimits::default(), None)
}

fn run_with(
    pool: &Pool,
    observed: &[Observed],
    engines: &[EngineView],
    limits: &SpecLimits,
    cluster_problem: Option<String>,
) -> Decision {
    decide(&Inputs {
        pool,
        observed,
        next_change: None,
        engines,
        timing: &Timing::default(),
        limits,
        cluster_problem,
        failing: &no_failures,
        now: t0(),
    })
}

fn condition(d: &Decision, t: ConditionType) -> (ConditionStatus, Reason) {
    let c = d.status.condition(t).unwrap_or_else(|| panic!("no {t:?} condition: {:#?}", d.status));
    (c.status, c.reason)
}

fn reasons(d: &Decision) -> Vec<&'static str> {
    d.events.iter().map(|e| e.reason).collect()
}

fn ready_pool(n: usize) -> Vec<Observed> {
    (0..n).map(|i| machine(&format!("m{i}"), true, true)).collect()
}

#[test]
fn a_converged_pool_plans_nothing_says_so_and_waits_for_events() {
    let p = pool(json!({"replicas": 3, "version": "v1.29.2"}));
    let d = run(&p, &ready_pool(3), &[engine("e0")]);
    assert!(d.plan.is_empty(), "{:?}", d.plan);
    assert_eq!(condition(&d, ConditionType::Ready), (ConditionStatus::True, Reason::AllReady));
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::True, Reason::PassSucceeded));
    assert_eq!(condition(&d, ConditionType::Progressing), (ConditionStatus::True, Reason::RolloutComplete));
    assert_eq!(condition(&d, ConditionType::RuntimeAvailable), (ConditionStatus::True, Reason::RuntimeReachable));
    assert_eq!((d.status.replicas, d.status.ready_replicas), (3, 3));
    assert!(d.events.is_empty() && !d.rollback && !d.held);
    assert_eq!(d.next, Outcome::Idle);
}

#[test]
fn a_pool_short_of_machines_creates_them_and_looks_again_soon() {
    let p = pool(json!({"replicas": 3, "version": "v1.29.2"}));
    let d = run(&p, &ready_pool(1), &[engine("e0")]);
    assert_eq!(d.plan.create.len(), 2, "the two missing, within 3 + a surge of 1");
    assert_eq!(condition(&d, ConditionType::Ready), (ConditionStatus::False, Reason::ScalingUp));
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::WaitingForMachines));
    assert_eq!(d.next, Outcome::Requeue(RECHECK));
}

#[test]
fn a_spec_the_settings_no_longer_allow_gets_no_new_machine_and_says_why() {
    let p = pool(json!({"replicas": 3, "version": "v1.29.2", "image": "other:2"}));
    let limits = SpecLimits { host: HostPolicy::new(&[], &["app:*".into()], &[]), ..SpecLimits::default() };
    let d = run_with(&p, &ready_pool(1), &[engine("e0")], &limits, None);
    assert!(d.plan.create.is_empty(), "{:?}", d.plan);
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::HostPolicyRefused));
    assert!(d.status.last_error.as_deref().is_some_and(|e| e.contains("other:2")), "{:?}", d.status.last_error);
}

#[test]
fn machines_no_engine_takes_are_counted_and_the_pool_looks_again_when_one_may() {
    let p = pool(json!({"replicas": 2, "version": "v1.29.2"}));
    let retry_at = t0() + chrono::Duration::seconds(5);
    let failing = EngineView {
        unplaceable: Some(Unplaceable { block: Block::Failing, message: "disk full".into(), retry_at: Some(retry_at) }),
        failing: true,
        ..engine("e0")
    };
    let d = run(&p, &[], &[failing]);
    assert_eq!((d.plan.create.len(), d.plan.unplaced), (0, 2));
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::NoEngineAvailable));
    let message = &d.status.condition(ConditionType::Reconciled).map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains("engine e0: disk full"), "{message}");
    assert_eq!(d.next, Outcome::Requeue(Duration::from_secs(5) + Duration::from_millis(20)), "when e0 may be tried");
}

#[test]
fn an_engine_being_listed_holds_new_machines_and_says_so() {
    let p = pool(json!({"replicas": 2, "version": "v1.29.2"}));
    let listing = EngineView {
        reachable: false,
        first_list: true,
        unplaceable: Some(Unplaceable { block: Block::NotReached, message: "not listed yet".into(), retry_at: None }),
        ..engine("e1")
    };
    let d = run(&p, &[], &[engine("e0"), listing]);
    assert!(d.plan.create.is_empty() && d.plan.unplaced == 2, "{:?}", d.plan);
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::WaitingForEngines));
}

#[test]
fn an_unusable_cluster_is_told_on_the_pool() {
    let p = pool(json!({"replicas": 1, "version": "v1.29.2"}));
    let d = run_with(&p, &ready_pool(1), &[engine("e0")], &SpecLimits::default(), Some("bad token".into()));
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::ClusterCredentialsInvalid));
}

#[test]
fn an_engine_that_stops_answering_is_told_once() {
    let mut p = pool(json!({"replicas": 1, "version": "v1.29.2"}));
    let silent = EngineView { reachable: false, error: Some("engine e0 does not answer".into()), ..engine("e0") };
    let d = run(&p, &ready_pool(1), std::slice::from_ref(&silent));
    assert_eq!(condition(&d, ConditionType::RuntimeAvailable), (ConditionStatus::False, Reason::RuntimeUnavailable));
    assert_eq!(reasons(&d), ["RuntimeUnavailable"]);
    p.status = d.status;
    let again = run(&p, &ready_pool(1), &[silent]);
    assert!(again.events.is_empty(), "not on every pass while it lasts: {:?}", again.events);
}

#[test]
fn a_stalled_rollout_is_told_once_and_rolled_back_when_asked() {
    let spec = json!({"replicas": 2, "version": "v1.29.2", "progress_deadline_seconds": 30,
                      "strategy": {"auto_rollback": true}});
    let mut p = pool(spec);
    let old = vec![machine("o1", false, true), machine("o2", false, true), machine("n1", true, false)];
    // The rollout began a minute ago and has not moved since.
    let started = t0() - chrono::Duration::seconds(60);
    p.status.rollout = Some(RolloutProgress {
        revision: 1,
        started_at: started,
        last_progress_at: started,
        updated_available: 0,
        outdated: 2,
        deadline_exceeded: false,
        rolling_back: false,
        completed_at: None,
    });
    let d = run(&p, &old, &[engine("e0")]);
    assert_eq!(condition(&d, ConditionType::Progressing), (ConditionStatus::False, Reason::ProgressDeadlineExceeded));
    assert_eq!(reasons(&d), ["ProgressDeadlineExceeded"]);
    assert!(d.rollback);
    p.status = d.status;
    let again = run(&p, &old, &[engine("e0")]);
    assert!(again.events.is_empty() && !again.rollback, "once per rollout: {:?}", again.events);
}

#[test]
fn deletions_that_keep_failing_make_the_pool_unhealthy_and_unreconciled() {
    let p = pool(json!({"replicas": 1, "version": "v1.29.2"}));
    let mut gone = machine("old", true, false);
    gone.phase = MachinePhase::Terminating;
    gone.deleting = true;
    let failing = |m: &str| {
        (m == "old").then(|| Failure {
            count: 3,
            retry_at: std::time::Instant::now(),
            message: "drain timed out".into(),
            drain: true,
        })
    };
    let observed = [machine("a", true, true), gone];
    let d = decide(&Inputs {
        pool: &p,
        observed: &observed,
        next_change: None,
        engines: &[engine("e0")],
        timing: &Timing::default(),
        limits: &SpecLimits::default(),
        cluster_problem: None,
        failing: &failing,
        now: t0(),
    });
    assert_eq!(condition(&d, ConditionType::MachinesHealthy), (ConditionStatus::False, Reason::DrainFailed));
    assert_eq!(condition(&d, ConditionType::Reconciled), (ConditionStatus::False, Reason::DrainFailed));
    assert!(d.status.last_error.as_deref().is_some_and(|e| e.contains("drain timed out")));
}

#[test]
fn a_paused_pool_is_held_and_says_so() {
    let p = pool(json!({"replicas": 2, "version": "v1.29.2", "paused": true}));
    let d = run(&p, &ready_pool(1), &[engine("e0")]);
    assert!(d.plan.create.is_empty() && d.held);
    assert_eq!(condition(&d, ConditionType::Ready), (ConditionStatus::False, Reason::Paused));
}

#[test]
fn the_clock_decides_when_to_look_again() {
    let p = pool(json!({"replicas": 1, "version": "v1.29.2"}));
    let in_3s = t0() + chrono::Duration::seconds(3);
    let observed = ready_pool(1);
    let d = decide(&Inputs {
        pool: &p,
        observed: &observed,
        next_change: Some(in_3s),
        engines: &[engine("e0")],
        timing: &Timing::default(),
        limits: &SpecLimits::default(),
        cluster_problem: None,
        failing: &no_failures,
        now: t0(),
    });
    assert_eq!(d.next, Outcome::Requeue(Duration::from_secs(3) + Duration::from_millis(20)));
}

// ---- properties over random pools ------------------------------------------

fn world() -> impl Strategy<Value = (Vec<Observed>, u32, bool, bool)> {
    let m = (any::<bool>(), any::<bool>(), any::<bool>(), prop::bool::weighted(0.1));
    (prop::collection::vec(m, 0..10), 0u32..8, any::<bool>(), any::<bool>()).prop_map(
        |(machines, replicas, paused, silent)| {
            let observed = machines
                .into_iter()
                .enumerate()
                .map(|(i, (up, ready, exited, lost))| {
                    let mut o = machine(&format!("m{i}"), up, ready && !exited);
                    if exited {
                        o.phase = MachinePhase::Exited;
                    }
                    o.lost = lost;
                    o
                })
                .collect();
            (observed, replicas, paused, silent)
        },
    )
}

proptest! {
    /// Whatever the world, the status counts what was observed, a pool is
    /// reconciled only when it has its ready machines, each event is told
    /// at most once, and deciding again on the same inputs decides the same.
    #[test]
    fn the_status_agrees_with_what_was_observed((observed, replicas, paused, silent) in world()) {
        let p = pool(json!({"replicas": replicas, "version": "v1.29.2", "paused": paused}));
        let e = if silent { EngineView { error: Some("silent".into()), ..engine("e0") } } else { engine("e0") };
        let d = run(&p, &observed, std::slice::from_ref(&e));
        let counted = counts(&observed);
        prop_assert_eq!(d.status.replicas, counted.total);
        prop_assert_eq!(d.status.ready_replicas, counted.ready);
        prop_assert_eq!(d.status.engines.values().map(|e| e.replicas).sum::<u32>(), counted.total);
        let reconciled = d.status.condition(ConditionType::Reconciled).map(|c| c.status);
        if reconciled == Some(ConditionStatus::True) {
            prop_assert!(counted.ready >= replicas, "reconciled with {} of {replicas} ready", counted.ready);
        }
        let mut told = reasons(&d);
        told.dedup();
        prop_assert_eq!(told.len(), d.events.len());
        prop_assert!(!d.rollback, "no rollout had started, so none stalled");
        prop_assert_eq!(d.held, paused);
        let again = run(&p, &observed, &[e]);
        prop_assert_eq!(again.plan, d.plan);
        prop_assert_eq!(again.status, d.status);
    }
}
