//! Who may call besides token holders: OIDC issuers whose JWTs map to a
//! role, and client certificates whose subject maps to a role. Both come
//! from one file, `--access-config` (JSON; its format is in
//! docs/access.md), read once at start: a file that cannot be read or
//! understood stops the start with the file named.
//!
//! - [`config`]: the file's shape and checks.
//! - [`rules`]: the claim-to-role rules and their matching (pure).
//! - [`oidc`]: verifying a JWT against its issuer's keys, then the rules.
//! - [`keys`]: an issuer's keys: discovery and JWKS, or a static file,
//!   cached and refreshed on an unknown key id at a bounded rate.
//! - [`verdicts`]: tokens already verified, until they expire.

pub mod config;
pub mod keys;
pub mod oidc;
pub mod rules;
pub mod verdicts;

pub use config::{AccessConfig, AccessConfigError, IssuerConfig};
pub use oidc::{OidcError, Verifier};
pub use rules::{ClaimRule, SubjectRule};
