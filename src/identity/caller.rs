//! The caller a request's credentials name: what the guard hands to the
//! handlers (and `cache` re-checks for long-lived responses).

use std::sync::Arc;

use crate::domain::grant::Grants;
use crate::domain::role::Role;

/// The authenticated caller, put in the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name; `oidc:<subject>` for an OIDC token,
    /// `cert:<subject>` for a client certificate.
    pub name: String,
    /// What it may do, namespace by namespace.
    pub grants: Grants,
    pub via: Via,
}

/// How the caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A drover token: valid while it is not revoked.
    Token,
    /// An OIDC JWT: valid until its `exp` (seconds since the epoch).
    Oidc { expires_at: i64 },
    /// A client certificate: valid for the connection.
    Certificate,
}

impl Caller {
    /// A token's caller with one role everywhere (`*`).
    pub fn token(name: impl Into<String>, role: Role) -> Self {
        Self::with_grants(name, Grants::everywhere(role))
    }

    pub fn with_grants(name: impl Into<String>, grants: Grants) -> Self {
        Self { name: name.into(), grants, via: Via::Token }
    }

    /// The highest role it holds anywhere, for the audit trail's `role`.
    pub fn highest_role(&self) -> Option<Role> {
        self.grants.highest()
    }
}

/// The subject of the client certificate the connection presented (mutual
/// TLS), put in each of its requests by the accept loop.
#[derive(Debug, Clone)]
pub struct ClientCertificate(pub Arc<str>);
