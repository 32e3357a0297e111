//! What a probe of a cluster's control plane saw: `/version`, `/healthz`,
//! and each component's DaemonSet image and pods.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::upgrade::{Component, image_version};
use crate::k8s::ClusterApi;

/// What `GET /v1/clusters/{name}/status` saw.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    pub name: String,
    /// `/version` answered.
    pub reachable: bool,
    /// `gitVersion` from `/version`.
    pub version: Option<String>,
    /// `/healthz` answered `ok`.
    pub healthy: bool,
    /// Why the cluster is unreachable or unhealthy.
    pub detail: Option<String>,
    pub components: Vec<ComponentStatus>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ComponentStatus {
    pub component: Component,
    pub daemonset: String,
    /// The image the DaemonSet runs the component with.
    pub image: Option<String>,
    /// The version in the image's tag.
    pub version: Option<String>,
    pub pods: Vec<PodStatus>,
    /// Why the component could not be read.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PodStatus {
    pub name: String,
    pub phase: Option<String>,
    pub image: Option<String>,
}

/// Probes the cluster behind `api`; what does not answer is reported in
/// the status, not as an error.
pub async fn probe(api: &ClusterApi, name: String) -> ClusterStatus {
    let mut status =
        ClusterStatus { name, reachable: false, version: None, healthy: false, detail: None, components: Vec::new() };
    match api.version().await {
        Ok(info) => {
            status.reachable = true;
            status.version = Some(info.git_version);
        }
        Err(e) => {
            status.detail = Some(e.to_string());
            return status;
        }
    }
    match api.healthz_once().await {
        Ok(()) => status.healthy = true,
        Err(e) => status.detail = Some(e),
    }
    for c in Component::ALL {
        status.components.push(component_status(api, c).await);
    }
    status
}

async fn component_status(api: &ClusterApi, c: Component) -> ComponentStatus {
    let mut s = ComponentStatus {
        component: c,
        daemonset: c.daemonset(),
        image: None,
        version: None,
        pods: vec![],
        error: None,
    };
    match api.get_daemonset(&c.daemonset()).await {
        Ok(Some(ds)) => {
            s.image = crate::k8s::daemonset_image(&ds, c);
            s.version = s.image.as_deref().and_then(image_version).map(|v| v.to_string());
        }
        Ok(None) => s.error = Some(format!("DaemonSet {} does not exist", c.daemonset())),
        Err(e) => s.error = Some(e.to_string()),
    }
    match api.list_pods(&c.pod_selector()).await {
        Ok(pods) => {
            s.pods = pods
                .iter()
                .map(|p| PodStatus {
                    name: p.metadata.name.clone().unwrap_or_default(),
                    phase: p.status.as_ref().and_then(|st| st.phase.clone()),
                    image: crate::k8s::pod_image(p, c),
                })
                .collect();
        }
        Err(e) => s.error = Some(e.to_string()),
    }
    s
}
