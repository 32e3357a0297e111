//! The simulator's worker nodes: Node objects (get, merge patch, delete),
//! pods bound to them by `spec.nodeName` and listed across namespaces with
//! a field selector, and the Eviction subresource. Tests create nodes and
//! pods directly, and can make evictions answer 429 for a while, as a
//! PodDisruptionBudget that allows no disruption would.

use super::http::{merge_patch, not_found, ok_json, query_param, selector_matches, status_error};
use super::*;

/// What the API says when a budget forbids an eviction.
pub const PDB_MESSAGE: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

type P1 = axum::extract::Path<String>;
type P2 = axum::extract::Path<(String, String)>;

fn success(kind: &str, name: &str, code: u16) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    ok_json(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code,
               "details": {"name": name, "kind": kind}}),
    )
}

pub(super) async fn get_node(State(sim): State<Arc<Inner>>, P1 { 0: name }: P1) -> Response {
    match sim.world().nodes.get(&name) {
        Some(n) => ok_json(StatusCode::OK, n.clone()),
        None => not_found("nodes", &name),
    }
}

pub(super) async fn patch_node(State(sim): State<Arc<Inner>>, P1 { 0: name }: P1, body: axum::body::Bytes) -> Response {
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else { return status_error(400, "BadRequest", "not JSON") };
    let mut w = sim.world();
    let rv = w.next_rv();
    let Some(node) = w.nodes.get_mut(&name) else { return not_found("nodes", &name) };
    merge_patch(node, &patch);
    node["metadata"]["resourceVersion"] = json!(rv);
    ok_json(StatusCode::OK, node.clone())
}

pub(super) async fn delete_node(State(sim): State<Arc<Inner>>, P1 { 0: name }: P1) -> Response {
    match sim.world().nodes.remove(&name) {
        Some(_) => success("nodes", &name, 200),
        None => not_found("nodes", &name),
    }
}

/// `GET /api/v1/pods`: every namespace; `spec.nodeName` is the one field
/// selector supported, as the real API supports only a few.
pub(super) async fn list_all_pods(State(sim): State<Arc<Inner>>, req: Request) -> Response {
    let labels = query_param(req.uri().query(), "labelSelector").unwrap_or_default();
    let fields = query_param(req.uri().query(), "fieldSelector").unwrap_or_default();
    let mut node = None;
    for term in fields.split(',').filter(|t| !t.is_empty()) {
        match term.split_once('=') {
            Some(("spec.nodeName", v)) => node = Some(v.trim_start_matches('=').to_owned()),
            _ => return status_error(400, "BadRequest", &format!("field label not supported: {term}")),
        }
    }
    let w = sim.world();
    let items: Vec<Value> = w
        .pods
        .values()
        .filter(|p| selector_matches(&labels, &p["metadata"]["labels"]))
        .filter(|p| node.as_deref().is_none_or(|n| p["spec"]["nodeName"] == n))
        .cloned()
        .collect();
    ok_json(
        StatusCode::OK,
        json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": w.resource_version.to_string()}, "items": items}),
    )
}

/// `POST .../pods/{name}/eviction`: 429 while evictions are blocked;
/// otherwise the pod terminates (at once, or after the termination delay).
pub(super) async fn evict_pod(State(sim): State<Arc<Inner>>, P2 { 0: (ns, name) }: P2) -> Response {
    let delay = sim.settings.termination_delay;
    let mut w = sim.world();
    let Some(pod) = w.pods.get(&name).filter(|p| p["metadata"]["namespace"] == ns.as_str()) else {
        return not_found("pods", &name);
    };
    if let Some(why) = w.evictions_blocked.clone() {
        return status_error(429, "TooManyRequests", &why);
    }
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return success("pods", &name, 201);
    }
    if delay.is_zero() {
        remove_pod(&mut w, &name);
    } else {
        w.terminating.insert(name.clone(), Instant::now());
        if let Some(p) = w.pods.get_mut(&name) {
            p["metadata"]["deletionTimestamp"] = json!(now());
        }
    }
    success("pods", &name, 201)
}

/// Removes evicted pods whose termination delay has passed.
pub(super) fn reap_terminated(w: &mut World, delay: Duration) {
    let due: Vec<String> =
        w.terminating.iter().filter(|(_, since)| since.elapsed() >= delay).map(|(n, _)| n.clone()).collect();
    due.iter().for_each(|p| remove_pod(w, p));
}

impl KubeSim {
    /// A Ready worker node, schedulable.
    pub fn add_node(&self, name: &str) {
        let mut w = self.inner.world();
        let rv = w.next_rv();
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid(), "resourceVersion": rv, "creationTimestamp": now(),
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        w.nodes.insert(name.to_owned(), node);
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.inner.world().nodes.get(name).cloned()
    }

    /// A Running pod bound to `node`; `owner` is the kind of its
    /// controller (`ReplicaSet`, `DaemonSet`...), `mirror` marks a static
    /// pod's mirror.
    pub fn add_node_pod(&self, namespace: &str, name: &str, node: &str, owner: Option<&str>, mirror: bool) {
        let mut w = self.inner.world();
        let rv = w.next_rv();
        let mut meta = json!({"name": name, "namespace": namespace, "uid": uid(), "resourceVersion": rv,
                              "creationTimestamp": now(), "labels": {"app": name}});
        if let Some(kind) = owner {
            let api = if kind == "Node" { "v1" } else { "apps/v1" };
            meta["ownerReferences"] = json!([{"apiVersion": api, "kind": kind, "name": format!("{name}-owner"), "uid": uid(), "controller": true}]);
        }
        if mirror {
            meta["annotations"] = json!({"kubernetes.io/config.mirror": "0123abcd"});
        }
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "example.test/app:1"}]},
            "status": {"phase": "Running"}
        });
        w.pods.insert(name.to_owned(), pod);
    }

    /// Names of the pods bound to `node`.
    pub fn pods_on_node(&self, node: &str) -> Vec<String> {
        self.inner.world().pods.values().filter(|p| p["spec"]["nodeName"] == node).map(name_of).collect()
    }

    /// Every eviction answers 429 until `allow_evictions`.
    pub fn block_evictions(&self) {
        self.inner.world().evictions_blocked = Some(PDB_MESSAGE.to_owned());
    }

    pub fn allow_evictions(&self) {
        self.inner.world().evictions_blocked = None;
    }
}
