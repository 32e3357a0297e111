//! Extractors that turn every bad request into a problem document naming
//! the field at fault, instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::{StatusCode, header, request::Parts};
use serde::de::DeserializeOwned;

use crate::domain::ValidationErrors;
use crate::error::ApiError;

/// Largest request body drover reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// A JSON body: `application/json` or any `application/*+json`
/// (such as `application/merge-patch+json`).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json_content_type(req.headers().get(header::CONTENT_TYPE))?;
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }
            } else {
                ApiError::Malformed(rejection.body_text())
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

fn check_json_content_type(value: Option<&header::HeaderValue>) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Err(ApiError::UnsupportedMediaType("the body must be JSON: set Content-Type: application/json".into()));
    };
    let mime = value.to_str().unwrap_or_default();
    let essence = mime.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let is_json = essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"));
    if is_json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!("Content-Type {mime:?} is not JSON; use application/json")))
    }
}

/// A body that may be left out: empty (or only whitespace) is `None`,
/// anything else must be JSON of the right shape.
pub fn optional_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<Option<T>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) { Ok(None) } else { parse_json(bytes).map(Some) }
}

/// Deserializes `bytes`, telling apart broken JSON (400) from JSON of the
/// wrong shape (422, with the path of the field at fault).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        shape_error(&path, e.into_inner())
    })?;
    de.end().map_err(|e| ApiError::Malformed(e.to_string()))?;
    Ok(value)
}

/// Turns a serde error at `path` into the matching API error.
pub fn shape_error(path: &str, err: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::Malformed(err.to_string()),
        Category::Data => {
            let message = strip_position(&err.to_string());
            let field = named_field(&message).map_or_else(
                || if path == "." || path.is_empty() { "body".to_owned() } else { path.to_owned() },
                |name| join_path(path, name),
            );
            let rule = if message.starts_with("unknown field") {
                "unknown_field"
            } else if message.starts_with("missing field") {
                "required"
            } else {
                "type"
            };
            ApiError::Validation(ValidationErrors::single(field, rule, message))
        }
    }
}

/// serde_json appends " at line L column C" to data errors; a field path
/// says more to the reader than a position does.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// The field an "unknown field `x`" or "missing field `x`" error is about.
fn named_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `").or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// serde_path_to_error already ends the path with an unknown field's name,
/// but not with a missing one's.
fn join_path(parent: &str, field: &str) -> String {
    if parent == "." || parent.is_empty() {
        field.to_owned()
    } else if parent == field || parent.ends_with(&format!(".{field}")) {
        parent.to_owned()
    } else {
        format!("{parent}.{field}")
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
            Err(ApiError::Validation(e)) => (e.0[0].field.clone(), e.0[0].rule),
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
    fn json_content_types() {
        let hv = |s: &'static str| header::HeaderValue::from_static(s);
        assert!(check_json_content_type(Some(&hv("application/json"))).is_ok());
        assert!(check_json_content_type(Some(&hv("application/json; charset=utf-8"))).is_ok());
        assert!(check_json_content_type(Some(&hv("application/merge-patch+json"))).is_ok());
        assert!(check_json_content_type(Some(&hv("text/plain"))).is_err());
        assert!(check_json_content_type(None).is_err());
    }
}
