//! Verdicts on JWTs already verified, kept until the token expires.
//!
//! A pipeline sends the same token with every request of its job; checking
//! its signature each time would make an OIDC request cost several times a
//! drover token's (BENCHMARKS.md, "OIDC tokens over HTTPS"). A verdict is
//! keyed by the SHA-256 of the whole token, signature included, so only
//! that exact token finds it; it holds until the token's `exp` plus the
//! issuer's leeway, and the verdicts of an issuer are dropped whenever its
//! keys change, so a retired key stops working with the fetch that retires
//! it. Refusals for a bad token are never kept: they cost their caller the
//! full check. The cache is bounded: when full, expired verdicts go, and if
//! that is not enough, all of them.

use std::collections::HashMap;
use std::sync::RwLock;

use sha2::{Digest, Sha256};

use crate::domain::grant::Grants;

/// Who a verified token names.
#[derive(Debug, Clone)]
pub struct Verified {
    pub subject: String,
    /// What the matching rule gives it.
    pub grants: Grants,
    /// `name=value` of each claim the matching rule used.
    pub used_claims: Vec<String>,
    /// The token's `exp`, in seconds since the epoch.
    pub expires_at: i64,
}

/// Most verdicts kept.
const MAX_VERDICTS: usize = 10_000;

/// What a verified token earned.
#[derive(Debug, Clone)]
pub enum Verdict {
    Allowed(Verified),
    /// Valid, but no rule matches: the subject, for the audit trail.
    NoRule(String),
}

#[derive(Debug, Clone)]
struct Entry {
    verdict: Verdict,
    /// Index of the issuer among the configured ones.
    issuer: usize,
    /// Last second (since the epoch) the verdict holds: `exp` + leeway.
    until: i64,
}

pub type TokenDigest = [u8; 32];

/// The SHA-256 of a token: the cache's key.
pub fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

#[derive(Default)]
pub struct Verdicts {
    map: RwLock<HashMap<TokenDigest, Entry>>,
}

impl Verdicts {
    /// The verdict on the token of `digest`, if one holds at `now`.
    pub fn get(&self, digest: &TokenDigest, now: i64) -> Option<Verdict> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(digest).filter(|e| now <= e.until).map(|e| e.verdict.clone())
    }

    /// Keeps `verdict` on a token of issuer `issuer` until `until`.
    pub fn put(&self, digest: TokenDigest, verdict: Verdict, issuer: usize, until: i64, now: i64) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_VERDICTS {
            map.retain(|_, e| now <= e.until);
            if map.len() >= MAX_VERDICTS {
                map.clear();
            }
        }
        map.insert(digest, Entry { verdict, issuer, until });
    }

    /// Drops the verdicts on tokens of `issuer` (its keys changed).
    pub fn forget_issuer(&self, issuer: usize) {
        self.map.write().unwrap_or_else(|p| p.into_inner()).retain(|_, e| e.issuer != issuer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Verdict {
        Verdict::Allowed(Verified {
            subject: "s".into(),
            grants: Grants::everywhere(crate::domain::role::Role::Viewer),
            used_claims: vec![],
            expires_at: 100,
        })
    }

    #[test]
    fn verdicts_hold_until_their_deadline_and_go_with_their_issuers_keys() {
        let v = Verdicts::default();
        let (a, b) = (digest("token-a"), digest("token-b"));
        v.put(a, allowed(), 0, 130, 50);
        v.put(b, Verdict::NoRule("x".into()), 1, 130, 50);
        assert!(v.get(&a, 130).is_some());
        assert!(v.get(&a, 131).is_none(), "past exp + leeway");
        assert!(v.get(&digest("token-c"), 50).is_none());
        v.forget_issuer(0);
        assert!(v.get(&a, 60).is_none());
        assert!(matches!(v.get(&b, 60), Some(Verdict::NoRule(_))));
    }

    #[test]
    fn a_full_cache_sheds_expired_verdicts_first() {
        let v = Verdicts::default();
        for i in 0..MAX_VERDICTS {
            v.put(digest(&i.to_string()), allowed(), 0, if i == 0 { 200 } else { 10 }, 0);
        }
        v.put(digest("new"), allowed(), 0, 200, 100);
        assert!(v.get(&digest("0"), 100).is_some() && v.get(&digest("new"), 100).is_some());
        assert_eq!(v.map.read().map(|m| m.len()).unwrap_or_default(), 2);
    }
}
