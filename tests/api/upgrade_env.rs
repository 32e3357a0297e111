//! A drover server wired to a Kubernetes API simulator with a registered
//! cluster, with settings short enough for tests, and the calls the upgrade
//! tests share.

use std::time::Duration;

use drover::config::{RuntimeKind, ServeConfig};
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::helpers::{self, TestApp};
use crate::kube_sim::{KubeSim, Matcher, SimSettings};

pub const CLUSTER: &str = "prod";
pub const FROM: &str = "v1.29.2";
pub const TO: &str = "v1.30.0";
pub const SIM_TOKEN: &str = "sim-token-d0-not-leak-7f3a9c";
pub const COMPONENTS: [&str; 3] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler"];

pub struct Env {
    pub sim: KubeSim,
    pub app: TestApp,
    cfg: ServeConfig,
}

/// Fast settings: small backoff, short waits, quick polls.
pub fn fast_config(dir: &std::path::Path) -> ServeConfig {
    let mut cfg = helpers::config(dir, RuntimeKind::Simulated);
    cfg.upgrade_api_tries = 10;
    cfg.upgrade_retry_backoff = Duration::from_millis(5);
    cfg.upgrade_wait_timeout = Duration::from_secs(4);
    cfg.upgrade_poll_interval = Duration::from_millis(15);
    cfg.kube_request_timeout = Duration::from_secs(3);
    cfg
}

/// A seeded simulator at `FROM`, a drover server, and cluster `prod`
/// registered with a bearer token.
pub async fn spawn_env(tweak: impl FnOnce(&mut ServeConfig)) -> Env {
    let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
    sim.seed_control_plane(FROM);
    let tmp = TempDir::new().expect("temporary directory");
    let mut cfg = fast_config(tmp.path());
    tweak(&mut cfg);
    let app = helpers::start(cfg.clone(), Some(tmp)).await;
    let res = app
        .request(Method::POST, "/v1/clusters", Some(json!({"name": CLUSTER, "server": sim.url(), "token": SIM_TOKEN})))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED, "registering the cluster: {}", res.text().await.unwrap_or_default());
    Env { sim, app, cfg }
}

impl Env {
    /// Stops drover and starts it again on the same data directory.
    pub async fn restart(self) -> Env {
        let Env { sim, app, cfg } = self;
        let app = app.restart_with(cfg.clone()).await;
        Env { sim, app, cfg }
    }

    pub async fn post_upgrade(&self, body: Value) -> Response {
        self.app.request(Method::POST, &format!("/v1/clusters/{CLUSTER}/upgrades"), Some(body)).await
    }

    /// Asks for the plan of the upgrade `body` describes.
    pub async fn plan_upgrade(&self, body: Value) -> Response {
        self.app.request(Method::POST, &format!("/v1/clusters/{CLUSTER}/upgrades/plan"), Some(body)).await
    }

    /// Starts an upgrade to `TO` and answers the job's id.
    pub async fn start_upgrade(&self, extra: Value) -> i64 {
        let mut body = json!({"version": TO});
        if let (Some(b), Value::Object(more)) = (body.as_object_mut(), extra) {
            b.extend(more);
        }
        let res = self.post_upgrade(body).await;
        assert_eq!(
            res.status(),
            StatusCode::ACCEPTED,
            "starting the upgrade: {}",
            res.text().await.unwrap_or_default()
        );
        let location = res.headers()["location"].to_str().expect("location").to_owned();
        let job: Value = res.json().await.expect("job JSON");
        assert_eq!(location, format!("/v1/upgrades/{}", job["id"]));
        job["id"].as_i64().expect("job id")
    }

    pub async fn job(&self, id: i64) -> Value {
        let res = self.app.get(&format!("/v1/upgrades/{id}")).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.expect("job JSON")
    }

    /// Polls until the job has ended; `hint` names the likely bug on timeout.
    pub async fn wait_done(&self, id: i64, limit: Duration, hint: &str) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let job = self.job(id).await;
            if !matches!(job["state"].as_str(), Some("pending" | "running")) {
                return job;
            }
            assert!(tokio::time::Instant::now() < deadline, "job {id} still running after {limit:?} ({hint}): {job:#}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn cancel(&self, id: i64) -> Response {
        self.app.request(Method::POST, &format!("/v1/upgrades/{id}/cancel"), None).await
    }

    /// The image a component's real DaemonSet runs.
    pub fn image_of(&self, component: &str) -> String {
        image_of(&self.sim, component)
    }

    /// The name of the component's pod right now (exactly one expected).
    pub fn pod_of(&self, component: &str) -> String {
        pod_of(&self.sim, component)
    }

    /// See [`assert_consistent`].
    pub fn assert_consistent(&self, job: &Value) {
        assert_consistent(&self.sim, job);
    }

    pub async fn wait_pods_settled(&self) {
        wait_pods_settled(&self.sim).await;
    }
}

/// The image a component's real DaemonSet runs.
pub fn image_of(sim: &KubeSim, component: &str) -> String {
    sim.daemonset_image(&format!("self-hosted-{component}")).unwrap_or_default()
}

/// The name of the component's pod right now (exactly one expected).
pub fn pod_of(sim: &KubeSim, component: &str) -> String {
    let pods = sim.pods(&format!("k8s-app=self-hosted-{component}"));
    assert_eq!(pods.len(), 1, "{component} should run one pod: {pods:#?}");
    pods[0]["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

/// The components a job view says it upgraded.
pub fn upgraded(job: &Value) -> Vec<String> {
    job["upgraded_components"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// No temporary DaemonSet is left, no copy was ever deleted while its
/// real DaemonSet rolled, and each component's DaemonSet runs the image
/// the job says (new when upgraded, old otherwise).
pub fn assert_consistent(sim: &KubeSim, job: &Value) {
    let left: Vec<String> = sim.daemonset_names().into_iter().filter(|n| n.starts_with("temp-upgrade-")).collect();
    assert!(left.is_empty(), "temporary DaemonSets left behind: {left:?}; job: {job:#}");
    assert_eq!(sim.violations(), Vec::<String>::new(), "a copy went while its component rolled; job: {job:#}");
    let upgraded = upgraded(job);
    for c in COMPONENTS {
        let version = if upgraded.iter().any(|u| u == c) { TO } else { FROM };
        let want = format!("registry.k8s.io/{c}:{version}");
        assert_eq!(image_of(sim, c), want, "DaemonSet of {c} disagrees with the job: {job:#}");
    }
}

/// Waits until each component has one Running pod of its DaemonSet's image.
pub async fn wait_pods_settled(sim: &KubeSim) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let settled = COMPONENTS.iter().all(|c| {
            let pods = sim.pods(&format!("k8s-app=self-hosted-{c}"));
            let image = image_of(sim, c);
            pods.len() == 1
                && pods[0]["status"]["phase"] == "Running"
                && pods[0]["spec"]["containers"][0]["image"] == image.as_str()
        });
        if settled {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "component pods never settled on their DaemonSets' images");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first request of `step` for `component` (at `position` in the
/// job): where a test holds the step.
pub fn step_matcher(sim: &KubeSim, component: &str, position: u32, step: u8) -> Matcher {
    let (ds, temp) = (format!("self-hosted-{component}"), format!("temp-upgrade-self-hosted-{component}"));
    match step {
        0 => Matcher::new("list", "pods").selector(format!("k8s-app={ds}")),
        1 => Matcher::new("apply", "daemonsets").name(temp),
        2 => Matcher::new("list", "pods").selector(format!("temp-upgrade-component={component}")),
        3 => Matcher::new("replace", "daemonsets").name(ds),
        4 => Matcher::new("get", "pods").name(pod_of(sim, component)),
        5 => Matcher::new("list", "pods").selector(format!("k8s-app={ds}")).nth(2),
        6 => Matcher::new("delete", "daemonsets").name(temp),
        _ => Matcher::new("get", "healthz").nth(position + 1),
    }
}

/// The step record of a component, from a job view.
pub fn step_of<'a>(job: &'a Value, component: &str, step: i64) -> Option<&'a Value> {
    job["progress"].as_array()?.iter().find(|p| p["component"] == component)?["steps"]
        .as_array()?
        .iter()
        .find(|s| s["step"] == step)
}
