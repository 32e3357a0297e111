//! A merge patch of a pool's spec. A patch is applied by merging it into
//! the spec's document (`PoolSpec::patched`); its shape is the input's
//! (`PoolSpecInput`) with every field optional, so nothing here lists the
//! spec's fields: the patch's schema is made from the input's
//! ([`patch_schema`], run on the OpenAPI document), and a patch's types are
//! checked by merging it into a minimal document and reading that as
//! input ([`check`]) before the pool is even read.

use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::document::PoolSpecInput;
use crate::domain::ValidationErrors;

/// A JSON merge patch (RFC 7396) of a pool's spec: every field optional;
/// a field left out keeps its value, `null` resets it to its default
/// (`replicas` and `version` have none and may not be `null`). Maps
/// (`labels`, `engine_selector`) merge key by key, a `null` value removing
/// the key; lists are replaced whole, and `[]` resets a list too (an empty
/// list is every list's default). `strategy` merges field by field.
/// The fields are `PoolSpecInput`'s.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PoolPatch {}

/// The fields of the input that have no default: a patch may leave them
/// out, never send them as `null`.
fn required() -> Vec<String> {
    let schema = serde_json::to_value(<PoolSpecInput as utoipa::PartialSchema>::schema()).unwrap_or(Value::Null);
    schema["required"].as_array().into_iter().flatten().filter_map(|f| f.as_str().map(str::to_owned)).collect()
}

/// Checks a patch's shape (its types, its nulls, its unknown fields);
/// answers the patch's top-level field names.
pub fn check(patch: &Value) -> Result<Vec<String>, ValidationErrors> {
    let Value::Object(fields) = patch else {
        return crate::domain::json::document::<PoolSpecInput>(patch.clone()).map(|_| Vec::new());
    };
    for field in required() {
        if fields.get(&field).is_some_and(Value::is_null) {
            let message = format!("invalid type: null, expected a value (`{field}` has no default)");
            return Err(ValidationErrors::single(field, "type", message));
        }
    }
    // The patch merged into the smallest document there is, read as input:
    // each field the patch sends is read by the input's own type.
    let mut document = json!({"replicas": 0, "version": "v0.0.0"});
    json_patch::merge(&mut document, patch);
    crate::domain::json::document::<PoolSpecInput>(document)?;
    Ok(fields.keys().cloned().collect())
}

/// The OpenAPI schemas of `PoolPatch` and `StrategyPatch`, made from
/// `PoolSpecInput`'s and `StrategyInput`'s in the finished document
/// (`schemas` is its `components.schemas`): the same properties and rules,
/// none required, each nullable (`null` resets it) but for the fields
/// without a default; map values nullable too (a `null` value removes the
/// key); `strategy` as a patch of its own.
pub fn patch_schemas(schemas: &mut Map<String, Value>) {
    let required = required();
    let mut patch = patch_of(schemas.get("PoolSpecInput"), &required);
    if let Some(strategy) = patch.pointer_mut("/properties/strategy") {
        *strategy = json!({"oneOf": [{"$ref": "#/components/schemas/StrategyPatch"}, {"type": "null"}]});
    }
    let description = schemas.get("PoolPatch").and_then(|p| p.get("description")).cloned();
    if let Some(description) = description {
        patch["description"] = description;
    }
    schemas.insert("PoolPatch".into(), patch);
    let mut strategy = patch_of(schemas.get("StrategyInput"), &[]);
    strategy["description"] = json!("A merge patch of `strategy`; `null` resets a field to its default.");
    schemas.insert("StrategyPatch".into(), strategy);
}

/// `input` with nothing required and its properties nullable (but `keep`,
/// and lists of objects).
///
/// A list of objects (`extra_mounts`) is reset with `[]`, and its schema
/// says no `null`: openapi-generator's typescript-fetch (7.x) drops a
/// `null` list of objects from the request whatever the schema says, so a
/// frontend's reset would silently do nothing; without the `null` its
/// compiler refuses the reset instead, and `[]` does the same. The server
/// still reads `null` as a reset, as RFC 7396 has it.
fn patch_of(input: Option<&Value>, keep: &[String]) -> Value {
    let mut schema = input.cloned().unwrap_or_else(|| json!({"type": "object"}));
    if let Some(map) = schema.as_object_mut() {
        map.remove("required");
        map.insert("additionalProperties".into(), json!(false));
    }
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, prop) in props.iter_mut() {
            if let Some(values) = prop.get_mut("additionalProperties").filter(|v| v.is_object()) {
                nullable(values);
            }
            if is_list_of_objects(prop) {
                let described = prop["description"].as_str().unwrap_or_default().to_owned();
                prop["description"] = json!(format!("{described} `[]` resets it.").trim().to_owned());
            } else if !keep.contains(name) {
                nullable(prop);
            }
        }
    }
    schema
}

/// A list whose items are a named schema (an object).
fn is_list_of_objects(schema: &Value) -> bool {
    schema["type"] == "array" && schema["items"].get("$ref").is_some()
}

/// Lets `schema` be `null` too.
fn nullable(schema: &mut Value) {
    match schema.get("type").cloned() {
        Some(Value::String(t)) => schema["type"] = json!([t, "null"]),
        Some(Value::Array(mut types)) => {
            if !types.contains(&json!("null")) {
                types.push(json!("null"));
            }
            schema["type"] = Value::Array(types);
        }
        _ => {
            let Some(map) = schema.as_object_mut() else { return };
            let alternatives = match map.remove("oneOf") {
                Some(Value::Array(mut alternatives)) => {
                    if !alternatives.iter().any(|a| a["type"] == "null") {
                        alternatives.push(json!({"type": "null"}));
                    }
                    alternatives
                }
                _ => {
                    let inner = std::mem::take(map);
                    vec![Value::Object(inner), json!({"type": "null"})]
                }
            };
            map.insert("oneOf".into(), Value::Array(alternatives));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_fields_refuse_null_and_unknown_fields_are_refused() {
        let rule = |patch: serde_json::Value| {
            let e = check(&patch).expect_err("accepted");
            (e.0[0].field.clone(), e.0[0].static_rule())
        };
        assert_eq!(rule(json!({"replicas": null})), ("replicas".into(), "type"));
        assert_eq!(rule(json!({"version": null})), ("version".into(), "type"));
        assert_eq!(rule(json!({"name": "x"})), ("name".into(), "unknown_field"));
        assert_eq!(rule(json!({"strategy": {"surge": 1}})), ("strategy.surge".into(), "unknown_field"));
        assert_eq!(rule(json!([])), ("body".into(), "type"));
        assert_eq!(rule(json!({"replicas": "two"})), ("replicas".into(), "type"));
        assert_eq!(rule(json!({"labels": {"a": 5}})), ("labels.a".into(), "type"));
    }

    #[test]
    fn check_names_what_the_patch_sends_and_nulls_reset_optional_fields() {
        assert_eq!(check(&json!({"replicas": 2, "labels": null})).unwrap(), ["labels", "replicas"]);
        let resets = json!({"image": null, "strategy": {"max_surge": null}, "labels": {"a": null}, "paused": null});
        assert!(check(&resets).is_ok());
    }

    /// The patch is the input field for field: a field added to the input
    /// is in the patch's schema without being written again.
    #[test]
    fn the_patch_schema_is_the_input_schema_with_every_field_optional() {
        let schemas = |name: &str| {
            serde_json::to_value(match name {
                "input" => <PoolSpecInput as utoipa::PartialSchema>::schema(),
                _ => <super::super::StrategyInput as utoipa::PartialSchema>::schema(),
            })
        };
        let mut all = Map::new();
        all.insert("PoolSpecInput".into(), schemas("input").unwrap());
        all.insert("StrategyInput".into(), schemas("strategy").unwrap());
        patch_schemas(&mut all);
        let (input, patch) = (&all["PoolSpecInput"], &all["PoolPatch"]);
        let names = |s: &Value| s["properties"].as_object().map(|p| p.keys().cloned().collect::<Vec<_>>());
        assert_eq!(names(patch), names(input));
        assert!(patch.get("required").is_none() && patch["additionalProperties"] == json!(false), "{patch}");
        assert_eq!(patch["properties"]["paused"]["type"], json!(["boolean", "null"]));
        assert_eq!(patch["properties"]["replicas"]["type"], input["properties"]["replicas"]["type"], "no default");
        assert_eq!(names(&all["StrategyPatch"]), names(&all["StrategyInput"]));
        // Lists of names reset with `null`; lists of objects with `[]` only.
        assert_eq!(patch["properties"]["engines"]["type"], json!(["array", "null"]));
        assert_eq!(patch["properties"]["extra_mounts"]["type"], json!("array"), "{patch}");
    }
}
