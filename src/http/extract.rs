//! Extractors that turn every bad request into a problem document naming
//! the field at fault, instead of axum's plain-text rejections. Every body
//! is read by one policy: `application/json` only (merge patches may also
//! say `application/merge-patch+json`), no duplicate keys, no arrays where
//! an object belongs (see [`crate::domain::json`]).

use crate::domain::object::Namespace;
use crate::identity::authz::Refusals;
use crate::identity::{Access, Caller, WorkedIn};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::{StatusCode, header, request::Parts};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::domain::json::{self, JsonError};
use crate::error::ApiError;

/// Largest request body drover reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The media type of every JSON request body.
const JSON: &str = "application/json";
/// RFC 7396 merge patches: accepted (besides `application/json`) where the
/// body is a merge patch.
const MERGE_PATCH: &str = "application/merge-patch+json";

/// A JSON body sent as `application/json`.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state, &[JSON]).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON body that may be left out: empty (or only whitespace) is `None`.
pub struct OptionalJson<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Some(bytes) = read_optional_body(req, state, &[JSON]).await? else { return Ok(OptionalJson(None)) };
        parse_json(&bytes).map(|v| OptionalJson(Some(v)))
    }
}

/// A JSON merge patch (RFC 7396) read into its typed form `T`: an object,
/// sent as `application/merge-patch+json` or `application/json`.
pub struct MergePatch<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for MergePatch<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state, &[MERGE_PATCH, JSON]).await?;
        merge_patch_object(&bytes).map(MergePatch)
    }
}

/// A merge patch that may be left out: an empty body is `None`.
pub struct OptionalMergePatch<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalMergePatch<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match read_optional_body(req, state, &[MERGE_PATCH, JSON]).await? {
            Some(bytes) => merge_patch_object(&bytes).map(|v| OptionalMergePatch(Some(v))),
            None => Ok(OptionalMergePatch(None)),
        }
    }
}

fn merge_patch_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match parse_json::<Value>(bytes)? {
        v @ Value::Object(_) => from_json_value(v),
        _ => Err(ApiError::invalid("body", "type", "a merge patch must be a JSON object")),
    }
}

/// The generations an `If-Match` header accepts: `None` when it was not
/// sent or is `*` (any existing pool). RFC 9110 asks If-Match for the
/// strong comparison, so a weak tag (`W/"3"`) matches nothing; a list of
/// tags accepts any of its strong ones. A malformed header is a 412.
pub struct IfMatch(pub Option<Vec<i64>>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if_match(parts.headers.get(header::IF_MATCH)).map(IfMatch)
    }
}

fn if_match(value: Option<&header::HeaderValue>) -> Result<Option<Vec<i64>>, ApiError> {
    let Some(value) = value else { return Ok(None) };
    let raw = value.to_str().unwrap_or_default().trim();
    if raw == "*" {
        return Ok(None);
    }
    let shown = || crate::telemetry::truncate(raw, 100).to_owned();
    let mut strong = Vec::new();
    for tag in raw.split(',').map(str::trim) {
        if tag.starts_with("W/") {
            continue;
        }
        let generation = tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).and_then(|t| t.parse().ok());
        match generation {
            Some(g) => strong.push(g),
            None => {
                return Err(ApiError::PreconditionFailed(format!(
                    "If-Match {:?} is not an ETag this server issued (they look like \"3\")",
                    shown()
                )));
            }
        }
    }
    if strong.is_empty() {
        return Err(ApiError::PreconditionFailed(format!(
            "If-Match {:?} names only weak ETags, which never match (If-Match uses strong comparison); send the ETag as it was received",
            shown()
        )));
    }
    Ok(Some(strong))
}

/// The body, once its declared type is one of `accepted`.
async fn read_body<S: Send + Sync>(req: Request, state: &S, accepted: &[&str]) -> Result<Bytes, ApiError> {
    check_content_type(req.headers().get(header::CONTENT_TYPE), accepted)?;
    collect(req, state).await
}

/// The body, unless it is empty or the JSON `null` (what some clients send
/// for "no body"); a body that is there must be declared as one of `accepted`.
async fn read_optional_body<S: Send + Sync>(
    req: Request,
    state: &S,
    accepted: &[&str],
) -> Result<Option<Bytes>, ApiError> {
    let declared = req.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = collect(req, state).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
        return Ok(None);
    }
    check_content_type(declared.as_ref(), accepted)?;
    Ok(Some(bytes))
}

async fn collect<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }
        } else {
            ApiError::Malformed(rejection.body_text())
        }
    })
}

/// Accepts exactly the media types in `accepted` (parameters such as
/// `charset` aside): a `+json` suffix alone says nothing about the shape.
fn check_content_type(value: Option<&header::HeaderValue>, accepted: &[&str]) -> Result<(), ApiError> {
    let expected = accepted.join(" or ");
    let Some(value) = value else {
        return Err(ApiError::UnsupportedMediaType(format!("the body must be JSON: set Content-Type: {expected}")));
    };
    let mime = value.to_str().unwrap_or_default();
    let essence = mime.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if accepted.contains(&essence.as_str()) {
        Ok(())
    } else {
        let shown: String = crate::telemetry::truncate(mime, 100).into();
        Err(ApiError::UnsupportedMediaType(format!("Content-Type {shown:?} is not accepted here; use {expected}")))
    }
}

/// Deserializes `bytes`, telling apart broken JSON (400) from JSON of the
/// wrong shape (422, with the path of the field at fault). Objects that
/// repeat a key, and arrays sent where an object belongs, are of the wrong
/// shape.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value = json::parse_value(bytes).map_err(shape_error)?;
    from_json_value(value)
}

/// Reads `T` from an already parsed document, by the same rules as
/// [`parse_json`].
pub fn from_json_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    json::from_value(value).map_err(shape_error)
}

/// Broken JSON is a 400; JSON of the wrong shape a 422 naming the field.
fn shape_error(e: JsonError) -> ApiError {
    match e {
        JsonError::Syntax(e) => ApiError::Malformed(e.to_string()),
        shape => ApiError::Validation(shape.into_validation()),
    }
}

/// Query parameters, with rejections as 422 problems.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|rejection| ApiError::invalid("query", "query_string", rejection.body_text()))
    }
}

/// The `namespace` query parameter every namespaced operation takes.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NamespaceParam {
    /// The namespace the request works in (default `default`). A list
    /// also takes `*`: every namespace the caller may see.
    #[param(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$", max_length = 63, example = "team-a")]
    pub namespace: Option<String>,
}

/// The namespace a request works in, and what its caller may do there:
/// every namespaced handler takes this, and hands `access` to its service,
/// which asks the authorizer of every object.
#[derive(Debug)]
pub struct Scope {
    pub access: Access,
    /// `namespace=*`: a list of every namespace the caller may see.
    pub across: bool,
}

impl Scope {
    /// The request's one namespace; `*` is a list's only.
    pub fn single(self) -> Result<Access, ApiError> {
        if self.across {
            return Err(ApiError::invalid(
                "namespace",
                "one_namespace",
                "`*` names every namespace, which only lists take; name one namespace",
            ));
        }
        Ok(self.access)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiQuery(param) = ApiQuery::<NamespaceParam>::from_request_parts(parts, state).await?;
        let caller = parts.extensions.get::<Caller>().cloned();
        let refusals = parts.extensions.get::<Refusals>().cloned().unwrap_or_default();
        let (namespace, across) = match param.namespace.as_deref() {
            None | Some("") => (Namespace::default(), false),
            Some("*") => (Namespace::default(), true),
            Some(ns) => (Namespace::parse(ns).map_err(|e| ApiError::invalid("namespace", "dns_label", e))?, false),
        };
        if let Some(worked_in) = parts.extensions.get::<WorkedIn>() {
            worked_in.set((!across).then(|| namespace.clone()));
        }
        Ok(Scope { access: Access::new(caller, namespace, refusals), across })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        replicas: u32,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        size: u32,
    }

    fn field_of(json: &str) -> (String, &'static str) {
        match parse_json::<Body>(json.as_bytes()) {
            Err(ApiError::Validation(e)) => (e.0[0].field.clone(), e.0[0].static_rule()),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn broken_json_is_malformed() {
        for bad in ["{", "{\"replicas\": }", "", "{\"replicas\": 1} {}", "nul"] {
            let got = parse_json::<Body>(bad.as_bytes());
            assert!(matches!(got, Err(ApiError::Malformed(_))), "{bad:?} gave {got:?}");
        }
    }

    #[test]
    fn shape_errors_name_the_field() {
        assert_eq!(field_of(r#"{"replicas": "3"}"#), ("replicas".into(), "type"));
        assert_eq!(field_of(r#"{"replicas": 3, "colour": 1}"#), ("colour".into(), "unknown_field"));
        assert_eq!(field_of(r#"{}"#), ("replicas".into(), "required"));
        assert_eq!(field_of(r#"{"replicas": 1, "inner": {"size": -1}}"#), ("inner.size".into(), "type"));
        assert_eq!(field_of(r#"{"replicas": 1, "inner": {"sise": 1}}"#), ("inner.sise".into(), "unknown_field"));
        assert_eq!(field_of(r#"[]"#), ("body".into(), "type"));
    }

    #[test]
    fn only_the_named_json_types_are_accepted() {
        let hv = |s: &'static str| header::HeaderValue::from_static(s);
        let json = |v| check_content_type(Some(&hv(v)), &[JSON]).is_ok();
        let patch = |v| check_content_type(Some(&hv(v)), &[MERGE_PATCH, JSON]).is_ok();
        assert!(json("application/json") && json("Application/JSON; charset=utf-8"));
        assert!(!json("application/merge-patch+json") && !json("application/evil+json") && !json("text/plain"));
        assert!(patch("application/merge-patch+json") && patch("application/json"));
        assert!(!patch("application/evil+json") && !patch("application/json-patch+json"));
        assert!(check_content_type(None, &[JSON]).is_err());
    }

    #[test]
    fn if_match_compares_strongly() {
        let tags = |v: &'static str| if_match(Some(&header::HeaderValue::from_static(v)));
        assert_eq!(if_match(None).unwrap(), None);
        assert_eq!(tags("\"4\"").unwrap(), Some(vec![4]));
        assert_eq!(tags("*").unwrap(), None);
        assert_eq!(tags("\"4\", W/\"5\", \"6\"").unwrap(), Some(vec![4, 6]));
        assert!(matches!(tags("W/\"4\""), Err(ApiError::PreconditionFailed(_))), "a weak tag never matches");
        assert!(tags("4").is_err());
    }

    #[test]
    fn duplicate_keys_and_arrays_for_objects_are_shape_errors() {
        assert_eq!(field_of(r#"{"replicas": 1, "replicas": 2}"#), ("replicas".into(), "duplicate_key"));
        assert_eq!(
            field_of(r#"{"replicas": 1, "inner": {"size": 1, "size": 1}}"#),
            ("inner.size".into(), "duplicate_key")
        );
        assert_eq!(field_of(r#"{"replicas": 1, "inner": [1]}"#), ("inner".into(), "type"));
    }
}
