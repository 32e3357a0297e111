//! All integration tests, in one binary to keep link time low.

mod helpers;
mod openapi;
mod pools;
