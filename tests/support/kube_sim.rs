//! A Kubernetes API simulator for tests: the slice of the API that drover's
//! upgrade runner uses, served over real HTTP on 127.0.0.1 so that the real
//! kube-rs client talks to it.
//!
//! What it simulates:
//! - DaemonSets (`apps/v1`): create, get, list, replace (with resourceVersion
//!   conflicts), merge patch, delete (foreground keeps the object, marked
//!   for deletion, until its pods are gone).
//! - Pods (`v1`): get, list with label selectors, delete.
//! - `/healthz` and `/version`; Kubernetes `Status` bodies for every error.
//! - A DaemonSet controller for one control-plane node: a pod per DaemonSet
//!   (`<ds>-<5 random chars>`) from its template, Pending then Running after
//!   a delay; a template change deletes the old pod and creates a new one;
//!   pods go with their DaemonSet.
//!
//! What tests control: the log of operations, an image whose pods never run,
//! bursts of error answers (now, or when a given request arrives), `/healthz`
//! failing a number of times, the server unreachable for a while, and holds
//! that park a given request until the test releases it.

#![allow(dead_code)] // Each test uses part of it.

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
}

impl Default for SimSettings {
    fn default() -> Self {
        Self { running_delay: Duration::from_millis(60), tick: Duration::from_millis(10), token: None }
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
        Ok(())
    }
}

impl Op {
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "replace" | "patch" | "delete")
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
    healthz_failures: u32,
    down_until: Option<Instant>,
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
                axum::routing::get(get_ds).put(replace_ds).patch(patch_ds).delete(delete_ds),
            )
            .route("/api/v1/namespaces/{ns}/pods", axum::routing::get(list_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}", axum::routing::get(get_pod).delete(delete_pod))
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

    /// Releases every hold (so that no request stays parked).
    pub fn release_all(&self) {
        self.inner.world().holds.iter().for_each(|h| h.hold.release());
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
    // Garbage collection: pods whose owner is gone.
    let live: HashSet<String> =
        w.daemonsets.values().filter_map(|d| d["metadata"]["uid"].as_str().map(str::to_owned)).collect();
    let orphans: Vec<String> = w
        .pods
        .values()
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
    use rand::Rng;
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

// ---- HTTP: faults, the log, and the handlers ---------------------------------

/// `labelSelector` and friends, percent-decoded.
fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == key).map(|(_, v)| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which operation a request is, before it is answered.
fn classify(method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Op {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, name) = match parts.as_slice() {
        ["healthz"] => ("healthz", None),
        ["version"] => ("version", None),
        ["apis", "apps", "v1", "namespaces", _, "daemonsets"] => ("daemonsets", None),
        ["apis", "apps", "v1", "namespaces", _, "daemonsets", n] => ("daemonsets", Some((*n).to_owned())),
        ["api", "v1", "namespaces", _, "pods"] => ("pods", None),
        ["api", "v1", "namespaces", _, "pods", n] => ("pods", Some((*n).to_owned())),
        _ => ("unknown", None),
    };
    let verb = match (method.as_str(), &name) {
        ("GET", None) if matches!(kind, "daemonsets" | "pods") => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "replace",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "other",
    };
    let name = name.or_else(|| {
        (verb == "create")
            .then(|| serde_json::from_slice::<Value>(body).ok())
            .flatten()
            .and_then(|v| v["metadata"]["name"].as_str().map(str::to_owned))
    });
    Op { verb: verb.into(), kind: kind.into(), name, selector: query_param(query, "labelSelector"), status: 0 }
}

/// Records every request, and applies holds and error bursts to it.
async fn observe(State(sim): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, 4 << 20).await.unwrap_or_default();
    let mut op = classify(&parts.method, parts.uri.path(), parts.uri.query(), &bytes);
    if let Some(token) = &sim.settings.token {
        let want = format!("Bearer {token}");
        if parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
            op.status = 401;
            sim.world().ops.push(op);
            return status_error(401, "Unauthorized", "Unauthorized");
        }
    }
    let hold = {
        let mut w = sim.world();
        let mut found = None;
        for slot in w.holds.iter_mut().filter(|s| s.matcher.matches(&op)) {
            slot.seen += 1;
            if slot.seen == slot.matcher.nth {
                found = Some(slot.hold.clone());
            }
        }
        found
    };
    if let Some(h) = hold {
        h.hit.store(true, Ordering::SeqCst);
        h.arrived.notify_waiters();
        let _ = h.gate.acquire().await;
    }
    let injected = {
        let mut w = sim.world();
        let mut armed = None;
        for t in w.triggers.iter_mut().filter(|t| t.matcher.matches(&op)) {
            t.seen += 1;
            if t.seen == t.matcher.nth {
                armed = Some((t.status, t.count));
            }
        }
        if armed.is_some() {
            w.burst = armed;
        }
        match w.burst {
            Some((status, left)) if left > 0 => {
                w.burst = if left > 1 { Some((status, left - 1)) } else { None };
                Some(status)
            }
            _ => None,
        }
    };
    let res = match injected {
        Some(409) => status_error(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
        Some(code) => status_error(code, "InternalError", "injected failure"),
        None => {
            let req = Request::from_parts(parts, Body::from(bytes));
            next.run(req).await
        }
    };
    op.status = res.status().as_u16();
    sim.world().ops.push(op);
    res
}

fn status_error(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    });
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn not_found(kind: &str, name: &str) -> Response {
    status_error(404, "NotFound", &format!("{kind} \"{name}\" not found"))
}

fn ok_json(status: StatusCode, v: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn selector_matches(selector: &str, labels: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim()].as_str() == Some(v.trim_start_matches('=').trim())
        } else {
            !labels[term.trim()].is_null()
        }
    })
}

async fn healthz(State(sim): State<Arc<Inner>>) -> Response {
    let mut w = sim.world();
    if w.healthz_failures > 0 {
        w.healthz_failures -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "[-]etcd failed: reason withheld\nhealthz check failed")
            .into_response();
    }
    "ok".into_response()
}

async fn version(State(sim): State<Arc<Inner>>) -> Response {
    let w = sim.world();
    let image = w
        .daemonsets
        .get("self-hosted-kube-apiserver")
        .and_then(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].as_str().map(str::to_owned));
    let git = image.as_deref().and_then(|i| i.rsplit_once(':')).map_or("v1.29.2".to_owned(), |(_, t)| t.to_owned());
    let mut nums = git.trim_start_matches('v').split('.');
    ok_json(
        StatusCode::OK,
        json!({
            "major": nums.next().unwrap_or("1"), "minor": nums.next().unwrap_or("29"), "gitVersion": git,
            "gitCommit": "0000000", "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z",
            "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"
        }),
    )
}

type P2 = axum::extract::Path<(String, String)>;
type P1 = axum::extract::Path<String>;

async fn list_ds(State(sim): State<Arc<Inner>>, P1 { 0: _ns }: P1, req: Request) -> Response {
    let sel = query_param(req.uri().query(), "labelSelector").unwrap_or_default();
    let w = sim.world();
    let items: Vec<Value> =
        w.daemonsets.values().filter(|d| selector_matches(&sel, &d["metadata"]["labels"])).cloned().collect();
    ok_json(
        StatusCode::OK,
        json!({"apiVersion": "apps/v1", "kind": "DaemonSetList",
        "metadata": {"resourceVersion": w.resource_version.to_string()}, "items": items}),
    )
}

async fn create_ds(State(sim): State<Arc<Inner>>, P1 { 0: ns }: P1, body: axum::body::Bytes) -> Response {
    let Ok(ds) = serde_json::from_slice::<Value>(&body) else {
        return status_error(400, "BadRequest", "the body is not JSON");
    };
    let name = name_of(&ds);
    if name.is_empty() {
        return status_error(422, "Invalid", "metadata.name: Required value");
    }
    if !ds["metadata"]["resourceVersion"].is_null() {
        return status_error(400, "BadRequest", "resourceVersion should not be set on objects to be created");
    }
    let mut w = sim.world();
    if w.daemonsets.contains_key(&name) {
        return status_error(409, "AlreadyExists", &format!("daemonsets.apps \"{name}\" already exists"));
    }
    let stored = store_new_ds(&mut w, &ns, ds);
    ok_json(StatusCode::CREATED, stored)
}

async fn get_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
    match sim.world().daemonsets.get(&name) {
        Some(d) => ok_json(StatusCode::OK, d.clone()),
        None => not_found("daemonsets.apps", &name),
    }
}

/// Stores `new` in place of the DaemonSet `name`: identity and status are
/// the server's; a changed spec bumps the generation.
fn update_ds(w: &mut World, name: &str, mut new: Value) -> Response {
    let Some(current) = w.daemonsets.get(name).cloned() else { return not_found("daemonsets.apps", name) };
    if new["spec"]["template"]["spec"]["containers"].as_array().is_none_or(|c| c.is_empty()) {
        return status_error(422, "Invalid", "spec.template.spec.containers: Required value");
    }
    let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
    let changed = new["spec"] != current["spec"];
    for key in ["uid", "creationTimestamp", "deletionTimestamp", "finalizers", "namespace"] {
        new["metadata"][key] = current["metadata"][key].clone();
    }
    new["metadata"]["generation"] = json!(if changed { generation + 1 } else { generation });
    new["metadata"]["resourceVersion"] = json!(w.next_rv());
    new["status"] = current["status"].clone();
    new["apiVersion"] = json!("apps/v1");
    new["kind"] = json!("DaemonSet");
    w.daemonsets.insert(name.to_owned(), new.clone());
    ok_json(StatusCode::OK, new)
}

async fn replace_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2, body: axum::body::Bytes) -> Response {
    let Ok(new) = serde_json::from_slice::<Value>(&body) else { return status_error(400, "BadRequest", "not JSON") };
    if name_of(&new) != name {
        return status_error(400, "BadRequest", "the name of the object does not match the name on the URL");
    }
    let mut w = sim.world();
    let Some(current) = w.daemonsets.get(&name) else { return not_found("daemonsets.apps", &name) };
    match new["metadata"]["resourceVersion"].as_str() {
        None => {
            return status_error(
                422,
                "Invalid",
                "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
            );
        }
        Some(rv) if Some(rv) != current["metadata"]["resourceVersion"].as_str() => {
            return status_error(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on daemonsets.apps \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                ),
            );
        }
        Some(_) => {}
    }
    update_ds(&mut w, &name, new)
}

fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in changes {
        if v.is_null() {
            if let Some(obj) = target.as_object_mut() {
                obj.remove(k);
            }
        } else {
            merge_patch(&mut target[k.as_str()], v);
        }
    }
}

async fn patch_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2, body: axum::body::Bytes) -> Response {
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else { return status_error(400, "BadRequest", "not JSON") };
    let mut w = sim.world();
    let Some(mut doc) = w.daemonsets.get(&name).cloned() else { return not_found("daemonsets.apps", &name) };
    merge_patch(&mut doc, &patch);
    update_ds(&mut w, &name, doc)
}

async fn delete_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2, req: Request) -> Response {
    let query_policy = query_param(req.uri().query(), "propagationPolicy");
    let body = to_bytes(req.into_body(), 1 << 20).await.unwrap_or_default();
    let opts: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let policy =
        opts["propagationPolicy"].as_str().map(str::to_owned).or(query_policy).unwrap_or_else(|| "Background".into());
    let mut w = sim.world();
    let rv = w.next_rv();
    let Some(ds) = w.daemonsets.get_mut(&name) else { return not_found("daemonsets.apps", &name) };
    if policy == "Foreground" {
        if ds["metadata"]["deletionTimestamp"].is_null() {
            ds["metadata"]["deletionTimestamp"] = json!(now());
            ds["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
            ds["metadata"]["resourceVersion"] = json!(rv);
        }
        return ok_json(StatusCode::OK, ds.clone());
    }
    let gone = w.daemonsets.remove(&name).unwrap_or_default();
    ok_json(
        StatusCode::OK,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "group": "apps", "kind": "daemonsets", "uid": gone["metadata"]["uid"]}}),
    )
}

async fn list_pods(State(sim): State<Arc<Inner>>, P1 { 0: _ns }: P1, req: Request) -> Response {
    let sel = query_param(req.uri().query(), "labelSelector").unwrap_or_default();
    let w = sim.world();
    let items: Vec<Value> =
        w.pods.values().filter(|p| selector_matches(&sel, &p["metadata"]["labels"])).cloned().collect();
    ok_json(
        StatusCode::OK,
        json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": w.resource_version.to_string()}, "items": items}),
    )
}

async fn get_pod(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
    match sim.world().pods.get(&name) {
        Some(p) => ok_json(StatusCode::OK, p.clone()),
        None => not_found("pods", &name),
    }
}

async fn delete_pod(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
    let mut w = sim.world();
    match w.pods.get(&name).cloned() {
        Some(p) => {
            remove_pod(&mut w, &name);
            ok_json(StatusCode::OK, p)
        }
        None => not_found("pods", &name),
    }
}

// ---- an unreachable server ------------------------------------------------------

/// Accepts connections whose reads and writes fail while the simulator is
/// "unreachable": clients see resets, on new and pooled connections alike.
struct FlakyListener {
    inner: TcpListener,
    sim: Arc<Inner>,
}

impl axum::serve::Listener for FlakyListener {
    type Io = FlakyStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => return (FlakyStream { stream, sim: Arc::clone(&self.sim) }, addr),
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

struct FlakyStream {
    stream: TcpStream,
    sim: Arc<Inner>,
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "simulated outage")
}

impl AsyncRead for FlakyStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.sim.is_down() {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for FlakyStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.sim.is_down() {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
