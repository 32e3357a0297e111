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
