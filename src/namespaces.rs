//! The namespaces service: create, list, read, fence and delete the
//! namespaces pools, clusters, upgrade jobs, apply sets and tokens belong
//! to.
//!
//! A namespace is seen by whoever holds a role in it, and created, changed
//! or deleted only by a `*` admin (a namespace's admin manages what is in
//! it, not the namespace). `default` always exists. A namespace that
//! still holds anything cannot be deleted: the store's foreign keys refuse
//! it even when a create races the delete.

use std::collections::BTreeMap;

use crate::db::namespaces::NamespaceRecord;
use crate::db::{self, Db};
use crate::domain::ValidationErrors;
use crate::domain::object::Namespace;
use crate::identity::{Access, Action, Denied, Target};
use crate::pools::Pools;

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("namespace {0:?} already exists")]
    Exists(String),
    #[error("namespace {0:?} does not exist")]
    NotFound(String),
    /// It still holds something (or it is `default`).
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Denied(#[from] Denied),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

#[derive(Clone)]
pub struct Namespaces {
    db: Db,
    pools: Pools,
}

impl Namespaces {
    pub fn new(db: Db, pools: Pools) -> Self {
        Self { db, pools }
    }

    #[tracing::instrument(name = "namespaces.create", skip_all)]
    pub async fn create(
        &self,
        access: &Access,
        name: Namespace,
        engine_selector: BTreeMap<String, String>,
    ) -> Result<NamespaceRecord, NamespaceError> {
        access.may(Action::CHANGE, &Target::namespace(&name))?;
        check_selector(&engine_selector)?;
        let mut tx = self.db.begin_write().await?;
        let record = match db::namespaces::insert(&mut tx, &name, &engine_selector, crate::clock::wall()).await {
            Ok(record) => record,
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                return Err(NamespaceError::Exists(name.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        tx.commit().await?;
        tracing::info!(namespace = %name, by = access.caller_name(), "namespace created");
        Ok(record)
    }

    /// The namespaces the caller has a role in (every one for a `*` grant).
    pub async fn list(&self, access: &Access) -> Result<Vec<NamespaceRecord>, NamespaceError> {
        let mut all = db::namespaces::all(self.db.read()).await?;
        if let Some(visible) = access.visible_namespaces() {
            all.retain(|n| visible.contains(&n.name));
        }
        Ok(all)
    }

    pub async fn get(&self, access: &Access, name: &Namespace) -> Result<NamespaceRecord, NamespaceError> {
        let found = db::namespaces::get(self.db.read(), name).await?;
        access.may(Action::READ, &Target::namespace(name))?;
        found.ok_or_else(|| NamespaceError::NotFound(name.to_string()))
    }

    /// Fences the namespace's pools to the engines whose labels match
    /// `engine_selector` (empty: any engine), and wakes them to move.
    #[tracing::instrument(name = "namespaces.set_engine_selector", skip_all)]
    pub async fn set_engine_selector(
        &self,
        access: &Access,
        name: &Namespace,
        engine_selector: BTreeMap<String, String>,
    ) -> Result<NamespaceRecord, NamespaceError> {
        self.get(access, name).await?;
        access.may(Action::CHANGE, &Target::namespace(name))?;
        check_selector(&engine_selector)?;
        let mut tx = self.db.begin_write().await?;
        let record = db::namespaces::set_engine_selector(&mut tx, name, &engine_selector, crate::clock::wall())
            .await?
            .ok_or_else(|| NamespaceError::NotFound(name.to_string()))?;
        tx.commit().await?;
        tracing::info!(namespace = %name, ?engine_selector, by = access.caller_name(), "namespace fenced");
        match self.pools.all(name).await {
            Ok(pools) => self.pools.woken(pools.iter().map(|p| &p.id)),
            // Their next resync places them by the new selector anyway.
            Err(e) => tracing::warn!(namespace = %name, error = %e, "could not wake the namespace's pools"),
        }
        Ok(record)
    }

    /// Deletes an empty namespace; `default` always exists.
    #[tracing::instrument(name = "namespaces.delete", skip_all)]
    pub async fn delete(&self, access: &Access, name: &Namespace) -> Result<(), NamespaceError> {
        self.get(access, name).await?;
        access.may(Action::CHANGE, &Target::namespace(name))?;
        if name.is_default() {
            return Err(NamespaceError::Busy("namespace \"default\" always exists".into()));
        }
        let held = db::namespaces::holdings(self.db.read(), name).await?;
        if !held.is_empty() {
            return Err(busy(name, &held));
        }
        let mut tx = self.db.begin_write().await?;
        match db::namespaces::delete(&mut tx, name).await {
            Ok(true) => {}
            Ok(false) => return Err(NamespaceError::NotFound(name.to_string())),
            // Something was created in it since it was counted.
            Err(e) if db::namespaces::is_in_use(&e) => {
                drop(tx);
                let held = db::namespaces::holdings(self.db.read(), name).await?;
                return Err(busy(name, &held));
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit().await?;
        tracing::info!(namespace = %name, by = access.caller_name(), "namespace deleted");
        Ok(())
    }
}

fn busy(name: &Namespace, held: &[(&str, i64)]) -> NamespaceError {
    let what: Vec<String> = held.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
    NamespaceError::Busy(format!(
        "namespace {:?} still holds {}; delete them first",
        name.as_str(),
        if what.is_empty() { "something".to_owned() } else { what.join(", ") }
    ))
}

fn check_selector(selector: &BTreeMap<String, String>) -> Result<(), NamespaceError> {
    let mut errs = ValidationErrors::default();
    crate::domain::labels::check(selector, "engine_selector", &mut errs);
    errs.into_result(()).map_err(NamespaceError::Invalid)
}
