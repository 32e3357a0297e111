//! Events: the append-only history of what drover did to each subject (a
//! pool, an upgrade job, an engine), and the notices that a subject
//! changed, which wake whoever follows it.
//!
//! - [`changes`]: "pool X / job Y changed", published by whoever commits a
//!   change, for the event streams and (through the other replicas) for a
//!   pool's driver.
//! - [`history`]: what an event stream reads of a subject's history.
//!
//! Every layer records events, so the event itself is a domain type
//! ([`crate::domain::event`]), written in the transaction of the change it
//! explains (its table: [`crate::db::events`]). What an engine's changes
//! are called is [`crate::engines::events`].

pub mod changes;
pub mod history;

pub use changes::{Changes, Subject, Watcher};
pub use history::Events;
