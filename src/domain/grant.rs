//! Grants: what a credential may do, namespace by namespace. A grant is a
//! scope (one namespace, or `*`: every namespace, and what belongs to none:
//! engines, namespaces, the access rules, global tokens) and a role in it.
//! A credential holds any number of them; its role in a namespace is the
//! highest any of them gives there.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::object::Namespace;
use super::role::Role;

/// Where a grant applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Every namespace, and what belongs to none.
    All,
    Namespace(Namespace),
}

impl Scope {
    pub const ALL: &'static str = "*";

    pub fn parse(s: &str) -> Result<Self, super::names::NameError> {
        if s == Self::ALL { Ok(Self::All) } else { Namespace::parse(s).map(Self::Namespace) }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::All => Self::ALL,
            Self::Namespace(ns) => ns.as_str(),
        }
    }

    /// Whether this scope covers `namespace`.
    pub fn covers(&self, namespace: &Namespace) -> bool {
        match self {
            Self::All => true,
            Self::Namespace(ns) => ns == namespace,
        }
    }

    /// Whether this scope covers all of `other`.
    pub fn includes(&self, other: &Scope) -> bool {
        match (self, other) {
            (Self::All, _) => true,
            (Self::Namespace(a), Self::Namespace(b)) => a == b,
            (Self::Namespace(_), Self::All) => false,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Scope::parse(&s).map_err(|e| serde::de::Error::custom(format!("a namespace or `*`: {e}")))
    }
}

fn scope_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some("A namespace (a DNS-1123 label), or `*` for every namespace and what belongs to none"))
        .pattern(Some(r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$"))
        .max_length(Some(63))
        .build()
}

/// A role in a scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// A namespace, or `*`.
    #[schema(schema_with = scope_schema)]
    pub namespace: Scope,
    pub role: Role,
}

impl Grant {
    pub fn new(namespace: Scope, role: Role) -> Self {
        Self { namespace, role }
    }

    /// What a credential with one global role had before grants.
    pub fn everywhere(role: Role) -> Self {
        Self { namespace: Scope::All, role }
    }
}

/// A credential's grants, and the questions asked of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants(pub Vec<Grant>);

impl Grants {
    pub fn everywhere(role: Role) -> Self {
        Self(vec![Grant::everywhere(role)])
    }

    /// The role in `namespace`: the highest any grant gives there.
    pub fn role_in(&self, namespace: &Namespace) -> Option<Role> {
        self.0.iter().filter(|g| g.namespace.covers(namespace)).map(|g| g.role).max()
    }

    /// The role over everything (`*` grants only): what engines, namespaces,
    /// the access rules and global tokens need.
    pub fn global_role(&self) -> Option<Role> {
        self.0.iter().filter(|g| g.namespace == Scope::All).map(|g| g.role).max()
    }

    /// The highest role in any scope: whether the caller may do something
    /// somewhere.
    pub fn highest(&self) -> Option<Role> {
        self.0.iter().map(|g| g.role).max()
    }

    /// Whether every grant of `other` is within these: a credential may only
    /// give what it holds itself.
    pub fn include(&self, other: &Grants) -> bool {
        other
            .0
            .iter()
            .all(|want| self.0.iter().any(|have| have.namespace.includes(&want.namespace) && have.role >= want.role))
    }

    /// The one namespace every grant is in, if they are all in one: where
    /// a token with these grants is managed (its admins list and revoke
    /// it). `None`: a global token, a `*` admin's.
    pub fn single_namespace(&self) -> Option<&Namespace> {
        let mut scopes = self.0.iter().map(|g| &g.namespace);
        let Some(Scope::Namespace(first)) = scopes.next() else { return None };
        scopes.all(|s| matches!(s, Scope::Namespace(ns) if ns == first)).then_some(first)
    }

    /// The namespaces these make an admin of (`*` aside).
    pub fn admin_of(&self) -> impl Iterator<Item = &Namespace> {
        self.0.iter().filter(|g| g.role == Role::Admin).filter_map(|g| match &g.namespace {
            Scope::Namespace(ns) => Some(ns),
            Scope::All => None,
        })
    }

    /// The namespaces these reach: `None` for every namespace.
    pub fn namespaces(&self) -> Option<Vec<Namespace>> {
        let mut out = Vec::new();
        for g in &self.0 {
            match &g.namespace {
                Scope::All => return None,
                Scope::Namespace(ns) => out.push(ns.clone()),
            }
        }
        out.sort();
        out.dedup();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Namespace {
        Namespace::parse(s).unwrap()
    }

    fn grant(scope: &str, role: Role) -> Grant {
        Grant::new(Scope::parse(scope).unwrap(), role)
    }

    #[test]
    fn the_role_in_a_namespace_is_the_highest_grant_there() {
        let g = Grants(vec![grant("a", Role::Operator), grant("*", Role::Viewer), grant("b", Role::Admin)]);
        assert_eq!(g.role_in(&ns("a")), Some(Role::Operator));
        assert_eq!(g.role_in(&ns("b")), Some(Role::Admin));
        assert_eq!(g.role_in(&ns("c")), Some(Role::Viewer), "`*` covers every namespace");
        assert_eq!(g.global_role(), Some(Role::Viewer));
        assert_eq!(Grants(vec![grant("a", Role::Admin)]).role_in(&ns("b")), None);
        assert_eq!(Grants(vec![grant("a", Role::Admin)]).global_role(), None);
    }

    #[test]
    fn a_credential_gives_only_what_it_holds() {
        let admin_of_a = Grants(vec![grant("a", Role::Admin)]);
        assert!(admin_of_a.include(&Grants(vec![grant("a", Role::Operator)])));
        assert!(admin_of_a.include(&Grants(vec![grant("a", Role::Admin)])));
        assert!(!admin_of_a.include(&Grants(vec![grant("*", Role::Viewer)])), "not every namespace");
        assert!(!admin_of_a.include(&Grants(vec![grant("b", Role::Viewer)])), "not another namespace");
        let operator_of_a = Grants(vec![grant("a", Role::Operator)]);
        assert!(!operator_of_a.include(&Grants(vec![grant("a", Role::Admin)])), "not a higher role");
        let root = Grants::everywhere(Role::Admin);
        assert!(root.include(&Grants(vec![grant("*", Role::Admin), grant("z", Role::Admin)])));
    }

    #[test]
    fn a_token_of_one_namespace_is_managed_there_and_any_other_is_global() {
        let one = Grants(vec![grant("a", Role::Operator), grant("a", Role::Viewer)]);
        assert_eq!(one.single_namespace(), Some(&ns("a")));
        assert_eq!(Grants(vec![grant("a", Role::Operator), grant("b", Role::Viewer)]).single_namespace(), None);
        assert_eq!(Grants(vec![grant("*", Role::Viewer)]).single_namespace(), None);
        assert_eq!(Grants::default().single_namespace(), None);
    }

    #[test]
    fn a_scope_reads_as_a_namespace_or_a_star() {
        let g: Grant = serde_json::from_value(serde_json::json!({"namespace": "*", "role": "admin"})).unwrap();
        assert_eq!(g, Grant::everywhere(Role::Admin));
        let g: Grant = serde_json::from_value(serde_json::json!({"namespace": "team-a", "role": "viewer"})).unwrap();
        assert_eq!(g.namespace, Scope::Namespace(ns("team-a")));
        assert!(serde_json::from_value::<Grant>(serde_json::json!({"namespace": "Team A", "role": "viewer"})).is_err());
        assert_eq!(serde_json::to_value(&g).unwrap()["namespace"], "team-a");
    }
}
