//! The caller a request's token names: what the token cache hands out and
//! the handlers read.

use crate::domain::role::Role;

/// The authenticated caller, put in the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}
