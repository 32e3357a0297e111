//! The apply service: check every document, read what exists, plan, and
//! (unless it is a dry run) execute the plan in one transaction.
//!
//! Every write goes through the service that owns the object
//! (`Pools::create_in`, `Engines::insert_in`, `Clusters::update_in`, ...),
//! so events, revisions and rollouts happen as for the single-object
//! routes; they all run in one transaction, so an apply commits whole or
//! not at all. The transaction starts by moving the apply set's revision
//! from the one the plan was made at: of two applies of one set at once,
//! the second finds it moved and changes nothing (on PostgreSQL it waits
//! for the first one's row lock, so this holds across replicas). Each
//! object is written by compare-and-swap too (a pool's generation, an
//! owner's record), so a change by another hand between plan and commit
//! also aborts the whole apply, never half of it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, SubsecRound, Utc};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::document::{self, Checked, Kind, MAX_DOCUMENTS, Object, Rules};
use super::plan::{self, Action, Existing, Key, Options, Owner, Ownership, Plan, Stamp, Wanted, World};
use crate::clusters::{ClusterError, Clusters, Prepared};
use crate::db::apply_sets::Owned;
use crate::db::{self, Db, WriteTx, pools::Pool};
use crate::domain::ValidationErrors;
use crate::domain::object::{ClusterRef, Namespace, PoolRef, SetRef};
use crate::domain::pool::PoolSpec;
use crate::domain::pool::change_role;
use crate::domain::role::Role;
use crate::engines::spec::{EngineSpec, Tls};
use crate::engines::{EngineError, Engines, Removed};
use crate::identity::authz::{self, Access, Target};
use crate::pools::{Planned, PoolError, Pools};

/// The apply service.
#[derive(Clone)]
pub struct Apply {
    db: Db,
    pools: Pools,
    registry: Engines,
    clusters: Clusters,
}

/// An apply as asked.
#[derive(Debug)]
pub struct Request {
    pub apply_set: String,
    pub documents: Vec<Value>,
    pub dry_run: bool,
    pub prune: bool,
    /// With `prune` and no document: delete every object of the set.
    pub allow_empty: bool,
    pub force: bool,
    pub adopt: bool,
    /// `If-Match`: the set's revisions the apply is based on (`0`: a set
    /// never applied).
    pub if_revision: Option<Vec<i64>>,
    /// Who asks, and the namespace the set and its objects are in: every
    /// step passes the authorizer, and a refusal refuses the whole apply.
    pub access: Access,
}

/// What an apply did, or (a dry run) would do.
pub struct Applied {
    pub apply_set: SetRef,
    pub dry_run: bool,
    /// The set's revision after the apply; `None` for a set never applied.
    pub revision: Option<i64>,
    pub plan: Plan,
    /// For each pool whose desired image changes: what the reconciler
    /// would do with the new spec, as `POST /v1/pools/{name}/plan` answers.
    pub rollouts: BTreeMap<String, Planned>,
    /// Pools as the apply left them (generation and revision to wait for).
    pub pools: BTreeMap<String, Pool>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// Another apply of the set, or another hand, changed something the
    /// plan relied on while this apply ran; nothing was changed.
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` names another revision of the set.
    #[error("{0}")]
    Precondition(String),
    /// The authorizer refused a step (the whole apply is refused).
    #[error(transparent)]
    Denied(#[from] crate::identity::Denied),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl From<ValidationErrors> for ApplyError {
    fn from(e: ValidationErrors) -> Self {
        Self::Invalid(e)
    }
}

/// What the documents ask for, by object.
struct Desired {
    objects: BTreeMap<Key, Wish>,
    wanted: Vec<Wanted>,
}

impl Desired {
    /// Each pool update's role, by the one rule of pool changes
    /// (`domain::pool::change_role`) from the pool's current spec; every
    /// other update is an admin's.
    fn with_update_roles(mut self, found: &Found) -> Self {
        for w in &mut self.wanted {
            w.update_role = match (self.objects.get(&w.key), found.pools.get(&w.key.name)) {
                (Some(Wish::Pool(next)), Some(current)) => change_role(&current.spec, next),
                _ => Role::Admin,
            };
        }
        self
    }
}

/// One object as its document asks for it, every rule passed.
enum Wish {
    Pool(PoolSpec),
    Engine(EngineSpec),
    Cluster(Prepared),
}

/// What exists, beside the planner's view of it: what the executor needs.
struct Found {
    world: World,
    pools: BTreeMap<String, Pool>,
    revision: Option<i64>,
}

impl Apply {
    pub fn new(db: Db, pools: Pools, registry: Engines, clusters: Clusters) -> Self {
        Self { db, pools, registry, clusters }
    }

    /// Checks, plans and (unless a dry run) applies.
    #[tracing::instrument(name = "apply.apply", skip_all)]
    pub async fn apply(&self, req: Request) -> Result<Applied, ApplyError> {
        let access = &req.access;
        let set = SetRef::new(access.namespace.clone(), req.apply_set.clone());
        check_request(&req)?;
        self.pools.namespace_exists(access).await.map_err(|e| match e {
            // Answered as any object the caller cannot see: 404.
            PoolError::NamespaceNotFound(name) => {
                ApplyError::Denied(crate::identity::Denied::Hidden { kind: "namespace", name })
            }
            other => other.into(),
        })?;
        // Comparing secrets tells whether a guess equals the stored one:
        // only admins, who may replace them, have them compared.
        let secrets = Secrets {
            clusters: access.role_in(&access.namespace) == Some(Role::Admin),
            engines: access.global_role() == Some(Role::Admin),
        };
        let desired = self.desired(&access.namespace, req.documents, secrets).await?;
        let found = self.found(&set, secrets).await?;
        let desired = desired.with_update_roles(&found);
        plan::check_references(&found.world, &desired.wanted)?;
        let revision = found.revision;
        if let Some(tags) = &req.if_revision
            && !tags.contains(&revision.unwrap_or(0))
        {
            return Err(ApplyError::Precondition(format!(
                "apply set {set} is at revision {}, not {}",
                revision.unwrap_or(0),
                tags.iter().map(i64::to_string).collect::<Vec<_>>().join(" or ")
            )));
        }
        let opts = Options { apply_set: &set, prune: req.prune, force: req.force, adopt: req.adopt };
        let plan = plan::plan(&found.world, &desired.wanted, &opts);
        let rollouts = self.rollouts(&plan, &desired, &found).await;
        let mut applied =
            Applied { apply_set: set.clone(), dry_run: req.dry_run, revision, plan, rollouts, pools: BTreeMap::new() };
        if req.dry_run || !applied.plan.writes() {
            return Ok(applied);
        }
        authorize(access, &set, &applied.plan)?;
        let done = self.execute(&applied.plan, desired, found, &set, access.caller_name()).await?;
        applied.revision = Some(done.revision);
        applied.pools = done.pools;
        tracing::info!(
            apply_set = %set,
            revision = done.revision,
            changes = applied.plan.steps.iter().filter(|s| s.action != Action::Unchanged).count(),
            "applied"
        );
        Ok(applied)
    }

    /// Every document checked, and every cluster's credentials; all the
    /// errors of all of them at once.
    async fn desired(
        &self,
        namespace: &Namespace,
        documents: Vec<Value>,
        secrets: Secrets,
    ) -> Result<Desired, ApplyError> {
        let rules = Rules { namespace, limits: self.pools.limits(), simulated_engines: self.registry.simulated };
        // A pool's creation lists the fields its document wrote, not every default.
        let written: Vec<Option<Value>> = documents
            .iter()
            .map(|d| (d.get("kind").and_then(Value::as_str) == Some("Pool")).then(|| d.get("spec").cloned()).flatten())
            .collect();
        let checked = document::check_all(documents, &rules)?;
        let mut errs = ValidationErrors::default();
        let mut desired = Desired { objects: BTreeMap::new(), wanted: Vec::new() };
        for Checked { index, name, object } in checked {
            let key = Key::new(object.kind(), name);
            let wish = match object {
                Object::Pool(spec) => Wish::Pool(spec),
                Object::Engine(spec) => Wish::Engine(spec),
                Object::Cluster(new) => match self.clusters.prepare(namespace, new).await {
                    Ok(prepared) => Wish::Cluster(prepared),
                    Err(ClusterError::Invalid(e)) => {
                        errs.0.extend(document::under(index, true, e).0);
                        continue;
                    }
                    Err(other) => return Err(other.into()),
                },
            };
            let view = match &wish {
                Wish::Pool(spec) => spec.view().to_json(),
                Wish::Engine(spec) => engine_view(&spec.address, &spec.labels, spec.tls.as_ref(), secrets.engines),
                Wish::Cluster(p) => cluster_view(&p.server, p.credentials.kind(), &p.fingerprint(), secrets.clusters),
            };
            let written = written.get(index).cloned().flatten();
            // Set for pools once their current specs are read (`with_update_roles`).
            let update_role = Role::Admin;
            desired.wanted.push(Wanted { key: key.clone(), document: index, view, written, update_role });
            desired.objects.insert(key, wish);
        }
        errs.into_result(desired).map_err(ApplyError::Invalid)
    }

    /// What exists, and who owns it. The set's revision is read first: an
    /// apply that commits after it makes this one's transaction fail, so a
    /// plan is never applied over a world it did not see.
    async fn found(&self, set: &SetRef, secrets: Secrets) -> Result<Found, ApplyError> {
        let revision = db::apply_sets::revision(self.db.read(), set).await?;
        let namespace = &set.namespace;
        let mut world = World::default();
        let pools: BTreeMap<String, Pool> = self
            .pools
            .all(namespace)
            .await
            .map_err(ApplyError::from)?
            .into_iter()
            .map(|p| (p.id.name.clone(), p))
            .collect();
        let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for pool in pools.values() {
            let existing = Existing {
                stamp: pool_stamp(pool),
                view: pool.spec.view().to_json(),
                deleting: pool.deleting,
                undeletable: None,
            };
            world.existing.insert(Key::new(Kind::Pool, pool.id.name.clone()), existing);
            if let Some(cluster) = pool.spec.cluster() {
                users.entry(cluster).or_default().push(&pool.id.name);
            }
        }
        for engine in db::engines::list(self.db.read()).await? {
            let undeletable = self.registry.held(&engine.name).await.map_err(ApplyError::from)?;
            let existing = Existing {
                stamp: Stamp::engine(engine.created_at),
                view: engine_view(&engine.endpoint, &engine.labels, engine.tls.as_ref(), secrets.engines),
                deleting: false,
                undeletable,
            };
            world.existing.insert(Key::new(Kind::Engine, engine.name), existing);
        }
        for cluster in self.clusters.all(namespace).await.map_err(ApplyError::from)? {
            let id = ClusterRef::new(namespace.clone(), cluster.name.clone());
            let fingerprint = self.clusters.credentials_fingerprint(&id).await.map_err(ApplyError::from)?;
            let mut why = Vec::new();
            if let Some(pools) = users.get(cluster.name.as_str()) {
                why.push(format!("pools {} use it", pools.join(", ")));
            }
            if let Some(job) = self.clusters.active_job(&id).await.map_err(ApplyError::from)? {
                why.push(format!("upgrade job {job} runs on it"));
            }
            let existing = Existing {
                stamp: Stamp::cluster(cluster.created_at, cluster.updated_at),
                view: cluster_view(
                    &cluster.server,
                    &cluster.auth_kind,
                    fingerprint.as_deref().unwrap_or(""),
                    secrets.clusters,
                ),
                deleting: false,
                undeletable: (!why.is_empty()).then(|| why.join("; ")),
            };
            world.existing.insert(Key::new(Kind::Cluster, cluster.name), existing);
        }
        for row in db::apply_sets::owners(self.db.read(), namespace).await? {
            let Some(kind) = Kind::parse(&row.kind) else { continue };
            world
                .owners
                .insert(Key::new(kind, row.name), Owner { apply_set: row.set, stamp: Stamp::stored(row.stamp) });
        }
        Ok(Found { world, pools, revision })
    }

    /// The reconciler's plan for each pool whose desired image changes. A
    /// plan that cannot be made (an engine unreachable) is left out; the
    /// apply does not depend on it.
    async fn rollouts(&self, plan: &Plan, desired: &Desired, found: &Found) -> BTreeMap<String, Planned> {
        let mut out = BTreeMap::new();
        for step in plan.steps.iter().filter(|s| s.kind == Kind::Pool && s.action == Action::Update) {
            let (Some(current), Some(Wish::Pool(spec))) =
                (found.pools.get(&step.name), desired.objects.get(&step.key()))
            else {
                continue;
            };
            if current.spec.desired_image() == spec.desired_image() {
                continue;
            }
            match self.pools.plan_with(current.clone(), Some(spec.clone())).await {
                Ok(planned) => {
                    out.insert(step.name.clone(), planned);
                }
                Err(e) => tracing::warn!(pool = %step.name, error = %e, "no rollout plan for the apply"),
            }
        }
        out
    }

    /// Runs the plan in one transaction, then wakes what it changed.
    async fn execute(
        &self,
        plan: &Plan,
        desired: Desired,
        found: Found,
        set: &SetRef,
        caller: Option<&str>,
    ) -> Result<Executed, ApplyError> {
        // Whole microseconds: what both stores keep, so that a stamp made
        // from this time equals the one read back later.
        let now = crate::clock::wall().trunc_subsecs(6);
        let mut tx = self.db.begin_write().await?;
        let revision = db::apply_sets::advance(&mut tx, set, found.revision, caller, now).await?.ok_or_else(|| {
            ApplyError::Conflict(format!(
                "another apply of apply set {set} committed while this one ran; nothing was changed: apply again \
                 to see the new plan"
            ))
        })?;
        let mut run = Run { set: set.clone(), by: format!("apply set {set}"), now, desired, done: Done::default() };
        // Creations and updates first, clusters and engines before the
        // pools that may name them; deletions after, the other way round.
        let mut writes: Vec<&plan::Step> =
            plan.steps.iter().filter(|s| matches!(s.action, Action::Create | Action::Update)).collect();
        writes.sort_by_key(|s| s.kind);
        for step in writes {
            self.write(&mut tx, step, &found, &mut run).await?;
        }
        let mut deletes: Vec<&plan::Step> = plan.steps.iter().filter(|s| s.action == Action::Delete).collect();
        deletes.sort_by_key(|s| std::cmp::Reverse(s.kind));
        for step in deletes {
            self.delete(&mut tx, step, &found, &mut run).await?;
        }
        record_ownership(&mut tx, plan, &found, &run, set).await?;
        tx.commit().await?;
        let Done { pools, engines, removed, woken, .. } = run.done;
        self.pools.woken(&woken);
        for spec in engines {
            let name = spec.name.clone();
            if let Err(e) = self.registry.activate(spec) {
                tracing::error!(engine = %name, error = %crate::error::error_chain(&e), "a registered engine could not be brought up");
            }
        }
        removed.into_iter().for_each(|r: Removed| self.registry.forget(r));
        Ok(Executed { revision, pools })
    }

    /// Creates or updates one object, through the service that owns it.
    async fn write(&self, tx: &mut WriteTx, step: &plan::Step, found: &Found, run: &mut Run) -> Result<(), ApplyError> {
        let key = step.key();
        let (by, now) = (Some(run.by.as_str()), run.now);
        let stamp = match (step.kind, run.desired.objects.remove(&key)) {
            (Kind::Pool, Some(Wish::Pool(spec))) => {
                let pool = match found.pools.get(&step.name).filter(|_| step.action == Action::Update) {
                    Some(current) => self
                        .pools
                        .change_in(tx, current, &spec, "Applied", by, now)
                        .await?
                        .ok_or_else(|| moved(&key))?,
                    None => {
                        self.pools.create_in(tx, &run.pool(&step.name), &spec, by, now).await.map_err(|e| match e {
                            PoolError::Exists(_) => moved(&key),
                            other => other.into(),
                        })?
                    }
                };
                run.done.woken.insert(pool.id.clone());
                let stamp = pool_stamp(&pool);
                run.done.pools.insert(step.name.clone(), pool);
                stamp
            }
            (Kind::Engine, Some(Wish::Engine(spec))) => {
                self.registry.insert_in(tx, &spec, None, by, now).await.map_err(|e| match e {
                    EngineError::Exists(_) => moved(&key),
                    other => other.into(),
                })?;
                run.done.engines.push(spec);
                Stamp::engine(now)
            }
            (Kind::Cluster, Some(Wish::Cluster(prepared))) => {
                let record = if step.action == Action::Create {
                    self.clusters.insert_in(tx, &prepared, now).await
                } else {
                    self.clusters.update_in(tx, &prepared, now).await
                }
                .map_err(|e| match e {
                    ClusterError::Exists(_) | ClusterError::NotFound(_) => moved(&key),
                    other => other.into(),
                })?;
                Stamp::cluster(record.created_at, record.updated_at)
            }
            _ => return Err(ApplyError::Internal(anyhow::anyhow!("BUG: no document for {key}"))),
        };
        run.done.stamps.insert(key, stamp);
        Ok(())
    }

    /// Deletes one object the set owns and the documents no longer name.
    async fn delete(
        &self,
        tx: &mut WriteTx,
        step: &plan::Step,
        found: &Found,
        run: &mut Run,
    ) -> Result<(), ApplyError> {
        let key = step.key();
        match step.kind {
            Kind::Pool => {
                let current = found.pools.get(&step.name).ok_or_else(|| moved(&key))?;
                // Deleting is a write of its own: the pool must still be as planned.
                let gone = self.pools.delete_in(tx, &current.id, Some(&run.by), run.now).await?;
                if gone.is_none_or(|p| pool_stamp(&p) != pool_stamp(current)) {
                    return Err(moved(&key));
                }
                run.done.woken.insert(current.id.clone());
            }
            Kind::Engine => {
                run.done.removed.push(self.registry.remove_in(tx, &step.name).await.map_err(|e| match e {
                    EngineError::NotFound(_) | EngineError::Conflict(_) => moved(&key),
                    other => other.into(),
                })?)
            }
            Kind::Cluster => self.clusters.delete_in(tx, &run.cluster(&step.name)).await.map_err(|e| match e {
                ClusterError::NotFound(_) | ClusterError::Busy { .. } | ClusterError::InUse { .. } => moved(&key),
                other => other.into(),
            })?,
        }
        Ok(())
    }
}

/// An apply being executed: what it was asked, and what it has done.
struct Run {
    set: SetRef,
    /// Who changes the objects, for their events.
    by: String,
    now: DateTime<Utc>,
    desired: Desired,
    done: Done,
}

impl Run {
    fn pool(&self, name: &str) -> PoolRef {
        PoolRef::new(self.set.namespace.clone(), name)
    }

    fn cluster(&self, name: &str) -> ClusterRef {
        ClusterRef::new(self.set.namespace.clone(), name)
    }

    /// An object as the ownership records name it: in the set's
    /// namespace, but an engine in none.
    fn owned<'a>(&'a self, key: &'a Key) -> Owned<'a> {
        let namespace = (key.kind != Kind::Engine).then_some(&self.set.namespace);
        (key.kind.as_str(), namespace, key.name.as_str())
    }
}

/// What the writes of an apply did, for its answer and for what is woken
/// once it commits.
#[derive(Default)]
struct Done {
    /// Each object's stamp after its write.
    stamps: BTreeMap<Key, Stamp>,
    pools: BTreeMap<String, Pool>,
    engines: Vec<EngineSpec>,
    removed: Vec<Removed>,
    woken: BTreeSet<PoolRef>,
}

/// The error of an object that changed between the plan and its write.
fn moved(key: &Key) -> ApplyError {
    ApplyError::Conflict(format!(
        "{key} changed while this apply ran; nothing was changed: apply again to see the new plan"
    ))
}

/// Records, in the set's ownership records, what each step made of its
/// object, and forgets the objects the set owned that are gone.
async fn record_ownership(
    tx: &mut WriteTx,
    plan: &Plan,
    found: &Found,
    run: &Run,
    set: &SetRef,
) -> Result<(), ApplyError> {
    for step in &plan.steps {
        let key = step.key();
        match (&step.ownership, step.action) {
            (_, Action::Conflict) | (Ownership::Keep, _) => {}
            (Ownership::Release, _) => db::apply_sets::release(tx, run.owned(&key), set).await?,
            (Ownership::Record { seen }, _) => {
                let stamp = run.done.stamps.get(&key).or_else(|| found.world.existing.get(&key).map(|e| &e.stamp));
                let stamp = stamp.map(Stamp::as_str).unwrap_or_default();
                if !db::apply_sets::record(tx, run.owned(&key), set, stamp, seen.as_ref(), run.now).await? {
                    return Err(moved(&key));
                }
            }
        }
    }
    for key in &plan.forget {
        db::apply_sets::release(tx, run.owned(key), set).await?;
    }
    Ok(())
}

/// Every step of a plan that writes passes the authorizer, in the set's
/// namespace (an engine: in none); one refusal refuses the whole apply,
/// before anything is written. Writing the set at all is an operator's.
fn authorize(access: &Access, set: &SetRef, plan: &Plan) -> Result<(), ApplyError> {
    let refused = |e: authz::Denied, object: &dyn std::fmt::Display| {
        tracing::info!(apply_set = %set, %object, refused = %e, "apply refused");
        ApplyError::Denied(e)
    };
    access
        .may(authz::Action::OPERATE, &Target::in_namespace(&set.namespace, "apply set", set.name.clone()))
        .map_err(|e| refused(e, set))?;
    for step in plan.steps.iter().filter(|s| s.action != Action::Conflict) {
        let target = match step.kind {
            Kind::Engine => Target::global("engine", step.name.clone()),
            Kind::Pool => Target::in_namespace(&set.namespace, "pool", step.name.clone()),
            Kind::Cluster => Target::in_namespace(&set.namespace, "cluster", step.name.clone()),
        };
        access.may(authz::Action::needs(step.needs_role), &target).map_err(|e| refused(e, &step.key()))?;
    }
    Ok(())
}

/// What a committed apply left.
struct Executed {
    revision: i64,
    pools: BTreeMap<String, Pool>,
}

/// The request's own rules: a valid set name, not too many documents.
fn check_request(req: &Request) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if req.prune && req.documents.is_empty() && !req.allow_empty {
        errs.push(
            "documents",
            "prune_without_documents",
            format!(
                "no documents: with prune this would delete every object of apply set {:?}; send allow_empty \
                 (drover apply --allow-empty) if that is what you mean",
                req.apply_set
            ),
        );
    }
    if req.documents.len() > MAX_DOCUMENTS {
        errs.push(
            "documents",
            "max_items",
            format!("at most {MAX_DOCUMENTS} documents in one apply; split the fleet into several apply sets"),
        );
    }
    errs.into_result(())
}

fn pool_stamp(pool: &Pool) -> Stamp {
    Stamp::pool(pool.created_at, pool.generation)
}

/// SHA-256 of secret parts, hex: compared, never shown.
fn fingerprint(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether secret fields are compared (by their fingerprints), or only
/// their presence, which every viewer sees anyway: a guess compared with
/// a stored secret tells whether it is right, so only who may replace the
/// secret has it compared (a namespace's admin its clusters', a global
/// admin engines').
#[derive(Debug, Clone, Copy)]
struct Secrets {
    clusters: bool,
    engines: bool,
}

fn engine_view(endpoint: &str, labels: &BTreeMap<String, String>, tls: Option<&Tls>, compared: bool) -> Value {
    let tls = match tls {
        Some(t) if compared => json!(fingerprint(&[&t.cert, &t.key, &t.ca])),
        Some(_) => json!("set"),
        None => Value::Null,
    };
    json!({"endpoint": endpoint, "labels": labels, "tls": tls})
}

fn cluster_view(server: &str, auth: &str, credentials: &str, compared: bool) -> Value {
    let credentials = if compared { credentials } else { "set" };
    json!({"server": server, "auth": auth, "credentials": credentials})
}

/// The errors of the services an apply writes through: a broken rule and
/// the store are the apply's own; anything else is internal.
macro_rules! from_service_error {
    ($($error:ident),*) => {$(
        impl From<$error> for ApplyError {
            fn from(e: $error) -> Self {
                match e {
                    $error::Invalid(errs) => ApplyError::Invalid(errs),
                    $error::Denied(denied) => ApplyError::Denied(denied),
                    $error::Store(e) => ApplyError::Store(e),
                    other => ApplyError::Internal(other.into()),
                }
            }
        }
    )*};
}

from_service_error!(PoolError, EngineError, ClusterError);
