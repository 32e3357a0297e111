//! Namespaces and grants: two teams on one drover. A credential of one
//! team reaches nothing of the other's through any documented operation
//! (the matrix is read from the OpenAPI document, so a new operation is
//! covered or fails the test), mints nothing beyond what it holds, and two
//! pools of the same name in two namespaces keep their machines apart.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, client_with_token};
use crate::upgrade_env::{Env, FROM, SIM_TOKEN, TO, spawn_env};

const LIMIT: Duration = Duration::from_secs(30);

async fn call(
    app: &TestApp,
    client: &reqwest::Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client.request(method, app.url(path)).timeout(Duration::from_secs(10));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
    let code = res.status().as_u16();
    let text = res.text().await.unwrap_or_default();
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn admin(app: &TestApp, method: Method, path: &str, body: Option<Value>, expect: u16) -> Value {
    let (code, body) = call(app, &app.client, method.clone(), path, body).await;
    assert_eq!(code, expect, "{method} {path}: {body}");
    body
}

/// A token holding `grants`, made by the bootstrap admin.
async fn token(app: &TestApp, name: &str, grants: Value) -> reqwest::Client {
    let made = admin(app, Method::POST, "/v1/tokens", Some(json!({"name": name, "grants": grants})), 201).await;
    client_with_token(made["token"].as_str().expect("the new token's secret"))
}

/// Two teams, each with a pool `web` of 2 machines; team-b also has a
/// cluster `prod`, an upgrade job (ended) and a token `b-ci`.
struct Teams {
    env: Env,
    job: i64,
    b_machine: String,
}

async fn teams() -> Teams {
    let env = spawn_env(|_| {}).await;
    let app = &env.app;
    for ns in ["team-a", "team-b"] {
        admin(app, Method::POST, "/v1/namespaces", Some(json!({"name": ns})), 201).await;
        let pool = json!({"name": "web", "replicas": 2, "version": FROM});
        admin(app, Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool), 201).await;
    }
    let cluster = json!({"name": "prod", "server": env.sim.url(), "token": SIM_TOKEN});
    admin(app, Method::POST, "/v1/clusters?namespace=team-b", Some(cluster), 201).await;
    let started =
        admin(app, Method::POST, "/v1/clusters/prod/upgrades?namespace=team-b", Some(json!({"version": TO})), 202)
            .await;
    let job = started["id"].as_i64().expect("the job's id");
    crate::helpers::wait_for(LIMIT, "team-b's upgrade job to end", async || {
        let job = admin(app, Method::GET, &format!("/v1/upgrades/{job}?namespace=team-b"), None, 200).await;
        !matches!(job["state"].as_str(), Some("pending" | "running"))
    })
    .await;
    let _ = token(app, "b-ci", json!([{"namespace": "team-b", "role": "operator"}])).await;
    let b_machine = crate::helpers::wait_some(LIMIT, "team-b's web to have 2 machines", async || {
        let list = admin(app, Method::GET, "/v1/pools/web/machines?namespace=team-b", None, 200).await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        (items.len() == 2).then(|| items[0]["name"].as_str().map(str::to_owned)).flatten()
    })
    .await;
    Teams { env, job, b_machine }
}

/// What team-b holds, as its admin sees it: compared before and after
/// team-a's attempts.
async fn team_b_state(app: &TestApp) -> Value {
    let mut state = json!({});
    for path in [
        "/v1/pools",
        "/v1/pools/web",
        "/v1/pools/web/machines",
        "/v1/pools/web/revisions",
        "/v1/pools/web/events",
        "/v1/clusters",
        "/v1/upgrades",
        "/v1/tokens",
    ] {
        let mut body = admin(app, Method::GET, &format!("{path}?namespace=team-b"), None, 200).await;
        if path == "/v1/upgrades" {
            // And the events of each job.
            for job in body["items"].as_array().cloned().unwrap_or_default() {
                let events = format!("/v1/upgrades/{}/events?namespace=team-b", job["id"]);
                state[events.as_str()] = admin(app, Method::GET, &events, None, 200).await;
            }
        }
        // What moves by itself: a pool's observed status, a token's last use.
        strip(&mut body, &["status", "last_used_at", "conditions", "observed_at"]);
        state[path] = body;
    }
    state
}

/// Team-b's state once it stopped moving by itself (its machines ready,
/// their events written): the same in two looks half a second apart.
async fn settled_state(app: &TestApp) -> Value {
    let mut last = team_b_state(app).await;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = team_b_state(app).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("team-b's state never settled: {last:#}");
}

fn strip(v: &mut Value, keys: &[&str]) {
    match v {
        Value::Object(map) => {
            for k in keys {
                map.remove(*k);
            }
            map.values_mut().for_each(|v| strip(v, keys));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strip(v, keys)),
        _ => {}
    }
}

/// A body for each operation that takes one; the matrix fails on an
/// operation with a required body that is not listed here.
fn body_for(method: &str, path: &str, sim: &str) -> Option<Value> {
    let pool = json!({"name": "intruder", "replicas": 1, "version": FROM});
    Some(match (method, path) {
        ("post", "/v1/pools") => pool,
        ("patch", "/v1/pools/{name}") | ("put", "/v1/pools/{name}/scale") => json!({"replicas": 0}),
        ("post", "/v1/pools/{name}/plan") => json!({"replicas": 0}),
        ("post", "/v1/clusters") => json!({"name": "intruder", "server": sim, "token": "t"}),
        ("post", "/v1/clusters/{name}/upgrades" | "/v1/clusters/{name}/upgrades/plan") => json!({"version": TO}),
        ("post", "/v1/apply") => json!({
            "apply_set": "intruder",
            "prune": true,
            "documents": [{"kind": "Pool", "name": "web", "spec": {"replicas": 0, "version": FROM}}],
        }),
        _ => return None,
    })
}

/// Every operation of a namespaced path in the committed document.
fn namespaced_operations() -> Vec<(String, String, bool)> {
    let doc: Value = serde_json::from_str(include_str!("../../openapi/openapi.json")).expect("the committed document");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            if params.iter().any(|p| p["name"] == "namespace" && p["in"] == "query") {
                let body_required = op["requestBody"]["required"].as_bool().unwrap_or(false);
                ops.push((method.clone(), path.clone(), body_required));
            }
        }
    }
    ops
}

#[tokio::test]
async fn a_credential_of_one_namespace_reaches_nothing_of_another_through_any_operation() {
    let t = teams().await;
    let app = &t.env.app;
    let a = token(app, "a-admin", json!([{"namespace": "team-a", "role": "admin"}])).await;
    let before = settled_state(app).await;
    let sim_writes = t.env.sim.ops().iter().filter(|o| o.is_write()).count();

    let ops = namespaced_operations();
    for prefix in ["/v1/pools", "/v1/clusters", "/v1/upgrades", "/v1/apply", "/v1/audit"] {
        assert!(ops.iter().any(|(_, p, _)| p.starts_with(prefix)), "no operation of {prefix} takes `namespace`");
    }
    let mut tried = Vec::new();
    for (method, template, body_required) in &ops {
        let body = body_for(method, template, &t.env.sim.url());
        assert!(body.is_some() || !body_required, "{method} {template} needs a body: add it to body_for");
        let concrete = template
            .replace("{machine}", &t.b_machine)
            .replace("{id}", &t.job.to_string())
            .replace("/v1/clusters/{name}", "/v1/clusters/prod")
            .replace("{name}", "web");
        assert!(!concrete.contains('{'), "a path parameter of {template} is not filled in");
        let m = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        // Named outright, and (for what is reached by id) from team-a.
        for ns in ["team-b", "team-a"] {
            if ns == "team-a" && !template.contains("{id}") {
                continue;
            }
            let path = format!("{concrete}?namespace={ns}");
            let (code, answer) = call(app, &a, m.clone(), &path, body.clone()).await;
            assert!(code == 403 || code == 404, "team-a's admin reached {method} {path} of team-b: {code} {answer}");
            tried.push(format!("{method} {path} -> {code}"));
        }
    }
    assert!(tried.len() >= 30, "the document lists too few namespaced operations: {tried:#?}");

    // Every namespace at once: team-a's own only.
    let (code, pools) = call(app, &a, Method::GET, "/v1/pools?namespace=*", None).await;
    assert_eq!(code, 200, "{pools}");
    let namespaces: Vec<&str> =
        pools["items"].as_array().expect("items").iter().filter_map(|p| p["namespace"].as_str()).collect();
    assert_eq!(namespaces, ["team-a"], "{pools}");
    let (code, answer) = call(app, &a, Method::GET, "/v1/pools?namespace=*&cursor=web", None).await;
    assert_eq!(code, 422, "a cursor this server did not hand out is refused, not read as the start: {answer}");

    let after = team_b_state(app).await;
    for (path, was) in before.as_object().expect("an object") {
        assert_eq!(&after[path], was, "team-a's attempts changed {path} of team-b: {tried:#?}");
    }
    let after = t.env.sim.ops().iter().filter(|o| o.is_write()).count();
    assert_eq!(after, sim_writes, "team-a's attempts wrote to team-b's cluster");
}

#[tokio::test]
async fn no_credential_mints_or_widens_a_credential_beyond_what_it_holds() {
    let env = spawn_env(|_| {}).await;
    let app = &env.app;
    for ns in ["team-a", "team-b"] {
        admin(app, Method::POST, "/v1/namespaces", Some(json!({"name": ns})), 201).await;
    }
    admin(
        app,
        Method::POST,
        "/v1/pools?namespace=team-a",
        Some(json!({"name": "web", "replicas": 1, "version": FROM})),
        201,
    )
    .await;
    let a = token(app, "a-admin", json!([{"namespace": "team-a", "role": "admin"}])).await;
    let _ = token(app, "b-ci", json!([{"namespace": "team-b", "role": "operator"}])).await;
    let new = |grants: Value| json!({"name": "minted", "grants": grants});
    for (what, body) in [
        ("a grant in another namespace", new(json!([{"namespace": "team-b", "role": "viewer"}]))),
        ("a grant on every namespace", new(json!([{"namespace": "*", "role": "viewer"}]))),
        ("a global role", json!({"name": "minted", "role": "viewer"})),
    ] {
        let (code, answer) = call(app, &a, Method::POST, "/v1/tokens", Some(body)).await;
        assert!(code == 403 || code == 404, "a namespace's admin minted {what}: {code} {answer}");
    }
    // Within its namespace, at most its own role.
    let (code, made) = call(
        app,
        &a,
        Method::POST,
        "/v1/tokens",
        Some(json!({"name": "made-op", "grants": [{"namespace": "team-a", "role": "operator"}]})),
    )
    .await;
    assert_eq!(code, 201, "{made}");
    let operator = client_with_token(made["token"].as_str().expect("secret"));
    let body = json!({"name": "wider", "grants": [{"namespace": "team-a", "role": "admin"}]});
    let (code, answer) = call(app, &operator, Method::POST, "/v1/tokens", Some(body)).await;
    assert_eq!(code, 403, "an operator minted an admin: {answer}");
    let body = json!({"name": "lesser", "grants": [{"namespace": "team-a", "role": "viewer"}]});
    let (code, answer) = call(app, &operator, Method::POST, "/v1/tokens", Some(body)).await;
    assert_eq!(code, 403, "only a namespace's admin manages its tokens: {answer}");

    // An apply whose documents name another namespace is refused whole.
    let apply = json!({
        "apply_set": "a-fleet",
        "documents": [
            {"kind": "Pool", "name": "mine", "spec": {"replicas": 0, "version": FROM}},
            {"kind": "Pool", "name": "theirs", "namespace": "team-b", "spec": {"replicas": 0, "version": FROM}},
        ],
    });
    let (code, answer) = call(app, &a, Method::POST, "/v1/apply?namespace=team-a", Some(apply)).await;
    assert_eq!(code, 422, "{answer}");
    assert!(answer.to_string().contains("namespace"), "the refusal names the namespace: {answer}");
    for (ns, pool) in [("team-a", "mine"), ("team-b", "theirs")] {
        let (code, _) = call(app, &app.client, Method::GET, &format!("/v1/pools/{pool}?namespace={ns}"), None).await;
        assert_eq!(code, 404, "nothing of a refused apply was applied ({ns}/{pool})");
    }

    // A prune of a set of the same name in team-a never reaches default's.
    let fleet = json!({"apply_set": "shared", "documents": [
        {"kind": "Pool", "name": "keep", "spec": {"replicas": 0, "version": FROM}},
    ]});
    admin(app, Method::POST, "/v1/apply", Some(fleet), 200).await;
    let empty = json!({"apply_set": "shared", "prune": true, "allow_empty": true, "documents": []});
    let (code, answer) = call(app, &a, Method::POST, "/v1/apply?namespace=team-a", Some(empty)).await;
    assert_eq!(code, 200, "{answer}");
    admin(app, Method::GET, "/v1/pools/keep", None, 200).await;

    // What only a `*` admin does.
    for (method, path, body) in [
        (Method::POST, "/v1/namespaces", Some(json!({"name": "team-c"}))),
        (Method::DELETE, "/v1/namespaces/team-b", None),
        (Method::PATCH, "/v1/namespaces/team-a", Some(json!({"engine_selector": {}}))),
        (Method::POST, "/v1/engines", Some(json!({"name": "e2", "endpoint": "unix:///nowhere.sock"}))),
        (Method::DELETE, "/v1/tokens/bootstrap-admin", None),
        (Method::DELETE, "/v1/tokens/b-ci", None),
    ] {
        let (code, answer) = call(app, &a, method.clone(), path, body).await;
        assert!(code == 403 || code == 404, "team-a's admin did {method} {path}: {code} {answer}");
    }
    // The operator works in its namespace, and nowhere else.
    let (code, answer) =
        call(app, &operator, Method::PUT, "/v1/pools/web/scale?namespace=team-a", Some(json!({"replicas": 0}))).await;
    assert_eq!(code, 200, "{answer}");
    // The change is in team-a's trail, which team-a's admin reads.
    let (code, trail) = call(app, &a, Method::GET, "/v1/audit?namespace=team-a", None).await;
    assert_eq!(code, 200, "{trail}");
    let scaled = trail["items"].as_array().expect("items").iter().any(|r| {
        r["token_name"] == "made-op" && r["method"] == "PUT" && r["namespace"] == "team-a" && r["outcome"] == "allowed"
    });
    assert!(scaled, "the operator's scale is in team-a's trail: {trail:#}");
    let (code, answer) = call(app, &a, Method::GET, "/v1/audit", None).await;
    assert!(code == 403 || code == 404, "the whole trail is a `*` admin's: {code} {answer}");
    let (code, answer) = call(app, &operator, Method::GET, "/v1/pools", None).await;
    assert_eq!(code, 404, "default is not the operator's: hidden as a missing one: {answer}");
    let tokens = admin(app, Method::GET, "/v1/tokens", None, 200).await;
    let names: Vec<&str> =
        tokens["items"].as_array().expect("items").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"minted") && !names.contains(&"wider") && !names.contains(&"lesser"), "{names:?}");
    assert!(names.contains(&"b-ci") && names.contains(&"bootstrap-admin"), "{names:?}");
    // A namespace's admin lists the tokens it manages, and no other.
    let (code, listed) = call(app, &a, Method::GET, "/v1/tokens", None).await;
    assert_eq!(code, 200, "{listed}");
    let names: Vec<&str> =
        listed["items"].as_array().expect("items").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["a-admin", "made-op"], "{listed}");
}

#[tokio::test]
async fn two_pools_of_one_name_in_two_namespaces_keep_their_machines_apart() {
    let env = spawn_env(|_| {}).await;
    let app = &env.app;
    for ns in ["team-a", "team-b"] {
        admin(app, Method::POST, "/v1/namespaces", Some(json!({"name": ns})), 201).await;
        let pool = json!({"name": "web", "replicas": 3, "version": FROM});
        admin(app, Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool), 201).await;
    }
    let machines = async |ns: &str, n: usize| -> Vec<String> {
        crate::helpers::wait_some(LIMIT, &format!("{ns}'s web to have {n} machines"), async || {
            let list = admin(app, Method::GET, &format!("/v1/pools/web/machines?namespace={ns}"), None, 200).await;
            let names: Vec<String> = list["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect();
            (names.len() == n).then_some(names)
        })
        .await
    };
    let a = machines("team-a", 3).await;
    let b = machines("team-b", 3).await;
    assert!(a.iter().all(|m| !b.contains(m)), "one machine in two namespaces: {a:?} {b:?}");

    admin(app, Method::PUT, "/v1/pools/web/scale?namespace=team-a", Some(json!({"replicas": 1})), 200).await;
    let a = machines("team-a", 1).await;
    let still_b = machines("team-b", 3).await;
    assert_eq!(still_b, b, "scaling team-a's web touched team-b's: {a:?}");

    // A namespace that holds a pool stays; `default` always does.
    let busy = admin(app, Method::DELETE, "/v1/namespaces/team-a", None, 409).await;
    assert!(busy.to_string().contains("pool"), "{busy}");
    admin(app, Method::DELETE, "/v1/namespaces/default", None, 409).await;
    admin(app, Method::DELETE, "/v1/pools/web?namespace=team-a", None, 202).await;
    machines("team-b", 3).await;
    crate::helpers::wait_for(LIMIT, "team-a's web to be gone", async || {
        call(app, &app.client, Method::GET, "/v1/pools/web?namespace=team-a", None).await.0 == 404
    })
    .await;
    admin(app, Method::DELETE, "/v1/namespaces/team-a", None, 204).await;
    let (code, _) = call(app, &app.client, Method::GET, "/v1/pools?namespace=team-a", None).await;
    assert_eq!(code, 404, "a deleted namespace is gone");
}
