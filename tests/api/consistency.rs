//! Two replicas on one PostgreSQL store, as fast and as safe as one: reads
//! through one see every write the other acknowledged, the change listener
//! recovers by itself, and every check-then-act rule of the store
//! (docs/ha.md, "Invariants") holds when two replicas race it, each raced
//! 100 times. The replicas are two servers in this test process (the real
//! app, each with its own replica id, listener, leases and connections)
//! sharing a fresh database on the test server.

use std::time::Duration;

use drover::config::RuntimeKind;
use drover::db::Location;
use futures_util::future::join;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::helpers::{self, RawStore, TestApp, metric, wait_for};
use crate::kube_sim::{KubeSim, SimSettings};
use crate::postgres;

const ROUNDS: usize = 100;
const LIMIT: Duration = Duration::from_secs(30);

/// Two servers on one fresh PostgreSQL database; `b` uses the admin token
/// `a` made at its first start.
struct Pair {
    a: TestApp,
    b: TestApp,
    store: Location,
}

async fn pair() -> Pair {
    let store = Location::parse(&postgres::shared().fresh_database()).expect("a database URL");
    let start = async |store: &Location, token: Option<&str>| {
        let tmp = TempDir::new().expect("temporary directory");
        if let Some(token) = token {
            std::fs::write(tmp.path().join("admin.token"), token).expect("copying the admin token");
        }
        let mut cfg = helpers::config(tmp.path(), RuntimeKind::Simulated);
        cfg.database_url = Some(store.clone());
        cfg.lease_duration = Duration::from_secs(3);
        helpers::start(cfg, Some(tmp)).await
    };
    let a = start(&store, None).await;
    let b = start(&store, Some(&a.admin_token)).await;
    Pair { a, b, store }
}

impl Pair {
    async fn raw(&self) -> RawStore {
        RawStore::open(&self.store).await
    }
}

async fn status(req: reqwest::RequestBuilder) -> u16 {
    req.send().await.expect("the server answers").status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_acknowledged_through_one_replica_is_read_through_the_other_at_once() {
    let p = pair().await;
    p.a.create_pool_ok("web", 0, json!({})).await;
    for round in 0..ROUNDS {
        let (writer, reader) = if round % 2 == 0 { (&p.a, &p.b) } else { (&p.b, &p.a) };
        let label = round.to_string();
        let res = writer.patch_pool("web", json!({"labels": {"round": label}}), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        let written: Value = res.json().await.expect("pool JSON");
        // Three reads: the first may miss the cache, the others hit it;
        // none may be older than the acknowledged write.
        for _ in 0..3 {
            let read = reader.pool("web").await;
            assert!(
                read["generation"].as_i64() >= written["generation"].as_i64()
                    && read["labels"]["round"] == label.as_str(),
                "round {round}: read {} after the write acknowledged {}",
                read["generation"],
                written["generation"]
            );
        }
    }
    let text = p.b.metrics_text();
    let hits = metric(&text, "drover_pool_reads_total{source=\"cache\"}");
    assert!(hits >= ROUNDS as f64, "most reads were served from the cache: {hits}\n{text}");
    assert_eq!(metric(&text, "drover_change_listener_connected"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_listener_reconnects_after_its_session_is_ended_and_misses_nothing() {
    let p = pair().await;
    p.a.create_pool_ok("web", 0, json!({})).await;
    let mut stream = p.b.client.get(p.b.url("/v1/pools/web/stream")).send().await.expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);

    // b's listener is up (under load it may still be connecting).
    crate::helpers::wait_for(Duration::from_secs(20), "b's change listener to listen", async || {
        metric(&p.b.metrics_text(), "drover_change_listener_connected") == 1.0
    })
    .await;
    let mut raw = p.raw().await;
    let session = drover::db::session_name(&p.b.state.replica);
    let ended = raw
        .integer(&format!(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity
             where application_name = '{session}' and query like 'LISTEN%'"
        ))
        .await;
    assert_eq!(ended, 1, "b's listener had one session of its own");
    // At once, before the listener is back: its notice is lost with the
    // session, and must still reach b.
    let res = p.a.patch_pool("web", json!({"paused": true}), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut seen = String::new();
    let reached = tokio::time::timeout(Duration::from_secs(2), async {
        while !seen.contains("\"paused\":true") {
            match stream.chunk().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                _ => break,
            }
        }
    })
    .await;
    assert!(reached.is_ok() && seen.contains("\"paused\":true"), "b's stream saw the change within 2 s: {seen}");
    wait_for(LIMIT, "the listener connected again", async || {
        let text = p.b.metrics_text();
        metric(&text, "drover_change_listener_connections_total") == 2.0
            && metric(&text, "drover_change_listener_connected") == 1.0
    })
    .await;
    assert_eq!(p.b.pool("web").await["paused"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_revoking_each_other_through_two_replicas_always_leave_one() {
    let p = pair().await;
    let mut raw = p.raw().await;
    // An admin token made through `app` by the holder of `with`: its name
    // and a client sending it.
    let make = async |app: &TestApp, with: &reqwest::Client, name: String| -> (String, reqwest::Client) {
        let res = with.post(app.url("/v1/tokens")).json(&json!({"name": name, "role": "admin"})).send().await;
        let res = res.expect("creating a token");
        let code = res.status();
        let body: Value = res.json().await.expect("token JSON");
        assert_eq!(code, StatusCode::CREATED, "{body}");
        (name, helpers::client_with_token(body["token"].as_str().expect("the secret")))
    };
    // Only the two admins of the round are left before each round.
    let mut x = make(&p.a, &p.a.client, "x0".into()).await;
    let mut y = make(&p.a, &p.a.client, "y0".into()).await;
    assert_eq!(status(x.1.delete(p.a.url("/v1/tokens/bootstrap-admin"))).await, 204);
    for round in 0..ROUNDS {
        let x_revokes_y = x.1.delete(p.a.url(&format!("/v1/tokens/{}", y.0)));
        let y_revokes_x = y.1.delete(p.b.url(&format!("/v1/tokens/{}", x.0)));
        let (by_x, by_y) = join(status(x_revokes_y), status(y_revokes_x)).await;
        let admins = raw.integer("select count(*) from token_grants where namespace = '*' and role = 'admin'").await;
        assert_eq!(admins, 1, "round {round}: answers {by_x} and {by_y} left {admins} admins");
        assert!(
            matches!((by_x, by_y), (204, 409 | 401) | (409 | 401, 204)),
            "round {round}: exactly one revocation goes through: {by_x}, {by_y}"
        );
        // The survivor, through either replica, makes the next two and
        // leaves them alone.
        let survivor = if by_x == 204 { x } else { y };
        let app = if round % 2 == 0 { &p.b } else { &p.a };
        x = make(app, &survivor.1, format!("x{}", round + 1)).await;
        y = make(app, &survivor.1, format!("y{}", round + 1)).await;
        assert_eq!(status(x.1.delete(app.url(&format!("/v1/tokens/{}", survivor.0)))).await, 204);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_deleted_while_a_pool_naming_it_is_created_never_leaves_the_pool_without_it() {
    let p = pair().await;
    let sim = KubeSim::start(SimSettings::default()).await;
    let mut raw = p.raw().await;
    for round in 0..ROUNDS {
        let cluster = format!("c{round}");
        let res =
            p.a.client.post(p.a.url("/v1/clusters")).json(&json!({"name": cluster, "server": sim.url(), "token": "t"}));
        assert_eq!(status(res).await, 201);
        let delete = p.a.client.delete(p.a.url(&format!("/v1/clusters/{cluster}")));
        let body = json!({"name": format!("p{round}"), "replicas": 0, "version": "v1.29.2", "cluster": cluster});
        let create = p.b.client.post(p.b.url("/v1/pools")).json(&body);
        let (deleted, created) = join(status(delete), status(create)).await;
        assert!(
            matches!((deleted, created), (204, 422) | (409, 201)),
            "round {round}: exactly one of the delete ({deleted}) and the create ({created}) goes through"
        );
    }
    let orphans = raw
        .integer(
            "select count(*) from pools where spec::jsonb ->> 'cluster' is not null
             and spec::jsonb ->> 'cluster' not in (select name from clusters)",
        )
        .await;
    assert_eq!(orphans, 0, "no pool names a cluster that is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_deleted_while_an_upgrade_of_it_starts_never_loses_the_job() {
    let p = pair().await;
    for round in 0..ROUNDS {
        // A simulator of its own per round: a job that starts fails at its
        // first look once the simulator is gone, and leaves the next
        // round's cluster alone.
        let sim = KubeSim::start(SimSettings::default()).await;
        sim.seed_control_plane(crate::upgrade_env::FROM);
        let cluster = format!("u{round}");
        let res =
            p.a.client.post(p.a.url("/v1/clusters")).json(&json!({"name": cluster, "server": sim.url(), "token": "t"}));
        assert_eq!(status(res).await, 201);
        let delete = p.a.client.delete(p.a.url(&format!("/v1/clusters/{cluster}")));
        let upgrade = p.b.client.post(p.b.url(&format!("/v1/clusters/{cluster}/upgrades")));
        let upgrade = upgrade.json(&json!({"version": crate::upgrade_env::TO}));
        let (deleted, started) = join(status(delete), status(upgrade)).await;
        assert!(
            matches!((deleted, started), (204, 404) | (409, 202)),
            "round {round}: exactly one of the delete ({deleted}) and the upgrade ({started}) goes through"
        );
        if started == 202 {
            let listed: Value = p.a.get(&format!("/v1/upgrades?cluster={cluster}")).await.json().await.expect("jobs");
            assert_eq!(listed["items"].as_array().map(Vec::len), Some(1), "round {round}: the job is kept");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_on_an_empty_store_make_exactly_one_admin_token() {
    let store = Location::parse(&postgres::shared().fresh_database()).expect("a database URL");
    let (db_a, db_b) = (drover::db::connect(&store).await.unwrap(), drover::db::connect(&store).await.unwrap());
    let (dir_a, dir_b) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let mut raw = RawStore::open(&store).await;
    for round in 0..ROUNDS {
        raw.execute("delete from tokens", &[]).await;
        for dir in [&dir_a, &dir_b] {
            let _ = std::fs::remove_file(dir.path().join("admin.token"));
        }
        let (ra, rb) =
            join(drover::identity::bootstrap(&db_a, dir_a.path()), drover::identity::bootstrap(&db_b, dir_b.path()))
                .await;
        assert!(ra.is_ok() && rb.is_ok(), "round {round}: both start: {ra:?} {rb:?}");
        assert_eq!(raw.integer("select count(*) from tokens").await, 1, "round {round}: one admin token");
        let files: Vec<String> = [&dir_a, &dir_b]
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.path().join("admin.token")).ok())
            .collect();
        assert_eq!(files.len(), 1, "round {round}: only the replica that made the token wrote it");
        let hash = drover::identity::hash_token(files[0].trim());
        let stored = raw.integer(&format!("select count(*) from tokens where hash = '{hash}'")).await;
        assert_eq!(stored, 1, "round {round}: the file holds the stored token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_sent_through_two_replicas_at_once_runs_the_request_once() {
    let p = pair().await;
    let mut raw = p.raw().await;
    for round in 0..ROUNDS {
        let body = json!({"name": format!("k{round}"), "replicas": 0, "version": "v1.29.2"});
        let key = format!("key-{round}");
        let send = |app: &TestApp| {
            let req = app.client.post(app.url("/v1/pools")).header("idempotency-key", &key).json(&body);
            status(req)
        };
        let (first, second) = join(send(&p.a), send(&p.b)).await;
        assert!(
            matches!((first, second), (201, 201 | 409) | (409, 201)),
            "round {round}: one runs, the other replays it or finds it running: {first}, {second}"
        );
    }
    assert_eq!(raw.integer("select count(*) from pools").await, ROUNDS as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_created_through_two_replicas_at_once_is_created_once() {
    let p = pair().await;
    let sim = KubeSim::start(SimSettings::default()).await;
    for round in 0..ROUNDS {
        let (path, body) = match round % 3 {
            0 => ("/v1/pools", json!({"name": format!("n{round}"), "replicas": 0, "version": "v1.29.2"})),
            1 => ("/v1/clusters", json!({"name": format!("n{round}"), "server": sim.url(), "token": "t"})),
            _ => ("/v1/tokens", json!({"name": format!("n{round}"), "role": "viewer"})),
        };
        let send = |app: &TestApp| status(app.client.post(app.url(path)).json(&body));
        let (first, second) = join(send(&p.a), send(&p.b)).await;
        assert!(
            matches!((first, second), (201, 409) | (409, 201)),
            "round {round} ({path}): exactly one create: {first}, {second}"
        );
    }
}
