//! The dashboard at `/ui`: its files over plain HTTP, and a real browser
//! (headless Chromium driven over the W3C WebDriver protocol) signing in,
//! opening a pool and scaling it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

#[tokio::test]
async fn dashboard_files_are_served_without_a_token_under_a_strict_csp() {
    let app = spawn_app().await;
    let anonymous = reqwest::Client::new();
    for (path, content_type, needle) in [
        ("/ui", "text/html; charset=utf-8", "<script src=\"/ui/app.js\""),
        ("/ui/", "text/html; charset=utf-8", "id=\"login-form\""),
        ("/ui/app.js", "text/javascript; charset=utf-8", "sessionStorage"),
        ("/ui/style.css", "text/css; charset=utf-8", ".cell"),
    ] {
        let res = anonymous.get(app.url(path)).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{path} needs no token");
        let headers = res.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().expect("ASCII CSP");
        for directive in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'"] {
            assert!(csp.contains(directive), "{path}: CSP {csp:?} lacks {directive:?}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("http"), "{path}: CSP {csp:?} is not self-only");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        let body = res.text().await.expect("body");
        assert!(body.contains(needle), "{path} should contain {needle:?}");
    }
    // Opening the page opened nothing else.
    let res = anonymous.get(app.url("/v1/pools")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = anonymous.get(app.url("/uinternal")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn dashboard_rejects_a_wrong_token_then_scales_a_pool_to_five_machines() {
    let Some((chromium, chromedriver)) =
        browser_or_skip("dashboard_rejects_a_wrong_token_then_scales_a_pool_to_five_machines")
    else {
        return;
    };
    let app = spawn_app().await;
    app.create_pool_ok("web", 0, json!({"image": "sim/app:1"})).await;

    let driver = Driver::start(&chromedriver).await.expect("starting chromedriver");
    let session = Session::new(&driver, &chromium).await.expect("starting a headless Chromium session");
    let outcome = tokio::time::timeout(Duration::from_secs(120), scenario(&session, &app)).await;
    // Always end the browser before reporting, so no Chromium outlives the test.
    let shot = session.screenshot().await;
    session.delete().await;
    drop(driver);
    if let Ok(png) = shot {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshot.png");
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("dashboard screenshot: {}", path.display());
    }
    match outcome {
        Err(_) => panic!("the browser scenario took over 120 s: the page never reached the awaited state"),
        Ok(Err(e)) => panic!("browser scenario failed: {e:#}"),
        Ok(Ok(())) => {}
    }
    let pool = app.pool("web").await;
    assert_eq!(pool["replicas"], 5, "the scale control changed the pool");
}

async fn scenario(s: &Session, app: &TestApp) -> anyhow::Result<()> {
    s.navigate(&app.url("/ui")).await?;
    s.wait_until("the sign-in form", "return !document.getElementById('login').hidden").await?;

    // A wrong token: back to the form, with a message.
    s.type_into("#token", "drover_not-a-real-token").await?;
    s.click("#login-submit").await?;
    let error = s
        .wait_until(
            "an error for the wrong token",
            "const e = document.getElementById('login-error'); \
             return !e.hidden && !document.getElementById('login').hidden && e.textContent",
        )
        .await?;
    ensure!(error.as_str().is_some_and(|t| t.contains("did not accept")), "login error said {error}");
    let stored = s.script("return sessionStorage.getItem('drover.token')").await?;
    ensure!(stored.is_null(), "a rejected token must not stay in sessionStorage, found {stored}");

    // The right token: the pools list, with our pool.
    s.type_into("#token", &app.admin_token).await?;
    s.click("#login-submit").await?;
    s.wait_until("the pool row", "return document.querySelector('[data-testid=pool-row][data-pool=web]') !== null")
        .await?;
    s.click("[data-testid=pool-row][data-pool=web] a").await?;
    s.wait_until(
        "the pool view with its scale control filled in",
        "return !document.getElementById('view-pool').hidden && document.getElementById('scale-input').value === '0'",
    )
    .await?;

    // Scale to 5 with the control, and watch the cells appear.
    s.clear("#scale-input").await?;
    s.type_into("#scale-input", "5").await?;
    s.click("#scale-submit").await?;
    s.wait_until("5 machine cells", "return document.querySelectorAll('[data-testid=machine-cell]').length === 5")
        .await?;
    // For the screenshot: let them settle (ready and counted by the rollout).
    let settled = s
        .wait_until(
            "5 ready machines",
            "return document.querySelectorAll('[data-testid=machine-cell][data-state=ready]').length === 5 \
             && document.getElementById('rollout-text').textContent.includes('5 of 5')",
        )
        .await;
    if let Err(e) = settled {
        eprintln!("machines did not all become ready for the screenshot: {e:#}");
    }
    let legend = s.script("return document.getElementById('image-legend').textContent").await?;
    ensure!(legend.as_str().is_some_and(|t| t.contains("sim/app:1")), "image legend: {legend}");
    Ok(())
}

// ------------------------------------------------------------ WebDriver --

/// Chromium and chromedriver, or `None` with a printed reason (a panic when
/// `CI` is set: CI must never pass without running the browser).
fn browser_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    let chromium = ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|n| in_path(n));
    let driver = in_path("chromedriver");
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{test} needs chromium and chromedriver (Debian: chromium chromium-driver) and CI is set")
        }
        _ => {
            eprintln!("skipping {test}: chromium or chromedriver is not installed (Debian: chromium chromium-driver)");
            None
        }
    }
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// A chromedriver on a free loopback port, in its own process group so that
/// dropping it ends the browsers it started too.
struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Driver {
    async fn start(binary: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chromedriver.log");
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().with_context(|| format!("spawning {}", binary.display()))?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let driver = Driver { child, url: format!("http://127.0.0.1:{port}"), http };
        let deadline = Instant::now() + Duration::from_secs(20);
        for _ in 0..200 {
            let ready = driver.http.get(format!("{}/status", driver.url)).send().await;
            if let Ok(res) = ready {
                let body: Value = res.json().await.unwrap_or(Value::Null);
                if body["value"]["ready"] == true {
                    return Ok(driver);
                }
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("chromedriver did not report ready on port {port} within 20 s (log: {})", log.display())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        #[cfg(unix)]
        {
            // Our own process group: chromedriver and the browsers it spawned.
            let _ = Command::new("kill").arg("-TERM").arg(format!("-{}", self.child.id())).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session.
struct Session {
    base: String,
    http: reqwest::Client,
}

const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Session {
    async fn new(driver: &Driver, chromium: &Path) -> anyhow::Result<Self> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900"],
            },
        }}});
        let res = driver.http.post(format!("{}/session", driver.url)).json(&caps).send().await?;
        let body: Value = res.json().await?;
        let id = body["value"]["sessionId"].as_str().ok_or_else(|| anyhow!("no session: {body}"))?;
        Ok(Session { base: format!("{}/session/{id}", driver.url), http: driver.http.clone() })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.with_context(|| format!("WebDriver {method} {path}"))?;
        let status = res.status();
        let body: Value = res.json().await.with_context(|| format!("WebDriver {method} {path}: reading JSON"))?;
        ensure!(status.is_success(), "WebDriver {method} {path} answered {status}: {}", body["value"]);
        Ok(body["value"].clone())
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    async fn find(&self, css: &str) -> anyhow::Result<String> {
        let found = self.post("/element", json!({"using": "css selector", "value": css})).await?;
        found[ELEMENT_KEY].as_str().map(str::to_owned).ok_or_else(|| anyhow!("no element for {css}: {found}"))
    }

    async fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/click"), json!({})).await.map(drop)
    }

    async fn clear(&self, css: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/clear"), json!({})).await.map(drop)
    }

    async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/value"), json!({ "text": text })).await.map(drop)
    }

    async fn script(&self, source: &str) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({"script": source, "args": []})).await
    }

    /// Polls `condition` (a script body) every 200 ms for up to 20 s until
    /// it returns something truthy, and returns that.
    async fn wait_until(&self, what: &str, condition: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = Value::Null;
        for _ in 0..100 {
            last = self.script(condition).await?;
            let truthy = match &last {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return Ok(last);
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let page = self.script("return document.body.innerText").await.unwrap_or_default();
        bail!("timed out waiting for {what} (last result {last}); the page says:\n{}", page.as_str().unwrap_or(""))
    }

    async fn screenshot(&self) -> anyhow::Result<Vec<u8>> {
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        let b64 = b64.as_str().ok_or_else(|| anyhow!("screenshot is not a string"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(b64)?)
    }

    async fn delete(&self) {
        if let Err(e) = self.call(reqwest::Method::DELETE, "", None).await {
            eprintln!("could not end the WebDriver session: {e:#}");
        }
    }
}
