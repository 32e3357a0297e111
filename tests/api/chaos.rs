//! A chaos run of our own: three replicas (real `drover serve` processes,
//! leases of 3 s) on a private PostgreSQL server and the real Docker
//! engine, each through its own recording Docker proxy and its own
//! database proxy. While pools are scaled and rolled between two images
//! through random replicas, faults come one after another at random: a
//! replica SIGKILLed and started again, one paused past its leases, the
//! database restarted, one replica cut off from the database. What must
//! hold is checked in `chaos_checks.rs`.
//!
//! The faults and the changes are drawn from one seed, printed first and
//! replayed with `DROVER_CHAOS_SEED`: the same schedule, though not the
//! same interleaving (the processes run at their own pace). The suite runs
//! 25 s of faults; `cargo bench --bench chaos` runs longer
//! (`DROVER_CHAOS_SECONDS`, default 300).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::chaos_checks::{self, Answer, Change, Fault, FaultKind, PoolRun, Record, Report, Setting};
use crate::docker::{self, EventLog, V1, V2};
use crate::helpers::{client_with_token, unique};
use crate::postgres::PgServer;
use crate::rig::{DockerProxy, LEASE, LEASE_DURATION, LIMIT, Replica, TcpProxy, WriteLog, patch, token};

/// How many replicas, pools and machines: at most POOLS x (MAX_MACHINES +
/// a surge of 1) containers at once, 25, which the engine here handles.
const REPLICAS: usize = 3;
const POOLS: usize = 5;
const MAX_MACHINES: u32 = 4;
/// Every pool converges within this after the last fault.
pub const CONVERGE: Duration = Duration::from_secs(30);
/// A client waits this long for an answer: longer than any pause, so a
/// request a paused replica holds is answered once it resumes rather than
/// given up on and applied later behind the test's back.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// A change is retried (it sets absolute values, so a retry is harmless)
/// until acknowledged or refused, for this long at most.
const RETRY_FOR: Duration = Duration::from_secs(40);

/// What a run is: its seed and how long faults go on.
pub struct Settings {
    pub seed: u64,
    pub faults_for: Duration,
}

impl Settings {
    /// The seed of `DROVER_CHAOS_SEED`, else a new one; the length from
    /// `DROVER_CHAOS_SECONDS` when `duration_from_env` (the bench), else
    /// `faults_for` (the suite keeps its own).
    pub fn new(faults_for: Duration, duration_from_env: bool) -> Settings {
        let seed = match std::env::var("DROVER_CHAOS_SEED") {
            Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("DROVER_CHAOS_SEED={s:?} is not a number")),
            Err(_) => rand::rng().random(),
        };
        let faults_for = match std::env::var("DROVER_CHAOS_SECONDS") {
            Ok(s) if duration_from_env => Duration::from_secs(
                s.trim().parse().unwrap_or_else(|_| panic!("DROVER_CHAOS_SECONDS={s:?} is not a number")),
            ),
            _ => faults_for,
        };
        Settings { seed, faults_for }
    }
}

/// Names for the pools of a run, made before it so that the caller can
/// sweep their containers whatever happens.
pub fn pool_names() -> Vec<String> {
    (0..POOLS).map(|i| unique(&format!("chaos{i}"))).collect()
}

/// Where each replica answers, and whether it can: the fault driver keeps
/// it; the clients read it (killed and paused replicas are skipped).
#[derive(Default)]
struct Slots(Mutex<Vec<(String, bool)>>);

impl Slots {
    fn set(&self, slot: usize, base: Option<String>, up: bool) {
        if let Ok(mut s) = self.0.lock() {
            if let Some(base) = base {
                s[slot].0 = base;
            }
            s[slot].1 = up;
        }
    }

    /// A replica that answers: slot `pick`, else the next one up (else
    /// `pick` anyway: all are down only for an instant).
    fn pick(&self, pick: usize) -> (usize, String) {
        let s = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        let slot = (0..s.len()).map(|k| (pick + k) % s.len()).find(|&i| s[i].1).unwrap_or(pick % s.len());
        (slot, s[slot].0.clone())
    }
}

/// The replicas of the run: the live one of each slot, those killed
/// before it, and every Docker proxy with the slot it served.
struct Group {
    server: PgServer,
    /// The database through each slot's proxy.
    urls: Vec<String>,
    proxies: Vec<TcpProxy>,
    live: Vec<Replica>,
    gone: Vec<Replica>,
    dockers: Vec<(usize, Arc<DockerProxy>)>,
    /// Every process of each slot: (slot, pid).
    incarnations: Vec<(usize, u32)>,
    /// What the clients read of it.
    slots: Arc<Slots>,
}

impl Group {
    /// A private server (the run restarts it), a proxy to it per replica,
    /// the replicas, and the write log installed once the first of them
    /// has migrated the database.
    async fn start() -> (Group, WriteLog) {
        let server = tokio::task::block_in_place(PgServer::start_new).unwrap_or_else(|e| panic!("{e}"));
        let db = server.fresh_database();
        let mut group = Group {
            urls: Vec::new(),
            proxies: Vec::new(),
            live: Vec::new(),
            gone: Vec::new(),
            dockers: Vec::new(),
            incarnations: Vec::new(),
            slots: Arc::default(),
            server,
        };
        let mut writes = None;
        for slot in 0..REPLICAS {
            let proxy = TcpProxy::start(group.server.port()).await;
            group.urls.push(proxy.url_through(&db, group.server.port()));
            group.proxies.push(proxy);
            let r = group.replica(slot).await;
            if let Ok(mut s) = group.slots.0.lock() {
                s.push((r.url(""), true));
            }
            group.live.push(r);
            if writes.is_none() {
                writes = Some(WriteLog::install(&db).await);
            }
        }
        (group, writes.expect("installed with the first replica"))
    }

    /// A new replica in `slot`, through that slot's database proxy.
    async fn replica(&mut self, slot: usize) -> Replica {
        let r = Replica::start(&self.urls[slot], true, &[]).await;
        self.dockers.push((slot, r.docker.clone().expect("a replica on Docker has a proxy")));
        self.incarnations.push((slot, r.proc.pid()));
        r
    }
}

/// Runs the chaos and checks it: the report says what happened and what broke.
pub async fn run(settings: &Settings, names: &[String]) -> Report {
    let seed = settings.seed;
    let faults_for = settings.faults_for;
    eprintln!("chaos: seed {seed} (DROVER_CHAOS_SEED={seed} replays its schedule), {faults_for:?} of faults");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut group, writes) = Group::start().await;
    let client = client_with_token(&token(&group.live.iter().collect::<Vec<_>>()));
    let d = docker::client().await;
    // Watched by the engine's event log from before they exist.
    let logs: Vec<EventLog> = names.iter().map(|n| EventLog::start(&d, n)).collect();
    let mut pools = create_pools(&client, &group, names, &mut rng).await;

    // The chaos: faults here, changes and reads on tasks of their own.
    let started = SystemTime::now();
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let firsts = pools.iter().map(|p| (p.name.clone(), p.changes[0].clone())).collect();
    let changer = change_pools(client.clone(), group.slots.clone(), firsts, seed, stop.clone(), answers.clone());
    let changer = tokio::spawn(changer);
    let reader = read_pools(client.clone(), group.slots.clone(), names.to_vec(), seed, stop.clone(), answers.clone());
    let reader = tokio::spawn(reader);
    let faults = inject_faults(&mut group, started, faults_for, &mut rng).await;
    let last_fault = SystemTime::now();
    stop.store(true, Ordering::SeqCst);
    let changed = changer.await.expect("the change task");
    reader.await.expect("the read task");
    for (p, changes) in pools.iter_mut().zip(changed) {
        p.changes.extend(changes);
    }

    // From the last fault, or the last change if it was acknowledged later.
    let last_change = pools.iter().flat_map(|p| p.changes.iter().filter_map(|c| c.acked)).max();
    let quiet_from = last_change.map_or(last_fault, |c| c.max(last_fault));
    let converged = wait_converged(&client, &group.live[0], &d, &pools, quiet_from).await;
    let all = || group.live.iter().chain(&group.gone);
    let record = Record {
        setting: Setting { seed, faults_for, lease: LEASE, started },
        faults,
        answers: answers.lock().map(|a| a.clone()).unwrap_or_default(),
        events: logs.iter().map(EventLog::entries).collect(),
        requests: group.dockers.iter().map(|(slot, p)| (*slot, p.requests())).collect(),
        writes: writes.rows().await,
        last_fault,
        converged,
        final_pools: final_pools(&client, &group.live[0], &d, names).await,
        panics: all().filter(|r| r.proc.output().contains("panicked")).map(|r| r.proc.output()).collect(),
        processes: group.incarnations.clone(),
        pools,
    };
    chaos_checks::check(&record)
}

/// The pools, each with a strategy of its own, created through random
/// replicas and ready.
async fn create_pools(client: &reqwest::Client, group: &Group, names: &[String], rng: &mut StdRng) -> Vec<PoolRun> {
    let mut pools = Vec::new();
    for name in names {
        let (surge, unavailable) = [(1, 0), (0, 1), (1, 1)][rng.random_range(0..3)];
        let replicas = rng.random_range(2..=3);
        let strategy =
            json!({"max_surge": surge, "max_unavailable": unavailable, "replacement": "termination_complete"});
        let body = json!({"name": name, "replicas": replicas, "version": V1, "strategy": strategy});
        let (_, base) = group.slots.pick(rng.random_range(0..REPLICAS));
        let mut first = Change::of(Some(replicas), Some(V1));
        let res = client.post(format!("{base}/v1/pools")).json(&body).send().await.expect("creating a pool");
        assert_eq!(res.status(), StatusCode::CREATED, "creating {name}");
        first.acked = Some(SystemTime::now());
        first.generation = res.json::<Value>().await.expect("the pool created")["generation"].as_i64();
        pools.push(PoolRun { name: name.clone(), surge, unavailable, changes: vec![first] });
    }
    for p in &pools {
        group.live[0]
            .proc
            .wait_pool(client, &p.name, LIMIT, "every pool ready before the faults", |v| {
                v["status"]["ready_replicas"] == v["replicas"] && v["status"]["observed_generation"] == v["generation"]
            })
            .await;
    }
    pools
}

/// Faults one after another, every kind once in each round (in a random
/// order), at least one round and on until `faults_for` has passed.
async fn inject_faults(group: &mut Group, started: SystemTime, faults_for: Duration, rng: &mut StdRng) -> Vec<Fault> {
    let kinds = [FaultKind::Kill, FaultKind::Pause, FaultKind::RestartDb, FaultKind::Cut];
    let (mut faults, mut round) = (Vec::new(), Vec::new());
    while faults.len() < kinds.len() || started.elapsed().unwrap_or_default() < faults_for {
        if round.is_empty() {
            round = kinds.to_vec();
            round.shuffle(rng);
        }
        let kind = round.pop().expect("refilled above");
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        faults.push(inject(group, kind, rng).await);
    }
    faults
}

/// One fault, injected and undone.
async fn inject(group: &mut Group, kind: FaultKind, rng: &mut StdRng) -> Fault {
    let slot = rng.random_range(0..REPLICAS);
    let slots = group.slots.clone();
    // Past the lease, by up to another lease.
    let past_lease = LEASE_DURATION + Duration::from_millis(rng.random_range(500..3000));
    let began = SystemTime::now();
    let note = match kind {
        FaultKind::Kill => {
            let before = group.live[slot].proc.pid();
            slots.set(slot, None, false);
            group.live[slot].proc.kill_now();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..3000))).await;
            let fresh = group.replica(slot).await;
            slots.set(slot, Some(fresh.url("")), true);
            let now = fresh.proc.pid();
            group.gone.push(std::mem::replace(&mut group.live[slot], fresh));
            format!("SIGKILL of replica {slot} (pid {before}), started again as pid {now}")
        }
        FaultKind::Pause => {
            // Frozen with work under way when there is some: its engine
            // changes are held for up to a second first, then dropped
            // unsent (the engine never sees them: a change that reached it
            // during the pause would be the documented residual window,
            // not a fault of the fences), so it resumes in mid-pass.
            let docker = group.live[slot].docker.clone().expect("a replica on Docker has a proxy");
            let before = docker.requests().len();
            docker.hold(true);
            let under_way = || docker.requests()[before..].iter().filter(|r| r.changes()).count();
            let held_from = tokio::time::Instant::now();
            while under_way() == 0 && held_from.elapsed() < Duration::from_secs(1) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slots.set(slot, None, false);
            group.live[slot].proc.signal(libc::SIGSTOP);
            let dropped = under_way();
            docker.cut_held();
            tokio::time::sleep(past_lease).await;
            docker.hold(false);
            group.live[slot].proc.signal(libc::SIGCONT);
            slots.set(slot, None, true);
            let pid = group.live[slot].proc.pid();
            format!(
                "SIGSTOP of replica {slot} (pid {pid}) for {past_lease:?} with {dropped} engine changes dropped, then SIGCONT"
            )
        }
        FaultKind::RestartDb => {
            let down = Duration::from_millis(rng.random_range(500..3000));
            tokio::task::block_in_place(|| group.server.stop());
            tokio::time::sleep(down).await;
            tokio::task::block_in_place(|| group.server.start());
            format!("PostgreSQL stopped, started again {down:?} later")
        }
        FaultKind::Cut => {
            group.proxies[slot].cut();
            tokio::time::sleep(past_lease).await;
            group.proxies[slot].restore();
            format!("replica {slot} (pid {}) cut off from PostgreSQL for {past_lease:?}", group.live[slot].proc.pid())
        }
    };
    let fault =
        Fault { kind, slot: (kind != FaultKind::RestartDb).then_some(slot), began, ended: SystemTime::now(), note };
    eprintln!("chaos: {}", fault.note);
    fault
}

/// Scales and rolls the pools through random replicas until stopped, one
/// change at a time, each retried until acknowledged or refused; answers
/// each pool's changes.
async fn change_pools(
    client: reqwest::Client,
    slots: Arc<Slots>,
    pools: Vec<(String, Change)>,
    seed: u64,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
) -> Vec<Vec<Change>> {
    // A stream of its own, so that the faults' draws stay the same whatever the changes' timing.
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1));
    let mut known: Vec<Change> = pools.iter().map(|(_, c)| c.clone()).collect();
    let mut changes: Vec<Vec<Change>> = pools.iter().map(|_| Vec::new()).collect();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
        let i = rng.random_range(0..pools.len());
        let name = &pools[i].0;
        let (body, mut change) = if rng.random_bool(0.6) {
            // Another count than the last acknowledged one: every change changes something.
            let now = known[i].replicas.unwrap_or(0);
            let others: Vec<u32> = (1..=MAX_MACHINES).filter(|&n| n != now).collect();
            let n = others[rng.random_range(0..others.len())];
            (json!({"replicas": n}), Change::of(Some(n), None))
        } else {
            let v = if known[i].version == Some(V1) { V2 } else { V1 };
            (json!({"version": v}), Change::of(None, Some(v)))
        };
        let deadline = change.sent + RETRY_FOR;
        loop {
            let (slot, base) = slots.pick(rng.random_range(0..REPLICAS));
            let url = format!("{base}/v1/pools/{name}");
            let request = if body.get("replicas").is_some() {
                client.put(format!("{url}/scale")).json(&body)
            } else {
                patch(&client, url, body.clone())
            };
            let answer = send(request.timeout(REQUEST_TIMEOUT), slot, "change").await;
            let status = answer.status;
            if let Ok(mut a) = answers.lock() {
                a.push(answer.clone());
            }
            match status {
                Some(s) if (200..300).contains(&s) => {
                    change.acked = Some(answer.at);
                    change.generation = answer.body.as_ref().and_then(|b| b["generation"].as_i64());
                    known[i] = known[i].then(&change);
                    break;
                }
                Some(s) if (400..500).contains(&s) => {
                    change.refused = true;
                    break;
                }
                _ if SystemTime::now() > deadline => break,
                _ => tokio::time::sleep(Duration::from_millis(rng.random_range(200..600))).await,
            }
        }
        changes[i].push(change);
    }
    changes
}

/// Reads pools and lists through random replicas until stopped: every
/// answer counts toward "2xx, 4xx or 503 with Retry-After, nothing else".
async fn read_pools(
    client: reqwest::Client,
    slots: Arc<Slots>,
    names: Vec<String>,
    seed: u64,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(2));
    while !stop.load(Ordering::SeqCst) {
        let (slot, base) = slots.pick(rng.random_range(0..REPLICAS));
        let url = match rng.random_range(0..=names.len()) {
            i if i < names.len() => format!("{base}/v1/pools/{}", names[i]),
            _ => format!("{base}/v1/pools?limit=20"),
        };
        let mut answer = send(client.get(url).timeout(Duration::from_secs(10)), slot, "read").await;
        answer.body = None; // only a change's answer is read again
        if let Ok(mut a) = answers.lock() {
            a.push(answer);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn send(request: reqwest::RequestBuilder, slot: usize, what: &'static str) -> Answer {
    let sent = SystemTime::now();
    let res = request.send().await;
    let (status, retry_after, body) = match res {
        Ok(res) => {
            let status = res.status().as_u16();
            let retry_after = res.headers().contains_key(reqwest::header::RETRY_AFTER);
            (Some(status), retry_after, res.json::<Value>().await.ok())
        }
        Err(_) => (None, false, None),
    };
    Answer { what, slot, sent, at: SystemTime::now(), status, retry_after, body }
}

/// Waits until every pool is at its spec (its status says so, and so does
/// the engine), at most [`CONVERGE`] from `quiet_from`; answers how long
/// after `quiet_from` that was.
async fn wait_converged(
    client: &reqwest::Client,
    r: &Replica,
    d: &bollard::Docker,
    pools: &[PoolRun],
    quiet_from: SystemTime,
) -> Option<Duration> {
    while quiet_from.elapsed().unwrap_or_default() < CONVERGE {
        let mut all = true;
        for p in pools {
            let view = pool(client, r, &p.name).await;
            let seen = docker::pool_containers(d, &p.name).await;
            all &= chaos_checks::converged(&view, &seen);
        }
        if all {
            return quiet_from.elapsed().ok();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

async fn pool(client: &reqwest::Client, r: &Replica, name: &str) -> Value {
    match client.get(r.url(&format!("/v1/pools/{name}"))).timeout(Duration::from_secs(10)).send().await {
        Ok(res) => res.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Each pool as a replica serves it, its containers and its machine records.
async fn final_pools(
    client: &reqwest::Client,
    r: &Replica,
    d: &bollard::Docker,
    names: &[String],
) -> Vec<chaos_checks::Final> {
    let mut out = Vec::new();
    for name in names {
        out.push(chaos_checks::Final {
            view: pool(client, r, name).await,
            containers: docker::pool_containers(d, name).await,
            records: r.proc.machine_names(client, name).await,
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn three_replicas_under_random_kills_pauses_cuts_and_database_restarts_keep_every_bound_and_change() {
    docker::require_docker();
    // The seed may be replayed here too; the length stays the suite's.
    let settings = Settings::new(Duration::from_secs(25), false);
    let names = pool_names();
    // Declared before the run, so dropped after its replicas have stopped.
    let _cleanup = docker::Cleanup(names.clone());
    let run = tokio::time::timeout(Duration::from_secs(90), run(&settings, &names));
    let report = run.await.unwrap_or_else(|_| {
        panic!(
            "the chaos run (seed {}) took over 90 s: a replica, the database or the engine hangs, or a pool \
             never converged",
            settings.seed
        )
    });
    eprintln!("{}", report.summary);
    assert!(
        report.violations.is_empty(),
        "{}\nviolations:\n{}\n\nevidence:\n{}",
        report.summary,
        report.violations.join("\n"),
        report.evidence
    );
}
