//! The Kubernetes operations drover performs, on one cluster, in
//! `kube-system`. Every operation is bounded in time and retried, with
//! backoff, while it fails in a way that may pass (5xx, 429, update
//! conflicts, transport errors, timeouts); "already exists" and "not found"
//! are turned into the outcomes an idempotent caller wants.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::http::Request;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};

use crate::domain::upgrade::NAMESPACE;

/// The field manager of drover's server-side applies.
pub const FIELD_MANAGER: &str = "drover";

/// What [`ClusterApi::delete_daemonset_unless`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// There is no such DaemonSet (any more).
    Gone,
    /// The delete is accepted (or was already under way); with foreground
    /// propagation the object stays until its pods are gone.
    Deleting,
    /// Left in place, for this reason.
    Kept(String),
}

/// How hard each operation tries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries per operation, the first included (kubeadm's: 10).
    pub tries: u32,
    /// Wait before the first retry; doubles up to 16 times this.
    pub backoff: Duration,
    /// Longest time one request may take.
    pub call_timeout: Duration,
}

impl RetryPolicy {
    /// One policy for every Kubernetes call drover makes: upgrade steps and
    /// node drains alike.
    pub fn from_config(c: &crate::config::ServeConfig) -> Self {
        Self { tries: c.upgrade_api_tries, backoff: c.upgrade_retry_backoff, call_timeout: c.kube_request_timeout }
    }

    /// The wait before the `retry`-th retry: doubling up to 16 times the
    /// backoff, jittered so that retries against a struggling server spread out.
    fn delay(&self, retry: u32) -> Duration {
        crate::domain::backoff::jittered(self.backoff, retry, self.backoff.saturating_mul(16))
    }
}

/// Why one try of an operation failed.
#[derive(Debug)]
pub enum Failure {
    Kube(kube::Error),
    Timeout(Duration),
    /// Not worth another try (e.g. the object cannot be upgraded as it is).
    Fatal(String),
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Self::Kube(e)
    }
}

impl Failure {
    fn retryable(&self) -> bool {
        match self {
            Self::Kube(kube::Error::Api(s)) => s.code >= 500 || s.code == 429 || s.is_conflict(),
            Self::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            Self::Kube(_) | Self::Fatal(_) => false,
            Self::Timeout(_) => true,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Kube(kube::Error::Api(s)) if s.message.is_empty() => format!("{} {}", s.code, s.reason),
            Self::Kube(kube::Error::Api(s)) => format!("{} {}: {}", s.code, s.reason, s.message),
            Self::Kube(e) => crate::error::error_chain(e),
            Self::Timeout(d) => format!("no answer within {d:?}"),
            Self::Fatal(m) => m.clone(),
        }
    }
}

/// A call to the Kubernetes API: counted by its [`kind`](Self::kind),
/// told in errors with its object (`evict pod kube-system/etcd-0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeOp {
    ListPods { selector: String },
    ListPodsOnNode { node: String },
    GetPod { name: String },
    EvictPod { namespace: String, name: String },
    CordonNode { node: String },
    DeleteNode { node: String },
    GetDaemonSet { name: String },
    ApplyDaemonSet { name: String },
    UpdateDaemonSet { name: String },
    DeleteDaemonSet { name: String },
    Version,
}

impl KubeOp {
    /// The metric label: one per kind of call, never a name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ListPods { .. } => "list pods",
            Self::ListPodsOnNode { .. } => "list pods on node",
            Self::GetPod { .. } => "get pod",
            Self::EvictPod { .. } => "evict pod",
            Self::CordonNode { .. } => "cordon node",
            Self::DeleteNode { .. } => "delete node",
            Self::GetDaemonSet { .. } => "get daemonset",
            Self::ApplyDaemonSet { .. } => "apply daemonset",
            Self::UpdateDaemonSet { .. } => "update daemonset",
            Self::DeleteDaemonSet { .. } => "delete daemonset",
            Self::Version => "get version",
        }
    }
}

impl std::fmt::Display for KubeOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.kind();
        match self {
            Self::ListPods { selector } => write!(f, "{kind} {selector}"),
            Self::ListPodsOnNode { node } | Self::CordonNode { node } | Self::DeleteNode { node } => {
                write!(f, "{kind} {node}")
            }
            Self::EvictPod { namespace, name } => write!(f, "{kind} {namespace}/{name}"),
            Self::GetPod { name }
            | Self::GetDaemonSet { name }
            | Self::ApplyDaemonSet { name }
            | Self::UpdateDaemonSet { name }
            | Self::DeleteDaemonSet { name } => write!(f, "{kind} {name}"),
            Self::Version => f.write_str("get /version"),
        }
    }
}

/// An operation that failed for good.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} failed after {tries} tries: {reason}")]
pub struct CallError {
    pub op: KubeOp,
    pub tries: u32,
    pub reason: String,
}

pub(super) fn is_status(e: &kube::Error, check: impl Fn(&kube::core::Status) -> bool) -> bool {
    matches!(e, kube::Error::Api(s) if check(s))
}

/// One cluster's API, for the objects of the control plane.
pub struct ClusterApi {
    pub(super) client: kube::Client,
    daemonsets: Api<DaemonSet>,
    pods: Api<Pod>,
    policy: RetryPolicy,
    /// Tries that failed and were repeated, since the last `take_retries`:
    /// the runner stores it with the step.
    retries: AtomicU32,
    /// Counts every try, when the caller keeps metrics.
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// Asked before every try: why the call must not be sent, if it must
    /// not. An upgrade job's lease (with several replicas): a replica that
    /// lost it, paused or cut off past its deadline, sends nothing more.
    gate: Option<Gate>,
}

/// Why a call must not be sent now, if it must not.
pub type Gate = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl ClusterApi {
    pub fn new(client: kube::Client, policy: RetryPolicy) -> Self {
        Self {
            daemonsets: Api::namespaced(client.clone(), NAMESPACE),
            pods: Api::namespaced(client.clone(), NAMESPACE),
            client,
            policy,
            retries: AtomicU32::new(0),
            metrics: None,
            gate: None,
        }
    }

    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn take_retries(&self) -> u32 {
        self.retries.swap(0, Ordering::Relaxed)
    }

    /// Runs `f` until it succeeds, fails for good, or runs out of tries,
    /// in one span (a child of the upgrade step that asked) that says the
    /// operation, the tries and the outcome.
    pub(super) async fn call<T, F, Fut>(&self, op: KubeOp, f: F) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let span = tracing::info_span!(
            "kube",
            otel.name = "kubernetes call",
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            k8s.operation = op.kind(),
            k8s.call = %op,
            tries = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = tracing::Instrument::instrument(self.call_with_retries(op, f), span.clone()).await;
        match &result {
            Ok(_) => span.record("outcome", "ok"),
            Err(e) => {
                span.record("tries", i64::from(e.tries));
                span.record("otel.status_code", "ERROR");
                span.record("outcome", "error")
            }
        };
        result
    }

    async fn call_with_retries<T, F, Fut>(&self, op: KubeOp, mut f: F) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut tries = 0;
        loop {
            if let Some(why) = self.gate.as_ref().and_then(|g| g()) {
                return Err(CallError { op, tries, reason: format!("not sent: {why}") });
            }
            tries += 1;
            let outcome = match tokio::time::timeout(self.policy.call_timeout, f()).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Timeout(self.policy.call_timeout)),
            };
            if let Some(m) = &self.metrics {
                m.kube_call(op.kind(), outcome.is_ok());
            }
            let failure = match outcome {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !failure.retryable() || tries >= self.policy.tries {
                return Err(CallError { op, tries, reason: failure.describe() });
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            let delay = self.policy.delay(tries);
            tracing::warn!(%op, tries, error = %failure.describe(), ?delay, "Kubernetes API call failed; trying again");
            tokio::time::sleep(delay).await;
        }
    }

    pub async fn list_pods(&self, selector: &str) -> Result<Vec<Pod>, CallError> {
        let lp = &ListParams::default().labels(selector);
        let pods = &self.pods;
        self.call(KubeOp::ListPods { selector: selector.to_owned() }, || async move { Ok(pods.list(lp).await?.items) })
            .await
    }

    pub async fn pod_exists(&self, name: &str) -> Result<bool, CallError> {
        let pods = &self.pods;
        self.call(KubeOp::GetPod { name: name.to_owned() }, || async move { Ok(pods.get_opt(name).await?.is_some()) })
            .await
    }

    pub async fn get_daemonset(&self, name: &str) -> Result<Option<DaemonSet>, CallError> {
        let daemonsets = &self.daemonsets;
        self.call(KubeOp::GetDaemonSet { name: name.to_owned() }, || async move { Ok(daemonsets.get_opt(name).await?) })
            .await
    }

    /// Creates or updates `ds` by server-side apply, as field manager
    /// [`FIELD_MANAGER`], taking over fields another manager set (force):
    /// the object ends up exactly as given, in one idempotent request.
    pub async fn apply_daemonset(&self, ds: &DaemonSet) -> Result<(), CallError> {
        let name = ds.metadata.name.as_deref().unwrap_or_default();
        let (pp, daemonsets) = (&PatchParams::apply(FIELD_MANAGER).force(), &self.daemonsets);
        let patch = &Patch::Apply(ds);
        self.call(KubeOp::ApplyDaemonSet { name: name.to_owned() }, || async move {
            daemonsets.patch(name, pp, patch).await?;
            Ok(())
        })
        .await
    }

    /// Reads the DaemonSet, derives the new object from it with `change`
    /// (`None`: nothing to write) and replaces it; a conflict reads again.
    pub async fn update_daemonset(
        &self,
        name: &str,
        change: impl Fn(&DaemonSet) -> Result<Option<DaemonSet>, String>,
    ) -> Result<(), CallError> {
        let (pp, daemonsets, change) = (&PostParams::default(), &self.daemonsets, &change);
        self.call(KubeOp::UpdateDaemonSet { name: name.to_owned() }, || async move {
            let current = daemonsets.get(name).await?;
            if let Some(new) = change(&current).map_err(Failure::Fatal)? {
                daemonsets.replace(name, pp, &new).await?;
            }
            Ok(())
        })
        .await
    }

    /// Deletes the DaemonSet and, first, its pods (foreground propagation),
    /// if `keep` finds no reason to keep the object as it is read now. The
    /// delete is conditional on that very version (uid and
    /// resourceVersion), so an object changed after the look is read and
    /// judged again, never deleted unseen. Already gone counts as done.
    pub async fn delete_daemonset_unless(
        &self,
        name: &str,
        keep: impl Fn(&DaemonSet) -> Option<String>,
    ) -> Result<Deletion, CallError> {
        let (daemonsets, keep) = (&self.daemonsets, &keep);
        self.call(KubeOp::DeleteDaemonSet { name: name.to_owned() }, || async move {
            let Some(current) = daemonsets.get_opt(name).await? else { return Ok(Deletion::Gone) };
            if let Some(why) = keep(&current) {
                return Ok(Deletion::Kept(why));
            }
            if current.metadata.deletion_timestamp.is_some() {
                return Ok(Deletion::Deleting);
            }
            let mut dp = DeleteParams::foreground();
            dp.preconditions = Some(Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            });
            match daemonsets.delete(name, &dp).await {
                Ok(_) => Ok(Deletion::Deleting),
                Err(e) if is_status(&e, |s| s.is_not_found()) => Ok(Deletion::Gone),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// One look at `/healthz`, without retries: the callers poll it, and a
    /// failure there means "not healthy yet".
    pub async fn healthz_once(&self) -> Result<(), String> {
        let req = Request::get("/healthz").body(Vec::new()).map_err(|e| e.to_string())?;
        match tokio::time::timeout(self.policy.call_timeout, self.client.request_text(req)).await {
            Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
            Ok(Ok(body)) => Err(format!("/healthz answered {:?}", body.chars().take(100).collect::<String>())),
            Ok(Err(e)) => Err(Failure::Kube(e).describe()),
            Err(_) => Err(Failure::Timeout(self.policy.call_timeout).describe()),
        }
    }

    /// The API server's `/version`.
    pub async fn version(&self) -> Result<Info, CallError> {
        let client = &self.client;
        self.call(KubeOp::Version, || async move { Ok(client.apiserver_version().await?) }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_told_with_its_object_and_counted_by_its_kind_alone() {
        let evict = KubeOp::EvictPod { namespace: "kube-system".into(), name: "etcd-0".into() };
        assert_eq!(evict.to_string(), "evict pod kube-system/etcd-0");
        assert_eq!(evict.kind(), "evict pod");
        let apply = KubeOp::ApplyDaemonSet { name: "temp-upgrade-self-hosted-kube-apiserver".into() };
        assert_eq!(apply.kind(), "apply daemonset", "once counted as `other`");
        assert_eq!(KubeOp::Version.to_string(), "get /version");
        assert_eq!(KubeOp::ListPodsOnNode { node: "n1".into() }.to_string(), "list pods on node n1");
    }
}
