//! The tokens, held in memory so that authenticating a request reads no
//! store at all.
//!
//! The map is keyed by the SHA-256 of each token, as the store is. Token
//! creation and revocation update it as soon as their transaction commits,
//! so a revoked token stops working on the next request; a reload from the
//! store every [`RELOAD_INTERVAL`] also picks up changes made outside the
//! API (a restored backup, an operator's `sqlite3`), which bounds how long
//! any revocation takes to one second.
//!
//! The time of each token's last use is kept here too and written to the
//! store in the background at most once per [`TOUCH_INTERVAL`], so that
//! reads never take SQLite's write lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::caller::{Caller, Via};
use crate::db::{self, Db};
use crate::domain::grant::Grants;

/// How often the map is rebuilt from the store.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// How stale a token's stored `last_used_at` may get.
pub const TOUCH_INTERVAL: Duration = Duration::from_secs(60);

struct Entry {
    name: String,
    grants: Grants,
    /// Unix seconds of the last use seen by this process; 0: none.
    used: AtomicI64,
    /// Unix seconds of the last use written to the store; 0: none.
    stored: AtomicI64,
}

#[derive(Default)]
pub struct TokenCache {
    by_hash: RwLock<HashMap<String, Arc<Entry>>>,
    /// Bumped by every insert and remove: a reload that read the store
    /// before one of them is stale and is dropped, so it can neither hide
    /// a new token nor bring back a revoked one.
    edits: AtomicU64,
}

impl TokenCache {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<Entry>>> {
        // The map is replaced whole or changed by one insert or remove, so a
        // panic elsewhere never leaves it half-written.
        self.by_hash.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Arc<Entry>>> {
        self.by_hash.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A cache holding every token in the store.
    pub async fn load(db: &Db) -> sqlx::Result<Self> {
        let cache = Self::default();
        cache.reload(db).await?;
        Ok(cache)
    }

    /// Replaces the map with the store's tokens, keeping the use times of
    /// tokens that are still there.
    pub async fn reload(&self, db: &Db) -> sqlx::Result<()> {
        let edits = self.edits.load(Ordering::Acquire);
        let rows = db::tokens::all(db).await?;
        let mut map = self.write();
        if self.edits.load(Ordering::Acquire) != edits {
            return Ok(());
        }
        let mut next = HashMap::with_capacity(rows.len());
        for row in rows {
            let stored = row.last_used_at.map_or(0, |t| t.timestamp());
            let entry = match map.remove(&row.hash) {
                Some(e) if e.name == row.name && e.grants == row.grants => e,
                _ => Arc::new(Entry {
                    name: row.name,
                    grants: row.grants,
                    used: AtomicI64::new(stored),
                    stored: AtomicI64::new(stored),
                }),
            };
            next.insert(row.hash, entry);
        }
        *map = next;
        Ok(())
    }

    /// The caller a token hash belongs to, stamping its use.
    pub fn lookup(&self, hash: &str, now: DateTime<Utc>) -> Option<Caller> {
        let map = self.read();
        let entry = map.get(hash)?;
        entry.used.fetch_max(now.timestamp(), Ordering::Relaxed);
        Some(Caller::with_grants(entry.name.clone(), entry.grants.clone()))
    }

    /// Adds a token whose creation has committed.
    pub fn insert(&self, name: &str, grants: &Grants, hash: &str) {
        let entry =
            Entry { name: name.to_owned(), grants: grants.clone(), used: AtomicI64::new(0), stored: AtomicI64::new(0) };
        let mut map = self.write();
        self.edits.fetch_add(1, Ordering::AcqRel);
        map.insert(hash.to_owned(), Arc::new(entry));
    }

    /// Forgets a token whose revocation has committed.
    pub fn remove(&self, name: &str) {
        let mut map = self.write();
        self.edits.fetch_add(1, Ordering::AcqRel);
        map.retain(|_, e| e.name != name);
    }

    /// Whether the token `name` still exists with grants that `allowed`:
    /// what a long-lived response asks from time to time.
    pub fn allows(&self, name: &str, allowed: impl Fn(&Grants) -> bool) -> bool {
        self.read().values().any(|e| e.name == name && allowed(&e.grants))
    }

    /// Whether `caller` may still act at `now` with grants that `allowed`:
    /// a revoked token, narrowed grants or an expired JWT end the event
    /// streams it opened.
    pub fn still_allows(&self, caller: &Caller, allowed: impl Fn(&Grants) -> bool, now: DateTime<Utc>) -> bool {
        match caller.via {
            Via::Token => self.allows(&caller.name, allowed),
            Via::Oidc { expires_at } => allowed(&caller.grants) && now.timestamp() < expires_at,
            Via::Certificate => allowed(&caller.grants),
        }
    }

    /// The last use of `name` seen by this process, if any.
    pub fn last_used(&self, name: &str) -> Option<DateTime<Utc>> {
        let map = self.read();
        let secs = map.values().find(|e| e.name == name)?.used.load(Ordering::Relaxed);
        (secs > 0).then(|| DateTime::from_timestamp(secs, 0)).flatten()
    }

    /// Writes the use times that moved by more than [`TOUCH_INTERVAL`] (or
    /// all that moved, with `all`) to the store.
    pub async fn store_use_times(&self, db: &Db, all: bool) -> sqlx::Result<()> {
        let min_step = if all { 1 } else { i64::try_from(TOUCH_INTERVAL.as_secs()).unwrap_or(60) };
        let due: Vec<(Arc<Entry>, i64)> = self
            .read()
            .values()
            .filter_map(|e| {
                let used = e.used.load(Ordering::Relaxed);
                (used - e.stored.load(Ordering::Relaxed) >= min_step).then(|| (Arc::clone(e), used))
            })
            .collect();
        for (entry, used) in due {
            let Some(at) = DateTime::from_timestamp(used, 0) else { continue };
            let mut tx = db.begin_background().await?;
            db::tokens::touch(&mut tx, &entry.name, at).await?;
            tx.commit().await?;
            entry.stored.store(used, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Keeps the cache in step with the store and writes use times, until
/// `cancel`; then writes the last use times once more.
pub async fn run(cache: Arc<TokenCache>, db: Db, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since_touch = Duration::ZERO;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = cache.reload(&db).await {
            tracing::warn!(error = %e, "could not reload the tokens; keeping the ones in memory");
        }
        since_touch += RELOAD_INTERVAL;
        if since_touch >= TOUCH_INTERVAL {
            since_touch = Duration::ZERO;
            if let Err(e) = cache.store_use_times(&db, false).await {
                tracing::debug!(error = %e, "could not stamp token use");
            }
        }
    }
    if let Err(e) = cache.store_use_times(&db, true).await {
        tracing::debug!(error = %e, "could not stamp token use at shutdown");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::role::Role;

    #[test]
    fn lookups_stamp_use_and_removal_is_immediate() {
        let cache = TokenCache::default();
        cache.insert("ci", &Grants::everywhere(Role::Operator), "h1");
        let now = crate::clock::wall();
        let caller = cache.lookup("h1", now).expect("known hash");
        assert_eq!((caller.name.as_str(), caller.grants.global_role()), ("ci", Some(Role::Operator)));
        assert_eq!(cache.last_used("ci").map(|t| t.timestamp()), Some(now.timestamp()));
        let at_least = |need| move |g: &Grants| g.global_role().is_some_and(|r| r >= need);
        assert!(cache.allows("ci", at_least(Role::Viewer)) && !cache.allows("ci", at_least(Role::Admin)));
        cache.remove("ci");
        assert!(cache.lookup("h1", now).is_none());
        assert!(!cache.allows("ci", at_least(Role::Viewer)));
    }
}
