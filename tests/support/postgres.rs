//! PostgreSQL servers for the tests: each is a private cluster (`initdb`)
//! in its own temporary directory, listening on a free loopback port, run
//! as the `postgres` user when the tests run as root (the server refuses
//! root). Nothing is shared with a server the machine may already run.
//!
//! A server lives as long as the test process that started it: it is run
//! by a small shell supervisor whose parent-death signal is the end of the
//! thread that started it, which only ends with the process. On that
//! signal the supervisor shuts PostgreSQL down ("fast": sessions cut,
//! nothing half-written) and removes the directory, so an aborted run
//! leaves no server and no files behind. A server started for one test is
//! stopped the same way when its handle is dropped.
//!
//! The supervisor also restarts PostgreSQL when it exits, unless the test
//! asked it to stay down ([`PgServer::stop`] / [`PgServer::start`]), which
//! is how the fault tests take the store away and give it back.
//!
//! Binaries: `initdb` and `postgres` on the PATH, else Debian's
//! `/usr/lib/postgresql/<version>/bin`. `scripts/test.sh` installs the
//! `postgresql` package when neither is there; a test that needs the
//! server and finds none fails and says so.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use drover::db::Location;

/// The environment variable that runs the API tests on PostgreSQL.
pub const SELECT_VAR: &str = "DROVER_TEST_DATABASE";

/// Whether this run's API tests keep their data in PostgreSQL
/// (`DROVER_TEST_DATABASE=postgres`) rather than SQLite.
pub fn selected() -> bool {
    match std::env::var(SELECT_VAR) {
        Ok(v) if v == "postgres" => true,
        Ok(v) if v.is_empty() || v == "sqlite" => false,
        Ok(v) => panic!("{SELECT_VAR}={v:?}: expected `postgres` or `sqlite`"),
        Err(_) => false,
    }
}

/// The store of a test server whose data directory is `data_dir`, when the
/// run selected PostgreSQL: a database made for that directory on first
/// use, its URL kept in the directory so that a restart (of the app, or of
/// the binary on the same directory) finds it again. `None` otherwise: the
/// server keeps SQLite in its data directory.
pub fn store_for_data_dir(data_dir: &Path) -> Option<Location> {
    if !selected() {
        return None;
    }
    let file = data_dir.join("test-database-url");
    let url = match std::fs::read_to_string(&file) {
        Ok(url) => url,
        Err(_) => {
            let url = shared().fresh_database();
            std::fs::create_dir_all(data_dir).expect("creating the data directory");
            std::fs::write(&file, &url).expect("recording the test database");
            url
        }
    };
    Some(Location::parse(url.trim()).expect("a test database URL parses"))
}

/// The server shared by every test of this process, started on first use.
pub fn shared() -> &'static PgServer {
    static SHARED: OnceLock<Result<PgServer, String>> = OnceLock::new();
    match SHARED.get_or_init(PgServer::start_new) {
        Ok(server) => server,
        Err(why) => panic!("{why}"),
    }
}

pub struct PgServer {
    dir: PathBuf,
    port: u16,
    supervisor: u32,
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PgServer {
    /// A new private server, up and accepting connections; it trades
    /// durability for speed (a test database need not survive a power cut).
    pub fn start_new() -> Result<PgServer, String> {
        Self::start_with(FAST)
    }

    /// A new private server with PostgreSQL's durable defaults (fsync,
    /// synchronous commits): for benchmarks set against SQLite.
    #[allow(dead_code)]
    pub fn start_durable() -> Result<PgServer, String> {
        Self::start_with("")
    }

    fn start_with(settings: &'static str) -> Result<PgServer, String> {
        let bin = binaries()?;
        let base = std::env::temp_dir().join(format!(
            "drover-test-pg-{}-{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&base).map_err(|e| format!("creating {}: {e}", base.display()))?;
        let owner = server_user()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&base, Some(uid), Some(gid))
                .map_err(|e| format!("handing {} to the postgres user: {e}", base.display()))?;
        }
        let as_owner = move |program: PathBuf| {
            let mut c = Command::new(program);
            if let Some((uid, gid)) = owner {
                c.uid(uid).gid(gid);
            }
            c
        };
        let out = as_owner(bin.join("initdb"))
            .arg("-D")
            .arg(base.join("data"))
            .args(["-U", "drover", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"])
            .env("LC_ALL", "C")
            .output()
            .map_err(|e| format!("running {}/initdb: {e}", bin.display()))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&base);
            return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let port = free_port()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let script = SUPERVISOR.to_owned();
        let (dir, postgres) = (base.clone(), bin.join("postgres"));
        // The thread that starts the supervisor waits on it for the rest of
        // the process: its end (the process's) is the supervisor's signal.
        std::thread::Builder::new()
            .name(format!("postgres-{port}"))
            .spawn(move || {
                let mut cmd = as_owner(PathBuf::from("/bin/sh"));
                cmd.arg("-c")
                    .arg(script)
                    .arg("supervisor")
                    .arg(&dir)
                    .arg(port.to_string())
                    .arg(&postgres)
                    .arg(settings);
                cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
                // SAFETY: prctl is async-signal-safe; it only sets this
                // child's parent-death signal.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                match cmd.spawn() {
                    Ok(mut child) => {
                        let _ = tx.send(Ok(child.id()));
                        let _ = child.wait();
                        // Keep this thread, and so the parent-death link,
                        // for as long as the process runs.
                        loop {
                            std::thread::park();
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("starting the postgres supervisor: {e}")));
                    }
                }
            })
            .map_err(|e| format!("starting the postgres thread: {e}"))?;
        let supervisor = rx.recv().map_err(|_| "the postgres thread ended".to_owned())??;
        let server = PgServer { dir: base, port, supervisor };
        server.wait_until_up(Duration::from_secs(60))?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://drover@127.0.0.1:{}/{database}", self.port)
    }

    /// A new, empty database; its URL.
    pub fn fresh_database(&self) -> String {
        let name = format!("t{}", DATABASES.fetch_add(1, Ordering::Relaxed));
        let created = blocking(self.url("postgres"), move |mut admin| async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}"))).execute(&mut admin).await?;
            Ok(name)
        });
        match created {
            Ok(name) => self.url(&name),
            Err(e) => panic!("creating a test database: {e}\n{}", self.log_tail()),
        }
    }

    /// Shuts the server down ("fast": open sessions are cut) and keeps it
    /// down until [`PgServer::start`].
    pub fn stop(&self) {
        std::fs::write(self.dir.join("down"), b"").expect("marking the server down");
        let pid = self.postmaster_pid();
        if let Some(pid) = pid {
            // SAFETY: signals the postmaster this server started, by pid.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.accepts() {
            assert!(Instant::now() < deadline, "the test server did not stop within 30s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a server [`PgServer::stop`] took down; returns once it accepts
    /// connections.
    pub fn start(&self) {
        std::fs::remove_file(self.dir.join("down")).expect("clearing the down mark");
        self.wait_until_up(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    }

    fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    fn accepts(&self) -> bool {
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), Duration::from_millis(200)).is_ok()
    }

    fn wait_until_up(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        // Accepting TCP is not yet accepting sessions (recovery, startup):
        // wait for the ready line of pg_isready's own probe, a session.
        loop {
            if self.accepts() && self.session_works() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the test PostgreSQL server did not come up within {limit:?}\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn session_works(&self) -> bool {
        blocking(self.url("postgres"), |mut c| async move { sqlx::query("select 1").execute(&mut c).await.map(drop) })
            .is_ok()
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!("postgres log (last lines):\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // SAFETY: signals the supervisor this handle started, by pid; it
        // stops PostgreSQL and removes the directory.
        unsafe { libc::kill(self.supervisor as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs `work` on a session of `url`, from synchronous code (a server is
/// set up from wherever a test first needs it), on a thread of its own.
fn blocking<T, F, W>(url: String, work: W) -> Result<T, String>
where
    T: Send + 'static,
    F: std::future::Future<Output = sqlx::Result<T>>,
    W: FnOnce(sqlx::PgConnection) -> F + Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async {
            use sqlx::Connection;
            let session = sqlx::PgConnection::connect(&url).await.map_err(|e| e.to_string())?;
            work(session).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "the session thread panicked".to_owned())?
}

/// Settings that trade durability for speed.
const FAST: &str = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off";

/// Runs PostgreSQL (`$3`, with settings `$4`) on directory `$1`'s cluster,
/// port `$2`: restarts it when it exits unless `$1/down` exists, and on
/// SIGTERM shuts it down and removes `$1`.
const SUPERVISOR: &str = r#"
dir=$1; port=$2; postgres=$3; settings=$4; pg=
finish() { [ -n "$pg" ] && kill -INT "$pg" 2>/dev/null && wait "$pg"; rm -rf "$dir"; exit 0; }
trap finish TERM INT HUP
while :; do
    if [ -e "$dir/down" ]; then sleep 0.1 & wait $!; continue; fi
    # $settings unquoted: one word per setting.
    "$postgres" -D "$dir/data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 $settings \
        -c max_connections=500 -c shared_buffers=64MB >>"$dir/log" 2>&1 &
    pg=$!
    wait "$pg"
    pg=
    sleep 0.2 & wait $!
done
"#;

/// `(uid, gid)` of the `postgres` user when the tests run as root (the
/// server refuses to), else `None`: the current user runs it.
fn server_user() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id").args([flag, "postgres"]).output().map_err(|e| format!("running id: {e}"))?;
        if !out.status.success() {
            return Err("the tests run as root and there is no `postgres` user to run the test server \
                        (install Debian's `postgresql` package: scripts/test.sh does)"
                .into());
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().map_err(|e| format!("id {flag} postgres: {e}"))
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

/// The directory holding `initdb` and `postgres`.
fn binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    for dir in on_path {
        if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
            return Ok(dir);
        }
    }
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    debian.sort_by_key(|p| version_of(p));
    debian.pop().ok_or_else(|| {
        "PostgreSQL is not installed (no initdb on the PATH nor in /usr/lib/postgresql/*/bin): \
         the README's test command, scripts/test.sh, installs Debian's `postgresql` package"
            .to_owned()
    })
}

fn version_of(bin: &Path) -> u32 {
    bin.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| format!("finding a free port: {e}"))
}
