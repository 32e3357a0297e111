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
        json!({"name": "prod", "server": env.sim.url(), "auth": "token",
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
