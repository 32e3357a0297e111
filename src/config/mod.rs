//! Typed settings: command-line flags, each with an environment fallback.

pub mod location;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::telemetry::LogFormat;
pub use location::Location;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// The Docker Engine, through its API socket.
    Docker,
    /// An in-memory stand-in, for trying drover without Docker.
    Simulated,
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address the HTTP API listens on.
    #[arg(long, env = "DROVER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// PEM certificate (chain) to serve HTTPS with; needs `--tls-key`.
    /// Reloaded when the file changes (docs/access.md).
    #[arg(long, env = "DROVER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "DROVER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates whose client certificates are accepted (mutual
    /// TLS); `--access-config` maps their subjects to roles.
    #[arg(long, env = "DROVER_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// How often the TLS files are looked at for a change.
    #[arg(long, env = "DROVER_TLS_RELOAD_INTERVAL", value_parser = parse_reload, default_value = "10s")]
    pub tls_reload_interval: Duration,

    /// Web origins (comma-separated, exact: `https://app.example.com`) whose
    /// pages may call the API from a browser. None by default.
    #[arg(long, env = "DROVER_CORS_ALLOWED_ORIGINS", value_delimiter = ',', value_parser = parse_origin)]
    pub cors_allowed_origins: Vec<String>,

    /// JSON file of OIDC issuers (`oidc_issuer`: issuer, audience, rules)
    /// and client-certificate subjects (`mtls`) with their roles; its
    /// format is in docs/access.md.
    #[arg(long, env = "DROVER_ACCESS_CONFIG")]
    pub access_config: Option<PathBuf>,

    /// How often `--access-config` is looked at for a change; a change
    /// that validates takes over, one that does not keeps the rules in use.
    #[arg(long, env = "DROVER_ACCESS_RELOAD_INTERVAL", value_parser = parse_reload, default_value = "1s")]
    pub access_reload_interval: Duration,

    /// Directory for drover's own files (the embedded SQLite database, the
    /// first admin token); created when missing.
    #[arg(long, env = "DROVER_DATA_DIR", default_value = "./drover-data")]
    pub data_dir: PathBuf,

    /// The store: `postgres://user:password@host:port/database` for one
    /// shared by several drover replicas (docs/ha.md), or
    /// `sqlite:///path/to/drover.db`. Without it, drover keeps an embedded
    /// SQLite database in the data directory.
    #[arg(long, env = "DROVER_DATABASE_URL", value_parser = Location::parse)]
    pub database_url: Option<Location>,

    /// How long a replica's claim on a pool lasts unless renewed
    /// (PostgreSQL only): a replica that stops renewing loses its pools to
    /// the others this long after its last renewal. Renewed every third of it.
    #[arg(long, env = "DROVER_LEASE_DURATION", value_parser = parse_lease, default_value = "15s")]
    pub lease_duration: Duration,

    /// Log filter, in `tracing` env-filter syntax (e.g. `info,drover=debug`).
    #[arg(long, env = "DROVER_LOG", default_value = "info")]
    pub log_level: String,

    /// Log line format.
    #[arg(long, env = "DROVER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Trace export to an OpenTelemetry collector (off by default).
    #[command(flatten)]
    pub traces: crate::telemetry::otlp::TraceSettings,

    /// Which container runtime drives the machines.
    #[arg(long, env = "DROVER_RUNTIME", value_enum, default_value_t = RuntimeKind::Docker)]
    pub runtime: RuntimeKind,

    /// Docker Engine endpoint (`unix:///path`, `tcp://host:port`); defaults to
    /// `DOCKER_HOST`, then the local socket.
    #[arg(long, env = "DROVER_DOCKER_HOST")]
    pub docker_host: Option<String>,

    /// Largest `replicas` a pool may ask for.
    #[arg(long, env = "DROVER_MAX_REPLICAS", default_value_t = 1000)]
    pub max_replicas: u32,

    /// Requests served at once; more are answered 503 with Retry-After.
    #[arg(long, env = "DROVER_MAX_CONCURRENT_REQUESTS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_requests: u32,

    /// Longest time one request may take before it is answered 503.
    #[arg(long, env = "DROVER_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub request_timeout: Duration,

    /// How often every pool is reconciled even when nothing woke it. A
    /// safety net, not the way changes are noticed: the engines' events,
    /// the API and each pass's own deadlines (readiness, restart backoff,
    /// progress deadline) wake a pool when something is due. 5 minutes keeps
    /// 10,000 idle pools near 2% of a core (30 s cost 24%).
    #[arg(long, env = "DROVER_RESYNC_INTERVAL", value_parser = parse_duration, default_value = "5m")]
    pub resync_interval: Duration,

    /// Container operations (create, start) in flight at once on each
    /// engine; stops run outside this limit.
    #[arg(long, env = "DROVER_MAX_PARALLEL", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_parallel: u32,

    /// Reconcile passes running at once, across all pools.
    #[arg(long, env = "DROVER_MAX_CONCURRENT_RECONCILES", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_concurrent_reconciles: u32,

    /// How long a machine without a health check must have run before it
    /// counts as ready (with a HEALTHCHECK, the check decides). A process
    /// that dies as it starts never counts, so it can never pay for the
    /// removal of a healthy machine. Such a process dies within tens of
    /// milliseconds; half a second is ten times that, and every batch of a
    /// rollout waits it out once (docs/machines.md).
    #[arg(long, env = "DROVER_MACHINE_SETTLE_TIME", value_parser = parse_settle, default_value = "500ms")]
    pub machine_settle_time: Duration,

    /// How long an engine may be unreachable before its machines are given
    /// up for lost and replaced on the other engines.
    #[arg(long, env = "DROVER_ENGINE_LOST_AFTER", value_parser = parse_duration, default_value = "30s")]
    pub engine_lost_after: Duration,

    /// Grace period Docker gives a machine's processes before killing them.
    #[arg(long, env = "DROVER_STOP_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub stop_timeout: Duration,

    /// Longest wait between retries of a failing reconcile.
    #[arg(long, env = "DROVER_MAX_BACKOFF", value_parser = parse_duration, default_value = "60s")]
    pub max_backoff: Duration,

    /// Tries per Kubernetes API call of an upgrade job, the first included.
    #[arg(long, env = "DROVER_UPGRADE_API_TRIES", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub upgrade_api_tries: u32,

    /// Wait before retrying a failed Kubernetes API call; it doubles with
    /// each retry, up to 16 times this.
    #[arg(long, env = "DROVER_UPGRADE_RETRY_BACKOFF", value_parser = parse_duration, default_value = "500ms")]
    pub upgrade_retry_backoff: Duration,

    /// Longest time each upgrade wait (pods Running, old pod gone, /healthz ok) may take.
    #[arg(long, env = "DROVER_UPGRADE_WAIT_TIMEOUT", value_parser = parse_duration, default_value = "2m")]
    pub upgrade_wait_timeout: Duration,

    /// How often an upgrade wait looks at the cluster again.
    #[arg(long, env = "DROVER_UPGRADE_POLL_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    pub upgrade_poll_interval: Duration,

    /// Longest time one Kubernetes API request may take.
    #[arg(long, env = "DROVER_KUBE_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub kube_request_timeout: Duration,

    /// Longest time cordoning and draining a machine's node may take, when
    /// its pool belongs to a cluster; past it the machine is kept and the
    /// deletion is tried again later.
    #[arg(long, env = "DROVER_DRAIN_TIMEOUT", value_parser = parse_duration, default_value = "2m")]
    pub drain_timeout: Duration,

    /// How often a drain looks again at the pods left on the node.
    #[arg(long, env = "DROVER_DRAIN_POLL_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    pub drain_poll_interval: Duration,

    /// Client connections open at once; a connection beyond it is answered
    /// 503 and closed.
    #[arg(long, env = "DROVER_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Longest time a client may take to send a request's head (its line
    /// and headers), counted from the connection's start or the request's
    /// first byte; a client that sends nothing is closed after it too.
    #[arg(long, env = "DROVER_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub header_read_timeout: Duration,

    /// Longest time a kept-alive connection may wait for its next request.
    #[arg(long, env = "DROVER_IDLE_TIMEOUT", value_parser = parse_duration, default_value = "60s")]
    pub idle_timeout: Duration,

    /// Largest request head (request line and headers), in bytes.
    #[arg(long, env = "DROVER_MAX_HEADER_BYTES", default_value_t = 64 * 1024, value_parser = clap::value_parser!(u32).range(4096..=1024 * 1024))]
    pub max_header_bytes: u32,

    /// Event streams open at once; more are answered 503 with Retry-After.
    #[arg(long, env = "DROVER_MAX_STREAMS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_streams: u32,

    /// Longest life of one event stream; the client reconnects with
    /// `Last-Event-ID` and misses nothing.
    #[arg(long, env = "DROVER_STREAM_LIFETIME", value_parser = parse_duration, default_value = "10m")]
    pub stream_lifetime: Duration,

    /// How often an event stream checks that its token still exists with
    /// its role (and reads the store even without a change notice); at
    /// most 30s.
    #[arg(long, env = "DROVER_STREAM_RECHECK", value_parser = parse_recheck, default_value = "10s")]
    pub stream_recheck: Duration,

    /// Refusals of requests without a valid token are audited as one
    /// record per window, which counts them.
    #[arg(long, env = "DROVER_AUDIT_BURST_WINDOW", value_parser = parse_duration, default_value = "10s")]
    pub audit_burst_window: Duration,

    /// Audit records older than this are deleted.
    #[arg(long, env = "DROVER_AUDIT_RETENTION", value_parser = parse_duration, default_value = "90d")]
    pub audit_retention: Duration,

    /// Most audit records kept; the oldest go first.
    #[arg(long, env = "DROVER_AUDIT_MAX_ROWS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..))]
    pub audit_max_rows: u64,

    /// Events older than this are deleted.
    #[arg(long, env = "DROVER_EVENT_RETENTION", value_parser = parse_duration, default_value = "30d")]
    pub event_retention: Duration,

    /// Most events kept; the oldest go first.
    #[arg(long, env = "DROVER_EVENT_MAX_ROWS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..))]
    pub event_max_rows: u64,

    /// Finished upgrade jobs (with their steps) older than this are deleted.
    #[arg(long, env = "DROVER_JOB_RETENTION", value_parser = parse_duration, default_value = "30d")]
    pub job_retention: Duration,

    /// Earlier revisions kept per pool, besides the current one; rollback
    /// can return to these.
    #[arg(long, env = "DROVER_REVISION_HISTORY", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub revision_history: u32,

    /// How often the retention pruner runs.
    #[arg(long, env = "DROVER_PRUNE_INTERVAL", value_parser = parse_duration, default_value = "10m")]
    pub prune_interval: Duration,

    /// Host directories (comma-separated, absolute) whose contents pools may
    /// bind-mount into machines. Empty (the default): no host mounts. The
    /// Docker socket, `/` and drover's data directory are refused even
    /// inside these, unless listed themselves.
    #[arg(long, env = "DROVER_ALLOWED_MOUNT_PATHS", value_delimiter = ',')]
    pub allowed_mount_paths: Vec<String>,

    /// Image references pools may run (comma-separated): exact references,
    /// or prefixes ending in `*` such as `registry.example.com/team/*`.
    /// `*` allows every image.
    #[arg(long, env = "DROVER_ALLOWED_IMAGES", value_delimiter = ',', default_value = "*")]
    pub allowed_images: Vec<String>,
}

impl ServeConfig {
    /// Every setting at its documented default, whatever the environment
    /// holds: the `DROVER_*` fallbacks belong to the command line, so a
    /// developer's shell never changes what tests or an embedding run with.
    pub fn defaults() -> Self {
        let matches = Defaults::command()
            .mut_args(|arg| arg.env(None))
            .try_get_matches_from(["drover"])
            .expect("BUG: every setting's default parses");
        Defaults::from_arg_matches(&matches).expect("BUG: every setting's default parses").serve
    }

    /// Settings for tests and embedding: an explicit data dir, port 0 on
    /// loopback, everything else at its default (never from the environment).
    pub fn for_data_dir(data_dir: PathBuf) -> Self {
        Self { data_dir, listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..Self::defaults() }
    }

    /// Where the store is: `--database-url`, else `drover.db` in the data
    /// directory.
    pub fn database(&self) -> Location {
        self.database_url.clone().unwrap_or_else(|| Location::Sqlite(self.data_dir.join("drover.db")))
    }
}

/// `drover serve` with no flags: the settings and their environment
/// fallbacks, which [`ServeConfig::defaults`] turns off.
#[derive(Parser)]
struct Defaults {
    #[command(flatten)]
    serve: ServeConfig,
}

/// A settle time: at least 100 ms (less could not tell a process that runs
/// from one that is dying), at most 5 minutes.
fn parse_settle(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(300)).contains(&d) {
        return Err(format!("{s:?} must be between 100ms and 5m"));
    }
    Ok(d)
}

/// A TLS reload interval: from 100 ms to 1 hour.
fn parse_reload(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!("{s:?} must be between 100ms and 1h"));
    }
    Ok(d)
}

/// An exact web origin: `http(s)://host[:port]`, no path, no wildcard
/// (the Fetch standard compares origins as whole strings).
pub fn parse_origin(s: &str) -> Result<String, String> {
    let s = s.trim();
    let rest = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://"));
    let ok = rest.is_some_and(|host| {
        !host.is_empty()
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
            && !host.ends_with(':')
    });
    if !ok {
        return Err(format!("{s:?} is not an origin like https://app.example.com (scheme and host, no path, no *)"));
    }
    Ok(s.to_ascii_lowercase())
}

fn parse_lease(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&d) {
        return Err(format!("{s:?} must be between 1s and 10m"));
    }
    Ok(d)
}

/// Longest duration any setting takes. Deadlines add a setting to the
/// current time, which panics past the clock's range; ten years is far
/// beyond any real timeout or retention and far within that range.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// Parses `500ms`, `30s`, `5m`, `1h`, `30d`, combinations such as `1h30m`
/// (humantime's syntax), or a bare number of seconds; at most
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>().map(Duration::from_secs).map_err(|_| format!("{s:?} is too long; at most 3650d"))?
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s, 5m, 1h or 30d: {e}"))?
    };
    if d > MAX_DURATION {
        return Err(format!("{s:?} is too long; at most 3650d"));
    }
    Ok(d)
}

/// A stream re-check interval: a duration of at most 30 seconds, so that a
/// revoked token loses its streams within half a minute.
fn parse_recheck(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(30) {
        return Err(format!("{s:?} must be more than 0 and at most 30s"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn durations_past_ten_years_are_refused_not_overflowed() {
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        assert!(parse_duration("3651d").unwrap_err().contains("too long"));
        assert!(parse_duration("18446744073709551615").unwrap_err().contains("too long"));
        assert!(parse_duration("99999999999999999999").unwrap_err().contains("too long"));
        assert!(parse_duration("213503982334601d").is_err());
    }

    #[test]
    fn origins_are_exact() {
        assert_eq!(parse_origin("https://App.example.com").as_deref(), Ok("https://app.example.com"));
        assert_eq!(parse_origin("http://127.0.0.1:8081").as_deref(), Ok("http://127.0.0.1:8081"));
        for bad in ["*", "https://*.example.com", "app.example.com", "https://a.example.com/", "https://", "null"] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serve_defaults_match_the_readme() {
        let cfg = ServeConfig::defaults();
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.data_dir, PathBuf::from("./drover-data"));
        assert_eq!(cfg.max_replicas, 1000);
        assert_eq!(cfg.runtime, RuntimeKind::Docker);
        assert!(cfg.allowed_mount_paths.is_empty(), "no host path may be mounted unless allowed");
        assert_eq!(cfg.allowed_images, ["*"]);
        assert_eq!((cfg.max_connections, cfg.max_streams), (1024, 256));
        assert_eq!(cfg.header_read_timeout, Duration::from_secs(10));
        assert_eq!(cfg.resync_interval, Duration::from_secs(300));
        assert!(cfg.tls_cert.is_none() && cfg.cors_allowed_origins.is_empty() && cfg.access_config.is_none());
        assert!(cfg.traces.endpoint.is_none(), "no trace export unless a collector is named");
        let embedded = ServeConfig::for_data_dir(PathBuf::from("/tmp/d"));
        assert_eq!((embedded.data_dir, embedded.listen.to_string()), (PathBuf::from("/tmp/d"), "127.0.0.1:0".into()));
        assert_eq!((embedded.max_replicas, embedded.runtime), (1000, RuntimeKind::Docker));
    }

    /// Variables the command line reads, each set to a value the test above
    /// would notice.
    const HOSTILE: &[(&str, &str)] = &[
        ("DROVER_LISTEN", "0.0.0.0:9"),
        ("DROVER_DATA_DIR", "/elsewhere"),
        ("DROVER_MAX_REPLICAS", "7"),
        ("DROVER_RUNTIME", "simulated"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("DROVER_ALLOWED_MOUNT_PATHS", "/"),
        ("DROVER_ALLOWED_IMAGES", "evil/*"),
        ("DROVER_MAX_CONNECTIONS", "3"),
        ("DROVER_HEADER_READ_TIMEOUT", "1s"),
        ("DROVER_RESYNC_INTERVAL", "1s"),
    ];

    #[test]
    fn defaults_ignore_the_drover_variables_that_the_command_line_reads() {
        let cli = Defaults::command();
        for (var, _) in HOSTILE {
            let read = cli.get_arguments().any(|a| a.get_env() == Some(std::ffi::OsStr::new(var)));
            assert!(read, "the command line no longer reads {var}: pick another variable for this test");
        }
        // The test above, in a child process of this test binary with the
        // variables set: setting them here would race other tests' threads.
        let exe = std::env::current_exe().expect("the path of the running test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", "config::tests::serve_defaults_match_the_readme", "--test-threads=1"])
            .envs(HOSTILE.iter().copied())
            .output()
            .expect("running the test binary again");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("test result: ok. 1 passed"),
            "the defaults changed with DROVER_* variables set:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
