//! Rolling updates on the real Docker engine: bounds, stalls, rollback,
//! pause, batch approval and the dry-run plan.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::docker::{self, CRASH_IMAGE, Cleanup, PLAIN_IMAGE, Sampler, V1, V2, require_docker};
use crate::helpers::{TestApp, spawn_docker_app, unique, wait_for};

const LIMIT: Duration = Duration::from_secs(120);

async fn rollout(app: &TestApp, pool: &str) -> Value {
    let res = app.get(&format!("/v1/pools/{pool}/rollout")).await;
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.expect("rollout JSON")
}

async fn wait_rollout(app: &TestApp, pool: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let r = rollout(app, pool).await;
        if done(&r) {
            return r;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}; rollout is {r:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the pass that last wrote the rollout's progress began: a held
/// rollout (paused, or awaiting approval) restarts its progress clock on
/// every pass (`src/domain/rollout.rs`).
fn progress_at(r: &Value) -> Option<DateTime<Utc>> {
    serde_json::from_value(r["last_progress_at"].clone()).ok()
}

/// Waits for a pass of a held rollout that began after `since`, so saw the
/// world as it was then; `unchanged` must hold on every poll meanwhile.
async fn wait_held_pass(
    app: &TestApp,
    pool: &str,
    since: DateTime<Utc>,
    unchanged: impl AsyncFn(&Value) -> Result<(), String>,
) {
    let what =
        format!("a pass of the held rollout that began after {since} (a held rollout is looked at on each resync)");
    wait_for(LIMIT, &what, async || {
        let r = rollout(app, pool).await;
        if let Err(moved) = unchanged(&r).await {
            panic!("{moved}: {r:#}");
        }
        progress_at(&r).is_some_and(|at| at > since)
    })
    .await;
}

/// Rolls 6 machines from V1 to V2 and returns (fewest running, most existing).
async fn roll_six(strategy: Value) -> (usize, usize) {
    let pool = unique("bounds");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    app.create_pool_ok(&pool, 6, json!({"version": V1, "strategy": strategy})).await;
    app.wait_converged(&pool, 6, LIMIT).await;
    let sampler = Sampler::start(d.clone(), pool.clone());
    assert_eq!(app.patch_pool(&pool, json!({"version": V2}), None).await.status(), StatusCode::OK);
    app.wait_converged(&pool, 6, LIMIT).await;
    let (min_running, max_total, samples) = sampler.finish().await;
    assert!(samples >= 3, "the sampler ran");
    let images: HashSet<String> = docker::pool_containers(&d, &pool).await.into_iter().map(|c| c.image).collect();
    assert_eq!(images, HashSet::from([format!("kindest/node:{V2}")]));
    assert_eq!(rollout(&app, &pool).await["state"], "complete");
    (min_running, max_total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn surge_2_unavailable_0_stays_within_8_machines_and_6_available() {
    require_docker();
    let strict = json!({"max_surge": 2, "max_unavailable": 0, "replacement": "termination_complete"});
    let (min_running, max_total) = roll_six(strict).await;
    assert!(max_total <= 8, "saw {max_total} machines with surge 2");
    assert!(min_running >= 6, "saw only {min_running} running with unavailable 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn surge_0_unavailable_2_never_drops_below_4_available() {
    require_docker();
    let strict = json!({"max_surge": 0, "max_unavailable": 2, "replacement": "termination_complete"});
    let (min_running, max_total) = roll_six(strict).await;
    assert!(max_total <= 6, "saw {max_total} machines with surge 0");
    assert!(min_running >= 4, "saw only {min_running} running with unavailable 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_rollout_to_a_crashing_image_stalls_without_touching_healthy_machines() {
    require_docker();
    let pool = unique("stall");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    // Default readiness and strategy: a container that exits at once runs for
    // an instant, which must never count as ready. Only the deadline is short.
    let spec = json!({"image": PLAIN_IMAGE, "progress_deadline_seconds": 4});
    app.create_pool_ok(&pool, 3, spec).await;
    app.wait_converged(&pool, 3, LIMIT).await;
    let healthy = app.machine_names(&pool).await;
    assert_eq!(app.patch_pool(&pool, json!({"image": CRASH_IMAGE}), None).await.status(), StatusCode::OK);
    let r = wait_rollout(&app, &pool, "a stalled rollout", |r| r["state"] == "stalled").await;
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("ProgressDeadlineExceeded"), "{r:#}");
    assert!(reason.contains("MachineExited") || reason.contains("CrashLoopBackOff"), "the rollout says why: {r:#}");
    let p = app.pool(&pool).await;
    let progressing =
        p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Progressing").cloned().unwrap();
    assert_eq!(
        (progressing["status"].clone(), progressing["reason"].clone()),
        (json!("False"), json!("ProgressDeadlineExceeded"))
    );
    assert!(app.events(&pool).await.iter().any(|e| e["reason"] == "ProgressDeadlineExceeded"));
    // Every healthy machine is still there and running.
    let running: HashSet<String> =
        docker::pool_containers(&d, &pool).await.into_iter().filter(|c| c.running).map(|c| c.name).collect();
    assert!(
        healthy.is_subset(&running),
        "healthy {healthy:?}, running {running:?}, events {:#?}",
        app.events(&pool).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn auto_rollback_returns_a_stalled_rollout_to_the_old_image() {
    require_docker();
    let pool = unique("autorb");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    let spec = json!({"image": PLAIN_IMAGE, "progress_deadline_seconds": 3, "strategy": {"auto_rollback": true}});
    app.create_pool_ok(&pool, 3, spec).await;
    app.wait_converged(&pool, 3, LIMIT).await;
    let healthy = app.machine_names(&pool).await;
    app.patch_pool(&pool, json!({"image": CRASH_IMAGE}), None).await;
    let p = app.wait_pool(&pool, LIMIT, "the automatic rollback", |p| p["image"] == PLAIN_IMAGE).await;
    assert_eq!(p["revision"], 3, "revision 1 was the old image, 2 the crash, 3 the way back");
    app.wait_converged(&pool, 3, LIMIT).await;
    let r = wait_rollout(&app, &pool, "the rollback to complete", |r| r["state"] == "complete").await;
    assert_eq!(r["revision"], 3, "rollback is a new revision: {r:#}");
    let seen = docker::pool_containers(&d, &pool).await;
    assert!(seen.iter().all(|c| c.image == PLAIN_IMAGE && c.running), "{seen:#?}");
    assert_eq!(app.machine_names(&pool).await, healthy, "the healthy machines were never replaced");
    let revisions: Value = app.get(&format!("/v1/pools/{pool}/revisions")).await.json().await.unwrap();
    assert_eq!(revisions["current"], 3);
    assert!(app.events(&pool).await.iter().any(|e| e["reason"] == "RolledBack"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn pause_freezes_the_machine_set_and_resume_finishes() {
    require_docker();
    let pool = unique("pause");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    app.create_pool_ok(&pool, 4, json!({"version": V1, "min_ready_seconds": 1})).await;
    app.wait_converged(&pool, 4, LIMIT).await;
    app.patch_pool(&pool, json!({"version": V2}), None).await;
    // A status from before the change counts every V1 machine as updated.
    app.wait_pool(&pool, LIMIT, "the rollout to start", |p| {
        p["status"]["observed_generation"] == p["generation"] && p["status"]["updated_replicas"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(app.patch_pool(&pool, json!({"paused": true}), None).await.status(), StatusCode::OK);
    app.wait_pool(&pool, LIMIT, "a pass that saw the pause", |p| p["status"]["observed_generation"] == p["generation"])
        .await;
    let frozen = app.machine_names(&pool).await;
    // An unpaused rollout moves on once its new machines are available:
    // wait for that moment, then for a pass that began after it.
    wait_for(LIMIT, "every machine of the paused pool to be available", async || {
        assert_eq!(app.machine_names(&pool).await, frozen, "a paused pool changed its machines");
        let counts = &rollout(&app, &pool).await["counts"];
        counts["available"] == counts["total"] && counts["terminating"] == 0
    })
    .await;
    wait_held_pass(&app, &pool, Utc::now(), async |_| {
        let now = app.machine_names(&pool).await;
        if now == frozen { Ok(()) } else { Err(format!("a paused pool changed its machines: {frozen:?} -> {now:?}")) }
    })
    .await;
    let r = rollout(&app, &pool).await;
    assert_eq!(r["state"], "paused", "{r:#}");
    assert!(r["counts"]["outdated"].as_u64() > Some(0), "paused in the middle: {r:#}");
    app.patch_pool(&pool, json!({"paused": false}), None).await;
    app.wait_converged(&pool, 4, LIMIT).await;
    assert_eq!(wait_rollout(&app, &pool, "completion", |r| r["state"] == "complete").await["counts"]["updated"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn batch_approval_stops_after_each_batch_until_continued() {
    require_docker();
    let pool = unique("batch");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    let strategy = json!({"max_surge": 2, "max_unavailable": 0, "batch_approval": true});
    app.create_pool_ok(&pool, 6, json!({"version": V1, "strategy": strategy})).await;
    app.wait_converged(&pool, 6, LIMIT).await;
    app.patch_pool(&pool, json!({"version": V2}), None).await;
    for batch in 1..=2u64 {
        let r = wait_rollout(&app, &pool, "the batch to finish", |r| r["state"] == "paused").await;
        assert_eq!(r["counts"]["updated"], 2 * batch, "{r:#}");
        assert_eq!(r["counts"]["total"], 6, "a finished batch leaves the pool at its size: {r:#}");
        assert_eq!(r["batch"]["awaiting_approval"], true);
        // Whatever pass comes next sees the batch done, and must wait.
        wait_held_pass(&app, &pool, Utc::now(), async |r| {
            let counts = (r["counts"]["updated"].clone(), r["counts"]["total"].clone());
            if counts == (json!(2 * batch), json!(6)) {
                Ok(())
            } else {
                Err("the rollout moved without approval".into())
            }
        })
        .await;
        let res = app.request(Method::POST, &format!("/v1/pools/{pool}/rollout/continue"), None).await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    app.wait_converged(&pool, 6, LIMIT).await;
    assert_eq!(wait_rollout(&app, &pool, "completion", |r| r["state"] == "complete").await["counts"]["updated"], 6);
    let res = app.request(Method::POST, &format!("/v1/pools/{pool}/rollout/continue"), None).await;
    assert_eq!(res.status(), StatusCode::CONFLICT, "nothing to continue once complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn the_dry_run_plan_matches_what_the_reconciler_then_does() {
    require_docker();
    let pool = unique("plan");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    app.create_pool_ok(&pool, 4, json!({"version": V1, "failure_domains": ["a", "b"]})).await;
    app.wait_converged(&pool, 4, LIMIT).await;
    let marked = app.machine_names(&pool).await.into_iter().max().unwrap_or_default();
    app.request(Method::POST, &format!("/v1/pools/{pool}/machines/{marked}/delete-request"), None).await;

    let planned: Value = app
        .client
        .post(app.url(&format!("/v1/pools/{pool}/plan")))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"replicas": 2}).to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let to_delete: HashSet<String> = planned["plan"]["delete"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["machine"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(to_delete.len(), 2, "{planned:#}");
    assert!(to_delete.contains(&marked), "the marked machine is planned first: {planned:#}");
    assert_eq!(planned["plan"]["create"], json!([]));
    assert_eq!(app.pool(&pool).await["replicas"], 4, "a dry run changes nothing");

    let before = app.machine_names(&pool).await;
    app.scale(&pool, 2).await;
    app.wait_converged(&pool, 2, LIMIT).await;
    let removed: HashSet<String> = before.difference(&app.machine_names(&pool).await).cloned().collect();
    assert_eq!(removed, to_delete, "the reconciler removed exactly the planned machines");

    // A proposed scale-up names the failure domains the new machines get.
    let planned: Value = app
        .client
        .post(app.url(&format!("/v1/pools/{pool}/plan")))
        .header("content-type", "application/json")
        .body(json!({"replicas": 4}).to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut domains: Vec<String> = planned["plan"]["create"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["failure_domain"].as_str().unwrap().to_owned())
        .collect();
    domains.sort();
    app.scale(&pool, 4).await;
    app.wait_converged(&pool, 4, LIMIT).await;
    let d = docker::client().await;
    let mut per_domain: Vec<String> = docker::pool_containers(&d, &pool)
        .await
        .into_iter()
        .filter_map(|c| c.labels.get("drover.dev/failure-domain").cloned())
        .collect();
    per_domain.sort();
    assert_eq!(per_domain, ["a", "a", "b", "b"], "planned {domains:?}");
}
