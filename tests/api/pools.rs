//! The pools API over real HTTP, on the simulated runtime.

use std::collections::HashSet;
use std::time::Duration;

use drover::config::RuntimeKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{assert_problem, spawn_app};

#[tokio::test]
async fn create_returns_201_with_location_etag_and_the_pool() {
    let app = spawn_app().await;
    let res = app
        .create_pool(json!({"name": "web", "replicas": 3, "version": "v1.29.2", "failure_domains": ["a", "b"]}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["location"], "/v1/pools/web");
    assert_eq!(res.headers()["etag"], "\"1\"");
    assert!(res.headers().contains_key("x-request-id"));
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["name"], "web");
    assert_eq!(body["replicas"], 3);
    assert_eq!(body["desired_image"], "kindest/node:v1.29.2");
    assert_eq!(body["generation"], 1);
    assert_eq!(body["phase"], "active");
    assert_eq!(
        body["strategy"],
        json!({
            "max_surge": 1,
            "max_unavailable": 0,
            "batch_approval": false,
            "auto_rollback": false,
            "replacement": "termination_started"
        })
    );
    assert_eq!((body["min_ready_seconds"].clone(), body["progress_deadline_seconds"].clone()), (json!(0), json!(600)));
    assert_eq!(body["revision"], 1);

    let got = app.pool("web").await;
    assert_eq!(got["failure_domains"], json!(["a", "b"]));
    let events = app.events("web").await;
    assert_eq!(events.last().unwrap()["reason"], "Created");
}

#[tokio::test]
async fn every_bad_input_is_a_problem_naming_its_field() {
    let app = spawn_app().await;
    let base = || json!({"name": "ok", "replicas": 1, "version": "v1.29.2"});
    let with = |k: &str, v: Value| {
        let mut b = base();
        b[k] = v;
        b
    };
    let cases: Vec<(Value, &str)> = vec![
        (with("name", json!("Bad_Name")), "name"),
        (with("name", json!("a".repeat(64))), "name"),
        (with("name", json!("-lead")), "name"),
        (with("replicas", json!(-1)), "replicas"),
        (with("replicas", json!(1001)), "replicas"),
        (with("replicas", json!("3")), "replicas"),
        (with("version", json!("1.29.2")), "version"),
        (with("version", json!("v1.29")), "version"),
        (with("image", json!("app/UPPER")), "image"),
        (with("image", json!("app:")), "image"),
        (with("failure_domains", json!(["a", "a"])), "failure_domains[1]"),
        (with("failure_domains", json!([""])), "failure_domains[0]"),
        (with("extra_mounts", json!([{"container_path": "rel", "host_path": "/x"}])), "extra_mounts[0].container_path"),
        (with("extra_mounts", json!([{"container_path": "/x", "host_path": "x"}])), "extra_mounts[0].host_path"),
        (with("strategy", json!({"max_surge": 0, "max_unavailable": 0})), "strategy"),
        (with("strategy", json!({"max_surge": "150%"})), "strategy.max_surge"),
        (with("colour", json!("red")), "colour"),
        (json!({"replicas": 1, "version": "v1.29.2"}), "name"),
        (json!({"name": "ok", "replicas": 1}), "version"),
    ];
    for (body, field) in cases {
        let res = app.create_pool(body.clone()).await;
        let status = res.status();
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_problem(res, 422, Some(field)).await;
    }
    // Nothing was half-written.
    let list: Value = app.get("/v1/pools").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]));
}

#[tokio::test]
async fn replicas_edges_are_accepted() {
    let app = spawn_app().await;
    app.create_pool_ok("zero", 0, json!({})).await;
    app.create_pool_ok("max", 1000, json!({"paused": true})).await;
}

#[tokio::test]
async fn transport_level_errors_are_problems_too() {
    let app = spawn_app().await;
    let malformed = app
        .client
        .post(app.url("/v1/pools"))
        .header("content-type", "application/json")
        .body("{\"name\":")
        .send()
        .await
        .unwrap();
    assert_problem(malformed, 400, None).await;

    let wrong_type =
        app.client.post(app.url("/v1/pools")).header("content-type", "text/plain").body("{}").send().await.unwrap();
    assert_problem(wrong_type, 415, None).await;

    let no_type = app.client.post(app.url("/v1/pools")).body("{}").send().await.unwrap();
    assert_problem(no_type, 415, None).await;

    let huge = format!(
        "{{\"name\":\"big\",\"replicas\":1,\"version\":\"v1.29.2\",\"labels\":{{\"k\":\"{}\"}}}}",
        "x".repeat(1024 * 1024 + 1)
    );
    let too_large = app
        .client
        .post(app.url("/v1/pools"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_problem(too_large, 413, None).await;

    assert_problem(app.get("/v1/nothing-here").await, 404, None).await;
    assert_problem(app.get("/v1/pools/missing").await, 404, None).await;
    assert_problem(app.request(Method::DELETE, "/v1/pools", None).await, 405, None).await;
}

#[tokio::test]
async fn a_duplicate_name_is_a_409() {
    let app = spawn_app().await;
    app.create_pool_ok("dup", 1, json!({})).await;
    let res = app.create_pool(json!({"name": "dup", "replicas": 2, "version": "v1.30.0"})).await;
    let body = assert_problem(res, 409, None).await;
    assert!(body["detail"].as_str().unwrap().contains("dup"));
    assert_eq!(app.pool("dup").await["replicas"], 1, "the first pool is untouched");
}

#[tokio::test]
async fn pagination_over_250_pools_skips_and_repeats_nothing() {
    let app = spawn_app().await;
    let mut want = HashSet::new();
    for i in 0..250 {
        let name = format!("p{i:03}");
        app.create_pool_ok(&name, 0, json!({})).await;
        want.insert(name);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/pools?limit=37&cursor={c}"),
            None => "/v1/pools?limit=37".to_owned(),
        };
        let page: Value = app.get(&path).await.json().await.unwrap();
        pages += 1;
        for p in page["items"].as_array().unwrap() {
            seen.push(p["name"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 20, "pagination does not end");
    }
    assert_eq!(pages, 7);
    assert_eq!(seen.len(), 250, "a pool was repeated or skipped");
    assert_eq!(seen.iter().cloned().collect::<HashSet<_>>(), want);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "pages come in name order");
}

#[tokio::test]
async fn bad_page_parameters_are_422() {
    let app = spawn_app().await;
    assert_problem(app.get("/v1/pools?limit=0").await, 422, Some("limit")).await;
    assert_problem(app.get("/v1/pools?limit=501").await, 422, Some("limit")).await;
    assert_problem(app.get("/v1/pools?cursor=!!!").await, 422, Some("cursor")).await;
    assert_problem(app.get("/v1/pools?limit=abc").await, 422, Some("query")).await;
}

#[tokio::test]
async fn patch_merges_bumps_generation_and_honours_if_match() {
    let app = spawn_app().await;
    app.create_pool_ok("web", 2, json!({"labels": {"team": "infra"}, "image": "app:1", "paused": true})).await;

    let res =
        app.patch_pool("web", json!({"replicas": 4, "labels": {"tier": "edge"}, "image": null}), Some("\"1\"")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["etag"], "\"2\"");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["replicas"], 4);
    assert_eq!(body["labels"], json!({"team": "infra", "tier": "edge"}));
    assert_eq!(body["image"], Value::Null, "null removes a field");
    assert_eq!(body["desired_image"], "kindest/node:v1.29.2");

    let stale = app.patch_pool("web", json!({"replicas": 5}), Some("\"1\"")).await;
    assert_problem(stale, 412, None).await;
    assert_eq!(app.pool("web").await["replicas"], 4);

    let bad = app.patch_pool("web", json!({"version": "nope"}), None).await;
    assert_problem(bad, 422, Some("version")).await;
    let unknown = app.patch_pool("web", json!({"name": "other"}), None).await;
    assert_problem(unknown, 422, Some("name")).await;
    let not_object = app.patch_pool("web", json!([1]), None).await;
    assert_problem(not_object, 422, Some("body")).await;
    assert_problem(app.patch_pool("missing", json!({"replicas": 1}), None).await, 404, None).await;

    // A no-op patch does not bump the generation.
    let same = app.patch_pool("web", json!({"replicas": 4}), None).await;
    assert_eq!(same.headers()["etag"], "\"2\"");
    let events = app.events("web").await;
    assert_eq!(events[0]["reason"], "RolloutStarted", "the image changed: {events:#?}");
    assert_eq!(events[1]["reason"], "SpecChanged");
    assert!(events[1]["message"].as_str().unwrap().contains("replicas: 2 -> 4"), "{}", events[1]);
    assert_eq!(app.pool("web").await["revision"], 2);
}

#[tokio::test]
async fn the_rollout_view_right_after_a_version_patch_agrees_with_the_patch() {
    let app = spawn_app().await;
    app.create_pool_ok("roll", 5, json!({"image": "sim/app:1"})).await;
    app.wait_converged("roll", 5, Duration::from_secs(20)).await;
    let res = app.patch_pool("roll", json!({"image": "sim/app:2"}), Some("\"1\"")).await;
    assert_eq!(res.status(), StatusCode::OK);
    // No pass has run on the new spec yet: the counts are observed now,
    // against the new image, not carried over from the last pass.
    let r: Value = app.get("/v1/pools/roll/rollout").await.json().await.unwrap();
    let count = |k: &str| r["counts"][k].as_u64().unwrap_or(u64::MAX);
    assert_eq!((r["revision"].clone(), r["desired_image"].clone()), (json!(2), json!("sim/app:2")), "{r:#}");
    assert_eq!(count("updated") + count("outdated"), count("total"), "counts from one observation: {r:#}");
    assert!(count("outdated") >= 4 && count("updated") <= 1, "the old machines are outdated at once: {r:#}");
    assert!(r["remaining"].as_u64() >= Some(4), "{r:#}");
    assert_eq!(r["state"], "progressing", "{r:#}");
}

/// The spec fields of a pool view: every property `PoolPatch` names.
fn spec_of(view: &Value) -> Value {
    let doc: Value = serde_json::from_str(include_str!("../../openapi/openapi.json")).expect("openapi.json");
    let fields = doc["components"]["schemas"]["PoolPatch"]["properties"].as_object().expect("PoolPatch properties");
    fields.keys().map(|k| (k.clone(), view[k].clone())).collect::<serde_json::Map<_, _>>().into()
}

#[tokio::test]
async fn a_patch_of_every_spec_field_a_pool_shows_makes_that_spec() {
    let app = spawn_app().await;
    let rich = json!({
        "image": "app:2", "failure_domains": ["a", "b"], "labels": {"team": "infra"}, "paused": true,
        "strategy": {"max_surge": "50%", "max_unavailable": 1, "batch_approval": true, "auto_rollback": true,
                     "replacement": "termination_complete"},
        "min_ready_seconds": 5, "progress_deadline_seconds": 60, "machine_ready_timeout_seconds": 30,
    });
    app.create_pool_ok("rich", 3, rich).await;
    app.create_pool_ok("plain", 1, json!({})).await;
    let wanted = spec_of(&app.pool("rich").await);
    let res = app.patch_pool("plain", wanted.clone(), Some("\"1\"")).await;
    assert_eq!(res.status(), StatusCode::OK);
    let got = spec_of(&res.json::<Value>().await.unwrap());
    assert_eq!(got, wanted, "every spec field the view shows can be patched to that value");
    // And back: maps merge, so emptying labels takes a null.
    let mut plain = wanted.clone();
    plain["labels"] = Value::Null;
    plain["image"] = Value::Null;
    assert_eq!(app.patch_pool("plain", plain, None).await.status(), StatusCode::OK);
    let back = spec_of(&app.pool("plain").await);
    assert_eq!((back["labels"].clone(), back["image"].clone()), (json!({}), Value::Null));
}

#[tokio::test]
async fn plan_and_rollback_take_no_body_or_null_as_no_body() {
    let app = spawn_app().await;
    app.create_pool_ok("opt", 1, json!({"image": "sim/app:1"})).await;
    let post = |path: &'static str, body: Option<&'static str>| {
        let mut req = app.client.post(app.url(path));
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        req.send()
    };
    for body in [None, Some("null"), Some(" null\n")] {
        let res = post("/v1/pools/opt/plan", body).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "plan with {body:?}");
    }
    assert_eq!(app.patch_pool("opt", json!({"image": "sim/app:2"}), None).await.status(), StatusCode::OK);
    let res = post("/v1/pools/opt/rollback", Some("null")).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(app.pool("opt").await["image"], "sim/app:1");
}

#[tokio::test]
async fn two_concurrent_patches_with_the_same_if_match_exactly_one_wins() {
    let app = spawn_app().await;
    app.create_pool_ok("race", 1, json!({})).await;
    for round in 0..10 {
        let etag = format!("\"{}\"", round + 1);
        let (a, b) = tokio::join!(
            app.patch_pool("race", json!({"replicas": 10 + round}), Some(&etag)),
            app.patch_pool("race", json!({"replicas": 50 + round}), Some(&etag)),
        );
        let mut statuses = [a.status().as_u16(), b.status().as_u16()];
        statuses.sort();
        assert_eq!(statuses, [200, 412], "round {round}");
        let pool = app.pool("race").await;
        assert_eq!(pool["generation"], round + 2);
    }
}

#[tokio::test]
async fn scale_sets_only_replicas() {
    let app = spawn_app().await;
    app.create_pool_ok("s", 1, json!({"labels": {"a": "b"}})).await;
    let res = app.scale("s", 7).await;
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        (body["replicas"].clone(), body["labels"].clone(), body["generation"].clone()),
        (json!(7), json!({"a": "b"}), json!(2))
    );
    assert_problem(app.scale("s", -1).await, 422, Some("replicas")).await;
    assert_problem(app.scale("s", 1001).await, 422, Some("replicas")).await;
    assert_problem(app.scale("nope", 1).await, 404, None).await;
    let stale = app
        .client
        .put(app.url("/v1/pools/s/scale"))
        .header("if-match", "\"1\"")
        .json(&json!({"replicas": 2}))
        .send()
        .await
        .unwrap();
    assert_problem(stale, 412, None).await;
}

#[tokio::test]
async fn delete_is_202_then_the_pool_disappears() {
    let app = spawn_app().await;
    app.create_pool_ok("gone", 3, json!({"image": "sim/app:1"})).await;
    app.wait_converged("gone", 3, Duration::from_secs(20)).await;
    let res = app.delete_pool("gone").await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(res.headers()["location"], "/v1/pools/gone");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["phase"], "deleting");
    // Changes to a deleting pool are refused; a repeated delete is fine.
    let again = app.delete_pool("gone").await.status();
    assert!(again == StatusCode::ACCEPTED || again == StatusCode::NOT_FOUND);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while app.get_pool("gone").await.status() != StatusCode::NOT_FOUND {
        assert!(tokio::time::Instant::now() < deadline, "deleted pool never disappeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_problem(app.delete_pool("gone").await, 404, None).await;
    assert_problem(app.get("/v1/pools/gone/events").await, 404, None).await;
}

#[tokio::test]
async fn events_paginate_newest_first() {
    let app = spawn_app().await;
    app.create_pool_ok("ev", 0, json!({"paused": true})).await;
    for r in 1..=12 {
        assert_eq!(app.scale("ev", r).await.status(), StatusCode::OK);
    }
    let first: Value = app.get("/v1/pools/ev/events?limit=5").await.json().await.unwrap();
    let items = first["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    let ids: Vec<i64> = items.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let cursor = first["next_cursor"].as_str().unwrap();
    let second: Value = app.get(&format!("/v1/pools/ev/events?limit=5&cursor={cursor}")).await.json().await.unwrap();
    let next_ids: Vec<i64> = second["items"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(next_ids[0] < *ids.last().unwrap());
}

#[tokio::test]
async fn pools_survive_a_restart_on_the_same_database() {
    let app = spawn_app().await;
    app.create_pool_ok("keep", 2, json!({"paused": true, "failure_domains": ["x"]})).await;
    app.scale("keep", 5).await;
    let app = app.restart(RuntimeKind::Simulated).await;
    let pool = app.pool("keep").await;
    assert_eq!((pool["replicas"].clone(), pool["generation"].clone()), (json!(5), json!(2)));
    assert_eq!(pool["failure_domains"], json!(["x"]));
    assert_eq!(app.events("keep").await.len(), 2);
}

#[tokio::test]
async fn health_and_readiness_answer_without_a_token() {
    let app = spawn_app().await;
    let h: Value = app.get("/healthz").await.json().await.unwrap();
    assert_eq!(h["status"], "ok");
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), StatusCode::OK);
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["ready"], true);
}

#[tokio::test]
async fn readiness_fails_with_the_reason_when_docker_is_unreachable() {
    let tmp = tempfile::TempDir::new().unwrap();
    let mut cfg = crate::helpers::config(tmp.path(), RuntimeKind::Docker);
    cfg.docker_host = Some(format!("unix://{}/no-such.sock", tmp.path().display()));
    let app = crate::helpers::start(cfg, Some(tmp)).await;
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    let runtime = body["checks"].as_array().unwrap().iter().find(|c| c["name"] == "runtime").cloned().unwrap();
    assert_eq!(runtime["ok"], false);
    assert!(runtime["detail"].as_str().unwrap().contains("no-such.sock"), "{runtime}");

    // Pools still work, and get a RuntimeUnavailable condition naming the engine.
    app.create_pool_ok("offline", 2, json!({})).await;
    let pool = app
        .wait_pool("offline", Duration::from_secs(10), "a RuntimeUnavailable condition", |p| {
            p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["reason"] == "RuntimeUnavailable"
                        && c["message"].as_str().is_some_and(|m| m.contains("no-such.sock"))
                })
            })
        })
        .await;
    assert!(pool["status"]["last_error"].as_str().unwrap().contains("engine local"), "{pool:#}");
    let events = app.events("offline").await;
    let failures = events.iter().filter(|e| e["reason"] == "RuntimeUnavailable").count();
    assert_eq!(failures, 1, "a repeating failure is told once: {events:#?}");
}

#[tokio::test]
async fn docs_and_openapi_are_served() {
    let app = spawn_app().await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    assert!(doc["paths"]["/v1/pools"].is_object());
    let docs = app.get("/docs/").await;
    assert_eq!(docs.status(), StatusCode::OK);
    assert!(docs.text().await.unwrap().contains("swagger"), "Swagger UI page");
}
