//! What the server's settings let machines reach and run: the host paths
//! pools may bind-mount, the images they may run, and the largest pool.
//! Checked when a spec is written, and again on every pass (the settings
//! may have been tightened since).

use std::collections::HashSet;

use super::spec::{MAX_MOUNTS, Mount, PoolSpec};
use crate::domain::ValidationErrors;

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

impl SpecLimits {
    /// No limit from settings: for specs read back from the store, which
    /// passed the settings of their day (today's are checked on each pass).
    pub fn unrestricted() -> Self {
        let host = HostPolicy { mount_dirs: vec!["/".into()], protected: Vec::new(), images: vec!["*".into()] };
        Self { max_replicas: u32::MAX, host }
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
        check_mounts(spec.extra_mounts(), self, &mut errs);
        (!errs.is_empty()).then(|| errs.to_string())
    }

    /// Refuses, under `field`, an image this policy does not let machines run.
    pub(super) fn check_image(&self, image: &str, field: &str, errs: &mut ValidationErrors) {
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
    use crate::domain::pool::PoolSpecInput;

    fn input() -> PoolSpecInput {
        PoolSpecInput::minimal(3, "v1.29.2")
    }

    fn first_rule(input: PoolSpecInput, limits: &SpecLimits) -> Option<&'static str> {
        PoolSpec::parse(input, limits).err().map(|e| e.0[0].static_rule())
    }

    #[test]
    fn host_paths_need_an_allowed_directory_and_never_expose_the_host() {
        let m = |h: &str| PoolSpecInput {
            extra_mounts: vec![Mount { container_path: "/m".into(), host_path: h.into(), read_only: false }],
            ..input()
        };
        let rule = |h: &str, policy: &HostPolicy| {
            let limits = SpecLimits { host: policy.clone(), ..SpecLimits::default() };
            first_rule(m(h), &limits)
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
        assert!(PoolSpec::parse(input(), &limits).is_ok(), "kindest/node:v1.29.2 is listed");
        let ok = PoolSpecInput { image: Some("registry.example.com/team/app:1".into()), ..input() };
        assert!(PoolSpec::parse(ok, &limits).is_ok());
        let other = PoolSpecInput { image: Some("evil.example.com/team/app:1".into()), ..input() };
        let refused = PoolSpec::parse(other, &limits).expect_err("accepted");
        assert_eq!((refused.0[0].field.as_str(), refused.0[0].static_rule()), ("image", "image_allowed"));
        let version = PoolSpecInput { version: "v1.30.0".into(), ..input() };
        let refused = PoolSpec::parse(version, &limits).expect_err("accepted");
        assert_eq!((refused.0[0].field.as_str(), refused.0[0].static_rule()), ("version", "image_allowed"));
    }
}
