//! Kubernetes versions (`v1.29.2`) and the node image a version maps to.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A Kubernetes release version, `vMAJOR.MINOR.PATCH`.
///
/// Pre-release and build suffixes are refused: node images are published for
/// releases only, and a suffix would make "up to date" ambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must look like vMAJOR.MINOR.PATCH, e.g. v1.29.2 (got {0:?})")]
pub struct VersionError(pub String);

impl FromStr for KubeVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VersionError(s.to_owned());
        let rest = s.strip_prefix('v').ok_or_else(bad)?;
        let mut parts = rest.split('.');
        let mut next = || -> Result<u32, VersionError> {
            let p = parts.next().ok_or_else(bad)?;
            // Digits only, no sign, no leading zero (semver's rule).
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || (p.len() > 1 && p.starts_with('0')) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let v = KubeVersion { major: next()?, minor: next()?, patch: next()? };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Serialize for KubeVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KubeVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Repository of kind's node images; a version's image is `<repo>:<version>`.
pub const NODE_IMAGE_REPOSITORY: &str = "kindest/node";

/// The node image kind publishes for `version`.
pub fn node_image(version: KubeVersion) -> String {
    format!("{NODE_IMAGE_REPOSITORY}:{version}")
}

impl utoipa::PartialSchema for KubeVersion {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$"))
            .description(Some("Kubernetes release version, vMAJOR.MINOR.PATCH"))
            .examples(["v1.29.2"])
            .into()
    }
}

impl utoipa::ToSchema for KubeVersion {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_versions() {
        let v: KubeVersion = "v1.29.2".parse().unwrap();
        assert_eq!(v, KubeVersion { major: 1, minor: 29, patch: 2 });
        assert_eq!(v.to_string(), "v1.29.2");
        assert_eq!("v0.0.0".parse::<KubeVersion>().unwrap().to_string(), "v0.0.0");
        assert_eq!("v4294967295.0.0".parse::<KubeVersion>().unwrap().major, u32::MAX);
    }

    #[test]
    fn refuses_anything_else() {
        for bad in [
            "",
            "v",
            "1.29.2",
            "v1.29",
            "v1.29.2.1",
            "v1.29.x",
            "v01.29.2",
            "v1.029.2",
            "v1.29.2-rc.1",
            "v1.29.2+build",
            "V1.29.2",
            "v 1.29.2",
            "v1..2",
            "v-1.2.3",
            "v4294967296.0.0",
        ] {
            assert!(bad.parse::<KubeVersion>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn versions_order_numerically() {
        let a: KubeVersion = "v1.9.0".parse().unwrap();
        let b: KubeVersion = "v1.10.0".parse().unwrap();
        assert!(a < b);
    }

    #[test]
    fn node_image_follows_kind() {
        assert_eq!(node_image("v1.29.2".parse().unwrap()), "kindest/node:v1.29.2");
    }
}
