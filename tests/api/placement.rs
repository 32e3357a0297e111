//! Placement on real engines when one of them never answers, answers late,
//! or answers but cannot run the pool's image: new machines go where they
//! can run, and no running machine is ever removed to feed an engine.
//! Every check of "nothing was removed" reads the engines' own event
//! streams, not drover's account.

use std::time::Duration;

use drover::config::RuntimeKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::docker::{Cleanup, EventLog, PLAIN_IMAGE, V1, V2, require_docker};
use crate::engines_support::ExtraEngine;
use crate::helpers::{TestApp, config, start, unique, wait_for};

async fn docker_app(lost_after: Duration) -> TestApp {
    let tmp = tempfile::TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Docker);
    cfg.engine_lost_after = lost_after;
    start(cfg, Some(tmp)).await
}

async fn register(app: &TestApp, name: &str, endpoint: &str) {
    let res = app.request(Method::POST, "/v1/engines", Some(json!({"name": name, "endpoint": endpoint}))).await;
    assert_eq!(res.status(), StatusCode::CREATED, "registering {name}: {}", res.text().await.unwrap_or_default());
}

async fn engine(app: &TestApp, name: &str) -> Value {
    app.get(&format!("/v1/engines/{name}")).await.json().await.expect("engine JSON")
}

/// The host's engine, as drover's `local` engine reaches it.
fn host_endpoint() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| h.starts_with("unix://"))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_owned())
}

/// Running containers of `pool` on the host's engine.
async fn running_on_host(host: &bollard::Docker, pool: &str) -> usize {
    crate::docker::pool_containers(host, pool).await.iter().filter(|c| c.running).count()
}

fn running(engine: &ExtraEngine, pool: &str) -> usize {
    engine.pool_containers(pool).iter().filter(|(_, running)| *running).count()
}

fn ready(p: &Value, n: u64) -> bool {
    let s = &p["status"];
    s["ready_replicas"] == n && s["replicas"] == n && s["terminating_replicas"] == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_engine_that_never_answers_takes_no_machine_away_and_the_hosts_daemon_is_not_registered_twice() {
    require_docker();
    let pool = unique("hostage");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = docker_app(Duration::from_secs(3)).await;
    let host = crate::docker::client().await;
    let nowhere = tempfile::TempDir::new().expect("temp dir");
    // A typo'd socket; the host's engine under a second name is refused,
    // naming `local`, which has that daemon.
    register(&app, "dead", &format!("unix://{}/no-such-engine.sock", nowhere.path().display())).await;
    let twin = app.request(Method::POST, "/v1/engines", Some(json!({"name": "e1", "endpoint": host_endpoint()}))).await;
    let problem = crate::helpers::assert_problem(twin, 409, None).await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("\"local\"")), "names local: {problem:#}");
    let log = EventLog::start(&host, &pool);

    app.create_pool_ok(&pool, 4, json!({"version": V1})).await;
    let created = tokio::time::Instant::now();
    wait_for(Duration::from_secs(10), "4 of 4 running on the live engine within 10 s of the create", async || {
        running_on_host(&host, &pool).await == 4 && ready(&app.pool(&pool).await, 4)
    })
    .await;
    eprintln!("4 of 4 ready {:?} after the create", created.elapsed());

    // Past the dead engine's lost timeout: still the same 4, none removed.
    let dead = engine(&app, "dead").await;
    assert_eq!(dead["status"]["placement"]["blocked"], "not_reached", "{dead:#}");
    wait_for(Duration::from_secs(10), "the dead engine's EngineLost event", async || {
        let events: Value = app.get("/v1/engines/dead/events").await.json().await.expect("events");
        events["items"].as_array().is_some_and(|e| e.iter().any(|e| e["reason"] == "EngineLost"))
    })
    .await;
    let settled = app.wait_pool(&pool, Duration::from_secs(10), "a pass after the loss", |p| ready(p, 4)).await;
    assert_eq!(running_on_host(&host, &pool).await, 4, "{:#}", settled["status"]);
    assert_eq!(log.removals(), Vec::<(String, String)>::new(), "running machines were removed");
    assert_eq!(log.created().len(), 4, "exactly 4 containers were ever created: {:?}", log.created());
    let mut engines: Vec<String> = crate::docker::pool_containers(&host, &pool)
        .await
        .iter()
        .map(|c| c.labels.get("drover.dev/engine").cloned().unwrap_or_default())
        .collect();
    engines.sort();
    assert_eq!(engines, ["local"; 4], "one daemon, one engine");
}

/// A TCP port on loopback that nothing listens on (yet).
fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a probe port");
    probe.local_addr().expect("probe address").port()
}

/// Forwards TCP connections on `port` to the host's Docker socket: the
/// host's daemon, reached at another address.
async fn forward_to_host(port: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("binding the forwarder");
    let socket = host_endpoint().trim_start_matches("unix://").to_owned();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Ok(mut engine) = tokio::net::UnixStream::connect(&socket).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_engine_found_at_its_first_answer_to_be_the_hosts_daemon_takes_no_machine() {
    require_docker();
    let pool = unique("twin");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = docker_app(Duration::from_secs(30)).await;
    let host = crate::docker::client().await;
    // Nothing answers there at registration: it is registered, not identified.
    let port = free_port();
    register(&app, "twin", &format!("tcp://127.0.0.1:{port}")).await;
    assert_eq!(engine(&app, "twin").await["status"]["daemon"]["id"], Value::Null);
    // Then the host's daemon answers there.
    let forwarder = forward_to_host(port).await;
    let mut twin = Value::Null;
    wait_for(Duration::from_secs(40), "the engine identified as the host's daemon", async || {
        twin = engine(&app, "twin").await;
        twin["status"]["placement"]["blocked"] == "duplicate_daemon"
    })
    .await;
    assert_eq!(twin["status"]["daemon"]["duplicate_of"], "local", "{twin:#}");
    assert_eq!(twin["status"]["daemon"]["id"], Value::Null, "a duplicate is not registered as the daemon: {twin:#}");
    wait_for(Duration::from_secs(10), "the DuplicateDaemon event", async || {
        let events: Value = app.get("/v1/engines/twin/events").await.json().await.expect("events");
        events["items"].as_array().is_some_and(|items| items.iter().any(|e| e["reason"] == "DuplicateDaemon"))
    })
    .await;

    // Its machines go to the daemon's engine, counted once.
    app.create_pool_ok(&pool, 2, json!({"version": V1, "engines": ["local", "twin"]})).await;
    wait_for(Duration::from_secs(30), "2 of 2 ready", async || ready(&app.pool(&pool).await, 2)).await;
    let engines: Vec<String> = crate::docker::pool_containers(&host, &pool)
        .await
        .iter()
        .map(|c| c.labels.get("drover.dev/engine").cloned().unwrap_or_default())
        .collect();
    assert_eq!(engines, ["local", "local"]);
    forwarder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_dead_third_engine_leaves_the_pool_full_and_takes_new_machines_first_once_it_starts() {
    require_docker();
    let pool = unique("third");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let images = [format!("kindest/node:{V1}"), format!("kindest/node:{V2}")];
    let images: Vec<&str> = images.iter().map(String::as_str).collect();
    let x = ExtraEngine::start("x", &images).expect("extra engine x");
    let mut late = ExtraEngine::start("late", &images).expect("extra engine late");
    late.stop();
    let app = docker_app(Duration::from_secs(30)).await;
    let host = crate::docker::client().await;
    register(&app, "x", &x.endpoint()).await;
    register(&app, "late", &late.endpoint()).await;
    let host_log = EventLog::start(&host, &pool);
    let x_log = EventLog::start(&x.client().expect("x client"), &pool);

    app.create_pool_ok(&pool, 6, json!({"version": V1, "strategy": {"max_surge": 1, "max_unavailable": 0}})).await;
    wait_for(
        Duration::from_secs(10),
        "6 of 6 on the two engines that answer, well before the lost timeout",
        async || running_on_host(&host, &pool).await + running(&x, &pool) == 6 && ready(&app.pool(&pool).await, 6),
    )
    .await;
    assert_eq!((running_on_host(&host, &pool).await, running(&x, &pool)), (3, 3), "spread over the two");

    // The engine comes up: it is listed, and the pool keeps its 6.
    late.restart().expect("starting the late engine");
    wait_for(Duration::from_secs(30), "the late engine listed", async || {
        engine(&app, "late").await["status"]["reachability"] == "reachable"
    })
    .await;
    let p = app.wait_pool(&pool, Duration::from_secs(10), "a pass with the late engine", |p| ready(p, 6)).await;
    assert_eq!(running(&late, &pool), 0, "{:#}", p["status"]);
    assert_eq!(running_on_host(&host, &pool).await + running(&x, &pool), 6);

    // New machines go to the engine with fewest first: scale up, then a rollout.
    assert_eq!(app.scale(&pool, 8).await.status(), StatusCode::OK);
    wait_for(Duration::from_secs(30), "8 ready with the 2 new ones on the late engine", async || {
        running(&late, &pool) == 2 && ready(&app.pool(&pool).await, 8)
    })
    .await;
    assert_eq!(host_log.removals(), Vec::<(String, String)>::new(), "the host's machines were removed");
    assert_eq!(x_log.removals(), Vec::<(String, String)>::new(), "x's machines were removed");
    assert_eq!(app.patch_pool(&pool, json!({"version": V2}), None).await.status(), StatusCode::OK);
    let new_version = |e: &Value| {
        e["reason"] == "MachineCreated" && e["message"].as_str().is_some_and(|m| m.contains(&format!("node:{V2}")))
    };
    wait_for(Duration::from_secs(30), "the rollout's first new machine", async || {
        app.events(&pool).await.iter().any(new_version)
    })
    .await;
    // Events come newest first: the last of them is the rollout's first.
    let first = app.events(&pool).await.into_iter().rev().find(new_version).expect("a new machine");
    assert!(first["message"].as_str().is_some_and(|m| m.contains("on engine late")), "{first:#}");
    drop(app);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_engine_without_the_image_gets_none_of_the_pool_and_says_why() {
    require_docker();
    let pool = unique("noimage");
    let _cleanup = Cleanup(vec![pool.clone()]);
    // This engine has the node images, not the pool's plain image.
    let bare = ExtraEngine::start("bare", &[&format!("kindest/node:{V1}")]).expect("extra engine");
    let app = docker_app(Duration::from_secs(30)).await;
    let host = crate::docker::client().await;
    register(&app, "bare", &bare.endpoint()).await;
    wait_for(Duration::from_secs(30), "the extra engine listed", async || {
        engine(&app, "bare").await["status"]["reachability"] == "reachable"
    })
    .await;

    app.create_pool_ok(&pool, 4, json!({"image": PLAIN_IMAGE, "engines": ["local", "bare"]})).await;
    wait_for(Duration::from_secs(30), "4 of 4 on the engine that has the image", async || {
        running_on_host(&host, &pool).await == 4 && ready(&app.pool(&pool).await, 4)
    })
    .await;
    assert!(bare.pool_containers(&pool).is_empty(), "{:?}", bare.pool_containers(&pool));
    let e = engine(&app, "bare").await;
    let refused = &e["status"]["placement"]["refused_images"];
    assert!(
        refused.as_array().is_some_and(|r| r
            .iter()
            .any(|r| r["image"] == PLAIN_IMAGE && r["error"].as_str().is_some_and(|m| m.contains("not available")))),
        "{e:#}"
    );
    assert_eq!(e["status"]["placement"]["eligible"], true, "other images still go there: {e:#}");
    let events: Value = app.get("/v1/engines/bare/events").await.json().await.expect("events");
    assert!(
        events["items"].as_array().is_some_and(|e| e.iter().any(|e| e["reason"] == "PlacementBackedOff")),
        "{events:#}"
    );
}
