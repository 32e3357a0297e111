//! The tokens service: create a token (its secret shown once, stored as a
//! hash), list them, revoke one; and read the audit trail. Every change is
//! mirrored in the in-memory token cache, so authenticating reads no store.

use std::sync::Arc;

use chrono::Utc;

use super::cache::TokenCache;
use super::{Role, hash_token, new_token};
use crate::db::audit::AuditRecord;
use crate::db::page::{Page, PageRequest};
use crate::db::tokens::{DeleteOutcome, TokenInfo};
use crate::db::{self, Db};
use crate::domain::ValidationErrors;
use crate::domain::names::DnsLabel;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("a token named {0:?} already exists")]
    Exists(String),
    #[error("no token named {0:?}")]
    NotFound(String),
    #[error("{0:?} is the last admin token; create another admin token first")]
    LastAdmin(String),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

/// A token just created, with its secret: the only time it is seen.
pub struct Created {
    pub info: TokenInfo,
    pub secret: String,
}

#[derive(Clone)]
pub struct Tokens {
    db: Db,
    cache: Arc<TokenCache>,
}

impl Tokens {
    pub fn new(db: Db, cache: Arc<TokenCache>) -> Self {
        Self { db, cache }
    }

    pub async fn create(&self, name: &DnsLabel, role: Role) -> Result<Created, TokenError> {
        let secret = new_token();
        let hash = hash_token(&secret);
        let mut tx = self.db.begin_write().await?;
        let info = match db::tokens::insert(&mut tx, name, role.as_str(), &hash, Utc::now()).await {
            Ok(info) => info,
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                return Err(TokenError::Exists(name.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        tx.commit().await?;
        self.cache.insert(&info.name, role, &hash);
        tracing::info!(token = %name, role = role.as_str(), "token created");
        Ok(Created { info, secret })
    }

    /// Every token (names and roles; never the secrets).
    pub async fn list(&self) -> Result<Vec<TokenInfo>, TokenError> {
        let mut items = db::tokens::list(self.db.read()).await?;
        // Uses are stamped in memory and stored about once a minute.
        for t in &mut items {
            t.last_used_at = t.last_used_at.max(self.cache.last_used(&t.name));
        }
        Ok(items)
    }

    /// Revokes a token; the last admin token cannot be revoked.
    pub async fn delete(&self, name: &str) -> Result<(), TokenError> {
        let mut tx = self.db.begin_write().await?;
        match db::tokens::delete(&mut tx, name).await? {
            None => Err(TokenError::NotFound(name.to_owned())),
            Some(DeleteOutcome::LastAdmin) => Err(TokenError::LastAdmin(name.to_owned())),
            Some(DeleteOutcome::Deleted) => {
                tx.commit().await?;
                // The token stops working with the next request, on this server.
                self.cache.remove(name);
                Ok(())
            }
        }
    }

    /// A page of the audit trail, newest first.
    pub async fn audit(&self, req: &PageRequest<i64>) -> Result<Page<AuditRecord>, TokenError> {
        let rows = db::audit::page(self.db.read(), req.after, req.fetch()).await?;
        Ok(Page::from_rows(rows, req.limit, |a| a.id.to_string()))
    }
}
