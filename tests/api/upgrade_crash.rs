//! Upgrade jobs driven by a real `drover serve` process that is killed
//! (SIGKILL: no graceful anything) in the middle of a step, against the
//! Kubernetes API simulator; and the data directory's lock, which keeps a
//! second process off the same store.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::helpers::{admin_token, client_with_token};
use crate::kube_sim::{KubeSim, Matcher, SimSettings};
use crate::process::Process;
use crate::upgrade_env::{
    CLUSTER, COMPONENTS, FROM, SIM_TOKEN, TO, assert_consistent, image_of, step_matcher, step_of, wait_pods_settled,
};

const JOB_LIMIT: Duration = Duration::from_secs(30);
const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// Short waits and polls, as `upgrade_env::fast_config` sets them in process.
const FAST: [&str; 12] = [
    "--runtime",
    "simulated",
    "--upgrade-api-tries",
    "10",
    "--upgrade-retry-backoff",
    "5ms",
    "--upgrade-wait-timeout",
    "4s",
    "--upgrade-poll-interval",
    "15ms",
    "--kube-request-timeout",
    "3s",
];

/// A seeded simulator, and a drover process with the simulator registered
/// as cluster `prod`.
struct Served {
    sim: KubeSim,
    dir: TempDir,
    proc: Process,
    client: reqwest::Client,
}

impl Served {
    async fn start() -> Served {
        let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
        sim.seed_control_plane(FROM);
        let dir = TempDir::new().expect("temporary directory");
        let proc = Process::spawn_with(dir.path(), &FAST);
        proc.wait_up().await;
        let client = client_with_token(&admin_token(dir.path()));
        let served = Served { sim, dir, proc, client };
        let body = json!({"name": CLUSTER, "server": served.sim.url(), "token": SIM_TOKEN});
        let res = served.client.post(served.url("/v1/clusters")).json(&body).send().await.expect("registering");
        assert_eq!(res.status(), StatusCode::CREATED, "{}", res.text().await.unwrap_or_default());
        served
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.proc.addr)
    }

    async fn start_upgrade(&self) -> i64 {
        let res = self
            .client
            .post(self.url(&format!("/v1/clusters/{CLUSTER}/upgrades")))
            .json(&json!({"version": TO}))
            .send()
            .await
            .expect("starting the upgrade");
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{}", res.text().await.unwrap_or_default());
        let job: Value = res.json().await.expect("job JSON");
        job["id"].as_i64().expect("job id")
    }

    async fn job(&self, id: i64) -> Value {
        let res = self.client.get(self.url(&format!("/v1/upgrades/{id}"))).send().await.expect("reading the job");
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.expect("job JSON")
    }

    async fn wait_done(&self, id: i64, hint: &str) -> Value {
        let deadline = tokio::time::Instant::now() + JOB_LIMIT;
        loop {
            let job = self.job(id).await;
            if !matches!(job["state"].as_str(), Some("pending" | "running")) {
                return job;
            }
            let log = self.proc.output();
            assert!(tokio::time::Instant::now() < deadline, "job {id} still running ({hint}): {job:#}\nlog:\n{log}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGKILL, then a new process on the same data directory.
    async fn crash_and_restart(&mut self) {
        self.proc.kill_now();
        self.proc = Process::spawn_with(self.dir.path(), &FAST);
        self.proc.wait_up().await;
    }
}

async fn killed_during(step: u8) {
    let mut s = Served::start().await;
    let hold = s.sim.hold(step_matcher(&s.sim, "kube-controller-manager", 1, step));
    let id = s.start_upgrade().await;
    hold.reached(HOLD_LIMIT, &format!("step {step}")).await;
    s.crash_and_restart().await;
    s.sim.release_all();
    let job = s.wait_done(id, &format!("the job did not resume after a SIGKILL in step {step}")).await;
    assert_eq!(job["state"], "succeeded", "SIGKILL in step {step}: {job:#}");
    assert_eq!(job["upgraded_components"], json!(COMPONENTS), "SIGKILL in step {step}");
    wait_pods_settled(&s.sim).await;
    assert_consistent(&s.sim, &job);
    for c in COMPONENTS {
        assert_eq!(image_of(&s.sim, c), format!("registry.k8s.io/{c}:{TO}"));
    }
    let record = step_of(&job, "kube-controller-manager", i64::from(step)).expect("step record");
    assert_eq!(record["attempts"], 2, "step {step} was cut short and must have run again: {record:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_any_step_still_ends_succeeded_on_the_new_version_without_a_temporary_daemonset() {
    let all = futures_util::stream::iter(0..=7).map(killed_during).buffer_unordered(4).collect::<Vec<()>>();
    tokio::time::timeout(Duration::from_secs(150), all)
        .await
        .expect("killed jobs never finished: a job does not resume, or a step cannot be redone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_real_daemonset_changed_but_before_the_step_was_saved_finishes_that_component() {
    let mut s = Served::start().await;
    // The API server applies step 3 to kube-apiserver, and its answer is
    // lost with the process: the stored step still says 3.
    let answer = s.sim.hold_answer(Matcher::new("replace", "daemonsets").name("self-hosted-kube-apiserver"));
    let id = s.start_upgrade().await;
    answer.reached(HOLD_LIMIT, "the answer to step 3's replace").await;
    assert_eq!(image_of(&s.sim, "kube-apiserver"), format!("registry.k8s.io/kube-apiserver:{TO}"));
    let before = s.job(id).await;
    assert_eq!(before["current"]["step"], 3, "{before:#}");
    let res = s.client.post(s.url(&format!("/v1/upgrades/{id}/cancel"))).send().await.expect("cancelling");
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    s.crash_and_restart().await;
    s.sim.release_all();

    let job = s.wait_done(id, "a cancel after a crash in the step-3 window").await;
    assert_eq!(job["state"], "cancelled", "{job:#}");
    // The real DaemonSet was already rolling: the component was finished,
    // never left without its copy, and the record says so.
    assert_eq!(job["upgraded_components"], json!(["kube-apiserver"]), "{job:#}");
    let states: Vec<&str> = job["progress"].as_array().unwrap().iter().filter_map(|p| p["state"].as_str()).collect();
    assert_eq!(states, ["upgraded", "cancelled", "skipped"], "{job:#}");
    assert!(job["error"].as_str().unwrap_or_default().contains("upgraded: kube-apiserver"), "{job:#}");
    wait_pods_settled(&s.sim).await;
    assert_consistent(&s.sim, &job);
}

#[tokio::test]
async fn a_second_serve_on_the_same_data_directory_exits_non_zero_naming_the_lock_and_the_first() {
    let dir = TempDir::new().expect("temporary directory");
    // The lock is SQLite's (replicas on PostgreSQL share a store on
    // purpose), so this test names SQLite whichever store the suite runs on.
    let sqlite = format!("sqlite://{}", dir.path().join("drover.db").display());
    let args = ["--runtime", "simulated", "--database-url", &sqlite];
    let mut first = Process::spawn_with(dir.path(), &args);
    first.wait_up().await;
    let mut second = Process::spawn_with(dir.path(), &args);
    let status = second.wait_exit(Duration::from_secs(10)).await.expect("the second drover kept running");
    assert!(!status.success(), "the second drover must fail: {status}");
    let said = second.output();
    assert!(said.contains("drover.lock"), "the message names the lock file: {said}");
    assert!(said.contains(&format!("process {}", first.pid())), "the message names the first process: {said}");
    assert!(first.is_running(), "the first drover keeps serving");
    let health = reqwest::get(format!("{}/healthz", first.addr)).await.expect("healthz");
    assert_eq!(health.status(), StatusCode::OK);

    // The same in process: building a second application is refused.
    let cfg = crate::helpers::config(dir.path(), drover::config::RuntimeKind::Simulated);
    let refused = drover::app::Application::build(cfg).await.err().map(|e| format!("{e:#}"));
    assert!(refused.as_deref().is_some_and(|e| e.contains("drover.lock")), "{refused:?}");
}
