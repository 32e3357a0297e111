//! Pools as an application: what the API asks of them, between the HTTP
//! handlers (which parse and answer) and the store.

pub mod service;
