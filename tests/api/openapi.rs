//! The committed OpenAPI document is what the code generates.

const COMMITTED: &str = include_str!("../../openapi/openapi.json");
const REFRESH: &str = "cargo run -q -- openapi > openapi/openapi.json";

#[test]
fn committed_openapi_document_is_current() {
    let generated =
        drover::http::openapi().expect("the OpenAPI document").to_pretty_json().expect("serializing the document");
    if generated.trim() != COMMITTED.trim() {
        panic!("openapi/openapi.json is stale; refresh it with:\n\n    {REFRESH}\n");
    }
}

#[test]
fn every_operation_documents_its_responses() {
    let doc: serde_json::Value = serde_json::from_str(COMMITTED).expect("openapi.json is JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "an OpenAPI 3.x document");
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{method} {path} has no responses"));
            assert!(!responses.is_empty(), "{method} {path} has no responses");
            assert!(op["summary"].is_string() || op["description"].is_string(), "{method} {path} is undocumented");
        }
    }
}

/// Every schema of the document, with a name for messages: the components
/// and every schema nested in them (properties, items, alternatives).
fn schemas(doc: &serde_json::Value) -> Vec<(String, &serde_json::Value)> {
    fn walk<'a>(at: String, schema: &'a serde_json::Value, out: &mut Vec<(String, &'a serde_json::Value)>) {
        out.push((at.clone(), schema));
        for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
            walk(format!("{at}.{name}"), prop, out);
        }
        for key in ["items", "additionalProperties"] {
            if schema[key].is_object() {
                walk(format!("{at}.{key}"), &schema[key], out);
            }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for (i, alternative) in schema[key].as_array().into_iter().flatten().enumerate() {
                walk(format!("{at}.{key}[{i}]"), alternative, out);
            }
        }
    }
    let mut out = Vec::new();
    for (name, schema) in doc["components"]["schemas"].as_object().expect("components.schemas") {
        walk(name.clone(), schema, &mut out);
    }
    out
}

fn committed() -> serde_json::Value {
    serde_json::from_str(COMMITTED).expect("openapi.json is JSON")
}

/// A generated client types an operation's answer once: an operation whose
/// successes had two shapes (the upgrade start answered a dry run's plan
/// with 200 and a job with 202) is typed as one of them.
#[test]
fn every_operation_answers_one_shape_on_success() {
    let doc = committed();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let mut shapes: Vec<&serde_json::Value> = op["responses"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(status, _)| status.starts_with('2'))
                .map(|(_, answer)| &answer["content"])
                .collect();
            shapes.dedup();
            assert!(shapes.len() <= 1, "{method} {path} answers {} shapes on success: {shapes:#?}", shapes.len());
        }
    }
    let plan = &doc["paths"]["/v1/clusters/{name}/upgrades/plan"]["post"]["responses"]["200"];
    assert_eq!(plan["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/UpgradePlan");
    let start = &doc["paths"]["/v1/clusters/{name}/upgrades"]["post"]["responses"];
    assert!(start.get("200").is_none() && start.get("202").is_some(), "the start answers only its job: {start:#}");
}

/// `servers` tells clients where the API is: relative first, so that the
/// Swagger UI and the pages the server serves call the server that served
/// the document; the default listener for tools that want an absolute URL.
#[test]
fn the_document_names_its_servers_relative_first() {
    let doc = committed();
    let servers = doc["servers"].as_array().expect("a servers entry");
    assert_eq!(servers.first().map(|s| &s["url"]), Some(&serde_json::json!("/")), "{servers:#?}");
    assert!(servers.iter().any(|s| s["url"] == "http://127.0.0.1:8080"), "the default listener: {servers:#?}");
}

/// Every property says what it holds (`Change.before`/`after` had no
/// schema, which generators type as `any`).
#[test]
fn every_property_has_a_schema() {
    const TYPED: [&str; 9] = ["type", "$ref", "oneOf", "allOf", "anyOf", "items", "properties", "enum", "const"];
    let doc = committed();
    let untyped: Vec<String> = schemas(&doc)
        .into_iter()
        .filter(|(at, s)| at.contains('.') && !TYPED.iter().any(|k| s.get(*k).is_some()))
        .filter(|(at, _)| !at.ends_with(".items") && !at.ends_with(".additionalProperties"))
        .map(|(at, _)| at)
        .collect();
    assert!(untyped.is_empty(), "properties without a schema: {untyped:?}");
    let before = &doc["components"]["schemas"]["Change"]["properties"]["before"];
    assert_eq!(before["oneOf"][0]["$ref"], "#/components/schemas/JsonValue", "{before:#}");
}

/// What generated clients keep of a list: openapi-generator turns a list
/// with `uniqueItems` into a set, and its typescript-fetch client drops a
/// `null` set, and a `null` list of objects, from a request. Elsewhere a
/// dropped `null` means what an absent field means; in a merge patch it is
/// a reset, which would silently do nothing. Uniqueness is said in words
/// (the server checks it), and a patch's list of objects takes `[]` as its
/// reset.
#[test]
fn no_list_is_one_a_generated_client_would_drop_a_reset_of() {
    let doc = committed();
    for (at, schema) in schemas(&doc) {
        assert!(schema.get("uniqueItems").is_none(), "{at} has uniqueItems");
    }
    for patch in ["PoolPatch", "StrategyPatch"] {
        for (name, prop) in doc["components"]["schemas"][patch]["properties"].as_object().expect("properties") {
            let nullable = prop["type"].as_array().is_some_and(|t| t.contains(&serde_json::json!("null")));
            let of_objects = prop["items"].get("$ref").is_some();
            assert!(!(nullable && of_objects), "{patch}.{name} is a nullable list of objects: {prop:#}");
        }
    }
    let patch = &doc["components"]["schemas"]["PoolPatch"]["properties"];
    for list in ["engines", "failure_domains"] {
        assert_eq!(patch[list]["type"], serde_json::json!(["array", "null"]), "{list}: `null` resets it");
        assert!(patch[list]["description"].as_str().is_some_and(|d| d.contains("at most once")), "{list}");
    }
    assert_eq!(patch["extra_mounts"]["type"], "array", "{:#}", patch["extra_mounts"]);
}
