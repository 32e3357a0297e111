//! The documents of an apply: one object each, `kind`, `name` and `spec`.
//!
//! A document's `spec` is the very type the single-object API takes:
//! `PoolSpecInput` for a pool (`POST /v1/pools` without its name),
//! `EngineSpecInput` for an engine and `ClusterSpecInput` for a cluster
//! (their registration bodies without the name; tests keep each pair
//! equal). So a field added to pools is accepted, diffed and described in
//! the JSON Schema of fleet files without a change here.
//!
//! Checking a document runs the same rules as the single-object routes;
//! every broken rule is reported with the path of its field from the
//! request's root (`documents[3].spec.replicas`), so that the client can
//! name the file and document it came from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::clusters::{ClusterSpecInput, NewCluster};
use crate::domain::ValidationErrors;
use crate::domain::json;
use crate::domain::names::DnsLabel;
use crate::domain::object::Namespace;
use crate::domain::pool::{PoolSpec, PoolSpecInput, SpecLimits};
use crate::engines::EngineSpecInput;
use crate::engines::spec::{self as engine, EngineSpec};

/// The one `apiVersion` of fleet documents; leaving it out means this one.
pub const API_VERSION: &str = "drover.dev/v1";

/// Most documents one apply takes: a fleet of a few thousand pools, a
/// request well under the 1 MiB body limit; a larger fleet is split into
/// several apply sets, which also keeps each transaction short.
pub const MAX_DOCUMENTS: usize = 5_000;

/// The secret fields of each kind, as paths from the document's root. A
/// fleet file gives each as a reference (`{file: PATH}` or `{env: NAME}`),
/// never inline; the client reads it and sends the value; the server never
/// shows it, in a diff or anywhere else.
pub const SECRET_FIELDS: &[(Kind, &[&str])] = &[
    (Kind::Engine, &["spec", "tls", "cert"]),
    (Kind::Engine, &["spec", "tls", "key"]),
    (Kind::Engine, &["spec", "tls", "ca"]),
    (Kind::Cluster, &["spec", "kubeconfig"]),
    (Kind::Cluster, &["spec", "token"]),
    (Kind::Cluster, &["spec", "ca_certificate"]),
];

/// A secret of a fleet file, given by reference: the contents of a file
/// (a path relative to the fleet file that names it) or the value of an
/// environment variable of `drover apply`. Never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SecretRef {
    File {
        /// Path of a file holding the value.
        #[schema(min_length = 1)]
        file: String,
    },
    Env {
        /// Name of an environment variable holding the value.
        #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_]*$")]
        env: String,
    },
}

/// What a document describes. The order is the order of creation (a
/// pool may name a cluster and engines); deletions go the other way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub enum Kind {
    Cluster,
    Engine,
    Pool,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Cluster, Kind::Engine, Kind::Pool];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pool => "Pool",
            Self::Engine => "Engine",
            Self::Cluster => "Cluster",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `apiVersion`: `drover.dev/v1`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum ApiVersion {
    #[serde(rename = "drover.dev/v1")]
    V1,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum PoolKind {
    Pool,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum EngineKind {
    Engine,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum ClusterKind {
    Cluster,
}

/// A machine pool: its name and the spec `POST /v1/pools` takes beside it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolDocument {
    /// `drover.dev/v1`, the default.
    #[serde(rename = "apiVersion", default)]
    #[schema(inline)]
    pub api_version: Option<ApiVersion>,
    #[schema(inline)]
    pub kind: PoolKind,
    /// The namespace the object is in; must be the apply's (its `namespace`
    /// parameter), which is also the default.
    #[serde(default)]
    pub namespace: Option<Namespace>,
    /// DNS-1123 label; unique among pools.
    #[schema(example = "workers")]
    pub name: DnsLabel,
    pub spec: PoolSpecInput,
}

/// A Docker engine pools may use: its name and what `POST /v1/engines`
/// takes beside it. In a fleet file, its TLS identity is given by
/// reference (`{file: PATH}` or `{env: NAME}`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineDocument {
    /// `drover.dev/v1`, the default.
    #[serde(rename = "apiVersion", default)]
    #[schema(inline)]
    pub api_version: Option<ApiVersion>,
    #[schema(inline)]
    pub kind: EngineKind,
    /// DNS-1123 label; `local` is the server's own engine.
    #[schema(example = "host-b")]
    pub name: DnsLabel,
    pub spec: EngineSpecInput,
}

/// A Kubernetes cluster: its name and what `POST /v1/clusters` takes beside
/// it. In a fleet file, its credentials are given by reference.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterDocument {
    /// `drover.dev/v1`, the default.
    #[serde(rename = "apiVersion", default)]
    #[schema(inline)]
    pub api_version: Option<ApiVersion>,
    #[schema(inline)]
    pub kind: ClusterKind,
    /// The namespace the object is in; must be the apply's (its `namespace`
    /// parameter), which is also the default.
    #[serde(default)]
    pub namespace: Option<Namespace>,
    /// DNS-1123 label.
    #[schema(example = "prod")]
    pub name: DnsLabel,
    pub spec: ClusterSpecInput,
}

/// One document of an apply: a `Pool`, an `Engine` or a `Cluster`, told
/// apart by `kind`. Only its schema exists as a type: a document is read
/// by its `kind` first, so that its errors name its own fields.
pub struct ApplyDocument;

impl utoipa::PartialSchema for ApplyDocument {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{Discriminator, OneOfBuilder};
        let mut discriminator = Discriminator::new("kind");
        for kind in Kind::ALL {
            let target = format!("#/components/schemas/{}Document", kind.as_str());
            discriminator.mapping.insert(kind.as_str().to_owned(), target);
        }
        OneOfBuilder::new()
            .item(utoipa::openapi::Ref::from_schema_name("PoolDocument"))
            .item(utoipa::openapi::Ref::from_schema_name("EngineDocument"))
            .item(utoipa::openapi::Ref::from_schema_name("ClusterDocument"))
            .discriminator(Some(discriminator))
            .description(Some("A `Pool`, an `Engine` or a `Cluster`, told apart by `kind`"))
            .into()
    }
}

impl ToSchema for ApplyDocument {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        schemas.push(("PoolDocument".into(), <PoolDocument as utoipa::PartialSchema>::schema()));
        schemas.push(("EngineDocument".into(), <EngineDocument as utoipa::PartialSchema>::schema()));
        schemas.push(("ClusterDocument".into(), <ClusterDocument as utoipa::PartialSchema>::schema()));
        <PoolDocument as ToSchema>::schemas(schemas);
        <EngineDocument as ToSchema>::schemas(schemas);
        <ClusterDocument as ToSchema>::schemas(schemas);
    }
}

/// A document that passed its shape and its kind's rules.
#[derive(Debug)]
pub struct Checked {
    /// Its index in the request's `documents`.
    pub index: usize,
    pub name: String,
    pub object: Object,
}

/// The object a checked document asks for.
#[derive(Debug)]
pub enum Object {
    Pool(PoolSpec),
    Engine(EngineSpec),
    /// Credentials are checked by the clusters service (it builds a client
    /// from them), after the documents.
    Cluster(NewCluster),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Pool(_) => Kind::Pool,
            Self::Engine(_) => Kind::Engine,
            Self::Cluster(_) => Kind::Cluster,
        }
    }
}

/// What the rules of documents depend on: the server's settings.
pub struct Rules<'a> {
    /// The namespace the apply works in: a document naming another is refused.
    pub namespace: &'a Namespace,
    pub limits: &'a SpecLimits,
    /// The server runs simulated engines (`sim://` endpoints only).
    pub simulated_engines: bool,
}

/// `documents[3]`: where the errors of a document are reported.
pub fn at(index: usize) -> String {
    format!("documents[{index}]")
}

/// Moves every error of a document under `documents[index]`, and its spec's
/// under `documents[index].spec` (`name` stays beside `spec`).
pub fn under(index: usize, spec: bool, errs: ValidationErrors) -> ValidationErrors {
    let root = at(index);
    let moved = errs.0.into_iter().map(|mut e| {
        e.field = match (spec && e.field != "name", e.field.as_str()) {
            (_, "body") => root.clone(),
            (true, field) => format!("{root}.spec.{field}"),
            (false, field) => format!("{root}.{field}"),
        };
        e
    });
    ValidationErrors(moved.collect())
}

/// Checks every document and the set as a whole (no object named twice);
/// returns all of them, or every broken rule of every document.
pub fn check_all(documents: Vec<Value>, rules: &Rules<'_>) -> Result<Vec<Checked>, ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let mut checked = Vec::with_capacity(documents.len());
    let mut seen: BTreeMap<(Kind, String), usize> = BTreeMap::new();
    for (index, value) in documents.into_iter().enumerate() {
        match check(index, value, rules) {
            Ok(doc) => {
                let key = (doc.object.kind(), doc.name.clone());
                if let Some(first) = seen.insert(key, index) {
                    // Both documents get the error: each names where it is,
                    // in whatever numbering the client shows its people.
                    let why = format!(
                        "{} {:?} is named by more than one document; name each object once",
                        doc.object.kind(),
                        doc.name
                    );
                    for i in [first, index] {
                        errs.push(format!("{}.name", at(i)), "unique", &why);
                    }
                }
                checked.push(doc);
            }
            Err(more) => errs.0.extend(more.0),
        }
    }
    errs.into_result(checked)
}

/// One document, by its `kind`.
pub fn check(index: usize, value: Value, rules: &Rules<'_>) -> Result<Checked, ValidationErrors> {
    let kind = match value.get("kind") {
        _ if !value.is_object() => {
            return Err(ValidationErrors::single(at(index), "type", "a document must be an object (kind, name, spec)"));
        }
        None => {
            return Err(ValidationErrors::single(
                format!("{}.kind", at(index)),
                "required",
                "missing field `kind` (Pool, Engine or Cluster)",
            ));
        }
        Some(Value::String(s)) => Kind::parse(s).ok_or_else(|| {
            ValidationErrors::single(
                format!("{}.kind", at(index)),
                "kind",
                format!("unknown kind {:?}; one of Pool, Engine, Cluster", crate::telemetry::truncate(s, 64)),
            )
        })?,
        Some(_) => {
            return Err(ValidationErrors::single(format!("{}.kind", at(index)), "type", "must be a string"));
        }
    };
    let shape = |e: ValidationErrors| under(index, false, e);
    let (name, object) = match kind {
        Kind::Pool => {
            let doc: PoolDocument = json::document(value).map_err(shape)?;
            same_namespace(index, doc.namespace.as_ref(), rules)?;
            let spec = PoolSpec::parse(doc.spec, rules.limits).map_err(|e| under(index, true, e))?;
            (doc.name.into_string(), Object::Pool(spec))
        }
        Kind::Engine => {
            let doc: EngineDocument = json::document(value).map_err(shape)?;
            let name = doc.name.to_string();
            let spec = engine::validate(doc.spec.into_raw(doc.name), rules.simulated_engines)
                .map_err(|e| under(index, true, e))?;
            (name, Object::Engine(spec))
        }
        Kind::Cluster => {
            // Its name and credentials are checked by the clusters service,
            // which reports them under `spec` but for `name`.
            let doc: ClusterDocument = json::document(value).map_err(shape)?;
            same_namespace(index, doc.namespace.as_ref(), rules)?;
            (doc.name.to_string(), Object::Cluster(doc.spec.into_new(doc.name)))
        }
    };
    Ok(Checked { index, name, object })
}

/// A document's namespace, if it names one, is the apply's: an apply
/// works in one namespace, the one its caller's grants are checked in.
fn same_namespace(index: usize, namespace: Option<&Namespace>, rules: &Rules<'_>) -> Result<(), ValidationErrors> {
    match namespace {
        Some(ns) if ns != rules.namespace => Err(ValidationErrors::single(
            format!("{}.namespace", at(index)),
            "namespace_mismatch",
            format!(
                "this document is in namespace {ns:?} but the apply works in {:?}; apply each namespace's \
                 documents on their own (drover apply --namespace {ns})",
                rules.namespace.as_str()
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> (SpecLimits, bool) {
        (SpecLimits::unrestricted(), true)
    }

    fn errors(docs: Vec<Value>) -> Vec<(String, &'static str)> {
        let (limits, simulated_engines) = rules();
        let namespace = Namespace::default();
        let rules = Rules { namespace: &namespace, limits: &limits, simulated_engines };
        check_all(docs, &rules)
            .expect_err("accepted")
            .0
            .into_iter()
            .map(|e| (e.static_rule(), e.field))
            .map(|(r, f)| (f, r))
            .collect()
    }

    fn pool(name: &str, spec: Value) -> Value {
        json!({"kind": "Pool", "name": name, "spec": spec})
    }

    #[test]
    fn a_pool_document_takes_the_spec_the_api_takes() {
        let (limits, simulated_engines) = rules();
        let namespace = Namespace::default();
        let rules = Rules { namespace: &namespace, limits: &limits, simulated_engines };
        let doc = json!({"apiVersion": "drover.dev/v1", "kind": "Pool", "name": "web",
            "spec": {"replicas": 3, "version": "v1.29.2", "labels": {"team": "a"}}});
        let checked = check_all(vec![doc], &rules).expect("valid");
        let Object::Pool(spec) = &checked[0].object else { panic!("not a pool") };
        assert_eq!((checked[0].name.as_str(), spec.replicas()), ("web", 3));
    }

    #[test]
    fn every_error_names_its_document_and_field_path() {
        let got = errors(vec![
            pool("web", json!({"replicas": 3, "version": "v1.29.2"})),
            pool("bad-spec", json!({"replicas": -1, "version": "1.29"})),
            json!({"kind": "Pool", "name": "x", "spec": {"replicas": "three", "version": "v1.29.2"}}),
            json!({"kind": "Pool", "name": "y", "spec": {"replicas": 1, "version": "v1.29.2", "colour": "red"}}),
            json!({"kind": "Pool", "name": "z", "extra": 1, "spec": {"replicas": 1, "version": "v1.29.2"}}),
            json!({"kind": "Gadget", "name": "g"}),
            json!({"name": "nokind"}),
            json!(["not", "an", "object"]),
            json!({"apiVersion": "drover.dev/v2", "kind": "Pool", "name": "v", "spec": {"replicas": 1, "version": "v1.29.2"}}),
            pool("Bad_Name", json!({"replicas": 1, "version": "v1.29.2"})),
        ]);
        assert!(got.contains(&("documents[9].name".into(), "dns_label")), "{got:?}");
        assert!(got.iter().any(|(f, _)| f == "documents[1].spec.replicas"), "{got:?}");
        assert!(got.iter().any(|(f, _)| f == "documents[1].spec.version"), "{got:?}");
        assert!(got.contains(&("documents[2].spec.replicas".into(), "type")), "{got:?}");
        assert!(got.contains(&("documents[3].spec.colour".into(), "unknown_field")), "{got:?}");
        assert!(got.contains(&("documents[4].extra".into(), "unknown_field")), "{got:?}");
        assert!(got.contains(&("documents[5].kind".into(), "kind")), "{got:?}");
        assert!(got.contains(&("documents[6].kind".into(), "required")), "{got:?}");
        assert!(got.contains(&("documents[7]".into(), "type")), "{got:?}");
        assert!(got.contains(&("documents[8].apiVersion".into(), "type")), "{got:?}");
        assert!(!got.iter().any(|(f, _)| f.starts_with("documents[0]")), "the valid document has no error: {got:?}");
    }

    #[test]
    fn a_document_of_another_namespace_is_refused_and_an_engine_names_none() {
        let spec = json!({"replicas": 1, "version": "v1.29.2"});
        let got = errors(vec![
            json!({"kind": "Pool", "name": "web", "namespace": "default", "spec": spec}),
            json!({"kind": "Pool", "name": "api", "namespace": "team-b", "spec": spec}),
            json!({"kind": "Engine", "name": "host-b", "namespace": "default", "spec": {"endpoint": "sim://b"}}),
        ]);
        assert_eq!(
            got,
            [
                ("documents[1].namespace".to_owned(), "namespace_mismatch"),
                ("documents[2].namespace".to_owned(), "unknown_field")
            ]
        );
    }

    #[test]
    fn the_same_object_twice_is_refused_but_a_pool_and_an_engine_may_share_a_name() {
        let spec = json!({"replicas": 1, "version": "v1.29.2"});
        let got = errors(vec![
            pool("web", spec.clone()),
            json!({"kind": "Engine", "name": "web", "spec": {"endpoint": "sim://web"}}),
            pool("web", spec),
        ]);
        assert_eq!(got, [("documents[0].name".to_owned(), "unique"), ("documents[2].name".to_owned(), "unique")]);
    }

    #[test]
    fn engine_and_cluster_documents_use_their_registration_rules() {
        let got = errors(vec![
            json!({"kind": "Engine", "name": "local", "spec": {"endpoint": "ftp://x"}}),
            json!({"kind": "Cluster", "name": "prod", "spec": {"server": "https://10.0.0.1:6443"}}),
        ]);
        assert!(got.contains(&("documents[0].name".into(), "reserved_name")), "{got:?}");
        assert!(got.contains(&("documents[0].spec.endpoint".into(), "endpoint_scheme")), "{got:?}");
        // A cluster's credentials are checked by the clusters service; its shape here.
        assert!(!got.iter().any(|(f, _)| f.starts_with("documents[1]")), "{got:?}");
    }
}
