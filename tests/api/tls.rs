//! HTTPS with certificates made by the test (rcgen): serving, mutual TLS
//! with a subject mapped to a role, reload when the files change, a corrupt
//! file at reload (the old certificate keeps serving), a bad file at start,
//! and the CLI over HTTPS with `--ca-cert`.

use std::path::Path;
use std::time::Duration;

use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use reqwest::StatusCode;
use serde_json::json;
use tempfile::TempDir;

use crate::helpers::{TestApp, config, start, wait_for};
use crate::pki::{Ca, https_client};

/// A server on HTTPS with a certificate of `ca`; with `client_ca`, mutual
/// TLS with `CN=ci-runner` as an operator. Returns the app, its https URL
/// and the directory of its files.
async fn https_app(ca: &Ca, client_ca: Option<&Ca>) -> (TestApp, String, TempDir) {
    https_app_with(ca, |cfg, files| {
        if let Some(client_ca) = client_ca {
            cfg.tls_client_ca = Some(client_ca.write(files, "clients.pem"));
            let access = files.join("access.json");
            let mapping = json!({"mtls": [{"subject": "CN=ci-runner", "role": "operator"}]});
            std::fs::write(&access, mapping.to_string()).expect("access config");
            cfg.access_config = Some(access);
        }
    })
    .await
}

/// A server on HTTPS with a certificate of `ca`, its settings changed by
/// `tweak` (given the directory of its files) before it starts; the
/// helpers' requests go over HTTPS as admin.
pub(crate) async fn https_app_with(ca: &Ca, tweak: impl FnOnce(&mut ServeConfig, &Path)) -> (TestApp, String, TempDir) {
    let files = TempDir::new().expect("dir");
    let (cert, key) = ca.server().write(files.path(), "server");
    let tmp = TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.tls_cert = Some(cert);
    cfg.tls_key = Some(key);
    cfg.tls_reload_interval = Duration::from_millis(100);
    tweak(&mut cfg, files.path());
    let mut app = start(cfg, Some(tmp)).await;
    let url = app.addr.replacen("http://", "https://", 1);
    app.addr = url.clone();
    app.client = admin_client(ca, &app.admin_token);
    (app, url, files)
}

fn admin_client(ca: &Ca, token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("header value");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes()).expect("CA PEM")])
        .default_headers(headers)
        .build()
        .expect("HTTPS client")
}

#[tokio::test]
async fn https_serves_the_api_with_the_given_certificate() {
    let ca = Ca::new("test CA");
    let (app, url, _files) = https_app(&ca, None).await;
    let client = https_client(&ca, None);
    let res = client.get(format!("{url}/healthz")).send().await.expect("HTTPS request");
    assert_eq!(res.status(), StatusCode::OK);
    let res = client.get(format!("{url}/v1/pools")).bearer_auth(&app.admin_token).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::OK);
    // A client that trusts another CA refuses the server; plain HTTP gets no answer.
    let stranger = https_client(&Ca::new("other CA"), None);
    assert!(stranger.get(format!("{url}/healthz")).send().await.is_err(), "a server of another CA was trusted");
    let plain = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let plain_url = url.replacen("https://", "http://", 1);
    assert!(plain.get(format!("{plain_url}/healthz")).send().await.is_err(), "plain HTTP was answered");
}

#[tokio::test]
async fn a_client_certificate_of_the_client_ca_gets_its_subjects_role_and_others_are_refused() {
    let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
    let (app, url, _files) = https_app(&server_ca, Some(&client_ca)).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let runner = https_client(&server_ca, Some(&client_ca.client("ci-runner")));
    let res = runner.get(format!("{url}/v1/pools/web")).send().await.expect("mTLS request");
    assert_eq!(res.status(), StatusCode::OK, "the certificate's subject is an operator");
    let res =
        runner.put(format!("{url}/v1/pools/web/scale")).json(&json!({"replicas": 2})).send().await.expect("scale");
    assert_eq!(res.status(), StatusCode::OK, "operators scale");
    let res = runner.delete(format!("{url}/v1/pools/web")).send().await.expect("delete");
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "but do not delete pools");
    // A certificate of the CA whose subject has no role is no credential.
    let nobody = https_client(&server_ca, Some(&client_ca.client("someone-else")));
    let res = nobody.get(format!("{url}/v1/pools")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // A certificate of another CA fails the handshake.
    let forged = https_client(&server_ca, Some(&Ca::new("forger").client("ci-runner")));
    assert!(forged.get(format!("{url}/v1/pools")).send().await.is_err(), "a foreign client certificate was accepted");
    // Without a certificate, a token still works.
    let token_only = https_client(&server_ca, None);
    let res = token_only.get(format!("{url}/v1/pools")).bearer_auth(&app.admin_token).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::OK);
    let res = token_only.get(format!("{url}/v1/pools")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_restart_and_a_corrupt_one_keeps_the_old() {
    let (first, second) = (Ca::new("first CA"), Ca::new("second CA"));
    let (app, url, files) = https_app(&first, None).await;
    let tls = app.state.tls.clone().expect("TLS is on");
    let old_clients = https_client(&first, None);
    let new_clients = https_client(&second, None);
    assert!(old_clients.get(format!("{url}/healthz")).send().await.is_ok());
    // Rotate: a certificate of another CA replaces the files.
    second.server().write(files.path(), "server");
    wait_for(Duration::from_secs(20), "the rotated certificate to be served", async || {
        new_clients.get(format!("{url}/healthz")).send().await.is_ok()
    })
    .await;
    assert!(tls.reloads() >= 1);
    // A corrupt certificate: the reload fails and the current one stays.
    let failed_before = tls.failed_reloads();
    std::fs::write(files.path().join("server.crt"), "-----BEGIN CERTIFICATE-----\ngarbage\n").expect("corrupt");
    wait_for(Duration::from_secs(20), "the corrupt certificate's reload to fail", async || {
        tls.failed_reloads() > failed_before
    })
    .await;
    let res = new_clients.get(format!("{url}/healthz")).send().await.expect("still served");
    assert_eq!(res.status(), StatusCode::OK);
    // A new connection (open ones keep the certificate they began with).
    let fresh = https_client(&first, None);
    assert!(fresh.get(format!("{url}/healthz")).send().await.is_err(), "the old certificate came back");
}

#[tokio::test]
async fn a_bad_tls_file_at_start_is_an_error_that_names_it() {
    let ca = Ca::new("test CA");
    let files = TempDir::new().expect("dir");
    let (cert, key) = ca.server().write(files.path(), "server");
    std::fs::write(&key, "not a key").expect("corrupt key");
    let tmp = TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.tls_cert = Some(cert);
    cfg.tls_key = Some(key.clone());
    let err = Application::build(cfg).await.err().expect("a bad key stops the start");
    assert!(format!("{err:#}").contains(&key.display().to_string()), "{err:#}");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    let missing = files.path().join("missing.crt");
    cfg.tls_cert = Some(missing.clone());
    cfg.tls_key = Some(files.path().join("server.key"));
    let err = Application::build(cfg).await.err().expect("a missing certificate stops the start");
    assert!(format!("{err:#}").contains(&missing.display().to_string()), "{err:#}");
}

#[tokio::test]
async fn the_cli_speaks_https_with_a_custom_ca() {
    let ca = Ca::new("test CA");
    let (app, url, files) = https_app(&ca, None).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let ca_file = ca.write(files.path(), "ca.pem");
    let run = |args: Vec<String>| run_cli(&url, &app.admin_token, args);
    let ok =
        run(vec!["pools".into(), "list".into(), "-o".into(), "json".into(), "--ca-cert".into(), path(&ca_file)]).await;
    assert!(ok.0 == 0 && ok.1.contains("\"web\""), "exit {}: {}\n{}", ok.0, ok.1, ok.2);
    // Without the CA the server is not trusted, and the error says so.
    let refused = run(vec!["pools".into(), "list".into()]).await;
    assert_eq!(refused.0, 1, "{}\n{}", refused.1, refused.2);
    assert!(refused.2.contains("cannot reach drover"), "{}", refused.2);
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Runs the `drover` binary against `server`; returns exit code, stdout, stderr.
async fn run_cli(server: &str, token: &str, args: Vec<String>) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(&args).env("DROVER_SERVER", server).env("DROVER_TOKEN", token).env_remove("DROVER_CA_CERT");
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the CLI ran over a minute")
        .expect("running the drover binary");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}
