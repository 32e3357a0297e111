//! The simulator's HTTP side: classifying each request into an [`Op`] for
//! the log, holds and error bursts, the handlers of the API subset, and a
//! listener whose connections fail while the server is "unreachable".

use super::*;

/// `labelSelector` and friends, percent-decoded.
pub(super) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
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
fn classify(method: &Method, path: &str, query: Option<&str>, content_type: &str, body: &[u8]) -> Op {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, name) = match parts.as_slice() {
        ["healthz"] => ("healthz", None),
        ["version"] => ("version", None),
        ["apis", "apps", "v1", "namespaces", _, "daemonsets"] => ("daemonsets", None),
        ["apis", "apps", "v1", "namespaces", _, "daemonsets", n] => ("daemonsets", Some((*n).to_owned())),
        ["api", "v1", "namespaces", _, "pods"] => ("pods", None),
        ["api", "v1", "namespaces", _, "pods", n] => ("pods", Some((*n).to_owned())),
        ["api", "v1", "namespaces", _, "pods", n, "eviction"] => ("eviction", Some((*n).to_owned())),
        ["api", "v1", "pods"] => ("pods", None),
        ["api", "v1", "nodes"] => ("nodes", None),
        ["api", "v1", "nodes", n] => ("nodes", Some((*n).to_owned())),
        _ => ("unknown", None),
    };
    // An eviction is logged as `evict pods <name>`, as kubectl would say it.
    let evict = kind == "eviction";
    let kind = if evict { "pods" } else { kind };
    let verb = match (method.as_str(), &name) {
        ("POST", _) if evict => "evict",
        ("GET", None) if matches!(kind, "daemonsets" | "pods" | "nodes") => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "replace",
        ("PATCH", _) if content_type.starts_with("application/apply-patch") => "apply",
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
    Op {
        verb: verb.into(),
        kind: kind.into(),
        name,
        selector: query_param(query, "labelSelector"),
        fields: query_param(query, "fieldSelector"),
        status: 0,
    }
}

/// Records every request, and applies holds and error bursts to it.
pub(super) async fn observe(State(sim): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, 4 << 20).await.unwrap_or_default();
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut op = classify(&parts.method, parts.uri.path(), parts.uri.query(), content_type, &bytes);
    if let Some(token) = &sim.settings.token {
        let want = format!("Bearer {token}");
        if parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
            op.status = 401;
            sim.world().ops.push(op);
            return status_error(401, "Unauthorized", "Unauthorized");
        }
    }
    let (hold, answer_hold) = {
        let mut w = sim.world();
        let w = &mut *w;
        (armed_hold(&mut w.holds, &op), armed_hold(&mut w.answer_holds, &op))
    };
    if let Some(h) = hold {
        park(&h).await;
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
    if let Some(h) = answer_hold {
        park(&h).await;
    }
    res
}

/// The hold among `slots` that this request arms, if any.
fn armed_hold(slots: &mut [HoldSlot], op: &Op) -> Option<Hold> {
    let mut found = None;
    for slot in slots.iter_mut().filter(|s| s.matcher.matches(op)) {
        slot.seen += 1;
        if slot.seen == slot.matcher.nth {
            found = Some(slot.hold.clone());
        }
    }
    found
}

async fn park(h: &Hold) {
    h.hit.store(true, Ordering::SeqCst);
    h.arrived.notify_waiters();
    let _ = h.gate.acquire().await;
}

pub(super) fn status_error(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    });
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(super) fn not_found(kind: &str, name: &str) -> Response {
    status_error(404, "NotFound", &format!("{kind} \"{name}\" not found"))
}

pub(super) fn ok_json(status: StatusCode, v: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

pub(super) fn selector_matches(selector: &str, labels: &Value) -> bool {
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

pub(super) async fn healthz(State(sim): State<Arc<Inner>>) -> Response {
    let mut w = sim.world();
    if w.healthz_failures > 0 {
        w.healthz_failures -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "[-]etcd failed: reason withheld\nhealthz check failed")
            .into_response();
    }
    "ok".into_response()
}

pub(super) async fn version(State(sim): State<Arc<Inner>>) -> Response {
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

pub(super) async fn list_ds(State(sim): State<Arc<Inner>>, P1 { 0: _ns }: P1, req: Request) -> Response {
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

pub(super) async fn create_ds(State(sim): State<Arc<Inner>>, P1 { 0: ns }: P1, req: Request) -> Response {
    let manager = query_param(req.uri().query(), "fieldManager").unwrap_or_else(|| "unknown".into());
    let body = to_bytes(req.into_body(), 4 << 20).await.unwrap_or_default();
    let Ok(mut ds) = serde_json::from_slice::<Value>(&body) else {
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
    super::apply::record_manager(&mut ds, &manager, "Update");
    let stored = store_new_ds(&mut w, &ns, ds);
    ok_json(StatusCode::CREATED, stored)
}

pub(super) async fn get_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
    match sim.world().daemonsets.get(&name) {
        Some(d) => ok_json(StatusCode::OK, d.clone()),
        None => not_found("daemonsets.apps", &name),
    }
}

/// Stores `new` in place of the DaemonSet `name`: identity and status are
/// the server's; a changed spec bumps the generation.
pub(super) fn update_ds(w: &mut World, name: &str, mut new: Value) -> Response {
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

pub(super) async fn replace_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2, req: Request) -> Response {
    let manager = query_param(req.uri().query(), "fieldManager").unwrap_or_else(|| "unknown".into());
    let body = to_bytes(req.into_body(), 4 << 20).await.unwrap_or_default();
    let Ok(mut new) = serde_json::from_slice::<Value>(&body) else {
        return status_error(400, "BadRequest", "not JSON");
    };
    super::apply::record_manager(&mut new, &manager, "Update");
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

pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
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

pub(super) async fn delete_ds(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2, req: Request) -> Response {
    let query_policy = query_param(req.uri().query(), "propagationPolicy");
    let body = to_bytes(req.into_body(), 1 << 20).await.unwrap_or_default();
    let opts: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let policy =
        opts["propagationPolicy"].as_str().map(str::to_owned).or(query_policy).unwrap_or_else(|| "Background".into());
    let mut w = sim.world();
    let rv = w.next_rv();
    let Some(current) = w.daemonsets.get(&name) else { return not_found("daemonsets.apps", &name) };
    if let Some(refused) = super::apply::preconditions_fail(&opts, current) {
        return refused;
    }
    if current["metadata"]["deletionTimestamp"].is_null() {
        super::apply::watch_delete(&mut w, &name);
    }
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

pub(super) async fn list_pods(State(sim): State<Arc<Inner>>, P1 { 0: _ns }: P1, req: Request) -> Response {
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

pub(super) async fn get_pod(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
    match sim.world().pods.get(&name) {
        Some(p) => ok_json(StatusCode::OK, p.clone()),
        None => not_found("pods", &name),
    }
}

pub(super) async fn delete_pod(State(sim): State<Arc<Inner>>, P2 { 0: (_ns, name) }: P2) -> Response {
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
pub(super) struct FlakyListener {
    pub(super) inner: TcpListener,
    pub(super) sim: Arc<Inner>,
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

pub(super) struct FlakyStream {
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
