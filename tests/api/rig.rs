//! The fault rig of the replica tests, the chaos test and its bench:
//! drover replicas as real processes of the real binary on one PostgreSQL
//! store, each with its own recording way to the Docker engine
//! ([`DockerProxy`]) and, when a test needs to cut it off, to the database
//! ([`TcpProxy`]).
//!
//! Leases last 3 s here (15 s by default), so that a takeover takes
//! seconds; the rules are the same at any duration.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::docker::V1;
use crate::helpers::{admin_token, unique, wait_for};
use crate::process::Process;

pub const LEASE: &str = "3s";
pub const LEASE_DURATION: Duration = Duration::from_secs(3);
pub const LIMIT: Duration = Duration::from_secs(120);

/// One drover process of a group sharing a store.
pub struct Replica {
    pub proc: Process,
    pub dir: TempDir,
    /// Its own way to the Docker engine, which records what it asked.
    pub docker: Option<Arc<DockerProxy>>,
}

impl Replica {
    /// `drover serve` on `database_url`, with its own data directory, on
    /// the simulated runtime or (with `docker`) the Docker engine through
    /// a recording proxy.
    pub async fn start(database_url: &str, docker: bool, extra: &[&str]) -> Replica {
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.proc.addr)
    }

    /// Whether `driver` (a pool's `status.driver`, a lease's holder, a
    /// replica id) names this process.
    pub fn is(&self, driver: &Value) -> bool {
        driver.as_str().is_some_and(|d| d.contains(&format!("-{}-", self.proc.pid())))
    }

    /// Its replica id, once `/metrics` of `any` lists it alive.
    pub async fn id(&self, client: &reqwest::Client, any: &Replica) -> String {
        let mut id = None;
        wait_for(LIMIT, "the replica alive on the store", async || {
            id = leases_held(client, any).await.into_keys().find(|r| self.is(&json!(r)));
            id.is_some()
        })
        .await;
        id.expect("waited for")
    }
}

/// The admin token, written by whichever replica started first.
pub fn token(replicas: &[&Replica]) -> String {
    replicas
        .iter()
        .find(|r| r.dir.path().join("admin.token").exists())
        .map(|r| admin_token(r.dir.path()))
        .expect("one replica wrote the admin token")
}

/// A fresh database on the shared test server.
pub fn database() -> String {
    crate::postgres::shared().fresh_database()
}

/// Pool leases held now by each replica, as any replica's `/metrics` says.
pub async fn leases_held(client: &reqwest::Client, r: &Replica) -> HashMap<String, f64> {
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
pub async fn names_split(
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
        let (side, wanted) = if drover::replicas::owner(&alive, &drover::domain::object::PoolRef::in_default(&name))
            == Some(id_b.as_str())
        {
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
pub async fn create_ready(client: &reqwest::Client, a: &Replica, b: &Replica, names: &[String], of_b: &[String]) {
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

/// A merge patch of a pool (or anything at `url`).
pub fn patch(client: &reqwest::Client, url: String, body: Value) -> reqwest::RequestBuilder {
    client.patch(url).header("content-type", "application/merge-patch+json").body(body.to_string())
}

/// One request the Docker proxy forwarded.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// When its request line passed the proxy.
    pub at: SystemTime,
}

impl Request {
    /// Whether it changes a container (create, start, stop, kill, remove...).
    pub fn changes(&self) -> bool {
        self.method != "GET" && self.method != "HEAD" && self.path.contains("/containers")
    }

    /// The name of the container it creates, when it is a create.
    pub fn creates(&self) -> Option<&str> {
        let query = self.path.split_once("/containers/create?")?.1;
        query.split('&').find_map(|kv| kv.strip_prefix("name="))
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
pub struct DockerProxy {
    pub path: PathBuf,
    seen: Arc<Mutex<Vec<Request>>>,
    /// What becomes of a request that changes a container.
    gate: tokio::sync::watch::Sender<Gate>,
    task: tokio::task::JoinHandle<()>,
}

impl DockerProxy {
    pub async fn start(path: PathBuf) -> Arc<DockerProxy> {
        let listener = UnixListener::bind(&path).expect("binding the Docker proxy");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let gate = tokio::sync::watch::Sender::new(Gate::Open);
        let hold = gate.subscribe();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (log, gate) = (log.clone(), hold.clone());
                tokio::spawn(async move {
                    if let Ok(engine) = UnixStream::connect("/var/run/docker.sock").await {
                        relay_recording(client, engine, log, gate).await;
                    }
                });
            }
        });
        Arc::new(DockerProxy { path, seen, gate, task })
    }

    /// Holds every request that changes a container (its sender waits for
    /// the answer), or passes them all on again, the held ones first.
    pub fn hold(&self, on: bool) {
        self.gate.send_replace(if on { Gate::Held } else { Gate::Open });
    }

    /// Drops the held requests, and any other change, unsent: their
    /// connections close, as if the engine had gone. Until [`Self::hold`].
    pub fn cut_held(&self) {
        self.gate.send_replace(Gate::Cut);
    }

    pub fn requests(&self) -> Vec<Request> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the Docker proxy does with a request that changes a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Open,
    Held,
    Cut,
}

/// Copies both ways; reads request lines out of what the client sends.
async fn relay_recording(
    client: UnixStream,
    engine: UnixStream,
    log: Arc<Mutex<Vec<Request>>>,
    mut gate: tokio::sync::watch::Receiver<Gate>,
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
            if record_requests(&mut pending, &log) {
                match gate.wait_for(|g| *g != Gate::Held).await.map(|g| *g) {
                    Ok(Gate::Open) => {}
                    _ => break,
                }
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
            let request = Request { method: method.to_owned(), path: path.to_owned(), at: SystemTime::now() };
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

/// A TCP proxy to the database that the test can cut and restore: on a
/// cut, open connections are dropped and new ones closed at once, as a
/// network partition would; a restore lets new ones through again.
pub struct TcpProxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    pub async fn start(target: u16) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the database proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (is_cut, open) = (cut.clone(), conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if is_cut.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut db) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut db).await;
                    }
                });
                if let Ok(mut open) = open.lock() {
                    // Finished relays go, so that a long run keeps only the open ones.
                    open.retain(|c| !c.is_finished());
                    open.push(conn);
                }
            }
        });
        TcpProxy { port, cut, conns, task }
    }

    /// `url` (of the database this proxy leads to) through this proxy.
    pub fn url_through(&self, url: &str, target: u16) -> String {
        url.replace(&format!(":{target}/"), &format!(":{}/", self.port))
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut open) = self.conns.lock() {
            open.drain(..).for_each(|c| c.abort());
        }
    }

    /// The network is back: new connections go through (those the cut
    /// dropped stay dropped, as after a real partition).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

/// Every committed write to the tables a reconcile pass writes (machine
/// records, pools, events, revisions), logged by the database itself: who
/// wrote (the session's `application_name`, `drover/<replica id>`), what,
/// and whose lease the pool had when the write committed. The triggers are
/// deferred to the commit, so a transaction rolled back leaves no row and
/// the lease is read as it is when the write becomes visible.
pub struct WriteLog {
    url: String,
}

/// One row of the [`WriteLog`].
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Write {
    /// The database's clock at the commit.
    pub at: chrono::DateTime<chrono::Utc>,
    pub session: String,
    pub tbl: String,
    pub pool: Option<String>,
    /// pools: `spec`, `status` or `other` (which document an update
    /// changed); events: the reason; machines: `terminating` when its
    /// deletion began, `ready` or `unready` when that changed, else the
    /// operation.
    pub what: String,
    /// machines: the machine's name; pools: `generation/observed`.
    pub detail: Option<String>,
    /// The pool's lease at the commit.
    pub holder: Option<String>,
    pub token: Option<i64>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Write {
    /// Whether a reconcile pass made it, rather than a request: machine
    /// records, a status, an event the API does not write. Passes write
    /// only under their pool's lease.
    pub fn by_a_pass(&self) -> bool {
        // The events requests write (src/pools, src/db/pools.rs).
        const API_REASONS: [&str; 8] = [
            "Created",
            "SpecChanged",
            "Scaled",
            "RolloutStarted",
            "DeletionRequested",
            "BatchApproved",
            "MachineDeleteRequested",
            "MachineRemovalRequested",
        ];
        match self.tbl.as_str() {
            "machines" => true,
            "pools" => self.what == "status",
            "events" => !API_REASONS.contains(&self.what.as_str()),
            _ => false,
        }
    }

    /// Whether the session that wrote it is `replica`'s.
    pub fn by(&self, replica: &str) -> bool {
        self.session == drover::db::session_name(replica)
    }

    /// Whether the pool's lease was the writer's when it committed.
    pub fn under_own_lease(&self) -> bool {
        self.holder.as_deref().is_some_and(|h| self.session == drover::db::session_name(h))
    }
}

const WRITE_LOG: &str = r#"
create table test_write_log (
    id          bigserial primary key,
    at          timestamptz not null,
    session     text not null,
    tbl         text not null,
    op          text not null,
    pool        text,
    what        text not null,
    detail      text,
    holder      text,
    token       bigint,
    expires_at  timestamptz
);
create function test_log_write() returns trigger language plpgsql as $$
declare
    doc jsonb := case when tg_op = 'DELETE' then to_jsonb(old) else to_jsonb(new) end;
    p text := doc ->> tg_argv[0];
    what text := lower(tg_op);
    detail text := doc ->> 'name';
    h text;
    t bigint;
    e timestamptz;
begin
    if tg_table_name = 'pools' and tg_op = 'UPDATE' then
        what := case when to_jsonb(old) -> 'spec' is distinct from doc -> 'spec' then 'spec'
                     when to_jsonb(old) -> 'status' is distinct from doc -> 'status' then 'status'
                     else 'other' end;
    end if;
    if tg_table_name = 'pools' then
        detail := (doc ->> 'generation') || '/' || ((doc ->> 'status')::jsonb ->> 'observed_generation');
    elsif tg_table_name = 'events' then
        what := doc ->> 'reason';
    elsif tg_table_name = 'machines' and tg_op = 'UPDATE' and to_jsonb(old) ->> 'terminating_since' is null
            and doc ->> 'terminating_since' is not null then
        what := 'terminating';
    elsif tg_table_name = 'machines' and tg_op <> 'DELETE'
            and (doc ->> 'ready')::boolean is distinct from coalesce((to_jsonb(old) ->> 'ready')::boolean, false) then
        what := case when (doc ->> 'ready')::boolean then 'ready' else 'unready' end;
    end if;
    -- A pool's lease lasts as long as its holder's incarnation (docs/ha.md).
    select l.holder, l.token,
           case when l.incarnation = 0 then l.expires_at
                when r.id is null then least(l.expires_at, now())
                else least(l.expires_at, r.expires_at) end
      into h, t, e
      from leases l left join replicas r on r.id = l.holder and r.incarnation = l.incarnation
     where l.kind = 'pool' and l.name = p;
    insert into test_write_log (at, session, tbl, op, pool, what, detail, holder, token, expires_at)
    values (clock_timestamp(), current_setting('application_name'), tg_table_name, lower(tg_op), p, what,
            detail, h, t, e);
    return null;
end $$;
create constraint trigger test_log after insert or update or delete on machines
    deferrable initially deferred for each row execute function test_log_write('pool');
create constraint trigger test_log after insert or update or delete on pools
    deferrable initially deferred for each row execute function test_log_write('name');
create constraint trigger test_log after insert or update or delete on events
    deferrable initially deferred for each row execute function test_log_write('subject');
create constraint trigger test_log after insert or update or delete on pool_revisions
    deferrable initially deferred for each row execute function test_log_write('pool');
"#;

impl WriteLog {
    /// Installs the log on the database at `url`, which the replicas have
    /// migrated already.
    pub async fn install(url: &str) -> WriteLog {
        let mut db = Self::connect(url).await;
        sqlx::raw_sql(WRITE_LOG).execute(&mut db).await.expect("installing the write log");
        WriteLog { url: url.to_owned() }
    }

    async fn connect(url: &str) -> sqlx::PgConnection {
        use sqlx::Connection;
        let connect = sqlx::PgConnection::connect(url);
        tokio::time::timeout(Duration::from_secs(30), connect)
            .await
            .expect("the test's session to the database within 30 s")
            .expect("the test's session to the database")
    }

    /// Every write logged so far, in commit order.
    pub async fn rows(&self) -> Vec<Write> {
        let mut db = Self::connect(&self.url).await;
        sqlx::query_as(
            "select at, session, tbl, pool, what, detail, holder, token, expires_at from test_write_log order by id",
        )
        .fetch_all(&mut db)
        .await
        .expect("reading the write log")
    }

    /// The database's clock now, which the log's times are read on.
    pub async fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let mut db = Self::connect(&self.url).await;
        sqlx::query_scalar("select clock_timestamp()").fetch_one(&mut db).await.expect("the database's clock")
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
    let creates: Vec<Option<String>> = log.lock().unwrap().iter().map(|r| r.creates().map(str::to_owned)).collect();
    assert_eq!(creates, [Some("x".to_owned()), None, None]);
}
