//! OIDC bearer tokens against a local issuer of the test's own (discovery
//! and JWKS on 127.0.0.1, keys generated here): accepted tokens map to
//! their rule's role; expired, not-yet-valid, wrong audience, wrong
//! issuer, unknown key, `alg: none`, HS256 signed with the public key and
//! tokens no rule matches are refused; keys rotate during a run, and a
//! revoked key stops working once the cached keys are too old; the audit
//! trail keeps the subject and the rule's claims, never the token.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use drover::app::Application;
use drover::config::RuntimeKind;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::helpers::{TestApp, config, metric, start, wait_for};

/// A signing key and its public JWK.
pub struct SigningKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
    public_pem: String,
}

impl SigningKey {
    pub fn rsa(kid: &str) -> Self {
        let pair =
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).expect("RSA key");
        let encoding = EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes()).expect("RSA PEM");
        Self::with(kid, Algorithm::RS256, encoding, pair.public_key_pem())
    }

    pub fn ec(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
        let encoding = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("EC PEM");
        Self::with(kid, Algorithm::ES256, encoding, pair.public_key_pem())
    }

    fn with(kid: &str, alg: Algorithm, encoding: EncodingKey, public_pem: String) -> Self {
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).expect("public JWK");
        jwk.common.key_id = Some(kid.to_owned());
        let jwk = serde_json::to_value(jwk).expect("JWK JSON");
        Self { kid: kid.to_owned(), alg, encoding, jwk, public_pem }
    }

    /// A token with `claims`, signed by this key.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("signing")
    }
}

/// The test's OIDC issuer: a discovery document and a JWKS it can change.
pub struct Issuer {
    pub url: String,
    jwks: Arc<std::sync::Mutex<Value>>,
    /// JWKS downloads so far.
    fetches: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct IssuerState {
    url: String,
    jwks: Arc<std::sync::Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

impl Issuer {
    pub async fn start(keys: &[&SigningKey]) -> Issuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the issuer");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let jwks = Arc::new(std::sync::Mutex::new(Value::Null));
        let fetches = Arc::new(AtomicUsize::new(0));
        let state = IssuerState { url: url.clone(), jwks: jwks.clone(), fetches: fetches.clone() };
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                get(|State(s): State<IssuerState>| async move {
                    Json(json!({"issuer": s.url, "jwks_uri": format!("{}/jwks", s.url)}))
                }),
            )
            .route(
                "/jwks",
                get(|State(s): State<IssuerState>| async move {
                    s.fetches.fetch_add(1, Ordering::SeqCst);
                    Json(s.jwks.lock().expect("lock").clone())
                }),
            )
            .with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let issuer = Issuer { url, jwks, fetches };
        issuer.publish(keys);
        issuer
    }

    /// Serves these keys from now on.
    pub fn publish(&self, keys: &[&SigningKey]) {
        *self.jwks.lock().expect("lock") = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    }

    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// Claims of a pipeline on org/infra's main branch, valid for 5 minutes.
    pub fn claims(&self) -> Value {
        let now = chrono::Utc::now().timestamp();
        json!({
            "iss": self.url, "aud": "drover", "sub": "repo:org/infra:ref:refs/heads/main",
            "repository": "org/infra", "ref": "refs/heads/main",
            "iat": now, "nbf": now, "exp": now + 300,
        })
    }
}

/// The rules of the README's example: main of org/infra operates, the rest
/// of org/infra views.
pub fn rules() -> Value {
    json!([
        {"claims": {"repository": "org/infra", "ref": "refs/heads/main"}, "role": "operator"},
        {"claims": {"repository": "org/infra"}, "role": "viewer"},
    ])
}

/// A server accepting `issuer`'s tokens, with `extra` merged into the issuer's entry.
pub async fn app_for(issuer: &Issuer, extra: Value) -> TestApp {
    let tmp = TempDir::new().expect("data dir");
    let mut entry = json!({"issuer": issuer.url, "audience": ["drover"], "rules": rules()});
    if let (Some(e), Value::Object(more)) = (entry.as_object_mut(), extra) {
        e.extend(more);
    }
    let path = tmp.path().join("access.json");
    std::fs::write(&path, json!({"oidc_issuer": [entry]}).to_string()).expect("access config");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.access_config = Some(path);
    start(cfg, Some(tmp)).await
}

async fn call(app: &TestApp, method: Method, path: &str, token: &str, body: Option<Value>) -> reqwest::Response {
    let mut req = reqwest::Client::new().request(method, app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.expect("request")
}

async fn status(app: &TestApp, token: &str) -> StatusCode {
    call(app, Method::GET, "/v1/pools", token, None).await.status()
}

#[tokio::test]
async fn oidc_tokens_get_the_role_of_the_first_rule_their_claims_match() {
    let (rsa, ec) = (SigningKey::rsa("rsa-1"), SigningKey::ec("ec-1"));
    let issuer = Issuer::start(&[&rsa, &ec]).await;
    let app = app_for(&issuer, json!({})).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let main = rsa.sign(&issuer.claims());
    let res = call(&app, Method::PUT, "/v1/pools/web/scale", &main, Some(json!({"replicas": 2}))).await;
    assert_eq!(res.status(), StatusCode::OK, "main of org/infra operates: {}", res.text().await.unwrap_or_default());
    let res = call(&app, Method::DELETE, "/v1/pools/web", &main, None).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "an operator does not delete pools");
    // ES256 works too; another branch of the repository only views.
    let mut branch = issuer.claims();
    branch["ref"] = json!("refs/heads/feature");
    let branch = ec.sign(&branch);
    assert_eq!(status(&app, &branch).await, StatusCode::OK);
    let res = call(&app, Method::PUT, "/v1/pools/web/scale", &branch, Some(json!({"replicas": 3}))).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // Drover's own tokens still work next to OIDC.
    assert_eq!(app.get("/v1/pools").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_token_no_rule_matches_gets_403_with_a_problem_that_names_no_secret() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let app = app_for(&issuer, json!({})).await;
    let mut claims = issuer.claims();
    claims["repository"] = json!("org/infra-fork");
    let token = key.sign(&claims);
    let res = call(&app, Method::GET, "/v1/pools", &token, None).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.text().await.expect("body");
    let problem: Value = serde_json::from_str(&body).expect("problem JSON");
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("/no-access-rule")), "{problem}");
    for secret in [token.as_str(), "org/infra-fork", "repo:org/infra", &issuer.url] {
        assert!(!body.contains(secret), "the problem shows {secret:?}: {body}");
    }
}

#[tokio::test]
async fn invalid_tokens_are_refused_with_401() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let other = Issuer::start(&[&key]).await;
    let app = app_for(&issuer, json!({})).await;
    let now = chrono::Utc::now().timestamp();
    let with = |patch: Value| {
        let mut c = issuer.claims();
        if let (Some(c), Value::Object(p)) = (c.as_object_mut(), patch) {
            c.extend(p);
        }
        c
    };
    let cases = [
        ("expired beyond the leeway", key.sign(&with(json!({"exp": now - 120, "iat": now - 600, "nbf": now - 600})))),
        ("not yet valid beyond the leeway", key.sign(&with(json!({"nbf": now + 120})))),
        ("for another audience", key.sign(&with(json!({"aud": "someone-else"})))),
        ("from an issuer not configured", key.sign(&with(json!({"iss": other.url})))),
        ("without a subject", key.sign(&with(json!({"sub": null})))),
        ("with a forged signature", {
            let t = key.sign(&issuer.claims());
            let (head, _) = t.rsplit_once('.').expect("three parts");
            format!("{head}.{}", URL_SAFE_NO_PAD.encode([7u8; 256]))
        }),
        ("with alg none", {
            let header = URL_SAFE_NO_PAD.encode(json!({"alg": "none", "kid": "k", "typ": "JWT"}).to_string());
            format!("{header}.{}.", URL_SAFE_NO_PAD.encode(issuer.claims().to_string()))
        }),
        ("HS256 with the public key as secret", {
            let mut header = Header::new(Algorithm::HS256);
            header.kid = Some("k".into());
            let secret = EncodingKey::from_secret(key.public_pem.as_bytes()).expect("HMAC key");
            jsonwebtoken::encode(&header, &issuer.claims(), &secret).expect("HS256")
        }),
    ];
    for (what, token) in &cases {
        let res = call(&app, Method::GET, "/v1/pools", token, None).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "a token {what}");
        assert!(res.headers().contains_key("www-authenticate"), "a token {what}");
    }
    // Within the leeway (30 s by default), a token just expired still works.
    let just = key.sign(&with(json!({"exp": now - 5})));
    assert_eq!(status(&app, &just).await, StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_key_id_refreshes_the_keys_once_then_is_refused() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let app = app_for(&issuer, json!({"min_refresh_seconds": 3600})).await;
    let at_start = issuer.fetches();
    assert_eq!(at_start, 1, "the keys are fetched once at start");
    let stranger = SigningKey::rsa("unknown");
    let token = stranger.sign(&issuer.claims());
    assert_eq!(status(&app, &token).await, StatusCode::UNAUTHORIZED);
    assert_eq!(issuer.fetches(), at_start + 1, "an unknown key id makes drover look at the issuer's keys again");
    // Within min_refresh_seconds, another unknown key id is refused at once.
    let other = SigningKey::ec("also-unknown").sign(&issuer.claims());
    assert_eq!(status(&app, &other).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(&app, &token).await, StatusCode::UNAUTHORIZED);
    assert_eq!(issuer.fetches(), at_start + 1, "made-up key ids cannot make drover hammer the issuer");
    assert_eq!(status(&app, &key.sign(&issuer.claims())).await, StatusCode::OK, "the cached key still works");
}

#[tokio::test]
async fn keys_rotated_during_a_run_are_picked_up_and_retired_keys_stop_working() {
    let old = SigningKey::rsa("old");
    let issuer = Issuer::start(&[&old]).await;
    let app = app_for(&issuer, json!({"min_refresh_seconds": 0})).await;
    assert_eq!(status(&app, &old.sign(&issuer.claims())).await, StatusCode::OK);
    // The issuer publishes a new key beside the old one and signs with it.
    let new = SigningKey::ec("new");
    issuer.publish(&[&old, &new]);
    let fetches = issuer.fetches();
    assert_eq!(status(&app, &new.sign(&issuer.claims())).await, StatusCode::OK, "the new key is fetched");
    assert_eq!(issuer.fetches(), fetches + 1, "exactly one refresh");
    // Then retires the old one: once drover refreshes, its tokens stop working.
    issuer.publish(&[&new]);
    let unknown = SigningKey::rsa("unknown").sign(&issuer.claims());
    let fetches = issuer.fetches();
    assert_eq!(status(&app, &unknown).await, StatusCode::UNAUTHORIZED, "an unknown kid: refresh, then refuse");
    assert_eq!(issuer.fetches(), fetches + 1);
    assert_eq!(status(&app, &old.sign(&issuer.claims())).await, StatusCode::UNAUTHORIZED, "the retired key");
    assert_eq!(status(&app, &new.sign(&issuer.claims())).await, StatusCode::OK);
}

#[tokio::test]
async fn a_revoked_key_stops_working_once_the_cached_keys_are_too_old_without_any_unknown_key_id() {
    let revoked = SigningKey::rsa("revoked");
    let kept = SigningKey::ec("kept");
    let issuer = Issuer::start(&[&revoked, &kept]).await;
    let app = app_for(&issuer, json!({"max_key_age_seconds": 1})).await;
    let token = revoked.sign(&issuer.claims());
    assert_eq!(status(&app, &token).await, StatusCode::OK, "accepted, and its verdict cached");
    // The issuer drops the key. No token names an unknown key id, so only
    // the age of the cached keys can make drover look again.
    issuer.publish(&[&kept]);
    let fetches = issuer.fetches();
    wait_for(Duration::from_secs(30), "the revoked key's token to be refused", async || {
        status(&app, &token).await == StatusCode::UNAUTHORIZED
    })
    .await;
    assert!(issuer.fetches() > fetches, "drover fetched the keys again by itself");
    assert_eq!(status(&app, &kept.sign(&issuer.claims())).await, StatusCode::OK, "the kept key still works");
}

#[tokio::test]
async fn a_static_jwks_file_serves_sites_without_the_network() {
    let key = SigningKey::ec("offline");
    let dir = TempDir::new().expect("dir");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [key.jwk]}).to_string()).expect("JWKS file");
    // An issuer URL nobody serves: the file is all drover reads.
    let issuer = Issuer { url: "https://issuer.invalid".into(), ..Issuer::start(&[]).await };
    let app = app_for(&issuer, json!({"jwks_file": jwks})).await;
    assert_eq!(status(&app, &key.sign(&issuer.claims())).await, StatusCode::OK);
}

#[tokio::test]
async fn the_audit_trail_keeps_the_subject_and_the_rules_claims_but_never_the_token() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let app = app_for(&issuer, json!({})).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let token = key.sign(&issuer.claims());
    let res = call(&app, Method::PUT, "/v1/pools/web/scale", &token, Some(json!({"replicas": 2}))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let audit: Value = app.get("/v1/audit?limit=10").await.json().await.expect("audit JSON");
    let record = audit["items"]
        .as_array()
        .and_then(|items| items.iter().find(|r| r["path"] == "/v1/pools/web/scale"))
        .unwrap_or_else(|| panic!("the scale is audited: {audit:#}"));
    assert_eq!(
        record["token_name"], "oidc:repo:org/infra:ref:refs/heads/main (ref=refs/heads/main, repository=org/infra)",
        "{record}"
    );
    assert_eq!((record["role"].as_str(), record["outcome"].as_str()), (Some("operator"), Some("allowed")));
    // Neither the token nor its signature is anywhere in the store.
    let signature = token.rsplit('.').next().expect("a signature");
    let mut db = app.raw_store().await;
    for table_column in ["audit.token_name", "audit.path", "tokens.name", "tokens.hash"] {
        let (table, column) = table_column.split_once('.').expect("table.column");
        let sql = format!("select count(*) from {table} where {column} like '%{signature}%'");
        assert_eq!(db.integer(&sql).await, 0, "{table_column} holds the token");
    }
    if let drover::db::Location::Sqlite(path) = &app.store {
        for file in [path.clone(), path.with_extension("db-wal")] {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(!String::from_utf8_lossy(&bytes).contains(signature), "{} holds the token", file.display());
        }
    }
}

#[tokio::test]
async fn a_bad_access_config_stops_the_start_and_names_the_file() {
    let tmp = TempDir::new().expect("dir");
    let path = tmp.path().join("access.json");
    std::fs::write(&path, r#"{"oidc_issuer": [{"issuer": "https://i", "audience": ["a"], "rules": []}]}"#)
        .expect("write");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.access_config = Some(path.clone());
    let err = Application::build(cfg).await.err().expect("an issuer without rules is refused");
    let err = format!("{err:#}");
    assert!(err.contains(&path.display().to_string()) && err.contains("rules"), "{err}");
}

#[tokio::test]
async fn the_cli_runs_its_token_command_again_when_the_server_refuses_the_token() {
    let key = SigningKey::rsa("k1");
    let issuer = Issuer::start(&[&key]).await;
    let app = app_for(&issuer, json!({})).await;
    let dir = TempDir::new().expect("dir");
    // The first token the command prints has expired (a CI token during a
    // long wait), the next is fresh; the command counts its runs.
    let now = chrono::Utc::now().timestamp();
    let mut expired = issuer.claims();
    (expired["iat"], expired["nbf"], expired["exp"]) = (json!(now - 900), json!(now - 900), json!(now - 600));
    std::fs::write(dir.path().join("token-1"), key.sign(&expired)).expect("token file");
    std::fs::write(dir.path().join("token-2"), key.sign(&issuer.claims())).expect("token file");
    let command = format!(
        "cd '{}' && n=$(( $(cat runs 2>/dev/null || echo 0) + 1 )) && echo $n > runs && cat token-$n",
        dir.path().display()
    );
    let listed = crate::cli::drover_at(&app.addr, None, &["pools", "list", "-o", "json", "--token-command", &command])
        .await
        .ok();
    assert!(listed.stdout.contains("\"items\""), "{}", listed.stdout);
    let runs = std::fs::read_to_string(dir.path().join("runs")).expect("the command ran");
    assert_eq!(runs.trim(), "2", "run once, and once more after the 401");
    // A command that fails says why, and nothing is sent without a token.
    let failed = crate::cli::drover_at(
        &app.addr,
        None,
        &["pools", "list", "--token-command", "echo no issuer here >&2; exit 7"],
    )
    .await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(
        failed.stderr.contains("--token-command failed") && failed.stderr.contains("no issuer here"),
        "{}",
        failed.stderr
    );
    // A token refused again after a fresh run is the server's 401, shown as such.
    let stale = format!("cat '{}'", dir.path().join("token-1").display());
    let refused = crate::cli::drover_at(&app.addr, None, &["pools", "list", "--token-command", &stale]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("401"), "{}", refused.stderr);
}

/// Writes the access config of `app_for` again with `rules`.
fn rewrite_rules(app: &TestApp, issuer: &Issuer, rules: Value) {
    let entry = json!({"issuer": issuer.url, "audience": ["drover"], "rules": rules});
    let body = json!({"oidc_issuer": [entry]}).to_string();
    std::fs::write(app.data_dir.join("access.json"), body).expect("access config");
}

#[tokio::test]
async fn a_rule_scoped_to_a_namespace_reaches_only_it_and_changed_rules_apply_without_a_restart() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let scoped = json!([{"claims": {"repository": "org/infra"}, "role": "operator", "namespaces": ["team-a"]}]);
    let app = app_for(&issuer, json!({"rules": scoped})).await;
    for ns in ["team-a", "team-b"] {
        let res = app.request(Method::POST, "/v1/namespaces", Some(json!({"name": ns}))).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let pool = json!({"name": "web", "replicas": 0, "version": "v1.29.2"});
        let res = app.request(Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool)).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let token = key.sign(&issuer.claims());
    let scale = async |ns: &str| {
        let path = format!("/v1/pools/web/scale?namespace={ns}");
        call(&app, Method::PUT, &path, &token, Some(json!({"replicas": 1}))).await.status()
    };
    assert_eq!(scale("team-a").await, StatusCode::OK, "the rule's namespace");
    assert_eq!(scale("team-b").await, StatusCode::NOT_FOUND, "another namespace is not the rule's");
    assert_eq!(scale("default").await, StatusCode::NOT_FOUND, "nor is default");

    // The platform team moves the pipeline to team-b: no restart.
    let moved = json!([{"claims": {"repository": "org/infra"}, "role": "operator", "namespaces": ["team-b"]}]);
    rewrite_rules(&app, &issuer, moved);
    wait_for(Duration::from_secs(5), "the changed rules to be in use", async || {
        scale("team-b").await == StatusCode::OK
    })
    .await;
    assert_eq!(scale("team-a").await, StatusCode::NOT_FOUND, "the old rule is gone");

    // A change that does not validate keeps the rules in use, and says so.
    let broken = json!([{"claims": {}, "role": "operator"}]);
    rewrite_rules(&app, &issuer, broken);
    wait_for(Duration::from_secs(5), "the broken change to be counted", async || {
        metric(&app.metrics_text(), "drover_access_config_reloads_total{result=\"failed\"}") >= 1.0
    })
    .await;
    assert_eq!(scale("team-b").await, StatusCode::OK, "the previous rules stay in use");
    assert_eq!(metric(&app.metrics_text(), "drover_access_config_reloads_total{result=\"ok\"}"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_changed_on_disk_takes_effect_on_two_replicas_within_3_s() {
    let key = SigningKey::rsa("k");
    let issuer = Issuer::start(&[&key]).await;
    let store = drover::config::Location::parse(&crate::postgres::shared().fresh_database()).expect("a database URL");
    let dir = TempDir::new().expect("shared config directory");
    let access = dir.path().join("access.json");
    let write = |namespace: &str| {
        let rules = json!([{"claims": {"repository": "org/infra"}, "role": "operator", "namespaces": [namespace]}]);
        let entry = json!({"issuer": issuer.url, "audience": ["drover"], "rules": rules});
        std::fs::write(&access, json!({"oidc_issuer": [entry]}).to_string()).expect("access config");
    };
    write("team-a");
    let mut replicas = Vec::new();
    let mut admin: Option<String> = None;
    for _ in 0..2 {
        let tmp = TempDir::new().expect("data dir");
        if let Some(token) = &admin {
            std::fs::write(tmp.path().join("admin.token"), token).expect("copying the admin token");
        }
        let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
        cfg.database_url = Some(store.clone());
        cfg.access_config = Some(access.clone());
        let app = start(cfg, Some(tmp)).await;
        admin = Some(app.admin_token.clone());
        replicas.push(app);
    }
    let first = &replicas[0];
    for ns in ["team-a", "team-b"] {
        let res = first.request(Method::POST, "/v1/namespaces", Some(json!({"name": ns}))).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let pool = json!({"name": "web", "replicas": 0, "version": "v1.29.2"});
        let res = first.request(Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool)).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let token = key.sign(&issuer.claims());
    let scale = async |app: &TestApp, ns: &str| {
        let path = format!("/v1/pools/web/scale?namespace={ns}");
        call(app, Method::PUT, &path, &token, Some(json!({"replicas": 1}))).await.status()
    };
    for app in &replicas {
        assert_eq!(scale(app, "team-a").await, StatusCode::OK);
        assert_eq!(scale(app, "team-b").await, StatusCode::NOT_FOUND);
    }
    write("team-b");
    for (i, app) in replicas.iter().enumerate() {
        wait_for(Duration::from_secs(3), &format!("replica {i} to use the changed rule"), async || {
            scale(app, "team-b").await == StatusCode::OK
        })
        .await;
    }
    for app in &replicas {
        assert_eq!(scale(app, "team-a").await, StatusCode::NOT_FOUND, "the old rule is gone everywhere");
    }
}
