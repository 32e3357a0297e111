//! Claim-to-role rules: `repository == "org/infra" && ref ==
//! "refs/heads/main" -> operator` is written
//! `{"claims": {"repository": "org/infra", "ref": "refs/heads/main"}, "role": "operator"}`.
//! Every listed claim must match (a rule is an AND); a claim's expected
//! value is a string or a list of strings (an OR). A token's claim that is
//! a list matches when one of its items does; numbers and booleans match
//! their JSON text. Pure: no IO.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::domain::role::Role;

/// One rule of an issuer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    pub claims: BTreeMap<String, Expected>,
    pub role: Role,
}

/// What a claim must be.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Expected {
    One(String),
    AnyOf(Vec<String>),
}

/// A client-certificate subject (RFC 4514 text, as drover logs it) and its role.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectRule {
    pub subject: String,
    pub role: Role,
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
        Ok(())
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

/// The first rule of `rules` that `claims` match, with the claims it used
/// (for the audit trail).
pub fn first_match<'r>(rules: &'r [ClaimRule], claims: &Map<String, Value>) -> Option<(&'r ClaimRule, Vec<String>)> {
    let rule = rules.iter().find(|r| r.matches(claims))?;
    let used = rule
        .claims
        .keys()
        .map(|name| {
            let value = claims.get(name).map(shown).unwrap_or_default();
            format!("{name}={value}")
        })
        .collect();
    Some((rule, used))
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
        let (r, used) = first_match(&rules, &claims(json!({"sub": "a", "ref": "refs/heads/main"}))).expect("match");
        assert_eq!(r.role, Role::Operator);
        assert_eq!(used, ["ref=refs/heads/main"]);
        assert!(first_match(&rules, &claims(json!({"sub": "b"}))).is_none());
    }

    #[test]
    fn empty_rules_are_refused() {
        assert!(rule(json!({}), "viewer").check().is_err());
        assert!(rule(json!({"a": []}), "viewer").check().is_err());
        assert!(rule(json!({"a": "b"}), "viewer").check().is_ok());
    }
}
