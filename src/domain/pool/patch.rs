//! The shape of a merge patch of a pool's spec. A patch is applied by
//! merging it into the spec's document (`PoolSpec::patched`); this type
//! only declares the shape to clients (the OpenAPI document) and checks a
//! patch's types before the merge, so that `{"replicas": null}` is a type
//! error at `replicas` rather than a missing field after it.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;
use utoipa::ToSchema;

use crate::domain::ValidationErrors;
use crate::domain::pool::Mount;
use crate::domain::strategy::{IntOrPercent, ReplacementPolicy};

/// A JSON merge patch (RFC 7396) of a pool's spec: every field optional;
/// a field left out keeps its value, `null` resets it to its default
/// (`replicas` and `version` have none and may not be `null`). Maps
/// (`labels`, `engine_selector`) merge key by key, a `null` value removing
/// the key; lists are replaced whole. `strategy` merges field by field.
///
/// Field for field the spec of `PoolSpecView`: a test fails when the two
/// part ways.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
// Read only by serde: a patch is checked against this shape (types, nulls,
// unknown fields), then merged into the spec's document as JSON.
#[allow(dead_code)]
pub struct PoolPatch {
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = i64, minimum = 0, maximum = 1000)]
    pub replicas: Option<i64>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = String, pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$", example = "v1.29.2")]
    pub version: Option<String>,
    /// `null`: the version's node image.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, min_length = 1, max_length = 255)]
    pub image: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<String>>, max_items = 64)]
    pub failure_domains: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<Mount>>, max_items = 64)]
    pub extra_mounts: Option<Option<Vec<Mount>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pub labels: Option<Option<BTreeMap<String, Option<String>>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<StrategyPatch>)]
    pub strategy: Option<Option<StrategyPatch>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub paused: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length = 63)]
    pub cluster: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Vec<String>>, max_items = 64)]
    pub engines: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pub engine_selector: Option<Option<BTreeMap<String, Option<String>>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 86400)]
    pub min_ready_seconds: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 86400)]
    pub progress_deadline_seconds: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 86400)]
    pub machine_ready_timeout_seconds: Option<Option<i64>>,
}

/// A merge patch of `strategy`; `null` resets a field to its default.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct StrategyPatch {
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<IntOrPercent>)]
    pub max_surge: Option<Option<IntOrPercent>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<IntOrPercent>)]
    pub max_unavailable: Option<Option<IntOrPercent>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub batch_approval: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<bool>)]
    pub auto_rollback: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<ReplacementPolicy>)]
    pub replacement: Option<Option<ReplacementPolicy>>,
}

/// A field that may be left out but, when present, may not be `null`.
fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A field that may be left out (`None`) or sent as `null` (`Some(None)`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Checks a patch's shape; answers the patch's top-level field names.
pub fn check(patch: &Value) -> Result<Vec<String>, ValidationErrors> {
    crate::domain::json::document::<PoolPatch>(patch.clone())?;
    Ok(patch.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::pool::{PoolSpecInput, PoolSpecView, StrategyInput, StrategyView};
    use serde_json::json;

    fn properties<T: utoipa::PartialSchema>() -> Vec<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        let mut names: Vec<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
        names.sort();
        names
    }

    /// The field-mirror test: fails when a field is added to the spec's
    /// view, its input or the patch's schema but not to all three.
    #[test]
    fn the_patch_the_view_and_the_input_name_the_same_fields() {
        assert_eq!(properties::<PoolPatch>(), properties::<PoolSpecView>());
        assert_eq!(properties::<PoolPatch>(), properties::<PoolSpecInput>());
        assert_eq!(properties::<StrategyPatch>(), properties::<StrategyView>());
        assert_eq!(properties::<StrategyPatch>(), properties::<StrategyInput>());
        let schema = serde_json::to_value(<PoolPatch as utoipa::PartialSchema>::schema()).unwrap();
        assert_eq!(schema["additionalProperties"], json!(false), "unknown fields are refused: {schema}");
        assert!(schema.get("required").is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)), "{schema}");
    }

    #[test]
    fn required_fields_refuse_null_and_unknown_fields_are_refused() {
        let rule = |patch: serde_json::Value| {
            let e = check(&patch).expect_err("accepted");
            (e.0[0].field.clone(), e.0[0].rule)
        };
        assert_eq!(rule(json!({"replicas": null})), ("replicas".into(), "type"));
        assert_eq!(rule(json!({"version": null})), ("version".into(), "type"));
        assert_eq!(rule(json!({"name": "x"})), ("name".into(), "unknown_field"));
        assert_eq!(rule(json!({"strategy": {"surge": 1}})), ("strategy.surge".into(), "unknown_field"));
        assert_eq!(rule(json!([])), ("body".into(), "type"));
    }

    #[test]
    fn check_names_what_the_patch_sends() {
        assert_eq!(check(&json!({"replicas": 2, "labels": null})).unwrap(), ["labels", "replicas"]);
    }
}
