//! Opting out must show: a test that needs Docker or a browser is listed as
//! ignored when the user opts out (README.md, "Tests"), and never passes
//! without having run. That holds only if each such test carries the
//! `cfg_attr` that `build.rs`'s cfg turns into `ignore`; these tests read
//! the sources of `tests/api/` and fail on any test that does not, or that
//! carries one without needing it.

use std::path::Path;

/// What a test that needs a tool calls, and the attribute it must carry.
const NEEDS: [(&str, &str); 2] = [
    ("require_docker();", "#[cfg_attr(skip_docker_tests, ignore = \"DROVER_SKIP_DOCKER_TESTS is set\")]"),
    ("Browser::start", "#[cfg_attr(skip_browser_tests, ignore = \"DROVER_SKIP_BROWSER_TESTS is set\")]"),
];

/// Calls that reach the Docker engine: a test making one directly must
/// also call `require_docker()`, which fails with the reason when the
/// engine is missing (and so must carry the attribute).
const DOCKER_USES: [&str; 3] = ["spawn_docker_app(", "docker::client(", "ExtraEngine::start("];

/// One top-level function of a source file: its attribute lines, its name
/// and the lines of its body (comments left out).
struct Function<'a> {
    attributes: Vec<&'a str>,
    name: &'a str,
    body: Vec<&'a str>,
}

impl Function<'_> {
    fn is_test(&self) -> bool {
        self.attributes.iter().any(|a| a.starts_with("#[tokio::test") || a.starts_with("#[test]"))
    }

    fn calls(&self, needle: &str) -> bool {
        self.body.iter().any(|l| l.contains(needle))
    }
}

/// The top-level functions of `source`, as rustfmt lays them out: the
/// signature at column 0, the closing brace alone at column 0.
fn functions(source: &str) -> Vec<Function<'_>> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let signature = ["fn ", "async fn ", "pub fn ", "pub async fn ", "pub(crate) fn ", "pub(crate) async fn "]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix));
        let Some(rest) = signature else { continue };
        let name = rest.split(['(', '<']).next().unwrap_or(rest);
        let attributes: Vec<&str> =
            lines[..i].iter().rev().take_while(|l| l.starts_with("#[") || l.starts_with("///")).copied().collect();
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| **l != "}")
            .filter(|l| !l.trim_start().starts_with("//"))
            .copied()
            .collect();
        found.push(Function { attributes, name, body });
    }
    found
}

/// What is wrong in `source` (the file `file`), one line per test.
fn problems(file: &str, source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for f in functions(source) {
        for (call, attribute) in NEEDS {
            let (calls, carries) = (f.calls(call), f.attributes.contains(&attribute));
            match (f.is_test(), calls, carries) {
                (true, true, false) => out.push(format!("{file}: {} calls {call} but lacks {attribute}", f.name)),
                (true, false, true) => {
                    out.push(format!("{file}: {} carries {attribute} but never calls {call}", f.name))
                }
                (false, true, _) => out.push(format!(
                    "{file}: {} calls {call} but is not a test: call it from each test, where this check sees it",
                    f.name
                )),
                _ => {}
            }
        }
        if f.is_test() && !f.calls(NEEDS[0].0) {
            for used in DOCKER_USES.iter().filter(|u| f.calls(u)) {
                out.push(format!("{file}: {} calls {used} without require_docker()", f.name));
            }
        }
    }
    out
}

#[test]
fn every_test_that_needs_docker_or_a_browser_is_ignored_when_the_user_opts_out() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api");
    let this = Path::new(file!()).file_name().expect("this file's name");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())).path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs") && p.file_name() != Some(this))
        .collect();
    files.sort();
    assert!(files.len() > 20, "the test sources were not found in {}: {files:?}", dir.display());
    let (mut found, mut needing) = (Vec::new(), 0);
    for path in &files {
        let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        needing += functions(&source).iter().filter(|f| f.is_test() && NEEDS.iter().any(|(c, _)| f.calls(c))).count();
        found.extend(problems(&file, &source));
    }
    assert!(found.is_empty(), "tests that would pass or fail instead of being ignored:\n{}", found.join("\n"));
    // The scan saw the tests it exists for (it did not silently match nothing).
    assert!(needing >= 30, "only {needing} tests need Docker or a browser: does the scan still find them?");
}

#[test]
fn the_opt_out_check_names_a_docker_test_without_the_attribute_and_every_other_mistake() {
    let source = r#"
#[tokio::test]
async fn needs_docker_but_is_not_marked() {
    require_docker();
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn marked_for_a_browser_it_never_starts() {
    let app = spawn_app().await;
}

async fn a_helper_that_hides_the_need() {
    require_docker();
}

#[tokio::test]
async fn uses_docker_without_asking_for_it() {
    let d = docker::client().await;
}

#[tokio::test]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn done_right() {
    require_docker();
    let d = docker::client().await;
}
"#;
    let found = problems("x.rs", source);
    let named = |name: &str| found.iter().filter(|p| p.contains(&format!(" {name} "))).count();
    assert_eq!(named("needs_docker_but_is_not_marked"), 1, "{found:#?}");
    assert_eq!(named("marked_for_a_browser_it_never_starts"), 1, "{found:#?}");
    assert_eq!(named("a_helper_that_hides_the_need"), 1, "{found:#?}");
    assert_eq!(named("uses_docker_without_asking_for_it"), 1, "{found:#?}");
    assert_eq!(named("done_right"), 0, "{found:#?}");
    assert_eq!(found.len(), 4, "{found:#?}");
}
