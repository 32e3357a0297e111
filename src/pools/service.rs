//! The pools service: every spec change goes through [`Pools::change`] (or
//! the rollback, `reconcile::rollback`), both of which write it with
//! `db::pools::change_spec`: the generation's compare-and-swap, the
//! revision and the event in one transaction.
//!
//! Every pool is looked up in the request's namespace, then passed to the
//! authorizer ([`Access::may`]) before it is shown or changed: a pool of a
//! namespace the caller has no grant in answers as a missing one. What a
//! change needs is the one rule of `domain::pool::change_role`.

use std::sync::Arc;

use chrono::Utc;
use serde_json::Value;

use super::error::PoolError;
use super::wake::Wake;
use crate::db::page::{Page, PageRequest};
use crate::db::pool_cache::Cached;
use crate::db::revisions::Revision;
use crate::db::{self, Db, pools::Pool};
use crate::domain::ValidationErrors;
use crate::domain::event::{Event, EventType, NewEvent};
use crate::domain::names::DnsLabel;
use crate::domain::object::{ClusterRef, Namespace, ObjectRef, PoolRef};
use crate::domain::pool::{PoolSpec, SpecLimits, change_role, describe_change, patch};
use crate::domain::rollout::Counts;
use crate::identity::{Access, Action, Target};
use crate::reconcile::{self, plan::Plan, rollback::RollbackError};

/// Pools as the API sees them.
#[derive(Clone)]
pub struct Pools {
    db: Db,
    /// The settings' rules of specs, shared with the reconciler.
    limits: Arc<SpecLimits>,
    wake: Wake,
    /// For dry runs and live counts: what a pass would see.
    reconcile: reconcile::Context,
}

/// A rollout as it stands: the pool, and its machines counted now (so that
/// the counts agree with each other and with a spec just changed).
pub struct Rollout {
    pub pool: Pool,
    pub counts: Counts,
}

/// What the reconciler would do now.
pub struct Planned {
    pub pool: Pool,
    pub plan: Plan,
    pub observed: Counts,
}

impl Pools {
    pub fn new(db: Db, limits: Arc<SpecLimits>, wake: Wake, reconcile: reconcile::Context) -> Self {
        Self { db, limits, wake, reconcile }
    }

    /// The settings' rules of specs.
    pub fn limits(&self) -> &SpecLimits {
        &self.limits
    }

    /// The pool `name` of the request's namespace, if the caller may do
    /// `action` to it. Decided before the lookup (the decision depends on
    /// the caller and the namespace, never on the pool): a refusal costs
    /// the same whether the pool exists or not, and answers the same.
    pub async fn get(&self, access: &Access, action: Action, name: &str) -> Result<Pool, PoolError> {
        let id = PoolRef::new(access.namespace.clone(), name);
        access.may(action, &target(&id))?;
        let found = self.db.pool(&id).await?;
        found.ok_or_else(|| PoolError::NotFound(name.to_owned()))
    }

    /// The pool, or `None` once it is gone (an event stream's end).
    pub async fn find(&self, pool: &PoolRef) -> Result<Option<Pool>, PoolError> {
        Ok(self.db.pool(pool).await?)
    }

    /// A pool as last committed, shared, with room for its rendered answer.
    pub async fn shared(&self, access: &Access, name: &str) -> Result<Arc<Cached>, PoolError> {
        let id = PoolRef::new(access.namespace.clone(), name);
        access.may(Action::READ, &target(&id))?;
        let found = self.db.pool_shared(&id).await?;
        found.ok_or_else(|| PoolError::NotFound(name.to_owned()))
    }

    /// A page of the pools of the request's namespace (of every namespace
    /// the caller sees, with `across`), in (namespace, name) order.
    pub async fn list(&self, access: &Access, across: bool, req: &PageRequest) -> Result<Page<Pool>, PoolError> {
        let rows = if across {
            let visible = access.visible_namespaces();
            // A cursor that is not one of ours is refused: read as none, it
            // would hand the first page again to a client that pages on.
            let after = match req.after.as_deref() {
                None => None,
                Some(c) => Some(cursor_pool(c).ok_or_else(|| {
                    PoolError::Invalid(ValidationErrors::single(
                        "cursor",
                        "cursor",
                        "not a cursor of a list of every namespace; pass back next_cursor as it was given",
                    ))
                })?),
            };
            db::pools::list_across(self.db.read(), visible.as_deref(), after.as_ref(), req.fetch()).await?
        } else {
            self.namespace_exists(access).await?;
            db::pools::list(self.db.read(), &access.namespace, req.after.as_deref(), req.fetch()).await?
        };
        Ok(Page::from_rows(rows, req.limit, |p| if across { cursor_of(&p.id) } else { p.id.name.clone() }))
    }

    /// The request's namespace exists and the caller sees it: what a list
    /// of its objects needs (a namespace it does not see answers as a
    /// missing one).
    pub async fn namespace_exists(&self, access: &Access) -> Result<(), PoolError> {
        let found = db::namespaces::get(self.db.read(), &access.namespace).await?;
        access.may(Action::READ, &Target::namespace(&access.namespace))?;
        found.map(drop).ok_or_else(|| PoolError::NamespaceNotFound(access.namespace.as_str().to_owned()))
    }

    /// A page of the pool's events, newest first.
    pub async fn events(&self, access: &Access, name: &str, req: &PageRequest<i64>) -> Result<Page<Event>, PoolError> {
        let pool = self.get(access, Action::READ, name).await?;
        Ok(db::events::page(self.db.read(), &ObjectRef::Pool(pool.id), req).await?)
    }

    /// Every desired image the pool has had, newest first, and its current revision.
    pub async fn revisions(&self, access: &Access, name: &str) -> Result<(i64, Vec<Revision>), PoolError> {
        let pool = self.get(access, Action::READ, name).await?;
        Ok((pool.revision, db::revisions::list(self.db.read(), &pool.id).await?))
    }

    /// A new pool from a create body: a `name` beside the spec's fields.
    /// Every rule both break is reported in one answer.
    #[tracing::instrument(name = "pools.create", skip_all)]
    pub async fn create(&self, access: &Access, body: Value) -> Result<Pool, PoolError> {
        let (name, spec) = parse_new(body, &self.limits)?;
        let id = PoolRef::new(access.namespace.clone(), name.into_string());
        self.namespace_exists(access).await?;
        access.may(Action::CHANGE, &target(&id))?;
        let mut tx = self.db.begin_write().await?;
        let pool = self.create_in(&mut tx, &id, &spec, None, crate::clock::wall()).await?;
        tx.commit().await?;
        self.wake.pool(&id);
        tracing::info!(namespace = %id.namespace, pool = %id.name, "pool created");
        Ok(pool)
    }

    /// Creates a pool in the caller's transaction: its row, first revision
    /// and event, as every creation does. `by` names who asked (an apply
    /// set), for the event. The caller commits, then calls [`Self::woken`].
    pub async fn create_in(
        &self,
        tx: &mut db::WriteTx,
        id: &PoolRef,
        spec: &PoolSpec,
        by: Option<&str>,
        now: chrono::DateTime<Utc>,
    ) -> Result<Pool, PoolError> {
        check_cluster(tx, &id.namespace, spec).await?;
        let pool = match db::pools::insert(tx, id, spec, now).await {
            Ok(pool) => pool,
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                return Err(PoolError::Exists(id.name.clone()));
            }
            // The namespace was deleted meanwhile.
            Err(e) if db::namespaces::is_in_use(&e) => {
                return Err(PoolError::NamespaceNotFound(id.namespace.as_str().to_owned()));
            }
            Err(e) => return Err(e.into()),
        };
        db::revisions::record_first(tx, id, spec, now).await?;
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let message = format!("created with {} replicas of {}{by}", spec.replicas(), spec.desired_image());
        db::events::record(tx, &NewEvent::pool(id, EventType::Normal, "Created", message), now).await?;
        Ok(pool)
    }

    /// Changes a pool's spec in the caller's transaction, by the one way
    /// specs change (`db::pools::change_spec`: the generation's
    /// compare-and-swap from `pool`, the revision, the events). `None` when
    /// the pool moved on since `pool` was read; nothing is written then.
    /// The pool answered carries its new generation and revision.
    pub async fn change_in(
        &self,
        tx: &mut db::WriteTx,
        pool: &Pool,
        spec: &PoolSpec,
        reason: &'static str,
        by: Option<&str>,
        now: chrono::DateTime<Utc>,
    ) -> Result<Option<Pool>, PoolError> {
        // A pool that named a cluster before checks existed can still be scaled.
        if spec.cluster() != pool.spec.cluster() {
            check_cluster(tx, &pool.id.namespace, spec).await?;
        }
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let event = |_| {
            let message = format!("{}{by}", describe_change(&pool.spec, spec));
            NewEvent::pool(&pool.id, EventType::Normal, reason, message)
        };
        let Some(written) = db::pools::change_spec(tx, pool, spec, now, event).await? else { return Ok(None) };
        let mut updated = written.pool;
        if let Some(revision) = written.revision {
            // The row was read back before the revision moved, in the same transaction.
            updated.revision = revision;
            updated.batches_approved = 1;
        }
        Ok(Some(updated))
    }

    /// Flags a pool for deletion in the caller's transaction, with its
    /// event; `None` when it is missing or being deleted already.
    pub async fn delete_in(
        &self,
        tx: &mut db::WriteTx,
        id: &PoolRef,
        by: Option<&str>,
        now: chrono::DateTime<Utc>,
    ) -> Result<Option<Pool>, PoolError> {
        let Some(pool) = db::pools::mark_deleting(tx, id, now).await? else { return Ok(None) };
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let message = format!("pool marked for deletion{by}; removing its machines");
        db::events::record(tx, &NewEvent::pool(id, EventType::Normal, "DeletionRequested", message), now).await?;
        Ok(Some(pool))
    }

    /// Wakes the reconciler and the event streams of pools whose change
    /// was committed.
    pub fn woken<'a>(&self, pools: impl IntoIterator<Item = &'a PoolRef>) {
        for pool in pools {
            self.wake.pool(pool);
        }
    }

    /// Every pool of `namespace`, in name order, read a page at a time.
    pub async fn all(&self, namespace: &Namespace) -> Result<Vec<Pool>, PoolError> {
        const PAGE: u32 = 1000;
        let mut out: Vec<Pool> = Vec::new();
        loop {
            let after = out.last().map(|p| p.id.name.clone());
            let page = db::pools::list(self.db.read(), namespace, after.as_deref(), PAGE).await?;
            let done = page.len() < PAGE as usize;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// A JSON merge patch of the spec, by a caller whose role in the pool's
    /// namespace may make that change (`domain::pool::change_role`).
    #[tracing::instrument(name = "pools.patch", skip_all)]
    pub async fn patch(
        &self,
        access: &Access,
        name: &str,
        patch: &Value,
        pinned: Option<&[i64]>,
    ) -> Result<Pool, PoolError> {
        patch::check(patch)?;
        self.change(access, name, pinned, "SpecChanged", |current| Ok(current.patched(patch, &self.limits)?)).await
    }

    /// Sets only `replicas`.
    #[tracing::instrument(name = "pools.scale", skip_all)]
    pub async fn scale(
        &self,
        access: &Access,
        name: &str,
        replicas: i64,
        pinned: Option<&[i64]>,
    ) -> Result<Pool, PoolError> {
        self.change(access, name, pinned, "Scaled", |current| Ok(current.with_replicas(replicas, &self.limits)?)).await
    }

    /// Applies `change` to the pool's spec with optimistic concurrency: bumps
    /// the generation only if nobody else did since we read it. With `pinned`
    /// generations (the request's `If-Match`) a lost race is the client's 412;
    /// without, we re-read and try again. `reason` names the event.
    async fn change(
        &self,
        access: &Access,
        name: &str,
        pinned: Option<&[i64]>,
        reason: &'static str,
        change: impl Fn(&PoolSpec) -> Result<PoolSpec, PoolError>,
    ) -> Result<Pool, PoolError> {
        const ATTEMPTS: usize = 5;
        for _ in 0..ATTEMPTS {
            let pool = self.get(access, Action::OPERATE, name).await?;
            if let Some(tags) = pinned
                && !tags.contains(&pool.generation)
            {
                let asked: Vec<String> = tags.iter().map(i64::to_string).collect();
                return Err(PoolError::Precondition(format!(
                    "pool {name:?} is at generation {}, not {}",
                    pool.generation,
                    asked.join(" or ")
                )));
            }
            if pool.deleting {
                return Err(PoolError::Conflict(format!(
                    "pool {name:?} is being deleted; its spec can no longer change"
                )));
            }
            let spec = change(&pool.spec)?;
            access.may(Action::needs(change_role(&pool.spec, &spec)), &target(&pool.id))?;
            if spec == pool.spec {
                return Ok(pool);
            }
            let mut tx = self.db.begin_write().await?;
            let Some(written) = self.change_in(&mut tx, &pool, &spec, reason, None, crate::clock::wall()).await? else {
                drop(tx);
                if pinned.is_some() {
                    return Err(PoolError::Precondition(format!(
                        "pool {name:?} changed while this request ran; re-read it and retry"
                    )));
                }
                continue;
            };
            tx.commit().await?;
            // The revision and approvals may have moved in this transaction.
            let updated = self.db.pool(&pool.id).await?.unwrap_or(written);
            self.wake.pool(&pool.id);
            tracing::info!(pool = %pool.id, generation = updated.generation, "spec updated");
            return Ok(updated);
        }
        Err(PoolError::Conflict(format!("pool {name:?} kept changing under this request; retry")))
    }

    /// Flags the pool for deletion (the reconciler removes its machines,
    /// then the pool). Repeating it is harmless.
    #[tracing::instrument(name = "pools.delete", skip_all)]
    pub async fn delete(&self, access: &Access, name: &str) -> Result<Pool, PoolError> {
        let found = self.get(access, Action::CHANGE, name).await?;
        let mut tx = self.db.begin_write().await?;
        let pool = match self.delete_in(&mut tx, &found.id, None, crate::clock::wall()).await? {
            Some(pool) => pool,
            // Already deleting (a repeated call), or gone meanwhile.
            None => self.get(access, Action::CHANGE, name).await?,
        };
        tx.commit().await?;
        self.wake.pool(&pool.id);
        Ok(pool)
    }

    /// The pool's rollout, counted now.
    pub async fn rollout(&self, access: &Access, name: &str) -> Result<Rollout, PoolError> {
        let pool = self.get(access, Action::READ, name).await?;
        self.counted(pool).await
    }

    async fn counted(&self, pool: Pool) -> Result<Rollout, PoolError> {
        let counts = reconcile::live_counts(&self.reconcile, &pool)
            .await
            .map_err(|e| PoolError::Internal(anyhow::Error::new(e).context("observing the pool")))?;
        Ok(Rollout { pool, counts })
    }

    /// Approves the next batch of a rollout with `strategy.batch_approval`.
    #[tracing::instrument(name = "pools.approve_batch", skip_all)]
    pub async fn approve_batch(&self, access: &Access, name: &str) -> Result<Rollout, PoolError> {
        let pool = self.get(access, Action::OPERATE, name).await?;
        if !pool.spec.strategy().batch_approval {
            return Err(PoolError::Conflict(format!("pool {name:?} does not use strategy.batch_approval")));
        }
        if pool.status.replicas == pool.status.updated_replicas && pool.status.observed_generation == pool.generation {
            return Err(PoolError::Conflict(format!("pool {name:?} has no rollout in progress")));
        }
        let now = crate::clock::wall();
        let mut tx = self.db.begin_write().await?;
        let pool =
            db::pools::approve_batch(&mut tx, &pool.id).await?.ok_or_else(|| PoolError::NotFound(name.into()))?;
        let message = format!("batch {} of revision {} approved", pool.batches_approved, pool.revision);
        db::events::record(&mut tx, &NewEvent::pool(&pool.id, EventType::Normal, "BatchApproved", message), now)
            .await?;
        tx.commit().await?;
        self.wake.pool(&pool.id);
        self.counted(pool).await
    }

    /// Returns the pool to an earlier revision's version and image (default:
    /// the newest earlier one with another image), by a caller whose role
    /// may make that change (`domain::pool::change_role`: on a pool with
    /// host mounts another custom image is an admin's, as for a PATCH).
    /// The image must still be allowed.
    #[tracing::instrument(name = "pools.rollback", skip_all)]
    pub async fn rollback(&self, access: &Access, name: &str, revision: Option<i64>) -> Result<Pool, PoolError> {
        let pool = self.get(access, Action::OPERATE, name).await?;
        if pool.deleting {
            return Err(PoolError::Conflict(format!("pool {name:?} is being deleted")));
        }
        let target = match revision {
            Some(r) => db::revisions::get(self.db.read(), &pool.id, r).await?,
            None => db::revisions::previous(self.db.read(), &pool.id, pool.revision).await?,
        };
        if let Some(target) = &target {
            if !self.limits.host.image_allowed(&target.desired_image) {
                let why = format!(
                    "revision {} runs {:?}, which this server no longer allows",
                    target.revision, target.desired_image
                );
                return Err(ValidationErrors::single("revision", "image_allowed", why).into());
            }
            if let Ok(spec) = reconcile::rollback::spec_of(&pool.spec, target) {
                access.may(Action::needs(change_role(&pool.spec, &spec)), &self::target(&pool.id))?;
            }
        }
        let rolled = reconcile::rollback::rollback(
            &self.db,
            &crate::replicas::Fence::Sole,
            &pool,
            revision,
            "rollback requested",
            crate::clock::wall(),
        )
        .await
        .map_err(|e| match e {
            RollbackError::UnknownRevision { .. } => ValidationErrors::single("revision", "exists", e).into(),
            RollbackError::Store(s) => PoolError::Store(s),
            RollbackError::BadRevision { .. } => PoolError::Internal(e.into()),
            other => PoolError::Conflict(other.to_string()),
        })?;
        self.wake.pool(&pool.id);
        Ok(rolled.pool)
    }

    /// What the reconciler would do now, for the pool as it is or with a
    /// merge patch of its spec. Nothing is changed.
    pub async fn plan(&self, access: &Access, name: &str, patch: Option<&Value>) -> Result<Planned, PoolError> {
        let pool = self.get(access, Action::READ, name).await?;
        let Some(patch) = patch else { return self.plan_with(pool, None).await };
        patch::check(patch)?;
        let proposed = pool.spec.patched(patch, &self.limits)?;
        self.plan_with(pool, Some(proposed)).await
    }

    /// What the reconciler would do now with `pool`, as it is or with the
    /// `proposed` spec. Nothing is changed.
    pub async fn plan_with(&self, mut pool: Pool, proposed: Option<PoolSpec>) -> Result<Planned, PoolError> {
        if let Some(proposed) = proposed {
            if proposed.desired_image() != pool.spec.desired_image() {
                // A new image starts a new rollout with its first batch approved.
                pool.batches_approved = 1;
            }
            pool.spec = proposed;
        }
        let (plan, observed) = reconcile::dry_run(&self.reconcile, &pool).await.map_err(|e| match e {
            reconcile::ReconcileError::Runtime(r) => PoolError::Unavailable(r.to_string()),
            reconcile::ReconcileError::Store(s) => PoolError::Store(s),
            other => PoolError::Internal(anyhow::anyhow!(other.to_string())),
        })?;
        Ok(Planned { pool, plan, observed })
    }
}

/// The authorizer's view of a pool.
pub fn target(pool: &PoolRef) -> Target {
    Target::in_namespace(&pool.namespace, "pool", &pool.name)
}

/// A list across namespaces is paged by `namespace/name`.
fn cursor_of(pool: &PoolRef) -> String {
    format!("{}/{}", pool.namespace, pool.name)
}

/// The pool a cursor of a list across namespaces names: the cursor is
/// this server's own `namespace/name` ([`cursor_of`]), handed back.
fn cursor_pool(cursor: &str) -> Option<PoolRef> {
    let (namespace, name) = cursor.split_once('/')?;
    Some(PoolRef::new(Namespace::parse(namespace).ok()?, name))
}

/// A pool may name only a registered cluster of its own namespace: its
/// machines' nodes are drained through it. Checked in the writing
/// transaction, holding the cluster's row against the cluster delete that
/// checks the other way.
async fn check_cluster(tx: &mut db::WriteTx, namespace: &Namespace, spec: &PoolSpec) -> Result<(), PoolError> {
    let Some(cluster) = spec.cluster() else { return Ok(()) };
    if db::clusters::hold(tx, &ClusterRef::new(namespace.clone(), cluster)).await? {
        return Ok(());
    }
    Err(ValidationErrors::single(
        "cluster",
        "cluster_exists",
        format!("names no registered cluster ({cluster:?}); register it with POST /v1/clusters first"),
    )
    .into())
}

/// Splits a create body into its name and spec, reporting the rules both
/// break at once.
fn parse_new(body: Value, limits: &SpecLimits) -> Result<(DnsLabel, PoolSpec), ValidationErrors> {
    let named = crate::domain::json::named(body)?;
    ValidationErrors::join(named.name, named.rest.and_then(|input| PoolSpec::parse(input, limits)))
}
