//! The create body (a `name` beside the spec's fields) and the scale body.

use utoipa::ToSchema;

use crate::domain::pool::PoolSpecInput;

/// A DNS-1123 label (`domain::names::check_dns_label`).
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Body of `POST /v1/pools`: a `name` beside the spec's fields. Only its
/// schema exists; the handler splits the body into name and spec.
pub struct CreatePool;

impl utoipa::PartialSchema for CreatePool {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        // The spec's own schema plus `name`: an `allOf` of the two could
        // never validate, since the spec refuses unknown fields.
        let mut schema = <PoolSpecInput as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(obj)) = &mut schema {
            let name = ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("DNS-1123 label, at most 63 characters; unique"))
                .min_length(Some(1))
                .max_length(Some(63))
                .pattern(Some(DNS_LABEL_PATTERN))
                .examples(["workers"]);
            obj.properties.insert("name".into(), name.into());
            obj.required.insert(0, "name".into());
            obj.description = Some("A pool's name and spec".into());
        }
        schema
    }
}

impl ToSchema for CreatePool {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        <PoolSpecInput as ToSchema>::schemas(schemas);
    }
}

/// Body of the scale endpoint.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// 0 to the server's maximum (default 1000).
    #[schema(minimum = 0, maximum = 1000)]
    pub replicas: i64,
}
