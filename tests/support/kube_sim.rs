//! A Kubernetes API simulator for tests: the slice of the API that drover's
//! upgrade runner uses, served over real HTTP on 127.0.0.1 so that the real
//! kube-rs client talks to it.
//!
//! What it simulates:
//! - DaemonSets (`apps/v1`): create, get, list, replace (with resourceVersion
//!   conflicts), merge patch, server-side apply (see `kube_sim_apply.rs`),
//!   delete with uid/resourceVersion preconditions (foreground keeps the
//!   object, marked for deletion, until its pods are gone).
//! - Pods (`v1`): get, list with label selectors, delete.
//! - `/healthz` and `/version`; Kubernetes `Status` bodies for every error.
//! - A DaemonSet controller for one control-plane node: a pod per DaemonSet
//!   (`<ds>-<5 random chars>`) from its template, Pending then Running after
//!   a delay; a template change deletes the old pod and creates a new one;
//!   pods go with their DaemonSet.
//!
//! - Nodes (`v1`, cluster-scoped): get, merge patch (cordon), delete; pods
//!   bound to a node (`spec.nodeName`), listed across namespaces with
//!   `fieldSelector=spec.nodeName=...`; the Eviction subresource, which
//!   deletes the pod or answers 429 while evictions are blocked, as a
//!   PodDisruptionBudget would (see `kube_sim_nodes.rs`).
//!
//! What tests control: the log of operations, an image whose pods never run,
//! bursts of error answers (now, or when a given request arrives), `/healthz`
//! failing a number of times, the server unreachable for a while, holds
//! that park a given request until the test releases it, and holds that
//! apply a request but park its answer (the client cannot tell whether it
//! was applied: the window a crash leaves). What tests read back, besides
//! objects: every breach of the upgrade's safety invariant (a temporary
//! copy deleted while its real DaemonSet rolls).

#![allow(dead_code)] // Each test uses part of it.

#[path = "kube_sim_apply.rs"]
mod apply;
#[path = "kube_sim_http.rs"]
mod http;
#[path = "kube_sim_nodes.rs"]
mod nodes;

use http::{
    FlakyListener, create_ds, delete_ds, delete_pod, get_ds, get_pod, healthz, list_ds, list_pods, observe, replace_ds,
    selector_matches, status_error, version,
};

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

/// The one node's labels; a DaemonSet whose nodeSelector does not match
/// them gets no pod.
const NODE_LABELS: [(&str, &str); 2] =
    [("kubernetes.io/hostname", "cp-0"), ("node-role.kubernetes.io/control-plane", "")];

#[derive(Debug, Clone)]
pub struct SimSettings {
    /// How long a new pod stays Pending.
    pub running_delay: Duration,
    /// How often the controller looks at the world.
    pub tick: Duration,
    /// The bearer token every request must carry, when set.
    pub token: Option<String>,
    /// How long an evicted pod stays, terminating, before it is gone.
    pub termination_delay: Duration,
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            running_delay: Duration::from_millis(60),
            tick: Duration::from_millis(10),
            token: None,
            termination_delay: Duration::ZERO,
        }
    }
}

/// One request the simulator answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Kubernetes verb: list, get, create, replace, patch, delete; `get` for
    /// `/healthz` and `/version`.
    pub verb: String,
    /// daemonsets, pods, healthz, version.
    pub kind: String,
    pub name: Option<String>,
    pub selector: Option<String>,
    /// The `fieldSelector`, e.g. `spec.nodeName=worker-abc123`.
    pub fields: Option<String>,
    pub status: u16,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.kind)?;
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        if let Some(s) = &self.selector {
            write!(f, " [{s}]")?;
        }
        if let Some(s) = &self.fields {
            write!(f, " [fields {s}]")?;
        }
        Ok(())
    }
}

impl Op {
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "replace" | "patch" | "apply" | "delete")
    }
}

/// Which requests a fault or a hold applies to; unset fields match anything.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    pub verb: Option<&'static str>,
    pub kind: Option<&'static str>,
    pub name: Option<String>,
    pub selector: Option<String>,
    /// Fire on the n-th matching request (1 = the first).
    pub nth: u32,
}

impl Matcher {
    pub fn new(verb: &'static str, kind: &'static str) -> Self {
        Self { verb: Some(verb), kind: Some(kind), nth: 1, ..Self::default() }
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub fn selector(mut self, s: impl Into<String>) -> Self {
        self.selector = Some(s.into());
        self
    }

    pub fn nth(mut self, n: u32) -> Self {
        self.nth = n;
        self
    }

    fn matches(&self, op: &Op) -> bool {
        self.verb.is_none_or(|v| v == op.verb)
            && self.kind.is_none_or(|k| k == op.kind)
            && self.name.as_ref().is_none_or(|n| Some(n) == op.name.as_ref())
            && self.selector.as_ref().is_none_or(|s| Some(s) == op.selector.as_ref())
    }
}

/// A parked request: `reached` resolves once it arrived; `release` lets it on.
#[derive(Clone)]
pub struct Hold {
    hit: Arc<AtomicBool>,
    arrived: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl Hold {
    /// Waits until the held request has arrived; panics after `limit`.
    pub async fn reached(&self, limit: Duration, what: &str) {
        let deadline = Instant::now() + limit;
        while !self.hit.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the request held for {what} never arrived within {limit:?}");
            let _ = tokio::time::timeout(Duration::from_millis(20), self.arrived.notified()).await;
        }
    }

    pub fn release(&self) {
        self.gate.add_permits(1000);
    }
}

struct Trigger {
    matcher: Matcher,
    seen: u32,
    status: u16,
    count: u32,
}

struct HoldSlot {
    matcher: Matcher,
    seen: u32,
    hold: Hold,
}

#[derive(Default)]
struct World {
    resource_version: u64,
    daemonsets: BTreeMap<String, Value>,
    pods: BTreeMap<String, Value>,
    /// When each pod was created, to turn it Running after the delay.
    pod_born: BTreeMap<String, Instant>,
    ops: Vec<Op>,
    broken_images: HashSet<String>,
    /// Error answers still to give: (status, how many).
    burst: Option<(u16, u32)>,
    triggers: Vec<Trigger>,
    holds: Vec<HoldSlot>,
    /// Holds of answers: the request is applied, its answer parked.
    answer_holds: Vec<HoldSlot>,
    /// Breaches of the upgrade's safety invariant, in order.
    violations: Vec<String>,
    healthz_failures: u32,
    down_until: Option<Instant>,
    nodes: BTreeMap<String, Value>,
    /// While set, every eviction is refused with 429 and this message.
    evictions_blocked: Option<String>,
    /// Evicted pods still terminating, and since when.
    terminating: BTreeMap<String, Instant>,
}

impl World {
    fn next_rv(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }
}

struct Inner {
    world: Mutex<World>,
    settings: SimSettings,
}

impl Inner {
    fn world(&self) -> MutexGuard<'_, World> {
        // A test that panicked while holding the lock poisons it; the data is still fine.
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_down(&self) -> bool {
        self.world().down_until.is_some_and(|t| Instant::now() < t)
    }
}

/// A running simulator; stops when dropped.
pub struct KubeSim {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl KubeSim {
    pub async fn start(settings: SimSettings) -> KubeSim {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the simulator");
        let addr = listener.local_addr().expect("simulator address");
        let tick = settings.tick;
        let inner = Arc::new(Inner { world: Mutex::new(World::default()), settings });
        let app = Router::new()
            .route("/healthz", axum::routing::get(healthz))
            .route("/version", axum::routing::get(version))
            .route("/apis/apps/v1/namespaces/{ns}/daemonsets", axum::routing::get(list_ds).post(create_ds))
            .route(
                "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}",
                axum::routing::get(get_ds).put(replace_ds).patch(apply::patch_ds).delete(delete_ds),
            )
            .route("/api/v1/namespaces/{ns}/pods", axum::routing::get(list_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}", axum::routing::get(get_pod).delete(delete_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}/eviction", axum::routing::post(nodes::evict_pod))
            .route("/api/v1/pods", axum::routing::get(nodes::list_all_pods))
            .route(
                "/api/v1/nodes/{name}",
                axum::routing::get(nodes::get_node).patch(nodes::patch_node).delete(nodes::delete_node),
            )
            .fallback(|| async { status_error(404, "NotFound", "the server could not find the requested resource") })
            .layer(middleware::from_fn_with_state(Arc::clone(&inner), observe))
            .with_state(Arc::clone(&inner));
        let flaky = FlakyListener { inner: listener, sim: Arc::clone(&inner) };
        let server = tokio::spawn(async move {
            let _ = axum::serve(flaky, app).await;
        });
        let ctl = Arc::clone(&inner);
        let controller = tokio::spawn(async move {
            loop {
                reconcile(&ctl);
                tokio::time::sleep(tick).await;
            }
        });
        KubeSim { addr, inner, tasks: vec![server, controller] }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Three self-hosted control-plane DaemonSets at `version`, each with
    /// its one pod already Running.
    pub fn seed_control_plane(&self, version: &str) {
        for c in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
            let name = format!("self-hosted-{c}");
            let ds = json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": "kube-system", "labels": {"k8s-app": name},
                             "annotations": {"drover.test/seeded": "true"}},
                "spec": {
                    "selector": {"matchLabels": {"k8s-app": name}},
                    "template": {
                        "metadata": {"labels": {"k8s-app": name, "component": c}},
                        "spec": {
                            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                            "containers": [{"name": c, "image": format!("registry.k8s.io/{c}:{version}"),
                                            "command": [c]}]
                        }
                    },
                    "updateStrategy": {"type": "RollingUpdate"}
                }
            });
            let mut w = self.inner.world();
            let stored = store_new_ds(&mut w, "kube-system", ds);
            let pod = new_pod(&mut w, &stored);
            let pod_name = name_of(&pod);
            w.pods.insert(pod_name.clone(), pod);
            if let Some(p) = w.pods.get_mut(&pod_name) {
                p["status"] = json!({"phase": "Running"});
            }
        }
    }

    /// Every operation so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.inner.world().ops.clone()
    }

    pub fn clear_ops(&self) {
        self.inner.world().ops.clear();
    }

    pub fn daemonset(&self, name: &str) -> Option<Value> {
        self.inner.world().daemonsets.get(name).cloned()
    }

    pub fn daemonset_names(&self) -> Vec<String> {
        self.inner.world().daemonsets.keys().cloned().collect()
    }

    /// The image of the DaemonSet's first container.
    pub fn daemonset_image(&self, name: &str) -> Option<String> {
        self.daemonset(name)
            .and_then(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].as_str().map(str::to_owned))
    }

    /// Pods matching a label selector (`k=v,k2=v2`).
    pub fn pods(&self, selector: &str) -> Vec<Value> {
        self.inner
            .world()
            .pods
            .values()
            .filter(|p| selector_matches(selector, &p["metadata"]["labels"]))
            .cloned()
            .collect()
    }

    /// Adds a pod no controller owns (to make "several pods" cases).
    pub fn add_stray_pod(&self, name: &str, labels: Value, image: &str) {
        let mut w = self.inner.world();
        let rv = w.next_rv();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "kube-system", "labels": labels, "uid": uid(),
                         "resourceVersion": rv, "creationTimestamp": now()},
            "spec": {"containers": [{"name": "stray", "image": image}]},
            "status": {"phase": "Running"}
        });
        w.pods.insert(name.to_owned(), pod);
    }

    /// Makes the DaemonSet's pod template select no node: the controller
    /// removes its pod and creates none.
    pub fn unschedule(&self, ds: &str) {
        let mut w = self.inner.world();
        let rv = w.next_rv();
        if let Some(d) = w.daemonsets.get_mut(ds) {
            d["spec"]["template"]["spec"]["nodeSelector"] = json!({"no-such-node": "true"});
            d["metadata"]["resourceVersion"] = json!(rv);
        }
    }

    /// Pods with this image stay Pending forever (an image that cannot be pulled).
    pub fn break_image(&self, image: &str) {
        self.inner.world().broken_images.insert(image.to_owned());
    }

    /// The next `count` requests get `status` (with a Status body).
    pub fn burst_now(&self, status: u16, count: u32) {
        self.inner.world().burst = Some((status, count));
    }

    /// When a request matching `m` arrives, it and the `count - 1` after it get `status`.
    pub fn burst_on(&self, m: Matcher, status: u16, count: u32) {
        self.inner.world().triggers.push(Trigger { matcher: m, seen: 0, status, count });
    }

    /// `/healthz` fails its next `n` answers.
    pub fn fail_healthz(&self, n: u32) {
        self.inner.world().healthz_failures = n;
    }

    /// Every connection is reset for `d`, new ones included.
    pub fn unreachable_for(&self, d: Duration) {
        self.inner.world().down_until = Some(Instant::now() + d);
    }

    /// Parks the request matching `m` (before it is applied) until released.
    pub fn hold(&self, m: Matcher) -> Hold {
        let hold = Hold { hit: Arc::default(), arrived: Arc::default(), gate: Arc::new(Semaphore::new(0)) };
        self.inner.world().holds.push(HoldSlot { matcher: m, seen: 0, hold: hold.clone() });
        hold
    }

    /// Applies the request matching `m`, then parks its answer until
    /// released: the change is made, and the client does not know it.
    pub fn hold_answer(&self, m: Matcher) -> Hold {
        let hold = Hold { hit: Arc::default(), arrived: Arc::default(), gate: Arc::new(Semaphore::new(0)) };
        self.inner.world().answer_holds.push(HoldSlot { matcher: m, seen: 0, hold: hold.clone() });
        hold
    }

    /// Releases every hold (so that no request stays parked).
    pub fn release_all(&self) {
        let w = self.inner.world();
        w.holds.iter().chain(&w.answer_holds).for_each(|h| h.hold.release());
    }

    /// Every time a temporary copy was deleted while its real DaemonSet rolled.
    pub fn violations(&self) -> Vec<String> {
        self.inner.world().violations.clone()
    }

    /// The job named on a temporary copy (`drover.dev/upgrade-job`).
    pub fn temp_job(&self, temp: &str) -> Option<String> {
        self.daemonset(temp)
            .and_then(|d| d["metadata"]["annotations"]["drover.dev/upgrade-job"].as_str().map(str::to_owned))
    }
}

// ---- the controller ----------------------------------------------------------

/// One pass of the DaemonSet controller, garbage collector and kubelet.
fn reconcile(inner: &Inner) {
    let delay = inner.settings.running_delay;
    let mut w = inner.world();
    let names: Vec<String> = w.daemonsets.keys().cloned().collect();
    for name in names {
        let Some(ds) = w.daemonsets.get(&name).cloned() else { continue };
        let uid = ds["metadata"]["uid"].clone();
        let owned: Vec<String> =
            w.pods.values().filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid).map(name_of).collect();
        if !ds["metadata"]["deletionTimestamp"].is_null() {
            // Foreground deletion: dependents first, then the owner.
            if owned.is_empty() {
                w.daemonsets.remove(&name);
            } else {
                owned.iter().for_each(|p| remove_pod(&mut w, p));
            }
            continue;
        }
        let hash = template_hash(&ds);
        let schedulable = node_selector_matches(&ds["spec"]["template"]["spec"]["nodeSelector"]);
        let mut current = 0;
        for p in &owned {
            let stale = w.pods.get(p).is_some_and(|pod| pod["metadata"]["labels"]["controller-revision-hash"] != hash);
            if stale || !schedulable {
                remove_pod(&mut w, p);
            } else {
                current += 1;
            }
        }
        if current == 0 && schedulable && owned.is_empty() {
            let pod = new_pod(&mut w, &ds);
            let pod_name = name_of(&pod);
            w.pod_born.insert(pod_name.clone(), Instant::now());
            w.pods.insert(pod_name, pod);
        }
        let ready = w
            .pods
            .values()
            .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid && p["status"]["phase"] == "Running")
            .count();
        if let Some(d) = w.daemonsets.get_mut(&name) {
            let desired = i32::from(schedulable);
            d["status"] = json!({
                "currentNumberScheduled": desired, "desiredNumberScheduled": desired, "numberMisscheduled": 0,
                "numberReady": ready, "observedGeneration": d["metadata"]["generation"].clone()
            });
        }
    }
    nodes::reap_terminated(&mut w, inner.settings.termination_delay);
    // Garbage collection: pods whose owner is gone. Pods that tests bind to
    // worker nodes have owners the simulator does not model; leave them.
    let live: HashSet<String> =
        w.daemonsets.values().filter_map(|d| d["metadata"]["uid"].as_str().map(str::to_owned)).collect();
    let orphans: Vec<String> = w
        .pods
        .values()
        .filter(|p| p["spec"]["nodeName"].is_null())
        .filter(|p| p["metadata"]["ownerReferences"][0]["uid"].as_str().is_some_and(|u| !live.contains(u)))
        .map(name_of)
        .collect();
    orphans.iter().for_each(|p| remove_pod(&mut w, p));
    // The kubelet: Pending pods start once their delay passed, unless their image is broken.
    let due: Vec<String> =
        w.pod_born.iter().filter(|(_, born)| born.elapsed() >= delay).map(|(n, _)| n.clone()).collect();
    for name in due {
        let broken = w.pods.get(&name).is_some_and(|p| {
            p["spec"]["containers"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["image"].as_str().is_some_and(|i| w.broken_images.contains(i))))
        });
        if broken {
            if let Some(p) = w.pods.get_mut(&name) {
                p["status"] =
                    json!({"phase": "Pending", "reason": "ImagePullBackOff", "message": "Back-off pulling image"});
            }
            continue;
        }
        w.pod_born.remove(&name);
        let rv = w.next_rv();
        if let Some(p) = w.pods.get_mut(&name) {
            p["status"] = json!({"phase": "Running", "podIP": "10.0.0.2"});
            p["metadata"]["resourceVersion"] = json!(rv);
        }
    }
}

fn remove_pod(w: &mut World, name: &str) {
    w.pods.remove(name);
    w.pod_born.remove(name);
    w.terminating.remove(name);
}

fn template_hash(ds: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ds["spec"]["template"].to_string().hash(&mut h);
    format!("{:010x}", h.finish() & 0xff_ffff_ffff)
}

fn node_selector_matches(sel: &Value) -> bool {
    sel.as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| NODE_LABELS.iter().any(|(nk, nv)| nk == k && Some(*nv) == v.as_str())))
}

fn new_pod(w: &mut World, ds: &Value) -> Value {
    use rand::RngExt;
    let ds_name = name_of(ds);
    let suffix: String = (0..5).map(|_| char::from(b'a' + rand::rng().random_range(0..26u8))).collect();
    let mut labels = ds["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["controller-revision-hash"] = json!(template_hash(ds));
    let rv = w.next_rv();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{ds_name}-{suffix}"), "namespace": ds["metadata"]["namespace"], "labels": labels,
            "uid": uid(), "resourceVersion": rv, "creationTimestamp": now(),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                                 "uid": ds["metadata"]["uid"], "controller": true}]
        },
        "spec": ds["spec"]["template"]["spec"],
        "status": {"phase": "Pending"}
    })
}

fn store_new_ds(w: &mut World, ns: &str, mut ds: Value) -> Value {
    let rv = w.next_rv();
    let meta = &mut ds["metadata"];
    meta["namespace"] = json!(ns);
    meta["uid"] = json!(uid());
    meta["resourceVersion"] = json!(rv);
    meta["generation"] = json!(1);
    meta["creationTimestamp"] = json!(now());
    ds["apiVersion"] = json!("apps/v1");
    ds["kind"] = json!("DaemonSet");
    ds["status"] =
        json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0});
    w.daemonsets.insert(name_of(&ds), ds.clone());
    ds
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

fn uid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
