//! Who may call, and with which role: drover's own bearer tokens, JWTs of
//! OIDC issuers, client certificates, and the role each route needs. The
//! audit trail of what callers did is [`crate::audit`].
//!
//! - [`gate`]: the middleware every request passes: who its credentials
//!   name, and whether they hold the route's role anywhere.
//! - [`authz`]: the one authorizer every service asks of every object:
//!   may this caller do this to that object, in its namespace.
//! - [`routes`]: the role each route needs (pure).
//! - [`caller`]: who a request's credentials named.
//! - [`secret`]: tokens as secrets (random, stored as hashes) and the
//!   first admin token of a new store.
//! - [`tokens`]: the tokens service (create, list, revoke) for the API.
//! - [`cache`]: every token in memory, so that authenticating reads no store.
//! - [`config`]: the access config (`--access-config`): OIDC issuers and
//!   client-certificate subjects, each with a role; [`rules`]: its
//!   claim-to-role rules and their matching (pure).
//! - [`reload`]: the access config in use, read again when its file
//!   changes.
//! - [`oidc`]: verifying a JWT against its issuer's keys, then the rules;
//!   [`keys`]: an issuer's keys, cached and refreshed; [`verdicts`]:
//!   tokens already verified, until they expire.

pub mod authz;
pub mod cache;
pub mod caller;
pub mod config;
pub mod gate;
pub mod keys;
pub mod oidc;
pub mod reload;
pub mod routes;
pub mod rules;
pub mod secret;
pub mod tokens;
pub mod verdicts;

pub use crate::domain::role::Role;
pub use authz::{Access, Action, Denied, Target, WorkedIn};
pub use caller::{Caller, ClientCertificate, Via};
pub use config::{AccessConfig, AccessConfigError, IssuerConfig};
pub use gate::{Gate, guard};
pub use oidc::{OidcError, Verifier};
pub use routes::required_role;
pub use rules::{ClaimRule, SubjectRule};
pub use secret::{bootstrap, hash_token, new_token, write_private};
