//! The pool reconciler against the real Docker engine.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::docker::{self, Cleanup, PLAIN_IMAGE, STUBBORN_V1, Sampler, V1, V2, require_docker};
use crate::helpers::{TestApp, spawn_docker_app, unique};

const CONVERGE: Duration = Duration::from_secs(90);

/// The pool's containers and machine records name the same machines.
async fn assert_records_match(app: &TestApp, d: &bollard::Docker, pool: &str, n: usize) {
    let seen = docker::pool_containers(d, pool).await;
    assert_eq!(seen.len(), n, "containers of {pool}: {seen:#?}");
    let machines = app.machines(pool).await;
    let container_names: HashSet<String> = seen.iter().map(|c| c.name.clone()).collect();
    assert_eq!(crate::helpers::names(&machines), container_names, "machine records mirror the containers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn scale_0_to_5_to_2_to_0_on_docker() {
    require_docker();
    let pool = unique("scale");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(&pool, 0, json!({"version": V1, "failure_domains": ["fd-a", "fd-b"]})).await;
    app.wait_converged(&pool, 0, CONVERGE).await;
    for n in [5u64, 2, 0] {
        assert_eq!(app.scale(&pool, n as i64).await.status(), StatusCode::OK);
        app.wait_converged(&pool, n, CONVERGE).await;
        assert_records_match(&app, &d, &pool, n as usize).await;
    }
    let events = app.events(&pool).await;
    let story: Vec<String> = events.iter().map(|e| format!("{}: {}", e["reason"], e["message"])).collect();
    assert_eq!(events.iter().filter(|e| e["reason"] == "MachineCreated").count(), 5, "{story:#?}");
    assert_eq!(events.iter().filter(|e| e["reason"] == "MachineDeleted").count(), 5, "{story:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_pool_s_stop_grace_period_is_what_its_deleted_machines_get_to_stop() {
    require_docker();
    let (quick, slow) = (unique("grace-1s"), unique("grace-server"));
    let _cleanup = Cleanup(vec![quick.clone(), slow.clone()]);
    // The server gives machines 8 s; the image ignores SIGTERM, so each
    // deletion takes the whole grace period before the engine kills it.
    let tmp = tempfile::TempDir::new().expect("temporary directory");
    let mut cfg = crate::helpers::config(tmp.path(), drover::config::RuntimeKind::Docker);
    cfg.stop_timeout = Duration::from_secs(8);
    let app = crate::helpers::start(cfg, Some(tmp)).await;
    let spec = |grace: Value| json!({"version": V1, "image": STUBBORN_V1, "stop_grace_period_seconds": grace});
    app.create_pool_ok(&quick, 1, spec(json!(1))).await;
    app.create_pool_ok(&slow, 1, spec(Value::Null)).await;
    assert_eq!(app.pool(&quick).await["stop_grace_period_seconds"], 1);
    assert!(app.pool(&slow).await["stop_grace_period_seconds"].is_null(), "unset: the server's");
    for pool in [&quick, &slow] {
        app.wait_converged(pool, 1, CONVERGE).await;
    }
    let deleted_in = async |pool: &str| {
        let started = tokio::time::Instant::now();
        assert_eq!(app.scale(pool, 0).await.status(), StatusCode::OK);
        app.wait_converged(pool, 0, CONVERGE).await;
        started.elapsed()
    };
    let (quick_took, slow_took) = (deleted_in(&quick).await, deleted_in(&slow).await);
    eprintln!("deleted with a 1 s grace period in {quick_took:?}, with the server's 8 s in {slow_took:?}");
    assert!(quick_took < Duration::from_secs(6), "the pool's 1 s, not the server's 8 s: {quick_took:?}");
    assert!(slow_took >= Duration::from_secs(7), "the server's 8 s when the pool sets none: {slow_took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn containers_get_the_pool_labels_names_and_an_even_spread() {
    require_docker();
    let pool = unique("labels");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(
        &pool,
        6,
        json!({"version": V1, "failure_domains": ["a", "b", "c"], "labels": {"team": "infra"}}),
    )
    .await;
    app.wait_converged(&pool, 6, CONVERGE).await;
    let seen = docker::pool_containers(&d, &pool).await;
    for c in &seen {
        assert!(drover::domain::names::is_machine_name(&c.name), "{}", c.name);
        assert_eq!(c.image, format!("kindest/node:{V1}"));
        assert_eq!(c.labels["drover.dev/managed-by"], "drover");
        assert_eq!(c.labels["team"], "infra");
    }
    for fd in ["a", "b", "c"] {
        let n =
            seen.iter().filter(|c| c.labels.get("drover.dev/failure-domain").map(String::as_str) == Some(fd)).count();
        assert_eq!(n, 2, "failure domain {fd} holds {n} of 6 machines");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_container_removed_out_of_band_is_replaced_and_its_record_dropped() {
    require_docker();
    let pool = unique("oob");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(&pool, 2, json!({"version": V1})).await;
    app.wait_converged(&pool, 2, CONVERGE).await;
    let victim = app.machines(&pool).await[0]["name"].as_str().unwrap().to_owned();
    docker::remove_by_hand(&victim);
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        let machines = app.machines(&pool).await;
        let running = docker::pool_containers(&d, &pool).await.iter().filter(|c| c.running).count();
        if !crate::helpers::names(&machines).contains(&victim) && running == 2 && machines.len() == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the removed machine was not replaced: {machines:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.wait_converged(&pool, 2, CONVERGE).await;
    assert_records_match(&app, &d, &pool, 2).await;
    let events = app.events(&pool).await;
    assert!(events.iter().any(|e| e["reason"] == "MachineVanished"), "{events:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_container_made_by_hand_with_the_pool_label_is_adopted() {
    require_docker();
    let pool = unique("adopt");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let handmade = format!("{pool}-handmade");
    docker::run_by_hand(&handmade, &format!("kindest/node:{V1}"), &[("drover.dev/pool", &pool)]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(&pool, 2, json!({"version": V1})).await;
    app.wait_converged(&pool, 2, CONVERGE).await;
    assert_records_match(&app, &d, &pool, 2).await;
    assert!(app.machine_names(&pool).await.contains(&handmade), "the hand-made container became a machine");
    assert!(app.events(&pool).await.iter().any(|e| e["reason"] == "MachineFound"));

    // Without a namespace label it is default's (as every machine made
    // before namespaces): a pool of the same name elsewhere never takes it.
    let res = app.request(Method::POST, "/v1/namespaces", Some(json!({"name": "team-b"}))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let twin = json!({"name": pool, "replicas": 1, "version": V1});
    let res = app.request(Method::POST, "/v1/pools?namespace=team-b", Some(twin)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let theirs = crate::helpers::wait_some(CONVERGE, "team-b's pool to have its one machine", async || {
        let res = app.get(&format!("/v1/pools/{pool}/machines?namespace=team-b")).await;
        let page: Value = res.json().await.ok()?;
        let names: Vec<String> =
            page["items"].as_array()?.iter().filter_map(|m| m["name"].as_str().map(str::to_owned)).collect();
        (names.len() == 1).then_some(names)
    })
    .await;
    assert!(!theirs.contains(&handmade), "team-b's pool adopted default's machine: {theirs:?}");
    app.wait_converged(&pool, 2, CONVERGE).await;
    assert!(app.machine_names(&pool).await.contains(&handmade), "default's pool keeps it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_machine_marked_for_deletion_is_the_one_removed_on_scale_down() {
    require_docker();
    let pool = unique("mark");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(&pool, 3, json!({"version": V1})).await;
    app.wait_converged(&pool, 3, CONVERGE).await;
    let all = app.machine_names(&pool).await;
    let chosen = all.iter().min().unwrap().clone();
    let res = app.request(Method::POST, &format!("/v1/pools/{pool}/machines/{chosen}/delete-request"), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let marked: Value = res.json().await.unwrap();
    assert_eq!(marked["delete_requested"], true);
    // The mark alone changes nothing, even to the pass it wakes.
    app.wait_pass_after_now(CONVERGE, "a pass after the mark").await;
    assert_eq!(docker::pool_containers(&d, &pool).await.len(), 3);
    assert_eq!(app.machine_names(&pool).await, all, "the mark alone removed or replaced a machine");

    app.scale(&pool, 2).await;
    app.wait_converged(&pool, 2, CONVERGE).await;
    let left = app.machine_names(&pool).await;
    assert!(!left.contains(&chosen), "the marked machine should have gone first");
    assert_eq!(left.len(), 2);

    // DELETE of a chosen machine lowers replicas and removes exactly it.
    let second = left.iter().max().unwrap().clone();
    let res = app.request(Method::DELETE, &format!("/v1/pools/{pool}/machines/{second}"), None).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(app.pool(&pool).await["replicas"], 1);
    let again = app.request(Method::DELETE, &format!("/v1/pools/{pool}/machines/{second}"), None).await;
    assert!(again.status() == StatusCode::ACCEPTED || again.status() == StatusCode::NOT_FOUND);
    app.wait_converged(&pool, 1, CONVERGE).await;
    assert_eq!(app.pool(&pool).await["replicas"], 1, "a repeated DELETE does not lower replicas twice");
    assert!(!app.machine_names(&pool).await.contains(&second));
    assert_records_match(&app, &d, &pool, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_version_change_replaces_every_machine_without_a_ready_dip() {
    require_docker();
    let pool = unique("roll");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    // Strict replacement: containers being stopped count toward the surge bound.
    app.create_pool_ok(&pool, 3, json!({"version": V1, "strategy": {"replacement": "termination_complete"}})).await;
    app.wait_converged(&pool, 3, CONVERGE).await;
    let before = app.machine_names(&pool).await;

    let sampler = Sampler::start(d.clone(), pool.clone());
    assert_eq!(app.patch_pool(&pool, json!({"version": V2}), None).await.status(), StatusCode::OK);
    app.wait_converged(&pool, 3, CONVERGE).await;
    let (min_running, max_total, samples) = sampler.finish().await;

    let after = docker::pool_containers(&d, &pool).await;
    assert!(after.iter().all(|c| c.image == format!("kindest/node:{V2}")), "{after:#?}");
    assert!(app.machine_names(&pool).await.is_disjoint(&before), "every machine was replaced");
    assert!(samples >= 5, "the sampler ran ({samples} samples)");
    assert!(min_running >= 3, "ready machines dipped to {min_running} during the rollout");
    assert!(max_total <= 4, "surge 1 under termination_complete allows 4 containers, saw {max_total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn deleting_a_pool_removes_exactly_its_containers() {
    require_docker();
    let (doomed, kept) = (unique("doomed"), unique("kept"));
    let foreign = unique("foreign");
    let _cleanup = Cleanup(vec![doomed.clone(), kept.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    docker::run_by_hand(&foreign, PLAIN_IMAGE, &[("drover.test/foreign", "yes")]);
    app.create_pool_ok(&doomed, 2, json!({"version": V1})).await;
    app.create_pool_ok(&kept, 2, json!({"version": V1})).await;
    app.wait_converged(&doomed, 2, CONVERGE).await;
    app.wait_converged(&kept, 2, CONVERGE).await;

    assert_eq!(app.delete_pool(&doomed).await.status(), StatusCode::ACCEPTED);
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while app.get_pool(&doomed).await.status() != StatusCode::NOT_FOUND {
        assert!(tokio::time::Instant::now() < deadline, "pool {doomed} was never removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(docker::pool_containers(&d, &doomed).await.is_empty());
    assert_eq!(docker::pool_containers(&d, &kept).await.len(), 2, "another pool's containers are untouched");
    let foreign_left = docker::containers(&d, "drover.test/foreign=yes").await;
    assert!(foreign_left.iter().any(|c| c.name == foreign && c.running), "a container not made by drover is untouched");
    docker::remove_by_hand(&foreign);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_crash_in_the_middle_of_a_scale_to_10_converges_with_no_duplicates_or_orphans() {
    require_docker();
    let d = docker::client().await;
    let pool = unique("crash");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let tmp = tempfile::TempDir::new().unwrap();

    let first = crate::process::Process::spawn(tmp.path());
    first.wait_up().await;
    let client = crate::helpers::client_with_token(&crate::helpers::admin_token(tmp.path()));
    let res = client
        .post(format!("{}/v1/pools", first.addr))
        .json(&json!({"name": pool, "replicas": 10, "version": V1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // Kill (SIGKILL) once some, but not all, containers exist.
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while docker::pool_containers(&d, &pool).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no container was ever created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    let at_crash = docker::pool_containers(&d, &pool).await.len();

    // A short resync, so that passes keep coming once the pool converged.
    let second = crate::process::Process::spawn_with(tmp.path(), &["--resync-interval", "1s"]);
    second.wait_up().await;
    let what = format!("convergence after the crash ({at_crash} containers existed)");
    second
        .wait_pool(&client, &pool, CONVERGE, &what, |p| {
            p["status"]["ready_replicas"] == 10 && p["status"]["replicas"] == 10
        })
        .await;
    // A pass that began after convergence would show a duplicate.
    second.wait_pass_after_now(&client, CONVERGE, "a pass after convergence").await;
    let seen = docker::pool_containers(&d, &pool).await;
    assert_eq!(seen.len(), 10, "exactly 10 containers after the crash (had {at_crash} at the crash)");
    let recorded = second.machine_names(&client, &pool).await;
    assert_eq!(
        recorded,
        seen.iter().map(|c| c.name.clone()).collect::<HashSet<_>>(),
        "no orphan and no missing record"
    );
    second.kill();
}
