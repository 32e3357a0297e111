//! Reading fleet files: paths and directories into documents, each with
//! where it came from, and secrets given by reference read in.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::apply::document::{Kind, MAX_DOCUMENTS, SECRET_FIELDS, SecretRef};
use crate::apply::source::{self, MAX_FILE_BYTES};
use crate::cli::client::CliError;

/// Largest secret read from a file: a kubeconfig or a PEM bundle.
const MAX_SECRET_BYTES: u64 = 1024 * 1024;

/// Where a document came from, as a person finds it in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file as named on the command line (`-` for standard input).
    pub file: String,
    /// 1-based position among the file's documents, empty ones counted.
    pub document: usize,
    /// For an item of a top-level list: its position in the list, 1-based.
    pub item: Option<usize>,
    pub line: u64,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} (document {}", self.file, self.line, self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        f.write_str(")")
    }
}

/// The documents of every file, in order, and where each came from.
#[derive(Debug, Default)]
pub struct Fleet {
    pub documents: Vec<Value>,
    pub origins: Vec<Origin>,
}

/// The fleet files `paths` name: a file as is, a directory's `.yaml`,
/// `.yml` and `.json` files in name order (with `recursive`, its
/// subdirectories' too, in the same order), hidden files left out.
pub fn expand(paths: &[PathBuf], recursive: bool) -> Result<Vec<PathBuf>, CliError> {
    let mut out = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            out.push(path.clone());
            continue;
        }
        let meta = std::fs::metadata(path).map_err(|e| usage(path, &e.to_string()))?;
        if meta.is_dir() {
            walk(path, recursive, &mut out)?;
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| usage(dir, &e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            if recursive {
                walk(&entry, recursive, out)?;
            }
        } else if entry.extension().is_some_and(|e| ["yaml", "yml", "json"].contains(&&*e.to_string_lossy())) {
            out.push(entry);
        }
    }
    Ok(())
}

fn usage(path: &Path, why: &str) -> CliError {
    CliError::Input(format!("{}: {why}", path.display()))
}

/// Reads every file: at most [`MAX_FILE_BYTES`] each (a larger one is
/// refused before it is read), at most [`MAX_DOCUMENTS`] documents in all.
pub fn read(files: &[PathBuf]) -> Result<Fleet, CliError> {
    let mut fleet = Fleet::default();
    for file in files {
        let shown = file.display().to_string();
        let text = read_bounded(file)?;
        let left = MAX_DOCUMENTS - fleet.documents.len();
        let docs = source::read(&text, left).map_err(|e| {
            let at = e.at.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default();
            CliError::Input(format!("{shown}{at}: {}", e.problem))
        })?;
        let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
        for doc in docs {
            let origin = Origin { file: shown.clone(), document: doc.number, item: doc.item, line: doc.line };
            let mut value = doc.value;
            resolve_secrets(&mut value, &base).map_err(|why| CliError::Input(format!("{origin}: {why}")))?;
            fleet.documents.push(value);
            fleet.origins.push(origin);
        }
    }
    Ok(fleet)
}

/// A file's bytes, refusing one over [`MAX_FILE_BYTES`] before reading it
/// (and reading no more than that of one that grows meanwhile).
fn read_bounded(file: &Path) -> Result<Vec<u8>, CliError> {
    let mut text = Vec::new();
    let too_large = |size: Option<u64>| usage(file, &source::too_large(size).problem.to_string());
    if file.as_os_str() == "-" {
        std::io::stdin().take(MAX_FILE_BYTES + 1).read_to_end(&mut text).map_err(|e| usage(file, &e.to_string()))?;
    } else {
        let f = std::fs::File::open(file).map_err(|e| usage(file, &e.to_string()))?;
        let size = f.metadata().map_err(|e| usage(file, &e.to_string()))?.len();
        if size > MAX_FILE_BYTES {
            return Err(too_large(Some(size)));
        }
        f.take(MAX_FILE_BYTES + 1).read_to_end(&mut text).map_err(|e| usage(file, &e.to_string()))?;
    }
    if text.len() as u64 > MAX_FILE_BYTES {
        // Read only up to the limit: its size is unknown.
        return Err(too_large(None));
    }
    Ok(text)
}

/// Replaces each secret field given by reference (`{file: PATH}`, relative
/// to `base`, or `{env: NAME}`) by what it names. A secret written inline
/// is refused: fleet files are meant for git.
pub fn resolve_secrets(doc: &mut Value, base: &Path) -> Result<(), String> {
    let Some(kind) = doc.get("kind").and_then(Value::as_str).and_then(Kind::parse) else { return Ok(()) };
    for (_, path) in SECRET_FIELDS.iter().filter(|(k, _)| *k == kind) {
        let Some(field) = path.iter().try_fold(&mut *doc, |v, key| v.get_mut(*key)) else { continue };
        let shown = path.join(".");
        let value = match &*field {
            Value::Null => continue,
            Value::String(_) => {
                return Err(format!(
                    "{shown}: secrets are not written in fleet files; give {{file: PATH}} or {{env: NAME}} instead"
                ));
            }
            other => reference(other).ok_or_else(|| {
                format!("{shown}: must be {{file: PATH}} (relative to the file) or {{env: NAME}}, and nothing else")
            })?,
        };
        *field = Value::String(secret(&value, base).map_err(|why| format!("{shown}: {why}"))?);
    }
    Ok(())
}

/// `{file: PATH}` or `{env: NAME}`, one key and a non-empty string.
fn reference(v: &Value) -> Option<SecretRef> {
    let fields = v.as_object().filter(|o| o.len() == 1)?;
    let (key, value) = fields.iter().next()?;
    let value = value.as_str().filter(|s| !s.is_empty())?.to_owned();
    match key.as_str() {
        "file" => Some(SecretRef::File { file: value }),
        "env" => Some(SecretRef::Env { env: value }),
        _ => None,
    }
}

fn secret(reference: &SecretRef, base: &Path) -> Result<String, String> {
    match reference {
        SecretRef::Env { env } => match std::env::var(env) {
            Ok(v) if !v.is_empty() => Ok(v),
            _ => Err(format!("environment variable {env} is not set")),
        },
        SecretRef::File { file } => {
            let path = base.join(file);
            let f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut text = String::new();
            f.take(MAX_SECRET_BYTES + 1).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
            if text.len() as u64 > MAX_SECRET_BYTES {
                return Err(format!("{} is over {MAX_SECRET_BYTES} bytes", path.display()));
            }
            Ok(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_by_reference_are_read_and_inline_ones_refused() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        std::fs::write(dir.path().join("key.pem"), "KEY").expect("write");
        // SAFETY: tests in this module do not read this variable concurrently.
        unsafe { std::env::set_var("DROVER_TEST_APPLY_TOKEN", "TOKEN") };
        let mut engine = json!({"kind": "Engine", "name": "b", "spec": {"endpoint": "tcp://h:1",
            "tls": {"cert": {"file": "key.pem"}, "key": {"file": "key.pem"}, "ca": {"env": "DROVER_TEST_APPLY_TOKEN"}}}});
        resolve_secrets(&mut engine, dir.path()).expect("resolved");
        assert_eq!(engine["spec"]["tls"], json!({"cert": "KEY", "key": "KEY", "ca": "TOKEN"}));

        let mut inline = json!({"kind": "Cluster", "name": "c", "spec": {"server": "https://x", "token": "abc"}});
        let why = resolve_secrets(&mut inline, dir.path()).expect_err("inline secret");
        assert!(why.starts_with("spec.token: secrets are not written"), "{why}");
        let mut unset = json!({"kind": "Cluster", "name": "c", "spec": {"token": {"env": "DROVER_TEST_UNSET_VAR"}}});
        assert!(resolve_secrets(&mut unset, dir.path()).expect_err("unset").contains("is not set"));
        let mut odd = json!({"kind": "Cluster", "name": "c", "spec": {"token": {"file": "a", "env": "B"}}});
        assert!(resolve_secrets(&mut odd, dir.path()).expect_err("both").contains("nothing else"));
        let mut pool = json!({"kind": "Pool", "name": "p", "spec": {"token": "not a secret of pools"}});
        resolve_secrets(&mut pool, dir.path()).expect("pools have no secrets");
    }

    #[test]
    fn directories_are_read_in_name_order_hidden_files_and_others_left_out() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        for name in ["b.yaml", "a.json", ".hidden.yaml", "notes.txt", "sub/c.yml"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, "").expect("write");
        }
        let names = |recursive| {
            let files = expand(&[dir.path().to_path_buf()], recursive).expect("expanded");
            files.iter().map(|p| p.strip_prefix(dir.path()).expect("inside").display().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["a.json", "b.yaml"]);
        assert_eq!(names(true), ["a.json", "b.yaml", "sub/c.yml"]);
    }
}
