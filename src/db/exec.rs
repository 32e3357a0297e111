//! Where a statement runs: a pool of readers, or one connection (a write
//! transaction's), of either store. Every query is written once and run on
//! whichever store drover was started with, through [`on_store!`]; the few
//! statements whose SQL differs between SQLite and PostgreSQL (JSON paths,
//! date arithmetic, list parameters) pick theirs with [`Exec::dialect`].
//!
//! Parameters are written `$1`, `$2`, ... (both stores read that form),
//! flags `true`/`false`, and null-safe equality `is not distinct from`.

use sqlx::postgres::{PgConnection, PgPool, PgQueryResult};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteQueryResult};

/// Which store drover runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The SQL of this store, for a statement whose text differs.
    pub fn pick(self, sqlite: &'static str, postgres: &'static str) -> &'static str {
        match self {
            Self::Sqlite => sqlite,
            Self::Postgres => postgres,
        }
    }
}

/// An executor of either store: readers, or a transaction's connection.
pub enum Exec<'c> {
    SqlitePool(&'c SqlitePool),
    Sqlite(&'c mut SqliteConnection),
    PgPool(&'c PgPool),
    Pg(&'c mut PgConnection),
}

impl Exec<'_> {
    pub fn dialect(&self) -> Dialect {
        match self {
            Self::SqlitePool(_) | Self::Sqlite(_) => Dialect::Sqlite,
            Self::PgPool(_) | Self::Pg(_) => Dialect::Postgres,
        }
    }
}

/// The rows a statement changed, whichever store ran it: the one result
/// of `execute` both arms of [`on_store!`] can return.
pub trait Affected {
    fn affected(self) -> sqlx::Result<u64>;
}

impl Affected for sqlx::Result<SqliteQueryResult> {
    fn affected(self) -> sqlx::Result<u64> {
        self.map(|done| done.rows_affected())
    }
}

impl Affected for sqlx::Result<PgQueryResult> {
    fn affected(self) -> sqlx::Result<u64> {
        self.map(|done| done.rows_affected())
    }
}

/// `on_store!(exec, |e| body)` runs `body` with `e` bound to the executor
/// inside `exec`, whichever store it is: the body is compiled once per
/// store, so its binds and its rows are checked against each store's own
/// types. (Written like a closure so that rustfmt formats the body.)
macro_rules! on_store {
    ($exec:expr, |$e:ident| $body:expr) => {
        match $exec {
            $crate::db::exec::Exec::SqlitePool($e) => $body,
            $crate::db::exec::Exec::Sqlite($e) => $body,
            $crate::db::exec::Exec::PgPool($e) => $body,
            $crate::db::exec::Exec::Pg($e) => $body,
        }
    };
}

pub(crate) use on_store;
