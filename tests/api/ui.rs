//! The dashboard at `/ui`: its files over plain HTTP, and a real browser
//! (headless Chromium driven over the W3C WebDriver protocol) signing in,
//! scaling a pool, watching its machines by engine while one engine is lost,
//! reading the engines, following an upgrade job, and running the
//! dashboard's SSE parser on the CLI parser's cases.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use base64::Engine as _;
use drover::config::RuntimeKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, config, spawn_app, start};
use crate::upgrade_env::spawn_env;

/// Every file under `ui/`, as `/ui/<path>` with the content type it needs
/// (a module served as anything but JavaScript does not run).
pub(crate) fn dashboard_files() -> Vec<(String, &'static str, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() { walk(&path, out) } else { out.push(path) }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(&root).expect("under ui/").to_string_lossy().replace('\\', "/");
            let content_type = match file.extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html; charset=utf-8",
                Some("js") => "text/javascript; charset=utf-8",
                Some("css") => "text/css; charset=utf-8",
                other => panic!("ui/{rel}: no content type decided for {other:?}"),
            };
            let url = if rel == "index.html" { "/ui".to_owned() } else { format!("/ui/{rel}") };
            (url, content_type, file)
        })
        .collect()
}

#[test]
fn the_dashboard_names_the_namespace_on_the_paths_the_server_does() {
    let api = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/js/api.js")).expect("api.js");
    let line = api.lines().find(|l| l.starts_with("const NAMESPACED = [")).expect("NAMESPACED in api.js");
    let listed: Vec<&str> = line.split('\'').skip(1).step_by(2).collect();
    assert_eq!(listed, drover::http::openapi::NAMESPACED, "ui/js/api.js and src/http/openapi.rs differ");
}

#[tokio::test]
async fn dashboard_files_are_served_without_a_token_under_a_strict_csp() {
    let app = spawn_app().await;
    let anonymous = reqwest::Client::new();
    let files = dashboard_files();
    assert!(files.len() > 5, "the dashboard's modules: {files:?}");
    let mut checks: Vec<(String, &str, String)> = files
        .iter()
        .map(|(url, content_type, file)| {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            (url.clone(), *content_type, text)
        })
        .collect();
    checks.push(("/ui/".to_owned(), "text/html; charset=utf-8", "id=\"login-form\"".to_owned()));
    for (path, content_type, needle) in &checks {
        let res = anonymous.get(app.url(path)).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{path} needs no token");
        let headers = res.headers().clone();
        assert_eq!(headers["content-type"], *content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().expect("ASCII CSP");
        for directive in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'"] {
            assert!(csp.contains(directive), "{path}: CSP {csp:?} lacks {directive:?}");
        }
        assert!(!csp.contains("unsafe") && !csp.contains("http"), "{path}: CSP {csp:?} is not self-only");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        let body = res.text().await.expect("body");
        assert!(body.contains(needle.as_str()), "{path} is not the file in ui/ (the binary is stale?)");
    }
    let index = &checks.iter().find(|(p, ..)| p == "/ui").expect("the page").2;
    assert!(index.contains("<script type=\"module\" src=\"/ui/js/main.js\">"), "the page loads its modules");
    // Opening the page opened nothing else.
    let res = anonymous.get(app.url("/v1/pools")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = anonymous.get(app.url("/uinternal")).send().await.expect("request");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

/// Limit of one browser scenario; each wait inside has its own 20 s bound.
pub(crate) const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn dashboard_rejects_a_wrong_token_then_scales_a_pool_to_five_machines() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    app.create_pool_ok("web", 0, json!({"image": "sim/app:1"})).await;
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, scale_scenario(&browser.session, &app)).await;
    browser.finish(outcome, "ui-scale-screenshot.png").await;
    let pool = app.pool("web").await;
    assert_eq!(pool["replicas"], 5, "the scale control changed the pool");
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn dashboard_shows_an_upgrade_job_component_by_component() {
    let browser = Browser::start().await;
    let env = spawn_env(|_| {}).await;
    let id = env.start_upgrade(json!({})).await;
    let job = env.wait_done(id, Duration::from_secs(30), "the runner never finished a plain upgrade").await;
    assert_eq!(job["state"], "succeeded", "{job:#}");
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, upgrade_scenario(&browser.session, &env.app, id)).await;
    browser.finish(outcome, "ui-upgrade-screenshot.png").await;
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn dashboard_shows_machines_by_engine_and_the_engines_while_one_is_lost() {
    let browser = Browser::start().await;
    let tmp = tempfile::TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.engine_lost_after = Duration::from_secs(2);
    cfg.machine_settle_time = Duration::from_millis(100);
    let app = start(cfg, Some(tmp)).await;
    for name in ["a", "b"] {
        let body = json!({"name": name, "endpoint": format!("sim://{name}"), "labels": {"zone": name}});
        let res = app.request(Method::POST, "/v1/engines", Some(body)).await;
        assert_eq!(res.status(), StatusCode::CREATED, "registering engine {name}");
    }
    app.create_pool_ok("web", 6, json!({"image": "sim/app:1", "engines": ["local", "a", "b"]})).await;
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, engines_scenario(&browser.session, &app)).await;
    browser.finish(outcome, "ui-engines-screenshot.png").await;
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn dashboard_with_a_token_of_one_namespace_shows_that_namespace_and_nothing_else() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    for ns in ["team-a", "team-b"] {
        let res = app.request(Method::POST, "/v1/namespaces", Some(json!({"name": ns}))).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let pool = json!({"name": format!("web-{ns}"), "replicas": 0, "version": "v1.29.2"});
        let res = app.request(Method::POST, &format!("/v1/pools?namespace={ns}"), Some(pool)).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    app.create_pool_ok("web-default", 0, json!({"image": "sim/app:1"})).await;
    let grants = json!([{"namespace": "team-a", "role": "viewer"}]);
    let res = app.request(Method::POST, "/v1/tokens", Some(json!({"name": "a-view", "grants": grants}))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let made: Value = res.json().await.expect("the token");
    let secret = made["token"].as_str().expect("the secret").to_owned();
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, namespace_scenario(&browser.session, &app, &secret)).await;
    browser.finish(outcome, "ui-namespace-screenshot.png").await;
}

/// Signs in with a viewer token of team-a: the picker offers team-a alone,
/// and the pools are team-a's.
async fn namespace_scenario(s: &Session, app: &TestApp, token: &str) -> anyhow::Result<()> {
    s.navigate(&app.url("/ui")).await?;
    s.wait_until("the sign-in form", "return !document.getElementById('login').hidden").await?;
    s.type_into("#token", token).await?;
    s.click("#login-submit").await?;
    s.wait_until(
        "team-a's pool",
        "return document.querySelector('[data-testid=pool-row][data-pool=web-team-a]') !== null",
    )
    .await?;
    let offered =
        s.script("return Array.from(document.querySelectorAll('#namespace-picker option')).map(o => o.value)").await?;
    ensure!(offered == json!(["team-a"]), "the picker offers the token's namespaces only: {offered}");
    let rows = s
        .script("return Array.from(document.querySelectorAll('[data-testid=pool-row]')).map(r => r.dataset.pool)")
        .await?;
    ensure!(rows == json!(["web-team-a"]), "the pools of team-a alone: {rows}");
    let problem = s.script("return document.getElementById('problem').hidden").await?;
    ensure!(problem == json!(true), "no error shown for a token without `default`");
    Ok(())
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn dashboard_sse_parser_follows_the_cli_parsers_rules() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, sse_scenario(&browser.session, &app)).await;
    browser.finish(outcome, "ui-sse-screenshot.png").await;
}

/// The cases of `src/cli/sse.rs`'s unit tests, chunk by chunk, plus a
/// character split across two chunks of bytes, through the module the
/// dashboard uses (loaded as the page loads it, under its CSP).
async fn sse_scenario(s: &Session, app: &TestApp) -> anyhow::Result<()> {
    s.navigate(&app.url("/ui")).await?;
    s.wait_until("the sign-in form", "return !document.getElementById('login').hidden").await?;
    let got = s
        .script_async(
            "const done = arguments[arguments.length - 1];
             import('/ui/js/sse.js').then(async ({ SseParser, sseMessages }) => {
               const run = (chunks) => { const p = new SseParser(); return chunks.map((c) => p.push(c)); };
               const bytes = new TextEncoder().encode('event: status\\ndata: caf\\u00e9\\n\\n');
               const body = new ReadableStream({ start(c) {
                 c.enqueue(bytes.slice(0, 24)); c.enqueue(bytes.slice(24)); c.close(); } });
               const streamed = [];
               for await (const m of sseMessages(body)) streamed.push(m);
               done({
                 blank_lines: run(['event: status\\ndata: {\"a\":1}\\n\\n: keep-alive\\n\\nevent: event\\nid: 7\\ndata: x\\n\\n']),
                 split_crlf: run(['event: sta', 'tus\\r\\ndata: one\\r\\ndata:two\\r\\n', '\\r\\n']),
                 unnamed: run(['data: hi\\n\\n']),
                 streamed,
               });
             }).catch((e) => done({ error: String(e) }));",
        )
        .await?;
    let msg = |event: &str, data: &str, id: Option<&str>| json!({"event": event, "data": data, "id": id});
    ensure!(got.get("error").is_none(), "loading or running ui/js/sse.js: {got}");
    ensure!(
        got["blank_lines"] == json!([[msg("status", "{\"a\":1}", None), msg("event", "x", Some("7"))]]),
        "messages end on blank lines, comments are skipped: {got:#}"
    );
    ensure!(
        got["split_crlf"] == json!([[], [], [msg("status", "one\ntwo", None)]]),
        "lines split across chunks and CRLF: {got:#}"
    );
    ensure!(got["unnamed"] == json!([[msg("message", "hi", None)]]), "data without an event name: {got:#}");
    ensure!(got["streamed"] == json!([msg("status", "café", None)]), "a character split across chunks: {got:#}");
    Ok(())
}

/// JavaScript: how many machine cells of engine `engine` match `filter`
/// (a selector suffix).
fn cells_on(engine: &str, filter: &str) -> String {
    format!(
        "document.querySelectorAll('[data-testid=engine-group][data-engine={engine}] \
         [data-testid=machine-cell]{filter}').length"
    )
}

/// JavaScript: the engine groups as `name: facts`, joined with `|`.
const GROUPS: &str = "Array.from(document.querySelectorAll('[data-testid=engine-group]')) \
     .map((g) => g.dataset.engine + ': ' + g.querySelector('[data-testid=engine-group-facts]').textContent).join('|')";

async fn engines_scenario(s: &Session, app: &TestApp) -> anyhow::Result<()> {
    sign_in(s, app).await?;
    s.wait_until("the pool row", "return document.querySelector('[data-testid=pool-row][data-pool=web]') !== null")
        .await?;
    s.wait_until(
        "the pool row with its machines spread 2/2/2 and healthy",
        "const r = document.querySelector('[data-testid=pool-row][data-pool=web]'); \
         return r.textContent.includes('a 2/2 · b 2/2 · local 2/2') && r.textContent.includes('yes')",
    )
    .await?;
    s.click("[data-testid=pool-row][data-pool=web] a").await?;
    s.wait_until(
        "three engine groups of two ready machines",
        &format!(
            "return {GROUPS} === 'a: 2 machines, 2 ready|b: 2 machines, 2 ready|local: 2 machines, 2 ready' \
               && ['a', 'b', 'local'].every((e) => document.querySelectorAll( \
                 `[data-testid=engine-group][data-engine=${{e}}] [data-testid=machine-cell][data-state=ready]`).length === 2)"
        ),
    )
    .await?;
    s.wait_until(
        "the pool followed over its event stream",
        "return document.getElementById('live-mode').textContent === 'Live (stream)'",
    )
    .await?;
    let conditions = s
        .script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('[data-testid=condition]')) \
             .map((r) => [r.dataset.type, r.dataset.status]))",
        )
        .await?;
    ensure!(conditions["MachinesHealthy"] == "True" && conditions["Ready"] == "True", "conditions: {conditions}");

    // A machine on engine a is OOM-killed behind drover's back; drover
    // restarts it in place, and its cell says so.
    let machines = app.machines("web").await;
    let victim = machines.iter().find(|m| m["engine"] == "a").context("a machine on engine a")?;
    let (name, id) = (victim["name"].as_str().unwrap_or_default(), victim["container_id"].as_str().unwrap_or_default());
    let engine_a = app.state.engines.set.get("a").context("engine a")?;
    engine_a.simulation().context("engine a is simulated")?.change(id, |c| {
        c.state = drover::runtime::ContainerState::Exited;
        c.exit_code = Some(137);
        c.oom_killed = true;
        c.finished_at = Some(chrono::Utc::now());
    });
    let note = s
        .wait_until(
            "the OOM-killed machine restarted, with its exit code and restart count",
            &format!(
                "const c = document.querySelector('[data-testid=machine-cell][data-machine=\"{name}\"]'); \
                 const n = c && c.querySelector('.mnote'); \
                 return n && c.dataset.state === 'ready' && n.textContent.includes('\\u21bb1') && c.getAttribute('aria-label')"
            ),
        )
        .await?;
    ensure!(
        note.as_str().is_some_and(|t| t.contains("exit code 137")
            && t.contains("lack of memory")
            && t.contains("restarted 1 time")),
        "the cell's accessible name tells the story: {note}"
    );
    // docs/dashboard.png: tall enough for the machines, the rollout and the conditions.
    s.post("/window/rect", json!({"width": 1280, "height": 1250})).await?;
    s.save_screenshot("ui-screenshot.png").await?;
    s.post("/window/rect", json!({"width": 1280, "height": 900})).await?;

    // Engine b goes away: its machines become unknown and, once it is given
    // up for lost, are replaced on a and local; its group, the pool's
    // conditions and the engines view say so.
    app.state.engines.set.get("b").context("engine b")?.simulation().context("engine b is simulated")?.outage(true);
    s.wait_until(
        "engine b's machines unknown and its group unreachable",
        &format!(
            "const g = document.querySelector('[data-testid=engine-group][data-engine=b]'); \
             return g && g.textContent.includes('engine unreachable') && {unknown} === 2",
            unknown = cells_on("b", "[data-phase=unknown]")
        ),
    )
    .await?;
    let after_loss = s
        .wait_until(
            "replacements on a and local once b is lost",
            &format!(
                "return {a} === 3 && {local} === 3 && {groups}",
                a = cells_on("a", "[data-state=ready]"),
                local = cells_on("local", "[data-state=ready]"),
                groups = GROUPS
            ),
        )
        .await?;
    ensure!(
        after_loss
            == "a: 3 machines, 3 ready|b: 0 machines, 0 ready, 2 given up for lost · engine unreachable|\
                       local: 3 machines, 3 ready",
        "machines by engine after the loss: {after_loss}"
    );
    s.wait_until(
        "the pool's conditions turned",
        "const c = (t) => document.querySelector(`[data-testid=condition][data-type=${t}]`); \
         return c('RuntimeAvailable').dataset.status === 'False' && c('MachinesHealthy').dataset.status === 'False' \
           && c('MachinesHealthy').textContent.includes('EngineLost')",
    )
    .await?;
    s.click("#nav-engines").await?;
    let rows = s
        .wait_until(
            "three engines, b unreachable with its error",
            "const rows = Array.from(document.querySelectorAll('[data-testid=engine-row]')); \
             const b = rows.find((r) => r.dataset.engine === 'b'); \
             return rows.length === 3 && b && b.dataset.reachability === 'unreachable' \
               && b.querySelector('[data-testid=engine-error]').textContent.includes('switched off') \
               && b.querySelector('[data-testid=engine-placement]').dataset.blocked === 'unreachable' \
               && b.querySelector('[data-testid=engine-placement]').textContent.includes('no: unreachable') \
               && rows.map((r) => [r.dataset.engine, r.dataset.reachability]).sort()",
        )
        .await?;
    ensure!(rows == json!([["a", "reachable"], ["b", "unreachable"], ["local", "reachable"]]), "engines: {rows}");
    let machines_on_a = s
        .script(
            "return document.querySelector('[data-testid=engine-row][data-engine=a] [data-testid=engine-machines]').textContent",
        )
        .await?;
    ensure!(
        machines_on_a.as_str().is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 2)),
        "machines on a: {machines_on_a}"
    );
    Ok(())
}

async fn sign_in(s: &Session, app: &TestApp) -> anyhow::Result<()> {
    s.navigate(&app.url("/ui")).await?;
    s.wait_until("the sign-in form", "return !document.getElementById('login').hidden").await?;
    s.type_into("#token", &app.admin_token).await?;
    s.click("#login-submit").await?;
    s.wait_until("the pools view", "return !document.getElementById('view-pools').hidden").await?;
    Ok(())
}

async fn upgrade_scenario(s: &Session, app: &TestApp, id: i64) -> anyhow::Result<()> {
    sign_in(s, app).await?;
    s.click("#nav-upgrades").await?;
    s.wait_until("the job's row", &format!("return document.querySelector('a[href=\"#/upgrades/{id}\"]') !== null"))
        .await?;
    s.click(&format!("a[href=\"#/upgrades/{id}\"]")).await?;
    let components = s
        .wait_until(
            "three components with eight steps each",
            "return document.querySelectorAll('[data-testid=upgrade-component]').length === 3 \
             && document.querySelectorAll('[data-testid=upgrade-step]').length === 24 \
             && Array.from(document.querySelectorAll('[data-testid=upgrade-component]')).map(c => c.dataset.component)",
        )
        .await?;
    ensure!(
        components == json!(["kube-apiserver", "kube-controller-manager", "kube-scheduler"]),
        "components in order: {components}"
    );
    let summary = s.script("return document.getElementById('upgrade-summary').textContent").await?;
    ensure!(summary.as_str().is_some_and(|t| t.contains("succeeded")), "job summary: {summary}");
    ensure!(summary.as_str().is_some_and(|t| t.contains("Driven by—")), "an ended job has no driver: {summary}");
    Ok(())
}

async fn scale_scenario(s: &Session, app: &TestApp) -> anyhow::Result<()> {
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

/// Opting out of the browser tests (README.md, "Tests").
const SKIP_BROWSER: &str = "DROVER_SKIP_BROWSER_TESTS";

/// Chromium and chromedriver, or a failure with the reason
/// (`scripts/test.sh` installs them). A test that needs them carries
/// `#[cfg_attr(skip_browser_tests, ignore = ...)]` (`build.rs` sets the cfg
/// when [`SKIP_BROWSER`] is set), so an opted-out run lists it as ignored;
/// `opt_outs.rs` checks that every such test does.
fn browser_binaries() -> (PathBuf, PathBuf) {
    let chromium = ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|n| in_path(n));
    match (chromium, in_path("chromedriver")) {
        (Some(c), Some(d)) => (c, d),
        (chromium, driver) => panic!(
            "this test needs chromium and chromedriver (found chromium: {chromium:?}, chromedriver: {driver:?}; \
             Debian: chromium chromium-driver, which scripts/test.sh installs); set {SKIP_BROWSER}=1 to list \
             the browser tests as ignored"
        ),
    }
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// A headless browser for one test: chromedriver and one session.
pub(crate) struct Browser {
    driver: Driver,
    pub(crate) session: Session,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session; fails the test
    /// with the reason when either cannot start.
    pub(crate) async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// [`Browser::start`] with more Chromium arguments.
    pub(crate) async fn start_with(extra_args: &[&str]) -> Self {
        let (chromium, chromedriver) = browser_binaries();
        let driver = Driver::start(&chromedriver).await.unwrap_or_else(|e| panic!("starting chromedriver: {e:#}"));
        let session = Session::new(&driver, &chromium, extra_args)
            .await
            .unwrap_or_else(|e| panic!("starting a headless Chromium session: {e:#}"));
        Browser { driver, session }
    }

    /// Saves a screenshot as `target/<file>`, ends the browser, then fails
    /// the test if the scenario did; so no Chromium outlives a failure.
    pub(crate) async fn finish(self, outcome: Result<anyhow::Result<()>, tokio::time::error::Elapsed>, file: &str) {
        if let Err(e) = self.session.save_screenshot(file).await {
            eprintln!("no screenshot: {e:#}");
        }
        self.session.delete().await;
        drop(self.driver);
        match outcome {
            Err(_) => panic!("the browser scenario took over {SCENARIO_LIMIT:?}: the page never reached a state"),
            Ok(Err(e)) => panic!("browser scenario failed: {e:#}"),
            Ok(Ok(())) => {}
        }
    }
}

/// A chromedriver on a free loopback port; dropping it ends it and the
/// browsers it started.
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
        // chromedriver's own shutdown closes the browsers it started; then
        // end chromedriver itself by its pid (never a process group or a
        // name: only what this test started).
        let _ = self.shutdown();
        for _ in 0..30 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// `GET /shutdown`, synchronously (this runs in `drop`).
    fn shutdown(&self) -> std::io::Result<()> {
        use std::io::{Read as _, Write as _};
        let addr = self.url.trim_start_matches("http://");
        let addr: std::net::SocketAddr = addr.parse().map_err(std::io::Error::other)?;
        let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(format!("GET /shutdown HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
        let mut sink = Vec::new();
        let _ = conn.read_to_end(&mut sink);
        Ok(())
    }
}

/// One browser session.
pub(crate) struct Session {
    base: String,
    http: reqwest::Client,
}

const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Session {
    async fn new(driver: &Driver, chromium: &Path, extra_args: &[&str]) -> anyhow::Result<Self> {
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ];
        args.extend_from_slice(extra_args);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.display().to_string(), "args": args},
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

    pub(crate) async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    async fn find(&self, css: &str) -> anyhow::Result<String> {
        let found = self.post("/element", json!({"using": "css selector", "value": css})).await?;
        found[ELEMENT_KEY].as_str().map(str::to_owned).ok_or_else(|| anyhow!("no element for {css}: {found}"))
    }

    pub(crate) async fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/click"), json!({})).await.map(drop)
    }

    async fn clear(&self, css: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/clear"), json!({})).await.map(drop)
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let id = self.find(css).await?;
        self.post(&format!("/element/{id}/value"), json!({ "text": text })).await.map(drop)
    }

    pub(crate) async fn script(&self, source: &str) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({"script": source, "args": []})).await
    }

    /// Runs `source`, which calls its last argument with the result.
    pub(crate) async fn script_async(&self, source: &str) -> anyhow::Result<Value> {
        self.script_async_with(source, json!([])).await
    }

    /// Runs `source` with `args` (a JSON array, as `arguments[0..]`).
    pub(crate) async fn script_async_with(&self, source: &str, args: Value) -> anyhow::Result<Value> {
        self.post("/execute/async", json!({"script": source, "args": args})).await
    }

    /// Polls `condition` (a script body) every 200 ms for up to 20 s until
    /// it returns something truthy, and returns that.
    pub(crate) async fn wait_until(&self, what: &str, condition: &str) -> anyhow::Result<Value> {
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

    /// Saves what the browser shows as `target/<file>` (docs/dashboard.png
    /// is `target/ui-screenshot.png`).
    async fn save_screenshot(&self, file: &str) -> anyhow::Result<()> {
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        let b64 = b64.as_str().ok_or_else(|| anyhow!("screenshot is not a string"))?;
        let png = base64::engine::general_purpose::STANDARD.decode(b64)?;
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join(file);
        std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("dashboard screenshot: {}", path.display());
        Ok(())
    }

    async fn delete(&self) {
        if let Err(e) = self.call(reqwest::Method::DELETE, "", None).await {
            eprintln!("could not end the WebDriver session: {e:#}");
        }
    }
}
