//! Control-plane upgrades as pure rules: the components and their names in
//! the cluster, the steps of an upgrade, job states, image references, and
//! kubeadm's version policy. No IO here; the runner in `crate::upgrade`
//! applies these rules to a live cluster.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::version::KubeVersion;

/// Namespace every self-hosted control-plane component lives in.
pub const NAMESPACE: &str = "kube-system";
/// Registry the component images come from unless a job names another.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "registry.k8s.io";
/// Prefix of the temporary copy of a component's DaemonSet.
pub const TEMP_PREFIX: &str = "temp-upgrade-";
/// Label key that selects the temporary copy's pods (and nothing else).
pub const TEMP_LABEL: &str = "temp-upgrade-component";
/// Annotation on the temporary copy naming the job that made it: a job
/// removes only its own copy.
pub const JOB_ANNOTATION: &str = "drover.dev/upgrade-job";
/// Label key carried by the real component's pods.
pub const COMPONENT_LABEL: &str = "k8s-app";

/// A control-plane component that runs self-hosted as a DaemonSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
}

impl Component {
    /// Every component, in the order an upgrade goes through them: the API
    /// server first, since the others talk to it.
    pub const ALL: [Component; 3] = [Self::KubeApiserver, Self::KubeControllerManager, Self::KubeScheduler];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::KubeApiserver => "kube-apiserver",
            Self::KubeControllerManager => "kube-controller-manager",
            Self::KubeScheduler => "kube-scheduler",
        }
    }

    /// The real DaemonSet: `self-hosted-<component>`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn daemonset(self) -> String {
        format!("self-hosted-{}", self.as_str())
    }

    /// The temporary copy: `temp-upgrade-self-hosted-<component>`.
    pub fn temp_daemonset(self) -> String {
        format!("{TEMP_PREFIX}{}", self.daemonset())
    }

    /// Selects the real component's pods.
    pub fn pod_selector(self) -> String {
        format!("{COMPONENT_LABEL}={}", self.daemonset())
    }

    /// Selects the temporary copy's pods.
    pub fn temp_pod_selector(self) -> String {
        format!("{TEMP_LABEL}={}", self.as_str())
    }

    /// `<repository>/<component>:<version>`, as kubeadm names the images.
    pub fn image(self, repository: &str, version: KubeVersion) -> String {
        format!("{}/{}:{version}", repository.trim_end_matches('/'), self.as_str())
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Component {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| {
            format!(
                "{s:?} is not a control-plane component; use kube-apiserver, kube-controller-manager or kube-scheduler"
            )
        })
    }
}

/// Puts components in upgrade order and refuses an empty list or repeats.
pub fn order_components(requested: &[Component]) -> Result<Vec<Component>, String> {
    if requested.is_empty() {
        return Err("must name at least one component".into());
    }
    let mut sorted = requested.to_vec();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("names {} twice", w[0]));
    }
    Ok(sorted)
}

/// The steps each component goes through (0-7, docs/upgrades.md), plus the two
/// ways a job winds down. The numbers are stored; never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// 0: exactly one pod runs the component.
    CheckPods,
    /// 1: create (or update) the temporary copy of the DaemonSet, by
    /// server-side apply.
    CreateTemp,
    /// 2: wait until the copy's pods are Running.
    WaitTempRunning,
    /// 3: set the real DaemonSet to the target image.
    UpdateDaemonSet,
    /// 4: wait until the old pod is gone.
    WaitOldPodGone,
    /// 5: wait until the component's new pods are Running.
    WaitNewRunning,
    /// 6: delete the temporary copy (foreground) and wait until it is gone.
    DeleteTemp,
    /// 7: wait until the API server's `/healthz` answers ok.
    WaitHealthy,
    /// Restore the saved DaemonSet spec, wait for it, remove the copy.
    Rollback,
    /// Remove the temporary copy after a cancel or an early failure.
    Cleanup,
}

impl Step {
    pub const UPGRADE: [Step; 8] = [
        Self::CheckPods,
        Self::CreateTemp,
        Self::WaitTempRunning,
        Self::UpdateDaemonSet,
        Self::WaitOldPodGone,
        Self::WaitNewRunning,
        Self::DeleteTemp,
        Self::WaitHealthy,
    ];

    pub fn number(self) -> i64 {
        self as i64
    }

    pub fn from_number(n: i64) -> Option<Self> {
        [Self::UPGRADE.as_slice(), &[Self::Rollback, Self::Cleanup]].concat().into_iter().find(|s| s.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::CheckPods => "check_pods",
            Self::CreateTemp => "create_temp",
            Self::WaitTempRunning => "wait_temp_running",
            Self::UpdateDaemonSet => "update_daemonset",
            Self::WaitOldPodGone => "wait_old_pod_gone",
            Self::WaitNewRunning => "wait_new_running",
            Self::DeleteTemp => "delete_temp",
            Self::WaitHealthy => "wait_healthy",
            Self::Rollback => "rollback",
            Self::Cleanup => "cleanup",
        }
    }

    /// What the step does to `c`, for plans and people.
    pub fn describe(self, c: Component) -> String {
        let (ds, temp) = (c.daemonset(), c.temp_daemonset());
        match self {
            Self::CheckPods => format!("check that exactly one pod matches {}", c.pod_selector()),
            Self::CreateTemp => format!("create or update the temporary DaemonSet {temp} (server-side apply)"),
            Self::WaitTempRunning => format!("wait until the pods matching {} are Running", c.temp_pod_selector()),
            Self::UpdateDaemonSet => format!("update DaemonSet {ds} to the new image"),
            Self::WaitOldPodGone => "wait until the old pod has disappeared".into(),
            Self::WaitNewRunning => format!("wait until the pods matching {} run the new image", c.pod_selector()),
            Self::DeleteTemp => {
                format!("once {ds}'s pods run its new template, delete DaemonSet {temp} with foreground propagation")
            }
            Self::WaitHealthy => "wait until the API server's /healthz answers ok".into(),
            Self::Rollback => format!("restore DaemonSet {ds} to its saved spec and delete {temp}"),
            Self::Cleanup => format!("once {ds}'s pods run its template, delete DaemonSet {temp} if it exists"),
        }
    }

    /// Whether the step changes the cluster. A step that only looks may be
    /// dropped at any point (on shutdown) and redone; one that writes is
    /// let finish its write.
    pub fn writes_cluster(self) -> bool {
        matches!(self, Self::CreateTemp | Self::UpdateDaemonSet | Self::DeleteTemp | Self::Rollback | Self::Cleanup)
    }

    /// The step after this one within a component, if any.
    pub fn next(self) -> Option<Step> {
        Self::from_number(self.number() + 1).filter(|s| *s <= Self::WaitHealthy)
    }
}

/// The life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted; the runner has not picked it up yet.
    Pending,
    Running,
    Succeeded,
    /// Stopped on an error; `error` says why and what state it left.
    Failed,
    /// Stopped on request at a safe point.
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Running, Self::Succeeded, Self::Failed, Self::Cancelled]
            .into_iter()
            .find(|v| v.as_str() == s)
    }

    pub fn is_active(self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }
}

/// `as_str` and `parse` for an enum stored (and sent) as its snake_case name.
macro_rules! named {
    ($t:ident { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some(Self::$v),)* _ => None }
            }
        }
    };
}

/// Where one component of a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ComponentState {
    /// Not reached yet.
    Pending,
    /// Its steps are running.
    Upgrading,
    /// Runs the new image.
    Upgraded,
    /// Failed, and runs its saved spec again.
    RolledBack,
    /// Failed, or its wind-down did; the job's error says what it runs.
    Failed,
    /// The job was cancelled while it was this component's turn.
    Cancelled,
    /// The job ended before this component's turn.
    Skipped,
}

named!(ComponentState {
    Pending => "pending",
    Upgrading => "upgrading",
    Upgraded => "upgraded",
    RolledBack => "rolled_back",
    Failed => "failed",
    Cancelled => "cancelled",
    Skipped => "skipped",
});

/// How one step's latest attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Running,
    Succeeded,
    Failed,
}

named!(StepState { Running => "running", Succeeded => "succeeded", Failed => "failed" });

/// How a job that will not finish its upgrade winds down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindDown {
    /// Restore the current component's saved spec.
    Rollback,
    /// Remove the temporary copy, leaving the component as it runs.
    Cleanup,
}

named!(WindDown { Rollback => "rollback", Cleanup => "cleanup" });

/// A rule of the version policy a request broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyViolation {
    /// Stable name of the rule: `no_downgrade`, `major_version`, `minor_skip`.
    pub rule: &'static str,
    pub message: String,
}

/// kubeadm's version policy: the target may not be older than the running
/// version, may not change the major version, and may move at most one
/// minor version ahead (each minor release only supports skew of one).
/// `force` lifts every rule.
pub fn check_version_policy(current: KubeVersion, target: KubeVersion, force: bool) -> Result<(), PolicyViolation> {
    if force {
        return Ok(());
    }
    let hint = "pass \"force\": true to override";
    if target < current {
        return Err(PolicyViolation {
            rule: "no_downgrade",
            message: format!("{target} is older than the cluster's {current}; downgrades are not supported ({hint})"),
        });
    }
    if target.major != current.major {
        return Err(PolicyViolation {
            rule: "major_version",
            message: format!("{current} to {target} changes the major version, which is not supported ({hint})"),
        });
    }
    if target.minor > current.minor + 1 {
        return Err(PolicyViolation {
            rule: "minor_skip",
            message: format!(
                "{current} to {target} skips minor version v{}.{}; upgrade one minor version at a time ({hint})",
                current.major,
                current.minor + 1
            ),
        });
    }
    Ok(())
}

/// The release version in an API server's `gitVersion` or an image tag:
/// `v1.29.2`, `v1.29.2-rc.1`, `v1.29.2+k3s1` all give v1.29.2. A build
/// suffix says nothing the policy cares about.
pub fn release_version(s: &str) -> Option<KubeVersion> {
    let end = s.find(['-', '+']).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// The version in an image reference's tag (`registry.k8s.io/kube-apiserver:v1.29.2`).
pub fn image_version(image: &str) -> Option<KubeVersion> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let (_, tag) = last.rsplit_once(':')?;
    release_version(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KubeVersion {
        s.parse().unwrap()
    }

    #[test]
    fn policy_allows_patch_and_next_minor_upgrades() {
        for (cur, target) in
            [("v1.29.2", "v1.29.2"), ("v1.29.2", "v1.29.5"), ("v1.29.2", "v1.30.0"), ("v1.29.9", "v1.30.1")]
        {
            assert_eq!(check_version_policy(v(cur), v(target), false), Ok(()), "{cur} -> {target}");
        }
    }

    #[test]
    fn policy_names_the_rule_it_enforces() {
        let rule = |cur, target| check_version_policy(v(cur), v(target), false).unwrap_err().rule;
        assert_eq!(rule("v1.29.2", "v1.29.1"), "no_downgrade");
        assert_eq!(rule("v1.29.2", "v1.28.9"), "no_downgrade");
        assert_eq!(rule("v1.29.2", "v1.31.0"), "minor_skip");
        assert_eq!(rule("v1.29.2", "v2.29.2"), "major_version");
        assert_eq!(rule("v1.29.2", "v2.0.0"), "major_version");
    }

    #[test]
    fn force_lifts_every_rule() {
        for (cur, target) in [("v1.29.2", "v1.28.0"), ("v1.29.2", "v1.32.0"), ("v1.29.2", "v2.0.0")] {
            assert_eq!(check_version_policy(v(cur), v(target), true), Ok(()));
        }
    }

    #[test]
    fn violations_say_how_to_override() {
        let err = check_version_policy(v("v1.29.2"), v("v1.31.0"), false).unwrap_err();
        assert!(err.message.contains("v1.30") && err.message.contains("force"), "{}", err.message);
    }

    #[test]
    fn versions_are_read_from_tags_and_git_versions() {
        assert_eq!(image_version("registry.k8s.io/kube-apiserver:v1.29.2"), Some(v("v1.29.2")));
        assert_eq!(image_version("localhost:5000/kube-apiserver:v1.29.2@sha256:abc"), Some(v("v1.29.2")));
        assert_eq!(image_version("localhost:5000/kube-apiserver"), None);
        assert_eq!(image_version("kube-apiserver:latest"), None);
        assert_eq!(release_version("v1.29.2+k3s1"), Some(v("v1.29.2")));
        assert_eq!(release_version("v1.30.0-rc.1"), Some(v("v1.30.0")));
    }

    #[test]
    fn components_have_kubeadms_names_and_order() {
        assert_eq!(Component::KubeApiserver.daemonset(), "self-hosted-kube-apiserver");
        assert_eq!(Component::KubeScheduler.temp_daemonset(), "temp-upgrade-self-hosted-kube-scheduler");
        assert_eq!(Component::KubeScheduler.pod_selector(), "k8s-app=self-hosted-kube-scheduler");
        assert_eq!(Component::KubeScheduler.temp_pod_selector(), "temp-upgrade-component=kube-scheduler");
        assert_eq!(
            Component::KubeControllerManager.image("registry.k8s.io/", v("v1.30.0")),
            "registry.k8s.io/kube-controller-manager:v1.30.0"
        );
        let order = order_components(&[Component::KubeScheduler, Component::KubeApiserver]).unwrap();
        assert_eq!(order, vec![Component::KubeApiserver, Component::KubeScheduler]);
        assert!(order_components(&[]).is_err());
        assert!(order_components(&[Component::KubeScheduler, Component::KubeScheduler]).is_err());
    }

    #[test]
    fn steps_round_trip_and_follow_each_other() {
        for s in Step::UPGRADE.into_iter().chain([Step::Rollback, Step::Cleanup]) {
            assert_eq!(Step::from_number(s.number()), Some(s));
        }
        assert_eq!(Step::WaitHealthy.next(), None);
        assert_eq!(Step::CheckPods.next(), Some(Step::CreateTemp));
    }
}
