//! From a cluster's stored credentials to a client of its API.

use crate::db::exec::Exec;
use crate::domain::object::ClusterRef;

use crate::db;
use crate::k8s::{ClusterApi, CredentialError, RetryPolicy};

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cluster {0:?} is not registered")]
    NotRegistered(String),
    /// The stored credentials do not read, or no client can be built from
    /// them; the message names the field, never a secret.
    #[error("the credentials of cluster {cluster:?} cannot be used: {source}")]
    Unusable {
        cluster: String,
        #[source]
        source: CredentialError,
    },
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

/// A client of cluster `name`'s API with its stored credentials, retrying
/// each call by `policy`. `readers` are the store's (the API's or the
/// workers', as the caller is).
pub async fn connect(readers: Exec<'_>, name: &ClusterRef, policy: RetryPolicy) -> Result<ClusterApi, ConnectError> {
    let unusable = |source| ConnectError::Unusable { cluster: name.name.clone(), source };
    let credentials = db::clusters::credentials(readers, name)
        .await?
        .ok_or_else(|| ConnectError::NotRegistered(name.name.clone()))?
        .map_err(unusable)?;
    let client = credentials.client(policy.call_timeout).await.map_err(unusable)?;
    Ok(ClusterApi::new(client, policy))
}

/// Whether cluster `name`'s stored credentials can be used, without
/// building a client: what a pool of the cluster says on every pass.
pub async fn check(readers: Exec<'_>, name: &ClusterRef, timeout: std::time::Duration) -> Result<(), ConnectError> {
    let unusable = |source| ConnectError::Unusable { cluster: name.name.clone(), source };
    let credentials = db::clusters::credentials(readers, name)
        .await?
        .ok_or_else(|| ConnectError::NotRegistered(name.name.clone()))?
        .map_err(unusable)?;
    credentials.config(timeout).await.map_err(unusable)?;
    Ok(())
}
