//! The client's HTTP side: one `reqwest::Client`, the bearer token on every
//! request, and every failure turned into a [`CliError`] that says what a
//! person needs to know: the problem's title, detail and fields, or which
//! server could not be reached.

use std::fmt;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::exit;
use crate::error::error_chain;

/// Longest wait for a TCP connection: a wrong address should fail fast.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest ordinary request (the server's own limit is 30 s by default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's RFC 9457 problem document, read leniently: a proxy's error
/// page or an older server may lack fields.
#[derive(Debug, Default, Deserialize)]
pub struct Problem {
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub status: u16,
    pub detail: Option<String>,
    #[serde(default)]
    pub errors: Vec<FieldError>,
    #[serde(default, rename = "type")]
    pub type_: String,
}

#[derive(Debug, Deserialize)]
pub struct FieldError {
    #[serde(default)]
    pub field: String,
    #[serde(default)]
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.title, self.status)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        for e in &self.errors {
            write!(f, "\n  {}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach drover at {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("{0}")]
    Problem(Problem),
    #[error("unexpected answer to {what}: {reason}")]
    BadResponse { what: String, reason: String },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
    #[error("gave up waiting after {0:?} (--timeout); the work goes on on the server")]
    Timeout(Duration),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Failed(_) => exit::FAILED,
            Self::Timeout(_) => exit::TIMEOUT,
            Self::Usage(_) => exit::USAGE,
            _ => exit::ERROR,
        }
    }
}

pub struct Client {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    server: String,
    token: Option<String>,
}

impl Client {
    pub fn new(server: &str, token: Option<String>) -> Result<Self, CliError> {
        let server = server.trim().trim_end_matches('/').to_owned();
        if server.starts_with("https://") {
            return Err(CliError::Usage(format!(
                "--server {server}: this build speaks plain HTTP only; reach drover over http:// (or a local TLS proxy)"
            )));
        }
        if !server.starts_with("http://") {
            return Err(CliError::Usage(format!("--server {server:?} must be a URL like http://127.0.0.1:8080")));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("drover-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::Usage(format!("cannot set up the HTTP client: {}", error_chain(&e))))?;
        let token = token.filter(|t| !t.trim().is_empty());
        Ok(Self { http, server, token })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.server));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> CliError {
        let reason = if e.is_timeout() { "the request timed out".to_owned() } else { error_chain(e) };
        CliError::Unreachable { server: self.server.clone(), reason }
    }

    /// Sends a request and answers its JSON body (`Null` when it has none).
    async fn send(&self, what: String, req: RequestBuilder) -> Result<Value, CliError> {
        let res = req.timeout(REQUEST_TIMEOUT).send().await.map_err(|e| self.unreachable(&e))?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| self.unreachable(&e))?;
        if !status.is_success() {
            return Err(CliError::Problem(problem_of(status, &bytes)));
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| CliError::BadResponse { what, reason: format!("not JSON: {e}") })
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.send(format!("GET {path}"), self.request(Method::GET, path)).await
    }

    /// Reads an answer as the type the server serialized it from, so that a
    /// renamed or missing field is an error, never a silent `-`.
    ///
    /// serde fills in a missing `Option` (and a `#[serde(default)]` field,
    /// which stored types have); the server always sends those fields, so
    /// every field the decoded value would send back must be in the answer.
    /// Fields the answer has and the type lacks (a newer server) are fine.
    pub fn decode<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, v: Value) -> Result<T, CliError> {
        let bad = |reason: String| CliError::BadResponse { what: what.to_owned(), reason };
        let decoded: T = serde_path_to_error::deserialize(&v).map_err(|e| {
            let (path, inner) = (e.path().to_string(), e.inner().to_string());
            match inner.strip_prefix("missing field `") {
                _ if path == "." => bad(inner),
                // As `missing_field` below names them: `status.replicas`.
                Some(field) => bad(format!("missing field `{path}.{field}")),
                None => bad(format!("{path}: {inner}")),
            }
        })?;
        let expected = serde_json::to_value(&decoded).map_err(|e| bad(e.to_string()))?;
        match missing_field(&v, &expected, "") {
            Some(path) => Err(bad(format!("missing field `{path}`"))),
            None => Ok(decoded),
        }
    }

    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        self.send(format!("DELETE {path}"), self.request(Method::DELETE, path)).await
    }

    /// POST with a JSON body, or none.
    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        let mut req = self.request(Method::POST, path);
        if let Some(body) = body {
            req = req.json(body);
        }
        self.send(format!("POST {path}"), req).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.send(format!("PUT {path}"), self.request(Method::PUT, path).json(body)).await
    }

    /// PATCH with a JSON merge patch (RFC 7396).
    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, CliError> {
        let req = self
            .request(Method::PATCH, path)
            .header(reqwest::header::CONTENT_TYPE, "application/merge-patch+json")
            .body(patch.to_string());
        self.send(format!("PATCH {path}"), req).await
    }

    /// Opens a Server-Sent Events stream; no overall timeout, since a
    /// stream lives as long as the work it follows.
    pub async fn open_stream(&self, path: &str, last_event_id: Option<&str>) -> Result<Response, CliError> {
        let mut req = self.request(Method::GET, path).header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let res = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = res.status();
        if !status.is_success() {
            let bytes = res.bytes().await.unwrap_or_default();
            return Err(CliError::Problem(problem_of(status, &bytes)));
        }
        Ok(res)
    }
}

/// The first field of `expected` that `got` lacks, as a path like `items[0].status.replicas`.
fn missing_field(got: &Value, expected: &Value, path: &str) -> Option<String> {
    let at = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
    match (got, expected) {
        (Value::Object(got), Value::Object(expected)) => expected.iter().find_map(|(key, e)| match got.get(key) {
            None => Some(at(key)),
            Some(g) => missing_field(g, e, &at(key)),
        }),
        (Value::Array(got), Value::Array(expected)) => {
            got.iter().zip(expected).enumerate().find_map(|(i, (g, e))| missing_field(g, e, &format!("{path}[{i}]")))
        }
        _ => None,
    }
}

/// The problem in an error answer, or one made up from its status when the
/// body is not a problem document.
fn problem_of(status: StatusCode, body: &[u8]) -> Problem {
    let mut p: Problem = serde_json::from_slice(body).unwrap_or_default();
    if p.status == 0 {
        p.status = status.as_u16();
    }
    if p.title.is_empty() {
        p.title = status.canonical_reason().unwrap_or("HTTP error").to_owned();
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if p.detail.is_none() && !text.is_empty() {
            p.detail = Some(text.chars().take(300).collect());
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_show_title_detail_and_each_field() {
        let body = br#"{"type":"https://drover.dev/problems/validation","title":"The request broke a validation rule",
            "status":422,"detail":"replicas: too big","errors":[{"field":"replicas","rule":"range","message":"too big"}]}"#;
        let shown = problem_of(StatusCode::UNPROCESSABLE_ENTITY, body).to_string();
        assert_eq!(shown, "The request broke a validation rule (422): replicas: too big\n  replicas: too big");
    }

    #[test]
    fn a_body_that_is_not_a_problem_still_gives_a_message() {
        let p = problem_of(StatusCode::BAD_GATEWAY, b"upstream down");
        assert_eq!(p.to_string(), "Bad Gateway (502): upstream down");
    }

    #[derive(Debug, Deserialize, serde::Serialize)]
    struct View {
        name: String,
        inner: Vec<Inner>,
    }

    #[derive(Debug, Deserialize, serde::Serialize)]
    struct Inner {
        error: Option<String>,
        #[serde(default)]
        count: u32,
    }

    fn decoded(v: Value) -> Result<View, String> {
        Client::decode::<View>("GET /x", v).map_err(|e| e.to_string())
    }

    #[test]
    fn an_answer_missing_any_field_is_an_error_that_names_it() {
        use serde_json::json;
        assert!(decoded(json!({"name": "a", "inner": [{"error": null, "count": 1}], "newer": 1})).is_ok());
        assert_eq!(decoded(json!({"inner": []})).unwrap_err(), "unexpected answer to GET /x: missing field `name`");
        assert_eq!(
            decoded(json!({"name": "a", "inner": [{"error": null, "count": 1}, {"count": 2}]})).unwrap_err(),
            "unexpected answer to GET /x: missing field `inner[1].error`",
            "an Option the server always sends"
        );
        assert_eq!(
            decoded(json!({"name": "a", "inner": [{"error": "x"}]})).unwrap_err(),
            "unexpected answer to GET /x: missing field `inner[0].count`",
            "a field with a default"
        );
        #[derive(Debug, Deserialize, serde::Serialize)]
        struct Outer {
            view: View,
        }
        assert_eq!(
            Client::decode::<Outer>("GET /y", json!({"view": {"inner": []}})).unwrap_err().to_string(),
            "unexpected answer to GET /y: missing field `view.name`"
        );
        assert_eq!(
            decoded(json!({"name": "a", "inner": [{"error": 3, "count": 1}]})).unwrap_err(),
            "unexpected answer to GET /x: inner[0].error: invalid type: integer `3`, expected a string"
        );
    }

    #[test]
    fn servers_must_be_plain_http_urls() {
        assert!(Client::new("http://127.0.0.1:8080/", None).is_ok_and(|c| c.server() == "http://127.0.0.1:8080"));
        assert!(matches!(Client::new("https://x", None), Err(CliError::Usage(_))));
        assert!(matches!(Client::new("127.0.0.1:8080", None), Err(CliError::Usage(_))));
    }
}
