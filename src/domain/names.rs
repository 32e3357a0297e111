//! Names of pools and machines.
//!
//! A pool name ends up in container labels, URLs and log lines, so it is held
//! to the strictest common rule: an RFC 1123 DNS label, as Kubernetes uses for
//! most object names.

use std::fmt;

use rand::RngExt;
use serde::{Deserialize, Serialize};

/// Longest DNS-1123 label.
pub const MAX_NAME_LEN: usize = 63;

/// Why a name was refused, phrased for the `detail` of a problem response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {MAX_NAME_LEN} characters (got {0})")]
    TooLong(usize),
    #[error("must consist of lowercase letters, digits and '-' (found {0:?})")]
    BadChar(char),
    #[error("must start and end with a lowercase letter or digit")]
    BadEdge,
}

/// Checks `s` against the DNS-1123 label rule:
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn check_dns_label(s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if s.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(s.chars().count()));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        return Err(NameError::BadChar(c));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(NameError::BadEdge);
    }
    Ok(())
}

/// The DNS-1123 label rule as a JSON Schema pattern.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A name that is a DNS-1123 label: of a pool, an engine, a cluster, a
/// token, an apply set. Checked once, where it enters: reading one from
/// JSON checks it (through [`crate::domain::json`], a bad one is the field's
/// `dns_label` error), and its OpenAPI schema states the rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct DnsLabel(String);

impl DnsLabel {
    /// The name the type gives serde, by which drover's JSON reader knows
    /// to check it as a rule of its own (`dns_label`) rather than as a type.
    pub const SERDE_NAME: &'static str = "DnsLabel";

    pub fn parse(s: &str) -> Result<Self, NameError> {
        check_dns_label(s)?;
        Ok(Self(s.to_owned()))
    }

    /// A name as the store keeps it: checked when it was written.
    pub fn from_store(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl<'de> Deserialize<'de> for DnsLabel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Label;
        impl<'de> serde::de::Visitor<'de> for Label {
            type Value = DnsLabel;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a DNS-1123 label")
            }

            fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<DnsLabel, D::Error> {
                let s = String::deserialize(d)?;
                DnsLabel::parse(&s).map_err(serde::de::Error::custom)
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<DnsLabel, E> {
                DnsLabel::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_newtype_struct(Self::SERDE_NAME, Label)
    }
}

impl utoipa::PartialSchema for DnsLabel {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A DNS-1123 label: lowercase letters, digits and '-', at most 63 characters, starting and ending with a letter or digit"))
            .min_length(Some(1))
            .max_length(Some(MAX_NAME_LEN))
            .pattern(Some(DNS_LABEL_PATTERN))
            .into()
    }
}

impl utoipa::ToSchema for DnsLabel {}

impl fmt::Display for DnsLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DnsLabel {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for DnsLabel {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<DnsLabel> for String {
    fn from(label: DnsLabel) -> String {
        label.0
    }
}

/// Prefix of every machine (and container) name, as Cluster API's Docker
/// provider names them.
pub const MACHINE_PREFIX: &str = "worker-";
const MACHINE_SUFFIX_LEN: usize = 6;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A fresh machine name: `worker-` and six random lowercase alphanumerics.
///
/// 36^6 (about 2.2e9) names make a collision within one engine unlikely; the
/// executor still treats "name already in use" as a retryable conflict.
pub fn new_machine_name() -> String {
    let mut rng = rand::rng();
    let suffix: String =
        (0..MACHINE_SUFFIX_LEN).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("{MACHINE_PREFIX}{suffix}")
}

/// True for names that `new_machine_name` could have produced.
pub fn is_machine_name(s: &str) -> bool {
    s.strip_prefix(MACHINE_PREFIX)
        .is_some_and(|rest| rest.len() == MACHINE_SUFFIX_LEN && rest.bytes().all(|b| ALPHABET.contains(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dns_label_is_checked_wherever_json_is_read() {
        let read =
            |v: serde_json::Value| crate::domain::json::document::<DnsLabel>(v).map_err(|e| e.0[0].static_rule());
        assert_eq!(read(serde_json::json!("web-1")).map(DnsLabel::into_string), Ok("web-1".into()));
        assert_eq!(read(serde_json::json!("Web")), Err("dns_label"));
        assert_eq!(read(serde_json::json!(7)), Err("type"));
        assert!(serde_json::from_value::<DnsLabel>(serde_json::json!("a_b")).is_err(), "any reader checks it");
        let schema = serde_json::to_value(<DnsLabel as utoipa::PartialSchema>::schema()).expect("schema");
        assert_eq!((schema["pattern"].as_str(), schema["maxLength"].as_u64()), (Some(DNS_LABEL_PATTERN), Some(63)));
    }

    #[test]
    fn dns_label_accepts_the_edges_of_the_rule() {
        for ok in ["a", "0", "a-b", "a--b", "web1", &"a".repeat(63)] {
            assert_eq!(check_dns_label(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn dns_label_rejects_each_broken_rule() {
        assert_eq!(check_dns_label(""), Err(NameError::Empty));
        assert_eq!(check_dns_label(&"a".repeat(64)), Err(NameError::TooLong(64)));
        assert_eq!(check_dns_label("Web"), Err(NameError::BadChar('W')));
        assert_eq!(check_dns_label("a_b"), Err(NameError::BadChar('_')));
        assert_eq!(check_dns_label("a.b"), Err(NameError::BadChar('.')));
        assert_eq!(check_dns_label("é"), Err(NameError::BadChar('é')));
        assert_eq!(check_dns_label("-a"), Err(NameError::BadEdge));
        assert_eq!(check_dns_label("a-"), Err(NameError::BadEdge));
    }

    #[test]
    fn machine_names_are_worker_and_six_lowercase_alphanumerics() {
        for _ in 0..200 {
            let name = new_machine_name();
            assert!(is_machine_name(&name), "{name}");
            assert_eq!(check_dns_label(&name), Ok(()));
        }
        assert!(!is_machine_name("worker-ABCDEF"));
        assert!(!is_machine_name("worker-abc"));
        assert!(!is_machine_name("node-abcdef"));
    }
}
