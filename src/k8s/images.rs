//! Which container of a self-hosted control-plane DaemonSet (or its pod)
//! runs the component, and with which image: read by the upgrade runner,
//! its plans and the cluster probes alike.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::domain::upgrade::Component;

/// The container that runs the component: the one named after it, else the
/// first (self-hosted DaemonSets have one).
pub fn component_container(containers: &mut [Container], component: Component) -> Option<&mut Container> {
    let idx = containers.iter().position(|c| c.name == component.as_str()).unwrap_or(0);
    containers.get_mut(idx)
}

/// The image the DaemonSet runs the component with.
pub fn daemonset_image(ds: &DaemonSet, component: Component) -> Option<String> {
    let mut containers = ds.spec.template.spec.as_ref()?.containers.clone();
    component_container(&mut containers, component).and_then(|c| c.image.clone())
}

/// The image a pod runs the component with.
pub fn pod_image(pod: &Pod, component: Component) -> Option<String> {
    let mut containers = pod.spec.as_ref()?.containers.clone();
    component_container(&mut containers, component).and_then(|c| c.image.clone())
}
