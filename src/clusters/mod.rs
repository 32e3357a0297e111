//! Registered clusters as an application: what the API asks of them
//! beyond their rows.

pub mod service;
