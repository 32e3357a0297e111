//! The clusters API: registration, write-only credentials, status probes.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{assert_problem, spawn_app};
use crate::kube_sim::{KubeSim, SimSettings};
use crate::upgrade_env::{CLUSTER, FROM, SIM_TOKEN, spawn_env};

/// A self-signed CA made for these tests (its key was thrown away): it must
/// parse, since registration builds a client from the credentials.
const CA: &str = "-----BEGIN CERTIFICATE-----\n\
MIIBijCCAS+gAwIBAgIUX6/4Psd/PPiMMbSIRUpCfEpb7ekwCgYIKoZIzj0EAwIw\n\
GTEXMBUGA1UEAwwOZHJvdmVyLXRlc3QtY2EwIBcNMjYxMjAzMDkzOTEwWhgPMjEy\n\
NjExMDkwOTM5MTBaMBkxFzAVBgNVBAMMDmRyb3Zlci10ZXN0LWNhMFkwEwYHKoZI\n\
zj0CAQYIKoZIzj0DAQcDQgAEapXSXjs+CI+wHvNe+YRav/Nm1FV9CVwvZymy2e6a\n\
gQkbxEW7IPGN6S9g+bBs1ECw/jfK3EwQs24U+S2KwOJHvKNTMFEwHQYDVR0OBBYE\n\
FFecz5C7RuKn3Ju6echm9cyAfV+OMB8GA1UdIwQYMBaAFFecz5C7RuKn3Ju6echm\n\
9cyAfV+OMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhANk7g3mn\n\
E1btimnEbNIAYyS2QftZn/fLBdfPy6OlvRJZAiEA8I327r108zxa3ZWzOCEHaUmd\n\
4FzalreOGOyBzGDHJtk=\n\
-----END CERTIFICATE-----\n";

fn kubeconfig(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n\
         users:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: admin\n\
         current-context: sim\n"
    )
}

#[tokio::test]
async fn credentials_never_appear_in_any_response() {
    let env = spawn_env(|_| {}).await;
    let kc_token = "kubeconfig-secret-token-5e1d";
    let res = env
        .app
        .request(
            Method::POST,
            "/v1/clusters",
            Some(json!({"name": "viakc", "kubeconfig": kubeconfig(&env.sim.url(), kc_token)})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let created = res.text().await.unwrap();
    let id = env.start_upgrade(json!({"components": ["kube-scheduler"]})).await;
    env.wait_done(id, Duration::from_secs(30), "a one-component upgrade").await;

    let mut bodies = vec![created];
    for path in [
        "/v1/clusters",
        "/v1/clusters/prod",
        "/v1/clusters/viakc",
        "/v1/clusters/prod/status",
        "/v1/clusters/viakc/status",
        "/v1/upgrades",
        &format!("/v1/upgrades/{id}"),
        &format!("/v1/upgrades/{id}/events"),
        "/openapi.json",
    ] {
        let res = env.app.get(path).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        bodies.push(res.text().await.unwrap());
    }
    let dup = env
        .app
        .request(
            Method::POST,
            "/v1/clusters",
            Some(json!({"name": "prod", "server": env.sim.url(), "token": SIM_TOKEN})),
        )
        .await;
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    bodies.push(dup.text().await.unwrap());
    for body in &bodies {
        assert!(!body.contains(SIM_TOKEN) && !body.contains(kc_token) && !body.contains("BEGIN CERTIFICATE"), "{body}");
    }
    let view: Value = serde_json::from_str(&bodies[2]).unwrap();
    assert_eq!(
        view,
        json!({"name": "prod", "namespace": "default", "server": env.sim.url(), "auth": "token",
        "created_at": view["created_at"], "updated_at": view["updated_at"]})
    );
}

#[tokio::test]
async fn status_reports_the_components_images_and_versions() {
    let env = spawn_env(|_| {}).await;
    let status: Value = env.app.get(&format!("/v1/clusters/{CLUSTER}/status")).await.json().await.unwrap();
    assert_eq!(status["reachable"], true);
    assert_eq!(status["healthy"], true);
    assert_eq!(status["version"], FROM);
    let comps = status["components"].as_array().unwrap();
    assert_eq!(comps.len(), 3);
    for c in comps {
        assert_eq!(c["version"], FROM, "{c}");
        assert_eq!(c["pods"].as_array().unwrap().len(), 1);
        assert_eq!(c["pods"][0]["phase"], "Running");
    }
    assert_eq!(comps[1]["image"], format!("registry.k8s.io/kube-controller-manager:{FROM}"));
}

#[tokio::test]
async fn an_unreachable_or_unhealthy_cluster_is_reported_not_failed() {
    let env = spawn_env(|_| {}).await;
    env.sim.fail_healthz(1);
    let status: Value = env.app.get(&format!("/v1/clusters/{CLUSTER}/status")).await.json().await.unwrap();
    assert_eq!(status["healthy"], false);
    assert!(status["detail"].as_str().unwrap_or_default().contains("healthz"), "{status:#}");

    let gone = KubeSim::start(SimSettings::default()).await;
    let url = gone.url();
    drop(gone);
    let res =
        env.app.request(Method::POST, "/v1/clusters", Some(json!({"name": "gone", "server": url, "token": "t"}))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let status: Value = env.app.get("/v1/clusters/gone/status").await.json().await.unwrap();
    assert_eq!(status["reachable"], false, "{status:#}");
    let res = env.app.request(Method::POST, "/v1/clusters/gone/upgrades", Some(json!({"version": "v1.30.0"}))).await;
    assert_problem(res, 503, None).await;
}

#[tokio::test]
async fn bad_cluster_bodies_name_the_field() {
    let app = spawn_app().await;
    let cases = [
        (json!({"name": "Bad_Name", "server": "http://127.0.0.1:1", "token": "t"}), "name"),
        (json!({"name": "a", "server": "http://127.0.0.1:1"}), "token"),
        (json!({"name": "a"}), "kubeconfig"),
        (json!({"name": "a", "kubeconfig": "x", "server": "http://127.0.0.1:1"}), "kubeconfig"),
        (json!({"name": "a", "kubeconfig": "{{{"}), "kubeconfig"),
        (
            json!({"name": "a", "server": "http://127.0.0.1:1", "token": "t", "ca_certificate": "nope"}),
            "ca_certificate",
        ),
        (json!({"name": "a", "server": "ftp://127.0.0.1:1", "token": "t"}), "server"),
        (json!({"name": "a", "server": "http://127.0.0.1:1", "token": "t", "colour": 1}), "colour"),
    ];
    for (body, field) in cases {
        let res = app.request(Method::POST, "/v1/clusters", Some(body.clone())).await;
        let problem = assert_problem(res, 422, Some(field)).await;
        assert!(!problem.to_string().contains("\"t\""), "{problem}");
    }
    let list: Value = app.get("/v1/clusters").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "nothing was half-written");
}

#[tokio::test]
async fn clusters_list_by_page_and_delete() {
    let app = spawn_app().await;
    for name in ["c", "a", "b"] {
        let body = json!({"name": name, "server": "https://10.0.0.1:6443", "token": "t", "ca_certificate": CA});
        let res = app.request(Method::POST, "/v1/clusters", Some(body)).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{}", res.text().await.unwrap_or_default());
    }
    let page: Value = app.get("/v1/clusters?limit=2").await.json().await.unwrap();
    let names: Vec<&str> = page["items"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let next: Value = app
        .get(&format!("/v1/clusters?limit=2&cursor={}", page["next_cursor"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(next["items"][0]["name"], "c");
    assert!(next["next_cursor"].is_null());
    assert_eq!(app.request(Method::DELETE, "/v1/clusters/b", None).await.status(), StatusCode::NO_CONTENT);
    assert_problem(app.request(Method::DELETE, "/v1/clusters/b", None).await, 404, None).await;
    assert_problem(app.get("/v1/clusters/b").await, 404, None).await;
}

#[tokio::test]
async fn credentials_that_cannot_travel_or_be_used_are_refused_at_registration_naming_the_field() {
    let app = spawn_app().await;
    let kubeconfig = |user: &str, cluster_extra: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Config",
  "clusters": [{{"name": "c", "cluster": {{"server": "https://10.0.0.1:6443"{cluster_extra}}}}}],
  "users": [{{"name": "u", "user": {user}}}],
  "contexts": [{{"name": "x", "context": {{"cluster": "c", "user": "u"}}}}], "current-context": "x"}}"#
        )
    };
    let garbage_pem = "-----BEGIN CERTIFICATE-----\n%%% not base64 %%%\n-----END CERTIFICATE-----\n";
    let not_a_cert = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
    let cases = [
        (json!({"name": "a", "server": "https://10.0.0.1:6443", "token": "abc\r\nX-Injected: 1"}), "token"),
        (json!({"name": "a", "server": "https://10.0.0.1:6443", "token": "abc\u{0}def"}), "token"),
        (json!({"name": "a", "server": "https://10.0.0.1:6443", "token": "abc\u{7f}"}), "token"),
        (json!({"name": "a", "kubeconfig": kubeconfig(r#"{"token": "abc\r\ndef"}"#, "")}), "kubeconfig"),
        (
            json!({"name": "a", "kubeconfig": kubeconfig(r#"{"token": "t"}"#, r#", "proxy-url": "http://p:3128""#)}),
            "kubeconfig",
        ),
        (
            json!({"name": "a", "server": "https://10.0.0.1:6443", "token": "t", "ca_certificate": garbage_pem}),
            "ca_certificate",
        ),
        (
            json!({"name": "a", "server": "https://10.0.0.1:6443", "token": "t", "ca_certificate": not_a_cert}),
            "ca_certificate",
        ),
    ];
    for (body, field) in cases {
        let res = app.request(Method::POST, "/v1/clusters", Some(body.clone())).await;
        let problem = assert_problem(res, 422, Some(field)).await;
        assert!(!problem.to_string().contains("abc"), "the value is never quoted: {problem}");
    }
    let list: Value = app.get("/v1/clusters").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "nothing was registered");
}

/// Writes cluster credentials straight into drover's database, as an older
/// version, a restored backup or a hand edit could have left them.
async fn store_credentials(data_dir: &std::path::Path, name: &str, server: &str, document: Value) {
    use crate::helpers::Param;
    let mut db = crate::helpers::test_raw_store(data_dir).await;
    db.execute(
        "insert into clusters (name, server, auth_kind, credentials, created_at, updated_at)
         values ($1, $2, 'token', $3, $4, $4)
         on conflict (namespace, name) do update set credentials = excluded.credentials",
        &[
            Param::Text(name.into()),
            Param::Text(server.into()),
            Param::Text(document.to_string()),
            Param::Time(chrono::Utc::now()),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stored_credentials_fail_every_route_job_and_pool_with_a_reason_and_never_panic() {
    use crate::process::Process;
    let sim = KubeSim::start(SimSettings { token: Some(SIM_TOKEN.into()), ..SimSettings::default() }).await;
    sim.seed_control_plane(FROM);
    let dir = tempfile::TempDir::new().unwrap();
    let args = [
        "--runtime",
        "simulated",
        "--upgrade-retry-backoff",
        "5ms",
        "--kube-request-timeout",
        "2s",
        "--drain-timeout",
        "2s",
        "--drain-poll-interval",
        "50ms",
        "--max-backoff",
        "1s",
    ];
    let mut first = Process::spawn_with(dir.path(), &args);
    first.wait_up().await;
    let client = crate::helpers::client_with_token(&crate::helpers::admin_token(dir.path()));
    let at = |p: &Process, path: &str| format!("{}{path}", p.addr);
    let body = json!({"name": CLUSTER, "server": sim.url(), "token": SIM_TOKEN});
    assert_eq!(client.post(at(&first, "/v1/clusters")).json(&body).send().await.unwrap().status(), StatusCode::CREATED);
    // A job that has started (held in step 0) when its credentials go bad.
    let hold = sim.hold(crate::upgrade_env::step_matcher(&sim, "kube-apiserver", 0, 0));
    let res = client.post(at(&first, "/v1/clusters/prod/upgrades")).json(&json!({"version": "v1.30.0"})).send().await;
    let job: Value = res.unwrap().json().await.unwrap();
    hold.reached(Duration::from_secs(10), "step 0").await;

    let crlf = json!({"kind": "token", "server": sim.url(), "token": "abc\r\nX-Injected: 1", "ca_certificate": null});
    store_credentials(dir.path(), CLUSTER, &sim.url(), crlf.clone()).await;
    store_credentials(dir.path(), "broken", &sim.url(), crlf).await;
    store_credentials(dir.path(), "garbled", &sim.url(), json!({"kind": "nonsense"})).await;
    first.kill_now();
    let mut server = Process::spawn_with(dir.path(), &args);
    server.wait_up().await;
    sim.release_all();

    // The job fails with the reason, and says where it stopped.
    let url = at(&server, &format!("/v1/upgrades/{}", job["id"]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let job = loop {
        let job: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
        if !matches!(job["state"].as_str(), Some("pending" | "running")) {
            break job;
        }
        assert!(tokio::time::Instant::now() < deadline, "the job never ended: {job:#}\n{}", server.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(job["state"], "failed", "{job:#}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains("credentials") && error.contains("control character"), "{error}");
    assert!(error.contains("nothing was changed"), "{error}");
    assert!(!error.contains("abc"), "the token is never quoted: {error}");

    // Every route that uses a cluster answers, with a problem where it cannot.
    for name in [CLUSTER, "broken", "garbled"] {
        assert_eq!(client.get(at(&server, &format!("/v1/clusters/{name}"))).send().await.unwrap().status(), 200);
        let res = client.get(at(&server, &format!("/v1/clusters/{name}/status"))).send().await.unwrap();
        let problem = assert_problem(res, 503, None).await;
        assert!(problem["detail"].as_str().unwrap_or_default().contains("credentials"), "{problem:#}");
        for route in ["upgrades", "upgrades/plan"] {
            let body = json!({"version": "v1.30.0"});
            let res = client.post(at(&server, &format!("/v1/clusters/{name}/{route}"))).json(&body).send().await;
            assert_problem(res.unwrap(), 503, None).await;
        }
    }
    assert_eq!(client.get(at(&server, "/v1/clusters")).send().await.unwrap().status(), StatusCode::OK);

    // A pool of that cluster: a scale-down needs the cluster (to drain the
    // node), and the pass fails with the reason instead of panicking.
    let pool = json!({"name": "nodes", "replicas": 2, "version": "v1.29.2", "cluster": "broken"});
    assert_eq!(client.post(at(&server, "/v1/pools")).json(&pool).send().await.unwrap().status(), 201);
    server
        .wait_pool(&client, "nodes", Duration::from_secs(20), "two machines", |p| p["status"]["ready_replicas"] == 2)
        .await;
    let scale = client.put(at(&server, "/v1/pools/nodes/scale")).json(&json!({"replicas": 1})).send().await.unwrap();
    assert_eq!(scale.status(), StatusCode::OK);
    let reconciled = |p: &Value| {
        p["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled")).cloned()
    };
    let p = server
        .wait_pool(&client, "nodes", Duration::from_secs(20), "Reconciled=False", |p| {
            reconciled(p).is_some_and(|c| c["status"] == "False")
        })
        .await;
    let condition = reconciled(&p).unwrap_or_default();
    assert_eq!(condition["reason"], "ClusterCredentialsInvalid", "every pass says so: {p:#}");
    assert!(condition["message"].as_str().unwrap_or_default().contains("credentials"), "{p:#}");
    let p = server
        .wait_pool(&client, "nodes", Duration::from_secs(20), "the drain failure told", |p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "MachinesHealthy" && c["reason"] == "DrainFailed"))
        })
        .await;
    let (replicas, terminating) = (&p["status"]["replicas"], &p["status"]["terminating_replicas"]);
    assert_eq!(
        (replicas, terminating),
        (&json!(1), &json!(1)),
        "the machine is kept, terminating, while its node cannot be drained: {p:#}"
    );

    let deleted = client.delete(at(&server, "/v1/clusters/garbled")).send().await.unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert!(server.is_running(), "drover exited: {}", server.output());
    let log = format!("{}{}", first.output(), server.output());
    assert!(!log.contains("panicked"), "something panicked:\n{log}");
}
