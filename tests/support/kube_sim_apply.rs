//! The simulator's server-side apply of DaemonSets, and the safety
//! invariant it watches while an upgrade runs.
//!
//! Apply (`PATCH` with `application/apply-patch+yaml`), as the API server
//! does it, within what drover uses: `fieldManager` is required; a missing
//! object is created (201); an object whose fields only this manager set
//! becomes exactly what is applied (fields it stopped applying go); fields
//! another manager set are a 409 conflict unless `force=true`, which takes
//! them over (the applied fields are merged onto the object). Every write
//! records its manager in `metadata.managedFields` (`Apply` or `Update`),
//! without the per-field detail the real server keeps.
//!
//! The invariant: a temporary copy `temp-upgrade-<ds>` is never deleted
//! while its real DaemonSet `<ds>` rolls, i.e. while the real one has no
//! pod, or a pod that is not Running, is terminating, or runs an older
//! template. Each breach is recorded, for tests to assert there is none.

use super::http::{merge_patch, not_found, ok_json, query_param, status_error};
use super::*;

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

type P2 = axum::extract::Path<(String, String)>;

/// `PATCH` of a DaemonSet: merge patch or server-side apply, by content type.
pub(super) async fn patch_ds(State(sim): State<Arc<Inner>>, P2 { 0: (ns, name) }: P2, req: Request) -> Response {
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let query = req.uri().query().map(str::to_owned);
    let body = to_bytes(req.into_body(), 4 << 20).await.unwrap_or_default();
    let Ok(doc) = serde_json::from_slice::<Value>(&body) else { return status_error(400, "BadRequest", "not JSON") };
    let mut w = sim.world();
    match content_type.split(';').next().unwrap_or("").trim() {
        APPLY => apply(&mut w, &ns, &name, query.as_deref(), doc),
        MERGE => {
            let Some(mut current) = w.daemonsets.get(&name).cloned() else {
                return not_found("daemonsets.apps", &name);
            };
            merge_patch(&mut current, &doc);
            let manager = query_param(query.as_deref(), "fieldManager").unwrap_or_else(|| "unknown".into());
            record_manager(&mut current, &manager, "Update");
            http::update_ds(&mut w, &name, current)
        }
        other => status_error(
            415,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format: {other}"),
        ),
    }
}

fn apply(w: &mut World, ns: &str, name: &str, query: Option<&str>, applied: Value) -> Response {
    let Some(manager) = query_param(query, "fieldManager").filter(|m| !m.is_empty()) else {
        return status_error(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        );
    };
    let force = query_param(query, "force").as_deref() == Some("true");
    if applied["apiVersion"] != "apps/v1" || applied["kind"] != "DaemonSet" {
        return status_error(400, "BadRequest", "apiVersion and kind must be apps/v1 DaemonSet in an apply patch");
    }
    if applied["metadata"]["name"].as_str() != Some(name) {
        return status_error(400, "BadRequest", "the name of the object does not match the name on the URL");
    }
    let Some(current) = w.daemonsets.get(name).cloned() else {
        if applied["spec"]["template"]["spec"]["containers"].as_array().is_none_or(|c| c.is_empty()) {
            return status_error(422, "Invalid", "spec.template.spec.containers: Required value");
        }
        let mut new = applied;
        record_manager(&mut new, &manager, "Apply");
        return ok_json(StatusCode::CREATED, store_new_ds(w, ns, new));
    };
    if let Some(rv) = applied["metadata"]["resourceVersion"].as_str()
        && Some(rv) != current["metadata"]["resourceVersion"].as_str()
    {
        return status_error(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on daemonsets.apps \"{name}\": the object has been modified"),
        );
    }
    let others: Vec<String> = managers(&current).into_iter().filter(|m| *m != manager).collect();
    if !others.is_empty() && !force {
        return status_error(
            409,
            "Conflict",
            &format!("Apply failed with {} conflict(s): conflict with {:?}", others.len(), others.join(", ")),
        );
    }
    let mut new = if others.is_empty() {
        // Only this manager set the object: it becomes what is applied.
        let mut new = applied;
        new["metadata"]["managedFields"] = current["metadata"]["managedFields"].clone();
        new
    } else {
        let mut merged = current.clone();
        merge_patch(&mut merged, &applied);
        merged
    };
    new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    record_manager(&mut new, &manager, "Apply");
    http::update_ds(w, name, new)
}

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|fs| fs.iter().filter_map(|f| f["manager"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Notes that `manager` wrote the object, by `operation` (Apply or Update).
pub(super) fn record_manager(obj: &mut Value, manager: &str, operation: &str) {
    let mut fields: Vec<Value> = obj["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    fields.retain(|f| f["manager"] != manager);
    fields.push(json!({"manager": manager, "operation": operation, "apiVersion": "apps/v1", "time": now()}));
    obj["metadata"]["managedFields"] = json!(fields);
}

/// Why the real DaemonSet of a temporary copy still rolls, if it does.
pub(super) fn real_rolls(w: &World, temp: &str) -> Option<String> {
    let real_name = temp.strip_prefix("temp-upgrade-")?;
    let Some(real) = w.daemonsets.get(real_name) else { return Some(format!("{real_name} does not exist")) };
    let hash = template_hash(real);
    let pods: Vec<&Value> =
        w.pods.values().filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == real["metadata"]["uid"]).collect();
    if pods.is_empty() {
        return Some(format!("{real_name} has no pod"));
    }
    pods.iter().find_map(|p| {
        let pod = name_of(p);
        if p["status"]["phase"] != "Running" {
            Some(format!("pod {pod} of {real_name} is {}", p["status"]["phase"]))
        } else if w.terminating.contains_key(&pod) || !p["metadata"]["deletionTimestamp"].is_null() {
            Some(format!("pod {pod} of {real_name} is terminating"))
        } else if p["metadata"]["labels"]["controller-revision-hash"] != hash.as_str() {
            Some(format!("pod {pod} of {real_name} runs an older template"))
        } else {
            None
        }
    })
}

/// Called when a delete of DaemonSet `name` is accepted.
pub(super) fn watch_delete(w: &mut World, name: &str) {
    if let Some(why) = real_rolls(w, name) {
        w.violations.push(format!("temporary DaemonSet {name} deleted while {why}"));
    }
}

/// A delete's preconditions (uid, resourceVersion) against the object.
pub(super) fn preconditions_fail(opts: &Value, current: &Value) -> Option<Response> {
    let pre = &opts["preconditions"];
    for (key, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        if let Some(want) = pre[key].as_str()
            && Some(want) != current["metadata"][key].as_str()
        {
            let have = current["metadata"][key].as_str().unwrap_or_default();
            return Some(status_error(
                409,
                "Conflict",
                &format!("Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"),
            ));
        }
    }
    None
}
