//! A pool's desired state and the rules it must satisfy.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::ValidationErrors;
use super::image::check_image_reference;
use super::names::check_dns_label;
use super::strategy::{IntOrPercent, ReplacementPolicy, RolloutStrategy};
use super::version::{KubeVersion, node_image};

pub use super::labels::RESERVED_LABEL_PREFIX;
pub const MAX_MOUNTS: usize = 64;
pub const MAX_FAILURE_DOMAINS: usize = 64;

/// A host path bind-mounted into every machine of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Absolute path inside the container; no `,` or `:`.
    #[schema(pattern = "^/[^,:]*$")]
    pub container_path: String,
    /// Absolute path on the Docker host, without `..`, inside a directory
    /// the server allows mounting from; no `,` or `:`.
    #[schema(pattern = "^/[^,:]*$")]
    pub host_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// What a pool should look like. Every value here has passed `validate`.
///
/// The domain type only: the API shows it as `PoolSpecView` and changes it
/// with `PoolPatch` (`http::wire`), the store keeps it as `db::pool_spec::StoredSpec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// Desired number of machines.
    pub replicas: u32,
    /// Kubernetes version of the machines; picks `kindest/node:<version>`
    /// unless `image` is set.
    pub version: KubeVersion,
    /// Custom image that overrides the version's node image.
    pub image: Option<String>,
    /// Machines are spread evenly across these names (a container label).
    pub failure_domains: Vec<String>,
    /// Host paths mounted into every machine.
    pub extra_mounts: Vec<Mount>,
    /// Labels put on every machine's container.
    pub labels: BTreeMap<String, String>,
    pub strategy: RolloutStrategy,
    /// A paused pool makes no rollout changes; its status keeps updating.
    pub paused: bool,
    /// Registered cluster whose nodes these machines are.
    pub cluster: Option<String>,
    /// Engines the machines may run on, by name; empty: every engine.
    pub engines: Vec<String>,
    /// Engines the machines may run on, by their labels; empty: every engine.
    pub engine_selector: BTreeMap<String, String>,
    /// A new machine counts as available once it has been ready this long.
    pub min_ready_seconds: u32,
    /// A rollout that makes no progress for this long is reported stalled.
    pub progress_deadline_seconds: u32,
    /// An up-to-date machine still running but unready after this long is
    /// replaced.
    pub machine_ready_timeout_seconds: u32,
}

/// Five minutes: long enough for a slow node image to boot and pass its
/// health check (kind nodes take 10-60 s), short enough that a machine hung
/// in start-up is replaced well within a rollout's progress deadline (600 s).
pub const DEFAULT_MACHINE_READY_TIMEOUT_SECONDS: u32 = 300;

pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;

impl PoolSpec {
    /// May the pool's machines run on this engine (by the pool's placement;
    /// draining is the engine's business)?
    pub fn places_on(&self, engine: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.engines.is_empty() || self.engines.iter().any(|e| e == engine))
            && super::labels::matches(&self.engine_selector, labels)
    }

    /// The image every machine should run: the custom image when set,
    /// otherwise the version's node image.
    pub fn desired_image(&self) -> String {
        self.image.clone().unwrap_or_else(|| node_image(self.version))
    }

    pub fn machine_ready_timeout(&self) -> u32 {
        self.machine_ready_timeout_seconds
    }
}

/// One line naming what changed between two specs, for the event log:
/// scalars with their old and new values, collections by name.
pub fn describe_change(old: &PoolSpec, new: &PoolSpec) -> String {
    fn shown(v: &Option<String>) -> String {
        v.as_ref().map_or_else(|| "null".to_owned(), |v| format!("{v:?}"))
    }
    let scalars = [
        ("replicas", old.replicas.to_string(), new.replicas.to_string()),
        ("version", format!("{:?}", old.version.to_string()), format!("{:?}", new.version.to_string())),
        ("image", shown(&old.image), shown(&new.image)),
        ("paused", old.paused.to_string(), new.paused.to_string()),
        ("cluster", shown(&old.cluster), shown(&new.cluster)),
        ("min_ready_seconds", old.min_ready_seconds.to_string(), new.min_ready_seconds.to_string()),
        (
            "progress_deadline_seconds",
            old.progress_deadline_seconds.to_string(),
            new.progress_deadline_seconds.to_string(),
        ),
        (
            "machine_ready_timeout_seconds",
            old.machine_ready_timeout_seconds.to_string(),
            new.machine_ready_timeout_seconds.to_string(),
        ),
    ];
    let collections = [
        ("failure_domains", old.failure_domains != new.failure_domains),
        ("extra_mounts", old.extra_mounts != new.extra_mounts),
        ("labels", old.labels != new.labels),
        ("strategy", old.strategy != new.strategy),
        ("engines", old.engines != new.engines),
        ("engine_selector", old.engine_selector != new.engine_selector),
    ];
    let changed: Vec<String> = scalars
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(k, a, b)| format!("{k}: {a} -> {b}"))
        .chain(collections.into_iter().filter(|(_, differs)| *differs).map(|(k, _)| k.to_owned()))
        .collect();
    format!("spec changed ({})", changed.join(", "))
}

/// Limits that come from settings rather than from the rules themselves.
#[derive(Debug, Clone)]
pub struct SpecLimits {
    pub max_replicas: u32,
    /// What machines may reach on the host, and what they may run.
    pub host: HostPolicy,
}

impl Default for SpecLimits {
    fn default() -> Self {
        Self { max_replicas: 1000, host: HostPolicy::default() }
    }
}

/// The host-safety policy: which host paths pools may bind-mount and which
/// images they may run. A machine that mounts the Docker socket, `/` or
/// drover's own data directory owns the host (or every credential drover
/// holds), whoever chose its image; so those are refused even inside an
/// allowed directory, unless the settings name them exactly.
///
/// Paths are compared as written, after removing `.` and repeated `/`
/// (`..` is refused): they name files on the Docker host, which drover
/// cannot inspect, so symbolic links there are not followed.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    /// Directories whose contents may be mounted; empty: no host mounts.
    pub mount_dirs: Vec<String>,
    /// Paths no mount may equal, contain or lie inside, unless `mount_dirs`
    /// names them exactly.
    pub protected: Vec<String>,
    /// Allowed image references: exact, a prefix ending in `*`, or `*`.
    pub images: Vec<String>,
}

/// The Docker socket's usual places; the configured endpoint is added.
pub const DOCKER_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/docker.sock"];

impl Default for HostPolicy {
    fn default() -> Self {
        let mut protected = vec!["/".to_owned()];
        protected.extend(DOCKER_SOCKETS.iter().map(|s| (*s).to_owned()));
        Self { mount_dirs: Vec::new(), protected, images: vec!["*".to_owned()] }
    }
}

/// `path` without `.` components and repeated slashes, or `None` when it is
/// not absolute or climbs with `..`.
pub fn normalize_host_path(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut out = String::new();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return None;
        }
        out.push('/');
        out.push_str(part);
    }
    Some(if out.is_empty() { "/".to_owned() } else { out })
}

/// Whether `path` is `dir` or lies inside it (both normalized).
fn within(path: &str, dir: &str) -> bool {
    dir == "/" || path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

impl HostPolicy {
    /// Builds a policy from settings: `protect` adds paths to the built-in
    /// protected ones (the Docker endpoint, the data directory).
    pub fn new(mount_dirs: &[String], images: &[String], protect: &[String]) -> Self {
        let mut protected = Self::default().protected;
        protected.extend(protect.iter().filter_map(|p| normalize_host_path(p)));
        Self {
            mount_dirs: mount_dirs.iter().filter_map(|d| normalize_host_path(d.trim())).collect(),
            protected,
            images: images.iter().map(|i| i.trim().to_owned()).filter(|i| !i.is_empty()).collect(),
        }
    }

    /// Why `host_path` (normalized) may not be mounted, if it may not.
    fn refuse_mount(&self, host_path: &str) -> Option<(&'static str, String)> {
        if !self.mount_dirs.iter().any(|d| within(host_path, d)) {
            let allowed = if self.mount_dirs.is_empty() { "none".to_owned() } else { self.mount_dirs.join(", ") };
            return Some((
                "host_path_allowed",
                format!("{host_path:?} is outside the directories this server allows mounting from ({allowed})"),
            ));
        }
        let exposed = self.protected.iter().find(|p| {
            let overlaps =
                if p.as_str() == "/" { host_path == "/" } else { within(host_path, p) || within(p, host_path) };
            overlaps && !self.mount_dirs.contains(p)
        })?;
        Some((
            "host_path_protected",
            format!(
                "{host_path:?} would expose {exposed:?} (the host's root, the Docker socket or drover's data); only a server that names it in its allowed mount paths accepts that"
            ),
        ))
    }

    /// What of a stored spec this policy refuses, if anything: the
    /// settings may have been tightened since the spec was accepted, and a
    /// pool must not go on creating what they no longer allow.
    pub fn refusal(&self, spec: &PoolSpec) -> Option<String> {
        let mut errs = ValidationErrors::default();
        self.check_image(&spec.desired_image(), "image", &mut errs);
        check_mounts(&spec.extra_mounts, self, &mut errs);
        (!errs.is_empty()).then(|| errs.to_string())
    }

    /// Refuses, under `field`, an image this policy does not let machines run.
    fn check_image(&self, image: &str, field: &str, errs: &mut ValidationErrors) {
        if !self.image_allowed(image) {
            errs.push(
                field,
                "image_allowed",
                format!("machines would run {image:?}, which this server does not allow (see --allowed-images)"),
            );
        }
    }

    pub fn image_allowed(&self, image: &str) -> bool {
        self.images.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => image == p,
        })
    }
}

/// A pool spec as a client sent it: loosely typed so that every broken rule
/// can be reported at once, with its field, instead of the first serde error.
#[derive(Debug, Clone, Default)]
pub struct RawSpec {
    pub replicas: i64,
    pub version: String,
    pub image: Option<String>,
    pub failure_domains: Vec<String>,
    pub extra_mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub max_surge: Option<IntOrPercent>,
    pub max_unavailable: Option<IntOrPercent>,
    pub batch_approval: bool,
    pub auto_rollback: bool,
    pub replacement: Option<ReplacementPolicy>,
    pub paused: bool,
    pub cluster: Option<String>,
    pub min_ready_seconds: Option<i64>,
    pub progress_deadline_seconds: Option<i64>,
    pub machine_ready_timeout_seconds: Option<i64>,
    pub engines: Vec<String>,
    pub engine_selector: BTreeMap<String, String>,
}

impl From<&PoolSpec> for RawSpec {
    /// The spec as input again, so that a change can be applied to it and
    /// checked by the same rules as a new spec. Destructured in full: a new
    /// spec field does not compile until it is carried here.
    fn from(spec: &PoolSpec) -> Self {
        let PoolSpec {
            replicas,
            version,
            image,
            failure_domains,
            extra_mounts,
            labels,
            strategy,
            paused,
            cluster,
            engines,
            engine_selector,
            min_ready_seconds,
            progress_deadline_seconds,
            machine_ready_timeout_seconds,
        } = spec.clone();
        let RolloutStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = strategy;
        RawSpec {
            replicas: i64::from(replicas),
            version: version.to_string(),
            image,
            failure_domains,
            extra_mounts,
            labels,
            max_surge: Some(max_surge),
            max_unavailable: Some(max_unavailable),
            batch_approval,
            auto_rollback,
            replacement: Some(replacement),
            paused,
            cluster,
            min_ready_seconds: Some(i64::from(min_ready_seconds)),
            progress_deadline_seconds: Some(i64::from(progress_deadline_seconds)),
            machine_ready_timeout_seconds: Some(i64::from(machine_ready_timeout_seconds)),
            engines,
            engine_selector,
        }
    }
}

/// Longest duration setting: one day.
pub const MAX_SECONDS: i64 = 86_400;

/// Checks every rule and returns the spec, or every broken rule.
pub fn validate(raw: RawSpec, limits: &SpecLimits) -> Result<PoolSpec, ValidationErrors> {
    let mut errs = ValidationErrors::default();

    let replicas = match u32::try_from(raw.replicas) {
        Ok(r) if r <= limits.max_replicas => r,
        _ => {
            errs.push(
                "replicas",
                "range",
                format!("must be between 0 and {} (got {})", limits.max_replicas, raw.replicas),
            );
            0
        }
    };
    let parsed = raw.version.parse::<KubeVersion>();
    let version = parsed.clone().unwrap_or_else(|e| {
        errs.push("version", "version", e);
        KubeVersion { major: 0, minor: 0, patch: 0 }
    });
    match (raw.image.as_deref().map(check_image_reference), &parsed) {
        (Some(Err(e)), _) => errs.push("image", "image_reference", e),
        // No image can be named while the version it would come from is bad.
        (None, Err(_)) => {}
        (Some(Ok(())), _) | (None, Ok(_)) => {
            let image = raw.image.clone().unwrap_or_else(|| node_image(version));
            let field = if raw.image.is_some() { "image" } else { "version" };
            limits.host.check_image(&image, field, &mut errs);
        }
    }
    check_failure_domains(&raw.failure_domains, &mut errs);
    check_mounts(&raw.extra_mounts, &limits.host, &mut errs);
    super::labels::check(&raw.labels, "labels", &mut errs);
    let defaults = RolloutStrategy::default();
    let strategy = RolloutStrategy {
        max_surge: raw.max_surge.unwrap_or(defaults.max_surge),
        max_unavailable: raw.max_unavailable.unwrap_or(defaults.max_unavailable),
        batch_approval: raw.batch_approval,
        auto_rollback: raw.auto_rollback,
        replacement: raw.replacement.unwrap_or_default(),
    };
    let mut seconds = |field: &str, v: Option<i64>, min: i64| -> Option<u32> {
        let v = v?;
        if (min..=MAX_SECONDS).contains(&v) {
            u32::try_from(v).ok()
        } else {
            errs.push(field, "range", format!("must be between {min} and {MAX_SECONDS} seconds (got {v})"));
            None
        }
    };
    let min_ready_seconds = seconds("min_ready_seconds", raw.min_ready_seconds, 0).unwrap_or(0);
    let progress_deadline_seconds = seconds("progress_deadline_seconds", raw.progress_deadline_seconds, 1)
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    let machine_ready_timeout_seconds = seconds("machine_ready_timeout_seconds", raw.machine_ready_timeout_seconds, 1)
        .unwrap_or(DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
    if progress_deadline_seconds <= min_ready_seconds {
        errs.push(
            "progress_deadline_seconds",
            "greater_than_min_ready",
            "must be greater than min_ready_seconds, or no rollout could ever show progress in time",
        );
    }
    if strategy.max_surge.is_zero() && strategy.max_unavailable.is_zero() {
        errs.push(
            "strategy",
            "strategy_bounds",
            "max_surge and max_unavailable must not both be zero, or no machine could ever be replaced",
        );
    }
    if let Some(Err(e)) = raw.cluster.as_deref().map(check_dns_label) {
        errs.push("cluster", "dns_label", e);
    }
    check_placement(&raw.engines, &raw.engine_selector, &mut errs);

    errs.into_result(PoolSpec {
        replicas,
        version,
        image: raw.image,
        failure_domains: raw.failure_domains,
        extra_mounts: raw.extra_mounts,
        labels: raw.labels,
        strategy,
        paused: raw.paused,
        cluster: raw.cluster,
        min_ready_seconds,
        progress_deadline_seconds,
        machine_ready_timeout_seconds,
        engines: raw.engines,
        engine_selector: raw.engine_selector,
    })
}

/// Engines by name or by labels, not both: one way to read a placement.
fn check_placement(engines: &[String], selector: &BTreeMap<String, String>, errs: &mut ValidationErrors) {
    if engines.len() > MAX_FAILURE_DOMAINS {
        errs.push("engines", "max_items", format!("at most {MAX_FAILURE_DOMAINS} engines"));
    }
    let mut seen = HashSet::new();
    for (i, e) in engines.iter().enumerate() {
        if let Err(why) = check_dns_label(e) {
            errs.push(format!("engines[{i}]"), "dns_label", why);
        } else if !seen.insert(e.as_str()) {
            errs.push(format!("engines[{i}]"), "unique", format!("duplicate engine {e:?}"));
        }
    }
    super::labels::check(selector, "engine_selector", errs);
    if !engines.is_empty() && !selector.is_empty() {
        errs.push("engine_selector", "one_placement", "name the engines or select them by labels, not both");
    }
}

fn check_failure_domains(domains: &[String], errs: &mut ValidationErrors) {
    if domains.len() > MAX_FAILURE_DOMAINS {
        errs.push("failure_domains", "max_items", format!("at most {MAX_FAILURE_DOMAINS} failure domains"));
    }
    let mut seen = HashSet::new();
    for (i, d) in domains.iter().enumerate() {
        let field = format!("failure_domains[{i}]");
        if d.is_empty() {
            errs.push(field, "non_empty", "must not be empty");
        } else if !super::labels::is_label_value(d) {
            errs.push(
                field,
                "label_value",
                "must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            );
        } else if !seen.insert(d.as_str()) {
            errs.push(field, "unique", format!("duplicate failure domain {d:?}"));
        }
    }
}

/// Checks each mount's shape, then the host path against `policy`.
pub fn check_mounts(mounts: &[Mount], policy: &HostPolicy, errs: &mut ValidationErrors) {
    if mounts.len() > MAX_MOUNTS {
        errs.push("extra_mounts", "max_items", format!("at most {MAX_MOUNTS} mounts"));
    }
    let mut targets = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let mut shaped = true;
        for (name, path) in [("container_path", &m.container_path), ("host_path", &m.host_path)] {
            let field = format!("extra_mounts[{i}].{name}");
            if !path.starts_with('/') {
                errs.push(field, "absolute_path", format!("must be an absolute path (got {path:?})"));
                shaped = false;
            } else if path.contains(['\0', ',', ':']) {
                errs.push(field, "path_chars", "must not contain NUL, ',' or ':'");
                shaped = false;
            }
        }
        if shaped {
            let field = format!("extra_mounts[{i}].host_path");
            match normalize_host_path(&m.host_path) {
                None => errs.push(field, "parent_reference", "must not contain `..`"),
                Some(host) => {
                    if let Some((rule, why)) = policy.refuse_mount(&host) {
                        errs.push(field, rule, why);
                    }
                }
            }
        }
        if !targets.insert(m.container_path.as_str()) {
            errs.push(format!("extra_mounts[{i}].container_path"), "unique", "two mounts share this container path");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawSpec {
        RawSpec { replicas: 3, version: "v1.29.2".into(), ..RawSpec::default() }
    }

    fn fields(r: Result<PoolSpec, ValidationErrors>) -> Vec<(String, &'static str)> {
        r.expect_err("spec was accepted").0.into_iter().map(|e| (e.field, e.rule)).collect()
    }

    #[test]
    fn a_minimal_spec_gets_the_defaults() {
        let spec = validate(raw(), &SpecLimits::default()).unwrap();
        assert_eq!(spec.strategy, RolloutStrategy::default());
        assert_eq!(spec.desired_image(), "kindest/node:v1.29.2");
        let spec = validate(RawSpec { image: Some("app:1".into()), ..raw() }, &SpecLimits::default()).unwrap();
        assert_eq!(spec.desired_image(), "app:1");
    }

    #[test]
    fn replicas_edges() {
        let limits = &SpecLimits { max_replicas: 1000, ..SpecLimits::default() };
        for ok in [0, 1, 1000] {
            assert!(validate(RawSpec { replicas: ok, ..raw() }, limits).is_ok(), "{ok}");
        }
        for bad in [-1, 1001, i64::MAX, i64::MIN] {
            assert_eq!(fields(validate(RawSpec { replicas: bad, ..raw() }, limits)), [("replicas".into(), "range")]);
        }
        let small = &SpecLimits { max_replicas: 5, ..SpecLimits::default() };
        assert!(validate(RawSpec { replicas: 6, ..raw() }, small).is_err());
    }

    #[test]
    fn version_and_image_are_checked() {
        let r = validate(
            RawSpec { version: "1.29".into(), image: Some("Bad Image".into()), ..raw() },
            &SpecLimits::default(),
        );
        assert_eq!(fields(r), [("version".into(), "version"), ("image".into(), "image_reference")]);
    }

    #[test]
    fn failure_domains_must_be_unique_and_non_empty() {
        let fd = |v: &[&str]| RawSpec { failure_domains: v.iter().map(|s| s.to_string()).collect(), ..raw() };
        assert!(validate(fd(&["a", "b", "zone-1.x_y"]), &SpecLimits::default()).is_ok());
        assert_eq!(
            fields(validate(fd(&["a", ""]), &SpecLimits::default())),
            [("failure_domains[1]".into(), "non_empty")]
        );
        assert_eq!(
            fields(validate(fd(&["a", "b", "a"]), &SpecLimits::default())),
            [("failure_domains[2]".into(), "unique")]
        );
        assert_eq!(
            fields(validate(fd(&["-a"]), &SpecLimits::default())),
            [("failure_domains[0]".into(), "label_value")]
        );
        assert_eq!(
            fields(validate(fd(&[&"a".repeat(64)]), &SpecLimits::default())),
            [("failure_domains[0]".into(), "label_value")]
        );
    }

    #[test]
    fn mounts_must_be_absolute_and_distinct() {
        let m = |c: &str, h: &str| Mount { container_path: c.into(), host_path: h.into(), read_only: false };
        let spec = |ms: Vec<Mount>| RawSpec { extra_mounts: ms, ..raw() };
        let srv = &SpecLimits { host: HostPolicy::new(&["/srv".into()], &["*".into()], &[]), ..SpecLimits::default() };
        assert!(validate(spec(vec![m("/data", "/srv/data")]), srv).is_ok());
        assert_eq!(
            fields(validate(spec(vec![m("/d", "/srv/../etc")]), srv)),
            [("extra_mounts[0].host_path".into(), "parent_reference")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("data", "/srv")]), &SpecLimits::default())),
            [("extra_mounts[0].container_path".into(), "absolute_path")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/data", "./srv")]), &SpecLimits::default())),
            [("extra_mounts[0].host_path".into(), "absolute_path")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/a:b", "/srv")]), srv)),
            [("extra_mounts[0].container_path".into(), "path_chars")]
        );
        assert_eq!(
            fields(validate(spec(vec![m("/d", "/srv/a"), m("/d", "/srv/b")]), srv)),
            [("extra_mounts[1].container_path".into(), "unique")]
        );
    }

    #[test]
    fn host_paths_need_an_allowed_directory_and_never_expose_the_host() {
        let m = |h: &str| RawSpec {
            extra_mounts: vec![Mount { container_path: "/m".into(), host_path: h.into(), read_only: false }],
            ..raw()
        };
        let rule = |h: &str, policy: &HostPolicy| {
            let limits = SpecLimits { host: policy.clone(), ..SpecLimits::default() };
            validate(m(h), &limits).err().map(|e| e.0[0].rule)
        };
        let default = HostPolicy::default();
        assert_eq!(rule("/srv/data", &default), Some("host_path_allowed"), "no mounts unless allowed");
        let data_dir = "/home/drover/data".to_owned();
        let all = HostPolicy::new(&["/".into()], &["*".into()], std::slice::from_ref(&data_dir));
        assert_eq!(rule("/etc", &all), None);
        assert_eq!(rule("/", &all), Some("host_path_protected"), "`/` is named, but it holds the Docker socket");
        for exposing in ["/var/run/docker.sock", "/var/run", "/var", "/run/docker.sock", "//var//run/./docker.sock"] {
            assert_eq!(rule(exposing, &all), Some("host_path_protected"), "{exposing}");
        }
        for exposing in ["/home/drover/data", "/home/drover", "/home/drover/data/drover.db"] {
            assert_eq!(rule(exposing, &all), Some("host_path_protected"), "{exposing}");
        }
        assert_eq!(rule("/home/drover-other", &all), None, "a sibling with a common prefix is not inside");
        let srv = HostPolicy::new(&["/srv".into()], &["*".into()], &[]);
        assert_eq!(rule("/", &srv), Some("host_path_allowed"));
        let socket = HostPolicy::new(&["/var/run/docker.sock".into()], &["*".into()], &[]);
        assert_eq!(rule("/var/run/docker.sock", &socket), None, "named exactly, so allowed");
    }

    #[test]
    fn images_must_match_the_allowed_references() {
        let policy = HostPolicy::new(&[], &["registry.example.com/team/*".into(), "kindest/node:v1.29.2".into()], &[]);
        let limits = SpecLimits { host: policy, ..SpecLimits::default() };
        assert!(validate(raw(), &limits).is_ok(), "kindest/node:v1.29.2 is listed");
        let ok = RawSpec { image: Some("registry.example.com/team/app:1".into()), ..raw() };
        assert!(validate(ok, &limits).is_ok());
        let other = RawSpec { image: Some("evil.example.com/team/app:1".into()), ..raw() };
        assert_eq!(fields(validate(other, &limits)), [("image".into(), "image_allowed")]);
        let version = RawSpec { version: "v1.30.0".into(), ..raw() };
        assert_eq!(fields(validate(version, &limits)), [("version".into(), "image_allowed")]);
    }

    #[test]
    fn labels_follow_kubernetes_rules_and_keep_drover_prefix_reserved() {
        let l = |k: &str, v: &str| RawSpec { labels: [(k.to_string(), v.to_string())].into(), ..raw() };
        assert!(validate(l("team", "infra"), &SpecLimits::default()).is_ok());
        assert!(validate(l("example.com/tier", ""), &SpecLimits::default()).is_ok());
        assert_eq!(
            fields(validate(l("drover.dev/pool", "x"), &SpecLimits::default())),
            [("labels.drover.dev/pool".into(), "reserved_label")]
        );
        assert_eq!(
            fields(validate(l("bad key", "x"), &SpecLimits::default())),
            [("labels.bad key".into(), "label_key")]
        );
        assert_eq!(fields(validate(l("/x", "x"), &SpecLimits::default())), [("labels./x".into(), "label_key")]);
        assert_eq!(fields(validate(l("k", "-v"), &SpecLimits::default())), [("labels.k".into(), "label_value")]);
    }

    #[test]
    fn strategy_with_both_bounds_zero_is_refused() {
        let s = RawSpec {
            max_surge: Some(IntOrPercent::Count(0)),
            max_unavailable: Some(IntOrPercent::Percent(0)),
            ..raw()
        };
        assert_eq!(fields(validate(s, &SpecLimits::default())), [("strategy".into(), "strategy_bounds")]);
        let seed = RawSpec {
            max_surge: Some(IntOrPercent::Percent(100)),
            max_unavailable: Some(IntOrPercent::Count(0)),
            ..raw()
        };
        assert!(validate(seed, &SpecLimits::default()).is_ok());
    }

    #[test]
    fn durations_have_ranges_and_the_deadline_exceeds_min_ready() {
        let ok = RawSpec {
            min_ready_seconds: Some(5),
            progress_deadline_seconds: Some(6),
            machine_ready_timeout_seconds: Some(1),
            ..raw()
        };
        let spec = validate(ok, &SpecLimits::default()).unwrap();
        assert_eq!(
            (spec.min_ready_seconds, spec.progress_deadline_seconds, spec.machine_ready_timeout_seconds),
            (5, 6, 1)
        );
        let d = validate(raw(), &SpecLimits::default()).unwrap();
        assert_eq!((d.min_ready_seconds, d.progress_deadline_seconds, d.machine_ready_timeout_seconds), (0, 600, 300));
        let r = |s: RawSpec| fields(validate(s, &SpecLimits::default()));
        assert_eq!(r(RawSpec { min_ready_seconds: Some(-1), ..raw() }), [("min_ready_seconds".into(), "range")]);
        assert_eq!(
            r(RawSpec { progress_deadline_seconds: Some(0), ..raw() }),
            [("progress_deadline_seconds".into(), "range")]
        );
        assert_eq!(
            r(RawSpec { machine_ready_timeout_seconds: Some(86_401), ..raw() }),
            [("machine_ready_timeout_seconds".into(), "range")]
        );
        assert_eq!(
            r(RawSpec { min_ready_seconds: Some(60), progress_deadline_seconds: Some(60), ..raw() }),
            [("progress_deadline_seconds".into(), "greater_than_min_ready")]
        );
    }

    #[test]
    fn a_spec_turned_back_into_input_validates_to_itself() {
        let rich = RawSpec {
            image: Some("app:1".into()),
            failure_domains: vec!["a".into(), "b".into()],
            labels: [("team".to_owned(), "infra".to_owned())].into(),
            max_surge: Some(IntOrPercent::Percent(25)),
            batch_approval: true,
            replacement: Some(ReplacementPolicy::TerminationComplete),
            paused: true,
            min_ready_seconds: Some(3),
            machine_ready_timeout_seconds: Some(60),
            engines: vec!["local".into()],
            ..raw()
        };
        let spec = validate(rich, &SpecLimits::default()).unwrap();
        assert_eq!(validate(RawSpec::from(&spec), &SpecLimits::default()).unwrap(), spec);
    }

    #[test]
    fn cluster_must_be_a_dns_label() {
        assert_eq!(
            fields(validate(RawSpec { cluster: Some("Prod".into()), ..raw() }, &SpecLimits::default())),
            [("cluster".into(), "dns_label")]
        );
    }
}
