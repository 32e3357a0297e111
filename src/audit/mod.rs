//! The audit trail: what each authenticated change was, by whom, with
//! which outcome (read back through `GET /v1/audit`; the table is
//! [`crate::db::audit`]).
//!
//! - [`log`]: the writer of the records of authenticated changes, batched:
//!   each request answers only once its record is committed.
//! - [`refusals`]: requests without valid credentials, audited once per
//!   burst, so that nobody without a token can grow the store fast.

pub mod log;
pub mod refusals;
