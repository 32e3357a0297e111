//! Test images, built locally: no registry can be reached, so nothing is
//! pulled. Each is `FROM scratch` with one static program, `machine.rs`
//! beside this file, which the harness compiles with the Rust toolchain
//! that builds the tests. Nothing else has to be installed on the host.
//! Shared by the integration tests and the benchmarks.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Versions whose `kindest/node:<version>` tags the harness builds locally;
/// no real kind image has these versions, so a developer's images are safe.
pub const V1: &str = "v1.99.1";
pub const V2: &str = "v1.99.2";
/// An image whose container exits at once with code 3.
pub const CRASH_IMAGE: &str = "drover-test/crash:1";
/// A plain long-running image that is not a node image.
pub const PLAIN_IMAGE: &str = "drover-test/plain:1";
/// Long-running images whose process ignores SIGTERM, so that stopping one
/// takes the whole grace period, as a real node does while it shuts down.
pub const STUBBORN_V1: &str = "drover-test/stubborn:1";
pub const STUBBORN_V2: &str = "drover-test/stubborn:2";
/// A long-running image with a Docker HEALTHCHECK that passes.
pub const HEALTHY_IMAGE: &str = "drover-test/healthy:1";

/// `docker <args>`, its trimmed output; fails the caller with the reason,
/// a hung engine included (`command.rs` bounds the wait).
pub fn docker(args: &[&str]) -> String {
    crate::command::docker(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Compiles `machine.rs` into a static binary in `dir`.
fn compile_machine(dir: &std::path::Path) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/machine.rs");
    let out = dir.join("machine");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let status = Command::new(&rustc)
        .args(["--edition", "2024", "-O", "-C", "target-feature=+crt-static", "-C", "panic=abort"])
        .args(["-C", "strip=symbols", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("running {rustc} to build the test images' program: {e}"));
    assert!(
        status.success(),
        "{rustc} could not build {} as a static binary (the C library's static archive, libc.a, \
         comes with gcc's libc6-dev on Debian)",
        source.display()
    );
    out
}

/// Builds the test images once per process.
pub fn build_once() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::TempDir::new().expect("build context");
        compile_machine(dir.path());
        let ctx = dir.path().to_str().expect("utf-8 path");
        let build = |tag: &str, body: &str| {
            std::fs::write(dir.path().join("Dockerfile"), body).expect("writing Dockerfile");
            docker(&["build", "-q", "-t", tag, ctx]);
        };
        // PID 1 exits on TERM, so that stopping a machine takes no grace period.
        build("drover-test/base:1", "FROM scratch\nCOPY machine /machine\nENTRYPOINT [\"/machine\"]\nCMD [\"run\"]\n");
        let variant = |label: &str, extra: &str| {
            format!("FROM drover-test/base:1\nLABEL drover.test.variant=\"{label}\"\n{extra}")
        };
        build(&format!("kindest/node:{V1}"), &variant(V1, ""));
        build(&format!("kindest/node:{V2}"), &variant(V2, ""));
        build(PLAIN_IMAGE, &variant("plain", ""));
        build(CRASH_IMAGE, &variant("crash", "CMD [\"exit\", \"3\"]\n"));
        build(STUBBORN_V1, &variant("stubborn-1", "CMD [\"run\", \"--ignore-term\"]\n"));
        build(STUBBORN_V2, &variant("stubborn-2", "CMD [\"run\", \"--ignore-term\"]\n"));
        build(
            HEALTHY_IMAGE,
            &variant("healthy", "HEALTHCHECK --interval=1s --timeout=1s CMD [\"/machine\", \"true\"]\n"),
        );
    });
}
