//! A cluster as a client registers it: a name and either a kubeconfig, or a
//! server URL with a bearer token. Secrets come in here and are stored;
//! nothing shows them again.

use serde::Deserialize;
use utoipa::ToSchema;

use crate::domain::ValidationErrors;
use crate::domain::names::check_dns_label;
use crate::domain::server_url::redact_server_url;
use crate::k8s::Credentials;

/// Body of `POST /v1/clusters`: a name and either a kubeconfig, or a server
/// URL with a bearer token (and the CA certificate for `https`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateCluster)]
pub struct NewCluster {
    /// DNS-1123 label; unique.
    #[schema(example = "prod")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length = 1, max_length = 63)]
    pub name: String,
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

/// A cluster's registration without its name: the `spec` of a `Cluster`
/// document of `POST /v1/apply`, field for field `CreateCluster` but `name`
/// (a test keeps the two equal).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpecInput {
    /// A kubeconfig document (YAML or JSON) with embedded data; file paths
    /// and exec plugins are refused.
    pub kubeconfig: Option<String>,
    /// Context of `kubeconfig` to use; its current context by default.
    pub context: Option<String>,
    /// API server URL, `https://host:port` (or `http://` for tests). It is
    /// shown to every viewer, so it may hold no credential.
    #[schema(example = "https://10.0.0.1:6443")]
    pub server: Option<String>,
    /// Bearer token, with `server`.
    pub token: Option<String>,
    /// PEM CA certificate of the API server, with `server`.
    pub ca_certificate: Option<String>,
}

impl ClusterSpecInput {
    /// The registration of a cluster named `name`.
    pub fn into_new(self, name: String) -> NewCluster {
        let ClusterSpecInput { kubeconfig, context, server, token, ca_certificate } = self;
        NewCluster { name, kubeconfig, context, server, token, ca_certificate }
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
        let server = self.server.as_deref().map(redact_server_url);
        f.debug_struct("NewCluster").field("name", &self.name).field("server", &server).finish_non_exhaustive()
    }
}

impl NewCluster {
    /// The cluster's name and credentials, every broken rule reported.
    pub(super) fn parse(self) -> Result<(String, Credentials), ValidationErrors> {
        let body = self;
        let mut errs = ValidationErrors::default();
        if let Err(e) = check_dns_label(&body.name) {
            errs.push("name", "dns_label", e);
        }
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
            Some(c) if errs.is_empty() => Ok((body.name, c)),
            _ => Err(errs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::json::schema_properties as properties;

    /// A cluster document's spec is the registration body but its name.
    #[test]
    fn the_registration_body_is_the_apply_spec_and_a_name() {
        let mut spec = properties::<ClusterSpecInput>();
        spec.push("name".into());
        spec.sort();
        assert_eq!(properties::<NewCluster>(), spec);
    }
}
