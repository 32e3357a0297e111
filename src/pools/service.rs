//! The pools service: every spec change goes through [`Pools::change`] (or
//! the rollback, `reconcile::rollback`), both of which write it with
//! `db::pools::change_spec`: the generation's compare-and-swap, the
//! revision and the event in one transaction.

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
use crate::domain::event::{Event, EventType, NewEvent, SubjectKind};
use crate::domain::names::DnsLabel;
use crate::domain::pool::{PoolSpec, SpecLimits, describe_change, patch};
use crate::domain::role::Role;
use crate::domain::rollout::Counts;
use crate::reconcile::{self, plan::Plan, rollback::RollbackError};

/// Spec fields an operator may change with PATCH; the rest need admin.
pub const OPERATOR_PATCHABLE: &[&str] = &["replicas", "version", "image", "paused"];

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

    pub async fn get(&self, name: &str) -> Result<Pool, PoolError> {
        self.find(name).await?.ok_or_else(|| PoolError::NotFound(name.to_owned()))
    }

    /// The pool, or `None` once it is gone (an event stream's end).
    pub async fn find(&self, name: &str) -> Result<Option<Pool>, PoolError> {
        Ok(self.db.pool(name).await?)
    }

    /// A pool as last committed, shared, with room for its rendered answer.
    pub async fn shared(&self, name: &str) -> Result<Arc<Cached>, PoolError> {
        self.db.pool_shared(name).await?.ok_or_else(|| PoolError::NotFound(name.to_owned()))
    }

    /// A page of pools in name order.
    pub async fn list(&self, req: &PageRequest) -> Result<Page<Pool>, PoolError> {
        let rows = db::pools::list(self.db.read(), req.after.as_deref(), req.fetch()).await?;
        Ok(Page::from_rows(rows, req.limit, |p| p.name.clone()))
    }

    /// A page of the pool's events, newest first.
    pub async fn events(&self, name: &str, req: &PageRequest<i64>) -> Result<Page<Event>, PoolError> {
        self.get(name).await?;
        Ok(db::events::page(self.db.read(), SubjectKind::Pool, name, req).await?)
    }

    /// Every desired image the pool has had, newest first, and its current revision.
    pub async fn revisions(&self, name: &str) -> Result<(i64, Vec<Revision>), PoolError> {
        let pool = self.get(name).await?;
        Ok((pool.revision, db::revisions::list(self.db.read(), name).await?))
    }

    /// A new pool from a create body: a `name` beside the spec's fields.
    /// Every rule both break is reported in one answer.
    pub async fn create(&self, body: Value) -> Result<Pool, PoolError> {
        let (name, spec) = parse_new(body, &self.limits)?;
        let mut tx = self.db.begin_write().await?;
        let pool = self.create_in(&mut tx, name.as_str(), &spec, None, Utc::now()).await?;
        tx.commit().await?;
        self.wake.pool(name.as_str());
        tracing::info!(pool = %name, "pool created");
        Ok(pool)
    }

    /// Creates a pool in the caller's transaction: its row, first revision
    /// and event, as every creation does. `by` names who asked (an apply
    /// set), for the event. The caller commits, then calls [`Self::woken`].
    pub async fn create_in(
        &self,
        tx: &mut db::WriteTx,
        name: &str,
        spec: &PoolSpec,
        by: Option<&str>,
        now: chrono::DateTime<Utc>,
    ) -> Result<Pool, PoolError> {
        check_cluster(tx, spec).await?;
        let pool = match db::pools::insert(tx, name, spec, now).await {
            Ok(pool) => pool,
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                return Err(PoolError::Exists(name.to_owned()));
            }
            Err(e) => return Err(e.into()),
        };
        db::revisions::record_first(tx, name, spec, now).await?;
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let message = format!("created with {} replicas of {}{by}", spec.replicas(), spec.desired_image());
        db::events::record(tx, &NewEvent::pool(name, EventType::Normal, "Created", message), now).await?;
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
            check_cluster(tx, spec).await?;
        }
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let event = |_| {
            let message = format!("{}{by}", describe_change(&pool.spec, spec));
            NewEvent::pool(&pool.name, EventType::Normal, reason, message)
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
        name: &str,
        by: Option<&str>,
        now: chrono::DateTime<Utc>,
    ) -> Result<Option<Pool>, PoolError> {
        let Some(pool) = db::pools::mark_deleting(tx, name, now).await? else { return Ok(None) };
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let message = format!("pool marked for deletion{by}; removing its machines");
        db::events::record(tx, &NewEvent::pool(name, EventType::Normal, "DeletionRequested", message), now).await?;
        Ok(Some(pool))
    }

    /// Wakes the reconciler and the event streams of pools whose change
    /// was committed.
    pub fn woken<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.wake.pool(name);
        }
    }

    /// Every pool, in name order, read a page at a time.
    pub async fn all(&self) -> Result<Vec<Pool>, PoolError> {
        const PAGE: u32 = 1000;
        let mut out: Vec<Pool> = Vec::new();
        loop {
            let after = out.last().map(|p| p.name.clone());
            let page = db::pools::list(self.db.read(), after.as_deref(), PAGE).await?;
            let done = page.len() < PAGE as usize;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// A JSON merge patch of the spec by a caller of `role`. Operators
    /// change size, image, version and pause; and on a pool with host
    /// mounts, choosing its image is an admin's decision, since the image
    /// gets what the mounts expose (SECURITY.md, "Roles").
    pub async fn patch(
        &self,
        name: &str,
        patch: &Value,
        pinned: Option<&[i64]>,
        role: Role,
    ) -> Result<Pool, PoolError> {
        let fields = patch::check(patch)?;
        let operator = role < Role::Admin;
        if operator && let Some(field) = fields.iter().find(|f| !OPERATOR_PATCHABLE.contains(&f.as_str())) {
            tracing::info!(field, "operator tried to patch an admin-only field");
            return Err(PoolError::AdminOnly("change fields other than replicas, version, image and paused"));
        }
        self.change(name, pinned, "SpecChanged", |current| {
            let spec = current.patched(patch, &self.limits)?;
            if operator && spec.image() != current.image() && !current.extra_mounts().is_empty() {
                tracing::info!("operator tried to change the image of a pool with host mounts");
                return Err(PoolError::AdminOnly("choose the image of a pool with host mounts"));
            }
            Ok(spec)
        })
        .await
    }

    /// Sets only `replicas`.
    pub async fn scale(&self, name: &str, replicas: i64, pinned: Option<&[i64]>) -> Result<Pool, PoolError> {
        self.change(name, pinned, "Scaled", |current| Ok(current.with_replicas(replicas, &self.limits)?)).await
    }

    /// Applies `change` to the pool's spec with optimistic concurrency: bumps
    /// the generation only if nobody else did since we read it. With `pinned`
    /// generations (the request's `If-Match`) a lost race is the client's 412;
    /// without, we re-read and try again. `reason` names the event.
    async fn change(
        &self,
        name: &str,
        pinned: Option<&[i64]>,
        reason: &'static str,
        change: impl Fn(&PoolSpec) -> Result<PoolSpec, PoolError>,
    ) -> Result<Pool, PoolError> {
        const ATTEMPTS: usize = 5;
        for _ in 0..ATTEMPTS {
            let pool = self.get(name).await?;
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
            if spec == pool.spec {
                return Ok(pool);
            }
            let mut tx = self.db.begin_write().await?;
            let Some(written) = self.change_in(&mut tx, &pool, &spec, reason, None, Utc::now()).await? else {
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
            let updated = self.db.pool(name).await?.unwrap_or(written);
            self.wake.pool(name);
            tracing::info!(pool = name, generation = updated.generation, "spec updated");
            return Ok(updated);
        }
        Err(PoolError::Conflict(format!("pool {name:?} kept changing under this request; retry")))
    }

    /// Flags the pool for deletion (the reconciler removes its machines,
    /// then the pool). Repeating it is harmless.
    pub async fn delete(&self, name: &str) -> Result<Pool, PoolError> {
        let mut tx = self.db.begin_write().await?;
        let pool = match self.delete_in(&mut tx, name, None, Utc::now()).await? {
            Some(pool) => pool,
            // Already deleting (a repeated call), or missing.
            None => self.get(name).await?,
        };
        tx.commit().await?;
        self.wake.pool(name);
        Ok(pool)
    }

    /// The pool's rollout, counted now.
    pub async fn rollout(&self, name: &str) -> Result<Rollout, PoolError> {
        let pool = self.get(name).await?;
        self.counted(pool).await
    }

    async fn counted(&self, pool: Pool) -> Result<Rollout, PoolError> {
        let counts = reconcile::live_counts(&self.reconcile, &pool)
            .await
            .map_err(|e| PoolError::Internal(anyhow::Error::new(e).context("observing the pool")))?;
        Ok(Rollout { pool, counts })
    }

    /// Approves the next batch of a rollout with `strategy.batch_approval`.
    pub async fn approve_batch(&self, name: &str) -> Result<Rollout, PoolError> {
        let pool = self.get(name).await?;
        if !pool.spec.strategy().batch_approval {
            return Err(PoolError::Conflict(format!("pool {name:?} does not use strategy.batch_approval")));
        }
        if pool.status.replicas == pool.status.updated_replicas && pool.status.observed_generation == pool.generation {
            return Err(PoolError::Conflict(format!("pool {name:?} has no rollout in progress")));
        }
        let now = Utc::now();
        let mut tx = self.db.begin_write().await?;
        let pool = db::pools::approve_batch(&mut tx, name).await?.ok_or_else(|| PoolError::NotFound(name.into()))?;
        let message = format!("batch {} of revision {} approved", pool.batches_approved, pool.revision);
        db::events::record(&mut tx, &NewEvent::pool(name, EventType::Normal, "BatchApproved", message), now).await?;
        tx.commit().await?;
        self.wake.pool(name);
        self.counted(pool).await
    }

    /// Returns the pool to an earlier revision's version and image (default:
    /// the newest earlier one with another image), by a caller of `role`.
    /// The image must still be allowed, and on a pool with host mounts only
    /// an admin picks another custom image (as for a PATCH of `image`).
    pub async fn rollback(&self, name: &str, revision: Option<i64>, role: Role) -> Result<Pool, PoolError> {
        let pool = self.get(name).await?;
        if pool.deleting {
            return Err(PoolError::Conflict(format!("pool {name:?} is being deleted")));
        }
        let target = match revision {
            Some(r) => db::revisions::get(self.db.read(), name, r).await?,
            None => db::revisions::previous(self.db.read(), name, pool.revision).await?,
        };
        if let Some(target) = &target {
            if !self.limits.host.image_allowed(&target.desired_image) {
                let why = format!(
                    "revision {} runs {:?}, which this server no longer allows",
                    target.revision, target.desired_image
                );
                return Err(ValidationErrors::single("revision", "image_allowed", why).into());
            }
            let another_image = target.image.is_some() && target.image.as_deref() != pool.spec.image();
            if role < Role::Admin && another_image && !pool.spec.extra_mounts().is_empty() {
                tracing::info!("operator tried to roll a pool with host mounts back to another custom image");
                return Err(PoolError::AdminOnly("choose the image of a pool with host mounts"));
            }
        }
        let rolled = reconcile::rollback::rollback(
            &self.db,
            &crate::replicas::Fence::Sole,
            &pool,
            revision,
            "rollback requested",
            Utc::now(),
        )
        .await
        .map_err(|e| match e {
            RollbackError::UnknownRevision { .. } => ValidationErrors::single("revision", "exists", e).into(),
            RollbackError::Store(s) => PoolError::Store(s),
            RollbackError::BadRevision { .. } => PoolError::Internal(e.into()),
            other => PoolError::Conflict(other.to_string()),
        })?;
        self.wake.pool(name);
        Ok(rolled.pool)
    }

    /// What the reconciler would do now, for the pool as it is or with a
    /// merge patch of its spec. Nothing is changed.
    pub async fn plan(&self, name: &str, patch: Option<&Value>) -> Result<Planned, PoolError> {
        let pool = self.get(name).await?;
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

/// A pool may name only a registered cluster: its machines' nodes are
/// drained through it. Checked in the writing transaction, holding the
/// cluster's row against the cluster delete that checks the other way.
async fn check_cluster(tx: &mut db::WriteTx, spec: &PoolSpec) -> Result<(), PoolError> {
    let Some(cluster) = spec.cluster() else { return Ok(()) };
    if db::clusters::hold(tx, cluster).await? {
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
