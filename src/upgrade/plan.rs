//! Pure construction of the objects an upgrade writes, the decisions the
//! runner takes from what it observes, and the dry-run plan: the temporary
//! DaemonSet, the upgraded and the restored real DaemonSet, what counts as
//! a pod being "up", where the real DaemonSet stands against the job, and
//! when the temporary copy may go. Only Kubernetes *types* are used here,
//! never a client, so all of it is unit-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::upgrade::{Component, JOB_ANNOTATION, Step, TEMP_LABEL};
use crate::k8s::images::component_container;
pub use crate::k8s::images::{daemonset_image, pod_image};

/// A DaemonSet that cannot be upgraded as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("DaemonSet {0} has no containers in its pod template")]
    NoContainers(String),
}

fn name_of(ds: &DaemonSet) -> String {
    ds.metadata.name.clone().unwrap_or_default()
}

/// The temporary copy of a component's DaemonSet, as kubeadm's self-hosted
/// upgrade builds it (docs/upgrades.md):
/// named `temp-upgrade-<name>`; its labels, selector and pod-template
/// labels all replaced by `temp-upgrade-component=<component>` so that its
/// pods are never mistaken for the real component's; metadata reduced to
/// name, namespace, labels and annotations (no resourceVersion, uid or
/// owner that would make the create fail or tie it to the original); and
/// no status, since it is a new object. It is annotated with the job that
/// made it, so that no other job ever removes it.
pub fn temp_daemonset(original: &DaemonSet, component: Component, job: i64) -> DaemonSet {
    let labels = BTreeMap::from([(TEMP_LABEL.to_owned(), component.as_str().to_owned())]);
    let mut annotations = original.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(JOB_ANNOTATION.to_owned(), job.to_string());
    let mut spec = original.spec.clone();
    spec.selector.match_labels = Some(labels.clone());
    // matchExpressions could still select the real pods: drop them.
    spec.selector.match_expressions = None;
    spec.template.metadata.get_or_insert_with(ObjectMeta::default).labels = Some(labels.clone());
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(format!("{}{}", crate::domain::upgrade::TEMP_PREFIX, name_of(original))),
            namespace: original.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// `current` with the component's container set to `image`. Everything
/// else, including the resourceVersion that makes the update conditional,
/// is kept.
pub fn with_image(current: &DaemonSet, component: Component, image: &str) -> Result<DaemonSet, PlanError> {
    let mut ds = current.clone();
    let pod = ds.spec.template.spec.as_mut().ok_or_else(|| PlanError::NoContainers(name_of(current)))?;
    let container =
        component_container(&mut pod.containers, component).ok_or_else(|| PlanError::NoContainers(name_of(current)))?;
    container.image = Some(image.to_owned());
    ds.status = None;
    Ok(ds)
}

/// `current` with the `saved` spec put back: current metadata (so the
/// update is conditional on what was just read), saved spec.
pub fn restored(current: &DaemonSet, saved: &DaemonSet) -> DaemonSet {
    DaemonSet { metadata: current.metadata.clone(), spec: saved.spec.clone(), status: None }
}

/// Whether the real DaemonSet already carries the saved pod template, so a
/// rollback has nothing to write.
pub fn has_template_of(current: &DaemonSet, saved: &DaemonSet) -> bool {
    current.spec.template == saved.spec.template
}

pub fn is_running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Pods are "up" when there is at least one, every one is Running, none is
/// `exclude` (the pod being replaced) and, when `image` is given, every one
/// runs it.
pub fn pods_up(pods: &[Pod], component: Component, exclude: Option<&str>, image: Option<&str>) -> bool {
    !pods.is_empty()
        && pods.iter().all(|p| {
            is_running(p)
                && (exclude.is_none() || p.metadata.name.as_deref() != exclude)
                && image.is_none_or(|img| pod_image(p, component).as_deref() == Some(img))
        })
}

/// Where the real DaemonSet stands against the job, as observed. Cancel
/// and rollback are decided from this, never from the stored step: after
/// a crash the stored step may lag one write behind the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealState {
    /// Its pod template is the one step 0 saved: the job has not changed it.
    Saved,
    /// Its component container has the job's new image.
    Upgraded,
    /// Neither: someone else changed it meanwhile.
    Other,
}

pub fn real_state(current: &DaemonSet, saved: &DaemonSet, component: Component, new_image: &str) -> RealState {
    if has_template_of(current, saved) {
        RealState::Saved
    } else if daemonset_image(current, component).as_deref() == Some(new_image) {
        RealState::Upgraded
    } else {
        RealState::Other
    }
}

/// What a cancel does with the component it finds the job at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    /// The job did not change the real DaemonSet: stop here and remove the
    /// copy (once the real pods run, as always).
    RemoveCopy,
    /// The real DaemonSet has the new image, so it rolls or has rolled:
    /// the component is finished first, and the job stops after it.
    FinishComponent,
}

pub fn on_cancel(real: Option<RealState>) -> OnCancel {
    match real {
        // Changed by someone else, or missing: not the job's to finish.
        Some(RealState::Saved | RealState::Other) | None => OnCancel::RemoveCopy,
        Some(RealState::Upgraded) => OnCancel::FinishComponent,
    }
}

/// The job a temporary copy belongs to, from its annotation.
pub fn temp_job(temp: &DaemonSet) -> Option<i64> {
    temp.metadata.annotations.as_ref()?.get(JOB_ANNOTATION)?.parse().ok()
}

/// Why the real DaemonSet cannot go without its temporary copy yet, or
/// `None` when it may: it exists, is not being deleted, and runs at least
/// one pod, every one Running, not terminating, with the DaemonSet's own
/// image. While it rolls (an old pod going, a new one starting), the copy
/// is the component's only working instance and must stay.
pub fn not_settled(real: Option<&DaemonSet>, pods: &[Pod], component: Component) -> Option<String> {
    let Some(real) = real else { return Some(format!("DaemonSet {} does not exist", component.daemonset())) };
    if real.metadata.deletion_timestamp.is_some() {
        return Some(format!("DaemonSet {} is being deleted", component.daemonset()));
    }
    let image = daemonset_image(real, component);
    if pods_up(pods, component, None, image.as_deref()) {
        return None;
    }
    let seen: Vec<String> = pods
        .iter()
        .map(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
            let going = if p.metadata.deletion_timestamp.is_some() { ", terminating" } else { "" };
            let img = pod_image(p, component).unwrap_or_default();
            format!("{} {phase}{going} ({img})", p.metadata.name.as_deref().unwrap_or("?"))
        })
        .collect();
    let want = image.unwrap_or_default();
    Some(if seen.is_empty() {
        format!("no pod of {} runs yet (wants {want})", component.daemonset())
    } else {
        format!("{} rolls to {want}: {}", component.daemonset(), seen.join(", "))
    })
}

/// One step of a dry-run plan.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PlannedStep {
    /// 0-7, in the order they run.
    pub number: i64,
    pub name: String,
    pub description: String,
}

/// What an upgrade would do to one component.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ComponentPlan {
    pub component: Component,
    pub daemonset: String,
    pub current_image: Option<String>,
    pub new_image: String,
    /// Whether the component already runs the new image (it is rolled
    /// anyway, as kubeadm does, which is harmless).
    pub up_to_date: bool,
    pub steps: Vec<PlannedStep>,
}

/// The plan for one component, from the image it runs now.
pub fn plan_component(component: Component, current_image: Option<String>, new_image: String) -> ComponentPlan {
    let steps = Step::UPGRADE
        .into_iter()
        .map(|s| PlannedStep { number: s.number(), name: s.name().to_owned(), description: s.describe(component) })
        .collect();
    ComponentPlan {
        component,
        daemonset: component.daemonset(),
        up_to_date: current_image.as_deref() == Some(new_image.as_str()),
        current_image,
        new_image,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn real_ds() -> DaemonSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {
                "name": "self-hosted-kube-apiserver", "namespace": "kube-system",
                "uid": "1234", "resourceVersion": "42", "generation": 3,
                "labels": {"k8s-app": "self-hosted-kube-apiserver"},
                "annotations": {"note": "kept"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "9"}]
            },
            "spec": {
                "selector": {"matchLabels": {"k8s-app": "self-hosted-kube-apiserver"}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "self-hosted-kube-apiserver", "tier": "control-plane"}},
                    "spec": {"containers": [
                        {"name": "sidecar", "image": "busybox:1"},
                        {"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.29.2"}
                    ]}
                }
            },
            "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1}
        }))
        .unwrap()
    }

    #[test]
    fn temp_daemonset_is_relabelled_and_stripped() {
        let temp = temp_daemonset(&real_ds(), Component::KubeApiserver, 7);
        let want = BTreeMap::from([("temp-upgrade-component".to_owned(), "kube-apiserver".to_owned())]);
        assert_eq!(temp.metadata.name.as_deref(), Some("temp-upgrade-self-hosted-kube-apiserver"));
        assert_eq!(temp.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(temp.metadata.labels.as_ref(), Some(&want));
        let annotations = temp.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
        assert_eq!(temp_job(&temp), Some(7), "the copy names the job that made it");
        let spec = &temp.spec;
        assert_eq!(spec.selector.match_labels.as_ref(), Some(&want));
        assert_eq!(spec.template.metadata.as_ref().unwrap().labels.as_ref(), Some(&want));
        // Only name, namespace, labels and annotations survive.
        let meta = serde_json::to_value(&temp.metadata).unwrap();
        let keys: Vec<&String> = meta.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["annotations", "labels", "name", "namespace"]);
        assert!(temp.status.is_none());
        // The pod spec itself is an exact copy: same image as the original.
        assert_eq!(
            daemonset_image(&temp, Component::KubeApiserver),
            daemonset_image(&real_ds(), Component::KubeApiserver)
        );
    }

    #[test]
    fn with_image_changes_only_the_component_container() {
        let ds = with_image(&real_ds(), Component::KubeApiserver, "registry.k8s.io/kube-apiserver:v1.30.0").unwrap();
        let containers = &ds.spec.template.spec.as_ref().unwrap().containers;
        assert_eq!(containers[0].image.as_deref(), Some("busybox:1"));
        assert_eq!(containers[1].image.as_deref(), Some("registry.k8s.io/kube-apiserver:v1.30.0"));
        assert_eq!(ds.metadata.resource_version.as_deref(), Some("42"), "the update stays conditional");
        assert!(ds.status.is_none());
    }

    #[test]
    fn with_image_refuses_a_daemonset_without_containers() {
        let empty =
            DaemonSet { metadata: ObjectMeta { name: Some("x".into()), ..Default::default() }, ..Default::default() };
        assert_eq!(with_image(&empty, Component::KubeScheduler, "i"), Err(PlanError::NoContainers("x".into())));
    }

    #[test]
    fn restored_keeps_current_metadata_and_saved_spec() {
        let saved = real_ds();
        let mut current = with_image(&saved, Component::KubeApiserver, "new:v2").unwrap();
        current.metadata.resource_version = Some("50".into());
        assert!(!has_template_of(&current, &saved));
        let back = restored(&current, &saved);
        assert_eq!(back.metadata.resource_version.as_deref(), Some("50"));
        assert!(has_template_of(&back, &saved));
    }

    fn pod(name: &str, phase: &str, image: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "kube-apiserver", "image": image}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_up_only_when_all_run_the_wanted_image() {
        let c = Component::KubeApiserver;
        assert!(!pods_up(&[], c, None, None));
        assert!(pods_up(&[pod("a", "Running", "i:1")], c, None, None));
        assert!(!pods_up(&[pod("a", "Pending", "i:1")], c, None, None));
        assert!(!pods_up(&[pod("a", "Running", "i:1")], c, Some("a"), None));
        assert!(!pods_up(&[pod("b", "Running", "i:1")], c, Some("a"), Some("i:2")));
        assert!(pods_up(&[pod("b", "Running", "i:2")], c, Some("a"), Some("i:2")));
    }

    #[test]
    fn the_real_daemonset_is_classified_from_its_template_not_the_stored_step() {
        let c = Component::KubeApiserver;
        let saved = real_ds();
        let new = "registry.k8s.io/kube-apiserver:v1.30.0";
        let mut current = saved.clone();
        current.metadata.resource_version = Some("99".into());
        assert_eq!(real_state(&current, &saved, c, new), RealState::Saved, "metadata does not matter");
        let upgraded = with_image(&saved, c, new).unwrap();
        assert_eq!(real_state(&upgraded, &saved, c, new), RealState::Upgraded);
        let other = with_image(&saved, c, "elsewhere/kube-apiserver:v9").unwrap();
        assert_eq!(real_state(&other, &saved, c, new), RealState::Other);
    }

    #[test]
    fn a_cancel_finishes_the_component_only_once_the_real_daemonset_has_the_new_image() {
        assert_eq!(on_cancel(Some(RealState::Saved)), OnCancel::RemoveCopy);
        assert_eq!(on_cancel(None), OnCancel::RemoveCopy);
        assert_eq!(on_cancel(Some(RealState::Other)), OnCancel::RemoveCopy);
        assert_eq!(on_cancel(Some(RealState::Upgraded)), OnCancel::FinishComponent);
    }

    fn real_pod(name: &str, phase: &str, image: &str, terminating: bool) -> Pod {
        let mut p = pod(name, phase, image);
        if terminating {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2024-01-01T00:00:00Z".parse().unwrap()));
        }
        p
    }

    #[test]
    fn the_copy_may_go_only_once_the_real_pods_run_the_real_template() {
        let c = Component::KubeApiserver;
        let new = "registry.k8s.io/kube-apiserver:v1.30.0";
        let old = "registry.k8s.io/kube-apiserver:v1.29.2";
        let rolled = with_image(&real_ds(), c, new).unwrap();
        let table: [(&str, Vec<Pod>, bool); 6] = [
            ("no pod yet", vec![], false),
            ("the old pod still runs", vec![real_pod("a", "Running", old, false)], false),
            ("the new pod is Pending", vec![real_pod("b", "Pending", new, false)], false),
            ("the old pod terminates", vec![real_pod("a", "Running", new, true)], false),
            (
                "old and new side by side",
                vec![real_pod("a", "Running", old, false), real_pod("b", "Running", new, false)],
                false,
            ),
            ("the new pod runs", vec![real_pod("b", "Running", new, false)], true),
        ];
        for (case, pods, may_go) in table {
            assert_eq!(not_settled(Some(&rolled), &pods, c).is_none(), may_go, "{case}");
        }
        assert!(not_settled(None, &[], c).is_some_and(|why| why.contains("does not exist")));
        let mut deleting = rolled.clone();
        deleting.metadata.deletion_timestamp = real_pod("x", "Running", new, true).metadata.deletion_timestamp;
        assert!(not_settled(Some(&deleting), &[real_pod("b", "Running", new, false)], c).is_some());
    }

    #[test]
    fn plan_lists_the_eight_steps() {
        let p = plan_component(Component::KubeScheduler, Some("a:v1".into()), "a:v2".into());
        assert_eq!(p.steps.len(), 8);
        assert_eq!(p.steps[6].name, "delete_temp");
        assert!(!p.up_to_date);
    }
}
