//! A cluster as a client registers it: a name and either a kubeconfig, or a
//! server URL with a bearer token. Secrets come in here and are stored;
//! nothing shows them again.

use serde::Deserialize;
use utoipa::ToSchema;

use crate::domain::ValidationErrors;
use crate::domain::names::DnsLabel;
use crate::domain::server_url::redact_server_url;
use crate::k8s::Credentials;

/// A cluster to register: its name, and what `POST /v1/clusters` (beside
/// the name: `http::wire::named::CreateCluster`) and a `Cluster` document
/// of `drover apply` give.
pub struct NewCluster {
    pub name: DnsLabel,
    pub spec: ClusterSpecInput,
}

/// A cluster's registration without its name: the `spec` of a `Cluster`
/// document of `POST /v1/apply`, and beside a `name` the body of
/// `POST /v1/clusters`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpecInput {
    /// A kubeconfig document (YAML or JSON) with embedded data; file paths
    /// and exec plugins are refused.
    pub kubeconfig: Option<String>,
    /// Context of `kubeconfig` to use; its current context by default.
    pub context: Option<String>,
    /// API server URL, `https://host:port` (or `http://` for tests). It is
    /// shown to every viewer, so it may hold no credential: a user name or
    /// password, or a query parameter such as `access_token`, is refused.
    #[schema(example = "https://10.0.0.1:6443")]
    pub server: Option<String>,
    /// Bearer token, with `server`. It is sent in an HTTP header, so it may
    /// not contain control characters (CR, LF, NUL, DEL).
    pub token: Option<String>,
    /// PEM CA certificate of the API server, with `server`.
    pub ca_certificate: Option<String>,
}

impl ClusterSpecInput {
    /// The registration of a cluster named `name`.
    pub fn into_new(self, name: DnsLabel) -> NewCluster {
        NewCluster { name, spec: self }
    }
}

// Written by hand so that a derived Debug can never print a secret.
impl std::fmt::Debug for ClusterSpecInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self.server.as_deref().map(redact_server_url);
        f.debug_struct("ClusterSpecInput").field("server", &server).finish_non_exhaustive()
    }
}

// Written by hand so that a derived Debug can never print a secret.
impl std::fmt::Debug for NewCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewCluster").field("name", &self.name).field("spec", &self.spec).finish()
    }
}

impl NewCluster {
    /// The cluster's name and credentials, every broken rule reported.
    pub(super) fn parse(self) -> Result<(String, Credentials), ValidationErrors> {
        let NewCluster { name, spec: body } = self;
        let mut errs = ValidationErrors::default();
        let creds = match (body.kubeconfig, body.server) {
            (Some(kubeconfig), None) => {
                for (field, set) in [("token", body.token.is_some()), ("ca_certificate", body.ca_certificate.is_some())]
                {
                    if set {
                        errs.push(field, "exclusive", "goes with server, not with kubeconfig");
                    }
                }
                Some(Credentials::Kubeconfig { kubeconfig, context: body.context })
            }
            (None, Some(server)) => match body.token {
                Some(token) => Some(Credentials::Token { server, token, ca_certificate: body.ca_certificate }),
                None => {
                    errs.push("token", "required", "is required with server");
                    None
                }
            },
            (Some(_), Some(_)) => {
                errs.push("kubeconfig", "exclusive", "give either kubeconfig or server, not both");
                None
            }
            (None, None) => {
                errs.push("kubeconfig", "required", "give a kubeconfig, or server and token");
                None
            }
        };
        match creds {
            Some(c) if errs.is_empty() => Ok((name.into_string(), c)),
            _ => Err(errs),
        }
    }
}
