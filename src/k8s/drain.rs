//! Taking a machine's node out of its cluster before the machine goes
//! (docs/drain.md), as `kubectl drain --ignore-daemonsets`
//! does: mark the node unschedulable, evict every pod on it through the
//! Eviction API except those a DaemonSet or the kubelet keeps there, wait
//! until they are gone, and, once the container is gone, delete the Node.
//!
//! Pods are only ever evicted, never deleted, so PodDisruptionBudgets hold:
//! an eviction a budget refuses (429) is asked again at the next look, until
//! the drain's deadline. The whole cordon and drain shares one deadline, so
//! an unreachable cluster fails the drain in bounded time too.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use tokio::time::Instant;

use super::credentials::CredentialError;
use super::ops::{CallError, ClusterApi, KubeOp, RetryPolicy, is_status};

/// The annotation the kubelet puts on the API's copy of a static pod; the
/// API cannot remove such a pod, it goes with the machine.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// At most this many pods are named in a timeout message.
const NAMED_PODS: usize = 5;

#[derive(Debug, Clone, Copy)]
pub struct DrainSettings {
    /// Longest the cordon and drain of one node may take, together.
    pub timeout: Duration,
    /// Pause between looks at the pods left on the node.
    pub poll_interval: Duration,
}

/// How the reconciler takes a pool's machine out of its cluster: the
/// drain, and the API calls around it.
#[derive(Debug, Clone, Copy)]
pub struct NodeSettings {
    pub drain: DrainSettings,
    pub retry: RetryPolicy,
}

impl NodeSettings {
    /// The drain settings, and the same API call policy as upgrade jobs.
    pub fn from_config(c: &crate::config::ServeConfig) -> Self {
        Self {
            drain: DrainSettings { timeout: c.drain_timeout, poll_interval: c.drain_poll_interval },
            retry: RetryPolicy::from_config(c),
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Pods whose eviction the API accepted.
    pub evicted: usize,
    /// DaemonSet and mirror pods left on the node; they go with the machine.
    pub kept: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("cluster {0:?} is not registered")]
    UnknownCluster(String),
    #[error("the cluster's credentials cannot be used")]
    Credentials(#[source] CredentialError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("{step} of node {node} did not finish within {timeout:?}{left}")]
    Timeout { step: &'static str, node: String, timeout: Duration, left: String },
}

/// What a drain does with one pod on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    Evict,
    /// Already being deleted (evicted earlier, or by someone else): wait.
    AwaitDeletion,
    /// Its DaemonSet would put it back at once, and it tolerates the cordon;
    /// `--ignore-daemonsets` leaves it, and so do we.
    KeepDaemonSet,
    /// The mirror of a static pod, which the API cannot remove.
    KeepMirror,
}

/// Which pods a drain evicts; pure, so that it is tested without a cluster.
pub fn pod_action(pod: &Pod) -> PodAction {
    let meta = &pod.metadata;
    if meta.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)) {
        PodAction::KeepMirror
    } else if meta.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "DaemonSet") {
        PodAction::KeepDaemonSet
    } else if meta.deletion_timestamp.is_some() {
        PodAction::AwaitDeletion
    } else {
        PodAction::Evict
    }
}

/// What the API said to one eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted, or the pod was already gone.
    Accepted,
    /// Refused for now (429), typically by a PodDisruptionBudget; the message says why.
    Refused(String),
}

impl ClusterApi {
    /// Marks the node unschedulable; `false` when the cluster has no such node.
    pub async fn cordon(&self, node: &str) -> Result<bool, CallError> {
        let nodes: &Api<Node> = &Api::all(self.client.clone());
        let (pp, patch) =
            (&PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})));
        self.call(KubeOp::CordonNode { node: node.to_owned() }, || async move {
            match nodes.patch(node, pp, patch).await {
                Ok(_) => Ok(true),
                Err(e) if is_status(&e, |s| s.is_not_found()) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Every pod bound to the node, in all namespaces.
    pub async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, CallError> {
        let pods: &Api<Pod> = &Api::all(self.client.clone());
        let lp = &ListParams::default().fields(&format!("spec.nodeName={node}"));
        self.call(KubeOp::ListPodsOnNode { node: node.to_owned() }, || async move { Ok(pods.list(lp).await?.items) })
            .await
    }

    /// Asks the API to evict a pod. A refusal (429) is an answer, not a
    /// failure to retry here: the drain asks again at its next look.
    pub async fn evict(&self, namespace: &str, name: &str) -> Result<Eviction, CallError> {
        let pods: &Api<Pod> = &Api::namespaced(self.client.clone(), namespace);
        let ep = &EvictParams::default();
        self.call(KubeOp::EvictPod { namespace: namespace.to_owned(), name: name.to_owned() }, || async move {
            match pods.evict(name, ep).await {
                Ok(_) => Ok(Eviction::Accepted),
                Err(e) if is_status(&e, |s| s.is_not_found()) => Ok(Eviction::Accepted),
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    Ok(Eviction::Refused(if s.message.is_empty() { s.reason.clone() } else { s.message.clone() }))
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Deletes the Node object; already gone counts as done.
    pub async fn delete_node(&self, node: &str) -> Result<(), CallError> {
        let nodes: &Api<Node> = &Api::all(self.client.clone());
        self.call(KubeOp::DeleteNode { node: node.to_owned() }, || async move {
            match nodes.delete(node, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(e) if is_status(&e, |s| s.is_not_found()) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }
}

/// One node's cordon and drain, under one deadline.
pub struct NodeDrain<'a> {
    api: &'a ClusterApi,
    node: &'a str,
    settings: DrainSettings,
    deadline: Instant,
}

impl<'a> NodeDrain<'a> {
    /// Starts the clock.
    pub fn new(api: &'a ClusterApi, node: &'a str, settings: DrainSettings) -> Self {
        Self { api, node, settings, deadline: Instant::now() + settings.timeout }
    }

    fn timeout(&self, step: &'static str, left: String) -> DrainError {
        DrainError::Timeout { step, node: self.node.to_owned(), timeout: self.settings.timeout, left }
    }

    /// Marks the node unschedulable; `false` when there is no such node.
    #[tracing::instrument(skip(self), fields(node = %self.node))]
    pub async fn cordon(&self) -> Result<bool, DrainError> {
        match tokio::time::timeout_at(self.deadline, self.api.cordon(self.node)).await {
            Ok(found) => Ok(found?),
            Err(_) => Err(self.timeout("cordon", String::new())),
        }
    }

    /// Evicts the pods that must go and waits until they are gone.
    #[tracing::instrument(skip(self), fields(node = %self.node))]
    pub async fn drain(&self) -> Result<Drained, DrainError> {
        let mut left = Vec::new();
        match tokio::time::timeout_at(self.deadline, self.evict_until_gone(&mut left)).await {
            Ok(result) => result,
            Err(_) => Err(self.timeout("drain", describe_left(&left))),
        }
    }

    /// Looks at the node's pods until none that must go is left; `left`
    /// says, at any moment, which are still there and why.
    async fn evict_until_gone(&self, left: &mut Vec<String>) -> Result<Drained, DrainError> {
        let mut evicted = BTreeSet::new();
        loop {
            let pods = self.api.pods_on_node(self.node).await?;
            left.clear();
            let mut kept = 0;
            for pod in &pods {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                match pod_action(pod) {
                    PodAction::KeepDaemonSet | PodAction::KeepMirror => kept += 1,
                    PodAction::AwaitDeletion => left.push(format!("{ns}/{name} (terminating)")),
                    PodAction::Evict => match self.api.evict(ns, name).await? {
                        Eviction::Accepted => {
                            evicted.insert(format!("{ns}/{name}"));
                            left.push(format!("{ns}/{name} (evicted)"));
                        }
                        Eviction::Refused(why) => left.push(format!("{ns}/{name} (eviction refused: {why})")),
                    },
                }
            }
            if left.is_empty() {
                return Ok(Drained { evicted: evicted.len(), kept });
            }
            tracing::debug!(pods = left.len(), "pods still on the node; looking again");
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }
}

fn describe_left(left: &[String]) -> String {
    match left.len() {
        0 => String::new(),
        n if n <= NAMED_PODS => format!("; {n} pod(s) left: {}", left.join(", ")),
        n => format!("; {n} pods left, among them {}", left[..NAMED_PODS].join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(meta: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta})).expect("pod JSON")
    }

    fn owned_by(kind: &str, controller: bool) -> serde_json::Value {
        json!({"name": "p", "namespace": "default", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "1", "controller": controller}]})
    }

    #[test]
    fn drain_evicts_plain_and_controller_owned_pods() {
        assert_eq!(pod_action(&pod(json!({"name": "bare", "namespace": "default"}))), PodAction::Evict);
        assert_eq!(pod_action(&pod(owned_by("ReplicaSet", true))), PodAction::Evict);
        assert_eq!(pod_action(&pod(owned_by("StatefulSet", true))), PodAction::Evict);
        assert_eq!(pod_action(&pod(owned_by("Job", true))), PodAction::Evict);
    }

    #[test]
    fn drain_keeps_daemonset_pods_as_ignore_daemonsets_does() {
        assert_eq!(pod_action(&pod(owned_by("DaemonSet", true))), PodAction::KeepDaemonSet);
        // Only the controlling owner counts, as in kubectl.
        assert_eq!(pod_action(&pod(owned_by("DaemonSet", false))), PodAction::Evict);
    }

    #[test]
    fn drain_keeps_mirror_pods_even_when_terminating() {
        let mirror = pod(json!({"name": "etcd-n", "namespace": "kube-system",
            "annotations": {"kubernetes.io/config.mirror": "abc"}, "deletionTimestamp": "2024-01-01T00:00:00Z"}));
        assert_eq!(pod_action(&mirror), PodAction::KeepMirror);
    }

    #[test]
    fn drain_waits_for_pods_already_being_deleted() {
        let going = pod(json!({"name": "p", "namespace": "default", "deletionTimestamp": "2024-01-01T00:00:00Z"}));
        assert_eq!(pod_action(&going), PodAction::AwaitDeletion);
    }

    #[test]
    fn timeout_messages_name_a_few_pods_at_most() {
        assert_eq!(describe_left(&[]), "");
        assert_eq!(describe_left(&["a/b (evicted)".into()]), "; 1 pod(s) left: a/b (evicted)");
        let many: Vec<String> = (0..8).map(|i| format!("ns/p{i}")).collect();
        let text = describe_left(&many);
        assert!(text.starts_with("; 8 pods left, among them ns/p0"), "{text}");
        assert!(!text.contains("ns/p5"), "{text}");
    }
}
