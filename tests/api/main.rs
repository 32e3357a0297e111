//! All integration tests, in one binary to keep link time low.

mod docker;
mod helpers;
#[path = "../support/images.rs"]
mod images;
mod openapi;
mod pools;
mod reconcile;
mod rollouts;
