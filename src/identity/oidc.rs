//! Verifying an OIDC JWT: which issuer, which key, the signature, the
//! registered claims, then the issuer's rules.
//!
//! What is checked, in order (SECURITY.md says why):
//! 1. the header's `alg` is RS256 or ES256: `none` and the HMAC family are
//!    refused before any key is looked at, so a public key can never be
//!    used as an HMAC secret;
//! 2. the unverified `iss` names a configured issuer (it only chooses the
//!    keys; the signature and the `iss` check below decide);
//! 3. the key: by `kid` (one refresh of the issuer's keys when unknown;
//!    and keys older than `max_key_age_seconds` are fetched again in the
//!    background, see [`Verifier::keep_fresh`]);
//!    a key whose JWKS entry names an algorithm must be used with it;
//! 4. signature, `iss`, `aud`, `exp` and `nbf` (with the issuer's leeway),
//!    by jsonwebtoken;
//! 5. the first rule whose claims all match gives the role; none is a 403.
//!
//! A verdict (allowed, or no rule) is then kept until the token expires
//! ([`super::verdicts`]), so the same token sent again costs a hash and a
//! lookup. The token itself is never stored or logged.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{AccessConfig, IssuerConfig};
use super::keys::{Key, KeyCache, KeyError, KeySource};
use super::rules::{ClaimRule, first_match};
pub use super::verdicts::Verified;
use super::verdicts::{Verdict, Verdicts, digest};

/// Least wait before stale keys that could not be fetched are tried again.
pub const STALE_RETRY: Duration = Duration::from_secs(5);

/// The algorithms drover accepts.
pub const ALGORITHMS: [Algorithm; 2] = [Algorithm::RS256, Algorithm::ES256];

/// Why a JWT was refused. Only [`OidcError::NoRule`] is a 403; the rest
/// are 401. The messages go to the debug log, never to the client.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("not a JWT")]
    Malformed,
    #[error("algorithm {0} is not accepted (RS256 or ES256 only)")]
    Algorithm(String),
    #[error("issuer {0:?} is not configured")]
    UnknownIssuer(String),
    #[error("no key of the issuer has id {0:?}")]
    UnknownKey(String),
    #[error("the token is not valid: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("no rule of the issuer matches the token of subject {subject:?}")]
    NoRule { subject: String },
}

struct Issuer {
    issuer: String,
    keys: KeyCache,
    /// Keys older than this are fetched again.
    max_key_age: Duration,
    validation: Validation,
    rules: Vec<ClaimRule>,
}

/// The configured issuers.
pub struct Verifier {
    issuers: Vec<Issuer>,
    verdicts: Verdicts,
}

impl Verifier {
    /// Loads every issuer's keys (see [`KeyCache::start`]).
    pub async fn start(config: &AccessConfig) -> Result<Self, KeyError> {
        let mut issuers = Vec::with_capacity(config.oidc_issuer.len());
        for c in &config.oidc_issuer {
            let keys = KeyCache::start(source_of(c), Duration::from_secs(c.min_refresh_seconds)).await?;
            issuers.push(Issuer {
                issuer: c.issuer.clone(),
                keys,
                max_key_age: Duration::from_secs(c.max_key_age_seconds),
                validation: validation(c),
                rules: c.rules.clone(),
            });
        }
        Ok(Self { issuers, verdicts: Verdicts::default() })
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// Until `cancel`, fetches each issuer's keys again once they are
    /// older than its `max_key_age_seconds`. A key the issuer retired or
    /// revoked then stops working within that time, and so do the cached
    /// verdicts of the tokens it signed (they are forgotten at each fetch).
    /// A fetch that fails keeps the cached keys and is tried again after
    /// `min_refresh_seconds` (at least [`STALE_RETRY`]).
    pub fn keep_fresh(self: &Arc<Self>, tasks: &TaskTracker, cancel: &CancellationToken) {
        for index in 0..self.issuers.len() {
            tasks.spawn(Arc::clone(self).keep_issuer_fresh(index, cancel.clone()));
        }
    }

    async fn keep_issuer_fresh(self: Arc<Self>, index: usize, cancel: CancellationToken) {
        let Some(issuer) = self.issuers.get(index) else { return };
        let retry = issuer.keys.min_refresh().max(STALE_RETRY);
        loop {
            let wait = match issuer.keys.age() {
                Some(age) if age < issuer.max_key_age => issuer.max_key_age - age,
                _ => retry,
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            // A refresh caused by an unknown key id may have come first.
            let stale = issuer.keys.age().is_none_or(|age| age >= issuer.max_key_age);
            if stale && issuer.keys.refresh().await {
                self.verdicts.forget_issuer(index);
            }
        }
    }

    /// Verifies `token` and maps it to a role.
    pub async fn verify(&self, token: &str) -> Result<Verified, OidcError> {
        let key = digest(token);
        let now = crate::clock::wall().timestamp();
        let verdict = match self.verdicts.get(&key, now) {
            Some(verdict) => verdict,
            None => {
                let (issuer, verdict, until) = self.check(token).await?;
                self.verdicts.put(key, verdict.clone(), issuer, until, now);
                verdict
            }
        };
        match verdict {
            Verdict::Allowed(v) => Ok(v),
            Verdict::NoRule(subject) => Err(OidcError::NoRule { subject }),
        }
    }

    /// The whole check of a token not seen before: its issuer's index, the
    /// verdict, and the last second the verdict holds (`exp` + leeway).
    async fn check(&self, token: &str) -> Result<(usize, Verdict, i64), OidcError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| unaccepted_header(token))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(OidcError::Algorithm(format!("{:?}", header.alg)));
        }
        let iss = unverified_issuer(token)?;
        let index = self.issuers.iter().position(|i| i.issuer == iss).ok_or(OidcError::UnknownIssuer(iss))?;
        let issuer = &self.issuers[index];
        let key = issuer.key_for(header.kid.as_deref(), header.alg, || self.verdicts.forget_issuer(index)).await?;
        let mut validation = issuer.validation.clone();
        validation.algorithms = vec![header.alg];
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)?;
        let claims = data.claims;
        let subject = claims.get("sub").and_then(Value::as_str).unwrap_or_default().to_owned();
        let expires_at = claims.get("exp").and_then(Value::as_i64).unwrap_or_default();
        let until = expires_at.saturating_add(i64::try_from(validation.leeway).unwrap_or(0));
        let verdict = match first_match(&issuer.rules, &claims) {
            Some((grants, used_claims)) => Verdict::Allowed(Verified { subject, grants, used_claims, expires_at }),
            None => Verdict::NoRule(subject),
        };
        Ok((index, verdict, until))
    }
}

impl Issuer {
    /// The key `kid` names (refreshing once when it is unknown), usable
    /// with `alg`.
    /// `on_new_keys` runs when a refresh stored new keys.
    async fn key_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
        on_new_keys: impl FnOnce(),
    ) -> Result<jsonwebtoken::DecodingKey, OidcError> {
        if let Some(key) = pick(&self.keys.current(), kid, alg) {
            return Ok(key);
        }
        // Looked up again even when this request's refresh was refused:
        // another request may just have fetched the key.
        if self.keys.refresh().await {
            on_new_keys();
        }
        pick(&self.keys.current(), kid, alg).ok_or_else(|| OidcError::UnknownKey(kid.unwrap_or("(none)").to_owned()))
    }
}

/// The key for `kid` and `alg`; without a `kid`, the issuer's only key of
/// that family.
fn pick(keys: &[Key], kid: Option<&str>, alg: Algorithm) -> Option<jsonwebtoken::DecodingKey> {
    let fits = |k: &&Key| k.family == alg.family() && k.alg.is_none_or(|a| a == alg);
    match kid {
        Some(kid) => keys.iter().filter(fits).find(|k| k.kid.as_deref() == Some(kid)).map(|k| k.key.clone()),
        None => {
            let mut candidates = keys.iter().filter(fits);
            match (candidates.next(), candidates.next()) {
                (Some(only), None) => Some(only.key.clone()),
                _ => None,
            }
        }
    }
}

/// A header jsonwebtoken cannot read: `alg: none` and unknown algorithms
/// land here, and are named when the header is readable JSON.
fn unaccepted_header(token: &str) -> OidcError {
    let alg = token
        .split('.')
        .next()
        .and_then(|h| URL_SAFE_NO_PAD.decode(h.trim_end_matches('=')).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|v| v.get("alg").and_then(Value::as_str).map(str::to_owned));
    match alg {
        Some(alg) => OidcError::Algorithm(alg),
        None => OidcError::Malformed,
    }
}

/// The `iss` of a token before its signature is checked: only to choose
/// whose keys check it.
fn unverified_issuer(token: &str) -> Result<String, OidcError> {
    let payload = token.split('.').nth(1).ok_or(OidcError::Malformed)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).map_err(|_| OidcError::Malformed)?;
    let claims: Value = serde_json::from_slice(&bytes).map_err(|_| OidcError::Malformed)?;
    claims.get("iss").and_then(Value::as_str).map(str::to_owned).ok_or(OidcError::Malformed)
}

fn source_of(c: &IssuerConfig) -> KeySource {
    match (&c.jwks_file, &c.jwks_uri) {
        (Some(path), _) => KeySource::File(path.clone()),
        (None, Some(uri)) => KeySource::Uri(uri.clone()),
        (None, None) => KeySource::Discovery { issuer: c.issuer.clone() },
    }
}

fn validation(c: &IssuerConfig) -> Validation {
    let mut v = Validation::new(Algorithm::RS256);
    v.set_issuer(&[&c.issuer]);
    v.set_audience(&c.audience);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    v.leeway = c.leeway_seconds;
    v.validate_exp = true;
    v.validate_nbf = true;
    v
}

/// Whether a bearer token looks like a JWT (three base64url parts) rather
/// than a drover token: decides which check it gets.
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("ey")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    #[test]
    fn none_and_hmac_are_refused_before_any_key_is_looked_at() {
        let body = encode(&serde_json::json!({"iss": "https://i", "sub": "x"}));
        let none = format!("{}.{body}.", encode(&serde_json::json!({"alg": "none"})));
        assert!(matches!(unaccepted_header(&none), OidcError::Algorithm(a) if a == "none"));
        assert!(matches!(unaccepted_header("garbage"), OidcError::Malformed));
        assert!(!ALGORITHMS.contains(&Algorithm::HS256));
        assert_eq!(unverified_issuer(&none).ok().as_deref(), Some("https://i"));
    }

    #[test]
    fn jwts_are_told_from_drover_tokens() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJ9.sig"));
        assert!(!looks_like_jwt("drover_abcdef"));
        assert!(!looks_like_jwt("eyJ.only-two"));
    }
}
