//! Pools across several engines: engines as a resource, placement and
//! spreading, scale-down from the fullest, losing an engine and its return,
//! draining and removal. The rules are checked fast on simulated engines;
//! the last test runs three real Docker engines.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use drover::config::RuntimeKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, config, start, unique, wait_for};

const LIMIT: Duration = Duration::from_secs(60);

async fn simulated(lost_after: Duration) -> TestApp {
    let tmp = tempfile::TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.engine_lost_after = lost_after;
    cfg.machine_settle_time = Duration::from_millis(100);
    start(cfg, Some(tmp)).await
}

async fn register(app: &TestApp, body: Value) -> reqwest::Response {
    app.request(Method::POST, "/v1/engines", Some(body)).await
}

async fn register_ok(app: &TestApp, name: &str, endpoint: &str) {
    let res = register(app, json!({"name": name, "endpoint": endpoint})).await;
    assert_eq!(res.status(), StatusCode::CREATED, "{}", res.text().await.unwrap_or_default());
}

/// Machines counted on each engine, from the pool's status.
fn per_engine(pool: &Value) -> BTreeMap<String, u64> {
    pool["status"]["engines"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v["ready_replicas"].as_u64().unwrap_or(0))).collect())
        .unwrap_or_default()
}

async fn wait_spread(app: &TestApp, pool: &str, want: &[(&str, u64)]) -> Value {
    let want: BTreeMap<String, u64> = want.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    let total: u64 = want.values().sum();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let p = app.pool(pool).await;
        let s = &p["status"];
        if per_engine(&p) == want
            && s["ready_replicas"] == total
            && s["replicas"] == total
            && s["terminating_replicas"] == 0
        {
            return p;
        }
        if tokio::time::Instant::now() > deadline {
            let machines: Vec<String> = app
                .machines(pool)
                .await
                .iter()
                .map(|m| {
                    format!("{} {} {} ready={} image={}", m["name"], m["engine"], m["phase"], m["ready"], m["image"])
                })
                .collect();
            panic!(
                "{pool} never spread as {want:?}: status {s:#}, machines {machines:#?}, events {:#?}",
                app.events(pool).await.iter().take(8).map(|e| e["message"].clone()).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn engines_are_a_resource_with_checked_endpoints_and_write_only_credentials() {
    let app = simulated(Duration::from_secs(30)).await;
    let list: Value = app.get("/v1/engines").await.json().await.unwrap();
    let local = &list["items"][0];
    assert_eq!((local["name"].clone(), local["builtin"].clone()), (json!("local"), json!(true)));
    assert_eq!(local["status"]["reachability"], "reachable");

    let res = register(&app, json!({"name": "b", "endpoint": "sim://b", "labels": {"zone": "west"}})).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["location"], "/v1/engines/b");
    let b: Value = app.get("/v1/engines/b").await.json().await.unwrap();
    assert_eq!(
        (b["labels"]["zone"].clone(), b["builtin"].clone(), b["tls"].clone()),
        (json!("west"), json!(false), json!(false))
    );

    assert_problem(register(&app, json!({"name": "b", "endpoint": "sim://b"})).await, 409, None).await;
    assert_problem(register(&app, json!({"name": "local", "endpoint": "sim://x"})).await, 422, Some("name")).await;
    for (endpoint, rule) in [
        ("tcp://10.1.2.3:2375", "tls_required"),
        ("ssh://root@10.1.2.3", "unsupported_scheme"),
        ("http://10.1.2.3", "endpoint_scheme"),
        ("unix://relative.sock", "unix_path"),
    ] {
        let body =
            assert_problem(register(&app, json!({"name": "x", "endpoint": endpoint})).await, 422, Some("endpoint"))
                .await;
        assert_eq!(body["errors"][0]["rule"], rule, "{endpoint}: {body:#}");
    }
    let tls = json!({"cert": "-----BEGIN CERTIFICATE-----\nnope\n", "key": "secret-key-material", "ca": "x"});
    let body = assert_problem(
        register(&app, json!({"name": "x", "endpoint": "tcp://10.1.2.3:2376", "tls": tls})).await,
        422,
        None,
    )
    .await;
    assert!(!body.to_string().contains("secret-key-material"), "a refusal never quotes the key: {body}");
    assert_problem(app.request(Method::DELETE, "/v1/engines/local", None).await, 409, None).await;
    assert_eq!(app.request(Method::DELETE, "/v1/engines/b", None).await.status(), StatusCode::NO_CONTENT);
    assert_problem(app.get("/v1/engines/b").await, 404, None).await;
}

#[tokio::test]
async fn a_pool_spreads_evenly_over_engines_and_scale_down_takes_from_the_fullest() {
    let app = simulated(Duration::from_secs(30)).await;
    register_ok(&app, "a", "sim://a").await;
    register_ok(&app, "b", "sim://b").await;
    let pool = unique("spread");
    app.create_pool_ok(&pool, 6, json!({"engines": ["local", "a", "b"]})).await;
    wait_spread(&app, &pool, &[("a", 2), ("b", 2), ("local", 2)]).await;
    app.scale(&pool, 9).await;
    wait_spread(&app, &pool, &[("a", 3), ("b", 3), ("local", 3)]).await;
    app.scale(&pool, 4).await;
    let p = app.wait_converged(&pool, 4, LIMIT).await;
    let spread = per_engine(&p);
    assert!(spread.values().all(|n| (1..=2).contains(n)), "scale-down took from the fullest: {spread:?}");

    // A selector places by labels: only engines labelled zone=west.
    register_ok(&app, "w", "sim://w").await;
    let res = register(&app, json!({"name": "w2", "endpoint": "sim://w2", "labels": {"zone": "west"}})).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let west = unique("west");
    app.create_pool_ok(&west, 3, json!({"engine_selector": {"zone": "west"}})).await;
    wait_spread(&app, &west, &[("w2", 3)]).await;
    let both = json!({"name": "both", "replicas": 1, "version": "v1.29.2", "engines": ["a"], "engine_selector": {"zone": "west"}});
    let res = app.create_pool(both).await;
    assert_problem(res, 422, Some("engine_selector")).await;
}

#[tokio::test]
async fn a_namespace_fenced_to_some_engines_places_only_there_and_says_so_when_none_matches() {
    let app = simulated(Duration::from_secs(30)).await;
    for zone in ["a", "b"] {
        let body = json!({"name": zone, "endpoint": format!("sim://{zone}"), "labels": {"zone": zone}});
        assert_eq!(register(&app, body).await.status(), StatusCode::CREATED);
    }
    let pool_in = async |ns: &str| -> Value {
        app.get(&format!("/v1/pools/web?namespace={ns}")).await.json().await.unwrap_or(Value::Null)
    };
    for (ns, zone) in [("team-a", "a"), ("team-c", "nowhere")] {
        let body = json!({"name": ns, "engine_selector": {"zone": zone}});
        assert_eq!(app.request(Method::POST, "/v1/namespaces", Some(body)).await.status(), StatusCode::CREATED);
        let pool = json!({"name": "web", "replicas": 4, "version": "v1.29.2"});
        let res = app.request(Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool)).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    // Only engine a carries zone=a: all four there, none on local or b.
    wait_for(LIMIT, "team-a's pool on engine a alone", async || {
        let p = pool_in("team-a").await;
        per_engine(&p) == BTreeMap::from([("a".to_owned(), 4)]) && p["status"]["ready_replicas"] == 4
    })
    .await;
    // No engine matches team-c's selector: nothing placed, and the pool says why.
    let p = crate::helpers::wait_some(LIMIT, "team-c's pool to say it is fenced", async || {
        let p = pool_in("team-c").await;
        let said = p["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["message"].as_str().is_some_and(|m| m.contains("namespace team-c is fenced")));
        said.then_some(p)
    })
    .await;
    assert_eq!(p["status"]["replicas"], 0, "nothing placed outside the fence: {p:#}");
}

#[tokio::test]
async fn losing_an_engine_replaces_its_machines_and_its_return_trims_the_surplus() {
    let app = simulated(Duration::from_secs(1)).await;
    register_ok(&app, "a", "sim://a").await;
    register_ok(&app, "b", "sim://b").await;
    let pool = unique("lose");
    app.create_pool_ok(&pool, 6, json!({"strategy": {"max_surge": 1}})).await;
    wait_spread(&app, &pool, &[("a", 2), ("b", 2), ("local", 2)]).await;
    let before: HashSet<String> = crate::helpers::names(&app.machines(&pool).await);

    let b = app.state.engines.set.get("b").expect("engine b");
    b.simulation().expect("simulated").outage(true);
    let p = wait_spread(&app, &pool, &[("a", 3), ("local", 3)]).await;
    let healthy =
        p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "MachinesHealthy").cloned();
    assert_eq!(healthy.map(|c| c["reason"].clone()), Some(json!("EngineLost")), "{p:#}");
    let engine_events: Value = app.get("/v1/engines/b/events").await.json().await.unwrap();
    let reasons: Vec<&str> =
        engine_events["items"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"EngineUnreachable"), "{reasons:?}");

    b.simulation().expect("simulated").outage(false);
    wait_spread(&app, &pool, &[("a", 2), ("b", 2), ("local", 2)]).await;
    let after = app.machines(&pool).await;
    assert_eq!(after.len(), 6, "exactly replicas records once the engine is back: {after:#?}");
    let names = crate::helpers::names(&after);
    assert_eq!(names.len(), 6, "no duplicate names");
    let kept_on_b = after
        .iter()
        .filter(|m| m["engine"] == "b")
        .filter(|m| before.contains(m["name"].as_str().unwrap_or("")))
        .count();
    assert_eq!(kept_on_b, 2, "the machines of the engine that came back are kept; replacements elsewhere go");
}

async fn engine(app: &TestApp, name: &str) -> Value {
    app.get(&format!("/v1/engines/{name}")).await.json().await.expect("engine JSON")
}

/// Reasons of the engine's events, oldest first.
async fn engine_reasons(app: &TestApp, name: &str) -> Vec<String> {
    let events: Value = app.get(&format!("/v1/engines/{name}/events")).await.json().await.expect("events JSON");
    let mut reasons: Vec<String> = events["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|e| e["reason"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    reasons.reverse();
    reasons
}

async fn wait_blocked(app: &TestApp, name: &str, blocked: Value) -> Value {
    let mut last = Value::Null;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while tokio::time::Instant::now() < deadline {
        last = engine(app, name).await;
        if last["status"]["placement"]["blocked"] == blocked {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("engine {name} never blocked as {blocked}: {last:#}");
}

#[tokio::test]
async fn one_daemon_is_one_engine_and_a_changed_daemon_takes_no_machine_until_an_admin_confirms_it() {
    let app = simulated(Duration::from_secs(30)).await;
    // A simulated engine's daemon is its endpoint: `local`'s is sim://local.
    let twin = register(&app, json!({"name": "twin", "endpoint": "sim://local"})).await;
    let problem = assert_problem(twin, 409, None).await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("\"local\"")), "names local: {problem:#}");
    register_ok(&app, "a", "sim://a").await;
    register_ok(&app, "b", "sim://b").await;
    let problem = assert_problem(register(&app, json!({"name": "c", "endpoint": "sim://a"})).await, 409, None).await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("\"a\"")), "names a: {problem:#}");
    assert_problem(app.get("/v1/engines/c").await, 404, None).await;
    let a = engine(&app, "a").await;
    assert_eq!(a["status"]["daemon"], json!({"id": "sim://a", "reported_id": "sim://a", "duplicate_of": null}));

    let pool = unique("daemons");
    app.create_pool_ok(&pool, 3, json!({"engines": ["local", "a", "b"]})).await;
    wait_spread(&app, &pool, &[("a", 1), ("b", 1), ("local", 1)]).await;

    // a's endpoint now reaches another host: it keeps its machine and takes no new one.
    let sim = app.state.engines.set.get("a").expect("engine a");
    sim.simulation().expect("simulated").replace_daemon("host-7");
    let a = wait_blocked(&app, "a", json!("daemon_changed")).await;
    assert_eq!(a["status"]["daemon"], json!({"id": "sim://a", "reported_id": "host-7", "duplicate_of": null}));
    assert!(a["status"]["placement"]["message"].as_str().is_some_and(|m| m.contains("confirm-identity")), "{a:#}");
    wait_for(LIMIT, "a DaemonChanged event", async || {
        engine_reasons(&app, "a").await.contains(&"DaemonChanged".into())
    })
    .await;
    app.scale(&pool, 5).await;
    wait_spread(&app, &pool, &[("a", 1), ("b", 2), ("local", 2)]).await;

    // An admin confirms: the new daemon is a's, and a takes machines again.
    let res = app.request(Method::POST, "/v1/engines/a/confirm-identity", None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let a: Value = res.json().await.expect("engine JSON");
    assert_eq!(a["status"]["daemon"]["id"], "host-7");
    assert_eq!(a["status"]["placement"]["eligible"], true, "{a:#}");
    assert_eq!(engine_reasons(&app, "a").await.last().map(String::as_str), Some("DaemonConfirmed"));
    app.scale(&pool, 6).await;
    wait_spread(&app, &pool, &[("a", 2), ("b", 2), ("local", 2)]).await;

    // a's endpoint now reaches b's daemon: b keeps it, and a cannot be confirmed as it.
    sim.simulation().expect("simulated").replace_daemon("sim://b");
    let a = wait_blocked(&app, "a", json!("duplicate_daemon")).await;
    assert_eq!(a["status"]["daemon"]["duplicate_of"], "b", "{a:#}");
    assert_eq!(engine(&app, "b").await["status"]["placement"]["eligible"], true, "b keeps its daemon");
    wait_for(LIMIT, "a DuplicateDaemon event", async || {
        engine_reasons(&app, "a").await.contains(&"DuplicateDaemon".into())
    })
    .await;
    let refused = app.request(Method::POST, "/v1/engines/a/confirm-identity", None).await;
    let problem = assert_problem(refused, 409, None).await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("\"b\"")), "names b: {problem:#}");

    // Back to the daemon it is registered as: it takes machines again by itself.
    sim.simulation().expect("simulated").replace_daemon("host-7");
    wait_blocked(&app, "a", Value::Null).await;
    assert_problem(app.request(Method::POST, "/v1/engines/nope/confirm-identity", None).await, 404, None).await;
}

#[tokio::test]
async fn draining_an_engine_moves_its_machines_then_it_can_be_deleted() {
    let app = simulated(Duration::from_secs(30)).await;
    register_ok(&app, "a", "sim://a").await;
    register_ok(&app, "b", "sim://b").await;
    let pool = unique("drain");
    app.create_pool_ok(&pool, 6, json!({"strategy": {"max_surge": 1, "max_unavailable": 0}})).await;
    wait_spread(&app, &pool, &[("a", 2), ("b", 2), ("local", 2)]).await;
    let body = assert_problem(app.request(Method::DELETE, "/v1/engines/b", None).await, 409, None).await;
    assert!(body["detail"].as_str().unwrap_or_default().contains("worker-"), "the 409 names the machines: {body:#}");

    let res = app.request(Method::POST, "/v1/engines/b/drain", None).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let p = wait_spread(&app, &pool, &[("a", 3), ("local", 3)]).await;
    assert_eq!(p["status"]["ready_replicas"], 6);
    let b: Value = app.get("/v1/engines/b").await.json().await.unwrap();
    assert_eq!((b["draining"].clone(), b["status"]["machines"].clone()), (json!(true), json!(0)));
    assert_eq!(app.request(Method::DELETE, "/v1/engines/b", None).await.status(), StatusCode::NO_CONTENT);
    let events = app.events(&pool).await;
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "MachineDeleting" && e["message"].as_str().unwrap_or("").contains("engine b"))
    );
}

#[tokio::test]
async fn a_lost_engine_can_be_removed_with_its_machines_and_a_pool_on_it_deleted() {
    let app = simulated(Duration::from_secs(1)).await;
    register_ok(&app, "a", "sim://a").await;
    let pool = unique("gone");
    app.create_pool_ok(&pool, 2, json!({"engines": ["a"]})).await;
    wait_spread(&app, &pool, &[("a", 2)]).await;
    let a = app.state.engines.set.get("a").expect("engine a");
    a.simulation().expect("simulated").outage(true);
    // Unreachable but not yet lost: its machines may come back, so it stays.
    let body = assert_problem(app.request(Method::DELETE, "/v1/engines/a", None).await, 409, None).await;
    assert!(body["detail"].as_str().unwrap_or_default().contains("worker-"), "{body:#}");

    // The host is gone for good: once lost, the engine goes and its
    // machines with it, and the pool (which had nowhere else to go) can be
    // deleted instead of waiting forever for containers nobody can reach.
    wait_for(LIMIT, "engine a to be given up for lost (its EngineLost event)", async || {
        let events: Value = app.get("/v1/engines/a/events").await.json().await.unwrap_or(Value::Null);
        events["items"].as_array().is_some_and(|items| items.iter().any(|e| e["reason"] == "EngineLost"))
    })
    .await;
    assert_eq!(app.request(Method::DELETE, "/v1/engines/a", None).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.request(Method::DELETE, &format!("/v1/pools/{pool}"), None).await.status(), StatusCode::ACCEPTED);
    let deadline = tokio::time::Instant::now() + LIMIT;
    while app.get(&format!("/v1/pools/{pool}")).await.status() != StatusCode::NOT_FOUND {
        assert!(tokio::time::Instant::now() < deadline, "the pool was never deleted: {:#}", app.pool(&pool).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Containers of `pool` on each of the three engines: (name, running).
fn on_engines(
    host: &bollard::Docker,
    extra: &[&crate::engines_support::ExtraEngine],
    pool: &str,
) -> impl std::future::Future<Output = Vec<Vec<(String, bool)>>> {
    let host = host.clone();
    let pool = pool.to_owned();
    let extra: Vec<Vec<(String, bool)>> = extra.iter().map(|e| e.pool_containers(&pool)).collect();
    async move {
        let local: Vec<(String, bool)> =
            crate::docker::pool_containers(&host, &pool).await.into_iter().map(|c| (c.name, c.running)).collect();
        std::iter::once(local).chain(extra).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn three_real_engines_spread_roll_lose_one_and_get_it_back_without_duplicates() {
    use crate::docker::{Cleanup, V1, V2, require_docker};
    use crate::engines_support::ExtraEngine;
    require_docker();
    let images = [format!("kindest/node:{V1}"), format!("kindest/node:{V2}")];
    let images: Vec<&str> = images.iter().map(String::as_str).collect();
    let mut e1 = ExtraEngine::start("e1", &images).expect("first extra engine");
    let mut e2 = ExtraEngine::start("e2", &images).expect("second extra engine");
    let pool = unique("three");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let tmp = tempfile::TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Docker);
    cfg.engine_lost_after = Duration::from_secs(5);
    let app = start(cfg, Some(tmp)).await;
    let host = crate::docker::client().await;
    register_ok(&app, "e1", &e1.endpoint()).await;
    register_ok(&app, "e2", &e2.endpoint()).await;

    let strategy = json!({"max_surge": 2, "max_unavailable": 0, "replacement": "termination_complete"});
    app.create_pool_ok(&pool, 6, json!({"version": V1, "engines": ["local", "e1", "e2"], "strategy": strategy})).await;
    wait_spread(&app, &pool, &[("e1", 2), ("e2", 2), ("local", 2)]).await;
    let counts: Vec<usize> = on_engines(&host, &[&e1, &e2], &pool).await.iter().map(Vec::len).collect();
    assert_eq!(counts, [2, 2, 2], "the engines themselves hold 2/2/2");
    app.scale(&pool, 9).await;
    wait_spread(&app, &pool, &[("e1", 3), ("e2", 3), ("local", 3)]).await;

    // A rolling update across engines keeps the bounds: at most 11
    // containers in all, never fewer than 9 running.
    assert_eq!(app.patch_pool(&pool, json!({"version": V2}), None).await.status(), StatusCode::OK);
    let (mut most, mut fewest) = (0usize, usize::MAX);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let seen = on_engines(&host, &[&e1, &e2], &pool).await;
        let all: Vec<&(String, bool)> = seen.iter().flatten().collect();
        most = most.max(all.len());
        fewest = fewest.min(all.iter().filter(|(_, running)| *running).count());
        let p = app.pool(&pool).await;
        // A status from before the change would say the same of V1.
        if p["status"]["observed_generation"] == p["generation"]
            && p["status"]["updated_replicas"] == 9
            && p["status"]["ready_replicas"] == 9
            && p["status"]["replicas"] == 9
            && p["status"]["terminating_replicas"] == 0
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "rollout across engines did not finish: {:#}", p["status"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(most <= 11, "surge 2 over 9 replicas allows 11 containers, saw {most}");
    assert!(fewest >= 9, "unavailable 0: never fewer than 9 running, saw {fewest}");

    // Lose e2 in the middle of the next rollout: 9 ready on the other two
    // within the lost timeout (5 s) + 30 s.
    assert_eq!(app.patch_pool(&pool, json!({"version": V1}), None).await.status(), StatusCode::OK);
    app.wait_pool(&pool, LIMIT, "the rollout back to V1 to be under way", |p| {
        let s = &p["status"];
        s["observed_generation"] == p["generation"]
            && s["updated_replicas"].as_u64().is_some_and(|n| (1..9).contains(&n))
    })
    .await;
    e2.stop();
    let lost_at = tokio::time::Instant::now();
    let deadline = lost_at + Duration::from_secs(35);
    loop {
        let p = app.pool(&pool).await;
        let spread = per_engine(&p);
        let s = &p["status"];
        if s["ready_replicas"] == 9
            && s["updated_replicas"] == 9
            && spread.get("e2").copied().unwrap_or(0) == 0
            && spread.values().sum::<u64>() == 9
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not 9 ready on the two engines left within 35 s: {s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("9 ready on two engines {:?} after losing e2", lost_at.elapsed());

    // e2 comes back: exactly 9 machines, no duplicate names, nothing left
    // over on e2 but running machines of the pool.
    e2.restart().expect("restarting e2");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let seen = on_engines(&host, &[&e1, &e2], &pool).await;
        let all: Vec<&(String, bool)> = seen.iter().flatten().collect();
        let names: HashSet<&String> = all.iter().map(|(n, _)| n).collect();
        let p = app.pool(&pool).await;
        let s = &p["status"];
        if all.len() == 9
            && names.len() == 9
            && all.iter().all(|(_, r)| *r)
            && s["ready_replicas"] == 9
            && s["replicas"] == 9
            && s["terminating_replicas"] == 0
        {
            assert_eq!(app.machines(&pool).await.len(), 9, "records mirror the containers");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not back to exactly 9 after e2 returned: {seen:?} {s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Deleting an engine with machines is refused; drained, it empties.
    assert_problem(app.request(Method::DELETE, "/v1/engines/e1", None).await, 409, None).await;
    assert_eq!(app.request(Method::POST, "/v1/engines/e1/drain", None).await.status(), StatusCode::ACCEPTED);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !e1.pool_containers(&pool).is_empty() || app.pool(&pool).await["status"]["ready_replicas"] != 9 {
        assert!(tokio::time::Instant::now() < deadline, "e1 did not empty: {:?}", e1.pool_containers(&pool));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.request(Method::DELETE, "/v1/engines/e1", None).await.status(), StatusCode::NO_CONTENT);
    drop(app);
    e1.stop();
}
