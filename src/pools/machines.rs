//! The machines service: a pool's machines as the store last recorded them
//! from the engines, and the two ways to choose which machine goes next:
//! mark it (it goes first on the next scale-down), or remove it (mark it
//! and lower `replicas` by one, as an autoscaler does). Each asks the
//! authorizer of the pool first: a machine is its pool's.

use super::error::PoolError;
use super::wake::Wake;
use crate::db::page::{Page, PageRequest};
use crate::db::{self, Db, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::object::PoolRef;
use crate::identity::{Access, Action};

#[derive(Clone)]
pub struct Machines {
    db: Db,
    wake: Wake,
}

/// A page of a pool's machines, and the image they should run.
pub struct PoolMachines {
    pub desired_image: String,
    pub page: Page<Machine>,
}

/// One machine of a pool, and the image it should run.
pub struct PoolMachine {
    pub desired_image: String,
    pub machine: Machine,
}

impl Machines {
    pub fn new(db: Db, wake: Wake) -> Self {
        Self { db, wake }
    }

    /// The pool of the request's namespace, if the caller may do `action`
    /// to it (looked up first: see `Pools::get`).
    async fn pool(&self, access: &Access, action: Action, name: &str) -> Result<Pool, PoolError> {
        let id = PoolRef::new(access.namespace.clone(), name);
        let found = self.db.pool(&id).await?;
        access.may(action, &super::target(&id))?;
        found.ok_or_else(|| PoolError::NotFound(name.to_owned()))
    }

    fn missing(pool: &str, machine: &str) -> PoolError {
        PoolError::MachineNotFound { pool: pool.to_owned(), machine: machine.to_owned() }
    }

    /// A page of the pool's machines in name order.
    pub async fn list(&self, access: &Access, pool: &str, req: &PageRequest) -> Result<PoolMachines, PoolError> {
        let pool = self.pool(access, Action::READ, pool).await?;
        let desired_image = pool.spec.desired_image();
        let rows = db::machines::page(self.db.read(), &pool.id, req.after.as_deref(), req.fetch()).await?;
        Ok(PoolMachines { desired_image, page: Page::from_rows(rows, req.limit, |m| m.name.clone()) })
    }

    pub async fn get(&self, access: &Access, pool: &str, machine: &str) -> Result<PoolMachine, PoolError> {
        let found = self.pool(access, Action::READ, pool).await?;
        let desired_image = found.spec.desired_image();
        let machine =
            db::machines::get(self.db.read(), &found.id, machine).await?.ok_or_else(|| Self::missing(pool, machine))?;
        Ok(PoolMachine { desired_image, machine })
    }

    /// Marks a machine to go first on the next scale-down; `replicas` is
    /// unchanged, and repeating it is harmless.
    pub async fn request_deletion(&self, access: &Access, pool: &str, machine: &str) -> Result<PoolMachine, PoolError> {
        let found = self.pool(access, Action::OPERATE, pool).await?;
        let desired_image = found.spec.desired_image();
        let now = crate::clock::wall();
        let mut tx = self.db.begin_write().await?;
        let marked = db::machines::request_delete(&mut tx, &found.id, machine, now)
            .await?
            .ok_or_else(|| Self::missing(pool, machine))?;
        let ev = NewEvent::pool(
            &found.id,
            EventType::Normal,
            "MachineDeleteRequested",
            format!("{machine} goes first on the next scale-down"),
        );
        db::events::record(&mut tx, &ev, now).await?;
        tx.commit().await?;
        self.wake.pool(&found.id);
        Ok(PoolMachine { desired_image, machine: marked })
    }

    /// Removes a chosen machine: marks it and lowers `replicas` by one, in
    /// one transaction. For a machine already marked (a repeated call)
    /// nothing changes.
    pub async fn remove(&self, access: &Access, name: &str, machine: &str) -> Result<PoolMachine, PoolError> {
        let found = self.pool(access, Action::OPERATE, name).await?;
        let id = &found.id;
        let now = crate::clock::wall();
        let mut tx = self.db.begin_write().await?;
        let (marked, pool) = match db::machines::mark_if_unmarked(&mut tx, id, machine, now).await? {
            Some(marked) => {
                let Some(pool) = db::pools::decrement_replicas(&mut tx, id, now).await? else {
                    return Err(PoolError::Conflict(format!(
                        "pool {name:?} is being deleted or has zero replicas; there is nothing to scale down"
                    )));
                };
                let message = format!("{machine} removed on request; replicas lowered to {}", pool.spec.replicas());
                let ev = NewEvent::pool(id, EventType::Normal, "MachineRemovalRequested", message);
                db::events::record(&mut tx, &ev, now).await?;
                tx.commit().await?;
                (marked, pool)
            }
            None => {
                drop(tx);
                // Marked before (a repeated call), or missing.
                let marked = db::machines::get(self.db.read(), id, machine)
                    .await?
                    .ok_or_else(|| Self::missing(name, machine))?;
                (marked, found.clone())
            }
        };
        self.wake.pool(id);
        Ok(PoolMachine { desired_image: pool.spec.desired_image(), machine: marked })
    }
}
