//! Reaching a registered cluster with its stored credentials, for the
//! handlers that inspect one (cluster status, upgrade plans).

use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::k8s::{ClusterApi, RetryPolicy};
use crate::state::AppState;

/// A client for a registered cluster, trying each call `tries` times.
pub async fn connect(state: &AppState, name: &str, tries: u32) -> ApiResult<ClusterApi> {
    let unusable = |e| ApiError::Unavailable(format!("cluster {name:?} cannot be reached with its credentials: {e}"));
    let creds = db::clusters::credentials(state.db.read(), name)
        .await?
        .ok_or_else(|| ApiError::not_found("cluster", name))?
        .map_err(unusable)?;
    let timeout = state.config.kube_request_timeout;
    let client = creds.client(timeout).await.map_err(unusable)?;
    let policy = RetryPolicy { tries, backoff: state.config.upgrade_retry_backoff, call_timeout: timeout };
    Ok(ClusterApi::new(client, policy))
}
