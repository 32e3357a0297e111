//! Several drover replicas on one PostgreSQL store: real processes of the
//! real binary, a real PostgreSQL (`tests/support/postgres.rs`), the
//! simulated runtime and the real Docker engine. The faults are real too:
//! SIGKILL, SIGSTOP/SIGCONT, the database server stopped and started, and
//! the network between a replica and the database cut by a proxy the test
//! controls. The rig (replicas, proxies, the store's write log) is
//! `rig.rs`, shared with the chaos test.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::time::Instant;

use crate::docker::{self, Cleanup, EventLog, V1, V2, require_docker};
use crate::helpers::{client_with_token, unique, wait_for};
use crate::postgres::{self, PgServer};
use crate::process::Process;
use crate::rig::{
    LEASE_DURATION, LIMIT, Replica, Request, TcpProxy, Write, WriteLog, create_ready, database, leases_held,
    names_split, patch, token,
};

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

    // While nothing changes, keeping the leases writes the replicas' rows,
    // never the pools' (docs/ha.md, "Ownership"): over three leases' time
    // (nine renewals each), no pool lease row has a new version, and each
    // replica's row has.
    type Versions = Vec<(String, String)>;
    let versions = async || -> (Versions, Versions) {
        use sqlx::Connection;
        let mut store = sqlx::PgConnection::connect(&db).await.expect("the test's session to the store");
        let pools = "select namespace || '/' || name, xmin::text from leases where kind = 'pool' order by 1";
        let replicas = "select id, xmin::text from replicas order by 1";
        let pools = sqlx::query_as(pools).fetch_all(&mut store).await.expect("reading the pools' leases");
        let replicas = sqlx::query_as(replicas).fetch_all(&mut store).await.expect("reading the replicas");
        (pools, replicas)
    };
    let (pools_before, replicas_before) = versions().await;
    assert_eq!(pools_before.len(), 300);
    tokio::time::sleep(3 * LEASE_DURATION).await;
    let (pools_after, replicas_after) = versions().await;
    assert_eq!(pools_before, pools_after, "a pool's lease row was written while nothing changed");
    assert_eq!(replicas_after.len(), 3);
    for (before, after) in replicas_before.iter().zip(&replicas_after) {
        assert_ne!(before, after, "replica {} renewed its row", before.0);
    }

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

/// A periodic pass writes only what changed: over several resync intervals
/// of a converged pool, no machine row gets a new version. (PostgreSQL keeps
/// microseconds; the records read back compared unequal to the observations
/// they were written from, so every pass rewrote every machine of the fleet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_passes_over_a_converged_pool_rewrite_no_machine_row() {
    let db = database();
    let a = Replica::start(&db, false, &[]).await;
    let client = client_with_token(&token(&[&a]));
    let spec = json!({"name": "still", "replicas": 5, "version": V1});
    assert_eq!(client.post(a.url("/v1/pools")).json(&spec).send().await.unwrap().status(), StatusCode::CREATED);
    a.proc.wait_pool(&client, "still", LIMIT, "five ready machines", |p| p["status"]["ready_replicas"] == 5).await;
    let versions = async || -> Vec<(String, String)> {
        use sqlx::Connection;
        let mut store = sqlx::PgConnection::connect(&db).await.expect("the test's session to the store");
        let rows = "select name, xmin::text from machines order by 1";
        sqlx::query_as(rows).fetch_all(&mut store).await.expect("reading the machines")
    };
    let passes = async || -> f64 {
        let text = client.get(a.url("/metrics")).send().await.unwrap().text().await.unwrap();
        text.lines()
            .filter(|l| l.starts_with("drover_reconcile_passes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // Settled first: the pass after the last start may still record it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (before, passes_before) = (versions().await, passes().await);
    assert_eq!(before.len(), 5);
    tokio::time::sleep(Duration::from_secs(7)).await; // the test replicas resync every 2 s
    assert!(passes().await >= passes_before + 3.0, "periodic passes ran meanwhile");
    assert_eq!(versions().await, before, "a pass rewrote a machine row that had not changed");
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

/// What both pause tests start from: replica `b` (one engine operation at
/// a time) paused past its leases with work in flight, `a` done with that
/// work meanwhile, and `b` just resumed. Fields drop in order: the
/// replicas stop before their containers are swept.
struct PausedPastLeases {
    a: Replica,
    b: Replica,
    client: reqwest::Client,
    d: bollard::Docker,
    /// The pools b drove, and the engine's record of each from before the work.
    of_b: Vec<String>,
    logs: Vec<EventLog>,
    first: HashMap<String, HashSet<String>>,
    /// b's replica id, which its leases and its sessions carry.
    b_id: String,
    writes: WriteLog,
    /// The database's clock just before b was paused and just after it resumed.
    paused: chrono::DateTime<chrono::Utc>,
    resumed: chrono::DateTime<chrono::Utc>,
    /// How many requests b's Docker proxy had seen when b resumed.
    resumed_at: usize,
    _cleanup: Cleanup,
}

async fn pause_past_leases(prefix: &str) -> PausedPastLeases {
    // Declared before the replicas, so dropped after them: swept while a
    // replica still runs, a pool's machines would be created again.
    let mut cleanup = Cleanup(Vec::new());
    let d = docker::client().await;
    let db = database();
    let a = Replica::start(&db, true, &[]).await;
    // One engine operation of b at a time, so that the test can tell when
    // none is between its lease check and the engine (below).
    let b = Replica::start(&db, true, &["--max-parallel", "1"]).await;
    let client = client_with_token(&token(&[&a, &b]));
    let (names, of_b) = names_split(&client, &a, &b, prefix, 6).await;
    cleanup.0.clone_from(&names);
    // Once the replicas have migrated the database, before any pool exists.
    let writes = WriteLog::install(&db).await;
    let b_id = b.id(&client, &a).await;
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
    let paused = writes.now().await;
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
    let resumed = writes.now().await;
    PausedPastLeases {
        a,
        b,
        client,
        d,
        of_b,
        logs,
        first,
        b_id,
        writes,
        paused,
        resumed,
        resumed_at,
        _cleanup: cleanup,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_replica_paused_past_its_leases_changes_nothing_when_it_resumes() {
    require_docker();
    let mut s = pause_past_leases("ha-stop").await;
    let docker_b = s.b.docker.clone().expect("b's Docker proxy");
    // b runs again for two leases' time: whatever it had in flight wakes up
    // now and must find its leases gone.
    crate::helpers::hold_for(2 * LEASE_DURATION, "b asks the engine for no change after it resumed", async || {
        let changes: Vec<String> =
            docker_b.requests()[s.resumed_at..].iter().filter(|r| r.changes()).map(|r| r.to_string()).collect();
        if changes.is_empty() { Ok(()) } else { Err(format!("b sent {changes:?}")) }
    })
    .await;
    assert!(s.b.proc.is_running(), "b resumed and runs on; it only stopped acting");
    for (n, log) in s.of_b.iter().zip(&s.logs) {
        let containers = docker::pool_containers(&s.d, n).await;
        assert_eq!(containers.len(), 3, "{n}: exactly the 3 machines asked for");
        let created: Vec<String> = log.created().into_iter().filter(|c| !s.first[n].contains(c)).collect();
        assert_eq!(created.len(), 2, "{n}: the engine created 2 containers, not one more: {created:?}");
        assert!(containers.iter().all(|c| c.running), "{n}: the one b created is started by a: {containers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_replica_paused_past_its_leases_writes_nothing_to_the_store_under_them_when_it_resumes() {
    require_docker();
    let mut s = pause_past_leases("ha-fence").await;
    let of_b = |w: &Write| w.pool.as_ref().is_some_and(|p| s.of_b.contains(p));
    // The log sees b's writes at all: its passes recorded its pools'
    // machines and status under its leases before the pause.
    let before: Vec<Write> =
        s.writes.rows().await.into_iter().filter(|w| w.by(&s.b_id) && w.at < s.paused && of_b(w)).collect();
    for (table, what) in [("machines", None), ("pools", Some("status"))] {
        let logged = before.iter().any(|w| w.tbl == table && what.is_none_or(|what| w.what == what));
        assert!(logged, "b's writes of {table} before the pause are logged: {before:#?}");
    }
    assert!(before.iter().all(Write::under_own_lease), "before the pause b wrote under its leases: {before:#?}");
    let token_before =
        |pool: &str| before.iter().filter(|w| w.pool.as_deref() == Some(pool)).filter_map(|w| w.token).max();

    // b runs again for two leases' time: its pass wakes up with its create
    // answered and the machine to record; whatever it writes must be under
    // a lease it holds anew (it rejoins, and may be handed pools back).
    crate::helpers::hold_for(2 * LEASE_DURATION, "b writes nothing under the leases it lost", async || {
        let after: Vec<Write> =
            s.writes.rows().await.into_iter().filter(|w| w.by(&s.b_id) && w.at > s.resumed && of_b(w)).collect();
        let fenced: Vec<&Write> = after
            .iter()
            .filter(|w| {
                let pool = w.pool.as_deref().unwrap_or_default();
                !w.under_own_lease() || w.token <= token_before(pool)
            })
            .collect();
        if fenced.is_empty() { Ok(()) } else { Err(format!("b wrote after it resumed: {fenced:#?}")) }
    })
    .await;
    let after = s.writes.rows().await.into_iter().filter(|w| w.by(&s.b_id) && w.at > s.resumed && of_b(w)).count();
    eprintln!(
        "b wrote {} rows of its pools before the pause, {after} after it resumed (under leases taken anew)",
        before.len()
    );
    assert!(s.b.proc.is_running(), "b resumed and runs on; it only stopped acting");
    // And the store holds what a did: three machine records per pool, one
    // per container.
    for n in &s.of_b {
        let recorded = s.a.proc.machine_names(&s.client, n).await;
        let seen: HashSet<String> = docker::pool_containers(&s.d, n).await.into_iter().map(|c| c.name).collect();
        assert_eq!(recorded, seen, "{n}: the records mirror the containers");
        assert_eq!(seen.len(), 3, "{n}: exactly the 3 machines asked for");
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
    let through_proxy = proxy.url_through(&db, postgres::shared().port());
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
async fn with_the_store_down_probes_and_refusals_answer_at_once_and_the_refusal_is_audited_when_it_is_back() {
    let db = database();
    let proxy = TcpProxy::start(postgres::shared().port()).await;
    let a = Replica::start(&proxy.url_through(&db, postgres::shared().port()), false, &[]).await;
    let ready = async || reqwest::get(a.url("/readyz")).await.expect("readyz").status();
    assert_eq!(ready().await, StatusCode::OK);

    proxy.cut();
    wait_for(LIMIT, "readyz to see the store gone", async || ready().await == StatusCode::SERVICE_UNAVAILABLE).await;
    // What a load balancer's probe and a refused client meet: answers, not
    // waits on a store that does not answer (a connect is retried for 10 s).
    for _ in 0..3 {
        let asked = Instant::now();
        let res = reqwest::get(a.url("/readyz")).await.expect("readyz");
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = res.json().await.expect("readiness JSON");
        assert_eq!(body["checks"][0]["ok"], false, "{body:#}");
        assert!(asked.elapsed() < Duration::from_secs(1), "readyz waited {:?} on the store", asked.elapsed());
    }
    let asked = Instant::now();
    let path = format!("/v1/pools/{}", unique("store-down"));
    let refused = reqwest::Client::new().patch(a.url(&path)).json(&json!({"replicas": 1})).send().await.expect("PATCH");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(asked.elapsed() < Duration::from_secs(1), "the 401 waited {:?} on the audit trail", asked.elapsed());

    proxy.restore();
    let mut store = <sqlx::PgConnection as sqlx::Connection>::connect(&db).await.expect("the store");
    wait_for(LIMIT, "the refusal's audit record, once the store is back", async || {
        let rows: i64 =
            sqlx::query_scalar("select count(*) from audit where path = $1 and outcome = 'unauthenticated'")
                .bind(&path)
                .fetch_one(&mut store)
                .await
                .expect("counting audit records");
        rows == 1
    })
    .await;
    wait_for(LIMIT, "readyz to see the store back", async || ready().await == StatusCode::OK).await;
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

// ---- load ----------------------------------------------------------------

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

/// The million-machine bench (`cargo bench --bench million`) scaled down
/// to what CI affords: 3,000 pools over three replicas, created through all
/// three at once. Every pool converges, each driven by exactly one live
/// replica (its lease's holder, which its status names); after a SIGKILL
/// the two left drive every pool, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_drive_3000_pools_each_by_one_and_after_a_sigkill_the_others_drive_them_all() {
    const POOLS: usize = 3000;
    let db = database();
    let a = Replica::start(&db, false, &[]).await;
    let b = Replica::start(&db, false, &[]).await;
    let c = Replica::start(&db, false, &[]).await;
    let client = client_with_token(&token(&[&a, &b, &c]));
    let urls: Vec<String> = [&a, &b, &c].iter().map(|r| r.url("/v1/pools")).collect();
    let started = Instant::now();
    let creators = (0..8).map(|w| {
        let (client, urls) = (client.clone(), urls.clone());
        tokio::spawn(async move {
            for i in (w..POOLS).step_by(8) {
                let body = json!({"name": format!("m{i:04}"), "replicas": 1, "version": "v1.29.2"});
                let res = client.post(&urls[i % 3]).json(&body).send().await.expect("creating a pool");
                assert_eq!(res.status(), StatusCode::CREATED, "pool m{i:04}");
            }
        })
    });
    for creator in futures_util::future::join_all(creators).await {
        creator.expect("a creator finished");
    }
    eprintln!("{POOLS} pools created through three replicas in {:?}", started.elapsed());

    use sqlx::Connection;
    let mut store = sqlx::PgConnection::connect(&db).await.expect("the test's session to the store");
    // Pools whose one machine is ready; pools driven by a live replica
    // (the lease held by the holder's current incarnation), and the most
    // lease rows of any pool.
    let count = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);
    let ready = "select count(*) from machines where ready";
    let driven = "select count(*) from leases l join replicas r on r.id = l.holder and r.incarnation = l.incarnation
                  where l.kind = 'pool' and l.expires_at > now() and r.expires_at > now()";
    let drivers_of_one = "select coalesce(max(n), 0) from (select count(*) as n from leases where kind = 'pool'
                          group by namespace, name) as per_pool";
    let mut last = (0, 0);
    wait_for(LIMIT, "every pool ready and driven", async || {
        let r = count(ready).fetch_one(&mut store).await.expect("counting ready machines");
        let d = count(driven).fetch_one(&mut store).await.expect("counting driven pools");
        last = (r, d);
        r == POOLS as i64 && d == POOLS as i64
    })
    .await;
    eprintln!("ready and driven {:?} after the first create: {last:?}", started.elapsed());
    assert_eq!(count(drivers_of_one).fetch_one(&mut store).await.expect("counting"), 1, "one lease row per pool");
    let held = leases_held(&client, &a).await;
    assert_eq!(held.len(), 3, "each replica drives a share: {held:?}");
    assert_eq!(held.values().sum::<f64>(), POOLS as f64, "no pool driven twice, none undriven: {held:?}");
    // Each pool's status names the holder of its lease.
    let mismatched = "select count(*) from pools p join leases l on l.kind = 'pool'
                      and l.namespace = p.namespace and l.name = p.name
                      where (p.status::jsonb ->> 'driver') is distinct from l.holder";
    wait_for(LIMIT, "every pool's status to name its lease's holder", async || {
        count(mismatched).fetch_one(&mut store).await.expect("comparing drivers") == 0
    })
    .await;

    let killed = Instant::now();
    c.proc.signal(libc::SIGKILL);
    wait_for(LIMIT, "the two left to drive every pool", async || {
        let held = leases_held(&client, &a).await;
        held.len() == 2 && held.values().sum::<f64>() == POOLS as f64
    })
    .await;
    eprintln!("the killed replica's pools driven by the others {:?} after the SIGKILL", killed.elapsed());
    assert_eq!(count(driven).fetch_one(&mut store).await.expect("counting driven pools"), POOLS as i64);
    assert_eq!(count(drivers_of_one).fetch_one(&mut store).await.expect("counting"), 1);
    wait_for(LIMIT, "every pool's status to name its new driver", async || {
        count(mismatched).fetch_one(&mut store).await.expect("comparing drivers") == 0
    })
    .await;
}
