//! The scale body (the create body is [`super::super::named::CreatePool`]).

use utoipa::ToSchema;

/// Body of the scale endpoint.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// 0 to the server's maximum (default 1000).
    #[schema(minimum = 0, maximum = 1000)]
    pub replicas: i64,
}
