//! The access config file: its shape, and the checks a file must pass
//! before drover starts with it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::rules::{ClaimRule, SubjectRule};
use crate::domain::grant::Grants;

/// Why the access file could not be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum AccessConfigError {
    #[error("reading the access config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the access config {path} is not valid: {source}")]
    Parse { path: PathBuf, source: serde_path_to_error::Error<serde_json::Error> },
    #[error("the access config {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessConfig {
    /// OIDC issuers whose tokens are accepted; `oidc` is accepted as a
    /// shorter name.
    #[serde(default, alias = "oidc")]
    pub oidc_issuer: Vec<IssuerConfig>,
    /// Client-certificate subjects and their roles (with `--tls-client-ca`).
    #[serde(default)]
    pub mtls: Vec<SubjectRule>,
}

/// One OIDC issuer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The `iss` its tokens carry, and where its discovery document is
    /// (`<issuer>/.well-known/openid-configuration`).
    pub issuer: String,
    /// The `aud` values accepted (a token needs one of them).
    pub audience: Vec<String>,
    /// Keys from this file (a JWKS document) instead of the network: for
    /// sites that cannot reach the issuer.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// Keys from this URL, skipping discovery.
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    #[serde(default = "default_leeway")]
    pub leeway_seconds: u64,
    /// Least time between two key fetches, whatever causes them, in
    /// seconds: tokens with made-up key ids cannot make drover hammer the
    /// issuer.
    #[serde(default = "default_refresh")]
    pub min_refresh_seconds: u64,
    /// Longest time cached keys are used without fetching them again, in
    /// seconds: a key the issuer retires or revokes stops working within
    /// this time, even when no token names an unknown key id.
    #[serde(default = "default_max_key_age")]
    pub max_key_age_seconds: u64,
    /// Rules in order; the first that matches gives the role.
    pub rules: Vec<ClaimRule>,
}

fn default_leeway() -> u64 {
    30
}

fn default_refresh() -> u64 {
    30
}

fn default_max_key_age() -> u64 {
    3600
}

/// Longest leeway accepted: past it, an expired token would live on.
const MAX_LEEWAY: u64 = 300;

impl AccessConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, AccessConfigError> {
        let bytes = std::fs::read(path).map_err(|source| AccessConfigError::Read { path: path.into(), source })?;
        Self::from_bytes(path, &bytes)
    }

    /// The config in `bytes`, read from `path` (which errors name).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, AccessConfigError> {
        let text = String::from_utf8_lossy(bytes);
        Self::parse(&text).map_err(|e| match e {
            ParseError::Syntax(source) => AccessConfigError::Parse { path: path.into(), source },
            ParseError::Rule(message) => AccessConfigError::Invalid { path: path.into(), message },
        })
    }

    fn parse(text: &str) -> Result<Self, ParseError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let config: Self = serde_path_to_error::deserialize(&mut de).map_err(ParseError::Syntax)?;
        config.check().map_err(ParseError::Rule)?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        for (i, issuer) in self.oidc_issuer.iter().enumerate() {
            let at = format!("oidc_issuer[{i}] ({})", issuer.issuer);
            if !(issuer.issuer.starts_with("https://") || issuer.issuer.starts_with("http://")) {
                return Err(format!("{at}: issuer must be an http(s) URL"));
            }
            if issuer.audience.is_empty() || issuer.audience.iter().any(String::is_empty) {
                return Err(format!("{at}: audience needs at least one non-empty value"));
            }
            if issuer.rules.is_empty() {
                return Err(format!("{at}: rules is empty, so no token of this issuer could be accepted"));
            }
            if issuer.leeway_seconds > MAX_LEEWAY {
                return Err(format!("{at}: leeway_seconds is at most {MAX_LEEWAY}"));
            }
            if issuer.max_key_age_seconds == 0 {
                return Err(format!("{at}: max_key_age_seconds is at least 1"));
            }
            for (j, rule) in issuer.rules.iter().enumerate() {
                rule.check().map_err(|e| format!("{at}: rules[{j}]: {e}"))?;
            }
        }
        for (i, rule) in self.mtls.iter().enumerate() {
            if rule.subject.trim().is_empty() {
                return Err(format!("mtls[{i}]: subject is empty"));
            }
            if rule.namespaces.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!("mtls[{i}]: namespaces is empty; name at least one namespace, or `*`"));
            }
        }
        Ok(())
    }

    /// The grants of a client certificate's subject, if one is listed.
    pub fn subject_grants(&self, subject: &str) -> Option<Grants> {
        self.mtls.iter().find(|r| r.subject == subject).map(SubjectRule::grants)
    }
}

enum ParseError {
    Syntax(serde_path_to_error::Error<serde_json::Error>),
    Rule(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "oidc_issuer": [{
        "issuer": "https://token.actions.githubusercontent.com",
        "audience": ["drover"],
        "rules": [
          {"claims": {"repository": "org/infra", "ref": "refs/heads/main"}, "role": "operator"},
          {"claims": {"repository": "org/infra"}, "role": "viewer"}
        ]
      }],
      "mtls": [{"subject": "CN=ci-runner,O=example", "role": "operator"}]
    }"#;

    #[test]
    fn the_documented_example_parses() {
        let c = AccessConfig::parse(EXAMPLE).unwrap_or_else(|_| panic!("parses"));
        assert_eq!(c.oidc_issuer.len(), 1);
        assert_eq!(c.oidc_issuer[0].leeway_seconds, 30);
        assert_eq!(c.oidc_issuer[0].max_key_age_seconds, 3600, "keys are fetched again every hour");
        assert_eq!(
            c.subject_grants("CN=ci-runner,O=example"),
            Some(Grants::everywhere(crate::domain::role::Role::Operator))
        );
        assert_eq!(c.subject_grants("CN=other"), None);
    }

    #[test]
    fn mistakes_are_named() {
        let err = |t: &str| match AccessConfig::parse(t) {
            Err(ParseError::Syntax(e)) => e.to_string(),
            Err(ParseError::Rule(e)) => e,
            Ok(_) => panic!("accepted {t}"),
        };
        assert!(err(r#"{"oidc_issuer": [{"issuer": "https://i", "audience": [], "rules": []}]}"#).contains("audience"));
        assert!(err(r#"{"oidc_issuer": [{"issuer": "https://i", "audience": ["a"], "rules": []}]}"#).contains("rules"));
        assert!(err(r#"{"oidc_issuers": []}"#).contains("unknown field"));
        let bad_role = r#"{"oidc_issuer": [{"issuer": "https://i", "audience": ["a"],
                           "rules": [{"claims": {"a": "b"}, "role": "root"}]}]}"#;
        assert!(err(bad_role).contains("oidc_issuer[0].rules[0].role"), "{}", err(bad_role));
        let no_claims = r#"{"oidc_issuer": [{"issuer": "https://i", "audience": ["a"],
                           "rules": [{"claims": {}, "role": "viewer"}]}]}"#;
        assert!(err(no_claims).contains("rules[0]"));
        let never_stale = r#"{"oidc_issuer": [{"issuer": "https://i", "audience": ["a"], "max_key_age_seconds": 0,
                           "rules": [{"claims": {"a": "b"}, "role": "viewer"}]}]}"#;
        assert!(err(never_stale).contains("max_key_age_seconds is at least 1"), "{}", err(never_stale));
    }
}
