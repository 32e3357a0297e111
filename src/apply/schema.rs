//! The JSON Schema of fleet files, made from the OpenAPI document's own
//! schemas rather than written by hand: a pool document's `spec` is the
//! API's `PoolSpecInput`, so a field added to pools appears here, in
//! editors and in `drover schema`, with nothing to change.
//!
//! A fleet file differs from the API in one way: secrets are references
//! (`{file: PATH}` or `{env: NAME}`), never inline. [`add_fleet_schemas`]
//! derives the file's document schemas from the API's, replacing each field
//! of [`SECRET_FIELDS`] with `SecretRef`; [`standalone`] lifts them out of
//! the OpenAPI document into a JSON Schema (draft-07, the newest that YAML
//! language servers read in full) for `drover schema` and
//! `# yaml-language-server: $schema=...`.

use serde_json::{Map, Value, json};

use super::document::{Kind, SECRET_FIELDS, SecretRef};

const REF_PREFIX: &str = "#/components/schemas/";

/// The name of the schema of one fleet document in the OpenAPI document.
pub const FLEET_DOCUMENT: &str = "FleetDocument";

/// The API's schema of a document of `kind`, and the fleet file's.
fn names(kind: Kind) -> (String, String) {
    let api = format!("{}Document", kind.as_str());
    let fleet = if secret_paths(kind).is_empty() { api.clone() } else { format!("Fleet{api}") };
    (api, fleet)
}

fn secret_paths(kind: Kind) -> Vec<&'static [&'static str]> {
    SECRET_FIELDS.iter().filter(|(k, _)| *k == kind).map(|(_, p)| *p).collect()
}

/// Adds `FleetDocument` (and what it needs) to the document's components.
pub fn add_fleet_schemas(doc: &mut Value) {
    let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    let secret = serde_json::to_value(<SecretRef as utoipa::PartialSchema>::schema()).unwrap_or(Value::Null);
    schemas.insert("SecretRef".into(), secret);
    let mut one_of = Vec::new();
    let mut mapping = Map::new();
    for kind in [Kind::Pool, Kind::Engine, Kind::Cluster] {
        let (api, fleet) = names(kind);
        if fleet != api {
            let Some(mut schema) = schemas.get(&api).cloned() else { continue };
            for path in secret_paths(kind) {
                by_reference(&mut schema, path, schemas);
            }
            let described = schema["description"].as_str().unwrap_or_default().to_owned();
            schema["description"] =
                json!(format!("{described} (As written in a fleet file: secrets by reference.)").trim().to_owned());
            schemas.insert(fleet.clone(), schema);
        }
        one_of.push(json!({"$ref": format!("{REF_PREFIX}{fleet}")}));
        mapping.insert(kind.as_str().into(), json!(format!("{REF_PREFIX}{fleet}")));
    }
    schemas.insert(
        FLEET_DOCUMENT.into(),
        json!({
            "description": "One document of a fleet file (`drover apply -f`): a `Pool`, an `Engine` or a `Cluster`, told apart by `kind`; secrets are given by reference",
            "oneOf": one_of,
            "discriminator": {"propertyName": "kind", "mapping": mapping},
        }),
    );
}

/// Replaces the field at `path` of `schema` with a `SecretRef`, copying
/// every schema on the way down so that the API's own stay as they are.
fn by_reference(schema: &mut Value, path: &[&str], schemas: &Map<String, Value>) {
    let Some((field, rest)) = path.split_first() else { return };
    let Some(prop) = schema.get_mut("properties").and_then(|p| p.get_mut(*field)) else { return };
    if rest.is_empty() {
        let nullable = is_nullable(prop);
        let description = prop.get("description").cloned();
        let secret = json!({"$ref": format!("{REF_PREFIX}SecretRef")});
        *prop = if nullable { json!({"oneOf": [secret, {"type": "null"}]}) } else { json!({"allOf": [secret]}) };
        if let Some(d) = description {
            prop["description"] = d;
        }
        return;
    }
    inline(prop, schemas);
    let target = match prop.get_mut("oneOf").and_then(Value::as_array_mut) {
        Some(branches) => branches.iter_mut().find(|b| b.get("properties").is_some()),
        None => Some(prop),
    };
    if let Some(target) = target {
        by_reference(target, rest, schemas);
    }
}

fn is_nullable(schema: &Value) -> bool {
    let null_type = |s: &Value| s["type"] == "null" || s["type"].as_array().is_some_and(|t| t.contains(&json!("null")));
    null_type(schema) || schema["oneOf"].as_array().is_some_and(|b| b.iter().any(null_type))
}

/// Replaces a `$ref` (alone or as a branch of a `oneOf`) by a copy of
/// what it names.
fn inline(schema: &mut Value, schemas: &Map<String, Value>) {
    let resolve = |v: &mut Value| {
        if let Some(name) = v.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(REF_PREFIX))
            && let Some(target) = schemas.get(name)
        {
            *v = target.clone();
        }
    };
    match schema.get_mut("oneOf").and_then(Value::as_array_mut) {
        Some(branches) => branches.iter_mut().for_each(resolve),
        None => resolve(schema),
    }
}

/// The JSON Schema of a fleet document (or a list of them), standing alone.
pub fn standalone(openapi: &Value) -> Value {
    let schemas = openapi.pointer("/components/schemas").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut definitions = Map::new();
    let mut todo = vec![FLEET_DOCUMENT.to_owned()];
    while let Some(name) = todo.pop() {
        if definitions.contains_key(&name) {
            continue;
        }
        let Some(schema) = schemas.get(&name) else { continue };
        let mut schema = schema.clone();
        draft7(&mut schema, &mut todo);
        definitions.insert(name, schema);
    }
    let document = json!({"$ref": format!("#/definitions/{FLEET_DOCUMENT}")});
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://drover.dev/schemas/fleet.json",
        "title": "drover fleet file",
        "description": "A document of a fleet file for `drover apply` (YAML or JSON; several per file, or a list). Generated from drover's OpenAPI document by `drover schema`.",
        "anyOf": [document.clone(), {"type": "array", "items": document}],
        "definitions": definitions,
    })
}

/// Rewrites OpenAPI references into the standalone document's and makes
/// what draft-07 reads differently say the same: a `$ref` with siblings
/// (ignored there) goes into an `allOf`; OpenAPI's own keywords go.
fn draft7(value: &mut Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            map.remove("discriminator");
            if let Some(example) = map.remove("example") {
                map.entry("examples").or_insert_with(|| json!([example]));
            }
            if let Some(Value::String(r)) = map.get("$ref").cloned()
                && let Some(name) = r.strip_prefix(REF_PREFIX)
            {
                refs.push(name.to_owned());
                let target = json!({"$ref": format!("#/definitions/{name}")});
                if map.len() == 1 {
                    map.insert("$ref".into(), target["$ref"].clone());
                } else {
                    map.remove("$ref");
                    map.insert("allOf".into(), json!([target]));
                }
            }
            for (key, v) in map.iter_mut() {
                // Property names are data, not keywords: walk their schemas only.
                if key == "properties" {
                    if let Value::Object(props) = v {
                        props.values_mut().for_each(|p| draft7(p, refs));
                    }
                } else {
                    draft7(v, refs);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| draft7(v, refs)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn components() -> Value {
        json!({"components": {"schemas": {
            "EngineDocument": {"type": "object", "description": "An engine.", "properties": {
                "kind": {"type": "string", "enum": ["Engine"]},
                "spec": {"$ref": "#/components/schemas/EngineSpecInput"}}},
            "EngineSpecInput": {"type": "object", "properties": {
                "endpoint": {"type": "string", "example": "tcp://x:1"},
                "tls": {"oneOf": [{"$ref": "#/components/schemas/TlsInput"}, {"type": "null"}]}}},
            "TlsInput": {"type": "object", "properties": {
                "cert": {"type": "string", "description": "PEM"}, "key": {"type": "string"}, "ca": {"type": "string"}}},
            "ClusterDocument": {"type": "object", "properties": {
                "spec": {"$ref": "#/components/schemas/ClusterSpecInput"}}},
            "ClusterSpecInput": {"type": "object", "properties": {
                "server": {"type": ["string", "null"]}, "token": {"type": ["string", "null"]},
                "kubeconfig": {"type": ["string", "null"]}, "ca_certificate": {"type": ["string", "null"]}}},
            "PoolDocument": {"type": "object", "properties": {"spec": {"$ref": "#/components/schemas/PoolSpecInput"}}},
            "PoolSpecInput": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
        }}})
    }

    #[test]
    fn secret_fields_become_references_in_copies_and_the_api_schemas_stay() {
        let mut doc = components();
        add_fleet_schemas(&mut doc);
        let s = &doc["components"]["schemas"];
        let tls = &s["FleetEngineDocument"]["properties"]["spec"]["properties"]["tls"]["oneOf"][0];
        assert_eq!(tls["properties"]["cert"]["allOf"][0]["$ref"], "#/components/schemas/SecretRef");
        assert_eq!(tls["properties"]["cert"]["description"], "PEM");
        let token = &s["FleetClusterDocument"]["properties"]["spec"]["properties"]["token"];
        assert_eq!(token["oneOf"][0]["$ref"], "#/components/schemas/SecretRef");
        assert_eq!(
            s["ClusterSpecInput"]["properties"]["server"]["type"],
            json!(["string", "null"]),
            "server is no secret"
        );
        assert_eq!(s["TlsInput"]["properties"]["cert"]["type"], "string", "the API's schema is untouched");
        assert_eq!(s["FleetDocument"]["oneOf"][0]["$ref"], "#/components/schemas/PoolDocument");
        assert!(s["SecretRef"].is_object());
    }

    #[test]
    fn the_standalone_schema_is_draft7_with_every_definition_it_names() {
        let mut doc = components();
        add_fleet_schemas(&mut doc);
        let schema = standalone(&doc);
        let text = schema.to_string();
        assert!(!text.contains("#/components/"), "{text}");
        for name in ["FleetDocument", "PoolDocument", "PoolSpecInput", "FleetEngineDocument", "SecretRef"] {
            assert!(schema["definitions"][name].is_object(), "{name} missing: {text}");
        }
        assert!(schema["definitions"].get("TlsInput").is_none(), "only what the fleet schema names");
        let endpoint = &schema["definitions"]["FleetEngineDocument"]["properties"]["spec"]["properties"]["endpoint"];
        assert_eq!(endpoint["examples"], json!(["tcp://x:1"]));
    }
}
