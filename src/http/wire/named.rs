//! The create bodies that are a `name` beside another type's fields:
//! `POST /v1/pools` (a pool's spec), `POST /v1/engines` (an engine's) and
//! `POST /v1/clusters` (a cluster's). The fields are the very type a
//! `drover apply` document's `spec` is, so the two cannot drift; only the
//! schema exists here (an `allOf` of the two could never validate, since
//! the spec refuses unknown fields), and handlers read such a body with
//! [`crate::domain::json::named`].

use std::borrow::Cow;
use std::marker::PhantomData;

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;

use crate::clusters::ClusterSpecInput;
use crate::domain::names::DnsLabel;
use crate::domain::pool::PoolSpecInput;
use crate::engines::EngineSpecInput;

/// How a body of `name` and `T`'s fields is called in the OpenAPI document.
pub trait NamedBody: utoipa::ToSchema {
    /// The schema's name (`CreatePool`).
    const SCHEMA: &'static str;
    /// What the body is, and what its name means.
    const DESCRIPTION: &'static str;
    const NAME: &'static str;
    const EXAMPLE: &'static str;
}

/// The schema of a body of `name` and `T`'s fields.
pub struct WithName<T>(PhantomData<T>);

impl<T: NamedBody> utoipa::PartialSchema for WithName<T> {
    fn schema() -> RefOr<Schema> {
        let mut schema = T::schema();
        if let RefOr::T(Schema::Object(obj)) = &mut schema {
            let mut name = DnsLabel::schema();
            if let RefOr::T(Schema::Object(name)) = &mut name {
                name.description = Some(T::NAME.into());
                name.examples = vec![T::EXAMPLE.into()];
            }
            obj.properties.insert("name".into(), name);
            obj.required.insert(0, "name".into());
            obj.description = Some(T::DESCRIPTION.into());
        }
        schema
    }
}

impl<T: NamedBody> utoipa::ToSchema for WithName<T> {
    fn name() -> Cow<'static, str> {
        T::SCHEMA.into()
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        T::schemas(schemas);
    }
}

impl NamedBody for PoolSpecInput {
    const SCHEMA: &'static str = "CreatePool";
    const DESCRIPTION: &'static str = "A pool's name and spec";
    const NAME: &'static str = "DNS-1123 label, at most 63 characters; unique";
    const EXAMPLE: &'static str = "workers";
}

impl NamedBody for EngineSpecInput {
    const SCHEMA: &'static str = "RegisterEngine";
    const DESCRIPTION: &'static str = "Body of `POST /v1/engines`: a name and where the engine is";
    const NAME: &'static str = "DNS-1123 label; `local` is the server's own engine";
    const EXAMPLE: &'static str = "host-b";
}

impl NamedBody for ClusterSpecInput {
    const SCHEMA: &'static str = "CreateCluster";
    const DESCRIPTION: &'static str = "Body of `POST /v1/clusters`: a name and either a kubeconfig, or a server URL \
        with a bearer token (and the CA certificate for `https`)";
    const NAME: &'static str = "DNS-1123 label; unique";
    const EXAMPLE: &'static str = "prod";
}

pub type CreatePool = WithName<PoolSpecInput>;
pub type RegisterEngine = WithName<EngineSpecInput>;
pub type CreateCluster = WithName<ClusterSpecInput>;
