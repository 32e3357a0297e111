use proptest::prelude::*;

use super::*;

fn m(name: &str, up_to_date: bool, ready: bool) -> Observed {
    Observed {
        name: name.into(),
        container_id: format!("id-{name}"),
        up_to_date,
        ready,
        available: ready,
        stuck: false,
        delete_requested: false,
        never_started: false,
        failure_domain: None,
        created_at: 0,
    }
}

fn requested(mut o: Observed) -> Observed {
    o.delete_requested = true;
    o
}

fn born(mut o: Observed, t: i64) -> Observed {
    o.created_at = t;
    o
}

/// The seed's behaviour: surge 100%, unavailable 0.
fn seed(replicas: u32) -> Desired {
    Desired {
        replicas,
        failure_domains: vec![],
        max_surge: replicas,
        max_unavailable: 0,
        paused: false,
        deleting: false,
        max_updated: None,
    }
}

fn deleted(p: &Plan) -> Vec<(&str, DeleteReason)> {
    p.delete.iter().map(|d| (d.machine.as_str(), d.reason)).collect()
}

#[test]
fn creates_replicas_minus_up_to_date_machines() {
    let p = plan(&[], &seed(5));
    assert_eq!(p.create.len(), 5);
    assert!(p.delete.is_empty());
    let p = plan(&[m("a", true, true), m("b", true, false)], &seed(5));
    assert_eq!(p.create.len(), 3, "not-ready up-to-date machines count as up to date");
}

#[test]
fn a_converged_pool_plans_nothing() {
    let world = [m("a", true, true), m("b", true, true)];
    assert!(plan(&world, &seed(2)).is_empty());
    assert!(plan(&[], &seed(0)).is_empty());
}

#[test]
fn scale_down_removes_outdated_machines_first() {
    let world = [m("new1", true, true), m("old", false, true), m("new2", true, true)];
    assert_eq!(deleted(&plan(&world, &seed(2))), [("old", DeleteReason::Outdated)]);
}

#[test]
fn delete_requested_machines_go_after_outdated_and_before_the_rest() {
    let world = [m("a", true, true), requested(m("b", true, true)), m("c", false, true), m("d", true, true)];
    let p = plan(&world, &seed(1));
    assert_eq!(
        deleted(&p),
        [("c", DeleteReason::Outdated), ("b", DeleteReason::DeleteRequested), ("a", DeleteReason::Excess)],
        "equally old machines go in name order"
    );
}

#[test]
fn excess_up_to_date_machines_go_newest_first() {
    let world = [born(m("old", true, true), 1), born(m("young", true, true), 9), born(m("mid", true, true), 5)];
    assert_eq!(deleted(&plan(&world, &seed(1))), [("young", DeleteReason::Excess), ("mid", DeleteReason::Excess)]);
}

#[test]
fn never_deletes_below_replicas_ready_machines() {
    // A rolling update whose new machines are not ready yet: nothing old goes.
    let world = [m("old1", false, true), m("old2", false, true), m("new1", true, false), m("new2", true, false)];
    let p = plan(&world, &seed(2));
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn not_ready_up_to_date_machines_are_never_scale_down_candidates() {
    let world = [m("a", true, true), m("b", true, false), m("c", true, false)];
    let p = plan(&world, &seed(1));
    assert!(p.delete.is_empty(), "{p:?}");
}

#[test]
fn not_ready_outdated_machines_go_at_no_cost() {
    let world = [m("a", true, true), m("broken-old", false, false)];
    assert_eq!(deleted(&plan(&world, &seed(1))), [("broken-old", DeleteReason::Outdated)]);
}

#[test]
fn seed_rollout_creates_all_new_machines_then_deletes_all_old() {
    let old = [m("o1", false, true), m("o2", false, true), m("o3", false, true)];
    let p = plan(&old, &seed(3));
    assert_eq!((p.create.len(), p.delete.len()), (3, 0));
    let mut world = old.to_vec();
    world.extend([m("n1", true, true), m("n2", true, true), m("n3", true, true)]);
    let p = plan(&world, &seed(3));
    assert_eq!(p.delete.len(), 3);
    assert!(p.delete.iter().all(|d| d.reason == DeleteReason::Outdated));
}

#[test]
fn surge_bounds_creation() {
    let old = [m("o1", false, true), m("o2", false, true), m("o3", false, true)];
    let d = Desired { max_surge: 1, ..seed(3) };
    assert_eq!(plan(&old, &d).create.len(), 1);
}

#[test]
fn unavailability_lets_old_machines_go_before_new_ones_exist() {
    let old: Vec<_> = (0..6).map(|i| m(&format!("o{i}"), false, true)).collect();
    let d = Desired { max_surge: 0, max_unavailable: 2, ..seed(6) };
    let p = plan(&old, &d);
    assert_eq!(p.delete.len(), 2);
    assert_eq!(p.create.len(), 2, "deletions make room under the surge bound");
}

#[test]
fn failure_domains_are_filled_fewest_first() {
    let d = Desired { failure_domains: vec!["a".into(), "b".into(), "c".into()], ..seed(5) };
    let mut x = m("x", true, true);
    x.failure_domain = Some("a".into());
    let p = plan(&[x], &d);
    let fds: Vec<_> = p.create.iter().map(|c| c.failure_domain.clone().unwrap_or_default()).collect();
    assert_eq!(fds, ["b", "c", "a", "b"]);
}

#[test]
fn interrupted_creations_are_started_not_duplicated() {
    let mut half = m("half", true, false);
    half.never_started = true;
    let mut stale = m("stale", false, false);
    stale.never_started = true;
    let p = plan(&[half, stale, m("ok", true, true)], &seed(3));
    assert_eq!(p.start.iter().map(|s| s.machine.as_str()).collect::<Vec<_>>(), ["half"]);
    assert_eq!(deleted(&p), [("stale", DeleteReason::Outdated)]);
    assert_eq!(p.create.len(), 1, "the half-created machine counts toward replicas");
}

#[test]
fn machines_not_yet_available_do_not_count_toward_the_floor() {
    // Two new machines are ready but have not been ready for min_ready_seconds.
    let mut fresh1 = m("n1", true, true);
    fresh1.available = false;
    let mut fresh2 = m("n2", true, true);
    fresh2.available = false;
    let world = [m("o1", false, true), m("o2", false, true), fresh1, fresh2];
    let d = Desired { max_surge: 2, ..seed(2) };
    assert!(plan(&world, &d).delete.is_empty(), "old machines stay until the new ones are available");
}

#[test]
fn stuck_machines_are_replaced_one_at_a_time_without_unavailability() {
    let stuck = |n: &str| {
        let mut x = m(n, true, false);
        x.stuck = true;
        x
    };
    let world = [m("a", true, true), stuck("s1"), stuck("s2")];
    let d = Desired { max_surge: 1, ..seed(3) };
    let p = plan(&world, &d);
    assert_eq!(deleted(&p), [("s1", DeleteReason::Unready)]);
    assert_eq!(p.create.len(), 1);
    let d = Desired { max_surge: 1, max_unavailable: 2, ..seed(3) };
    assert_eq!(plan(&world, &d).delete.len(), 2);
}

#[test]
fn batch_approval_stops_a_rollout_after_each_batch() {
    let old: Vec<_> = (0..6).map(|i| m(&format!("o{i}"), false, true)).collect();
    let d = Desired { max_surge: 2, max_updated: Some(2), ..seed(6) };
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
fn a_deleting_pool_removes_everything_and_creates_nothing() {
    let world = [m("a", true, true), m("b", false, false)];
    let p = plan(&world, &Desired { deleting: true, ..seed(3) });
    assert_eq!(deleted(&p), [("a", DeleteReason::PoolDeleting), ("b", DeleteReason::PoolDeleting)]);
    assert!(p.create.is_empty());
}

#[test]
fn a_paused_pool_changes_nothing() {
    let world = [m("a", false, true)];
    assert!(plan(&world, &Desired { paused: true, ..seed(3) }).is_empty());
}

// ---- properties over random worlds -----------------------------------------

fn world() -> impl Strategy<Value = Vec<Observed>> {
    let machine = (any::<bool>(), any::<bool>(), any::<bool>(), 0i64..5, prop::option::of(0usize..4), any::<bool>());
    prop::collection::vec(machine, 0..14).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (up, ready, req, t, fd, flag))| Observed {
                name: format!("m{i}"),
                container_id: format!("c{i}"),
                up_to_date: up,
                ready,
                // Some ready machines are not available yet (min_ready_seconds).
                available: ready && (flag || t < 3),
                stuck: up && !ready && flag,
                delete_requested: req,
                never_started: !ready && t == 4,
                failure_domain: fd.map(|f| format!("fd{f}")),
                created_at: t,
            })
            .collect()
    })
}

fn desired() -> impl Strategy<Value = Desired> {
    (0u32..10, 0u32..6, 0u32..4, prop::bool::weighted(0.1), 0usize..4).prop_map(
        |(replicas, surge, unavailable, paused, fds)| {
            // Both bounds zero is refused by validation (and raised to 1 by resolve).
            let unavailable = if surge == 0 && unavailable == 0 { 1 } else { unavailable };
            Desired {
                replicas,
                failure_domains: (0..fds).map(|f| format!("fd{f}")).collect(),
                max_surge: surge,
                max_unavailable: unavailable,
                paused,
                deleting: false,
                max_updated: None,
            }
        },
    )
}

/// The world after a plan: deletions gone, creations present and not ready.
fn apply(world: &[Observed], p: &Plan) -> Vec<Observed> {
    let mut next: Vec<Observed> =
        world.iter().filter(|m| !p.delete.iter().any(|d| d.machine == m.name)).cloned().collect();
    for (i, c) in p.create.iter().enumerate() {
        let mut n = m(&format!("new{}-{i}", next.len()), true, false);
        n.available = false;
        n.failure_domain = c.failure_domain.clone();
        n.created_at = 100;
        next.push(n);
    }
    next
}

proptest! {
    #[test]
    fn plans_never_break_the_availability_floor(w in world(), d in desired()) {
        let after = apply(&w, &plan(&w, &d));
        let floor = d.replicas.saturating_sub(d.max_unavailable) as usize;
        for (what, before, after) in [
            ("ready", w.iter().filter(|m| m.ready).count(), after.iter().filter(|m| m.ready).count()),
            ("available", w.iter().filter(|m| m.available).count(), after.iter().filter(|m| m.available).count()),
        ] {
            prop_assert!(after >= floor.min(before), "{what} {before} -> {after}, floor {floor}");
        }
    }

    #[test]
    fn batch_approval_caps_up_to_date_machines(w in world(), d in desired(), allowed in 0u32..10) {
        let d = Desired { max_updated: Some(allowed), ..d };
        let up_before = w.iter().filter(|m| m.up_to_date).count();
        let after = apply(&w, &plan(&w, &d));
        let up_after = after.iter().filter(|m| m.up_to_date).count();
        prop_assert!(up_after <= up_before.max(allowed as usize), "{up_before} -> {up_after} up to date, {allowed} allowed");
    }

    #[test]
    fn remediation_replaces_few_at_a_time(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let replaced = p.delete.iter().filter(|x| x.reason == DeleteReason::Unready).count();
        prop_assert!(replaced <= d.max_unavailable.max(1) as usize);
    }

    #[test]
    fn with_no_unavailability_ready_never_drops_below_min_of_replicas_and_before(w in world(), replicas in 0u32..10, surge in 1u32..6) {
        let d = Desired { max_surge: surge, max_unavailable: 0, ..seed(replicas) };
        let ready_before = w.iter().filter(|m| m.ready).count();
        let after = apply(&w, &plan(&w, &d));
        let ready_after = after.iter().filter(|m| m.ready).count();
        prop_assert!(ready_after >= (replicas as usize).min(ready_before));
    }

    #[test]
    fn creations_never_exceed_the_surge_bound(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let after = apply(&w, &p);
        let bound = (d.replicas + d.max_surge) as usize;
        prop_assert!(p.create.is_empty() || after.len() <= bound, "{} machines, bound {bound}", after.len());
    }

    #[test]
    fn creation_count_is_replicas_minus_up_to_date_within_room(w in world(), d in desired()) {
        prop_assume!(!d.paused);
        let p = plan(&w, &d);
        let remaining: Vec<_> = w.iter().filter(|m| !p.delete.iter().any(|x| x.machine == m.name)).collect();
        let up = remaining.iter().filter(|m| m.up_to_date).count();
        let want = (d.replicas as usize).saturating_sub(up);
        let room = (d.replicas + d.max_surge) as usize - remaining.len().min((d.replicas + d.max_surge) as usize);
        prop_assert_eq!(p.create.len(), want.min(room));
    }

    #[test]
    fn deletion_order_respects_priority(w in world(), d in desired()) {
        let p = plan(&w, &d);
        let find = |name: &str| w.iter().find(|m| m.name == name).cloned();
        let gone = |name: &str| p.delete.iter().any(|x| x.machine == name);
        // Scale-down deletions (remediation of stuck machines is not one).
        let scaled_down = || p.delete.iter().filter(|x| x.reason != DeleteReason::Unready).filter_map(|x| find(&x.machine));
        // An up-to-date machine goes only when no ready outdated one stays.
        if scaled_down().any(|m| m.up_to_date) {
            prop_assert!(w.iter().filter(|m| !m.up_to_date && m.ready).all(|m| gone(&m.name)));
        }
        // An unrequested up-to-date machine goes only when every requested ready one goes.
        if scaled_down().any(|m| m.up_to_date && !m.delete_requested) {
            prop_assert!(w.iter().filter(|m| m.up_to_date && m.ready && m.delete_requested).all(|m| gone(&m.name)));
        }
        // Not-ready up-to-date machines are never scale-down candidates;
        // only remediation replaces them, and only once they are stuck.
        prop_assert!(w.iter().filter(|m| m.up_to_date && !m.ready && !m.stuck).all(|m| !gone(&m.name)));
    }

    #[test]
    fn a_converged_world_plans_nothing(n in 0u32..10, d in desired()) {
        let w: Vec<_> = (0..n).map(|i| m(&format!("m{i}"), true, true)).collect();
        let d = Desired { replicas: n, ..d };
        prop_assert!(plan(&w, &d).is_empty());
    }

    #[test]
    fn planning_twice_on_the_applied_world_converges(w in world(), d in desired()) {
        prop_assume!(!d.paused);
        // Machines become ready between passes; the rollout must finish.
        let mut world = w;
        for _ in 0..60 {
            for m in &mut world {
                // Time passes: whatever is ready becomes available.
                m.available = m.ready;
                if m.up_to_date {
                    m.ready = true;
                    m.available = true;
                    m.stuck = false;
                    m.never_started = false;
                }
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
