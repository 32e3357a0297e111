//! The answer of an apply for people: one line per object that changes,
//! its fields below it, unchanged objects counted; coloured on a terminal.

use serde_json::Value;

use std::collections::BTreeMap;

use super::files::Origin;
use crate::apply::plan::{Action, Resolution};
use crate::cli::client::Conflicts;
use crate::http::wire::apply::{AppliedObject, ApplyResult};

/// ANSI colours, or none.
#[derive(Debug, Clone, Copy)]
pub struct Palette {
    on: bool,
}

impl Palette {
    pub fn new(on: bool) -> Self {
        Self { on }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.on { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }
}

fn sign(action: Action) -> (&'static str, &'static str) {
    match action {
        Action::Create => ("+", "32"),
        Action::Update => ("~", "33"),
        Action::Delete => ("-", "31"),
        Action::Unchanged => ("=", "2"),
        Action::Conflict => ("!", "35"),
    }
}

/// A value as one short line: strings quoted, lists and maps as JSON.
fn shown(v: &Option<Value>) -> String {
    match v {
        None => "(none)".to_owned(),
        Some(v) => {
            let text = v.to_string();
            if text.chars().count() > 120 { format!("{}…", text.chars().take(119).collect::<String>()) } else { text }
        }
    }
}

/// Whether a value is a default not worth a line when an object is created.
fn empty(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        _ => false,
    }
}

fn object_lines(out: &mut String, applied: &AppliedObject, origin: Option<&Origin>, p: Palette) {
    let o = &applied.step;
    let (mark, colour) = sign(o.action);
    let action = serde_json::to_value(o.action).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    let from = origin.map(|o| format!("  ({o})")).unwrap_or_default();
    out.push_str(&p.paint(colour, &format!("{mark} {} {}", o.kind, o.name)));
    out.push_str(&format!("  {action}{from}\n"));
    if let Some(c) = &o.conflict {
        out.push_str(&format!("    {}\n", p.paint(colour, &c.message)));
    }
    for c in &o.changes {
        let line = match (o.action, c.secret) {
            (_, true) => format!("{}: (secret, changed)", c.path),
            (Action::Create, _) if empty(&c.after) => continue,
            (Action::Create, _) => format!("{}: {}", c.path, shown(&c.after)),
            (Action::Delete, _) => continue,
            _ => format!("{}: {} → {}", c.path, shown(&c.before), shown(&c.after)),
        };
        out.push_str(&format!("    {line}\n"));
    }
    if let Some(r) = &applied.rollout {
        let plan = &r.plan;
        out.push_str(&format!(
            "    rollout to {}: {} of {} machines up to date; next pass creates {}, deletes {}\n",
            r.desired_image,
            r.observed.updated,
            r.observed.total,
            plan.create.len(),
            plan.delete.len()
        ));
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The conflicts of an answer, and what resolves each kind of them.
pub fn conflicts(r: &ApplyResult) -> Conflicts {
    let mut counts: BTreeMap<Option<Resolution>, u32> = BTreeMap::new();
    for c in r.objects.iter().filter_map(|o| o.step.conflict.as_ref()) {
        *counts.entry(c.resolution).or_default() += 1;
    }
    let resolutions = counts
        .into_iter()
        .map(|(resolution, n)| {
            let how = match resolution {
                Some(Resolution::Force) => {
                    "--force overwrites (or deletes) what another hand changed since this apply set wrote it"
                }
                Some(Resolution::Adopt) => "--adopt takes over objects that no apply set owns",
                Some(Resolution::AdoptAndForce) => "--adopt --force takes over objects of another apply set",
                None => "no flag resolves these: change the files, or wait as each message says",
            };
            (n, how)
        })
        .collect();
    Conflicts { count: r.summary.conflict, applied: r.changed && !r.dry_run, resolutions }
}

/// The whole answer, for people.
pub fn render(r: &ApplyResult, origins: &[Origin], p: Palette) -> String {
    let mut out = String::new();
    let revision = r.revision.map_or("never applied".to_owned(), |n| format!("revision {n}"));
    let conflicts = r.summary.conflict;
    let mode = match (r.dry_run, r.changed, conflicts) {
        (true, _, _) => "dry run, nothing changed".to_owned(),
        (false, true, 0) => "applied".to_owned(),
        (false, true, n) => format!("applied, but for {n} conflict{}", plural(n)),
        (false, false, 0) => "nothing to change".to_owned(),
        (false, false, n) => format!("nothing applied: {n} conflict{}", plural(n)),
    };
    out.push_str(&format!("apply set {} ({revision}; {mode})\n", r.apply_set));
    for o in r.objects.iter().filter(|o| o.step.action != Action::Unchanged) {
        let origin = o.step.document.and_then(|d| origins.get(d as usize));
        object_lines(&mut out, o, origin, p);
    }
    if !r.unlisted.is_empty() {
        let names: Vec<String> = r.unlisted.iter().map(|k| format!("{} {}", k.kind, k.name)).collect();
        out.push_str(&format!(
            "{}\n",
            p.paint("2", &format!("not in the files, kept (--prune deletes them): {}", names.join(", ")))
        ));
    }
    let s = &r.summary;
    let verb = if r.dry_run { "would" } else { "did" };
    out.push_str(&format!(
        "{}: {} to create, {} to update, {} to delete, {} unchanged, {} conflict{}{}\n",
        if r.dry_run { "Plan" } else { "Applied" },
        s.create,
        s.update,
        s.delete,
        s.unchanged,
        s.conflict,
        plural(s.conflict),
        if r.dry_run { format!(" (needs the {} role)", r.needs_role.as_str()) } else { String::new() },
    ));
    if !r.changed && s.conflict == 0 {
        out.push_str(&format!("No changes: the server {verb} nothing.\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::diff::Change;
    use crate::apply::document::Kind;
    use crate::apply::plan::{Conflict, ConflictReason, Step};
    use crate::http::wire::apply::ApplySummary;
    use crate::identity::Role;
    use serde_json::json;

    fn object(name: &str, action: Action, changes: Vec<Change>) -> AppliedObject {
        let step = Step {
            kind: Kind::Pool,
            name: name.into(),
            document: Some(0),
            action,
            changes,
            conflict: None,
            adopted: false,
            needs_role: Role::Operator,
            ownership: Default::default(),
        };
        AppliedObject { step, rollout: None, generation: None, revision: None }
    }

    fn change(path: &str, before: Option<Value>, after: Option<Value>) -> Change {
        Change { path: path.into(), before, after, secret: false }
    }

    #[test]
    fn a_plan_reads_as_a_diff_with_unchanged_objects_counted() {
        let mut conflict = object("db", Action::Conflict, vec![]);
        conflict.step.conflict = Some(Conflict {
            reason: ConflictReason::ChangedElsewhere,
            message: "Pool db changed since ...".into(),
            resolution: Some(Resolution::Force),
        });
        let result = ApplyResult {
            apply_set: "fleet".into(),
            namespace: Default::default(),
            dry_run: true,
            revision: Some(3),
            changed: true,
            needs_role: Role::Admin,
            summary: ApplySummary { create: 1, update: 1, delete: 0, unchanged: 1, conflict: 1 },
            objects: vec![
                object(
                    "web",
                    Action::Create,
                    vec![change("replicas", None, Some(json!(3))), change("paused", None, Some(json!(false)))],
                ),
                object("api", Action::Update, vec![change("replicas", Some(json!(3)), Some(json!(5)))]),
                object("same", Action::Unchanged, vec![]),
                conflict,
            ],
            unlisted: vec![],
        };
        let origins = [Origin { file: "fleet.yaml".into(), document: 1, item: None, line: 1 }];
        let text = render(&result, &origins, Palette::new(false));
        assert!(text.contains("+ Pool web  create  (fleet.yaml:1 (document 1))\n    replicas: 3\n"), "{text}");
        assert!(!text.contains("paused"), "defaults of a new object are left out: {text}");
        assert!(text.contains("~ Pool api  update"), "{text}");
        assert!(text.contains("    replicas: 3 → 5\n"), "{text}");
        assert!(!text.contains("Pool same"), "unchanged objects are only counted: {text}");
        assert!(text.contains("! Pool db  conflict"), "{text}");
        assert!(
            text.contains(
                "Plan: 1 to create, 1 to update, 0 to delete, 1 unchanged, 1 conflict (needs the admin role)"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "no colour when off");
        assert!(render(&result, &origins, Palette::new(true)).contains("\x1b[32m+ Pool web"));
    }
}
