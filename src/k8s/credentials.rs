//! Cluster credentials: what a user registers (a kubeconfig, or a server
//! URL with a bearer token and a CA certificate), how they are checked, and
//! how they become a `kube::Client`.
//!
//! Registration checks everything that would fail, or make the client
//! library panic, at use: a value that cannot travel in an HTTP header (a
//! token with CR, LF, NUL or DEL), settings drover does not support (a
//! proxy), certificates and keys that do not parse; and then builds the
//! client once. Building a client is fallible everywhere, and guarded
//! against panics, so credentials stored some other way fail a request or
//! a job with a reason, never the process.
//!
//! Credentials are write-only. `Debug` prints no secret, no API type holds
//! them, and errors about them never quote them.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};

/// How drover authenticates to a cluster; stored as JSON.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Credentials {
    /// A whole kubeconfig (YAML or JSON) with its data embedded.
    Kubeconfig {
        kubeconfig: String,
        /// The context to use; the kubeconfig's current context when absent.
        context: Option<String>,
    },
    /// An API server URL and a bearer token; the CA certificate (PEM) is
    /// needed for `https` servers whose certificate is not publicly trusted.
    Token { server: String, token: String, ca_certificate: Option<String> },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kubeconfig { context, .. } => {
                f.debug_struct("Kubeconfig").field("kubeconfig", &"<redacted>").field("context", context).finish()
            }
            Self::Token { server, ca_certificate, .. } => f
                .debug_struct("Token")
                .field("server", server)
                .field("token", &"<redacted>")
                .field("ca_certificate", &ca_certificate.as_ref().map(|_| "<set>"))
                .finish(),
        }
    }
}

/// Credentials that cannot be used. Messages name the field, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CredentialError {
    pub field: &'static str,
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> CredentialError {
    CredentialError { field, message: message.into() }
}

/// Fields that make a kubeconfig read files or run programs on drover's
/// host. A client-supplied kubeconfig must never do either.
fn refuse_host_access(kc: &Kubeconfig) -> Result<(), CredentialError> {
    let why = "reads a file on drover's host; embed the data (the *-data fields) instead";
    for c in kc.clusters.iter().filter_map(|c| c.cluster.as_ref()) {
        if c.certificate_authority.is_some() {
            return Err(bad("kubeconfig", format!("certificate-authority {why}")));
        }
    }
    for a in kc.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        if a.client_certificate.is_some() || a.client_key.is_some() || a.token_file.is_some() {
            return Err(bad("kubeconfig", format!("client-certificate, client-key or tokenFile {why}")));
        }
        if a.exec.is_some() || a.auth_provider.is_some() {
            return Err(bad(
                "kubeconfig",
                "exec and auth-provider plugins would run programs on drover's host; use a token or client certificate data",
            ));
        }
    }
    Ok(())
}

/// A value that goes into an HTTP header as is: no control characters
/// (CR, LF, NUL, ...) and no DEL. The client library panics on such a
/// bearer token, so it is refused here, where the field can be named.
fn header_safe(field: &'static str, what: &str, value: &str) -> Result<(), CredentialError> {
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(bad(
            field,
            format!(
                "{what} contains a control character (such as CR, LF, NUL or DEL), which cannot be sent in an HTTP header"
            ),
        ));
    }
    Ok(())
}

/// What kube would read from a kubeconfig and drover cannot use, or that
/// would break a request at use rather than now.
fn refuse_unusable(kc: &Kubeconfig) -> Result<(), CredentialError> {
    for named in &kc.clusters {
        let Some(c) = named.cluster.as_ref() else { continue };
        if c.proxy_url.is_some() {
            return Err(bad(
                "kubeconfig",
                format!(
                    "cluster {:?}: proxy-url is not supported; drover connects to the API server directly",
                    named.name
                ),
            ));
        }
        if let Some(server) = &c.server {
            header_safe("kubeconfig", &format!("cluster {:?}: server", named.name), server)?;
        }
    }
    for named in &kc.auth_infos {
        let Some(a) = named.auth_info.as_ref() else { continue };
        let user = format!("user {:?}", named.name);
        if a.token.is_some() {
            // The token is a SecretString; its serialized form is the one
            // way to read it without another dependency.
            let doc = serde_json::to_value(a).unwrap_or_default();
            let token = doc["token"].as_str().unwrap_or_default();
            header_safe("kubeconfig", &format!("{user}: token"), token)?;
            if token.trim().is_empty() {
                return Err(bad("kubeconfig", format!("{user}: token is empty")));
            }
        }
        if let Some(name) = &a.username {
            header_safe("kubeconfig", &format!("{user}: username"), name)?;
        }
        let impersonation =
            a.impersonate.iter().chain(a.impersonate_uid.iter()).chain(a.impersonate_groups.iter().flatten());
        for value in impersonation {
            header_safe("kubeconfig", &format!("{user}: impersonation"), value)?;
        }
        if a.impersonate_user_extra.is_some() {
            return Err(bad("kubeconfig", format!("{user}: impersonate-user-extra is not supported")));
        }
    }
    Ok(())
}

impl Credentials {
    /// The field a problem with the whole of these credentials is told on.
    fn main_field(&self) -> &'static str {
        if matches!(self, Self::Token { .. }) { "server" } else { "kubeconfig" }
    }

    /// The field a certificate problem is told on.
    fn tls_field(&self) -> &'static str {
        match self {
            Self::Token { ca_certificate: Some(_), .. } => "ca_certificate",
            Self::Token { .. } => "server",
            Self::Kubeconfig { .. } => "kubeconfig",
        }
    }

    /// The kubeconfig these credentials stand for. Token credentials are
    /// turned into a one-context kubeconfig, so both kinds take one path.
    fn kubeconfig(&self) -> Result<(Kubeconfig, KubeConfigOptions), CredentialError> {
        match self {
            Self::Kubeconfig { kubeconfig, context } => {
                // kube's parse errors quote the document; keep only the kind of failure.
                let kc = Kubeconfig::from_yaml(kubeconfig)
                    .map_err(|_| bad("kubeconfig", "is not a kubeconfig document (YAML or JSON)"))?;
                refuse_host_access(&kc)?;
                refuse_unusable(&kc)?;
                Ok((kc, KubeConfigOptions { context: context.clone(), ..Default::default() }))
            }
            Self::Token { server, token, ca_certificate } => {
                if token.trim().is_empty() {
                    return Err(bad("token", "must not be empty"));
                }
                header_safe("token", "the token", token)?;
                header_safe("server", "the server URL", server)?;
                let mut cluster = serde_json::json!({ "server": server });
                if let Some(ca) = ca_certificate {
                    if !ca.contains("-----BEGIN CERTIFICATE-----") {
                        return Err(bad("ca_certificate", "must be a PEM certificate (-----BEGIN CERTIFICATE-----)"));
                    }
                    cluster["certificate-authority-data"] = STANDARD.encode(ca).into();
                }
                let doc = serde_json::json!({
                    "clusters": [{ "name": "drover", "cluster": cluster }],
                    "users": [{ "name": "drover", "user": { "token": token } }],
                    "contexts": [{ "name": "drover", "context": { "cluster": "drover", "user": "drover" } }],
                    "current-context": "drover",
                });
                let kc = serde_json::from_value(doc).map_err(|e| bad("server", format!("cannot be used: {e}")))?;
                Ok((kc, KubeConfigOptions::default()))
            }
        }
    }

    /// A client configuration, with every secret loaded and checked.
    /// `timeout` bounds connecting; each call is bounded by the caller.
    pub async fn config(&self, timeout: Duration) -> Result<kube::Config, CredentialError> {
        let (kc, options) = self.kubeconfig()?;
        let field = self.main_field();
        let mut config = kube::Config::from_custom_kubeconfig(kc, &options).await.map_err(|e| {
            let field =
                if matches!(e, kube::config::KubeconfigError::ParseCertificates(_)) { self.tls_field() } else { field };
            bad(field, format!("cannot be used: {}", describe_kubeconfig_error(&e)))
        })?;
        match config.cluster_url.scheme_str() {
            Some("http") | Some("https") => {}
            _ => return Err(bad(field, "the server URL must start with http:// or https://")),
        }
        // drover retries with its own budget (a setting); kube's built-in
        // retry would multiply it.
        config.default_retry = false;
        config.connect_timeout = Some(timeout);
        Ok(config)
    }

    /// A client for these credentials. Never panics: what the client
    /// library would panic on is refused first, and a panic in it all the
    /// same is turned into an error.
    pub async fn client(&self, timeout: Duration) -> Result<kube::Client, CredentialError> {
        let config = self.config(timeout).await?;
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kube::Client::try_from(config)));
        match built {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(self.describe_client_error(&e)),
            Err(_) => Err(bad(self.main_field(), "the client library refused these credentials")),
        }
    }

    fn describe_client_error(&self, e: &kube::Error) -> CredentialError {
        match e {
            kube::Error::RustlsTls(_) => {
                bad(self.tls_field(), "a certificate or key cannot be used (not valid PEM/DER)")
            }
            kube::Error::ProxyProtocolDisabled { .. } | kube::Error::ProxyProtocolUnsupported { .. } => {
                bad(self.main_field(), "proxy-url is not supported; drover connects to the API server directly")
            }
            kube::Error::Auth(_) => bad(self.main_field(), "the user's credentials cannot be used"),
            _ => bad(self.main_field(), "cannot build a client from these credentials"),
        }
    }

    /// Everything registration checks: the credentials parse, every value
    /// can be sent, and a client can be built from them (no network is
    /// used). Answers the API server URL, which is not a secret.
    pub async fn validate(&self, timeout: Duration) -> Result<String, CredentialError> {
        let config = self.config(timeout).await?;
        let server = config.cluster_url.to_string().trim_end_matches('/').to_owned();
        self.client(timeout).await?;
        Ok(server)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kubeconfig { .. } => "kubeconfig",
            Self::Token { .. } => "token",
        }
    }
}

/// kube's kubeconfig errors, without anything that could quote a secret.
fn describe_kubeconfig_error(e: &kube::config::KubeconfigError) -> String {
    use kube::config::KubeconfigError as E;
    match e {
        E::CurrentContextNotSet => "no current-context and no context given".into(),
        E::LoadContext(name) => format!("context {name:?} is not defined"),
        E::LoadClusterOfContext(name) => format!("cluster {name:?} is not defined"),
        E::MissingClusterUrl => "the cluster has no server URL".into(),
        E::ParseClusterUrl(_) => "the server URL is not a valid URL".into(),
        E::ParseCertificates(_) => "the CA certificate is not valid PEM".into(),
        _ => "the kubeconfig could not be loaded".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "very-secret-token-123";

    #[test]
    fn debug_never_prints_secrets() {
        let token =
            Credentials::Token { server: "http://127.0.0.1:1".into(), token: SECRET.into(), ca_certificate: None };
        let kc = Credentials::Kubeconfig { kubeconfig: format!("token: {SECRET}"), context: None };
        for c in [token, kc] {
            let shown = format!("{c:?}");
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(shown.contains("<redacted>"));
        }
    }

    #[tokio::test]
    async fn token_credentials_build_a_plain_http_config() {
        let c =
            Credentials::Token { server: "http://127.0.0.1:6443".into(), token: SECRET.into(), ca_certificate: None };
        let config = c.config(Duration::from_secs(1)).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:6443/");
        assert!(!config.default_retry);
        assert_eq!(c.validate(Duration::from_secs(1)).await.unwrap(), "http://127.0.0.1:6443");
    }

    fn token(token: &str) -> Credentials {
        Credentials::Token { server: "http://127.0.0.1:6443".into(), token: token.into(), ca_certificate: None }
    }

    fn kubeconfig_with(cluster_extra: &str, user: &str) -> Credentials {
        let kubeconfig = format!(
            r#"{{"apiVersion": "v1", "kind": "Config",
  "clusters": [{{"name": "c", "cluster": {{"server": "http://127.0.0.1:6443"{cluster_extra}}}}}],
  "users": [{{"name": "u", "user": {user}}}],
  "contexts": [{{"name": "x", "context": {{"cluster": "c", "user": "u"}}}}],
  "current-context": "x"}}"#
        );
        Credentials::Kubeconfig { kubeconfig, context: None }
    }

    #[tokio::test]
    async fn header_unsafe_tokens_are_refused_naming_the_field_and_never_panic() {
        for bad_token in ["a\r\nInjected: 1", "nul\0byte", "del\u{7f}", "line\nfeed"] {
            let err = token(bad_token).validate(Duration::from_secs(1)).await.unwrap_err();
            assert_eq!(err.field, "token", "{bad_token:?}");
            assert!(err.message.contains("control character"), "{err}");
            assert!(!err.to_string().contains(bad_token), "the value is never quoted: {err}");
            // The client path refuses it too, without a panic.
            let refused = token(bad_token).client(Duration::from_secs(1)).await.err().map(|e| e.field);
            assert_eq!(refused, Some("token"));
        }
        let kc = kubeconfig_with("", r#"{"token": "abc\r\ndef"}"#);
        let Err(err) = kc.client(Duration::from_secs(1)).await else { panic!("a CR/LF token built a client") };
        assert_eq!(err.field, "kubeconfig");
        assert!(err.message.contains("user \"u\": token"), "{err}");
    }

    #[tokio::test]
    async fn unsupported_kubeconfig_fields_and_bad_pem_are_refused() {
        let proxy = kubeconfig_with(r#", "proxy-url": "http://proxy:3128""#, r#"{"token": "abc"}"#);
        let err = proxy.validate(Duration::from_secs(1)).await.unwrap_err();
        assert!(err.field == "kubeconfig" && err.message.contains("proxy-url"), "{err}");

        let impersonate = kubeconfig_with("", r#"{"token": "abc", "as": "admin\nX: y"}"#);
        assert_eq!(impersonate.validate(Duration::from_secs(1)).await.unwrap_err().field, "kubeconfig");

        let garbage = "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n";
        let ca = Credentials::Token {
            server: "https://127.0.0.1:6443".into(),
            token: "abc".into(),
            ca_certificate: Some(garbage.into()),
        };
        assert_eq!(ca.validate(Duration::from_secs(1)).await.unwrap_err().field, "ca_certificate");

        // Valid base64 that is no certificate: only building the client finds it.
        let not_der = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
        let ca = Credentials::Token {
            server: "https://127.0.0.1:6443".into(),
            token: "abc".into(),
            ca_certificate: Some(not_der.into()),
        };
        assert_eq!(ca.validate(Duration::from_secs(1)).await.unwrap_err().field, "ca_certificate");

        let key = kubeconfig_with("", r#"{"client-certificate-data": "bm9wZQ==", "client-key-data": "bm9wZQ=="}"#);
        assert_eq!(key.validate(Duration::from_secs(1)).await.unwrap_err().field, "kubeconfig");
    }

    #[tokio::test]
    async fn bad_credentials_name_the_field_without_quoting_it() {
        let cases = [
            (Credentials::Token { server: "http://x".into(), token: " ".into(), ca_certificate: None }, "token"),
            (
                Credentials::Token {
                    server: "http://x".into(),
                    token: SECRET.into(),
                    ca_certificate: Some("nope".into()),
                },
                "ca_certificate",
            ),
            (Credentials::Kubeconfig { kubeconfig: format!("[{SECRET}"), context: None }, "kubeconfig"),
        ];
        for (c, field) in cases {
            let err = c.config(Duration::from_secs(1)).await.unwrap_err();
            assert_eq!(err.field, field);
            assert!(!err.to_string().contains(SECRET), "{err}");
        }
    }

    #[tokio::test]
    async fn kubeconfigs_that_touch_the_host_are_refused() {
        let kubeconfig = r#"
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1", certificate-authority: /etc/passwd}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"#;
        let c = Credentials::Kubeconfig { kubeconfig: kubeconfig.into(), context: None };
        let err = c.config(Duration::from_secs(1)).await.unwrap_err();
        assert!(err.message.contains("certificate-authority"), "{err}");
    }
}
