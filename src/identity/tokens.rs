//! The tokens service: create a token (its secret shown once, stored as a
//! hash), list them, revoke one; and read the audit trail. Every change is
//! mirrored in the in-memory token cache, so authenticating reads no store.
//!
//! A token holds grants. One whose grants are all in one namespace is
//! managed there: that namespace's admins create, list and revoke it. Any
//! other (a grant on `*`, or grants in several namespaces) is global, a
//! `*` admin's. No caller gives a grant it does not hold itself.

use std::sync::Arc;

use super::authz::{self, Access, Action, Denied, Target};
use super::cache::TokenCache;
use super::{hash_token, new_token};
use crate::db::audit::AuditRecord;
use crate::db::page::{Page, PageRequest};
use crate::db::tokens::{DeleteOutcome, NewToken, TokenInfo};
use crate::db::{self, Db};
use crate::domain::ValidationErrors;
use crate::domain::grant::{Grants, Scope};
use crate::domain::names::DnsLabel;
use crate::domain::object::Namespace;
use crate::domain::role::Role;

/// Most grants one token holds.
pub const MAX_GRANTS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("a token named {0:?} already exists")]
    Exists(String),
    #[error("no token named {0:?}")]
    NotFound(String),
    #[error("{0:?} is the last token with the admin role on `*`; create another first")]
    LastAdmin(String),
    #[error(transparent)]
    Denied(#[from] Denied),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

/// A token just created, with its secret: the only time it is seen.
pub struct Created {
    pub info: TokenInfo,
    pub secret: String,
}

#[derive(Clone)]
pub struct Tokens {
    db: Db,
    cache: Arc<TokenCache>,
}

impl Tokens {
    pub fn new(db: Db, cache: Arc<TokenCache>) -> Self {
        Self { db, cache }
    }

    /// Creates a token with `grants`, each of which the caller must be an
    /// admin of (a namespace's admin gives grants in that namespace; only
    /// a `*` admin gives `*`) and hold itself.
    #[tracing::instrument(name = "tokens.create", skip_all)]
    pub async fn create(&self, access: &Access, name: &DnsLabel, grants: Grants) -> Result<Created, TokenError> {
        check_grants(&grants).map_err(TokenError::Invalid)?;
        for grant in &grants.0 {
            access.may(Action::CHANGE, &scope_target(&grant.namespace, name))?;
        }
        // Implied by the checks above; kept as the rule itself, so that a
        // change to them cannot let a caller mint more than it holds.
        if !authz::may_give(access.grants(), &grants) {
            return Err(Denied::Forbidden { need: Role::Admin }.into());
        }
        // A grant on a namespace that does not exist (yet) would hand it to
        // whoever the name is given to later.
        for grant in &grants.0 {
            if let Scope::Namespace(ns) = &grant.namespace
                && db::namespaces::get(self.db.read(), ns).await?.is_none()
            {
                return Err(Denied::Hidden { kind: "namespace", name: ns.as_str().to_owned() }.into());
            }
        }
        let secret = new_token();
        let hash = hash_token(&secret);
        let new = NewToken { name: name.as_str(), namespace: grants.single_namespace(), grants: &grants, hash: &hash };
        let mut tx = self.db.begin_write().await?;
        let info = match db::tokens::insert(&mut tx, &new, crate::clock::wall()).await {
            Ok(info) => info,
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                return Err(TokenError::Exists(name.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        tx.commit().await?;
        self.cache.insert(&info.name, &grants, &hash);
        tracing::info!(token = %name, grants = %describe(&grants), by = access.caller_name(), "token created");
        Ok(Created { info, secret })
    }

    /// The tokens the caller manages (names and grants; never the
    /// secrets): every one for a `*` admin, else those of the namespaces
    /// it is an admin of.
    pub async fn list(&self, access: &Access) -> Result<Vec<TokenInfo>, TokenError> {
        let mut items = match access.grants() {
            Some(g) if g.global_role() != Some(Role::Admin) => {
                let mut items = Vec::new();
                for ns in g.admin_of() {
                    items.extend(db::tokens::list(&self.db, Some(ns)).await?);
                }
                items.sort_by(|a, b| a.name.cmp(&b.name));
                items.dedup_by(|a, b| a.name == b.name);
                items
            }
            _ => db::tokens::list(&self.db, None).await?,
        };
        // Uses are stamped in memory and stored about once a minute.
        for t in &mut items {
            t.last_used_at = t.last_used_at.max(self.cache.last_used(&t.name));
        }
        Ok(items)
    }

    /// Revokes a token the caller manages; the last token with the admin
    /// role on `*` cannot be revoked.
    #[tracing::instrument(name = "tokens.delete", skip_all)]
    pub async fn delete(&self, access: &Access, name: &str) -> Result<(), TokenError> {
        let managed_in = db::tokens::namespace_of(self.db.read(), name)
            .await?
            .ok_or_else(|| TokenError::NotFound(name.to_owned()))?;
        let target = match &managed_in {
            Some(ns) => Target::in_namespace(ns, "token", name),
            None => Target::global("token", name),
        };
        access.may(Action::CHANGE, &target)?;
        let mut tx = self.db.begin_write().await?;
        match db::tokens::delete(&mut tx, name, managed_in.as_ref()).await? {
            None => Err(TokenError::NotFound(name.to_owned())),
            Some(DeleteOutcome::LastAdmin) => Err(TokenError::LastAdmin(name.to_owned())),
            Some(DeleteOutcome::Deleted) => {
                tx.commit().await?;
                // The token stops working with the next request, on this server.
                self.cache.remove(name);
                tracing::info!(token = %name, by = access.caller_name(), "token revoked");
                Ok(())
            }
        }
    }

    /// A page of the audit trail, newest first: of one namespace (its
    /// admins), or all of it (`None`: a `*` admin).
    pub async fn audit(
        &self,
        access: &Access,
        namespace: Option<&Namespace>,
        req: &PageRequest<i64>,
    ) -> Result<Page<AuditRecord>, TokenError> {
        let target = match namespace {
            Some(ns) => Target::in_namespace(ns, "audit trail", ns.as_str()),
            None => Target::global("audit trail", "*"),
        };
        access.may(Action::CHANGE, &target)?;
        let rows = db::audit::page(self.db.read(), namespace, req.after, req.fetch()).await?;
        Ok(Page::from_rows(rows, req.limit, |a| a.id.to_string()))
    }
}

/// What giving a grant on `scope` needs: its admin role there.
fn scope_target(scope: &Scope, token: &DnsLabel) -> Target {
    match scope {
        Scope::All => Target::global("token", token.as_str()),
        Scope::Namespace(ns) => Target::in_namespace(ns, "namespace", ns.as_str()),
    }
}

fn check_grants(grants: &Grants) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if grants.0.is_empty() {
        errs.push("grants", "min_items", "a token needs at least one grant");
    }
    if grants.0.len() > MAX_GRANTS {
        errs.push("grants", "max_items", format!("at most {MAX_GRANTS} grants"));
    }
    for (i, g) in grants.0.iter().enumerate() {
        if grants.0[..i].iter().any(|earlier| earlier.namespace == g.namespace) {
            errs.push(
                format!("grants[{i}].namespace"),
                "unique",
                format!("{:?} is granted twice; give each namespace one role", g.namespace.as_str()),
            );
        }
    }
    errs.into_result(())
}

/// `team-a:operator, *:viewer`, for logs.
fn describe(grants: &Grants) -> String {
    grants.0.iter().map(|g| format!("{}:{}", g.namespace, g.role.as_str())).collect::<Vec<_>>().join(", ")
}
