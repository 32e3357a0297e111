//! The client's HTTP side: one `reqwest::Client`, the bearer token on every
//! request (given, or printed by a command that is run again when the
//! server refuses what it printed), and every failure turned into a
//! [`CliError`] that says what a person needs to know: the problem's title,
//! detail and fields, or which server could not be reached.

use std::fmt;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

use super::exit;
use crate::error::error_chain;

/// Longest wait for a TCP connection: a wrong address should fail fast.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest ordinary request (the server's own limit is 30 s by default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest run of `--token-command`.
const TOKEN_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::error::Problem;

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
    /// Input the command read is wrong (a fleet file), as opposed to how
    /// it was called.
    #[error("{0}")]
    Input(String),
    #[error("--token-command {0}")]
    TokenCommand(String),
    #[error("{0}")]
    Failed(String),
    #[error("gave up waiting after {0:?} (--timeout); the work goes on on the server")]
    Timeout(Duration),
    /// An apply answered, with objects it left alone.
    #[error("{0}")]
    Conflicts(Conflicts),
}

/// An apply's conflicts: objects left alone, and what would resolve them.
#[derive(Debug)]
pub struct Conflicts {
    pub count: u32,
    /// Whether the rest of the apply changed something.
    pub applied: bool,
    /// How each kind of conflict is resolved, with how many it concerns
    /// (`"--force overwrites what another hand changed"`).
    pub resolutions: Vec<(u32, &'static str)>,
}

impl fmt::Display for Conflicts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let objects = if self.count == 1 { "1 object was".to_owned() } else { format!("{} objects were", self.count) };
        let outcome = if self.applied { "the rest was applied" } else { "nothing was applied" };
        write!(f, "{objects} left alone as conflicts (each is shown above); {outcome}")?;
        for (n, how) in &self.resolutions {
            write!(f, "\n  {n}: {how}")?;
        }
        Ok(())
    }
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

/// How the client trusts the server and proves itself over HTTPS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA certificates: the only ones trusted for the server's certificate.
    pub ca_cert: Option<std::path::PathBuf>,
    /// PEM certificate and key presented to the server (mutual TLS).
    pub client_cert: Option<std::path::PathBuf>,
    pub client_key: Option<std::path::PathBuf>,
}

fn read_pem(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::Usage(format!("{flag} {}: {e}", path.display())))
}

/// The HTTP client, trusting `tls.ca_cert` alone when given (else the
/// system's roots) and presenting a client certificate when given.
fn http_client(tls: &TlsOptions) -> Result<reqwest::Client, CliError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("drover-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &tls.ca_cert {
        let certs = reqwest::Certificate::from_pem_bundle(&read_pem("--ca-cert", path)?)
            .map_err(|e| CliError::Usage(format!("--ca-cert {}: no PEM certificate: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(CliError::Usage(format!("--ca-cert {}: no PEM certificate", path.display())));
        }
        builder = builder.tls_certs_only(certs);
    }
    match (&tls.client_cert, &tls.client_key) {
        (None, None) => {}
        (Some(cert), Some(key)) => {
            let mut pem = read_pem("--client-cert", cert)?;
            pem.extend_from_slice(b"\n");
            pem.extend_from_slice(&read_pem("--client-key", key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| CliError::Usage(format!("--client-cert/--client-key: {}", error_chain(&e))))?;
            builder = builder.identity(identity);
        }
        _ => return Err(CliError::Usage("--client-cert and --client-key go together".into())),
    }
    builder.build().map_err(|e| CliError::Usage(format!("cannot set up the HTTP client: {}", error_chain(&e))))
}

pub struct Client {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    server: String,
    credentials: Credentials,
    /// `--namespace`: sent with every request to a namespaced path.
    namespace: Option<String>,
}

/// Where the bearer token comes from.
enum Credentials {
    None,
    Token(String),
    /// A command that prints a token, such as a CI system's OIDC token
    /// that lives a few minutes: run before the first request, and again
    /// when the server refuses the token it printed (expired during a long
    /// `--wait`).
    Command {
        command: String,
        current: tokio::sync::Mutex<Option<String>>,
    },
}

impl Client {
    pub fn new(server: &str, token: Option<String>, tls: &TlsOptions) -> Result<Self, CliError> {
        let server = server.trim().trim_end_matches('/').to_owned();
        if !server.starts_with("http://") && !server.starts_with("https://") {
            return Err(CliError::Usage(format!(
                "--server {server:?} must be a URL like http://127.0.0.1:8080 or https://drover.example.com"
            )));
        }
        let http = http_client(tls)?;
        let credentials = match token.filter(|t| !t.trim().is_empty()) {
            Some(token) => Credentials::Token(token),
            None => Credentials::None,
        };
        Ok(Self { http, server, credentials, namespace: None })
    }

    /// Takes the bearer token from what `command` (run by `sh -c`) prints,
    /// instead of a fixed token.
    pub fn with_token_command(mut self, command: &str) -> Self {
        let current = tokio::sync::Mutex::new(None);
        self.credentials = Credentials::Command { command: command.to_owned(), current };
        self
    }

    /// Works in `namespace`: every request to a namespaced path (the
    /// server's [`NAMESPACED`](crate::http::openapi::NAMESPACED) list)
    /// names it.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// Whether lists span every namespace the caller sees (`-n '*'`).
    pub fn across(&self) -> bool {
        self.namespace.as_deref() == Some("*")
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// `path` with the client's namespace, where the path takes one.
    fn with_namespace(&self, path: &str) -> String {
        let Some(ns) = &self.namespace else { return path.to_owned() };
        let bare = path.split('?').next().unwrap_or(path);
        let namespaced = crate::http::openapi::NAMESPACED
            .iter()
            .any(|p| bare == *p || bare.strip_prefix(p).is_some_and(|r| r.starts_with('/')));
        if !namespaced || path.contains("namespace=") {
            return path.to_owned();
        }
        let joint = if path.contains('?') { '&' } else { '?' };
        format!("{path}{joint}namespace={ns}")
    }

    /// A request without credentials: [`dispatch`](Self::dispatch) adds them.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{}", self.server, self.with_namespace(path)))
    }

    /// `req` with the bearer token; `renew` runs the token command again.
    async fn authorize(&self, req: RequestBuilder, renew: bool) -> Result<RequestBuilder, CliError> {
        match &self.credentials {
            Credentials::None => Ok(req),
            Credentials::Token(token) => Ok(req.bearer_auth(token)),
            Credentials::Command { command, current } => {
                let mut current = current.lock().await;
                let token = match current.take() {
                    Some(token) if !renew => token,
                    _ => run_token_command(command).await?,
                };
                let req = req.bearer_auth(&token);
                *current = Some(token);
                Ok(req)
            }
        }
    }

    /// Sends `req` with the bearer token. When the server refuses a token
    /// the command printed, the command runs again and the request is sent
    /// once more with what it prints now.
    async fn dispatch(&self, req: RequestBuilder) -> Result<Response, CliError> {
        let again = match self.credentials {
            Credentials::Command { .. } => req.try_clone(),
            _ => None,
        };
        let res = self.authorize(req, false).await?.send().await.map_err(|e| self.unreachable(&e))?;
        match again {
            Some(again) if res.status() == StatusCode::UNAUTHORIZED => {
                self.authorize(again, true).await?.send().await.map_err(|e| self.unreachable(&e))
            }
            _ => Ok(res),
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> CliError {
        let reason = if e.is_timeout() { "the request timed out".to_owned() } else { error_chain(e) };
        CliError::Unreachable { server: self.server.clone(), reason }
    }

    /// Sends a request and answers its JSON body (`Null` when it has none).
    async fn send(&self, what: String, req: RequestBuilder) -> Result<Value, CliError> {
        let res = self.dispatch(req.timeout(REQUEST_TIMEOUT)).await?;
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
    /// POST with a JSON body, or none.
    pub async fn post<B: serde::Serialize + ?Sized>(&self, path: &str, body: Option<&B>) -> Result<Value, CliError> {
        let mut req = self.request(Method::POST, path);
        if let Some(body) = body {
            req = req.json(body);
        }
        self.send(format!("POST {path}"), req).await
    }

    /// POST without a body.
    pub async fn post_empty(&self, path: &str) -> Result<Value, CliError> {
        self.post::<Value>(path, None).await
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
        let res = self.dispatch(req).await?;
        let status = res.status();
        if !status.is_success() {
            let bytes = res.bytes().await.unwrap_or_default();
            return Err(CliError::Problem(problem_of(status, &bytes)));
        }
        Ok(res)
    }
}

/// Runs `--token-command` and answers the token it printed (trimmed).
async fn run_token_command(command: &str) -> Result<String, CliError> {
    let fail = |why: String| CliError::TokenCommand(why);
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c").arg(command).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(TOKEN_COMMAND_TIMEOUT, cmd.output())
        .await
        .map_err(|_| fail(format!("ran over {TOKEN_COMMAND_TIMEOUT:?} without printing a token")))?
        .map_err(|e| fail(format!("could not be run by sh: {e}")))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let said: String = said.trim().chars().take(500).collect();
        return Err(fail(format!(
            "failed ({}){}",
            out.status,
            if said.is_empty() { String::new() } else { format!(": {said}") }
        )));
    }
    let token = String::from_utf8(out.stdout).map_err(|_| fail("printed something that is not UTF-8".into()))?;
    match token.trim() {
        "" => Err(fail("printed no token".into())),
        token => Ok(token.to_owned()),
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
    fn the_namespace_goes_to_namespaced_paths_only() {
        let tls = TlsOptions { ca_cert: None, client_cert: None, client_key: None };
        let plain = Client::new("http://127.0.0.1:1", None, &tls).expect("a client");
        assert_eq!(plain.with_namespace("/v1/pools"), "/v1/pools");
        let c = plain.in_namespace("team-a");
        assert_eq!(c.with_namespace("/v1/pools"), "/v1/pools?namespace=team-a");
        assert_eq!(c.with_namespace("/v1/pools?limit=5"), "/v1/pools?limit=5&namespace=team-a");
        assert_eq!(c.with_namespace("/v1/upgrades/3/events"), "/v1/upgrades/3/events?namespace=team-a");
        assert_eq!(c.with_namespace("/v1/apply?dry_run=true"), "/v1/apply?dry_run=true&namespace=team-a");
        assert_eq!(c.with_namespace("/v1/engines"), "/v1/engines");
        assert_eq!(c.with_namespace("/v1/namespaces/team-a"), "/v1/namespaces/team-a");
        assert_eq!(c.with_namespace("/v1/poolsx"), "/v1/poolsx");
    }

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

    #[derive(Debug, serde::Deserialize, serde::Serialize)]
    struct View {
        name: String,
        inner: Vec<Inner>,
    }

    #[derive(Debug, serde::Deserialize, serde::Serialize)]
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
        #[derive(Debug, serde::Deserialize, serde::Serialize)]
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
        let plain = TlsOptions::default();
        assert!(
            Client::new("http://127.0.0.1:8080/", None, &plain).is_ok_and(|c| c.server() == "http://127.0.0.1:8080")
        );
        assert!(Client::new("https://x", None, &plain).is_ok());
        assert!(matches!(Client::new("127.0.0.1:8080", None, &plain), Err(CliError::Usage(_))));
        let missing = TlsOptions { ca_cert: Some("/nonexistent/ca.pem".into()), ..TlsOptions::default() };
        let err = Client::new("https://x", None, &missing).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("--ca-cert /nonexistent/ca.pem"), "{err}");
    }
}
