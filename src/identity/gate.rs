//! The gate every request passes: who its credentials name, and whether
//! that caller's role is enough for the route (see [`super::routes`]).
//!
//! Every route except the probes and the API documents needs credentials.
//! The role a route needs is decided from its method and route pattern
//! alone, before the handler runs, so a 401 or 403 never tells whether the
//! named resource exists. drover's own tokens are looked up in memory
//! ([`super::cache`]); a bearer token may also be a JWT of an OIDC issuer
//! of the access config ([`super::oidc`]), and a connection may present a
//! client certificate whose subject the access config maps to a role
//! ([`crate::tls`]). A token in the header is always the one judged: a
//! certificate is used only by requests without one.
//!
//! Changes are written to the audit trail ([`crate::audit`]); refusals of
//! requests without valid credentials are audited once per burst, so that
//! nobody without a token can grow the store fast.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};

use super::OidcError;
use super::authz::{Refusals, WorkedIn};
use super::cache::TokenCache;
use super::caller::{Caller, ClientCertificate, Via};
use super::oidc::looks_like_jwt;
use super::reload::Loaded;
use super::routes::{is_public, required_role};
use super::secret::hash_token;
use crate::audit::log::AuditLog;
use crate::audit::refusals::RefusalAudit;
use crate::db::{self, Db, audit::NewAudit};
use crate::domain::role::Role;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::telemetry::{Clipped, truncate};

/// `pools/web` for `/v1/pools/web/scale`: what an audit record is about.
fn resource_of(path: &str) -> Option<String> {
    let mut parts = path.trim_start_matches('/').split('/').skip(1);
    let kind = parts.next()?;
    Some(match parts.next() {
        Some(name) => format!("{kind}/{name}"),
        None => kind.to_owned(),
    })
}

/// Longest path an audit record keeps: enough to name any route of the
/// API, so a longer one is cut and marked with its full length.
pub const AUDIT_MAX_PATH: usize = 256;
/// Longest resource (`pools/<name>`) an audit record keeps.
const AUDIT_MAX_RESOURCE: usize = 128;
/// Longest method an audit record keeps (clients may invent methods).
const AUDIT_MAX_METHOD: usize = 16;

/// The token of an `Authorization: Bearer <token>` header. The scheme is
/// case-insensitive (RFC 9110, section 11.1).
fn bearer(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The caller a drover token names, from the in-memory token cache: no
/// store read. The cache is keyed by the token's SHA-256, so the lookup's
/// timing depends on the hash, never on how much of a token was right.
/// With several replicas, a token another replica created a moment ago is
/// not in this one's cache before its next reload: a hash the cache does
/// not know is looked up in the store (by its unique index) before the
/// request is refused, so a token works everywhere as soon as it is made.
async fn lookup(state: &Gate<'_>, token: &str) -> Option<Caller> {
    let hash = hash_token(token);
    if let Some(caller) = state.tokens.lookup(&hash, crate::clock::wall()) {
        return Some(caller);
    }
    state.db.shared_store()?;
    match db::tokens::by_hash(state.db, &hash).await {
        Ok(Some(stored)) => {
            state.tokens.insert(&stored.name, &stored.grants, &stored.hash);
            state.tokens.lookup(&hash, crate::clock::wall())
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "looking up a token in the store failed");
            None
        }
    }
}

/// Longest subject kept in a caller's name.
const MAX_SUBJECT: usize = 200;

/// Who a request's credentials name.
enum Identity {
    Known(Caller),
    /// A valid OIDC token that no rule maps to a role.
    NoRule(String),
    None,
}

/// Judges the request's credentials; returns who they name and, for an
/// OIDC token, what the audit trail keeps of it (its subject and the claims
/// the matching rule used; never the token).
async fn identify(
    state: &Gate<'_>,
    headers: &axum::http::HeaderMap,
    cert: Option<&ClientCertificate>,
) -> (Identity, Option<String>) {
    if let Some(token) = bearer(headers.get(header::AUTHORIZATION)) {
        return match state.access.as_ref().and_then(|a| a.oidc.as_deref()) {
            Some(oidc) if looks_like_jwt(token) => match oidc.verify(token).await {
                Ok(v) => {
                    let name = format!("oidc:{}", truncate(&v.subject, MAX_SUBJECT));
                    let label = format!("{name} ({})", v.used_claims.join(", "));
                    let caller = Caller { name, grants: v.grants, via: Via::Oidc { expires_at: v.expires_at } };
                    (Identity::Known(caller), Some(label))
                }
                Err(OidcError::NoRule { subject }) => {
                    let name = format!("oidc:{}", truncate(&subject, MAX_SUBJECT));
                    (Identity::NoRule(name.clone()), Some(name))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "refused a JWT");
                    (Identity::None, None)
                }
            },
            _ => (lookup(state, token).await.map_or(Identity::None, Identity::Known), None),
        };
    }
    let Some(cert) = cert else { return (Identity::None, None) };
    match state.access.as_ref().and_then(|a| a.config.subject_grants(&cert.0)) {
        Some(grants) => {
            let name = format!("cert:{}", truncate(&cert.0, MAX_SUBJECT));
            (Identity::Known(Caller { name, grants, via: Via::Certificate }), None)
        }
        None => {
            tracing::debug!(subject = %cert.0, "a client certificate whose subject has no role");
            (Identity::None, None)
        }
    }
}

fn unauthenticated() -> Response {
    let mut res = ApiError::Unauthenticated.into_response();
    res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"drover\""));
    res
}

/// What [`guard`] works with: borrowed from the application's state (see
/// `state.rs`), so that this module needs nothing of the HTTP layer but its
/// extractors and a request costs no reference counting for it.
pub struct Gate<'a> {
    pub db: &'a Db,
    pub tokens: &'a TokenCache,
    pub refusals: &'a RefusalAudit,
    pub audit: &'a AuditLog,
    pub metrics: &'a Metrics,
    /// The access config in use (OIDC issuers, client-certificate
    /// subjects), when one is given.
    pub access: Option<Arc<Loaded>>,
}

/// Authenticates, authorizes and audits one request, then hands it to
/// `next`. `route` is the matched route pattern (`/v1/pools/{name}`): the
/// role a request needs depends on it, never on the names in the path.
pub async fn guard<F, Fut>(state: &Gate<'_>, route: Option<&str>, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let path = req.uri().path().to_owned();
    if is_public(&path) {
        return next(req).await;
    }
    let method = req.method().clone();
    let route = route.unwrap_or(&path);
    let need = required_role(&method, route);
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    // Only changes are audited; reads keep nothing of the path.
    let audited_path = mutating.then(|| Clipped(&path, AUDIT_MAX_PATH).to_string());
    let (identity, label) = identify(state, req.headers(), req.extensions().get::<ClientCertificate>()).await;
    let refusals = Refusals::default();
    let worked_in = WorkedIn::default();
    let (response, outcome) = match &identity {
        Identity::None => {
            state.metrics.unauthenticated();
            (unauthenticated(), "unauthenticated")
        }
        Identity::NoRule(_) => (ApiError::NoAccessRule.into_response(), "forbidden"),
        // The route's role, held nowhere: refused before anything is read.
        // Which namespace (and object) the role is needed in is the
        // services' to decide, through the one authorizer (`authz`).
        Identity::Known(c) if c.grants.highest().is_none_or(|role| role < need) => {
            (ApiError::Forbidden { need: need.as_str() }.into_response(), "forbidden")
        }
        Identity::Known(c) => {
            req.extensions_mut().insert(c.clone());
            req.extensions_mut().insert(refusals.clone());
            req.extensions_mut().insert(worked_in.clone());
            let response = next(req).await;
            let outcome = if refusals.first().is_some() { "forbidden" } else { "allowed" };
            (response, outcome)
        }
    };
    let refused = refusals.first();
    let caller = match &identity {
        Identity::Known(c) => Some(c),
        _ => None,
    };
    let named = match &identity {
        Identity::Known(c) => Some(label.unwrap_or_else(|| c.name.clone())),
        Identity::NoRule(name) => Some(name.clone()),
        Identity::None => None,
    };
    // Changes are audited, and every refusal (of a read too: an object of
    // another namespace asked for); a read allowed keeps nothing.
    let audited_path = audited_path.or_else(|| refused.is_some().then(|| Clipped(&path, AUDIT_MAX_PATH).to_string()));
    if let Some(path) = audited_path {
        let resource = match &refused {
            Some(r) => Some(truncate(&r.object, AUDIT_MAX_RESOURCE).to_owned()),
            None => resource_of(&path).map(|r| truncate(&r, AUDIT_MAX_RESOURCE).to_owned()),
        };
        let record = NewAudit {
            token_name: named.clone(),
            role: caller.and_then(Caller::highest_role).map(Role::as_str),
            method: truncate(method.as_str(), AUDIT_MAX_METHOD).to_owned(),
            path,
            resource,
            namespace: match &refused {
                Some(r) => r.namespace.as_ref(),
                None => worked_in.get(),
            }
            .map(|ns| ns.as_str().to_owned()),
            action: refused.as_ref().map(|r| r.action.as_str()),
            status: response.status().as_u16(),
            outcome,
        };
        // A change is audited before its answer leaves; a refusal never
        // waits on the store (src/audit/refusals.rs).
        match (named.is_some(), outcome) {
            (true, "allowed") => state.audit.write(record).await,
            (true, _) => state.refusals.record(record),
            (false, _) => state.refusals.record_anonymous(record),
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let hv = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer(Some(&hv("Bearer abc"))), Some("abc"));
        assert_eq!(bearer(Some(&hv("bearer abc"))), Some("abc"));
        assert_eq!(bearer(Some(&hv("BEARER   abc "))), Some("abc"));
        assert_eq!(bearer(Some(&hv("Basic abc"))), None);
        assert_eq!(bearer(Some(&hv("Bearer"))), None);
        assert_eq!(bearer(Some(&hv("Bearer "))), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn audit_resources_name_the_object() {
        assert_eq!(resource_of("/v1/pools/web/scale").as_deref(), Some("pools/web"));
        assert_eq!(resource_of("/v1/pools").as_deref(), Some("pools"));
        assert_eq!(resource_of("/v1/upgrades/7/cancel").as_deref(), Some("upgrades/7"));
    }
}
