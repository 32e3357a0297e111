use std::sync::LazyLock;

use serde_json::json;

use super::*;
use crate::domain::object::Namespace;

const SET: &str = "fleet";
static FLEET: LazyLock<SetRef> = LazyLock::new(|| set(SET));

fn set(name: &str) -> SetRef {
    SetRef::new(Namespace::default(), name)
}

fn pool(replicas: u32) -> Value {
    json!({"replicas": replicas, "version": "v1.29.2", "image": null, "labels": {}, "extra_mounts": []})
}

fn existing(view: Value, stamp: &str) -> Existing {
    Existing { stamp: Stamp::stored(stamp.into()), view, deleting: false, undeletable: None }
}

fn owner(set: &str, stamp: &str) -> Owner {
    Owner { apply_set: self::set(set), stamp: Stamp::stored(stamp.into()) }
}

fn key(name: &str) -> Key {
    Key::new(Kind::Pool, name)
}

fn wanted(name: &str, view: Value) -> Wanted {
    Wanted { key: key(name), document: 0, view, written: None, update_role: Role::Operator }
}

fn opts() -> Options<'static> {
    Options { apply_set: &FLEET, prune: false, force: false, adopt: false }
}

/// What the plan does to the object `web`: its action and conflict reason.
struct Case {
    what: &'static str,
    exists: Option<Existing>,
    owner: Option<Owner>,
    want: Option<Value>,
    opts: Options<'static>,
    action: Action,
    reason: Option<ConflictReason>,
    ownership: Ownership,
}

fn run(case: &Case) -> Plan {
    let mut world = World::default();
    if let Some(e) = &case.exists {
        world.existing.insert(key("web"), e.clone());
    }
    if let Some(o) = &case.owner {
        world.owners.insert(key("web"), o.clone());
    }
    let wanted: Vec<Wanted> = case.want.iter().map(|v| wanted("web", v.clone())).collect();
    plan(&world, &wanted, &case.opts)
}

#[test]
fn each_object_gets_the_action_its_ownership_and_state_call_for() {
    let force = Options { force: true, ..opts() };
    let adopt = Options { adopt: true, ..opts() };
    let prune = Options { prune: true, ..opts() };
    let record = |seen: Option<&str>| Ownership::Record { seen: seen.map(set) };
    let cases = [
        Case {
            what: "a new object is created and recorded",
            exists: None,
            owner: None,
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Create,
            reason: None,
            ownership: record(None),
        },
        Case {
            what: "an owned object asked as it is stays unchanged",
            exists: Some(existing(pool(3), "s1")),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Unchanged,
            reason: None,
            ownership: Ownership::Keep,
        },
        Case {
            what: "an owned object asked otherwise is updated",
            exists: Some(existing(pool(3), "s1")),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(5)),
            opts: opts(),
            action: Action::Update,
            reason: None,
            ownership: record(Some(SET)),
        },
        Case {
            what: "an object changed by another hand is a conflict",
            exists: Some(existing(pool(4), "s2")),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Conflict,
            reason: Some(ConflictReason::ChangedElsewhere),
            ownership: Ownership::Keep,
        },
        Case {
            what: "force overwrites a change by another hand",
            exists: Some(existing(pool(4), "s2")),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: force,
            action: Action::Update,
            reason: None,
            ownership: record(Some(SET)),
        },
        Case {
            what: "another hand's change to exactly what is asked is no conflict; the new stamp is noted",
            exists: Some(existing(pool(3), "s2")),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Unchanged,
            reason: None,
            ownership: record(Some(SET)),
        },
        Case {
            what: "an object deleted by another hand is a conflict",
            exists: None,
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Conflict,
            reason: Some(ConflictReason::DeletedElsewhere),
            ownership: Ownership::Keep,
        },
        Case {
            what: "force creates an object deleted by another hand again",
            exists: None,
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: force,
            action: Action::Create,
            reason: None,
            ownership: record(Some(SET)),
        },
        Case {
            what: "an object nobody owns is not taken over",
            exists: Some(existing(pool(3), "s1")),
            owner: None,
            want: Some(pool(3)),
            opts: opts(),
            action: Action::Conflict,
            reason: Some(ConflictReason::NotOwned),
            ownership: Ownership::Keep,
        },
        Case {
            what: "force alone does not take over an object nobody owns",
            exists: Some(existing(pool(3), "s1")),
            owner: None,
            want: Some(pool(5)),
            opts: force,
            action: Action::Conflict,
            reason: Some(ConflictReason::NotOwned),
            ownership: Ownership::Keep,
        },
        Case {
            what: "adopt takes over an object nobody owns, as it is",
            exists: Some(existing(pool(3), "s1")),
            owner: None,
            want: Some(pool(3)),
            opts: adopt,
            action: Action::Unchanged,
            reason: None,
            ownership: record(None),
        },
        Case {
            what: "adopt takes over and changes an object nobody owns",
            exists: Some(existing(pool(3), "s1")),
            owner: None,
            want: Some(pool(5)),
            opts: adopt,
            action: Action::Update,
            reason: None,
            ownership: record(None),
        },
        Case {
            what: "another set's object is not taken over by adopt alone",
            exists: Some(existing(pool(3), "s1")),
            owner: Some(owner("other", "s1")),
            want: Some(pool(3)),
            opts: adopt,
            action: Action::Conflict,
            reason: Some(ConflictReason::OwnedByAnotherSet),
            ownership: Ownership::Keep,
        },
        Case {
            what: "adopt and force take over another set's object",
            exists: Some(existing(pool(3), "s1")),
            owner: Some(owner("other", "s1")),
            want: Some(pool(3)),
            opts: Options { adopt: true, force: true, ..opts() },
            action: Action::Unchanged,
            reason: None,
            ownership: record(Some("other")),
        },
        Case {
            what: "an object being deleted is left alone",
            exists: Some(Existing { deleting: true, ..existing(pool(3), "s1") }),
            owner: Some(owner(SET, "s1")),
            want: Some(pool(3)),
            opts: force,
            action: Action::Conflict,
            reason: Some(ConflictReason::BeingDeleted),
            ownership: Ownership::Keep,
        },
        Case {
            what: "prune deletes an owned object the documents no longer name",
            exists: Some(existing(pool(3), "s1")),
            owner: Some(owner(SET, "s1")),
            want: None,
            opts: prune,
            action: Action::Delete,
            reason: None,
            ownership: Ownership::Release,
        },
        Case {
            what: "prune leaves alone an owned object changed by another hand",
            exists: Some(existing(pool(4), "s2")),
            owner: Some(owner(SET, "s1")),
            want: None,
            opts: prune,
            action: Action::Conflict,
            reason: Some(ConflictReason::ChangedElsewhere),
            ownership: Ownership::Keep,
        },
        Case {
            what: "prune leaves alone an object in use",
            exists: Some(Existing { undeletable: Some("pools use it".into()), ..existing(pool(3), "s1") }),
            owner: Some(owner(SET, "s1")),
            want: None,
            opts: prune,
            action: Action::Conflict,
            reason: Some(ConflictReason::InUse),
            ownership: Ownership::Keep,
        },
    ];
    for case in &cases {
        let plan = run(case);
        let step = plan.steps.first().unwrap_or_else(|| panic!("{}: no step", case.what));
        assert_eq!(step.action, case.action, "{}: {step:?}", case.what);
        assert_eq!(step.conflict.as_ref().map(|c| c.reason), case.reason, "{}", case.what);
        assert_eq!(step.ownership, case.ownership, "{}", case.what);
    }
}

#[test]
fn prune_never_touches_objects_it_does_not_own() {
    let mut world = World::default();
    world.existing.insert(key("mine"), existing(pool(1), "a"));
    world.existing.insert(key("theirs"), existing(pool(1), "b"));
    world.existing.insert(key("nobodys"), existing(pool(1), "c"));
    world.owners.insert(key("mine"), owner(SET, "a"));
    world.owners.insert(key("theirs"), owner("other", "b"));
    let plan = plan(&world, &[], &Options { prune: true, force: true, ..opts() });
    let deleted: Vec<&str> =
        plan.steps.iter().filter(|s| s.action == Action::Delete).map(|s| s.name.as_str()).collect();
    assert_eq!(deleted, ["mine"]);
}

#[test]
fn without_prune_the_objects_left_out_are_listed_and_kept() {
    let mut world = World::default();
    world.existing.insert(key("old"), existing(pool(1), "a"));
    world.owners.insert(key("old"), owner(SET, "a"));
    world.owners.insert(key("gone"), owner(SET, "z"));
    let kept = plan(&world, &[], &opts());
    assert!(kept.steps.is_empty() && kept.forget.is_empty());
    assert_eq!(kept.unlisted, [key("old")]);
    let pruned = plan(&world, &[], &Options { prune: true, ..opts() });
    assert_eq!(pruned.forget, [key("gone")], "an owned object that is gone is forgotten with prune");
}

#[test]
fn roles_follow_the_single_object_routes() {
    let mut world = World::default();
    world.existing.insert(key("web"), existing(pool(3), "s"));
    world.owners.insert(key("web"), owner(SET, "s"));
    let mut mounted = pool(3);
    mounted["extra_mounts"] = json!([{"container_path": "/d", "host_path": "/srv/d", "read_only": true}]);
    world.existing.insert(key("db"), existing(mounted.clone(), "s"));
    world.owners.insert(key("db"), owner(SET, "s"));
    // An update needs what the one pool rule (`change_role`) said of it.
    let role = |name: &str, view: Value, update_role: Role| {
        let plan = plan(&world, &[Wanted { update_role, ..wanted(name, view) }], &opts());
        (plan.steps[0].needs_role, plan.needs_role())
    };
    assert_eq!(role("web", pool(5), Role::Operator), (Role::Operator, Role::Operator));
    let mut imaged = mounted.clone();
    imaged["image"] = json!("example/node:2");
    assert_eq!(role("db", imaged, Role::Admin).0, Role::Admin);
    assert_eq!(role("new", pool(1), Role::Operator).0, Role::Admin, "creating is an admin's");
    assert_eq!(role("web", pool(3), Role::Admin), (Role::Viewer, Role::Viewer), "a no-op needs no more than a viewer");
}

#[test]
fn an_engine_change_is_a_conflict_since_engines_do_not_change_in_place() {
    let engine = Key::new(Kind::Engine, "b");
    let mut world = World::default();
    world.existing.insert(engine.clone(), existing(json!({"endpoint": "sim://b", "labels": {}, "tls": null}), "t"));
    world.owners.insert(engine.clone(), owner(SET, "t"));
    let want = Wanted {
        key: engine,
        document: 0,
        view: json!({"endpoint": "sim://b", "labels": {"zone": "a"}, "tls": null}),
        written: None,
        update_role: Role::Admin,
    };
    let plan = plan(&world, &[want], &Options { force: true, ..opts() });
    assert_eq!(plan.steps[0].conflict.as_ref().map(|c| c.reason), Some(ConflictReason::Immutable));
}

#[test]
fn pools_must_name_a_cluster_that_exists_or_is_in_the_documents() {
    let mut world = World::default();
    world.existing.insert(Key::new(Kind::Cluster, "prod"), existing(json!({}), "x"));
    let mut named = pool(1);
    named["cluster"] = json!("prod");
    let mut staged = pool(1);
    staged["cluster"] = json!("stage");
    let mut missing = pool(1);
    missing["cluster"] = json!("nowhere");
    let stage = Wanted {
        key: Key::new(Kind::Cluster, "stage"),
        document: 3,
        view: json!({}),
        written: None,
        update_role: Role::Admin,
    };
    let wanted = [
        Wanted { document: 0, ..wanted("a", named) },
        Wanted { document: 1, ..wanted("b", staged) },
        Wanted { document: 2, ..wanted("c", missing) },
        stage,
    ];
    let errs = check_references(&world, &wanted).expect_err("a missing cluster");
    assert_eq!(errs.0.len(), 1);
    assert_eq!((errs.0[0].field.as_str(), errs.0[0].static_rule()), ("documents[2].spec.cluster", "cluster_exists"));
}

#[test]
fn a_plan_that_only_notes_stamps_still_writes_but_changes_nothing() {
    let mut world = World::default();
    world.existing.insert(key("web"), existing(pool(3), "s2"));
    world.owners.insert(key("web"), owner(SET, "s1"));
    let plan = plan(&world, &[wanted("web", pool(3))], &opts());
    assert!(!plan.changes_anything() && plan.writes());
    assert_eq!(plan.needs_role(), Role::Operator);
}

#[test]
fn a_creation_lists_what_the_document_wrote() {
    let mut w = wanted("web", pool(3));
    w.written = Some(json!({"replicas": 3, "version": "v1.29.2"}));
    let plan = plan(&World::default(), &[w], &opts());
    let paths: Vec<&str> = plan.steps[0].changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["replicas", "version"], "defaults are not listed");
}
