//! The finishing passes over the generated OpenAPI document: what utoipa's
//! attributes cannot say, or would have to say on every operation.
//!
//! - the bearer scheme, and the answers any authenticated route may give
//!   before its handler runs (400/413/415 for bodies, 401, 403, 503);
//! - header parameters as plain optional strings (`If-Match`,
//!   `Last-Event-ID`), and `Idempotency-Key` on every POST the idempotency
//!   middleware serves;
//! - response headers: `X-Request-Id` (and `traceresponse`, when traces
//!   are exported) on every answer, `Retry-After` on every 503,
//!   `Idempotent-Replayed` on POST successes;
//! - optional request bodies (plan, rollback) as optional, without a `null`
//!   branch a client would have to send;
//! - `required` on every property of a schema only responses use: the
//!   server serializes every field of those types (`null` when empty), so a
//!   generated client should not see them as maybe-absent;
//! - OpenAPI `links` from a created pool to the operations on it;
//! - one named schema, `JsonValue`, for fields that hold any JSON value;
//! - the `namespace` query parameter on every operation of a namespaced
//!   path, and its 404 (a namespace that does not exist).

use serde_json::{Map, Value, json};

use crate::http::idempotency::{IDEMPOTENCY_KEY_MAX, SECRET_ANSWERS};

/// Operations whose request body may be left out.
const OPTIONAL_BODIES: &[(&str, &str)] = &[("post", "/v1/pools/{name}/plan"), ("post", "/v1/pools/{name}/rollback")];

/// Response schemas whose fields are not all always sent.
const SOMETIMES_ABSENT: &[&str] = &["Problem", "Check", "SseMessage"];

const METHODS: [&str; 6] = ["get", "put", "post", "delete", "patch", "head"];

/// A string schema with a closed set of values, for fields typed `String`
/// in Rust whose values are nonetheless fixed.
pub(crate) fn string_enum(values: &[&str], description: &str) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(values.iter().copied()))
        .description(Some(description))
        .build()
}

/// The document as served and committed.
pub fn finish(doc: utoipa::openapi::OpenApi) -> anyhow::Result<utoipa::openapi::OpenApi> {
    use anyhow::Context as _;
    let doc = with_security(doc);
    // The passes below work on JSON; the document's own types read it back.
    // Both directions are exercised by the tests (the committed document is
    // this function's output), so a failure here is a bug in a pass.
    let mut value = serde_json::to_value(&doc).context("the OpenAPI document does not serialize")?;
    headers(&mut value);
    optional_bodies(&mut value);
    response_fields_required(&mut value);
    links(&mut value);
    stream_payloads(&mut value);
    label_and_name_rules(&mut value);
    namespace_params(&mut value)?;
    // After the label rules: the patch's schemas are the input's, rules included.
    if let Some(schemas) = value.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        crate::domain::pool::patch::patch_schemas(schemas);
    }
    // Last: the fleet file's schemas are copies of the API's, rules included.
    crate::apply::schema::add_fleet_schemas(&mut value);
    json_values(&mut value);
    serde_json::from_value(value).context("a pass made the OpenAPI document unreadable to utoipa")
}

/// The paths whose objects belong to a namespace: every operation on them
/// or under them names it with the `namespace` query parameter, which the
/// [`Scope`](crate::http::extract::Scope) extractor of their handlers reads.
/// (Tokens are not among them: a token's grants say where it works, and a
/// caller manages the tokens of the namespaces it is an admin of.)
pub const NAMESPACED: &[&str] = &["/v1/pools", "/v1/clusters", "/v1/upgrades", "/v1/apply", "/v1/audit"];

/// Adds [`NamespaceParam`](crate::http::extract::NamespaceParam), as utoipa
/// writes it, to every operation of a [`NAMESPACED`] path that does not
/// declare it already, with the 404 a missing namespace answers and the
/// 422 a malformed one (or `*` outside a list) does.
fn namespace_params(doc: &mut Value) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use utoipa::IntoParams as _;
    let params = crate::http::extract::NamespaceParam::into_params(|| Some(utoipa::openapi::path::ParameterIn::Query));
    let param = params.first().context("NamespaceParam declares no parameter")?;
    let param = serde_json::to_value(param).context("the namespace parameter does not serialize")?;
    let problem = |description: &str| {
        json!({
            "description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
        })
    };
    let not_found = problem("No such namespace, or no such object in it");
    let bad_namespace = problem(
        "The namespace is not a DNS label, or is `*` on an operation that is not a list; `errors` names the rule",
    );
    let Some(paths) = doc.pointer_mut("/paths").and_then(Value::as_object_mut) else { return Ok(()) };
    for (path, item) in paths.iter_mut() {
        let namespaced =
            NAMESPACED.iter().any(|p| path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')));
        if !namespaced {
            continue;
        }
        for method in METHODS {
            let Some(op) = item.get_mut(method).and_then(Value::as_object_mut) else { continue };
            let list = op.entry("parameters").or_insert_with(|| json!([]));
            if let Some(list) = list.as_array_mut()
                && !list.iter().any(|p| p["name"] == "namespace" && p["in"] == "query")
            {
                list.push(param.clone());
            }
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                responses.entry("404").or_insert_with(|| not_found.clone());
                responses.entry("422").or_insert_with(|| bad_namespace.clone());
            }
        }
    }
    Ok(())
}

/// The schema of a field that holds any JSON value (a diff's `before` and
/// `after`), named so that generated clients share one type for it.
const JSON_VALUE: &str = "JsonValue";

/// Fields of any JSON value have a schema with no `type` (utoipa's for a
/// `serde_json::Value`), which generators type as `any`. Each becomes a
/// [`JSON_VALUE`] or `null`. The alternatives are listed one by one
/// because a `type` array (`["string", "number", ...]`) is what
/// openapi-python-client cannot read, and an `array` without `items` or an
/// `object` without `additionalProperties` neither; those two say "any
/// value" with `{}`, which utoipa reads back from `"type": null` (and
/// writes as `{}` again).
fn json_values(doc: &mut Value) {
    const TYPED: [&str; 9] = ["type", "$ref", "oneOf", "allOf", "anyOf", "items", "properties", "enum", "const"];
    let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    let mut used = false;
    for schema in schemas.values_mut() {
        let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for prop in props.values_mut().filter_map(Value::as_object_mut) {
            if !TYPED.iter().any(|k| prop.contains_key(*k)) {
                let reference = json!({"$ref": format!("#/components/schemas/{JSON_VALUE}")});
                prop.insert("oneOf".into(), json!([reference, {"type": "null"}]));
                used = true;
            }
        }
    }
    if used {
        let any = json!({"type": null});
        schemas.insert(
            JSON_VALUE.into(),
            json!({
                "description": "A JSON value other than `null`, as the field holds it: a string, a number, a boolean, a list or an object",
                "anyOf": [
                    {"type": "string"},
                    {"type": "number"},
                    {"type": "boolean"},
                    {"type": "array", "items": any},
                    {"type": "object", "additionalProperties": any},
                ],
            }),
        );
    }
}

/// Declares the bearer scheme and, on every operation that is not public,
/// the answers any route may give before its handler runs: 401, 403, and
/// 503 when the server sheds load or a request times out.
fn with_security(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            Http::builder()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A drover token (from POST /v1/tokens, or the admin.token file written on first start), or \
                     a JWT of an OIDC issuer named in the access config (RS256 or ES256; docs/access.md). A \
                     client certificate signed by --tls-client-ca, whose subject the access config maps to a \
                     role, authenticates requests without a token (mutual TLS).",
                ))
                .build(),
        ),
    );
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
            )
            .build()
    };
    for item in doc.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch, &mut item.head];
        for op in ops.into_iter().flatten() {
            let public = op.security.as_ref().is_some_and(|s| s.iter().all(|r| *r == SecurityRequirement::default()));
            if public {
                continue;
            }
            op.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
            let has_body = op.request_body.is_some();
            let responses = &mut op.responses.responses;
            if has_body {
                responses.entry("400".into()).or_insert_with(|| problem("The body is not valid JSON").into());
                responses.entry("413".into()).or_insert_with(|| problem("The body is over 1 MiB").into());
                responses.entry("415".into()).or_insert_with(|| problem("The body is not declared as JSON").into());
            }
            responses.entry("401".into()).or_insert_with(|| {
                problem(
                    "No valid credentials: no token, an unknown or revoked token, or a JWT that failed a check \
                     (algorithm, signature, issuer, audience, expiry, not-before); type `unauthenticated`",
                )
                .into()
            });
            responses.entry("403".into()).or_insert_with(|| {
                problem(
                    "The caller's role may not do this (type `forbidden`), or the JWT is valid but no rule of \
                     its issuer gives it a role (type `no-access-rule`); neither names a secret",
                )
                .into()
            });
            responses
                .entry("503".into())
                .or_insert_with(|| problem("Overloaded or timed out; retry after `Retry-After` seconds").into());
        }
    }
    doc
}

/// Every operation of the document, with its path and method.
fn operations(doc: &mut Value) -> impl Iterator<Item = (String, &'static str, &mut Map<String, Value>)> {
    let paths = doc.get_mut("paths").and_then(Value::as_object_mut);
    paths.into_iter().flat_map(|paths| paths.iter_mut()).flat_map(|(path, item)| {
        let path = path.clone();
        let item = item.as_object_mut();
        item.into_iter().flat_map(|item| item.iter_mut()).filter_map(move |(method, op)| {
            let method = METHODS.iter().find(|m| **m == method.as_str())?;
            Some((path.clone(), *method, op.as_object_mut()?))
        })
    })
}

fn problem_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

fn headers(doc: &mut Value) {
    // Defined once and referenced from every answer (inline, it would be
    // repeated on each of them).
    doc["components"]["headers"]["traceresponse"] = json!({
        "description": "W3C Trace Context: `00-<trace id>-<span id>-<flags>` of this request, when drover exports traces (a `traceparent` sent with the request is continued)",
        "schema": {"type": "string", "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"}
    });
    for (path, method, op) in operations(doc) {
        let keyed = method == "post" && !SECRET_ANSWERS.contains(&("POST", path.as_str()));
        let params = op.entry("parameters").or_insert_with(|| json!([]));
        if let Some(params) = params.as_array_mut() {
            // A header is a string on the wire; clients send it or leave it out.
            for p in params.iter_mut().filter(|p| p["in"] == "header") {
                let description = p["description"].clone();
                let kept = p["schema"].get("maxLength").cloned();
                p["schema"] = json!({"type": "string"});
                if let Some(max) = kept {
                    p["schema"]["maxLength"] = max;
                }
                p["required"] = json!(false);
                p["description"] = description;
            }
            if keyed {
                params.push(json!({
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": false,
                    "description": "Makes the request safe to retry: the same key with the same body within 24 hours gets the first answer again (with `Idempotent-Replayed: true`) without the work being redone",
                    "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX, "pattern": "^[!-~]+$"}
                }));
            }
        }
        if op.get("parameters").and_then(Value::as_array).is_some_and(Vec::is_empty) {
            op.remove("parameters");
        }
        let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else { continue };
        if keyed {
            responses.entry("409").or_insert_with(|| {
                problem_response("A request with this `Idempotency-Key` is still being served, or the key was used for another request")
            });
            responses.entry("422").or_insert_with(|| {
                problem_response("The `Idempotency-Key` is malformed, or was used for another request")
            });
        }
        for (status, response) in responses.iter_mut() {
            let Some(response) = response.as_object_mut() else { continue };
            let headers = response.entry("headers").or_insert_with(|| json!({}));
            headers["X-Request-Id"] = json!({
                "description": "The request's id, as sent (when short and printable) or made up; it is on every log line of the request",
                "schema": {"type": "string"}
            });
            headers["traceresponse"] = json!({"$ref": "#/components/headers/traceresponse"});
            if status == "503" {
                headers["Retry-After"] =
                    json!({"description": "Seconds to wait before retrying", "schema": {"type": "string"}});
            }
            if keyed && status.starts_with('2') {
                headers["Idempotent-Replayed"] = json!({
                    "description": "`true` when this is the stored answer to an earlier request with the same `Idempotency-Key`",
                    "schema": {"type": "string", "enum": ["true"]}
                });
            }
        }
    }
}

/// A body that may be left out is `required: false`, not a `null` a client
/// would have to send (and the server would refuse).
fn optional_bodies(doc: &mut Value) {
    for (path, method, op) in operations(doc) {
        if !OPTIONAL_BODIES.contains(&(method, path.as_str())) {
            continue;
        }
        let Some(body) = op.get_mut("requestBody") else { continue };
        body["required"] = json!(false);
        if let Some(content) = body.get_mut("content").and_then(Value::as_object_mut) {
            for media in content.values_mut() {
                if let Some(one_of) = media["schema"].get("oneOf").and_then(Value::as_array) {
                    let not_null: Vec<Value> = one_of.iter().filter(|s| s["type"] != "null").cloned().collect();
                    if let [only] = not_null.as_slice() {
                        media["schema"] = only.clone();
                    }
                }
            }
        }
    }
}

/// The names of the component schemas `value` refers to.
fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                out.push(name.to_owned());
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// Marks every property of the schemas only responses reach as required.
fn response_fields_required(doc: &mut Value) {
    let schemas = doc["components"]["schemas"].clone();
    // Schemas reachable from a request body or parameter stay as declared.
    let mut inputs = Vec::new();
    for (_, _, op) in operations(doc) {
        refs(op.get("requestBody").unwrap_or(&Value::Null), &mut inputs);
        refs(op.get("parameters").unwrap_or(&Value::Null), &mut inputs);
    }
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = inputs.pop() {
        if seen.insert(name.clone()) {
            refs(&schemas[&name], &mut inputs);
        }
    }
    let Some(schemas) = doc["components"]["schemas"].as_object_mut() else { return };
    for (name, schema) in schemas.iter_mut() {
        if seen.contains(name) || SOMETIMES_ABSENT.contains(&name.as_str()) {
            continue;
        }
        let Some(props) = schema.get("properties").and_then(Value::as_object) else { continue };
        let all: Vec<Value> = props.keys().map(|k| json!(k)).collect();
        schema["required"] = Value::Array(all);
    }
}

/// The payload schema of each message name of the two event streams, as
/// `x-sse-events` on their 200 answers (OpenAPI 3.1 has no SSE vocabulary).
fn stream_payloads(doc: &mut Value) {
    let schema = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let streams = [
        (
            "/paths/~1v1~1pools~1{name}~1stream/get/responses/200",
            json!({"status": schema("PoolView"), "event": schema("Event"), "deleted": schema("StreamDeleted")}),
        ),
        (
            "/paths/~1v1~1upgrades~1{id}~1stream/get/responses/200",
            json!({"status": schema("UpgradeView"), "event": schema("Event")}),
        ),
    ];
    for (pointer, events) in streams {
        if let Some(ok) = doc.pointer_mut(pointer) {
            ok["x-sse-events"] = events;
        }
    }
}

/// A Kubernetes label value (`domain::labels::is_label_value`).
const LABEL_VALUE: &str = "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// A label key: an optional DNS prefix and `/`, then a label value.
const LABEL_KEY: &str =
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
use crate::domain::names::DNS_LABEL_PATTERN as DNS_LABEL;

fn is_type(schema: &Value, ty: &str) -> bool {
    schema["type"] == ty || schema["type"].as_array().is_some_and(|t| t.iter().any(|t| t == ty))
}

/// The rules `domain::pool::validate` and `domain::labels::check` enforce
/// on the items of lists and maps, which utoipa's field attributes cannot
/// reach: failure domains are label values and engines DNS labels, each
/// listed once (said in the description); label maps hold at most 64 keys
/// of the label-key form with label values (or empty ones). Keys under
/// `drover.dev/` are reserved, which a pattern does not say; the
/// description does.
fn label_and_name_rules(doc: &mut Value) {
    let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    for schema in schemas.values_mut() {
        let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for (name, prop) in props.iter_mut() {
            match name.as_str() {
                "failure_domains" | "engines" if is_type(prop, "array") => {
                    let pattern = if name == "engines" { DNS_LABEL } else { LABEL_VALUE };
                    prop["items"] = json!({"type": "string", "pattern": pattern, "minLength": 1, "maxLength": 63});
                    // Said in words, not as `uniqueItems`: generators turn a
                    // unique list into a set, and openapi-generator's
                    // typescript-fetch then drops the `null` that resets it
                    // in a patch. The server refuses a repeat either way.
                    let described = prop["description"].as_str().unwrap_or_default().to_owned();
                    let note = "Each at most once (a repeat is refused: 422, rule `unique`).";
                    prop["description"] = json!(format!("{described} {note}").trim().to_owned());
                }
                "labels" | "engine_selector" if is_type(prop, "object") => {
                    prop["maxProperties"] = json!(64);
                    prop["propertyNames"] = json!({"type": "string", "pattern": LABEL_KEY});
                    let value = &mut prop["additionalProperties"];
                    if value.is_object() {
                        value["maxLength"] = json!(63);
                        value["pattern"] = json!(format!("^({})?$", &LABEL_VALUE[1..LABEL_VALUE.len() - 1]));
                    }
                    let described = prop["description"].as_str().unwrap_or_default().to_owned();
                    let note =
                        "Keys are `[prefix/]name` (`drover.dev/` is reserved); values are empty or label values.";
                    prop["description"] = json!(format!("{described} {note}").trim().to_owned());
                }
                _ => {}
            }
        }
    }
}

/// Links from a created pool to what can be done with it: clients (and
/// schemathesis' stateful tests) follow them with the pool's name.
fn links(doc: &mut Value) {
    let name = json!({"name": "$response.body#/name"});
    let to = |operation: &str, description: &str| json!({"operationId": operation, "parameters": name.clone(), "description": description});
    let pool_links = json!({
        "GetPool": to("get_pool", "The pool just created"),
        "PatchPool": to("patch_pool", "Change the pool just created"),
        "ScalePool": to("scale_pool", "Scale the pool just created"),
        "DeletePool": to("delete_pool", "Delete the pool just created"),
        "ListPoolEvents": to("list_pool_events", "The events of the pool just created"),
        "GetRollout": to("get_rollout", "The rollout of the pool just created"),
        "PlanPool": to("plan_pool", "A dry run on the pool just created"),
    });
    let Some(created) = doc.pointer_mut("/paths/~1v1~1pools/post/responses/201") else { return };
    created["links"] = pool_links.clone();
    for method in ["get", "patch"] {
        if let Some(ok) = doc.pointer_mut(&format!("/paths/~1v1~1pools~1{{name}}/{method}/responses/200")) {
            ok["links"] = pool_links.clone();
        }
    }
}
