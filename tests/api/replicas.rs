//! Several drover replicas on one PostgreSQL store: real processes of the
//! real binary, a real PostgreSQL (`tests/support/postgres.rs`), the
//! simulated runtime and the real Docker engine. The faults are real too:
//! SIGKILL, SIGSTOP/SIGCONT, the database server stopped and started, and
//! the network between a replica and the database cut by a proxy the test
//! controls.
//!
//! Leases last 3 s here (15 s by default), so that a takeover takes
//! seconds; the rules are the same at any duration.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;

use crate::docker::{self, Cleanup, EventLog, V1, V2, require_docker};
use crate::helpers::{admin_token, client_with_token, unique, wait_for};
use crate::postgres::{self, PgServer};
use crate::process::Process;

const LEASE: &str = "3s";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const LIMIT: Duration = Duration::from_secs(120);

/// One drover process of a group sharing a store.
struct Replica {
    proc: Process,
    dir: TempDir,
    /// Its own way to the Docker engine, which records what it asked.
    docker: Option<Arc<DockerProxy>>,
}

impl Replica {
    /// `drover serve` on `database_url`, with its own data directory, on
    /// the simulated runtime or (with `docker`) the Docker engine through
    /// a recording proxy.
    async fn start(database_url: &str, docker: bool, extra: &[&str]) -> Replica {
        let dir = TempDir::new().expect("temporary directory");
        let proxy = if docker { Some(DockerProxy::start(dir.path().join("docker.sock")).await) } else { None };
        let mut args: Vec<String> =
            ["--database-url", database_url, "--lease-duration", LEASE, "--resync-interval", "2s"]
                .map(str::to_owned)
                .to_vec();
        match &proxy {
            Some(p) => args.extend(["--docker-host".to_owned(), format!("unix://{}", p.path.display())]),
            None => args.extend(["--runtime".to_owned(), "simulated".to_owned()]),
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proc = Process::spawn_with(dir.path(), &args);
        proc.wait_up().await;
        Replica { proc, dir, docker: proxy }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.proc.addr)
    }

    /// Whether `driver` (a pool's `status.driver`) names this process.
    fn is(&self, driver: &Value) -> bool {
        driver.as_str().is_some_and(|d| d.contains(&format!("-{}-", self.proc.pid())))
    }
}

/// The admin token, written by whichever replica started first.
fn token(replicas: &[&Replica]) -> String {
    replicas
        .iter()
        .find(|r| r.dir.path().join("admin.token").exists())
        .map(|r| admin_token(r.dir.path()))
        .expect("one replica wrote the admin token")
}

/// A fresh database on the shared test server.
fn database() -> String {
    postgres::shared().fresh_database()
}

/// Pool leases held now by each replica, as any replica's `/metrics` says.
async fn leases_held(client: &reqwest::Client, r: &Replica) -> HashMap<String, f64> {
    let text = client.get(r.url("/metrics")).send().await.expect("metrics").text().await.expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with("drover_leases_held{"))
        .filter_map(|l| {
            let replica = l.split("replica=\"").nth(1)?.split('"').next()?.to_owned();
            Some((replica, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// `count` pool names starting with `prefix`, half of which `b` is to
/// drive (answered second) and the rest `a`, chosen by the same rendezvous
/// hash the replicas use once both are alive: left to chance, six pools
/// all land on one replica once in 64 runs.
async fn names_split(
    client: &reqwest::Client,
    a: &Replica,
    b: &Replica,
    prefix: &str,
    count: usize,
) -> (Vec<String>, Vec<String>) {
    let mut alive = Vec::new();
    wait_for(LIMIT, "both replicas alive on the store", async || {
        alive = leases_held(client, a).await.into_keys().collect();
        alive.len() == 2
    })
    .await;
    let id_of = |r: &Replica| alive.iter().find(|id| r.is(&json!(id))).cloned();
    let (Some(_), Some(id_b)) = (id_of(a), id_of(b)) else { panic!("the replicas alive are a and b: {alive:?}") };
    let (mut of_a, mut of_b) = (Vec::new(), Vec::new());
    for i in 0..1000 {
        let name = unique(&format!("{prefix}{i}"));
        let (side, wanted) = if drover::replicas::owner(&alive, &name) == Some(id_b.as_str()) {
            (&mut of_b, count / 2)
        } else {
            (&mut of_a, count - count / 2)
        };
        if side.len() < wanted {
            side.push(name);
        }
    }
    assert_eq!(of_a.len() + of_b.len(), count, "a thousand names hold {count} split between {alive:?}");
    let all = of_a.iter().chain(&of_b).cloned().collect();
    (all, of_b)
}

/// Creates a pool of one machine per name through `a`, and waits until
/// each machine is ready and the pools of `of_b` are driven by `b`, the
/// others by `a`.
async fn create_ready(client: &reqwest::Client, a: &Replica, b: &Replica, names: &[String], of_b: &[String]) {
    for n in names {
        let spec = json!({"name": n, "replicas": 1, "version": V1});
        assert_eq!(client.post(a.url("/v1/pools")).json(&spec).send().await.unwrap().status(), StatusCode::CREATED);
    }
    for n in names {
        let driver = if of_b.contains(n) { b } else { a };
        a.proc
            .wait_pool(client, n, LIMIT, "one machine, driven by its replica", |p| {
                p["status"]["ready_replicas"] == 1 && driver.is(&p["status"]["driver"])
            })
            .await;
    }
}

fn patch(client: &reqwest::Client, url: String, body: Value) -> reqwest::RequestBuilder {
    client.patch(url).header("content-type", "application/merge-patch+json").body(body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_300_pools_and_every_replica_serves_the_whole_api() {
    let db = database();
    let a = Replica::start(&db, false, &[]).await;
    let b = Replica::start(&db, false, &[]).await;
    let c = Replica::start(&db, false, &[]).await;
    let client = client_with_token(&token(&[&a, &b, &c]));
    let all = [&a, &b, &c];
    for i in 0..300 {
        let r = all[i % 3];
        let body = json!({"name": format!("p{i:03}"), "replicas": 0, "version": "v1.29.2"});
        let res = client.post(r.url("/v1/pools")).json(&body).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    wait_for(LIMIT, "every pool leased", async || leases_held(&client, &b).await.values().sum::<f64>() == 300.0).await;
    let held = leases_held(&client, &c).await;
    assert_eq!(held.len(), 3, "every replica holds some: {held:?}");
    assert!(held.values().all(|&n| n <= 150.0), "none drives more than half: {held:?}");

    // A retry of a keyed create that lands on another replica gets the
    // first answer, and a stale If-Match is refused by any replica.
    let body = json!({"name": "keyed", "replicas": 0, "version": "v1.29.2"});
    let first = client.post(a.url("/v1/pools")).header("idempotency-key", "k1").json(&body).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let retry = client.post(b.url("/v1/pools")).header("idempotency-key", "k1").json(&body).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "the replayed answer");
    assert_eq!(retry.json::<Value>().await.unwrap()["created_at"], first["created_at"]);
    let etag = client.get(c.url("/v1/pools/keyed")).send().await.unwrap().headers()["etag"].clone();
    let res = patch(&client, a.url("/v1/pools/keyed"), json!({"replicas": 1})).header("if-match", etag.clone());
    assert_eq!(res.send().await.unwrap().status(), StatusCode::OK);
    let stale = patch(&client, b.url("/v1/pools/keyed"), json!({"replicas": 2})).header("if-match", etag);
    assert_eq!(stale.send().await.unwrap().status(), StatusCode::PRECONDITION_FAILED);

    // A change made through one replica reaches another's event stream at
    // once, not at its next keep-alive (15 s).
    let mut stream = client.get(c.url("/v1/pools/p007/stream")).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let changed = Instant::now();
    let res = patch(&client, a.url("/v1/pools/p007"), json!({"paused": true})).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut seen = String::new();
    while !seen.contains("\"paused\":true") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
            .await
            .expect("the change reached the other replica's stream within 5 s")
            .unwrap()
            .expect("the stream is open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    eprintln!("a change on one replica reached another's stream in {:?}", changed.elapsed());
    drop(stream);

    // One replica stops (SIGTERM): it hands its leases over as it goes, and
    // the other two drive every pool.
    let stopped = c.proc.pid();
    c.proc.signal(libc::SIGTERM);
    wait_for(LIMIT, "the two left drive all 301 pools", async || {
        let held = leases_held(&client, &a).await;
        held.len() == 2 && held.values().sum::<f64>() == 301.0
    })
    .await;
    assert!(!leases_held(&client, &b).await.keys().any(|r| r.contains(&format!("-{stopped}-"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn sigkill_of_the_replica_driving_a_50_machine_rollout_another_finishes_it_exactly() {
    require_docker();
    let name = unique("ha-roll");
    let _cleanup = Cleanup(vec![name.clone()]);
    let d = docker::client().await;
    let db = database();
    let a = Replica::start(&db, true, &[]).await;
    let b = Replica::start(&db, true, &[]).await;
    let client = client_with_token(&token(&[&a, &b]));
    // The strict surge: a stopping machine counts until it is gone, so the
    // engine never holds more than 55 containers, whoever drives the pool.
    let strategy = json!({"max_surge": 5, "max_unavailable": 0, "replacement": "termination_complete"});
    let spec = json!({"name": name, "replicas": 50, "version": V1, "strategy": strategy});
    assert_eq!(client.post(a.url("/v1/pools")).json(&spec).send().await.unwrap().status(), StatusCode::CREATED);
    a.proc
        .wait_pool(&client, &name, LIMIT, "50 machines on the first image", |p| {
            p["status"]["ready_replicas"] == 50 && p["status"]["updated_replicas"] == 50
        })
        .await;
    let events = EventLog::start(&d, &name);
    let res = patch(&client, a.url(&format!("/v1/pools/{name}")), json!({"version": V2})).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let p = a
        .proc
        .wait_pool(&client, &name, LIMIT, "the rollout under way", |p| {
            p["status"]["updated_replicas"].as_u64() >= Some(10)
        })
        .await;
    let (driver, survivor) = if a.is(&p["status"]["driver"]) { (a, b) } else { (b, a) };
    assert!(survivor.proc.pid() != driver.proc.pid());
    let killed = Instant::now();
    driver.proc.kill();
    drop(driver.dir);

    let p = survivor
        .proc
        .wait_pool(&client, &name, LIMIT, "the other replica to finish the rollout", |p| {
            let s = &p["status"];
            s["replicas"] == 50
                && s["ready_replicas"] == 50
                && s["updated_replicas"] == 50
                && s["terminating_replicas"] == 0
                && s["observed_generation"] == p["generation"]
        })
        .await;
    eprintln!("rollout finished {:?} after the driver's SIGKILL", killed.elapsed());
    assert!(survivor.is(&p["status"]["driver"]), "the survivor drives the pool: {}", p["status"]["driver"]);
    survivor.proc.wait_pass_after_now(&client, LIMIT, "a pass after convergence, which would show a duplicate").await;

    let seen = docker::pool_containers(&d, &name).await;
    assert_eq!(seen.len(), 50, "no duplicate and no orphan container");
    assert!(seen.iter().all(|c| c.image == format!("kindest/node:{V2}") && c.running), "{seen:#?}");
    let recorded = survivor.proc.machine_names(&client, &name).await;
    assert_eq!(recorded, seen.iter().map(|c| c.name.clone()).collect::<HashSet<_>>(), "records mirror the containers");
    let peak = events.peak_existing(50);
    assert!(peak <= 55, "the surge bound (50 + 5) held across the takeover: {peak} containers at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_replica_paused_past_its_leases_changes_nothing_when_it_resumes() {
    require_docker();
    // Declared before the replicas, so dropped after them: swept while a
    // replica still runs, a pool's machines would be created again.
    let mut cleanup = Cleanup(Vec::new());
    let d = docker::client().await;
    let db = database();
    let a = Replica::start(&db, true, &[]).await;
    // One engine operation of b at a time, so that the test can tell when
    // none is between its lease check and the engine (below).
    let mut b = Replica::start(&db, true, &["--max-parallel", "1"]).await;
    let client = client_with_token(&token(&[&a, &b]));
    let (names, of_b) = names_split(&client, &a, &b, "ha-stop", 6).await;
    cleanup.0.clone_from(&names);
    create_ready(&client, &a, &b, &names, &of_b).await;
    let logs: Vec<EventLog> = of_b.iter().map(|n| EventLog::start(&d, n)).collect();
    let mut first = HashMap::new();
    for n in &of_b {
        let names: HashSet<String> = docker::pool_containers(&d, n).await.into_iter().map(|c| c.name).collect();
        first.insert(n.clone(), names);
    }

    // Work for b in flight as it stops: each of its pools scales to 3.
    // b's first create is held at the engine's door, so b freezes with
    // that one operation sent (its lease was valid when it checked) and
    // every other one queued for b's single engine slot, before its check.
    // A process frozen between a check and the write that follows cannot
    // be told apart from one whose request is slow on the wire; what
    // fencing promises is that nothing is *started* on a lease gone.
    let docker_b = b.docker.clone().expect("b's Docker proxy");
    docker_b.hold(true);
    let before = docker_b.requests().len();
    for n in &of_b {
        let res = patch(&client, a.url(&format!("/v1/pools/{n}")), json!({"replicas": 3})).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    wait_for(LIMIT, "b to send its first create", async || docker_b.requests()[before..].iter().any(Request::changes))
        .await;
    b.proc.signal(libc::SIGSTOP);
    docker_b.hold(false);
    // Twice the lease: the fault itself (b is paused for it), not a wait for something.
    tokio::time::sleep(2 * LEASE_DURATION).await;
    for n in &of_b {
        a.proc
            .wait_pool(&client, n, LIMIT, "the live replica to take over and scale to 3", |p| {
                a.is(&p["status"]["driver"]) && p["status"]["ready_replicas"] == 3 && p["status"]["replicas"] == 3
            })
            .await;
    }
    let resumed_at = docker_b.requests().len();
    b.proc.signal(libc::SIGCONT);
    // b runs again for two leases' time: whatever it had in flight wakes up
    // now and must find its leases gone.
    crate::helpers::hold_for(2 * LEASE_DURATION, "b asks the engine for no change after it resumed", async || {
        let changes: Vec<String> =
            docker_b.requests()[resumed_at..].iter().filter(|r| r.changes()).map(|r| r.to_string()).collect();
        if changes.is_empty() { Ok(()) } else { Err(format!("b sent {changes:?}")) }
    })
    .await;
    assert!(b.proc.is_running(), "b resumed and runs on; it only stopped acting");
    for (n, log) in of_b.iter().zip(&logs) {
        let containers = docker::pool_containers(&d, n).await;
        assert_eq!(containers.len(), 3, "{n}: exactly the 3 machines asked for");
        let created: Vec<String> = log.created().into_iter().filter(|c| !first[n].contains(c)).collect();
        assert_eq!(created.len(), 2, "{n}: the engine created 2 containers, not one more: {created:?}");
        assert!(containers.iter().all(|c| c.running), "{n}: the one b created is started by a: {containers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_replicas_recover_by_themselves_and_nothing_is_lost() {
    let server = PgServer::start_new().unwrap_or_else(|e| panic!("{e}"));
    let db = server.fresh_database();
    let a = Replica::start(&db, false, &[]).await;
    let b = Replica::start(&db, false, &[]).await;
    let client = client_with_token(&token(&[&a, &b]));
    let (pid_a, pid_b) = (a.proc.pid(), b.proc.pid());

    let load = Load::start(client.clone(), vec![a.url(""), b.url("")]);
    tokio::time::sleep(Duration::from_secs(2)).await; // load before the fault
    let down = Instant::now();
    tokio::task::block_in_place(|| server.stop());
    // The outage itself: 3 s without a database.
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| server.start());
    let up = Instant::now();
    let outage = up - down;
    tokio::time::sleep(outage + Duration::from_secs(4)).await; // load after the fault
    let answers = load.stop().await;

    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status >= 500).collect();
    eprintln!("{} requests, {} answered 5xx during a {outage:?} outage", answers.len(), failed.len());
    assert!(answers.iter().filter(|a| a.at > up + outage).count() > 20, "the load went on after the outage");
    for f in &failed {
        assert!(f.at >= down && f.at <= up + outage, "a 5xx outside the outage and a recovery as long: {f:?}");
        assert_eq!(f.status, 503, "the store being away is a 503 (with Retry-After), never a 500: {f:?}");
    }
    assert!((a.proc.pid(), b.proc.pid()) == (pid_a, pid_b));
    let (mut a, mut b) = (a, b);
    assert!(a.proc.is_running() && b.proc.is_running(), "neither replica had to be restarted");
    // Every create that was answered 201 is there, on either replica.
    for created in answers.iter().filter(|x| x.status == 201) {
        let name = created.pool.as_deref().expect("a create names its pool");
        for r in [&a, &b] {
            let res = client.get(r.url(&format!("/v1/pools/{name}"))).send().await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{name}, acknowledged at {:?}, is kept", created.at);
        }
    }
    // Both drive pools again, and every pool is driven.
    let list: Value = client.get(a.url("/v1/pools?limit=500")).send().await.unwrap().json().await.unwrap();
    assert!(list["next_cursor"].is_null(), "one page holds every pool");
    let pools = list["items"].as_array().map_or(0, Vec::len) as f64;
    wait_for(LIMIT, "every pool leased again after the restart", async || {
        let held = leases_held(&client, &a).await;
        held.len() == 2 && held.values().sum::<f64>() == pools
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_replica_cut_off_from_postgres_stops_acting_within_the_lease() {
    require_docker();
    // Declared before the replicas, so dropped after them: swept while a
    // replica still runs, a pool's machines would be created again.
    let mut cleanup = Cleanup(Vec::new());
    let d = docker::client().await;
    let db = database();
    let proxy = TcpProxy::start(postgres::shared().port()).await;
    let through_proxy = db.replace(&format!(":{}/", postgres::shared().port()), &format!(":{}/", proxy.port));
    let a = Replica::start(&db, true, &[]).await;
    let b = Replica::start(&through_proxy, true, &[]).await;
    let client = client_with_token(&token(&[&a, &b]));
    let (names, of_b) = names_split(&client, &a, &b, "ha-cut", 6).await;
    cleanup.0.clone_from(&names);
    create_ready(&client, &a, &b, &names, &of_b).await;

    let cut = Instant::now();
    proxy.cut();
    let docker_b = b.docker.as_ref().expect("b's Docker proxy");
    // From one lease after the cut, b must not act: its machines are
    // removed behind its back, and only a may replace them.
    tokio::time::sleep(LEASE_DURATION).await; // the bound under test
    let after_lease = docker_b.requests().len();
    for n in &of_b {
        for c in docker::pool_containers(&d, n).await {
            crate::images::docker(&["rm", "-f", &c.name]);
        }
    }
    for n in &of_b {
        a.proc
            .wait_pool(&client, n, LIMIT, "the other replica to replace the removed machine", |p| {
                a.is(&p["status"]["driver"]) && p["status"]["ready_replicas"] == 1
            })
            .await;
    }
    let changes: Vec<String> =
        docker_b.requests()[after_lease..].iter().filter(|r| r.changes()).map(|r| r.to_string()).collect();
    assert!(changes.is_empty(), "b acted {:?} after the cut: {changes:?}", cut.elapsed());
    let ready = reqwest::get(b.url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE, "b says it cannot reach its store");
    let mut b = b;
    assert!(b.proc.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_store_setting_stops_the_start_naming_the_setting_and_changes_nothing() {
    let refused = async |url: &str| -> String {
        let dir = TempDir::new().unwrap();
        let mut proc = Process::spawn_with(dir.path(), &["--runtime", "simulated", "--database-url", url]);
        let status = proc.wait_exit(Duration::from_secs(30)).await.expect("drover exits");
        assert!(!status.success(), "{url}: exit {status:?}");
        let out = proc.output();
        assert!(!out.contains("panicked"), "{url}: {out}");
        assert!(out.contains("--database-url"), "{url}: the message names the setting: {out}");
        out
    };
    assert!(refused("mysql://db/drover").await.contains("sqlite:// or postgres://"));
    assert!(refused("postgres://drover@db:notaport/x").await.contains("not a PostgreSQL URL"));
    let unreachable = refused("postgres://drover:s3cret@127.0.0.1:1/drover").await;
    assert!(unreachable.contains("cannot connect") && !unreachable.contains("s3cret"), "{unreachable}");

    // A database a newer drover migrated: refused, untouched.
    let url = database();
    drop(Replica::start(&url, false, &[]).await);
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.unwrap();
    sqlx::query(
        "insert into _sqlx_migrations (version, description, installed_on, success, checksum, execution_time)
         values (99, 'from a newer drover', now(), true, '\\x00', 0)",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let rows = "select (select count(*) from _sqlx_migrations) * 1000 + (select count(*) from replicas)";
    let before: i64 = sqlx::query_scalar(rows).fetch_one(&mut db).await.unwrap();
    let newer = refused(&url).await;
    assert!(newer.contains("migration 99") && newer.contains("Nothing was changed"), "{newer}");
    let after: i64 = sqlx::query_scalar(rows).fetch_one(&mut db).await.unwrap();
    assert_eq!(before, after, "no migration applied, no replica registered");
}

// ---- fault machinery ----------------------------------------------------

/// One request the Docker proxy forwarded.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
}

impl Request {
    /// Whether it changes a container (create, start, stop, kill, remove...).
    fn changes(&self) -> bool {
        self.method != "GET" && self.method != "HEAD" && self.path.contains("/containers")
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// A Unix socket forwarding to the Docker engine's, recording the request
/// line of every request one replica sends: which replica asked the engine
/// for what, which the engine's own event log cannot say.
struct DockerProxy {
    path: PathBuf,
    seen: Arc<Mutex<Vec<Request>>>,
    /// While true, a request that changes a container is recorded but not
    /// passed on: its sender waits for the answer.
    held: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl DockerProxy {
    async fn start(path: PathBuf) -> Arc<DockerProxy> {
        let listener = UnixListener::bind(&path).expect("binding the Docker proxy");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let held = tokio::sync::watch::Sender::new(false);
        let hold = held.subscribe();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (log, hold) = (log.clone(), hold.clone());
                tokio::spawn(async move {
                    if let Ok(engine) = UnixStream::connect("/var/run/docker.sock").await {
                        relay_recording(client, engine, log, hold).await;
                    }
                });
            }
        });
        Arc::new(DockerProxy { path, seen, held, task })
    }

    fn hold(&self, on: bool) {
        self.held.send_replace(on);
    }

    fn requests(&self) -> Vec<Request> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways; reads request lines out of what the client sends.
async fn relay_recording(
    client: UnixStream,
    engine: UnixStream,
    log: Arc<Mutex<Vec<Request>>>,
    mut hold: tokio::sync::watch::Receiver<bool>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut engine_rx, mut engine_tx) = engine.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending = Vec::new();
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            if record_requests(&mut pending, &log) && hold.wait_for(|held| !*held).await.is_err() {
                break;
            }
            if engine_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = engine_tx.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut engine_rx, &mut client_tx).await;
        let _ = client_tx.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Takes every complete `METHOD /path HTTP/1.1` line out of `pending`;
/// answers whether one of them changes a container.
fn record_requests(pending: &mut Vec<u8>, log: &Mutex<Vec<Request>>) -> bool {
    let mut changes = false;
    let text = String::from_utf8_lossy(pending).into_owned();
    let mut consumed = 0;
    for (at, _) in text.match_indices(" HTTP/1.1\r\n") {
        // The request line starts at its method, which may follow the
        // previous request's body directly (no line break in between).
        let before = &text[consumed..at];
        let start = ["GET /", "HEAD /", "POST /", "PUT /", "DELETE /"].iter().filter_map(|m| before.rfind(m)).max();
        if let Some(start) = start
            && let Some((method, path)) = before[start..].split_once(' ')
            && let Ok(mut log) = log.lock()
        {
            let request = Request { method: method.to_owned(), path: path.to_owned() };
            changes |= request.changes();
            log.push(request);
        }
        consumed = at + " HTTP/1.1\r\n".len();
    }
    // Keep only an unfinished tail (bounded: bodies are not request lines).
    let rest = &pending[consumed.min(pending.len())..];
    let keep = rest.len().min(4096);
    *pending = rest[rest.len() - keep..].to_vec();
    changes
}

/// A TCP proxy to the database that the test can cut: open connections
/// are dropped and new ones closed at once, as a network partition would.
struct TcpProxy {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    async fn start(target: u16) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the database proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (is_cut, open) = (cut.clone(), conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if is_cut.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut db) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut db).await;
                    }
                });
                if let Ok(mut open) = open.lock() {
                    open.push(conn);
                }
            }
        });
        TcpProxy { port, cut, conns, task }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut open) = self.conns.lock() {
            open.drain(..).for_each(|c| c.abort());
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

/// One answer of the load.
#[derive(Debug)]
struct Answer {
    at: Instant,
    status: u16,
    /// The pool a create named.
    pool: Option<String>,
}

/// Requests to every replica in turn, reads and creates, until stopped
/// (at most 60 s and 20,000 requests).
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Answer>>,
}

impl Load {
    fn start(client: reqwest::Client, bases: Vec<String>) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut answers = Vec::new();
            let started = Instant::now();
            for i in 0..20_000usize {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) || started.elapsed() > Duration::from_secs(60) {
                    break;
                }
                let base = &bases[i % bases.len()];
                let (req, pool) = if i % 3 == 0 {
                    let name = format!("load-{i}");
                    let body = json!({"name": name, "replicas": 1, "version": "v1.29.2"});
                    (client.post(format!("{base}/v1/pools")).json(&body), Some(name))
                } else {
                    (client.get(format!("{base}/v1/pools?limit=20")), None)
                };
                let status = match req.timeout(Duration::from_secs(15)).send().await {
                    Ok(res) => res.status().as_u16(),
                    // No answer at all: counted as a failure too.
                    Err(_) => 599,
                };
                answers.push(Answer { at: Instant::now(), status, pool });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        });
        Load { stop, task }
    }

    async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("the load task")
    }
}

#[test]
fn request_lines_are_read_out_of_a_byte_stream_split_anywhere() {
    let log = Mutex::new(Vec::new());
    let stream = b"POST /v1.47/containers/create?name=x HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}GET /v1.47/containers/json HTTP/1.1\r\n\r\nDELETE /v1.47/containers/abc?force=true HTTP/1.1\r\n\r\n";
    let mut pending = Vec::new();
    for chunk in stream.chunks(7) {
        pending.extend_from_slice(chunk);
        record_requests(&mut pending, &log);
    }
    let seen: Vec<String> = log.lock().unwrap().iter().map(|r| r.to_string()).collect();
    assert_eq!(
        seen,
        [
            "POST /v1.47/containers/create?name=x",
            "GET /v1.47/containers/json",
            "DELETE /v1.47/containers/abc?force=true"
        ]
    );
    let changes: Vec<bool> = log.lock().unwrap().iter().map(Request::changes).collect();
    assert_eq!(changes, [true, false, true]);
}
