//! Test images built locally from the static busybox binary: no registry
//! can be reached here, so nothing is pulled. Shared by the integration
//! tests and the benchmarks.

use std::process::Command;
use std::sync::OnceLock;

/// Versions whose `kindest/node:<version>` tags the harness builds locally;
/// no real kind image has these versions, so a developer's images are safe.
pub const V1: &str = "v1.99.1";
pub const V2: &str = "v1.99.2";
/// An image whose container exits at once.
pub const CRASH_IMAGE: &str = "drover-test/crash:1";
/// A plain long-running image that is not a node image.
pub const PLAIN_IMAGE: &str = "drover-test/plain:1";
pub const BUSYBOX: &str = "/bin/busybox";

pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).env("DOCKER_BUILDKIT", "0").output().expect("running docker");
    assert!(out.status.success(), "docker {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Builds the test images once per process.
pub fn build_once() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::TempDir::new().expect("build context");
        std::fs::copy(BUSYBOX, dir.path().join("busybox")).expect("copying busybox");
        let ctx = dir.path().to_str().expect("utf-8 path");
        let dockerfile = |body: &str| {
            std::fs::write(dir.path().join("Dockerfile"), body).expect("writing Dockerfile");
        };
        // PID 1 exits on TERM, so that stopping a machine takes no grace period.
        dockerfile(
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n\
             CMD [\"/bin/sh\", \"-c\", \"trap 'exit 0' TERM; sleep 1000000 & wait\"]\n",
        );
        docker(&["build", "-q", "-t", "drover-test/base:1", ctx]);
        for (tag, label) in
            [(format!("kindest/node:{V1}"), V1), (format!("kindest/node:{V2}"), V2), (PLAIN_IMAGE.to_owned(), "plain")]
        {
            dockerfile(&format!("FROM drover-test/base:1\nLABEL drover.test.variant=\"{label}\"\n"));
            docker(&["build", "-q", "-t", &tag, ctx]);
        }
        dockerfile(
            "FROM drover-test/base:1\nLABEL drover.test.variant=\"crash\"\nCMD [\"/bin/sh\", \"-c\", \"exit 3\"]\n",
        );
        docker(&["build", "-q", "-t", CRASH_IMAGE, ctx]);
    });
}
