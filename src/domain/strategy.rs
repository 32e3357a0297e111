//! Rolling-update bounds: counts or percentages of the desired replicas.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A count (`2`) or a percentage of the desired replicas (`"25%"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Count(u32),
    Percent(u32),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntOrPercentError {
    #[error("must be a non-negative integer or a percentage string such as \"25%\"")]
    Shape,
    #[error("percentage must be between 0% and 100%")]
    PercentRange,
}

impl IntOrPercent {
    pub fn parse_str(s: &str) -> Result<Self, IntOrPercentError> {
        let digits = s.strip_suffix('%').ok_or(IntOrPercentError::Shape)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IntOrPercentError::Shape);
        }
        let p: u32 = digits.parse().map_err(|_| IntOrPercentError::PercentRange)?;
        if p > 100 {
            return Err(IntOrPercentError::PercentRange);
        }
        Ok(Self::Percent(p))
    }

    /// Resolves against `replicas`: percentages round up for surge and down
    /// for unavailability, as Kubernetes Deployments do.
    pub fn resolve(self, replicas: u32, round_up: bool) -> u32 {
        match self {
            Self::Count(n) => n,
            Self::Percent(p) => {
                let scaled = u64::from(replicas) * u64::from(p);
                let v = if round_up { scaled.div_ceil(100) } else { scaled / 100 };
                u32::try_from(v).unwrap_or(u32::MAX)
            }
        }
    }

    pub fn is_zero(self) -> bool {
        matches!(self, Self::Count(0) | Self::Percent(0))
    }
}

impl fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for IntOrPercent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Count(n) => s.serialize_u32(*n),
            Self::Percent(_) => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrPercent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(IntOrPercentError::Shape))? {
            Raw::Int(n) => {
                u32::try_from(n).map(Self::Count).map_err(|_| serde::de::Error::custom(IntOrPercentError::Shape))
            }
            Raw::Str(s) => Self::parse_str(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// How a pool replaces outdated machines: also the `strategy` of a pool's
/// spec as the API shows it, every default filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StrategyView)]
pub struct RolloutStrategy {
    /// Machines allowed above `replicas` while a rollout runs.
    pub max_surge: IntOrPercent,
    /// Machines allowed below `replicas` available while a rollout runs.
    pub max_unavailable: IntOrPercent,
    /// Pause the rollout after each batch until it is continued.
    pub batch_approval: bool,
    /// Return to the previous revision when the progress deadline passes.
    pub auto_rollback: bool,
    /// Whether a machine being deleted still counts toward
    /// `replicas + max_surge`.
    pub replacement: ReplacementPolicy,
}

/// When a replacement may be created for a machine being deleted, as the
/// pod replacement policy of Kubernetes Deployments (KEP-3973).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplacementPolicy {
    /// As soon as its deletion starts: a machine shutting down (grace
    /// period, drain) does not count toward `replicas + max_surge`, so a
    /// slow stop never holds up the rollout. Swarm and Deployments do this.
    #[default]
    TerminationStarted,
    /// Only once its container is gone: the number of containers never
    /// exceeds `replicas + max_surge`, at the price of waiting out every
    /// grace period.
    TerminationComplete,
}

impl Default for RolloutStrategy {
    fn default() -> Self {
        Self {
            max_surge: IntOrPercent::Count(1),
            max_unavailable: IntOrPercent::Count(0),
            batch_approval: false,
            auto_rollback: false,
            replacement: ReplacementPolicy::TerminationStarted,
        }
    }
}

/// Surge and unavailability resolved against a replica count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedBounds {
    pub max_surge: u32,
    pub max_unavailable: u32,
    /// True when both bounds rounded to zero and unavailability was raised to
    /// one so that the rollout can move (Cluster API's rule).
    pub unavailable_raised: bool,
}

impl ResolvedBounds {
    /// Machines one approved batch may convert to the new image.
    pub fn batch_size(&self) -> u32 {
        self.max_surge.max(self.max_unavailable).max(1)
    }
}

impl RolloutStrategy {
    pub fn resolve(&self, replicas: u32) -> ResolvedBounds {
        let max_surge = self.max_surge.resolve(replicas, true);
        let max_unavailable = self.max_unavailable.resolve(replicas, false);
        if max_surge == 0 && max_unavailable == 0 {
            ResolvedBounds { max_surge, max_unavailable: 1, unavailable_raised: true }
        } else {
            ResolvedBounds { max_surge, max_unavailable, unavailable_raised: false }
        }
    }
}

impl utoipa::PartialSchema for IntOrPercent {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)).maximum(Some(u32::MAX)))
            .item(ObjectBuilder::new().schema_type(Type::String).pattern(Some(r"^(100|[1-9]?[0-9])%$")))
            .description(Some("A count, or a percentage of replicas such as \"25%\""))
            .into()
    }
}

impl utoipa::ToSchema for IntOrPercent {}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<IntOrPercent, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn parses_counts_and_percentages() {
        assert_eq!(parse("3").unwrap(), IntOrPercent::Count(3));
        assert_eq!(parse("\"0%\"").unwrap(), IntOrPercent::Percent(0));
        assert_eq!(parse("\"100%\"").unwrap(), IntOrPercent::Percent(100));
        for bad in ["-1", "\"101%\"", "\"25\"", "\"%\"", "\"2.5%\"", "1.5", "null", "\"-5%\""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips_through_json() {
        for v in [IntOrPercent::Count(2), IntOrPercent::Percent(25)] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(parse(&json).unwrap(), v);
        }
    }

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down() {
        assert_eq!(IntOrPercent::Percent(25).resolve(10, true), 3);
        assert_eq!(IntOrPercent::Percent(25).resolve(10, false), 2);
        assert_eq!(IntOrPercent::Percent(100).resolve(7, true), 7);
        assert_eq!(IntOrPercent::Count(4).resolve(1, false), 4);
    }

    #[test]
    fn both_bounds_rounding_to_zero_raise_unavailable_to_one() {
        let s = RolloutStrategy {
            max_surge: IntOrPercent::Percent(0),
            max_unavailable: IntOrPercent::Percent(10),
            ..RolloutStrategy::default()
        };
        let b = s.resolve(5);
        assert_eq!((b.max_surge, b.max_unavailable, b.unavailable_raised), (0, 1, true));
        let b = RolloutStrategy::default().resolve(5);
        assert_eq!((b.max_surge, b.max_unavailable, b.unavailable_raised), (1, 0, false));
    }
}
