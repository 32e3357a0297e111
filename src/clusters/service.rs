//! The clusters service: what the API asks of registered clusters. A
//! cluster belongs to a namespace: it is looked up in the request's, and
//! passed to the authorizer before it is shown, probed or changed.

use chrono::Utc;

use super::connect::{ConnectError, connect};
use super::input::NewCluster;
use super::probe::{ClusterStatus, probe};
use crate::db::clusters::{ClusterRecord, Deleted};
use crate::db::page::{Page, PageRequest};
use crate::db::{self, Db};
use crate::domain::ValidationErrors;
use crate::domain::object::{ClusterRef, Namespace};
use crate::domain::server_url::check_server_url;
use crate::identity::{Access, Action, Target};
use crate::k8s::{ClusterApi, Credentials, RetryPolicy};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no cluster named {0:?}")]
    NotFound(String),
    #[error("no namespace named {0:?}")]
    NamespaceNotFound(String),
    /// The authorizer's refusal.
    #[error(transparent)]
    Denied(#[from] crate::identity::Denied),
    #[error("cluster {0:?} already exists")]
    Exists(String),
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("upgrade job {job} is active on cluster {cluster:?}; cancel it or wait for it to end (/v1/upgrades/{job})")]
    Busy { cluster: String, job: i64 },
    #[error("cluster {cluster:?} is used by pools {}; delete them, or patch their `cluster`, first", pools.join(", "))]
    InUse { cluster: String, pools: Vec<String> },
    /// The stored credentials cannot be used (503: the cluster, not the request).
    #[error("cluster {cluster:?} cannot be reached with its credentials: {why}")]
    Unusable { cluster: String, why: String },
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

impl From<ConnectError> for ClusterError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::NotRegistered(name) => Self::NotFound(name),
            ConnectError::Unusable { cluster, source } => Self::Unusable { cluster, why: source.to_string() },
            ConnectError::Store(e) => Self::Store(e),
        }
    }
}

/// A registration that passed every rule, ready to store.
pub struct Prepared {
    pub id: ClusterRef,
    /// The API server the credentials reach (shown to viewers).
    pub server: String,
    pub credentials: Credentials,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("id", &self.id).field("server", &self.server).finish_non_exhaustive()
    }
}

impl Prepared {
    /// A fingerprint of the credentials, comparable with
    /// [`Clusters::credentials_fingerprint`].
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.credentials)
    }
}

/// SHA-256 of the credentials' stored document, hex.
fn fingerprint(credentials: &Credentials) -> String {
    use sha2::{Digest, Sha256};
    let document = serde_json::to_vec(credentials).unwrap_or_default();
    Sha256::digest(&document).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone)]
pub struct Clusters {
    db: Db,
    /// How calls to a cluster are tried: `tries` is the caller's.
    calls: RetryPolicy,
}

impl Clusters {
    pub fn new(db: Db, calls: RetryPolicy) -> Self {
        Self { db, calls }
    }

    /// A client of the cluster, trying each call `tries` times.
    pub async fn connect(&self, cluster: &ClusterRef, tries: u32) -> Result<ClusterApi, ClusterError> {
        Ok(connect(self.db.read(), cluster, RetryPolicy { tries, ..self.calls }).await?)
    }

    /// The request's namespace exists and the caller sees it.
    async fn namespace_exists(&self, access: &Access) -> Result<(), ClusterError> {
        let found = db::namespaces::get(self.db.read(), &access.namespace).await?;
        access.may(Action::READ, &Target::namespace(&access.namespace))?;
        found.map(drop).ok_or_else(|| ClusterError::NamespaceNotFound(access.namespace.as_str().to_owned()))
    }

    /// The cluster `name` of the request's namespace, if the caller may do
    /// `action` to it (looked up first, so that one the caller may not see
    /// answers as a missing one, at the same cost).
    pub async fn get(&self, access: &Access, action: Action, name: &str) -> Result<ClusterRecord, ClusterError> {
        let id = ClusterRef::new(access.namespace.clone(), name);
        let found = db::clusters::get(self.db.read(), &id).await?;
        access.may(action, &target(&id))?;
        found.ok_or_else(|| ClusterError::NotFound(name.to_owned()))
    }

    /// Registers a cluster in the request's namespace once its credentials
    /// check out (they parse, every value can be sent, a client can be
    /// built; no network is used).
    #[tracing::instrument(name = "clusters.register", skip_all)]
    pub async fn register(&self, access: &Access, input: NewCluster) -> Result<ClusterRecord, ClusterError> {
        self.namespace_exists(access).await?;
        access.may(Action::CHANGE, &Target::in_namespace(&access.namespace, "cluster", input.name.as_str()))?;
        let prepared = self.prepare(&access.namespace, input).await?;
        let mut tx = self.db.begin_write().await?;
        let record = self.insert_in(&mut tx, &prepared, crate::clock::wall()).await?;
        tx.commit().await?;
        Ok(record)
    }

    /// A registration whose every rule passed: its name, its credentials
    /// (they parse, every value can be sent, a client can be built) and
    /// the server they reach, which may carry no credential.
    pub async fn prepare(&self, namespace: &Namespace, input: NewCluster) -> Result<Prepared, ClusterError> {
        let (name, credentials) = input.parse().map_err(ClusterError::Invalid)?;
        let server = credentials
            .validate(self.calls.call_timeout)
            .await
            .map_err(|e| ClusterError::Invalid(ValidationErrors::single(e.field, "credentials", e.message)))?;
        // The URL is shown to viewers and logged: it may carry no credential.
        let field = if credentials.kind() == "token" { "server" } else { "kubeconfig" };
        check_server_url(&server)
            .map_err(|e| ClusterError::Invalid(ValidationErrors::single(field, "server_url_credentials", e)))?;
        Ok(Prepared { id: ClusterRef::new(namespace.clone(), name), server, credentials })
    }

    /// Stores a prepared registration in the caller's transaction.
    pub async fn insert_in(
        &self,
        tx: &mut db::WriteTx,
        p: &Prepared,
        now: chrono::DateTime<Utc>,
    ) -> Result<ClusterRecord, ClusterError> {
        let record = match db::clusters::insert(tx, &p.id, &p.server, &p.credentials, now).await {
            Ok(r) => r,
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(ClusterError::Exists(p.id.name.clone()));
            }
            Err(e) if db::namespaces::is_in_use(&e) => {
                return Err(ClusterError::NamespaceNotFound(p.id.namespace.as_str().to_owned()));
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(cluster = %p.id, server = %p.server, auth = p.credentials.kind(), "cluster registered");
        Ok(record)
    }

    /// Replaces a cluster's server and credentials in the caller's
    /// transaction (a credential rotation); jobs and drains use them from
    /// their next call on.
    pub async fn update_in(
        &self,
        tx: &mut db::WriteTx,
        p: &Prepared,
        now: chrono::DateTime<Utc>,
    ) -> Result<ClusterRecord, ClusterError> {
        let record = db::clusters::update(tx, &p.id, &p.server, &p.credentials, now)
            .await?
            .ok_or_else(|| ClusterError::NotFound(p.id.name.clone()))?;
        tracing::info!(cluster = %p.id, server = %p.server, auth = p.credentials.kind(), "cluster credentials replaced");
        Ok(record)
    }

    /// Deletes a cluster in the caller's transaction, by the rules of
    /// [`Self::delete`].
    pub async fn delete_in(&self, tx: &mut db::WriteTx, cluster: &ClusterRef) -> Result<(), ClusterError> {
        deleted(cluster, db::clusters::delete_if_idle_in(tx, cluster).await?)
    }

    /// A fingerprint of a cluster's stored credentials (SHA-256 of their
    /// document): tells whether a registration would change them, without
    /// showing them. `None` when the cluster is not registered.
    pub async fn credentials_fingerprint(&self, cluster: &ClusterRef) -> Result<Option<String>, ClusterError> {
        match db::clusters::credentials(self.db.read(), cluster).await? {
            None => Ok(None),
            Some(Ok(credentials)) => Ok(Some(fingerprint(&credentials))),
            // Unreadable credentials differ from any that can be given.
            Some(Err(_)) => Ok(Some("unreadable".into())),
        }
    }

    /// The id of the upgrade job active on the cluster, if one is.
    pub async fn active_job(&self, cluster: &ClusterRef) -> Result<Option<i64>, ClusterError> {
        Ok(db::upgrades::active_for_cluster(self.db.read(), cluster).await?)
    }

    /// A page of the clusters of the request's namespace, in name order.
    pub async fn list(&self, access: &Access, req: &PageRequest) -> Result<Page<ClusterRecord>, ClusterError> {
        self.namespace_exists(access).await?;
        let rows = db::clusters::list(self.db.read(), &access.namespace, req.after.as_deref(), req.fetch()).await?;
        Ok(Page::from_rows(rows, req.limit, |c| c.name.clone()))
    }

    /// Every cluster of `namespace`, in name order (an apply's world).
    pub async fn all(&self, namespace: &Namespace) -> Result<Vec<ClusterRecord>, ClusterError> {
        const PAGE: u32 = 500;
        let mut out: Vec<ClusterRecord> = Vec::new();
        loop {
            let after = out.last().map(|c| c.name.clone());
            let page = db::clusters::list(self.db.read(), namespace, after.as_deref(), PAGE).await?;
            let done = page.len() < PAGE as usize;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// Forgets a cluster and its job history; refused while a job runs on
    /// it or a pool names it.
    #[tracing::instrument(name = "clusters.delete", skip_all)]
    pub async fn delete(&self, access: &Access, name: &str) -> Result<(), ClusterError> {
        let found = self.get(access, Action::CHANGE, name).await?;
        let id = ClusterRef::new(found.namespace, found.name);
        deleted(&id, db::clusters::delete_if_idle(&self.db, &id).await?)
    }

    /// Probes the cluster's control plane (each call tried once).
    pub async fn status(&self, access: &Access, name: &str) -> Result<ClusterStatus, ClusterError> {
        let found = self.get(access, Action::READ, name).await?;
        let api = self.connect(&ClusterRef::new(found.namespace, found.name.clone()), 1).await?;
        Ok(probe(&api, found.name).await)
    }
}

/// The authorizer's view of a cluster.
pub fn target(cluster: &ClusterRef) -> Target {
    Target::in_namespace(&cluster.namespace, "cluster", &cluster.name)
}

/// What a delete of `cluster` came to.
fn deleted(cluster: &ClusterRef, outcome: Deleted) -> Result<(), ClusterError> {
    let name = || cluster.name.clone();
    match outcome {
        Deleted::Yes => Ok(()),
        Deleted::Missing => Err(ClusterError::NotFound(name())),
        Deleted::Busy(job) => Err(ClusterError::Busy { cluster: name(), job }),
        Deleted::InUse(pools) => Err(ClusterError::InUse { cluster: name(), pools }),
    }
}
