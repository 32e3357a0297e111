//! Cluster credentials: what a user registers (a kubeconfig, or a server
//! URL with a bearer token and a CA certificate), how they are checked, and
//! how they become a `kube::Client`.
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

impl Credentials {
    /// The kubeconfig these credentials stand for. Token credentials are
    /// turned into a one-context kubeconfig, so both kinds take one path.
    fn kubeconfig(&self) -> Result<(Kubeconfig, KubeConfigOptions), CredentialError> {
        match self {
            Self::Kubeconfig { kubeconfig, context } => {
                // kube's parse errors quote the document; keep only the kind of failure.
                let kc = Kubeconfig::from_yaml(kubeconfig)
                    .map_err(|_| bad("kubeconfig", "is not a kubeconfig document (YAML or JSON)"))?;
                refuse_host_access(&kc)?;
                Ok((kc, KubeConfigOptions { context: context.clone(), ..Default::default() }))
            }
            Self::Token { server, token, ca_certificate } => {
                if token.trim().is_empty() {
                    return Err(bad("token", "must not be empty"));
                }
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
        let field = if matches!(self, Self::Token { .. }) { "server" } else { "kubeconfig" };
        let mut config = kube::Config::from_custom_kubeconfig(kc, &options)
            .await
            .map_err(|e| bad(field, format!("cannot be used: {}", describe_kubeconfig_error(&e))))?;
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

    /// A client for these credentials.
    pub async fn client(&self, timeout: Duration) -> Result<kube::Client, CredentialError> {
        let config = self.config(timeout).await?;
        kube::Client::try_from(config).map_err(|e| bad("credentials", format!("cannot build a client: {e}")))
    }

    /// The API server URL, which is not a secret.
    pub async fn server(&self, timeout: Duration) -> Result<String, CredentialError> {
        Ok(self.config(timeout).await?.cluster_url.to_string().trim_end_matches('/').to_owned())
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
        assert_eq!(c.server(Duration::from_secs(1)).await.unwrap(), "http://127.0.0.1:6443");
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
