use proptest::prelude::*;

use super::*;
use MachinePhase::*;

fn m(name: &str, up_to_date: bool, ready: bool) -> Observed {
    Observed::for_test(name, up_to_date, ready)
}

fn with(mut o: Observed, change: impl FnOnce(&mut Observed)) -> Observed {
    change(&mut o);
    o
}

fn requested(o: Observed) -> Observed {
    with(o, |o| o.delete_requested = true)
}

fn born(o: Observed, t: i64) -> Observed {
    with(o, |o| o.created_at = t)
}

fn phase(o: Observed, p: MachinePhase) -> Observed {
    with(o, |o| {
        o.phase = p;
        o.ready = false;
        o.available = false;
        o.deleting = p == Terminating;
    })
}

fn on(o: Observed, engine: &str) -> Observed {
    with(o, |o| o.engine = engine.into())
}

/// Cluster API's behaviour: surge 100%, unavailable 0, one engine.
fn full_surge(replicas: u32) -> Desired {
    Desired {
        replicas,
        failure_domains: vec![],
        engines: vec!["e0".into()],
        max_surge: replicas,
        max_unavailable: 0,
        replacement: ReplacementPolicy::TerminationStarted,
        paused: false,
        deleting: false,
        max_updated: None,
        max_failed_restarts: 5,
    }
}

fn deleted(p: &Plan) -> Vec<(&str, DeleteReason)> {
    p.delete.iter().map(|d| (d.machine.as_str(), d.reason)).collect()
}

fn repaired(p: &Plan) -> Vec<(&str, RepairAction)> {
    p.repair.iter().map(|r| (r.machine.as_str(), r.action)).collect()
}

#[test]
fn creates_replicas_minus_up_to_date_machines() {
    let p = plan(&[], &full_surge(5));
    assert_eq!(p.create.len(), 5);
    assert!(p.delete.is_empty());
    let p = plan(&[m("a", true, true), m("b", true, false)], &full_surge(5));
    assert_eq!(p.create.len(), 3, "machines still starting count as up to date");
}

#[test]
fn a_converged_pool_plans_nothing() {
    let world = [m("a", true, true), m("b", true, true)];
    assert!(plan(&world, &full_surge(2)).is_empty());
    assert!(plan(&[], &full_surge(0)).is_empty());
}

#[test]
fn scale_down_removes_outdated_machines_first() {
    let world = [m("new1", true, true), m("old", false, true), m("new2", true, true)];
    assert_eq!(deleted(&plan(&world, &full_surge(2))), [("old", DeleteReason::Outdated)]);
}

#[test]
fn delete_requested_machines_go_after_outdated_and_before_the_rest() {
    let world = [m("a", true, true), requested(m("b", true, true)), m("c", false, true), m("d", true, true)];
    let p = plan(&world, &full_surge(1));
    assert_eq!(
        deleted(&p),
        [("c", DeleteReason::Outdated), ("b", DeleteReason::DeleteRequested), ("a", DeleteReason::Excess)],
        "equally old machines go in name order"
    );
}

#[test]
fn excess_up_to_date_machines_go_newest_first() {
    let world = [born(m("old", true, true), 1), born(m("young", true, true), 9), born(m("mid", true, true), 5)];
    assert_eq!(
        deleted(&plan(&world, &full_surge(1))),
        [("young", DeleteReason::Excess), ("mid", DeleteReason::Excess)]
    );
}

#[test]
fn scale_down_takes_from_the_fullest_engine_first() {
    let world = [
        born(on(m("a1", true, true), "a"), 1),
        born(on(m("a2", true, true), "a"), 2),
        born(on(m("a3", true, true), "a"), 3),
        born(on(m("b1", true, true), "b"), 9),
        born(on(m("b2", true, true), "b"), 8),
        born(on(m("c1", true, true), "c"), 7),
    ];
    let d = Desired { engines: vec!["a".into(), "b".into(), "c".into()], ..full_surge(3) };
    let p = plan(&world, &d);
    let gone: Vec<&str> = p.delete.iter().map(|x| x.machine.as_str()).collect();
    assert_eq!(gone, ["a3", "b1", "a2"], "3/2/1 becomes 1/1/1: fullest engine, then newest");
}

#[test]
fn never_deletes_below_replicas_ready_machines() {
    // A rolling update whose new machines are not ready yet: nothing old goes.
    let world = [m("old1", false, true), m("old2", false, true), m("new1", true, false), m("new2", true, false)];
    let p = plan(&world, &full_surge(2));
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn a_crashing_new_machine_never_pays_for_a_healthy_old_one() {
    // max_unavailable 0: the new machine exited at once, so it is not ready.
    let world = [m("o1", false, true), m("o2", false, true), m("o3", false, true), phase(m("n1", true, false), Exited)];
    let d = Desired { max_surge: 1, ..full_surge(3) };
    let p = plan(&world, &d);
    assert!(p.delete.is_empty(), "{p:?}");
    assert!(p.create.is_empty(), "the surge slot is taken by the broken machine");
}

#[test]
fn not_ready_surplus_goes_first_and_at_no_cost() {
    let world = [
        m("a", true, true),
        m("b", true, true),
        phase(m("exited", true, false), Exited),
        m("starting", true, false),
        phase(m("paused", true, false), Paused),
    ];
    let p = plan(&world, &full_surge(2));
    let mut gone: Vec<&str> = p.delete.iter().map(|d| d.machine.as_str()).collect();
    gone.sort_unstable();
    assert_eq!(gone, ["exited", "paused", "starting"], "ready machines stay; {p:?}");
    assert!(p.repair.is_empty(), "surplus is not repaired");
}

#[test]
fn not_ready_up_to_date_machines_within_replicas_are_kept() {
    let world = [m("a", true, true), m("b", true, false), m("c", true, false)];
    let p = plan(&world, &full_surge(3));
    assert!(p.delete.is_empty(), "{p:?}");
}

#[test]
fn not_ready_outdated_machines_go_at_no_cost() {
    let world = [m("a", true, true), phase(m("broken-old", false, false), Exited)];
    assert_eq!(deleted(&plan(&world, &full_surge(1))), [("broken-old", DeleteReason::Outdated)]);
}

#[test]
fn broken_machines_are_restarted_in_place_once_their_backoff_passed() {
    let exited = phase(m("x", true, false), Exited);
    let waiting = plan(&[m("a", true, true), exited.clone()], &full_surge(2));
    assert!(waiting.is_empty(), "backoff not over: wait; {waiting:?}");
    let due = with(exited, |o| o.repair_due = true);
    let p = plan(&[m("a", true, true), due], &full_surge(2));
    assert_eq!(repaired(&p), [("x", RepairAction::Restart)]);
    assert!(p.create.is_empty() && p.delete.is_empty(), "a machine being repaired is not replaced too");
}

#[test]
fn paused_machines_are_unpaused_and_interrupted_creations_started() {
    let paused = with(phase(m("p", true, false), Paused), |o| o.repair_due = true);
    let creating = phase(m("c", true, false), Creating);
    let stale = phase(m("stale", false, false), Creating);
    let p = plan(&[paused, creating, stale, m("ok", true, true)], &full_surge(3));
    assert_eq!(repaired(&p), [("p", RepairAction::Unpause), ("c", RepairAction::Start)]);
    assert_eq!(deleted(&p), [("stale", DeleteReason::Outdated)]);
    assert!(p.create.is_empty(), "the half-created machine counts toward replicas");
}

#[test]
fn machines_that_keep_failing_or_are_dead_are_replaced() {
    let looping = with(phase(m("loop", true, false), Exited), |o| {
        o.failed_restarts = 5;
        o.repair_due = true;
    });
    let dead = phase(m("dead", true, false), Dead);
    let p = plan(&[m("ok", true, true), looping, dead], &Desired { max_surge: 1, ..full_surge(3) });
    assert_eq!(deleted(&p), [("loop", DeleteReason::Broken), ("dead", DeleteReason::Broken)]);
    assert_eq!(p.create.len(), 2, "their replacements are created at once (termination_started)");
    assert!(p.repair.is_empty());
}

#[test]
fn terminating_machines_are_finished_and_count_toward_nothing_by_default() {
    let world =
        [m("a", true, true), phase(m("t1", true, false), Terminating), phase(m("t2", false, false), Terminating)];
    let d = Desired { max_surge: 1, ..full_surge(3) };
    let p = plan(&world, &d);
    let finished: Vec<&str> = p.finish.iter().map(|f| f.machine.as_str()).collect();
    assert_eq!(finished, ["t1", "t2"]);
    assert!(p.delete.is_empty());
    assert_eq!(p.create.len(), 2, "termination_started: stopping machines leave the surge bound");
    let strict = Desired { replacement: ReplacementPolicy::TerminationComplete, ..d };
    assert_eq!(plan(&world, &strict).create.len(), 1, "termination_complete: they stay in it until gone");
}

#[test]
fn a_rollout_under_termination_complete_counts_its_own_deletions() {
    let world: Vec<_> = (0..4).map(|i| m(&format!("o{i}"), false, true)).chain([m("n0", true, true)]).collect();
    let d = Desired { max_surge: 1, replacement: ReplacementPolicy::TerminationComplete, ..full_surge(4) };
    let p = plan(&world, &d);
    assert_eq!(p.delete.len(), 1);
    assert!(p.create.is_empty(), "the old machine still stops: no room yet");
    let eager = Desired { replacement: ReplacementPolicy::TerminationStarted, ..d };
    assert_eq!(plan(&world, &eager).create.len(), 1);
}

#[test]
fn machines_on_an_unreachable_engine_count_but_are_left_alone() {
    let unknown = on(phase(m("far", true, false), Unknown), "e1");
    let d = Desired { engines: vec!["e0".into()], ..full_surge(2) };
    let p = plan(&[m("a", true, true), unknown.clone()], &d);
    assert!(p.is_empty(), "not replaced before the engine is given up; {p:?}");
    let outdated_unknown = with(unknown, |o| o.up_to_date = false);
    let p = plan(&[m("a", true, true), m("b", true, true), outdated_unknown], &d);
    assert!(p.delete.is_empty(), "nothing is done on an engine that does not answer");
}

#[test]
fn machines_of_a_lost_engine_are_replaced_and_trimmed_when_it_returns() {
    let lost = |n: &str| with(on(phase(m(n, true, false), Unknown), "e1"), |o| o.lost = true);
    let d = Desired { engines: vec!["e0".into(), "e2".into()], max_surge: 1, ..full_surge(4) };
    let world = [on(m("a", true, true), "e0"), on(m("b", true, true), "e2"), lost("c"), lost("d")];
    let p = plan(&world, &d);
    assert_eq!(p.create.len(), 2, "lost machines count toward nothing");
    let engines: Vec<&str> = p.create.iter().map(|c| c.engine.as_str()).collect();
    assert_eq!(engines, ["e0", "e2"]);
    // The engine is back: six machines for four replicas; the returned ones
    // sit on the least full engine, so the replacements' engines give.
    let back = [
        born(on(m("a", true, true), "e0"), 1),
        born(on(m("b", true, true), "e2"), 1),
        born(on(m("c", true, true), "e1"), 1),
        born(on(m("d", true, true), "e1"), 1),
        born(on(m("r1", true, true), "e0"), 5),
        born(on(m("r2", true, true), "e2"), 5),
    ];
    let d = Desired { engines: vec!["e0".into(), "e1".into(), "e2".into()], ..d };
    let p = plan(&back, &d);
    let gone: Vec<&str> = p.delete.iter().map(|x| x.machine.as_str()).collect();
    assert_eq!(gone.len(), 2);
    assert!(gone.iter().all(|n| n.starts_with('r') || *n == "a" || *n == "b"), "{gone:?}");
}

#[test]
fn creations_spread_over_engines_and_failure_domains() {
    let d = Desired {
        engines: vec!["e0".into(), "e1".into(), "e2".into()],
        failure_domains: vec!["a".into(), "b".into()],
        ..full_surge(6)
    };
    let p = plan(&[on(m("x", true, true), "e1")], &d);
    let engines: Vec<&str> = p.create.iter().map(|c| c.engine.as_str()).collect();
    assert_eq!(engines, ["e0", "e2", "e0", "e1", "e2"]);
    let domains: Vec<&str> = p.create.iter().filter_map(|c| c.failure_domain.as_deref()).collect();
    assert_eq!(domains, ["a", "b", "a", "b", "a"]);
    assert!(plan(&[], &Desired { engines: vec![], ..full_surge(3) }).create.is_empty(), "no engine answers: wait");
}

#[test]
fn a_full_surge_rollout_creates_all_new_machines_then_deletes_all_old() {
    let old = [m("o1", false, true), m("o2", false, true), m("o3", false, true)];
    let p = plan(&old, &full_surge(3));
    assert_eq!((p.create.len(), p.delete.len()), (3, 0));
    let mut world = old.to_vec();
    world.extend([m("n1", true, true), m("n2", true, true), m("n3", true, true)]);
    let p = plan(&world, &full_surge(3));
    assert_eq!(p.delete.len(), 3);
    assert!(p.delete.iter().all(|d| d.reason == DeleteReason::Outdated));
}

#[test]
fn surge_bounds_creation() {
    let old = [m("o1", false, true), m("o2", false, true), m("o3", false, true)];
    let d = Desired { max_surge: 1, ..full_surge(3) };
    assert_eq!(plan(&old, &d).create.len(), 1);
}

#[test]
fn unavailability_lets_old_machines_go_before_new_ones_exist() {
    let old: Vec<_> = (0..6).map(|i| m(&format!("o{i}"), false, true)).collect();
    let d = Desired { max_surge: 0, max_unavailable: 2, ..full_surge(6) };
    let p = plan(&old, &d);
    assert_eq!(p.delete.len(), 2);
    assert_eq!(p.create.len(), 2, "deletions make room under the surge bound");
}

#[test]
fn machines_not_yet_available_do_not_count_toward_the_floor() {
    // Two new machines are ready but have not been ready for min_ready_seconds.
    let fresh = |n: &str| with(m(n, true, true), |o| o.available = false);
    let world = [m("o1", false, true), m("o2", false, true), fresh("n1"), fresh("n2")];
    let d = Desired { max_surge: 2, ..full_surge(2) };
    assert!(plan(&world, &d).delete.is_empty(), "old machines stay until the new ones are available");
}

#[test]
fn stuck_machines_are_replaced_one_at_a_time_without_unavailability() {
    let stuck = |n: &str| with(m(n, true, false), |o| o.stuck = true);
    let world = [m("a", true, true), stuck("s1"), stuck("s2")];
    let d = Desired { max_surge: 1, ..full_surge(3) };
    let p = plan(&world, &d);
    assert_eq!(deleted(&p), [("s1", DeleteReason::Unready)]);
    assert_eq!(p.create.len(), 1);
    let d = Desired { max_surge: 1, max_unavailable: 2, ..full_surge(3) };
    assert_eq!(plan(&world, &d).delete.len(), 2);
}

#[test]
fn batch_approval_stops_a_rollout_after_each_batch() {
    let old: Vec<_> = (0..6).map(|i| m(&format!("o{i}"), false, true)).collect();
    let d = Desired { max_surge: 2, max_updated: Some(2), ..full_surge(6) };
    let p = plan(&old, &d);
    assert_eq!((p.create.len(), p.delete.len()), (2, 0));
    let mut world = old.clone();
    world.extend([m("n1", true, true), m("n2", true, true)]);
    let p = plan(&world, &d);
    assert_eq!((p.create.len(), p.delete.len()), (0, 2), "the batch finishes by removing two old machines");
    let world: Vec<_> = world.into_iter().filter(|m| !p.delete.iter().any(|x| x.machine == m.name)).collect();
    assert!(plan(&world, &d).is_empty(), "then the rollout waits for approval");
}

#[test]
fn a_deleting_pool_removes_everything_it_can_reach_and_creates_nothing() {
    let world = [m("a", true, true), phase(m("b", false, false), Exited), phase(m("far", true, false), Unknown)];
    let p = plan(&world, &Desired { deleting: true, ..full_surge(3) });
    assert_eq!(deleted(&p), [("a", DeleteReason::PoolDeleting), ("b", DeleteReason::PoolDeleting)]);
    assert!(p.create.is_empty());
}

#[test]
fn a_paused_pool_changes_nothing_but_finishes_deletions() {
    let world = [m("a", false, true), phase(m("t", true, false), Terminating)];
    let p = plan(&world, &Desired { paused: true, ..full_surge(3) });
    assert!(p.delete.is_empty() && p.create.is_empty() && p.repair.is_empty());
    assert_eq!(p.finish.len(), 1);
}

// ---- properties over random worlds -----------------------------------------

const PHASES: [MachinePhase; 8] = [Running, Running, Starting, Exited, Paused, Dead, Creating, Terminating];

fn world() -> impl Strategy<Value = Vec<Observed>> {
    let machine = (
        (any::<bool>(), any::<bool>(), any::<bool>(), 0i64..5),
        (0usize..PHASES.len(), prop::option::of(0usize..4), 0usize..3, any::<bool>(), 0u32..7),
        prop::bool::weighted(0.1),
    );
    prop::collection::vec(machine, 0..14).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, ((up, ready_flag, req, t), (ph, fd, engine, flag, failed), unknown))| {
                let phase = if unknown { Unknown } else { PHASES[ph] };
                let ready = phase == Running && ready_flag;
                Observed {
                    name: format!("m{i}"),
                    container_id: format!("c{i}"),
                    engine: format!("e{engine}"),
                    phase,
                    up_to_date: up,
                    ready,
                    // Some ready machines are not available yet (min_ready_seconds).
                    available: ready && (flag || t < 3),
                    stuck: up && phase == Running && !ready && flag,
                    delete_requested: req,
                    deleting: phase == Terminating,
                    lost: unknown && flag,
                    repair_due: flag,
                    failed_restarts: failed,
                    failure_domain: fd.map(|f| format!("fd{f}")),
                    created_at: t,
                    engine_failing: false,
                    start_in_flight: phase == Creating && flag && up,
                }
            })
            .collect()
    })
}

fn desired() -> impl Strategy<Value = Desired> {
    (0u32..10, 0u32..6, 0u32..4, prop::bool::weighted(0.1), 0usize..4, any::<bool>()).prop_map(
        |(replicas, surge, unavailable, paused, fds, strict)| {
            // Both bounds zero is refused by validation (and raised to 1 by resolve).
            let unavailable = if surge == 0 && unavailable == 0 { 1 } else { unavailable };
            Desired {
                replicas,
                failure_domains: (0..fds).map(|f| format!("fd{f}")).collect(),
                engines: vec!["e0".into(), "e1".into(), "e2".into()],
                max_surge: surge,
                max_unavailable: unavailable,
                replacement: if strict {
                    ReplacementPolicy::TerminationComplete
                } else {
                    ReplacementPolicy::TerminationStarted
                },
                paused,
                deleting: false,
                max_updated: None,
                max_failed_restarts: 5,
            }
        },
    )
}

fn active(w: &[Observed]) -> impl Iterator<Item = &Observed> {
    w.iter().filter(|m| m.phase != Terminating && !m.lost)
}

/// The world after a plan: deletions terminating, repairs running (not
/// ready yet), creations present and not ready.
fn apply(world: &[Observed], p: &Plan) -> Vec<Observed> {
    let mut next: Vec<Observed> = world
        .iter()
        .map(|o| {
            if p.delete.iter().any(|d| d.machine == o.name) {
                phase(o.clone(), Terminating)
            } else if p.repair.iter().any(|r| r.machine == o.name) {
                phase(o.clone(), Starting)
            } else {
                o.clone()
            }
        })
        .collect();
    for (i, c) in p.create.iter().enumerate() {
        let n = with(m(&format!("new{}-{i}", next.len()), true, false), |n| {
            n.engine = c.engine.clone();
            n.failure_domain = c.failure_domain.clone();
            n.created_at = 100;
        });
        next.push(n);
    }
    next
}

/// What an engine can be, as a pass sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EngineState {
    Answering,
    /// Does not answer (or never did), not lost yet.
    Silent,
    Lost,
    /// Answers, but its placement breaker is open.
    Failing,
    /// Answers, but the pool may no longer place there (draining, or its
    /// placement changed): its machines are outdated.
    Disallowed,
}

const ENGINE_STATES: [EngineState; 5] =
    [EngineState::Answering, EngineState::Silent, EngineState::Lost, EngineState::Failing, EngineState::Disallowed];

/// A world whose machines sit on three engines in random states, with the
/// desired engines those that take new machines.
fn engines_world() -> impl Strategy<Value = (Vec<Observed>, Desired)> {
    (world(), desired(), prop::array::uniform3(0usize..ENGINE_STATES.len())).prop_map(|(w, d, states)| {
        let state = |engine: &str| ENGINE_STATES[states[engine[1..].parse::<usize>().unwrap_or(0)]];
        let w = w
            .into_iter()
            .map(|mut o| {
                match state(&o.engine) {
                    EngineState::Silent | EngineState::Lost if o.phase != Terminating => {
                        o.phase = Unknown;
                        o.ready = false;
                        o.available = false;
                        o.stuck = false;
                    }
                    EngineState::Failing => o.engine_failing = true,
                    EngineState::Disallowed => o.up_to_date = false,
                    _ => {}
                }
                o.lost = state(&o.engine) == EngineState::Lost;
                o
            })
            .collect();
        let placeable = |e: &String| matches!(state(e), EngineState::Answering);
        let d = Desired { engines: d.engines.iter().filter(|e| placeable(e)).cloned().collect(), ..d };
        (w, d)
    })
}

proptest! {
    /// Spread is a preference: whatever the engines' states, a ready machine
    /// goes only when the pool has more than `replicas` up-to-date machines,
    /// when a rollout replaces it (it is outdated), or when it was asked for.
    #[test]
    fn a_ready_machine_is_deleted_only_as_excess_rollout_or_request((w, d) in engines_world()) {
        let p = plan(&w, &d);
        let up_to_date = active(&w).filter(|m| m.up_to_date).count();
        for x in &p.delete {
            let Some(m) = w.iter().find(|m| m.name == x.machine) else { continue };
            if !m.ready {
                continue;
            }
            prop_assert!(
                !m.up_to_date || m.delete_requested || up_to_date > d.replicas as usize,
                "ready {} deleted ({:?}) with {up_to_date} up to date of {} replicas", m.name, x.reason, d.replicas
            );
        }
        prop_assert!(p.create.iter().all(|c| d.engines.contains(&c.engine)), "placed off the placeable engines");
        if d.engines.is_empty() {
            prop_assert!(p.create.is_empty());
        } else {
            prop_assert_eq!(p.unplaced, 0);
        }
    }

    #[test]
    fn plans_never_break_the_availability_floor(w in world(), d in desired()) {
        let after = apply(&w, &plan(&w, &d));
        let floor = d.replicas.saturating_sub(d.max_unavailable) as usize;
        for (what, before, after) in [
            ("ready", active(&w).filter(|m| m.ready).count(), active(&after).filter(|m| m.ready).count()),
            ("available", active(&w).filter(|m| m.available).count(), active(&after).filter(|m| m.available).count()),
        ] {
            prop_assert!(after >= floor.min(before), "{what} {before} -> {after}, floor {floor}");
        }
    }

    #[test]
    fn nothing_is_done_to_machines_on_unreachable_engines(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let unknown = |name: &str| w.iter().any(|m| m.name == name && m.phase == Unknown);
        prop_assert!(p.delete.iter().all(|x| !unknown(&x.machine)));
        prop_assert!(p.repair.iter().all(|x| !unknown(&x.machine)));
    }

    #[test]
    fn batch_approval_caps_up_to_date_machines(w in world(), d in desired(), allowed in 0u32..10) {
        let d = Desired { max_updated: Some(allowed), ..d };
        let up_before = active(&w).filter(|m| m.up_to_date).count();
        let after = apply(&w, &plan(&w, &d));
        let up_after = active(&after).filter(|m| m.up_to_date).count();
        prop_assert!(up_after <= up_before.max(allowed as usize), "{up_before} -> {up_after} up to date, {allowed} allowed");
    }

    #[test]
    fn remediation_replaces_few_at_a_time(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let replaced = p.delete.iter().filter(|x| x.reason == DeleteReason::Unready).count();
        prop_assert!(replaced <= d.max_unavailable.max(1) as usize);
    }

    #[test]
    fn creations_never_exceed_the_surge_bound(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let after = apply(&w, &p);
        let bound = (d.replicas + d.max_surge) as usize;
        let counted = match d.replacement {
            ReplacementPolicy::TerminationStarted => active(&after).count(),
            ReplacementPolicy::TerminationComplete => after.iter().filter(|m| !m.lost).count(),
        };
        prop_assert!(p.create.is_empty() || counted <= bound, "{counted} machines counted, bound {bound}");
    }

    #[test]
    fn creation_count_is_replicas_minus_up_to_date_within_room(w in world(), d in desired()) {
        prop_assume!(!d.paused);
        let p = plan(&w, &d);
        let after = apply(&w, &p);
        let remaining: Vec<_> = active(&after).filter(|m| m.created_at != 100).collect();
        let up = remaining.iter().filter(|m| m.up_to_date).count();
        let want = (d.replicas as usize).saturating_sub(up);
        let counted = match d.replacement {
            ReplacementPolicy::TerminationStarted => remaining.len(),
            ReplacementPolicy::TerminationComplete => {
                after.iter().filter(|m| !m.lost && m.created_at != 100).count()
            }
        };
        let room = ((d.replicas + d.max_surge) as usize).saturating_sub(counted);
        prop_assert_eq!(p.create.len(), want.min(room));
    }

    #[test]
    fn deletion_order_respects_priority(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let find = |name: &str| w.iter().find(|m| m.name == name).cloned();
        let gone = |name: &str| p.delete.iter().any(|x| x.machine == name);
        let excess_ready = || p.delete.iter().filter(|x| matches!(x.reason, DeleteReason::Excess | DeleteReason::DeleteRequested)).filter_map(|x| find(&x.machine)).filter(|m| m.up_to_date && m.ready);
        // A ready up-to-date machine goes only when no ready outdated one stays.
        if excess_ready().next().is_some() {
            prop_assert!(active(&w).filter(|m| !m.up_to_date && m.ready && m.phase != Unknown).all(|m| gone(&m.name)));
        }
        // An unrequested ready up-to-date machine goes only when every requested ready one goes.
        if excess_ready().any(|m| !m.delete_requested) {
            prop_assert!(active(&w).filter(|m| m.up_to_date && m.ready && m.delete_requested).all(|m| gone(&m.name)));
        }
        // Up-to-date machines go only as true excess, as broken, or as stuck.
        let up_to_date = active(&w).filter(|m| m.up_to_date).count();
        let excess = p.delete.iter().filter(|x| matches!(x.reason, DeleteReason::Excess | DeleteReason::DeleteRequested)).filter_map(|x| find(&x.machine)).filter(|m| m.up_to_date).count();
        prop_assert!(excess <= up_to_date.saturating_sub(d.replicas as usize));
    }

    #[test]
    fn a_converged_world_plans_nothing(n in 0u32..10, d in desired()) {
        let w: Vec<_> = (0..n).map(|i| m(&format!("m{i}"), true, true)).collect();
        let d = Desired { replicas: n, ..d };
        prop_assert!(plan(&w, &d).is_empty());
    }

    #[test]
    fn planning_again_on_the_applied_world_converges(w in world(), d in desired()) {
        prop_assume!(!d.paused);
        // Between passes: stops finish, engines come back, started machines
        // become ready and available, backoffs pass.
        let mut world = w;
        for _ in 0..60 {
            world.retain(|m| m.phase != Terminating && !m.lost);
            for m in &mut world {
                if m.phase != Dead {
                    m.phase = Running;
                    m.ready = true;
                    m.available = true;
                    m.stuck = false;
                    m.failed_restarts = 0;
                }
                m.repair_due = true;
            }
            let p = plan(&world, &d);
            if p.is_empty() {
                break;
            }
            world = apply(&world, &p);
        }
        let p = plan(&world, &d);
        prop_assert!(p.is_empty(), "still planning {p:?}");
        prop_assert_eq!(world.len(), d.replicas as usize);
        prop_assert!(world.iter().all(|m| m.up_to_date && m.ready));
    }
}

#[test]
fn with_no_engine_to_place_on_the_shortfall_is_counted_not_created() {
    let p = plan(&[m("a", true, true)], &Desired { engines: vec![], ..full_surge(3) });
    assert!(p.create.is_empty());
    assert_eq!(p.unplaced, 2);
    let p = plan(&[m("a", true, true)], &Desired { engines: vec!["e1".into()], ..full_surge(3) });
    assert_eq!((p.create.len(), p.unplaced), (2, 0));
    assert!(p.create.iter().all(|c| c.engine == "e1"), "new machines go where placement allows: {p:?}");
}

#[test]
fn a_never_started_container_on_a_failing_engine_is_replaced_not_started() {
    let failing = with(phase(m("c", true, false), Creating), |o| o.engine_failing = true);
    let d = Desired { engines: vec!["e1".into()], max_surge: 1, ..full_surge(2) };
    let p = plan(&[m("a", true, true), failing], &d);
    assert_eq!(deleted(&p), [("c", DeleteReason::Broken)]);
    assert!(p.repair.is_empty());
    assert_eq!(p.create, [Creation { engine: "e1".into(), failure_domain: None }]);
}

#[test]
fn a_start_in_flight_is_neither_started_again_nor_replaced() {
    let starting = with(phase(m("c", true, false), Creating), |o| o.start_in_flight = true);
    let p = plan(&[m("a", true, true), starting.clone()], &full_surge(2));
    assert!(p.is_empty(), "{p:?}");
    let p = plan(&[m("a", true, true), with(starting, |o| o.engine_failing = true)], &full_surge(2));
    assert!(p.is_empty(), "its start decides: {p:?}");
}

#[test]
fn without_new_machines_keeps_the_pool_at_replicas_and_starts_nothing_new() {
    let machines = [m("a", false, true), m("b", false, true), m("c", false, true)];
    let repair = |name: &str, action| Repair {
        machine: name.into(),
        container_id: format!("id-{name}"),
        engine: "e0".into(),
        action,
        failed_restarts: 0,
    };
    let deletion = |name: &str, reason| Deletion {
        machine: name.into(),
        container_id: format!("id-{name}"),
        engine: "e0".into(),
        reason,
    };
    let mut p = Plan {
        create: vec![Creation { engine: "e0".into(), failure_domain: None }],
        delete: vec![deletion("a", DeleteReason::Outdated), deletion("b", DeleteReason::Outdated)],
        repair: vec![repair("x", RepairAction::Start), repair("c", RepairAction::Restart)],
        ..Plan::default()
    };
    p.without_new_machines(&machines, 2);
    assert!(p.create.is_empty());
    let deleted: Vec<&str> = p.delete.iter().map(|d| d.machine.as_str()).collect();
    assert_eq!(deleted, ["a"], "down to replicas, no further");
    let repaired: Vec<(&str, RepairAction)> = p.repair.iter().map(|r| (r.machine.as_str(), r.action)).collect();
    assert_eq!(repaired, [("c", RepairAction::Restart)], "a never-started container stays unstarted");
}
