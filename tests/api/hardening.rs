//! What the server keeps and what it accepts (SECURITY.md's threat model):
//! no secret in the idempotency store, abandoned keys freed, no credentials
//! in server URLs, bounded growth of the store without a token, one parsing
//! policy, host safety. (Slow clients, event streams and log injection are
//! in `connections`; metric labels in `metrics`.)

use std::time::Duration;

use drover::config::{RuntimeKind, ServeConfig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Param, TestApp, assert_problem, client_with_token, config, spawn_app, start, wait_for};

/// A server on the simulated runtime with settings changed by `change`.
pub async fn spawn_with(change: impl FnOnce(&mut ServeConfig)) -> TestApp {
    let tmp = tempfile::TempDir::new().expect("temporary directory");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    change(&mut cfg);
    start(cfg, Some(tmp)).await
}

pub async fn make_token(app: &TestApp, name: &str, role: &str) -> String {
    let res = app.request(Method::POST, "/v1/tokens", Some(json!({"name": name, "role": role}))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let body: Value = res.json().await.expect("token JSON");
    body["token"].as_str().expect("a token").to_owned()
}

async fn count(app: &TestApp, sql: &'static str) -> i64 {
    app.raw_store().await.integer(sql).await
}

#[tokio::test]
async fn a_keyed_token_creation_is_refused_and_keeps_no_secret() {
    let app = spawn_app().await;
    let body = json!({"name": "ci", "role": "viewer"});
    let keyed = app.client.post(app.url("/v1/tokens")).header("idempotency-key", "t-1").json(&body).send();
    let problem = assert_problem(keyed.await.unwrap(), 422, Some("Idempotency-Key")).await;
    assert_eq!(problem["errors"][0]["rule"], "idempotency_secret", "{problem:#}");
    assert_eq!(count(&app, "select count(*) from idempotency").await, 0, "nothing is kept for a replay");
    assert_eq!(count(&app, "select count(*) from tokens where name = 'ci'").await, 0, "nothing was created");

    let plain = app.request(Method::POST, "/v1/tokens", Some(body)).await;
    assert_eq!(plain.status(), StatusCode::CREATED, "the same request without a key works");
    let secret: Value = plain.json().await.unwrap();
    let secret = secret["token"].as_str().unwrap();
    crate::helpers::assert_only_hashes_stored(&app, &[secret]).await;
}

#[tokio::test]
async fn a_claim_left_by_a_stopped_process_does_not_block_its_key() {
    let app = spawn_app().await;
    let body = json!({"name": "after-crash", "replicas": 0, "version": "v1.29.2", "paused": true});
    let hash: String = Sha256::digest(serde_json::to_vec(&body).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    // What a process that died mid-request leaves: a claim without an answer.
    app.raw_store()
        .await
        .execute(
            "insert into idempotency (token_name, key, method, path, body_hash, created_at)
             values ('bootstrap-admin', 'k-crash', 'POST', '/v1/pools', $1, $2)",
            &[Param::Text(hash), Param::Time(chrono::Utc::now() - chrono::TimeDelta::seconds(60))],
        )
        .await;
    let res = app.client.post(app.url("/v1/pools")).header("idempotency-key", "k-crash").json(&body).send().await;
    let res = res.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED, "a claim older than the request timeout is taken over");
}

#[tokio::test]
async fn a_keyed_request_that_times_out_frees_its_key_at_once() {
    // A cluster whose API server accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            sockets.push(s);
        }
    });
    let app = spawn_with(|c| {
        c.request_timeout = Duration::from_secs(1);
        c.kube_request_timeout = Duration::from_secs(20);
    })
    .await;
    let register = json!({"name": "silent", "server": server, "token": "t"});
    assert_eq!(app.request(Method::POST, "/v1/clusters", Some(register)).await.status(), StatusCode::CREATED);
    let start_upgrade = || {
        app.client
            .post(app.url("/v1/clusters/silent/upgrades"))
            .header("idempotency-key", "up-1")
            .json(&json!({"version": "v1.30.0"}))
            .send()
    };
    assert_problem(start_upgrade().await.unwrap(), 503, None).await;
    // Its claim is released by a write of its own, which may land just
    // after the answer. Waited for well within 5 s: only past the request
    // timeout plus 5 s is an unanswered claim taken over by age, which
    // would free the key whether or not the release works.
    wait_for(Duration::from_secs(3), "the release of the timed-out request's claim", async || {
        count(&app, "select count(*) from idempotency where status is null").await == 0
    })
    .await;
    let retry = start_upgrade().await.unwrap();
    assert_ne!(retry.status(), StatusCode::CONFLICT, "the abandoned claim still blocks the key");
    // The retry timed out too; its claim is released by a write of its own,
    // which may land just after the answer.
    wait_for(Duration::from_secs(5), "the release of the timed-out request's claim", async || {
        count(&app, "select count(*) from idempotency where status is null").await == 0
    })
    .await;
    held.abort();
}

#[tokio::test]
async fn server_urls_with_credentials_are_refused_naming_the_field() {
    let app = spawn_app().await;
    let kubeconfig = |server: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        )
    };
    let cases = [
        (json!({"name": "a", "server": "http://admin:hunter2@127.0.0.1:6443", "token": "t"}), "server"),
        (json!({"name": "b", "server": "https://127.0.0.1:6443/?access_token=hunter2", "token": "t"}), "server"),
        (json!({"name": "c", "kubeconfig": kubeconfig("http://admin:hunter2@127.0.0.1:6443")}), "kubeconfig"),
    ];
    for (body, field) in cases {
        let res = app.request(Method::POST, "/v1/clusters", Some(body.clone())).await;
        let problem = assert_problem(res, 422, Some(field)).await;
        assert_eq!(problem["errors"][0]["rule"], "server_url_credentials", "{body}: {problem:#}");
        assert!(!problem.to_string().contains("hunter2"), "the answer repeats the secret: {problem}");
    }
    let list = app.get("/v1/clusters").await.text().await.unwrap();
    assert!(!list.contains("hunter2"), "{list}");
}

#[tokio::test]
async fn token_less_requests_add_one_audit_record_per_burst_with_a_short_path() {
    let app = spawn_with(|c| c.audit_burst_window = Duration::from_secs(1)).await;
    let anon = reqwest::Client::new();
    let long = "p".repeat(60_000);
    let size = |app: &TestApp| {
        ["", "-wal"]
            .iter()
            .map(|s| std::fs::metadata(app.data_dir.join(format!("drover.db{s}"))).map_or(0, |m| m.len()))
            .sum::<u64>()
    };
    let before = size(&app);
    let started = std::time::Instant::now();
    for _ in 0..100 {
        let res = anon.delete(app.url(&format!("/v1/pools/{long}"))).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let windows = started.elapsed().as_secs() as i64 + 1;
    // The burst's count is written when it ends (checked every second).
    wait_for(Duration::from_secs(10), "the last burst's record (its window is 1 s)", async || {
        count(&app, "select coalesce(sum(repeats), 0) from audit where outcome = 'unauthenticated'").await >= 100
    })
    .await;
    let rows = count(&app, "select count(*) from audit where outcome = 'unauthenticated'").await;
    assert!((1..=windows + 1).contains(&rows), "{rows} records for 100 refusals in {windows} s");
    assert_eq!(count(&app, "select sum(repeats) from audit where outcome = 'unauthenticated'").await, 100);
    let longest = count(&app, "select max(length(path)) from audit").await;
    assert!(longest <= 300, "an audited path of {longest} bytes");
    let grown = size(&app).saturating_sub(before);
    assert!(grown < 512 * 1024, "100 refusals grew the store by {grown} bytes");
}

#[tokio::test]
async fn the_pruner_removes_what_is_past_its_retention() {
    let app = spawn_app().await;
    // The app's own pruner makes a pass at start, idempotency keys last:
    // the rows below must not be inserted while that pass still runs (it
    // would take the old key before the pass under test could).
    wait_for(Duration::from_secs(30), "the app's own first pruning pass to end", async || {
        app.get("/metrics")
            .await
            .text()
            .await
            .unwrap_or_default()
            .contains(r#"drover_pruned_rows_total{table="idempotency"}"#)
    })
    .await;
    app.create_pool_ok("hist", 0, json!({"image": "sim/app:1", "paused": true})).await;
    // A pool of the same name in another namespace, at its first revision:
    // the other's six revisions say nothing about it.
    let made = app.request(Method::POST, "/v1/namespaces", Some(json!({"name": "team-b"}))).await;
    assert_eq!(made.status(), StatusCode::CREATED);
    let other = json!({"name": "hist", "replicas": 0, "version": "v1.29.2", "image": "sim/app:1", "paused": true});
    let made = app.request(Method::POST, "/v1/pools?namespace=team-b", Some(other)).await;
    assert_eq!(made.status(), StatusCode::CREATED);
    for i in 2..=6 {
        assert_eq!(
            app.patch_pool("hist", json!({"image": format!("sim/app:{i}")}), None).await.status(),
            StatusCode::OK
        );
    }
    let mut db = app.raw_store().await;
    let now = chrono::Utc::now();
    let days = |d: i64| now - chrono::TimeDelta::days(d);
    for (sql, at) in [
        (
            "insert into audit (time, method, path, status, outcome) values ($1, 'POST', '/old', 401, 'unauthenticated')",
            days(100),
        ),
        (
            "insert into events (subject_kind, subject, time, type, reason, message) values ('pool', 'hist', $1, 'Normal', 'Old', 'old')",
            days(40),
        ),
        (
            "insert into idempotency (token_name, key, method, path, body_hash, created_at) values ('x', 'old', 'POST', '/', 'h', $1)",
            now - chrono::TimeDelta::hours(25),
        ),
        (
            "insert into clusters (name, server, auth_kind, credentials, created_at, updated_at) values ('old', 'http://x', 'token', '{}', $1, $1)",
            days(50),
        ),
    ] {
        db.execute(sql, &[Param::Time(at)]).await;
    }
    db.execute(
        "insert into upgrade_jobs (cluster, version, components, image_repository, force, state, created_at, finished_at, updated_at)
         values ('old', 'v1.30.0', '[]', 'r', false, 'succeeded', $1, $1, $1)",
        &[Param::Time(days(40))],
    )
    .await;
    let settings = drover::retention::Settings {
        audit_age: Duration::from_secs(90 * 86_400),
        audit_max_rows: 1_000_000,
        event_age: Duration::from_secs(30 * 86_400),
        event_max_rows: 1_000_000,
        job_age: Duration::from_secs(30 * 86_400),
        revision_history: 2,
        interval: Duration::from_secs(600),
    };
    let pruned = drover::retention::prune_once(&app.state.db, &settings, now).await.unwrap();
    assert_eq!(
        (pruned.audit, pruned.events, pruned.upgrade_jobs, pruned.revisions, pruned.idempotency),
        (1, 1, 1, 3, 1),
        "{pruned:?}"
    );
    let revisions = db
        .integers("select revision from pool_revisions where namespace = 'default' and pool = 'hist' order by revision")
        .await;
    assert_eq!(revisions, [4, 5, 6], "the current revision and the two before it");
    let theirs = db.integers("select revision from pool_revisions where namespace = 'team-b' and pool = 'hist'").await;
    assert_eq!(theirs, [1], "another namespace's pool of that name keeps its revision");
    assert_eq!(count(&app, "select count(*) from audit where path = '/old'").await, 0);

    let capped = drover::retention::Settings { audit_max_rows: 2, ..settings };
    drover::retention::prune_once(&app.state.db, &capped, now).await.unwrap();
    assert!(count(&app, "select count(*) from audit").await <= 2, "the row cap holds");
}

#[tokio::test]
async fn one_parsing_policy_for_keys_schemes_etags_media_types_and_shapes() {
    let app = spawn_app().await;
    let raw = |method: Method, path: &str, ct: &str, body: &str| {
        app.client.request(method, app.url(path)).header("content-type", ct).body(body.to_owned()).send()
    };
    let dup = raw(
        Method::POST,
        "/v1/pools",
        "application/json",
        r#"{"name": "d", "replicas": 1, "replicas": 2, "version": "v1.29.2"}"#,
    );
    let problem = assert_problem(dup.await.unwrap(), 422, Some("replicas")).await;
    assert_eq!(problem["errors"][0]["rule"], "duplicate_key");
    let dup_token =
        raw(Method::POST, "/v1/tokens", "application/json", r#"{"name": "a", "name": "b", "role": "viewer"}"#);
    assert_eq!(assert_problem(dup_token.await.unwrap(), 422, Some("name")).await["errors"][0]["rule"], "duplicate_key");

    let lower =
        reqwest::Client::new().get(app.url("/v1/pools")).header("authorization", format!("bearer {}", app.admin_token));
    assert_eq!(lower.send().await.unwrap().status(), StatusCode::OK, "the scheme is case-insensitive");

    app.create_pool_ok("p", 0, json!({"paused": true})).await;
    assert_problem(app.patch_pool("p", json!({"replicas": 1}), Some("W/\"1\"")).await, 412, None).await;
    assert_eq!(app.patch_pool("p", json!({"replicas": 1}), Some("\"1\"")).await.status(), StatusCode::OK);

    let evil = raw(
        Method::POST,
        "/v1/pools",
        "application/evil+json",
        r#"{"name": "e", "replicas": 0, "version": "v1.29.2"}"#,
    );
    assert_problem(evil.await.unwrap(), 415, None).await;
    let evil_patch = raw(Method::PATCH, "/v1/pools/p", "application/evil+json", r#"{"replicas": 2}"#);
    assert_problem(evil_patch.await.unwrap(), 415, None).await;
    let merge_on_post = raw(
        Method::POST,
        "/v1/pools",
        "application/merge-patch+json",
        r#"{"name": "m", "replicas": 0, "version": "v1.29.2"}"#,
    );
    assert_problem(merge_on_post.await.unwrap(), 415, None).await;
    let json_patch = raw(Method::PATCH, "/v1/pools/p", "application/json", r#"{"replicas": 2}"#);
    assert_eq!(json_patch.await.unwrap().status(), StatusCode::OK, "a merge patch may be sent as application/json");

    let array = raw(
        Method::POST,
        "/v1/pools",
        "application/json",
        r#"{"name": "s", "replicas": 0, "version": "v1.29.2", "strategy": [null, null]}"#,
    );
    assert_eq!(assert_problem(array.await.unwrap(), 422, Some("strategy")).await["errors"][0]["rule"], "type");
    let mounts = raw(
        Method::POST,
        "/v1/pools",
        "application/json",
        r#"{"name": "s", "replicas": 0, "version": "v1.29.2", "extra_mounts": [["/a", "/b", false]]}"#,
    );
    assert_problem(mounts.await.unwrap(), 422, Some("extra_mounts[0]")).await;
}

#[tokio::test]
async fn host_mounts_need_an_allowed_directory_and_never_expose_the_host() {
    let app = spawn_app().await;
    let data_dir = app.data_dir.display().to_string();
    for host in ["/var/run/docker.sock", "/", "/etc", data_dir.as_str()] {
        let body = json!({"name": "m", "replicas": 0, "version": "v1.29.2",
            "extra_mounts": [{"container_path": "/x", "host_path": host}]});
        let problem = assert_problem(app.create_pool(body).await, 422, Some("extra_mounts[0].host_path")).await;
        assert_eq!(problem["errors"][0]["rule"], "host_path_allowed", "{host}: by default nothing is mounted");
    }

    let parent = app.data_dir.parent().expect("a parent").display().to_string();
    let open = spawn_with(|c| c.allowed_mount_paths = vec!["/".into()]).await;
    for host in ["/", "/var/run/docker.sock", "/var/run", "/run/docker.sock"] {
        let body = json!({"name": "m", "replicas": 0, "version": "v1.29.2",
            "extra_mounts": [{"container_path": "/x", "host_path": host}]});
        let problem = assert_problem(open.create_pool(body).await, 422, Some("extra_mounts[0].host_path")).await;
        assert_eq!(problem["errors"][0]["rule"], "host_path_protected", "{host}");
    }
    let own = open.data_dir.display().to_string();
    let body = json!({"name": "m", "replicas": 0, "version": "v1.29.2",
        "extra_mounts": [{"container_path": "/x", "host_path": own}]});
    let problem = assert_problem(open.create_pool(body).await, 422, Some("extra_mounts[0].host_path")).await;
    assert_eq!(problem["errors"][0]["rule"], "host_path_protected", "drover's own data directory");
    let fine = json!({"name": "m", "replicas": 0, "version": "v1.29.2",
        "extra_mounts": [{"container_path": "/x", "host_path": parent.clone() + "-elsewhere"}]});
    assert_eq!(open.create_pool(fine).await.status(), StatusCode::CREATED);

    let limited = spawn_with(|c| c.allowed_images = vec!["sim/*".into()]).await;
    let body = json!({"name": "i", "replicas": 0, "version": "v1.29.2", "image": "evil/miner:1"});
    let problem = assert_problem(limited.create_pool(body).await, 422, Some("image")).await;
    assert_eq!(problem["errors"][0]["rule"], "image_allowed");
}

#[tokio::test]
async fn only_an_admin_changes_the_image_of_a_pool_with_host_mounts() {
    let app = spawn_with(|c| c.allowed_mount_paths = vec!["/srv".into(), "/var/run/docker.sock".into()]).await;
    let socket = json!({"image": "sim/app:1", "paused": true,
        "extra_mounts": [{"container_path": "/var/run/docker.sock", "host_path": "/var/run/docker.sock"}]});
    app.create_pool_ok("sock", 1, socket).await;
    app.create_pool_ok("plain", 1, json!({"image": "sim/app:1", "paused": true})).await;
    let operator = client_with_token(&make_token(&app, "ops", "operator").await);
    let patch = |pool: &str, body: Value| {
        operator
            .patch(app.url(&format!("/v1/pools/{pool}")))
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
    };
    assert_problem(patch("sock", json!({"image": "sim/evil:1"})).await.unwrap(), 403, None).await;
    assert_eq!(patch("sock", json!({"replicas": 2})).await.unwrap().status(), StatusCode::OK);
    assert_eq!(patch("plain", json!({"image": "sim/app:2"})).await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.patch_pool("sock", json!({"image": "sim/app:2"}), None).await.status(), StatusCode::OK);
    let rollback = operator.post(app.url("/v1/pools/sock/rollback")).send().await.unwrap();
    assert_problem(rollback, 403, None).await;
    assert_eq!(app.pool("sock").await["image"], "sim/app:2", "the image is the admin's");
}
