//! The price of an OIDC token over HTTPS: `GET /v1/pools/{name}` with a
//! JWT (RS256, its key cached) against the same request with a drover
//! token, in one run of one server.
//!
//! A fresh `drover serve --runtime simulated` process (the release binary)
//! with `--tls-cert`/`--tls-key` from a CA made here (rcgen) and an access
//! config naming a local OIDC issuer (discovery and JWKS served here, on
//! 127.0.0.1); one pool. Then `wrk` at 64 connections, in alternating
//! turns of `DROVER_BENCH_SECS` (default 10) seconds: drover token, JWT,
//! drover token, JWT, ... (`DROVER_BENCH_TURNS`, default 3 each); the
//! median turn of each is reported, with their ratio. The first JWT request
//! fetches the issuer's keys; every later one finds them cached.
//!
//! Run: `cargo bench --bench edge` (needs `wrk`: apt-get install wrk).

use std::process::{Command, Stdio};
use std::time::Duration;

use axum::Json;
use axum::routing::get;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{Value, json};

#[path = "support/measure.rs"]
mod measure;
use measure::{Server, env_or, percentile, wrk};

/// A CA and a certificate for 127.0.0.1 it signed, as PEM files in `dir`;
/// returns the CA's PEM.
fn certificates(dir: &std::path::Path) -> anyhow::Result<String> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("server.crt"), cert.pem())?;
    std::fs::write(dir.join("server.key"), key.serialize_pem())?;
    Ok(ca_pem)
}

/// Serves discovery and a JWKS of `jwk` on 127.0.0.1; returns the issuer URL.
async fn issuer(jwk: Value) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let discovery = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
    let app = axum::Router::new()
        .route("/.well-known/openid-configuration", get(move || async move { Json(discovery) }))
        .route("/jwks", get(move || async move { Json(json!({"keys": [jwk]})) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

async fn start(dir: &std::path::Path, ca_pem: &str, issuer_url: &str) -> anyhow::Result<Server> {
    let access = dir.join("access.json");
    let rules = json!([{"claims": {"repository": "org/infra"}, "role": "viewer"}]);
    let config = json!({"oidc_issuer": [{"issuer": issuer_url, "audience": ["drover"], "rules": rules}]});
    std::fs::write(&access, config.to_string())?;
    let data = dir.join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--runtime", "simulated", "--log-level", "warn"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--tls-cert")
        .arg(dir.join("server.crt"))
        .arg("--tls-key")
        .arg(dir.join("server.key"))
        .arg("--access-config")
        .arg(&access)
        .stdout(Stdio::null())
        .spawn()?;
    let base = format!("https://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes())?])
        .timeout(Duration::from_secs(10))
        .build()?;
    Server::ready(child, base, http, &data).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs = env_or("DROVER_BENCH_SECS", 10);
    let turns = env_or("DROVER_BENCH_TURNS", 3);
    let dir = tempfile::TempDir::new()?;
    let ca_pem = certificates(dir.path())?;
    let pair = KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)?;
    let signing = EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes())?;
    let mut jwk = Jwk::from_encoding_key(&signing, Algorithm::RS256)?;
    jwk.common.key_id = Some("bench".into());
    let issuer_url = issuer(serde_json::to_value(jwk)?).await?;
    let server = start(dir.path(), &ca_pem, &issuer_url).await?;

    let res = server
        .http
        .post(format!("{}/v1/pools", server.base))
        .bearer_auth(&server.token)
        .json(&json!({"name": "web", "replicas": 3, "version": "v1.29.2", "image": "sim/app:1"}))
        .send()
        .await?;
    anyhow::ensure!(res.status().is_success(), "creating the pool: {}", res.status());
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"iss": issuer_url, "aud": "drover", "sub": "repo:org/infra:ref:refs/heads/main",
                        "repository": "org/infra", "iat": now, "nbf": now, "exp": now + 3600});
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("bench".into());
    let jwt = jsonwebtoken::encode(&header, &claims, &signing)?;
    let url = format!("{}/v1/pools/web", server.base);
    for (what, token) in [("drover token", &server.token), ("JWT", &jwt)] {
        let res = server.http.get(&url).bearer_auth(token).send().await?;
        anyhow::ensure!(res.status().is_success(), "GET with the {what}: {}", res.status());
    }

    let (mut plain, mut oidc) = (Vec::new(), Vec::new());
    for turn in 1..=turns {
        eprintln!("turn {turn}/{turns}: drover token, then JWT ({secs} s each)");
        plain.push(wrk(&url, Some(&server.token), secs)?);
        oidc.push(wrk(&url, Some(&jwt), secs)?);
    }
    let median = |runs: &[(f64, f64)]| {
        let mut rps: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut p99: Vec<f64> = runs.iter().map(|r| r.1).collect();
        (percentile(&mut rps, 0.5), percentile(&mut p99, 0.5))
    };
    let (plain_rps, plain_p99) = median(&plain);
    let (oidc_rps, oidc_p99) = median(&oidc);
    println!("\nGET /v1/pools/web over HTTPS, wrk -t2 -c64, {turns} turns of {secs} s each, median turn:\n");
    println!("| credential | requests/s | p99 (ms) | every turn (req/s) |");
    println!("|---|---:|---:|---|");
    let turns_of = |runs: &[(f64, f64)]| runs.iter().map(|r| format!("{:.0}", r.0)).collect::<Vec<_>>().join(", ");
    println!("| drover token | {plain_rps:.0} | {plain_p99:.2} | {} |", turns_of(&plain));
    println!("| OIDC JWT (RS256, key cached) | {oidc_rps:.0} | {oidc_p99:.2} | {} |", turns_of(&oidc));
    println!("\nJWT throughput / token throughput: {:.0}%", 100.0 * oidc_rps / plain_rps);
    drop(server);
    Ok(())
}
