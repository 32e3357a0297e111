//! The one authorizer: may this caller do this to that object?
//!
//! Every service asks [`Access::may`] for each object it reads or changes,
//! after it has looked the object up (so that an object of a namespace the
//! caller cannot see costs the same as a missing one). The answer depends
//! on the caller's grants and the object's namespace alone:
//!
//! - a caller with no role in the object's namespace is told the object
//!   does not exist ([`Denied::Hidden`]: the same status and body as a
//!   missing one);
//! - a caller who may see it but whose role there is below what the
//!   action needs is refused ([`Denied::Forbidden`]);
//! - what belongs to no namespace (engines, namespaces themselves, the
//!   access rules, global tokens) is changed only with a grant on `*`;
//!   engines and namespaces are seen by anyone with a grant somewhere
//!   (namespaces: those the caller has a role in).
//!
//! Each refusal is noted for the request ([`Refusal`]), which the gate
//! audits once the answer is made: caller, action, namespace and object.

use std::sync::{Arc, Mutex};

use super::caller::Caller;
use crate::domain::grant::Grants;
use crate::domain::object::Namespace;
use crate::domain::role::Role;

/// What an action needs: a role in the object's namespace (or on `*` for
/// an object of none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub need: Role,
}

impl Action {
    pub const READ: Action = Action { need: Role::Viewer };
    pub const OPERATE: Action = Action { need: Role::Operator };
    pub const CHANGE: Action = Action { need: Role::Admin };

    pub fn needs(need: Role) -> Self {
        Action { need }
    }

    /// As the audit trail names it.
    pub fn as_str(self) -> &'static str {
        match self.need {
            Role::Viewer => "read",
            Role::Operator => "operate",
            Role::Admin => "change",
        }
    }
}

/// An object an action is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its namespace; `None` for what belongs to none (an engine, a
    /// namespace, a global token, the access rules).
    pub namespace: Option<Namespace>,
    /// `pool`, `cluster`, `upgrade job`, `engine`, `namespace`, `token`...:
    /// what a missing one is called in the answer.
    pub kind: &'static str,
    pub name: String,
}

impl Target {
    pub fn in_namespace(namespace: &Namespace, kind: &'static str, name: impl Into<String>) -> Self {
        Self { namespace: Some(namespace.clone()), kind, name: name.into() }
    }

    pub fn global(kind: &'static str, name: impl Into<String>) -> Self {
        Self { namespace: None, kind, name: name.into() }
    }

    /// A namespace itself: seen by who has a role in it, changed only on `*`.
    pub fn namespace(namespace: &Namespace) -> Self {
        Self { namespace: None, kind: "namespace", name: namespace.as_str().to_owned() }
    }
}

/// Why an action is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The caller may not see the object: answered as a missing one.
    #[error("{kind} {name:?} does not exist")]
    Hidden { kind: &'static str, name: String },
    /// The caller sees the object, but its role there is below `need`.
    #[error("this needs the {} role", need.as_str())]
    Forbidden { need: Role },
}

impl From<Denied> for crate::error::ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Hidden { kind, name } => Self::NotFound { kind, name },
            Denied::Forbidden { need } => Self::Forbidden { need: need.as_str() },
        }
    }
}

/// A refusal, as the audit trail records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub action: Action,
    pub namespace: Option<Namespace>,
    pub object: String,
}

/// The refusals of one request, shared by its services and the gate.
#[derive(Debug, Clone, Default)]
pub struct Refusals(Arc<Mutex<Vec<Refusal>>>);

impl Refusals {
    fn note(&self, refusal: Refusal) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(refusal);
    }

    /// The first refusal, if any: what the request's audit record names.
    pub fn first(&self) -> Option<Refusal> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).first().cloned()
    }
}

/// The namespace a request worked in, as its handler's scope read it
/// (`None` inside: `*`, a list of every namespace): what the audit record
/// of an allowed change names.
#[derive(Debug, Clone, Default)]
pub struct WorkedIn(Arc<std::sync::OnceLock<Option<Namespace>>>);

impl WorkedIn {
    /// Kept once: a request has one scope.
    pub fn set(&self, namespace: Option<Namespace>) {
        let _ = self.0.set(namespace);
    }

    pub fn get(&self) -> Option<&Namespace> {
        self.0.get().and_then(Option::as_ref)
    }
}

/// What one request may do: its caller (`None`: no authentication, a test
/// setup, every grant), the namespace it works in, and where its refusals
/// are noted.
#[derive(Debug, Clone)]
pub struct Access {
    caller: Option<Caller>,
    pub namespace: Namespace,
    refusals: Refusals,
}

impl Access {
    pub fn new(caller: Option<Caller>, namespace: Namespace, refusals: Refusals) -> Self {
        Self { caller, namespace, refusals }
    }

    /// Everything, in `namespace`: for work drover does on its own, and
    /// tests.
    pub fn unrestricted(namespace: Namespace) -> Self {
        Self::new(None, namespace, Refusals::default())
    }

    pub fn caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }

    /// Who asks, as records name it.
    pub fn caller_name(&self) -> Option<&str> {
        self.caller.as_ref().map(|c| c.name.as_str())
    }

    /// The caller's grants (`None`: unrestricted).
    pub fn grants(&self) -> Option<&Grants> {
        self.caller.as_ref().map(|c| &c.grants)
    }

    /// The caller's role in `namespace`.
    pub fn role_in(&self, namespace: &Namespace) -> Option<Role> {
        match &self.caller {
            None => Some(Role::Admin),
            Some(c) => c.grants.role_in(namespace),
        }
    }

    /// The caller's role over everything (`*`).
    pub fn global_role(&self) -> Option<Role> {
        match &self.caller {
            None => Some(Role::Admin),
            Some(c) => c.grants.global_role(),
        }
    }

    /// The namespaces the caller may see; `None`: every one.
    pub fn visible_namespaces(&self) -> Option<Vec<Namespace>> {
        self.caller.as_ref().and_then(|c| c.grants.namespaces())
    }

    /// May the caller do `action` to `target`? The one decision: every
    /// service asks it of every object it reads or changes.
    pub fn may(&self, action: Action, target: &Target) -> Result<(), Denied> {
        let decision = decide(self.caller.as_ref().map(|c| &c.grants), action, target);
        if decision.is_err() {
            self.refusals.note(Refusal {
                action,
                namespace: target
                    .namespace
                    .clone()
                    .or_else(|| (target.kind == "namespace").then(|| Namespace::stored(target.name.clone()))),
                object: format!("{}/{}", target.kind, target.name),
            });
        }
        decision
    }
}

/// The rule itself, pure.
fn decide(grants: Option<&Grants>, action: Action, target: &Target) -> Result<(), Denied> {
    let Some(grants) = grants else { return Ok(()) };
    let hidden = || Denied::Hidden { kind: target.kind, name: target.name.clone() };
    let role = match (&target.namespace, target.kind) {
        (Some(namespace), _) => grants.role_in(namespace),
        // A namespace is seen by who has a role in it; changed only on `*`.
        (None, "namespace") => {
            let seen = grants.role_in(&Namespace::stored(target.name.clone()));
            match action.need {
                Role::Viewer => seen,
                _ => grants.global_role().or(seen.map(|_| Role::Viewer)),
            }
        }
        // Engines are seen by anyone with a grant somewhere.
        (None, "engine") if action.need == Role::Viewer => grants.highest().map(|_| Role::Viewer),
        (None, _) => match grants.global_role() {
            Some(role) => Some(role),
            // Seen (so refused, not hidden) by a caller of some namespace.
            None => grants.highest().map(|_| Role::Viewer),
        },
    };
    match role {
        None => Err(hidden()),
        Some(role) if role >= action.need => Ok(()),
        Some(_) => Err(Denied::Forbidden { need: action.need }),
    }
}

/// Whether a caller holding `have` may give `want` (a token's grants): it
/// may only give what it holds itself.
pub fn may_give(have: Option<&Grants>, want: &Grants) -> bool {
    have.is_none_or(|have| have.include(want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::grant::{Grant, Scope};

    fn ns(s: &str) -> Namespace {
        Namespace::parse(s).unwrap()
    }

    fn grants(list: &[(&str, Role)]) -> Grants {
        Grants(list.iter().map(|(s, r)| Grant::new(Scope::parse(s).unwrap(), *r)).collect())
    }

    #[test]
    fn an_object_of_a_namespace_without_a_grant_is_missing_and_a_low_role_is_forbidden() {
        let g = grants(&[("a", Role::Operator)]);
        let web_a = Target::in_namespace(&ns("a"), "pool", "web");
        let web_b = Target::in_namespace(&ns("b"), "pool", "web");
        assert_eq!(decide(Some(&g), Action::OPERATE, &web_a), Ok(()));
        assert_eq!(decide(Some(&g), Action::CHANGE, &web_a), Err(Denied::Forbidden { need: Role::Admin }));
        let hidden = Err(Denied::Hidden { kind: "pool", name: "web".into() });
        assert_eq!(decide(Some(&g), Action::READ, &web_b), hidden, "not even read");
        assert_eq!(decide(Some(&g), Action::CHANGE, &web_b), hidden);
        assert_eq!(decide(None, Action::CHANGE, &web_b), Ok(()), "no authentication: a test setup");
    }

    #[test]
    fn what_belongs_to_no_namespace_is_changed_only_with_a_grant_on_star() {
        let team_admin = grants(&[("a", Role::Admin)]);
        let root = grants(&[("*", Role::Admin)]);
        let engine = Target::global("engine", "host-b");
        assert_eq!(decide(Some(&team_admin), Action::READ, &engine), Ok(()), "engines are shared");
        assert_eq!(decide(Some(&team_admin), Action::CHANGE, &engine), Err(Denied::Forbidden { need: Role::Admin }));
        assert_eq!(decide(Some(&root), Action::CHANGE, &engine), Ok(()));
        let b = Target::namespace(&ns("b"));
        assert!(matches!(decide(Some(&team_admin), Action::READ, &b), Err(Denied::Hidden { .. })));
        assert_eq!(decide(Some(&team_admin), Action::READ, &Target::namespace(&ns("a"))), Ok(()));
        assert_eq!(
            decide(Some(&team_admin), Action::CHANGE, &Target::namespace(&ns("a"))),
            Err(Denied::Forbidden { need: Role::Admin }),
            "a namespace's admin does not delete the namespace"
        );
    }

    #[test]
    fn every_refusal_is_noted_for_the_audit_trail() {
        let refusals = Refusals::default();
        let caller = Caller::with_grants("ci", grants(&[("a", Role::Viewer)]));
        let access = Access::new(Some(caller), ns("a"), refusals.clone());
        let _ = access.may(Action::OPERATE, &Target::in_namespace(&ns("b"), "pool", "web"));
        let r = refusals.first().expect("a refusal");
        assert_eq!((r.action, r.namespace, r.object.as_str()), (Action::OPERATE, Some(ns("b")), "pool/web"));
    }
}
