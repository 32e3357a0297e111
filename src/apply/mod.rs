//! Declarative fleets: `POST /v1/apply` and `drover apply`. A set of
//! documents (pools, engines, clusters) is compared by the server with
//! what exists, and the difference is applied in one transaction, or only
//! shown (a dry run).
//!
//! - [`document`]: the documents, one object each, built on the API's own
//!   input types (a pool's `spec` is `PoolSpecInput`), and their checks.
//! - [`source`]: fleet files (YAML or JSON, several documents each) read
//!   into documents, within limits that refuse alias bombs and huge files
//!   with bounded memory and time.
//! - [`diff`]: the field-level difference of two JSON documents.
//! - [`plan`]: the planner, a pure function of what exists, who owns it and
//!   what was asked: per object create, update, delete, unchanged or
//!   conflict, with the role each change needs.
//! - [`schema`]: the JSON Schema of a fleet file, derived from the OpenAPI
//!   document's schemas (so a field added to pools appears there unasked).
//! - [`service`]: reads the world, plans, and executes a plan through the
//!   pools, engines and clusters services, in one transaction guarded by
//!   the apply set's revision.

pub mod diff;
pub mod document;
pub mod plan;
pub mod schema;
mod service;
pub mod source;

pub use service::{Applied, Apply, ApplyError, Request};
