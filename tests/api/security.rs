//! Tokens, roles, audit, idempotent writes and load shedding.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::helpers::{Param, TestApp, assert_problem, client_with_token, spawn_app, wait_for, wait_some};

async fn make_token(app: &TestApp, name: &str, role: &str) -> String {
    let res = app.request(Method::POST, "/v1/tokens", Some(json!({"name": name, "role": role}))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let body: Value = res.json().await.unwrap();
    body["token"].as_str().unwrap().to_owned()
}

/// The least role each route needs, written out independently of the
/// server's own table.
fn needed(method: &str, path: &str) -> Option<&'static str> {
    if matches!(path, "/healthz" | "/readyz") {
        return None;
    }
    if path.starts_with("/v1/tokens") || path == "/v1/audit" {
        return Some("admin");
    }
    let operator = [
        ("put", "/v1/pools/{name}/scale"),
        ("patch", "/v1/pools/{name}"),
        ("post", "/v1/pools/{name}/rollout/continue"),
        ("post", "/v1/pools/{name}/rollback"),
        ("post", "/v1/pools/{name}/machines/{machine}/delete-request"),
        ("delete", "/v1/pools/{name}/machines/{machine}"),
        ("post", "/v1/clusters/{name}/upgrades"),
        ("post", "/v1/upgrades/{id}/cancel"),
    ];
    // Dry runs: a plan (a pool's, an upgrade's), and an apply (whose
    // changes each need their own route's role, checked by the apply
    // itself: tests/api/apply.rs).
    let dry_runs = ["/v1/pools/{name}/plan", "/v1/clusters/{name}/upgrades/plan", "/v1/apply"];
    if method == "get" || (method == "post" && dry_runs.contains(&path)) {
        Some("viewer")
    } else if operator.contains(&(method, path)) {
        Some("operator")
    } else {
        Some("admin")
    }
}

fn rank(role: &str) -> u8 {
    match role {
        "viewer" => 1,
        "operator" => 2,
        _ => 3,
    }
}

#[tokio::test]
async fn every_route_in_the_openapi_document_enforces_the_role_matrix() {
    let app = spawn_app().await;
    let mut clients: HashMap<&str, reqwest::Client> = HashMap::new();
    clients.insert("none", reqwest::Client::new());
    clients.insert("bad", client_with_token("drover_not-a-real-token"));
    clients.insert("viewer", client_with_token(&make_token(&app, "matrix-viewer", "viewer").await));
    clients.insert("operator", client_with_token(&make_token(&app, "matrix-operator", "operator").await));
    clients.insert("admin", app.client.clone());

    let doc = drover::http::openapi().expect("the OpenAPI document");
    let doc = serde_json::to_value(&doc).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let concrete =
                path.replace("{name}", "nosuch").replace("{machine}", "worker-nosuch").replace("{id}", "999999");
            let need = needed(method, path);
            for (who, client) in &clients {
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let mut req = client.request(m, app.url(&concrete));
                if matches!(method.as_str(), "post" | "put" | "patch") {
                    req = req.header("content-type", "application/json").body("{}");
                }
                let status = req.send().await.unwrap().status();
                let expect_denied = match (need, *who) {
                    (None, _) => None,
                    (Some(_), "none" | "bad") => Some(StatusCode::UNAUTHORIZED),
                    (Some(need), role) if rank(role) < rank(need) => Some(StatusCode::FORBIDDEN),
                    _ => None,
                };
                match expect_denied {
                    Some(code) => assert_eq!(status, code, "{who} {method} {path}"),
                    None => assert!(
                        status != StatusCode::UNAUTHORIZED
                            && status != StatusCode::FORBIDDEN
                            && !status.is_server_error()
                            || (path == "/readyz" && status == StatusCode::SERVICE_UNAVAILABLE),
                        "{who} {method} {path} answered {status}"
                    ),
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 5 * 25, "only {checked} combinations checked");
}

#[tokio::test]
async fn denials_are_problems_that_reveal_nothing() {
    let app = spawn_app().await;
    app.create_pool_ok("secret", 1, json!({"paused": true})).await;
    let anon = reqwest::Client::new();
    for path in ["/v1/pools/secret", "/v1/pools/missing"] {
        let res = anon.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.headers()["www-authenticate"], "Bearer realm=\"drover\"");
        let body = assert_problem(res, 401, None).await;
        assert!(!body.to_string().contains("secret"), "{body}");
    }
    let viewer = client_with_token(&make_token(&app, "v", "viewer").await);
    let a = viewer.delete(app.url("/v1/pools/secret")).send().await.unwrap();
    let b = viewer.delete(app.url("/v1/pools/missing")).send().await.unwrap();
    let (a, b) = (assert_problem(a, 403, None).await, assert_problem(b, 403, None).await);
    assert_eq!(a, b, "existing and missing pools are refused alike");
}

#[tokio::test]
async fn operators_scale_and_roll_but_only_admins_reshape_pools() {
    let app = spawn_app().await;
    app.create_pool_ok("ops", 1, json!({"paused": true})).await;
    let op = client_with_token(&make_token(&app, "op", "operator").await);
    let patch = |body: Value| {
        op.patch(app.url("/v1/pools/ops"))
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
    };
    assert_eq!(patch(json!({"replicas": 2, "version": "v1.30.0"})).await.unwrap().status(), StatusCode::OK);
    assert_problem(patch(json!({"labels": {"a": "b"}})).await.unwrap(), 403, None).await;
    assert_eq!(
        op.put(app.url("/v1/pools/ops/scale")).json(&json!({"replicas": 3})).send().await.unwrap().status(),
        StatusCode::OK
    );
    let create = op
        .post(app.url("/v1/pools"))
        .json(&json!({"name": "nope", "replicas": 1, "version": "v1.29.2"}))
        .send()
        .await
        .unwrap();
    assert_problem(create, 403, None).await;
}

#[tokio::test]
async fn tokens_are_shown_once_stored_hashed_and_revocable() {
    let app = spawn_app().await;
    let secret = make_token(&app, "ci", "operator").await;
    let list: Value = app.get("/v1/tokens").await.json().await.unwrap();
    assert!(!list.to_string().contains(&secret), "a listing never shows a secret");
    let names: Vec<&str> = list["items"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bootstrap-admin", "ci"]);
    let dup = app.request(Method::POST, "/v1/tokens", Some(json!({"name": "ci", "role": "viewer"}))).await;
    assert_problem(dup, 409, None).await;
    let bad_role = app.request(Method::POST, "/v1/tokens", Some(json!({"name": "x", "role": "root"}))).await;
    assert_problem(bad_role, 422, Some("role")).await;

    // The store holds only hashes of tokens.
    crate::helpers::assert_only_hashes_stored(&app, &[&secret, &app.admin_token]).await;

    let ci = client_with_token(&secret);
    assert_eq!(ci.get(app.url("/v1/pools")).send().await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.request(Method::DELETE, "/v1/tokens/ci", None).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(ci.get(app.url("/v1/pools")).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_problem(app.request(Method::DELETE, "/v1/tokens/bootstrap-admin", None).await, 409, None).await;
}

#[cfg(unix)]
#[tokio::test]
async fn the_admin_token_file_and_the_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::TempDir::new().unwrap();
    let cfg = crate::helpers::sqlite_config(tmp.path(), drover::config::RuntimeKind::Simulated);
    let app = crate::helpers::start(cfg, Some(tmp)).await;
    for file in ["admin.token", "drover.db"] {
        let mode = std::fs::metadata(app.data_dir.join(file)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file} has mode {mode:o}");
    }
    let dir = std::fs::metadata(&app.data_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir, 0o700);
}

#[tokio::test]
async fn mutating_requests_are_audited_allowed_or_not() {
    let app = spawn_app().await;
    app.create_pool_ok("aud", 0, json!({"paused": true})).await;
    let viewer = client_with_token(&make_token(&app, "peek", "viewer").await);
    viewer.delete(app.url("/v1/pools/aud")).send().await.unwrap();
    reqwest::Client::new().delete(app.url("/v1/pools/aud")).send().await.unwrap();
    app.scale("aud", 2).await;
    // Refusals are audited by a background writer (they never wait on the
    // store), within a second.
    let expected = [
        (json!("PUT"), json!("bootstrap-admin"), json!("allowed"), json!("pools/aud")),
        (json!("DELETE"), Value::Null, json!("unauthenticated"), json!("pools/aud")),
        (json!("DELETE"), json!("peek"), json!("forbidden"), json!("pools/aud")),
    ];
    let rows = wait_some(Duration::from_secs(10), "the refusals' audit records", async || {
        let audit: Value = app.get("/v1/audit?limit=10").await.json().await.ok()?;
        let rows: Vec<(Value, Value, Value, Value)> = audit["items"]
            .as_array()?
            .iter()
            .map(|a| (a["method"].clone(), a["token_name"].clone(), a["outcome"].clone(), a["resource"].clone()))
            .collect();
        expected.iter().all(|e| rows.contains(e)).then_some(rows)
    })
    .await;
    assert!(rows.iter().any(|r| r.0 == "POST" && r.3 == "pools"), "the create was audited: {rows:?}");
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_answer_and_refuses_another_body() {
    let app = spawn_app().await;
    let post = |body: Value, key: &'static str| {
        app.client.post(app.url("/v1/pools")).header("idempotency-key", key).json(&body).send()
    };
    let body = json!({"name": "once", "replicas": 0, "version": "v1.29.2", "paused": true});
    let first = post(body.clone(), "k-1").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body: Value = first.json().await.unwrap();
    let again = post(body.clone(), "k-1").await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED, "the first answer, not a 409");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], "/v1/pools/once");
    assert_eq!(again.json::<Value>().await.unwrap(), first_body);
    assert_eq!(app.events("once").await.len(), 1, "the work was done once");

    let other = post(json!({"name": "twice", "replicas": 0, "version": "v1.29.2"}), "k-1").await.unwrap();
    assert_problem(other, 422, Some("Idempotency-Key")).await;
    assert_problem(app.get("/v1/pools/twice").await, 404, None).await;

    // Errors are remembered too: the same bad request gets the same 422.
    let bad = json!({"name": "BAD", "replicas": 0, "version": "v1.29.2"});
    assert_eq!(post(bad.clone(), "k-2").await.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(post(bad, "k-2").await.unwrap().headers()["idempotent-replayed"], "true");
}

#[tokio::test]
async fn beyond_the_concurrency_limit_requests_are_shed_with_retry_after() {
    let tmp = tempfile::TempDir::new().unwrap();
    let mut cfg = crate::helpers::config(tmp.path(), drover::config::RuntimeKind::Simulated);
    cfg.max_concurrent_requests = 1;
    let app = crate::helpers::start(cfg, Some(tmp)).await;
    // Hold the only slot: a request whose body never finishes arriving.
    let addr = app.addr.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/pools HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
        app.admin_token
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    wait_for(Duration::from_secs(5), "the slow request to take the only slot", async || {
        app.state.inflight.available_permits() == 0
    })
    .await;
    let res = app.get("/v1/pools").await;
    assert_eq!(
        res.headers().get("retry-after").map(|v| v.to_str().unwrap_or_default().to_owned()),
        Some("1".to_owned())
    );
    assert_problem(res, 503, None).await;
    drop(slow);
    wait_for(Duration::from_secs(5), "the slot to be freed once its client hung up", async || {
        app.state.inflight.available_permits() == 1
    })
    .await;
    assert_eq!(app.get("/v1/pools").await.status(), StatusCode::OK, "the slot is free again");
}

#[tokio::test]
async fn idempotency_keys_expire_after_24_hours_and_not_before() {
    let app = spawn_app().await;
    let post = |name: &str, key: &'static str| {
        let body = json!({"name": name, "replicas": 0, "version": "v1.29.2", "paused": true});
        app.client.post(app.url("/v1/pools")).header("idempotency-key", key).json(&body).send()
    };
    assert_eq!(post("first", "old").await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(post("second", "young").await.unwrap().status(), StatusCode::CREATED);
    // Age the keys as if time had passed: one just past the retention, one just inside it.
    let mut db = app.raw_store().await;
    for (key, hours) in [("old", 25), ("young", 23)] {
        let aged = [Param::Time(chrono::Utc::now() - chrono::TimeDelta::hours(hours)), Param::Text(key.into())];
        db.execute("update idempotency set created_at = $1 where key = $2", &aged).await;
    }
    assert_eq!(post("third", "old").await.unwrap().status(), StatusCode::CREATED, "an expired key is free again");
    assert_problem(post("fourth", "young").await.unwrap(), 422, Some("Idempotency-Key")).await;
}

#[tokio::test]
async fn a_token_use_is_stamped() {
    let app = spawn_app().await;
    app.get("/v1/pools").await;
    let tokens: Value = app.get("/v1/tokens").await.json().await.unwrap();
    assert!(tokens["items"][0]["last_used_at"].is_string(), "{tokens:#}");
}

#[tokio::test]
async fn a_token_removed_from_the_store_behind_the_apis_back_stops_working_within_a_second() {
    let app = spawn_app().await;
    let ci = client_with_token(&make_token(&app, "ci", "viewer").await);
    assert_eq!(ci.get(app.url("/v1/pools")).send().await.unwrap().status(), StatusCode::OK);
    app.raw_store().await.execute("delete from tokens where name = 'ci'", &[]).await;
    let removed = std::time::Instant::now();
    loop {
        let status = ci.get(app.url("/v1/pools")).send().await.unwrap().status();
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(removed.elapsed() < Duration::from_millis(1500), "the token still works after {:?}", removed.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
