//! Who may do what: bearer tokens, three roles, and the audit trail.
//!
//! Every route except the probes and the API documents needs a token. The
//! role a route needs is decided from its method and route pattern alone,
//! before the handler runs, so a 401 or 403 never tells whether the named
//! resource exists. Tokens are looked up in memory ([`cache`]); refusals of
//! requests without a valid token are audited once per burst
//! ([`refusals`]), so that nobody without a token can grow the store fast.
//!
//! Besides drover's own tokens, a bearer token may be a JWT of an OIDC
//! issuer of the access config (verified by [`crate::access::oidc`]), and a
//! connection may present a client certificate whose subject the access
//! config maps to a role ([`crate::tls`]). A token in the header is always
//! the one judged: a certificate is used only by requests without one.

use std::path::Path;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::access::{AccessConfig, OidcError, Verifier, oidc::looks_like_jwt};
use crate::db::{self, Db, audit::NewAudit};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::telemetry::{Clipped, truncate};
use audit_log::AuditLog;
use cache::TokenCache;
use refusals::RefusalAudit;

pub mod audit_log;
pub mod cache;
pub mod caller;
pub mod refusals;
pub mod tokens;

pub use crate::domain::role::Role;
pub use caller::{Caller, ClientCertificate, Via};

const TOKEN_PREFIX: &str = "drover_";

/// A new random token: 256 bits, URL-safe.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

pub fn hash_token(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Routes anyone may call.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/openapi.json") || path == "/docs" || path.starts_with("/docs/")
        // The dashboard's page and files hold no data; its API calls carry the token.
        || path == "/ui"
        || path.starts_with("/ui/")
}

/// The least role a route needs. Unknown routes need `admin`, so that a
/// new endpoint is closed until someone decides otherwise.
pub fn required_role(method: &Method, route: &str) -> Role {
    use Role::*;
    let m = method.as_str();
    match (m, route) {
        (_, "/v1/tokens" | "/v1/tokens/{name}" | "/v1/audit") => Admin,
        ("GET" | "HEAD", _) => Viewer,
        // A dry run changes nothing.
        ("POST", "/v1/pools/{name}/plan") => Viewer,
        // A dry run changes nothing; an apply checks each change against
        // the role its single-object route needs (`apply::plan`).
        ("POST", "/v1/apply") => Viewer,
        ("PUT", "/v1/pools/{name}/scale")
        | ("PATCH", "/v1/pools/{name}")
        | ("POST", "/v1/pools/{name}/rollout/continue")
        | ("POST", "/v1/pools/{name}/rollback")
        | ("POST", "/v1/pools/{name}/machines/{machine}/delete-request")
        | ("DELETE", "/v1/pools/{name}/machines/{machine}")
        | ("POST", "/v1/clusters/{name}/upgrades")
        | ("POST", "/v1/upgrades/{id}/cancel") => Operator,
        _ => Admin,
    }
}

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
    if let Some(caller) = state.tokens.lookup(&hash, Utc::now()) {
        return Some(caller);
    }
    state.db.shared_store()?;
    match db::tokens::by_hash(state.db.read(), &hash).await {
        Ok(Some(stored)) => {
            state.tokens.insert(&stored.name, stored.role, &stored.hash);
            state.tokens.lookup(&hash, Utc::now())
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
        return match state.oidc {
            Some(oidc) if looks_like_jwt(token) => match oidc.verify(token).await {
                Ok(v) => {
                    let name = format!("oidc:{}", truncate(&v.subject, MAX_SUBJECT));
                    let label = format!("{name} ({})", v.used_claims.join(", "));
                    let caller = Caller { name, role: v.role, via: Via::Oidc { expires_at: v.expires_at } };
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
    match state.access.and_then(|a| a.subject_role(&cert.0)) {
        Some(role) => {
            let name = format!("cert:{}", truncate(&cert.0, MAX_SUBJECT));
            (Identity::Known(Caller { name, role, via: Via::Certificate }), None)
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
    /// The OIDC issuers, when the access config names any.
    pub oidc: Option<&'a Verifier>,
    /// The access config (client-certificate subjects), when given.
    pub access: Option<&'a AccessConfig>,
}

/// Authenticates, authorizes and audits one request, then hands it to
/// `next`. `route` is the matched route pattern (`/v1/pools/{name}`): the
/// role a request needs depends on it, never on the names in the path.
pub async fn guard<F, Fut>(state: &Gate<'_>, route: Option<&str>, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let path = req.uri().path();
    if is_public(path) {
        return next(req).await;
    }
    let method = req.method().clone();
    let route = route.unwrap_or(path);
    let need = required_role(&method, route);
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    // Only changes are audited; reads keep nothing of the path.
    let audited_path = mutating.then(|| Clipped(path, AUDIT_MAX_PATH).to_string());
    let (identity, label) = identify(state, req.headers(), req.extensions().get::<ClientCertificate>()).await;
    let (response, outcome) = match &identity {
        Identity::None => {
            state.metrics.unauthenticated();
            (unauthenticated(), "unauthenticated")
        }
        Identity::NoRule(_) => (ApiError::NoAccessRule.into_response(), "forbidden"),
        Identity::Known(c) if c.role < need => {
            (ApiError::Forbidden { need: need.as_str() }.into_response(), "forbidden")
        }
        Identity::Known(c) => {
            req.extensions_mut().insert(c.clone());
            (next(req).await, "allowed")
        }
    };
    let caller = match &identity {
        Identity::Known(c) => Some(c),
        _ => None,
    };
    let named = match &identity {
        Identity::Known(c) => Some(label.unwrap_or_else(|| c.name.clone())),
        Identity::NoRule(name) => Some(name.clone()),
        Identity::None => None,
    };
    if let Some(path) = audited_path {
        let resource = resource_of(&path).map(|r| truncate(&r, AUDIT_MAX_RESOURCE).to_owned());
        let record = NewAudit {
            token_name: named.clone(),
            role: caller.map(|c| c.role.as_str()),
            method: truncate(method.as_str(), AUDIT_MAX_METHOD).to_owned(),
            path,
            resource,
            status: response.status().as_u16(),
            outcome,
        };
        if named.is_none() {
            state.refusals.record(state.db, &record).await;
        } else {
            state.audit.write(record).await;
        }
    }
    response
}

/// On first start, when no token exists, makes an admin token and writes
/// it to `<data dir>/admin.token` (mode 0600). The log names the file,
/// never the token. Of replicas starting together on an empty store,
/// exactly one makes it (the check and the insert hold the table), and
/// only that one writes the file. The file is written before the token is
/// committed, so no valid admin token is ever without it.
pub async fn bootstrap(db: &Db, data_dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut tx = db.begin_write().await?;
    if db::tokens::any_locked(&mut tx).await? {
        return Ok(());
    }
    let token = new_token();
    let path = data_dir.join("admin.token");
    db::tokens::insert(&mut tx, "bootstrap-admin", Role::Admin.as_str(), &hash_token(&token), Utc::now()).await?;
    write_private(&path, &format!("{token}\n")).with_context(|| format!("writing {}", path.display()))?;
    if let Err(e) = tx.commit().await {
        let _ = std::fs::remove_file(&path);
        return Err(e).context("storing the first admin token");
    }
    tracing::warn!(file = %path.display(), "created an admin token (name bootstrap-admin); it is in {}", path.display());
    Ok(())
}

/// Creates (or replaces) a file readable by its owner only.
pub fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(content.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {

    #[test]
    fn token_hashes_are_lowercase_hex_sha256() {
        assert_eq!(hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
    use super::*;

    #[test]
    fn tokens_are_random_and_hash_stably() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 43);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_eq!(hash_token(&a).len(), 64);
    }

    #[test]
    fn roles_follow_the_route_table() {
        let r = |m: &str, p: &str| required_role(&Method::from_bytes(m.as_bytes()).unwrap(), p);
        assert_eq!(r("GET", "/v1/pools"), Role::Viewer);
        assert_eq!(r("POST", "/v1/pools/{name}/plan"), Role::Viewer);
        assert_eq!(r("PUT", "/v1/pools/{name}/scale"), Role::Operator);
        assert_eq!(r("POST", "/v1/upgrades/{id}/cancel"), Role::Operator);
        assert_eq!(r("POST", "/v1/pools"), Role::Admin);
        assert_eq!(r("DELETE", "/v1/clusters/{name}"), Role::Admin);
        assert_eq!(r("GET", "/v1/tokens"), Role::Admin);
        assert_eq!(r("GET", "/v1/audit"), Role::Admin);
        assert_eq!(r("POST", "/v1/something-new"), Role::Admin);
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }

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
