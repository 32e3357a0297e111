//! The planner: what an apply does to each object, as a pure function of
//! what exists, who owns it, and what the documents ask for.
//!
//! Ownership is what makes an apply safe to run from a pipeline:
//! - an apply set owns what it created (or adopted), and remembers the
//!   *stamp* each object had when it last wrote it; a stamp changes with
//!   every change by anyone, so a stamp that moved means another hand (the
//!   dashboard, a scale, a rollback) changed the object since. Such an
//!   object is a **conflict**, left alone unless the request forces it;
//! - an object that exists but belongs to no apply set is never taken over
//!   unless the request adopts it, and one of another set only with adopt
//!   and force;
//! - prune deletes only objects of this set that the documents no longer
//!   name, never anyone else's.
//!
//! An object another hand changed to exactly what the documents ask is not
//! a conflict: the set takes note of its new stamp.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::diff::{Change, diff};
use super::document::Kind;
use crate::domain::ValidationErrors;
use crate::domain::object::SetRef;
use crate::domain::role::Role;

/// An object: its kind and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub struct Key {
    pub kind: Kind,
    pub name: String,
}

impl Key {
    pub fn new(kind: Kind, name: impl Into<String>) -> Self {
        Self { kind, name: name.into() }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

/// What changes with every change of an object by anyone: made from the
/// object's times and generation, kept by the apply set that wrote it, and
/// only ever compared, never read for its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(String);

impl Stamp {
    /// A pool's: its creation (which tells one pool of a name from a later
    /// one) and its generation (which every spec change moves).
    pub fn pool(created_at: DateTime<Utc>, generation: i64) -> Self {
        Self(format!("{}/{generation}", created_at.timestamp_micros()))
    }

    /// An engine's: engines do not change in place.
    pub fn engine(created_at: DateTime<Utc>) -> Self {
        Self(created_at.timestamp_micros().to_string())
    }

    /// A cluster's: its credentials are replaced in place.
    pub fn cluster(created_at: DateTime<Utc>, updated_at: DateTime<Utc>) -> Self {
        Self(format!("{}/{}", created_at.timestamp_micros(), updated_at.timestamp_micros()))
    }

    /// As the store keeps it.
    pub fn stored(stored: String) -> Self {
        Self(stored)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An object as it exists, in the form its documents take.
#[derive(Debug, Clone)]
pub struct Existing {
    /// Changes with every change of the object by anyone.
    pub stamp: Stamp,
    /// Its document: a pool's spec with every default, an engine's endpoint
    /// and labels, a cluster's server; secrets as fingerprints.
    pub view: Value,
    /// It is being deleted: nothing changes it any more.
    pub deleting: bool,
    /// Why it cannot be deleted now (machines on an engine, pools on a cluster).
    pub undeletable: Option<String>,
}

/// The apply set that owns an object, and the object's stamp when that set
/// last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub apply_set: SetRef,
    pub stamp: Stamp,
}

/// What the planner sees of the world.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub existing: BTreeMap<Key, Existing>,
    pub owners: BTreeMap<Key, Owner>,
}

/// An object a document asks for, in the form `Existing::view` takes.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub key: Key,
    /// Its index in the request's `documents`.
    pub document: usize,
    pub view: Value,
    /// What a creation lists: the fields the document wrote, when they
    /// are all shown (a pool's: its view would list every default too);
    /// `None`: the view.
    pub written: Option<Value>,
    /// The least role an update of the object to this view needs, by the
    /// rule of its single-object route (a pool's: `domain::pool::change_role`).
    pub update_role: Role,
}

/// How the request asked to treat what it finds.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub apply_set: &'a SetRef,
    /// Delete the set's objects the documents no longer name.
    pub prune: bool,
    /// Overwrite (or delete) objects changed by another hand.
    pub force: bool,
    /// Take over objects no apply set owns (with `force`: another set's).
    pub adopt: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Update,
    Delete,
    Unchanged,
    /// Left alone: see `conflict`.
    Conflict,
}

/// Why an object is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConflictReason {
    /// Changed since this apply set last wrote it (`force` overwrites).
    ChangedElsewhere,
    /// Deleted since this apply set last wrote it (`force` creates it again).
    DeletedElsewhere,
    /// Exists, and no apply set owns it (`adopt` takes it over).
    NotOwned,
    /// Another apply set owns it (`adopt` with `force` takes it over).
    OwnedByAnotherSet,
    /// Being deleted: apply again once it is gone.
    BeingDeleted,
    /// The change cannot be made in place (an engine's endpoint, labels or identity).
    Immutable,
    /// Cannot be deleted now (machines on an engine, pools or a job on a cluster).
    InUse,
}

/// What the request would need to do to go ahead anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    Force,
    Adopt,
    AdoptAndForce,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Conflict {
    pub reason: ConflictReason,
    /// What happened, for people.
    pub message: String,
    /// The flag that would override it; `null` when none does.
    pub resolution: Option<Resolution>,
}

/// How the step changes the set's record of the object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Ownership {
    /// Nothing to record.
    #[default]
    Keep,
    /// Record the object (with its stamp after the step) as the set's;
    /// `seen` is the owner the plan saw, which must still be the owner.
    Record { seen: Option<SetRef> },
    /// The set lets go of the object.
    Release,
}

/// What the apply does to one object.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Step {
    pub kind: Kind,
    pub name: String,
    /// Index in `documents`; `null` for an object the documents no longer name.
    pub document: Option<u32>,
    pub action: Action,
    /// The fields that change (all of them for a creation or a deletion).
    pub changes: Vec<Change>,
    /// Why the object is left alone, when `action` is `conflict`.
    pub conflict: Option<Conflict>,
    /// The apply set takes the object over (`adopt`).
    pub adopted: bool,
    /// The least role this step needs.
    pub needs_role: Role,
    #[serde(skip)]
    pub ownership: Ownership,
}

impl Step {
    pub fn key(&self) -> Key {
        Key::new(self.kind, self.name.clone())
    }
}

/// The plan of a whole apply.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// One step per document, in document order, then one per object
    /// pruned, in kind and name order.
    pub steps: Vec<Step>,
    /// Objects the set owned that are gone; with prune, forgotten.
    pub forget: Vec<Key>,
    /// Objects the set owns that the documents no longer name (without
    /// prune: kept, and listed so that people see them).
    pub unlisted: Vec<Key>,
}

impl Plan {
    /// Whether anything is (or would be) created, updated or deleted.
    pub fn changes_anything(&self) -> bool {
        self.steps.iter().any(|s| matches!(s.action, Action::Create | Action::Update | Action::Delete))
    }

    /// Whether the apply writes anything at all (its changes, or only the
    /// set's records).
    pub fn writes(&self) -> bool {
        self.changes_anything()
            || !self.forget.is_empty()
            || self.steps.iter().any(|s| s.ownership != Ownership::Keep && s.action != Action::Conflict)
    }

    /// The least role the whole apply needs.
    pub fn needs_role(&self) -> Role {
        let least = if self.writes() { Role::Operator } else { Role::Viewer };
        self.steps.iter().map(|s| s.needs_role).fold(least, Role::max)
    }

    pub fn conflicts(&self) -> usize {
        self.steps.iter().filter(|s| s.action == Action::Conflict).count()
    }
}

/// Fields of a kind's view that are secret: compared, never shown.
pub fn secrets(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pool => &[],
        Kind::Engine => &["tls"],
        Kind::Cluster => &["credentials"],
    }
}

/// Pools name clusters: each must exist or be in the documents.
pub fn check_references(world: &World, wanted: &[Wanted]) -> Result<(), ValidationErrors> {
    let clusters: BTreeSet<&str> = world
        .existing
        .keys()
        .chain(wanted.iter().map(|w| &w.key))
        .filter(|k| k.kind == Kind::Cluster)
        .map(|k| k.name.as_str())
        .collect();
    let mut errs = ValidationErrors::default();
    for w in wanted.iter().filter(|w| w.key.kind == Kind::Pool) {
        if let Some(cluster) = w.view.get("cluster").and_then(Value::as_str)
            && !clusters.contains(cluster)
        {
            errs.push(
                format!("{}.spec.cluster", super::document::at(w.document)),
                "cluster_exists",
                format!("names no cluster ({cluster:?}): register it, or add a Cluster document"),
            );
        }
    }
    errs.into_result(())
}

/// The plan: one step per wanted object, then the prunes.
pub fn plan(world: &World, wanted: &[Wanted], opts: &Options<'_>) -> Plan {
    let mut out = Plan::default();
    let named: BTreeSet<&Key> = wanted.iter().map(|w| &w.key).collect();
    for w in wanted {
        out.steps.push(step_for(world, w, opts));
    }
    for (key, owner) in world.owners.iter().filter(|(k, o)| &o.apply_set == opts.apply_set && !named.contains(k)) {
        match world.existing.get(key) {
            None => {
                if opts.prune {
                    out.forget.push(key.clone());
                }
            }
            // Going already; the set lets go of it with the prune.
            Some(existing) if existing.deleting => {
                if opts.prune {
                    out.forget.push(key.clone());
                }
            }
            Some(existing) if opts.prune => out.steps.push(prune(key, existing, owner, opts)),
            Some(_) => out.unlisted.push(key.clone()),
        }
    }
    out
}

fn base(key: &Key, document: Option<usize>, action: Action) -> Step {
    Step {
        kind: key.kind,
        name: key.name.clone(),
        document: document.and_then(|d| u32::try_from(d).ok()),
        action,
        changes: Vec::new(),
        conflict: None,
        adopted: false,
        needs_role: Role::Viewer,
        ownership: Ownership::Keep,
    }
}

fn conflicted(mut step: Step, reason: ConflictReason, message: String, resolution: Option<Resolution>) -> Step {
    step.action = Action::Conflict;
    step.conflict = Some(Conflict { reason, message, resolution });
    step.needs_role = Role::Viewer;
    step.ownership = Ownership::Keep;
    step
}

fn step_for(world: &World, w: &Wanted, opts: &Options<'_>) -> Step {
    let key = &w.key;
    let owner = world.owners.get(key);
    let ours = owner.filter(|o| &o.apply_set == opts.apply_set);
    let seen = owner.map(|o| o.apply_set.clone());
    let mut step = base(key, Some(w.document), Action::Unchanged);
    let Some(existing) = world.existing.get(key) else {
        if ours.is_some() && !opts.force {
            let message = format!(
                "{key} was deleted since apply set {} last applied it; pass force to create it again",
                opts.apply_set
            );
            return conflicted(step, ConflictReason::DeletedElsewhere, message, Some(Resolution::Force));
        }
        step.action = Action::Create;
        step.changes = diff(None, Some(w.written.as_ref().unwrap_or(&w.view)), secrets(key.kind));
        step.needs_role = Role::Admin;
        step.ownership = Ownership::Record { seen };
        return step;
    };
    if existing.deleting {
        let message = format!("{key} is being deleted; apply again once it is gone");
        return conflicted(step, ConflictReason::BeingDeleted, message, None);
    }
    let changes = diff(Some(&existing.view), Some(&w.view), secrets(key.kind));
    match (owner, ours) {
        (None, _) if !opts.adopt => {
            let message =
                format!("{key} exists and no apply set owns it; pass adopt to manage it with {}", opts.apply_set);
            return conflicted(step, ConflictReason::NotOwned, message, Some(Resolution::Adopt));
        }
        (Some(other), None) if !(opts.adopt && opts.force) => {
            let message =
                format!("{key} belongs to apply set {}; pass adopt and force to take it over", other.apply_set);
            return conflicted(step, ConflictReason::OwnedByAnotherSet, message, Some(Resolution::AdoptAndForce));
        }
        (_, Some(ours)) if ours.stamp != existing.stamp && !changes.is_empty() && !opts.force => {
            let message = format!(
                "{key} changed since apply set {} last applied it (another hand: the dashboard, a scale, a \
                 rollback); pass force to overwrite it",
                opts.apply_set
            );
            step.changes = changes;
            return conflicted(step, ConflictReason::ChangedElsewhere, message, Some(Resolution::Force));
        }
        _ => {}
    }
    step.adopted = ours.is_none();
    // Taking an object over (from no set, or from another) decides who may
    // change or prune it from now on: the object's admin's call, even when
    // nothing of it changes.
    let least = if step.adopted { Role::Admin } else { Role::Viewer };
    if changes.is_empty() {
        let refresh = ours.is_none_or(|o| o.stamp != existing.stamp);
        if refresh {
            step.ownership = Ownership::Record { seen };
            step.needs_role = least;
        }
        return step;
    }
    if key.kind == Kind::Engine {
        let fields: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
        let message = format!(
            "{key} cannot change in place ({}); drain it, delete it (remove it from the files and apply with \
             prune), then add it again",
            fields.join(", ")
        );
        step.changes = changes;
        return conflicted(step, ConflictReason::Immutable, message, None);
    }
    step.needs_role = w.update_role.max(least);
    step.action = Action::Update;
    step.changes = changes;
    step.ownership = Ownership::Record { seen };
    step
}

fn prune(key: &Key, existing: &Existing, owner: &Owner, opts: &Options<'_>) -> Step {
    let step = base(key, None, Action::Delete);
    if owner.stamp != existing.stamp && !opts.force {
        let message = format!(
            "{key} changed since apply set {} last applied it (another hand); pass force to delete it anyway",
            opts.apply_set
        );
        return conflicted(step, ConflictReason::ChangedElsewhere, message, Some(Resolution::Force));
    }
    if let Some(why) = &existing.undeletable {
        return conflicted(step, ConflictReason::InUse, format!("{key} cannot be deleted now: {why}"), None);
    }
    Step {
        changes: diff(Some(&existing.view), None, secrets(key.kind)),
        needs_role: Role::Admin,
        ownership: Ownership::Release,
        ..step
    }
}

#[cfg(test)]
mod tests;
