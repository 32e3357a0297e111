//! Machines that heal themselves, on the real engine with default pool
//! settings: whatever happens to a machine's container behind drover's
//! back, the pool is back to its ready machines within a resync and a few
//! seconds, and the events say what happened.

use std::time::Duration;

use serde_json::{Value, json};

use crate::docker::{self, CRASH_IMAGE, Cleanup, HEALTHY_IMAGE, V1, require_docker};
use crate::helpers::{TestApp, spawn_docker_app, unique};

/// How long healing may take: the test server's resync interval (5 s), by
/// which a pass looks even if an engine event was missed, plus 10 s.
const HEAL_WITHIN: Duration = Duration::from_secs(15);

/// Waits until the pool has exactly `n` containers, all running, and its
/// status says `n` ready and nothing terminating.
async fn wait_healthy(app: &TestApp, d: &bollard::Docker, pool: &str, n: usize, limit: Duration) {
    let started = tokio::time::Instant::now();
    loop {
        let seen = docker::pool_containers(d, pool).await;
        let p = app.pool(pool).await;
        let s = &p["status"];
        if seen.len() == n
            && seen.iter().all(|c| c.running)
            && s["ready_replicas"] == n
            && s["terminating_replicas"] == 0
            && s["replicas"] == n
        {
            return;
        }
        assert!(started.elapsed() < limit, "not healed within {limit:?}: containers {seen:#?}, status {s:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reasons(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| format!("{}: {}", e["reason"].as_str().unwrap_or_default(), e["message"])).collect()
}

/// One thing done to one machine of a 3-machine pool, and the event
/// reasons (with a word of their message) that must then be in its log.
async fn heal_after(app: &TestApp, d: &bollard::Docker, pool: &str, what: &str, expect: &[(&str, &str)]) {
    app.create_pool_ok(pool, 3, json!({"version": V1})).await;
    app.wait_converged(pool, 3, Duration::from_secs(60)).await;
    let victim = app.machines(pool).await[0]["name"].as_str().unwrap_or_default().to_owned();
    let args: Vec<&str> = match what {
        "stop" => vec!["stop", "-t", "1", &victim],
        "kill" => vec!["kill", &victim],
        "pause" => vec!["pause", &victim],
        // The machine's own process exits (the test program exits with 7 on SIGUSR1).
        "crash" => vec!["kill", "--signal", "USR1", &victim],
        _ => vec!["rm", "-f", &victim],
    };
    crate::images::docker(&args);
    let started = tokio::time::Instant::now();
    // The events come first: a crashed machine restarted at once can look
    // healthy again before the pass that restarted it has written its
    // status and events, so "healthy" alone does not mean "noticed".
    loop {
        let events = reasons(&app.events(pool).await);
        let missing = expect.iter().find(|(reason, word)| {
            !events.iter().any(|e| e.starts_with(reason) && e.contains(&victim) && e.contains(word))
        });
        let Some((reason, word)) = missing else { break };
        assert!(
            started.elapsed() < HEAL_WITHIN,
            "after `docker {what}`: no {reason} event about {victim} saying {word:?} within {HEAL_WITHIN:?}; events: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_healthy(app, d, pool, 3, HEAL_WITHIN.saturating_sub(started.elapsed())).await;
    eprintln!("docker {what}: healed in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_stopped_killed_paused_crashed_or_removed_machine_is_healed_with_an_event_naming_the_cause() {
    require_docker();
    let cases: [(&str, &[(&str, &str)]); 5] = [
        ("stop", &[("MachineExited", "exited"), ("MachineRestarted", "restarted")]),
        ("kill", &[("MachineExited", "signal 9"), ("MachineRestarted", "restarted")]),
        ("pause", &[("MachinePaused", "paused"), ("MachineUnpaused", "unpaused")]),
        ("crash", &[("MachineExited", "code 7"), ("MachineRestarted", "restarted")]),
        ("rm", &[("MachineVanished", "gone")]),
    ];
    let pools: Vec<String> = cases.iter().map(|(what, _)| unique(what)).collect();
    // Declared before the server, so dropped after it: nothing recreates
    // the machines once they are swept.
    let _cleanup = Cleanup(pools.clone());
    let app = spawn_docker_app().await;
    let d = docker::client().await;
    let runs = cases.iter().zip(&pools).map(|((what, expect), pool)| heal_after(&app, &d, pool, what, expect));
    tokio::time::timeout(Duration::from_secs(120), futures_util::future::join_all(runs))
        .await
        .expect("healing five pools took over 2 minutes: a pass is stuck waiting on something");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_crash_looping_image_restarts_with_growing_backoff_then_is_replaced() {
    require_docker();
    let pool = unique("crashloop");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    app.create_pool_ok(&pool, 1, json!({"image": CRASH_IMAGE})).await;
    // Restarts at once, then after 1, 2, 4 and 8 s: the fifth failure comes
    // about 15 s in, and the machine is replaced.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    let events = loop {
        let events = app.events(&pool).await;
        if events.iter().any(|e| e["reason"] == "MachineDeleting") {
            break events;
        }
        assert!(tokio::time::Instant::now() < deadline, "never replaced: {:#?}", reasons(&events));
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let restarts: Vec<chrono::DateTime<chrono::Utc>> = events
        .iter()
        .filter(|e| e["reason"] == "MachineRestarted")
        .filter_map(|e| e["time"].as_str().and_then(|t| t.parse().ok()))
        .rev()
        .collect();
    assert!(
        (5..=6).contains(&restarts.len()),
        "{} restarts before the replacement: five failed ones are allowed; {:#?}",
        restarts.len(),
        reasons(&events)
    );
    let gaps: Vec<i64> = restarts.windows(2).map(|w| (w[1] - w[0]).num_milliseconds()).collect();
    assert!(gaps.iter().skip(1).take(3).is_sorted(), "the waits between restarts grow: {gaps:?} ms");
    assert!(gaps.get(3).is_some_and(|g| *g >= 3_000), "backoff reached seconds: {gaps:?} ms");
    let messages = reasons(&events);
    assert!(messages.iter().any(|e| e.contains("next wait")), "restart events show the backoff: {messages:#?}");
    assert!(
        messages.iter().any(|e| e.starts_with("MachineDeleting") && e.contains("kept failing")),
        "after five failed restarts the machine is replaced: {messages:#?}"
    );
    // The replacement crashes as soon as it starts (in the background, after
    // the pass that created it): the pool says so within moments, and is
    // never reconciled meanwhile.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let p = app.pool(&pool).await;
        let conditions = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let status = |kind: &str| conditions.iter().find(|c| c["type"] == kind).map(|c| c["status"].clone());
        assert_eq!(
            status("Reconciled"),
            Some(json!("False")),
            "a pool short of ready machines is not reconciled: {p:#}"
        );
        if status("MachinesHealthy") == Some(json!("False")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the crash-looping replacement is not reported: {p:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_image_with_a_healthcheck_is_ready_only_once_the_check_passes() {
    require_docker();
    let pool = unique("health");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let app = spawn_docker_app().await;
    app.create_pool_ok(&pool, 1, json!({"image": HEALTHY_IMAGE})).await;
    let mut phases = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let machine = loop {
        if let Some(m) = app.machines(&pool).await.first().cloned() {
            phases.push((m["phase"].clone(), m["health"].clone(), m["ready"].clone()));
            if m["ready"] == true {
                break m;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready: {phases:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((machine["phase"].clone(), machine["health"].clone()), (json!("running"), json!("healthy")));
    assert!(
        phases.iter().any(|(p, h, r)| p == "starting" && h == "starting" && r == false),
        "before its first check passed, the machine was starting and not ready: {phases:?}"
    );
}
