//! The field-level difference of two JSON documents, for people and
//! scripts: which field changed, from what, to what.
//!
//! Objects are compared key by key (a pool's `labels` show the one label
//! that changed), lists as a whole (a list's order can matter, and the
//! whole new list reads better than index arithmetic). A secret field is
//! reported as changed without either value.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// One field that differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Change {
    /// The field: `replicas`, `strategy.max_surge`, `labels["app.kubernetes.io/name"]`.
    pub path: String,
    /// Its value before; `null` when it was absent, or is secret.
    pub before: Option<Value>,
    /// Its value after; `null` when it is removed, or is secret.
    pub after: Option<Value>,
    /// A write-only field (credentials, keys): it changes, and neither
    /// value is shown.
    pub secret: bool,
}

/// The changes from `before` to `after`; `None` stands for an object that
/// does not exist (yet, or any more), whose top-level fields are listed.
/// Fields named in `secrets` (top-level keys) are never shown.
pub fn diff(before: Option<&Value>, after: Option<&Value>, secrets: &[&str]) -> Vec<Change> {
    let mut out = Vec::new();
    match (before, after) {
        (Some(b), Some(a)) => walk(&mut out, &mut String::new(), b, a),
        (None, Some(a)) => listed(&mut out, a, false),
        (Some(b), None) => listed(&mut out, b, true),
        (None, None) => {}
    }
    for change in &mut out {
        let top = change.path.split(['.', '[']).next().unwrap_or_default();
        if secrets.contains(&top) {
            change.secret = true;
            change.before = None;
            change.after = None;
        }
    }
    // A secret field reports once, at its top, however it changed inside.
    out.dedup_by(|b, a| a.secret && b.secret && top(&a.path) == top(&b.path));
    for change in out.iter_mut().filter(|c| c.secret) {
        change.path = top(&change.path).to_owned();
    }
    out
}

fn top(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or_default()
}

/// Every top-level field of a document created (or deleted), absent ones
/// (`null`) left out.
fn listed(out: &mut Vec<Change>, doc: &Value, removed: bool) {
    let Value::Object(fields) = doc else {
        out.push(change(String::new(), removed.then(|| doc.clone()), (!removed).then(|| doc.clone())));
        return;
    };
    for (k, v) in fields.iter().filter(|(_, v)| !v.is_null()) {
        let path = join(&mut String::new(), k);
        let (before, after) = if removed { (Some(v.clone()), None) } else { (None, Some(v.clone())) };
        out.push(change(path, before, after));
    }
}

fn change(path: String, before: Option<Value>, after: Option<Value>) -> Change {
    Change { path, before, after, secret: false }
}

fn walk(out: &mut Vec<Change>, path: &mut String, before: &Value, after: &Value) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => fields(out, path, b, a),
        _ => out.push(change(path.clone(), present(before), present(after))),
    }
}

fn fields(out: &mut Vec<Change>, path: &mut String, before: &Map<String, Value>, after: &Map<String, Value>) {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let null = Value::Null;
    for key in keys {
        let len = path.len();
        let child = join(path, key);
        *path = child;
        walk(out, path, before.get(key).unwrap_or(&null), after.get(key).unwrap_or(&null));
        path.truncate(len);
    }
}

/// `null` is how an absent value reads: shown as absent.
fn present(v: &Value) -> Option<Value> {
    (!v.is_null()).then(|| v.clone())
}

/// `path.key`, or `path["key"]` for a key that is not a plain identifier.
fn join(path: &mut String, key: &str) -> String {
    let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (plain, path.is_empty()) {
        (true, true) => key.to_owned(),
        (true, false) => format!("{path}.{key}"),
        (false, _) => format!("{path}[{}]", Value::String(key.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(changes: &[Change]) -> Vec<(&str, Option<&Value>, Option<&Value>)> {
        changes.iter().map(|c| (c.path.as_str(), c.before.as_ref(), c.after.as_ref())).collect()
    }

    #[test]
    fn equal_documents_have_no_changes() {
        let doc = json!({"replicas": 3, "labels": {"a": "b"}, "list": [1, 2]});
        assert!(diff(Some(&doc), Some(&doc), &[]).is_empty());
    }

    #[test]
    fn scalars_nested_fields_and_map_keys_are_reported_one_by_one() {
        let before = json!({"replicas": 3, "strategy": {"max_surge": 1, "max_unavailable": 0},
            "labels": {"team": "a", "app.kubernetes.io/name": "web", "gone": "x"}, "image": null});
        let after = json!({"replicas": 5, "strategy": {"max_surge": "25%", "max_unavailable": 0},
            "labels": {"team": "a", "app.kubernetes.io/name": "api", "new": "y"}, "image": "example/node:2"});
        let changes = diff(Some(&before), Some(&after), &[]);
        assert_eq!(
            paths(&changes),
            [
                ("image", None, Some(&json!("example/node:2"))),
                ("labels[\"app.kubernetes.io/name\"]", Some(&json!("web")), Some(&json!("api"))),
                ("labels.gone", Some(&json!("x")), None),
                ("labels.new", None, Some(&json!("y"))),
                ("replicas", Some(&json!(3)), Some(&json!(5))),
                ("strategy.max_surge", Some(&json!(1)), Some(&json!("25%"))),
            ]
        );
    }

    #[test]
    fn lists_change_as_a_whole() {
        let changes = diff(Some(&json!({"zones": ["a", "b"]})), Some(&json!({"zones": ["b", "a"]})), &[]);
        assert_eq!(paths(&changes), [("zones", Some(&json!(["a", "b"])), Some(&json!(["b", "a"])))]);
    }

    #[test]
    fn a_created_object_lists_its_fields_and_a_deleted_one_its_old_fields() {
        let doc = json!({"endpoint": "sim://b", "labels": {"zone": "a"}, "tls": null});
        let created = diff(None, Some(&doc), &[]);
        assert_eq!(
            paths(&created),
            [("endpoint", None, Some(&json!("sim://b"))), ("labels", None, Some(&json!({"zone": "a"})))]
        );
        let deleted = diff(Some(&doc), None, &[]);
        assert_eq!(deleted[0].before, Some(json!("sim://b")));
        assert_eq!(deleted[0].after, None);
    }

    #[test]
    fn secret_fields_change_without_their_values() {
        let before = json!({"server": "https://a", "credentials": {"token": "sha256:1", "ca": "sha256:2"}});
        let after = json!({"server": "https://a", "credentials": {"token": "sha256:3", "ca": "sha256:4"}});
        let changes = diff(Some(&before), Some(&after), &["credentials"]);
        assert_eq!(changes, [Change { path: "credentials".into(), before: None, after: None, secret: true }]);
        let created = diff(None, Some(&after), &["credentials"]);
        assert!(created.iter().any(|c| c.path == "credentials" && c.secret && c.after.is_none()), "{created:?}");
        assert!(!format!("{created:?}").contains("sha256"), "no secret value leaks: {created:?}");
    }
}
