//! An issuer's signing keys, cached in memory.
//!
//! They come from the issuer's discovery document and the JWKS it points
//! to, from a JWKS URL given in the access config, or from a JWKS file (for
//! sites that cannot reach the issuer). A token whose key id is not cached
//! triggers one refresh, unless the last refresh is more recent than the
//! issuer's `min_refresh_seconds`: issuers rotate keys by publishing the
//! new one first, so a refresh finds it, while a stream of made-up key ids
//! costs the issuer at most one request per interval. Keys are also
//! fetched again once they are older than the issuer's
//! `max_key_age_seconds` ([`super::Verifier::keep_fresh`]), so that a key
//! the issuer retired or revoked stops working even if no token ever
//! names an unknown key id.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Why keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the JWKS file {path}: {source}")]
    File { path: PathBuf, source: std::io::Error },
    #[error("fetching {url}: {source}")]
    Fetch { url: String, source: reqwest::Error },
    #[error("fetching {url}: the server answered {status}")]
    Status { url: String, status: reqwest::StatusCode },
    #[error("{what} is not valid JSON of the expected shape: {detail}")]
    Shape { what: String, detail: String },
    #[error("the discovery document of {expected} names another issuer ({found})")]
    IssuerMismatch { expected: String, found: String },
}

/// Where the keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    File(PathBuf),
    Discovery { issuer: String },
    Uri(String),
}

/// One usable key.
pub struct Key {
    pub kid: Option<String>,
    /// The key's own `alg`, when the JWKS names one: a token must then use it.
    pub alg: Option<Algorithm>,
    pub family: jsonwebtoken::AlgorithmFamily,
    pub key: DecodingKey,
}

/// The keys of one issuer.
pub struct KeyCache {
    source: KeySource,
    http: reqwest::Client,
    /// The cached keys, and when they were fetched (`None` before the
    /// first success).
    keys: RwLock<(Arc<Vec<Key>>, Option<Instant>)>,
    /// When keys were last fetched; held while a refresh runs, so that
    /// concurrent requests with the same new key id cause one fetch.
    last_refresh: Mutex<Option<Instant>>,
    min_refresh: Duration,
}

/// How long one fetch of a discovery document or JWKS may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest JWKS or discovery document read.
const MAX_DOCUMENT: usize = 512 * 1024;

impl KeyCache {
    /// Loads the keys once. A file that cannot be read is an error (the
    /// operator gave it); an issuer that cannot be reached is logged, and
    /// its keys are fetched again when a token asks for them.
    pub async fn start(source: KeySource, min_refresh: Duration) -> Result<Self, KeyError> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|source| KeyError::Fetch { url: "(client setup)".into(), source })?;
        let cache = Self {
            source,
            http,
            keys: RwLock::new((Arc::new(Vec::new()), None)),
            last_refresh: Mutex::new(None),
            min_refresh,
        };
        match cache.load().await {
            Ok(keys) => cache.store(keys),
            Err(e @ KeyError::File { .. }) | Err(e @ KeyError::Shape { .. }) if cache.is_file() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "could not fetch the OIDC issuer's keys; trying again on the first token")
            }
        }
        // The start's fetch does not count: the first unknown key id may
        // always look again (a key published just after the start).
        Ok(cache)
    }

    fn is_file(&self) -> bool {
        matches!(self.source, KeySource::File(_))
    }

    fn store(&self, keys: Vec<Key>) {
        let mut slot = self.keys.write().unwrap_or_else(|p| p.into_inner());
        *slot = (Arc::new(keys), Some(Instant::now()));
    }

    /// How long ago the cached keys were fetched; `None` when no fetch has
    /// succeeded yet.
    pub fn age(&self) -> Option<Duration> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).1.map(|at| at.elapsed())
    }

    /// The least time between two fetches.
    pub fn min_refresh(&self) -> Duration {
        self.min_refresh
    }

    /// The cached keys.
    pub fn current(&self) -> Arc<Vec<Key>> {
        Arc::clone(&self.keys.read().unwrap_or_else(|p| p.into_inner()).0)
    }

    /// Fetches the keys again unless that happened less than
    /// `min_refresh` ago; returns whether new keys were stored. A failed
    /// fetch keeps the old keys.
    pub async fn refresh(&self) -> bool {
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < self.min_refresh) {
            return false;
        }
        *last = Some(Instant::now());
        match self.load().await {
            Ok(keys) => {
                tracing::info!(keys = keys.len(), "refreshed an OIDC issuer's keys");
                self.store(keys);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not refresh an OIDC issuer's keys; keeping the cached ones");
                false
            }
        }
    }

    async fn load(&self) -> Result<Vec<Key>, KeyError> {
        let jwks = match &self.source {
            KeySource::File(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| KeyError::File { path: path.clone(), source })?;
                parse_json(&text, &path.display().to_string())?
            }
            KeySource::Uri(url) => self.get_json(url).await?,
            KeySource::Discovery { issuer } => {
                let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                let doc = self.get_json(&url).await?;
                let found = doc.get("issuer").and_then(Value::as_str).unwrap_or_default();
                if found != issuer {
                    return Err(KeyError::IssuerMismatch { expected: issuer.clone(), found: found.to_owned() });
                }
                let jwks_uri = doc
                    .get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| KeyError::Shape { what: url.clone(), detail: "no jwks_uri".into() })?;
                self.get_json(jwks_uri).await?
            }
        };
        parse_jwks(&jwks)
    }

    async fn get_json(&self, url: &str) -> Result<Value, KeyError> {
        let fetch = |source| KeyError::Fetch { url: url.to_owned(), source };
        let res = self.http.get(url).send().await.map_err(fetch)?;
        if !res.status().is_success() {
            return Err(KeyError::Status { url: url.to_owned(), status: res.status() });
        }
        let body = res.bytes().await.map_err(fetch)?;
        if body.len() > MAX_DOCUMENT {
            return Err(KeyError::Shape { what: url.to_owned(), detail: "larger than 512 KiB".into() });
        }
        let text = String::from_utf8_lossy(&body);
        parse_json(&text, url)
    }
}

fn parse_json(text: &str, what: &str) -> Result<Value, KeyError> {
    serde_json::from_str(text).map_err(|e| KeyError::Shape { what: what.to_owned(), detail: e.to_string() })
}

/// The usable keys of a JWKS document: RSA and P-256 keys meant for
/// signatures. Keys of other kinds (encryption keys, symmetric keys,
/// curves drover does not accept) are skipped, never an error: issuers
/// publish them side by side.
pub fn parse_jwks(doc: &Value) -> Result<Vec<Key>, KeyError> {
    let items = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| KeyError::Shape { what: "the JWKS".into(), detail: "no \"keys\" list".into() })?;
    Ok(items.iter().filter_map(|item| serde_json::from_value::<Jwk>(item.clone()).ok()).filter_map(usable).collect())
}

fn usable(jwk: Jwk) -> Option<Key> {
    use jsonwebtoken::jwk::PublicKeyUse;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => jsonwebtoken::AlgorithmFamily::Rsa,
        AlgorithmParameters::EllipticCurve(p) if p.curve == jsonwebtoken::jwk::EllipticCurve::P256 => {
            jsonwebtoken::AlgorithmFamily::Ec
        }
        _ => return None,
    };
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        // A key bound to an algorithm drover refuses is of no use.
        Some(_) => return None,
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key { kid: jwk.common.key_id.clone(), alg, family, key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn symmetric_encryption_and_foreign_keys_are_skipped() {
        let doc = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "h", "alg": "HS256"},
            {"kty": "RSA", "use": "enc", "kid": "e", "n": "sXch", "e": "AQAB"},
            {"kty": "RSA", "kid": "ps", "alg": "PS256", "n": "sXch", "e": "AQAB"},
            {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "weird"},
            {"kty": "RSA", "kid": "ok", "alg": "RS256", "n": "sXch", "e": "AQAB"}
        ]});
        let keys = parse_jwks(&doc).expect("a JWKS");
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref()).collect();
        assert_eq!(kids, [Some("ok")]);
        assert!(parse_jwks(&json!({"nokeys": []})).is_err());
    }
}
