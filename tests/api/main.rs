//! All integration tests, in one binary to keep link time low.

mod docker;
mod helpers;
mod openapi;
mod pools;
mod reconcile;
