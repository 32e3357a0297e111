//! Claim-to-grant rules: `repository == "org/infra" && ref ==
//! "refs/heads/main" -> operator of team-a` is written
//! `{"claims": {"repository": "org/infra", "ref": "refs/heads/main"}, "role": "operator", "namespaces": ["team-a"]}`.
//! Every listed claim must match (a rule is an AND); a claim's expected
//! value is a string or a list of strings (an OR). A token's claim that is
//! a list matches when one of its items does; numbers and booleans match
//! their JSON text. Pure: no IO.
//!
//! A rule gives its role in the namespaces it names (`namespaces`), or in
//! the one an explicit table maps a claim's value to (`namespace_from`:
//! `{"claim": "repository", "map": {"org/app": "team-a"}}`; a value the
//! table lacks does not match). A rule naming neither gives its role on
//! `*`, as a rule did before namespaces. No rule makes a namespace out of
//! a claim's value itself: a table is what keeps a claim a token's holder
//! can influence (a branch, a pull request's ref) from choosing a
//! namespace (docs/access.md).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::domain::grant::{Grant, Grants, Scope};
use crate::domain::object::Namespace;
use crate::domain::role::Role;

/// One rule of an issuer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    pub claims: BTreeMap<String, Expected>,
    pub role: Role,
    /// The namespaces (or `*`) the role is given in; with neither this nor
    /// `namespace_from`, `*`.
    #[serde(default)]
    pub namespaces: Option<Vec<Scope>>,
    /// The namespace a claim's value maps to, by an explicit table.
    #[serde(default)]
    pub namespace_from: Option<ClaimTable>,
}

/// A claim, and the namespace each of its accepted values stands for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimTable {
    pub claim: String,
    pub map: BTreeMap<String, Namespace>,
}

/// What a claim must be.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Expected {
    One(String),
    AnyOf(Vec<String>),
}

/// A client-certificate subject (RFC 4514 text, as drover logs it), its
/// role and the namespaces it has it in (`*` when none are named).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectRule {
    pub subject: String,
    pub role: Role,
    #[serde(default)]
    pub namespaces: Option<Vec<Scope>>,
}

impl SubjectRule {
    pub fn grants(&self) -> Grants {
        scoped(self.role, self.namespaces.as_deref())
    }
}

/// `role` in each of `namespaces`, or on `*` when none are given.
fn scoped(role: Role, namespaces: Option<&[Scope]>) -> Grants {
    match namespaces {
        None => Grants::everywhere(role),
        Some(list) => Grants(list.iter().map(|ns| Grant::new(ns.clone(), role)).collect()),
    }
}

impl Expected {
    fn accepts(&self, actual: &str) -> bool {
        match self {
            Self::One(v) => v == actual,
            Self::AnyOf(vs) => vs.iter().any(|v| v == actual),
        }
    }
}

impl ClaimRule {
    /// A rule without claims would match every token of its issuer: refused,
    /// so that "everyone" is never written by accident.
    pub fn check(&self) -> Result<(), String> {
        if self.claims.is_empty() {
            return Err("claims is empty; a rule must name at least one claim".into());
        }
        if self.claims.values().any(|e| matches!(e, Expected::AnyOf(v) if v.is_empty())) {
            return Err("a claim's list of values is empty".into());
        }
        match (&self.namespaces, &self.namespace_from) {
            (Some(_), Some(_)) => Err("give namespaces or namespace_from, not both".into()),
            (Some(list), None) if list.is_empty() => {
                Err("namespaces is empty; name at least one namespace, or `*`".into())
            }
            (None, Some(table)) if table.map.is_empty() => {
                Err("namespace_from.map is empty; map at least one value of the claim to a namespace".into())
            }
            _ => Ok(()),
        }
    }

    /// What the rule gives a token whose claims match it; `None` when a
    /// table maps the token's claim to no namespace.
    pub fn grants(&self, claims: &Map<String, Value>) -> Option<Grants> {
        match &self.namespace_from {
            None => Some(scoped(self.role, self.namespaces.as_deref())),
            Some(table) => {
                let value = claims.get(&table.claim)?.as_str()?;
                let namespace = table.map.get(value)?;
                Some(Grants(vec![Grant::new(Scope::Namespace(namespace.clone()), self.role)]))
            }
        }
    }

    /// Whether every claim of the rule is in `claims` with an accepted value.
    pub fn matches(&self, claims: &Map<String, Value>) -> bool {
        self.claims.iter().all(|(name, expected)| claims.get(name).is_some_and(|v| value_matches(expected, v)))
    }
}

fn value_matches(expected: &Expected, actual: &Value) -> bool {
    match actual {
        Value::String(s) => expected.accepts(s),
        Value::Number(n) => expected.accepts(&n.to_string()),
        Value::Bool(b) => expected.accepts(if *b { "true" } else { "false" }),
        Value::Array(items) => items.iter().any(|i| !i.is_array() && value_matches(expected, i)),
        Value::Null | Value::Object(_) => false,
    }
}

/// What the first rule of `rules` that `claims` match gives, with the
/// claims it used (for the audit trail).
pub fn first_match(rules: &[ClaimRule], claims: &Map<String, Value>) -> Option<(Grants, Vec<String>)> {
    let (rule, grants) = rules.iter().filter(|r| r.matches(claims)).find_map(|r| Some((r, r.grants(claims)?)))?;
    let mut names: Vec<&String> = rule.claims.keys().collect();
    names.extend(rule.namespace_from.as_ref().map(|t| &t.claim));
    names.dedup();
    let used = names
        .into_iter()
        .map(|name| {
            let value = claims.get(name).map(shown).unwrap_or_default();
            format!("{name}={value}")
        })
        .collect();
    Some((grants, used))
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(claims: Value, role: &str) -> ClaimRule {
        serde_json::from_value(json!({"claims": claims, "role": role})).expect("a rule")
    }

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    #[test]
    fn every_claim_of_a_rule_must_match() {
        let r = rule(json!({"repository": "org/infra", "ref": "refs/heads/main"}), "operator");
        assert!(r.matches(&claims(json!({"repository": "org/infra", "ref": "refs/heads/main", "sub": "x"}))));
        assert!(!r.matches(&claims(json!({"repository": "org/infra", "ref": "refs/heads/dev"}))));
        assert!(!r.matches(&claims(json!({"repository": "org/infra"}))), "a missing claim never matches");
        assert!(!r.matches(&claims(json!({"repository": "org/infra-evil", "ref": "refs/heads/main"}))));
    }

    #[test]
    fn lists_numbers_and_booleans_match_their_text() {
        let r = rule(json!({"groups": ["ops", "sre"], "run_attempt": "1", "protected": "true"}), "viewer");
        assert!(r.matches(&claims(json!({"groups": ["dev", "sre"], "run_attempt": 1, "protected": true}))));
        assert!(!r.matches(&claims(json!({"groups": ["dev"], "run_attempt": 1, "protected": true}))));
        assert!(!r.matches(&claims(json!({"groups": "sre", "run_attempt": 2, "protected": true}))));
        assert!(!r.matches(&claims(json!({"groups": {"sre": 1}, "run_attempt": 1, "protected": true}))));
    }

    #[test]
    fn the_first_matching_rule_wins_and_names_its_claims() {
        let rules = [rule(json!({"ref": "refs/heads/main"}), "operator"), rule(json!({"sub": "a"}), "admin")];
        let (g, used) = first_match(&rules, &claims(json!({"sub": "a", "ref": "refs/heads/main"}))).expect("match");
        assert_eq!(g, Grants::everywhere(Role::Operator), "a rule naming no namespace gives its role on `*`");
        assert_eq!(used, ["ref=refs/heads/main"]);
        assert!(first_match(&rules, &claims(json!({"sub": "b"}))).is_none());
    }

    #[test]
    fn a_rule_gives_its_role_in_the_namespaces_it_names_or_the_one_its_table_maps_a_claim_to() {
        let named: ClaimRule = serde_json::from_value(json!({"claims": {"repository": "org/app"}, "role": "operator",
            "namespaces": ["team-a"]}))
        .unwrap();
        let team_a = Scope::parse("team-a").unwrap();
        let (g, _) = first_match(&[named], &claims(json!({"repository": "org/app"}))).expect("match");
        assert_eq!(g, Grants(vec![Grant::new(team_a.clone(), Role::Operator)]));
        let table: ClaimRule =
            serde_json::from_value(json!({"claims": {"repository_owner": "org"}, "role": "operator",
            "namespace_from": {"claim": "repository", "map": {"org/app": "team-a", "org/api": "team-b"}}}))
            .unwrap();
        let rules = [table];
        let (g, used) =
            first_match(&rules, &claims(json!({"repository_owner": "org", "repository": "org/app"}))).expect("mapped");
        assert_eq!(g, Grants(vec![Grant::new(team_a, Role::Operator)]));
        assert_eq!(used, ["repository_owner=org", "repository=org/app"]);
        assert!(
            first_match(&rules, &claims(json!({"repository_owner": "org", "repository": "org/other"}))).is_none(),
            "a value the table lacks gives nothing"
        );
    }

    #[test]
    fn empty_rules_are_refused() {
        assert!(rule(json!({}), "viewer").check().is_err());
        assert!(rule(json!({"a": []}), "viewer").check().is_err());
        assert!(rule(json!({"a": "b"}), "viewer").check().is_ok());
        let both: ClaimRule =
            serde_json::from_value(json!({"claims": {"a": "b"}, "role": "viewer", "namespaces": ["x"],
            "namespace_from": {"claim": "c", "map": {"d": "y"}}}))
            .unwrap();
        assert!(both.check().is_err());
    }
}
