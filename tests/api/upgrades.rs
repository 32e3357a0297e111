//! Control-plane upgrade jobs, end to end: drover's real kube client against
//! the Kubernetes API simulator, over loopback HTTP.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{assert_problem, wait_some};
use crate::kube_sim::{Matcher, Op};
use crate::upgrade_env::{CLUSTER, COMPONENTS, Env, FROM, TO, spawn_env, step_matcher, step_of};

const JOB_LIMIT: Duration = Duration::from_secs(30);
const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// The log with polls collapsed: consecutive identical operations count once.
fn collapsed(ops: &[Op]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for op in ops {
        let line = op.to_string();
        if out.last() != Some(&line) {
            out.push(line);
        }
    }
    out
}

/// The calls of the step table in docs/upgrades.md: the pod check of every
/// component first (step 0), then for each component the steps 1-7.
fn documented_sequence(old_pods: &[String]) -> Vec<String> {
    let mut seq = vec!["get version".to_owned()];
    seq.extend(COMPONENTS.iter().map(|c| format!("get daemonsets self-hosted-{c}")));
    for c in COMPONENTS {
        seq.push(format!("list pods [k8s-app=self-hosted-{c}]"));
        seq.push(format!("get daemonsets self-hosted-{c}"));
    }
    for (c, old) in COMPONENTS.iter().zip(old_pods) {
        let (ds, temp) = (format!("self-hosted-{c}"), format!("temp-upgrade-self-hosted-{c}"));
        seq.extend([
            // 1, 2: the copy, by server-side apply, and its pods.
            format!("apply daemonsets {temp}"),
            format!("list pods [temp-upgrade-component={c}]"),
            // 3: look at the real DaemonSet, make sure the copy runs, then change it.
            format!("get daemonsets {ds}"),
            format!("get daemonsets {temp}"),
            format!("list pods [temp-upgrade-component={c}]"),
            format!("get daemonsets {ds}"),
            format!("replace daemonsets {ds}"),
            // 4, 5
            format!("get pods {old}"),
            format!("list pods [k8s-app={ds}]"),
            // 6: the real pods run the real template, the copy is this job's: delete it.
            format!("get daemonsets {ds}"),
            format!("list pods [k8s-app={ds}]"),
            format!("get daemonsets {temp}"),
            format!("delete daemonsets {temp}"),
            format!("get daemonsets {temp}"),
            // 7
            "get healthz".to_owned(),
        ]);
    }
    seq
}

#[tokio::test]
async fn happy_path_upgrades_every_component_with_the_documented_sequence_of_calls() {
    let env = spawn_env(|_| {}).await;
    let old_pods: Vec<String> = COMPONENTS.iter().map(|c| env.pod_of(c)).collect();
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, JOB_LIMIT, "the runner never finished a plain upgrade").await;

    assert_eq!(job["state"], "succeeded", "{job:#}");
    assert_eq!(job["upgraded_components"], json!(COMPONENTS));
    assert_eq!(job["from_version"], FROM);
    assert!(job["current"].is_null());
    assert!(job["driver"].is_null(), "an ended job has no driver: {job:#}");
    env.assert_consistent(&job);
    env.wait_pods_settled().await;
    for (c, old) in COMPONENTS.iter().zip(&old_pods) {
        assert_ne!(&env.pod_of(c), old, "{c}'s pod was not replaced");
        for step in 0..=7 {
            let s = step_of(&job, c, step).unwrap_or_else(|| panic!("no record of step {step} of {c}: {job:#}"));
            assert_eq!(s["state"], "succeeded");
            assert_eq!(s["attempts"], 1);
            assert!(s["finished_at"].is_string());
        }
    }
    assert_eq!(collapsed(&env.sim.ops()), documented_sequence(&old_pods));
    assert_eq!(env.sim.violations(), Vec::<String>::new());

    let events: Value = env.app.get(&format!("/v1/upgrades/{id}/events")).await.json().await.unwrap();
    let reasons: Vec<&str> = events["items"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert_eq!(reasons.first(), Some(&"Succeeded"), "newest first: {reasons:?}");
    assert_eq!(reasons.iter().filter(|r| **r == "ComponentUpgraded").count(), 3);
}

async fn assert_check_fails_without_changes(env: &Env, expected: &str) {
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, JOB_LIMIT, "a failed pod check should end the job at once").await;
    assert_eq!(job["state"], "failed");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains(expected) && error.contains("nothing was changed"), "{error}");
    assert!(error.contains("step 0 (check_pods) of kube-scheduler"), "{error}");
    let writes: Vec<String> = env.sim.ops().iter().filter(|o| o.is_write()).map(|o| o.to_string()).collect();
    assert!(writes.is_empty(), "the check must come before any change: {writes:?}");
    assert_eq!(job["upgraded_components"], json!([]));
}

#[tokio::test]
async fn a_component_without_a_pod_fails_the_check_before_anything_changes() {
    let env = spawn_env(|_| {}).await;
    env.sim.unschedule("self-hosted-kube-scheduler");
    tokio::time::timeout(Duration::from_secs(5), async {
        while !env.sim.pods("k8s-app=self-hosted-kube-scheduler").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the simulator's controller did not remove the unschedulable pod");
    assert_check_fails_without_changes(&env, "no pod matches k8s-app=self-hosted-kube-scheduler").await;
}

#[tokio::test]
async fn a_component_with_two_pods_fails_the_check_before_anything_changes() {
    let env = spawn_env(|_| {}).await;
    let labels = json!({"k8s-app": "self-hosted-kube-scheduler"});
    env.sim.add_stray_pod("kube-scheduler-stray", labels, "registry.k8s.io/kube-scheduler:v1.29.2");
    assert_check_fails_without_changes(&env, "2 pods match k8s-app=self-hosted-kube-scheduler").await;
}

async fn restart_during(step: u8) {
    let env = spawn_env(|_| {}).await;
    let hold = env.sim.hold(step_matcher(&env.sim, "kube-controller-manager", 1, step));
    let id = env.start_upgrade(json!({})).await;
    hold.reached(HOLD_LIMIT, &format!("step {step}")).await;
    let env = env.restart().await;
    env.sim.release_all();
    let job = env.wait_done(id, JOB_LIMIT, &format!("the job did not resume after a restart in step {step}")).await;
    assert_eq!(job["state"], "succeeded", "restart in step {step}: {job:#}");
    env.assert_consistent(&job);
    env.wait_pods_settled().await;
    // A graceful stop drops a step that only looks (it runs again), and
    // lets a step that writes finish its write. (A store error under the
    // suite's load may retry a step once more: that is one more attempt.)
    let record = step_of(&job, "kube-controller-manager", i64::from(step)).expect("step record");
    let attempts = record["attempts"].as_i64().unwrap_or(0);
    if [2, 4, 5, 7].contains(&step) {
        assert!(attempts >= 2, "step {step} only waits: it should have been run again after the restart: {record:#}");
    } else {
        assert!(attempts >= 1, "step {step}: {record:#}");
    }
    let events: Value = env.app.get(&format!("/v1/upgrades/{id}/events")).await.json().await.unwrap();
    assert!(events["items"].as_array().unwrap().iter().any(|e| e["reason"] == "Resumed"), "step {step}");
}

#[tokio::test]
async fn a_restart_in_any_step_still_ends_succeeded_without_a_temporary_daemonset() {
    let all = join_all((0..=7).map(restart_during));
    tokio::time::timeout(Duration::from_secs(90), all)
        .await
        .expect("restarts never finished: a job does not resume, or the runner ignores shutdown");
}

async fn cancel_during(step: u8) {
    let env = spawn_env(|_| {}).await;
    let hold = env.sim.hold(step_matcher(&env.sim, "kube-apiserver", 0, step));
    let id = env.start_upgrade(json!({})).await;
    hold.reached(HOLD_LIMIT, &format!("step {step}")).await;
    let res = env.cancel(id).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED, "cancel in step {step}");
    let view: Value = res.json().await.unwrap();
    assert_eq!(view["cancel_requested"], true);
    env.sim.release_all();
    let job = env.wait_done(id, JOB_LIMIT, &format!("a cancel in step {step} was never honoured")).await;
    assert_eq!(job["state"], "cancelled", "cancel in step {step}: {job:#}");
    // Before step 3 nothing is changed; from step 3 on, the component is finished first.
    let upgraded = if step < 3 { json!([]) } else { json!(["kube-apiserver"]) };
    assert_eq!(job["upgraded_components"], upgraded, "cancel in step {step}: {job:#}");
    env.assert_consistent(&job);
    env.wait_pods_settled().await;
}

#[tokio::test]
async fn a_cancel_in_any_step_leaves_the_cluster_consistent() {
    let all = join_all((0..=7).map(cancel_during));
    tokio::time::timeout(Duration::from_secs(90), all)
        .await
        .expect("cancels never finished: the runner does not reach a safe point");
}

#[tokio::test]
async fn a_pending_job_is_cancelled_at_once_and_an_ended_one_cannot_be() {
    let env = spawn_env(|_| {}).await;
    let id = env.start_upgrade(json!({"components": ["kube-scheduler"]})).await;
    let job = env.wait_done(id, JOB_LIMIT, "a one-component upgrade").await;
    assert_eq!(job["state"], "succeeded");
    assert_problem(env.cancel(id).await, 409, None).await;
    assert_problem(env.cancel(999).await, 404, None).await;
}

#[tokio::test]
async fn an_image_that_never_runs_is_rolled_back_and_fails_the_job() {
    let env = spawn_env(|c| c.upgrade_wait_timeout = Duration::from_millis(1500)).await;
    env.sim.break_image(&format!("registry.k8s.io/kube-scheduler:{TO}"));
    let id = env.start_upgrade(json!({})).await;
    let running = wait_some(JOB_LIMIT, "the job to run", async || {
        let job: Value = env.app.get(&format!("/v1/upgrades/{id}")).await.json().await.ok()?;
        (job["state"] == "running").then_some(job)
    })
    .await;
    let driver = running["driver"].as_str().unwrap_or_default();
    assert!(driver.contains(&format!("-{}-", std::process::id())), "a running job names its runner: {running:#}");
    let job = env.wait_done(id, JOB_LIMIT, "a stuck pod should time out and roll back").await;
    assert_eq!(job["state"], "failed", "{job:#}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains("step 5 (wait_new_running) of kube-scheduler failed: timed out"), "{error}");
    assert!(error.contains("kube-scheduler was rolled back"), "{error}");
    assert!(error.contains("upgraded: kube-apiserver, kube-controller-manager"), "{error}");
    assert_eq!(job["upgraded_components"], json!(["kube-apiserver", "kube-controller-manager"]));
    let scheduler = &job["progress"][2];
    assert_eq!(scheduler["state"], "rolled_back");
    assert_eq!(step_of(&job, "kube-scheduler", 8).expect("rollback record")["state"], "succeeded");
    env.assert_consistent(&job);
    env.wait_pods_settled().await;
}

#[tokio::test]
async fn a_5xx_burst_shorter_than_the_retry_budget_is_survived() {
    let env = spawn_env(|_| {}).await;
    env.sim.burst_on(Matcher::new("replace", "daemonsets").name("self-hosted-kube-apiserver"), 503, 5);
    env.sim.burst_on(Matcher::new("create", "daemonsets").name("temp-upgrade-self-hosted-kube-scheduler"), 500, 4);
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, JOB_LIMIT, "retries should carry the job through a short burst").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
    let retries = step_of(&job, "kube-apiserver", 3).expect("step 3")["api_retries"].as_i64().unwrap_or(0);
    assert_eq!(retries, 5, "{job:#}");
    env.assert_consistent(&job);
}

#[tokio::test]
async fn update_conflicts_are_read_again_and_retried() {
    let env = spawn_env(|_| {}).await;
    env.sim.burst_on(Matcher::new("replace", "daemonsets").name("self-hosted-kube-controller-manager"), 409, 3);
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, JOB_LIMIT, "conflicts should be retried").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
    assert!(step_of(&job, "kube-controller-manager", 3).unwrap()["api_retries"].as_i64() >= Some(1));
}

#[tokio::test]
async fn a_5xx_burst_longer_than_the_retry_budget_fails_the_job_cleanly() {
    let env = spawn_env(|_| {}).await;
    // Ten tries fail; the rollback that follows meets the last two errors and then succeeds.
    env.sim.burst_on(Matcher::new("replace", "daemonsets").name("self-hosted-kube-apiserver"), 503, 12);
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, JOB_LIMIT, "exhausted retries should fail the job").await;
    assert_eq!(job["state"], "failed", "{job:#}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains("step 3 (update_daemonset) of kube-apiserver failed"), "{error}");
    assert!(error.contains("after 10 tries") && error.contains("503"), "{error}");
    assert!(error.contains("rolled back"), "{error}");
    assert_eq!(job["upgraded_components"], json!([]));
    env.assert_consistent(&job);
    env.wait_pods_settled().await;
}

#[tokio::test]
async fn healthz_failing_for_a_while_and_a_short_outage_are_waited_out() {
    let env = spawn_env(|_| {}).await;
    env.sim.fail_healthz(5);
    let hold = env.sim.hold(Matcher::new("list", "pods").selector("temp-upgrade-component=kube-controller-manager"));
    let id = env.start_upgrade(json!({})).await;
    hold.reached(HOLD_LIMIT, "step 2 of kube-controller-manager").await;
    env.sim.unreachable_for(Duration::from_millis(150));
    env.sim.release_all();
    let job = env.wait_done(id, JOB_LIMIT, "waits and retries should outlast short outages").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
    let retried = step_of(&job, "kube-controller-manager", 2).expect("step 2")["api_retries"].as_i64().unwrap_or(0);
    assert!(retried >= 1, "the outage should have cost retries: {job:#}");
    assert!(env.sim.ops().iter().filter(|o| o.kind == "healthz").count() >= 6, "healthz failures were waited out");
    env.assert_consistent(&job);
}

#[tokio::test]
async fn version_policy_rejections_answer_422_naming_the_rule() {
    let env = spawn_env(|_| {}).await;
    for (version, rule) in [
        ("v1.31.0", "minor_skip"),
        ("v1.28.9", "no_downgrade"),
        ("v2.0.0", "major_version"),
        ("1.30", "version_format"),
        ("v1.30.0-rc.1", "version_format"),
    ] {
        let body = assert_problem(env.post_upgrade(json!({"version": version})).await, 422, Some("version")).await;
        assert_eq!(body["errors"][0]["rule"], rule, "{version}: {body:#}");
    }
    let body = assert_problem(env.post_upgrade(json!({"version": TO, "components": ["etcd"]})).await, 422, None).await;
    assert!(body["detail"].as_str().unwrap_or_default().contains("components"), "{body:#}");
    assert!(env.sim.ops().iter().all(|o| !o.is_write()), "a refused request changed the cluster");
    // force lifts the policy.
    let id = env.start_upgrade(json!({"version": "v1.31.0", "force": true, "components": ["kube-scheduler"]})).await;
    let job = env.wait_done(id, JOB_LIMIT, "a forced upgrade").await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(env.image_of("kube-scheduler"), "registry.k8s.io/kube-scheduler:v1.31.0");
}

#[tokio::test]
async fn one_active_job_per_cluster_and_the_409_names_it() {
    let env = spawn_env(|_| {}).await;
    let hold = env.sim.hold(Matcher::new("apply", "daemonsets"));
    let id = env.start_upgrade(json!({})).await;
    hold.reached(HOLD_LIMIT, "step 1").await;
    let body = assert_problem(env.post_upgrade(json!({"version": TO})).await, 409, None).await;
    assert!(body["detail"].as_str().unwrap_or_default().contains(&format!("upgrade job {id} ")), "{body:#}");
    let busy = env.app.request(reqwest::Method::DELETE, "/v1/clusters/prod", None).await;
    assert_problem(busy, 409, None).await;
    env.sim.release_all();
    let job = env.wait_done(id, JOB_LIMIT, "the first job").await;
    assert_eq!(job["state"], "succeeded");

    let list: Value = env.app.get("/v1/upgrades?cluster=prod&state=succeeded&limit=1").await.json().await.unwrap();
    assert_eq!(list["items"][0]["id"], id);
    let none: Value = env.app.get("/v1/upgrades?state=running").await.json().await.unwrap();
    assert_eq!(none["items"], json!([]));
    assert_problem(env.app.get("/v1/upgrades?state=bogus").await, 422, None).await;
}

#[tokio::test]
async fn the_plan_route_answers_the_plan_and_changes_nothing() {
    let env = spawn_env(|_| {}).await;
    let res = env.plan_upgrade(json!({"version": TO, "image_repository": "mirror.local:5000/k8s"})).await;
    assert_eq!(res.status(), StatusCode::OK);
    let plan: Value = res.json().await.unwrap();
    assert_eq!(plan["current_version"], FROM);
    let comps = plan["components"].as_array().unwrap();
    assert_eq!(comps.len(), 3);
    assert_eq!(comps[0]["component"], "kube-apiserver");
    assert_eq!(comps[0]["current_image"], format!("registry.k8s.io/kube-apiserver:{FROM}"));
    assert_eq!(comps[0]["new_image"], format!("mirror.local:5000/k8s/kube-apiserver:{TO}"));
    assert_eq!(comps[2]["steps"].as_array().unwrap().len(), 8);
    assert!(env.sim.ops().iter().all(|o| !o.is_write()));
    let list: Value = env.app.get("/v1/upgrades").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "a dry run stores no job");
}

/// Before the plan had its own route, a start with `"dry_run": true`
/// answered the plan. Obeying only the route would start a job that was
/// meant as a look; the contradiction is refused instead, and a start with
/// `"dry_run": false` (which older CLIs send) still starts.
#[tokio::test]
async fn a_dry_run_sent_to_the_start_route_is_refused_and_starts_nothing() {
    let env = spawn_env(|_| {}).await;
    let res = env.post_upgrade(json!({"version": TO, "dry_run": true})).await;
    let problem = assert_problem(res, 422, Some("dry_run")).await;
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&format!("/v1/clusters/{CLUSTER}/upgrades/plan")), "names the plan route: {problem:#}");
    let res = env.plan_upgrade(json!({"version": TO, "dry_run": false})).await;
    assert_problem(res, 422, Some("dry_run")).await;
    assert!(env.sim.ops().iter().all(|o| !o.is_write()), "a refused request changed the cluster");
    let list: Value = env.app.get("/v1/upgrades").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "a refused request stored no job");

    let planned = env.plan_upgrade(json!({"version": TO, "dry_run": true})).await;
    assert_eq!(planned.status(), StatusCode::OK, "a plan may still say it is a dry run");
    let id = env.start_upgrade(json!({"dry_run": false})).await;
    let job = env.wait_done(id, JOB_LIMIT, "an upgrade started with `dry_run: false`").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
}

/// Starts job `id` (ids are handed out in order) and cancels it: in even
/// rounds with cancels sent from the moment the start is sent, until one
/// finds the job (so it lands as early as it can, racing the runner's
/// claim); in odd rounds once the start answered, a little later each
/// time. `None` when the start is refused because the previous job still
/// winds down.
async fn start_and_cancel(env: &Env, id: i64, round: u64) -> Option<(i64, StatusCode)> {
    let post = env.post_upgrade(json!({"version": TO}));
    if round % 2 == 1 {
        let res = post.await;
        if res.status() != StatusCode::ACCEPTED {
            assert_eq!(res.status(), StatusCode::CONFLICT);
            return None;
        }
        tokio::time::sleep(Duration::from_millis(round % 7 * 3)).await;
        return Some((id, env.cancel(id).await.status()));
    }
    let early = async {
        for _ in 0..5000 {
            let status = env.cancel(id).await.status();
            if status != StatusCode::NOT_FOUND {
                return status;
            }
        }
        panic!("job {id} never appeared");
    };
    tokio::pin!(post, early);
    let (res, cancel) = tokio::select! {
        res = &mut post => {
            if res.status() != StatusCode::ACCEPTED {
                assert_eq!(res.status(), StatusCode::CONFLICT);
                return None;
            }
            (res, early.await)
        }
        cancel = &mut early => (post.await, cancel),
    };
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    Some((id, cancel))
}

/// A timestamp of a view, compared as a time (the text's fraction varies in length).
fn time(v: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    v.as_str().and_then(|t| t.parse().ok())
}

/// One round of the race: the job's id, and what the cancel answered.
struct Round {
    id: i64,
    cancel: StatusCode,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_the_start_of_a_job_never_lets_a_runner_write_to_a_cancelled_job() {
    let env = spawn_env(|c| c.upgrade_poll_interval = Duration::from_millis(5)).await;
    let rounds = tokio::time::timeout(Duration::from_secs(90), async {
        let mut rounds = Vec::new();
        for r in 0..50u64 {
            let next_id = i64::try_from(r).unwrap() + 1;
            // The previous job may still wind down (409): ask again, bounded.
            let mut tries = 0;
            let (id, cancel) = loop {
                if let Some(round) = start_and_cancel(&env, next_id, r).await {
                    break round;
                }
                tries += 1;
                assert!(tries < 400, "round {r}: the previous job never ended");
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            assert_eq!(id, next_id, "ids are handed out in order");
            rounds.push(Round { id, cancel });
        }
        rounds
    })
    .await
    .expect("50 rounds of start and cancel did not finish: a cancelled job is never wound down");

    let mut cancelled_pending = 0;
    for Round { id, cancel } in &rounds {
        let job = env.wait_done(*id, JOB_LIMIT, "a cancelled job never ended").await;
        assert_eq!(job["state"], "cancelled", "cancel answered {cancel}: {job:#}");
        let finished = time(&job["finished_at"]).expect("finished_at");
        assert_eq!(time(&job["updated_at"]), Some(finished), "nothing writes a job after its end: {job:#}");
        let events: Value = env.app.get(&format!("/v1/upgrades/{id}/events?limit=500")).await.json().await.unwrap();
        let events = events["items"].as_array().cloned().unwrap_or_default();
        for e in &events {
            assert!(time(&e["time"]) <= Some(finished), "an event after the end: {e:#}; job {job:#}");
        }
        for p in job["progress"].as_array().unwrap() {
            for s in p["steps"].as_array().unwrap() {
                assert!(time(&s["finished_at"]) <= Some(finished), "a step after the end: {job:#}");
            }
        }
        if *cancel == StatusCode::OK {
            // Cancelled while pending: no runner ever claimed it.
            cancelled_pending += 1;
            assert!(job["started_at"].is_null(), "{job:#}");
            assert!(job["progress"].as_array().unwrap().iter().all(|p| p["steps"] == json!([])), "{job:#}");
            assert!(events.iter().all(|e| e["reason"] != "Started" && e["reason"] != "Resumed"), "{events:#?}");
        } else {
            assert_eq!(*cancel, StatusCode::ACCEPTED, "job {id}");
        }
    }
    println!("{cancelled_pending} of {} jobs were cancelled before a runner claimed them", rounds.len());
    assert_eq!(env.sim.violations(), Vec::<String>::new(), "a copy was removed while its component rolled");
    let left: Vec<String> = env.sim.daemonset_names().into_iter().filter(|n| n.starts_with("temp-upgrade-")).collect();
    assert!(left.is_empty(), "temporary DaemonSets left: {left:?}");
    // Each component runs the new version exactly when some job says it upgraded it.
    let mut upgraded = std::collections::BTreeSet::new();
    for Round { id, .. } in &rounds {
        upgraded.extend(crate::upgrade_env::upgraded(&env.job(*id).await));
    }
    for c in COMPONENTS {
        let version = if upgraded.contains(c) { TO } else { FROM };
        assert_eq!(env.image_of(c), format!("registry.k8s.io/{c}:{version}"));
    }
    env.wait_pods_settled().await;
}

async fn operator_client(env: &Env) -> reqwest::Client {
    let body = json!({"name": "ci-operator", "role": "operator"});
    let res = env.app.request(reqwest::Method::POST, "/v1/tokens", Some(body)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let token: Value = res.json().await.unwrap();
    crate::helpers::client_with_token(token["token"].as_str().unwrap())
}

#[tokio::test]
async fn only_an_admin_may_choose_the_image_repository_or_force_the_version_policy() {
    let env = spawn_env(|_| {}).await;
    let operator = operator_client(&env).await;
    let url = env.app.url("/v1/clusters/prod/upgrades");
    let plan_url = env.app.url("/v1/clusters/prod/upgrades/plan");
    for (url, body) in [
        (&url, json!({"version": TO, "image_repository": "evil.example.com/k8s"})),
        (&plan_url, json!({"version": TO, "image_repository": "evil.example.com/k8s"})),
        (&url, json!({"version": "v1.31.0", "force": true})),
        (&plan_url, json!({"version": TO, "force": true})),
    ] {
        let res = operator.post(url).json(&body).send().await.unwrap();
        let problem = assert_problem(res, 403, None).await;
        assert!(problem["detail"].as_str().unwrap_or_default().contains("admin"), "{problem:#}");
    }
    assert!(env.sim.ops().iter().all(|o| !o.is_write()), "a refused request changed the cluster");
    let list: Value = env.app.get("/v1/upgrades").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "a refused request stored no job");

    // Naming the default registry is no choice; an operator may.
    let plain = json!({"version": TO, "image_repository": "registry.k8s.io"});
    assert_eq!(operator.post(&plan_url).json(&plain).send().await.unwrap().status(), StatusCode::OK);
    // The admin still can.
    let res = env.plan_upgrade(json!({"version": TO, "image_repository": "mirror.local:5000/k8s"})).await;
    assert_eq!(res.status(), StatusCode::OK);
    let id = env.start_upgrade(json!({"version": "v1.31.0", "force": true, "components": ["kube-scheduler"]})).await;
    let job = env.wait_done(id, JOB_LIMIT, "a forced upgrade by an admin").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
}
