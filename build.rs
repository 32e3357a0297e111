//! Turns the test opt-outs into cfgs, so that an opted-out test is listed
//! as ignored rather than reported as passed (README.md, "Tests"):
//! `DROVER_SKIP_DOCKER_TESTS` sets `skip_docker_tests` and
//! `DROVER_SKIP_BROWSER_TESTS` sets `skip_browser_tests`; the tests that
//! need Docker or a browser carry `#[cfg_attr(<cfg>, ignore = "...")]`.

/// Each opt-out variable and the cfg it sets.
const OPT_OUTS: [(&str, &str); 2] =
    [("DROVER_SKIP_DOCKER_TESTS", "skip_docker_tests"), ("DROVER_SKIP_BROWSER_TESTS", "skip_browser_tests")];

fn main() {
    for (var, cfg) in OPT_OUTS {
        // Rerun when the variable changes (and only then: no source is read).
        println!("cargo:rerun-if-env-changed={var}");
        println!("cargo:rustc-check-cfg=cfg({cfg})");
        // Set and non-empty, as scripts/test.sh reads it.
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
}
