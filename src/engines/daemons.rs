//! One Docker daemon, one engine. Each engine's informer asks its endpoint
//! which daemon answers there (the `ID` of `GET /info`) whenever it
//! (re)connects; this module decides what that means:
//!
//! - at registration, an endpoint that reaches a daemon already registered
//!   (under another name, or as the built-in `local`) is refused, naming
//!   the engine that has it;
//! - an engine registered while it did not answer is registered as the
//!   daemon of its first answer, unless that daemon is another engine's:
//!   then it is a duplicate and takes no new machine ([`keepers`]);
//! - an engine whose endpoint reaches another daemon than the one it is
//!   registered as takes no new machine until an admin confirms the new
//!   one ([`Engines::confirm_identity`]).
//!
//! Each new report is told once in the engine's events, by whichever
//! replica records it first. `local` is not stored: it is registered as the
//! daemon of its first answer for as long as the server runs.

use super::engine::identity::DaemonNews;
use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::engine::identity::{Identity, Mismatch};
use super::service::{EngineError, EngineInfo, Engines};
use super::{Engine, spec};
use crate::db;
use crate::domain::event::{EventType, NewEvent};
use crate::identity::{Access, Action, Target};
use crate::runtime::Backend;

/// How long a registration waits to learn the daemon at its endpoint; an
/// engine that has not answered by then is registered anyway and
/// identified at its first answer.
const IDENTIFY_WITHIN: Duration = Duration::from_secs(5);

/// How often the daemons are checked besides each new report (a safety
/// net: reports wake the check at once).
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// What one engine says of its daemon, for [`keepers`].
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub engine: &'a str,
    /// The daemon its endpoint reports.
    pub reported: Option<&'a str>,
    /// The daemon it is registered as.
    pub registered: Option<&'a str>,
}

/// Engines whose endpoint reaches a daemon that another engine keeps:
/// duplicate → keeper. Of the engines that reach a daemon or are
/// registered as it, `local` keeps it, else the one registered as it (even
/// while it does not answer), else the first by name.
pub fn keepers<'a>(claims: &[Claim<'a>]) -> BTreeMap<String, String> {
    let mut by_daemon: BTreeMap<&str, Vec<&Claim<'a>>> = BTreeMap::new();
    for c in claims {
        let mut daemons = vec![c.reported, c.registered];
        daemons.dedup();
        for daemon in daemons.into_iter().flatten() {
            by_daemon.entry(daemon).or_default().push(c);
        }
    }
    let mut duplicates = BTreeMap::new();
    for (daemon, group) in by_daemon {
        let rank = |c: &&&Claim<'a>| (c.engine != spec::LOCAL, c.registered != Some(daemon), c.engine);
        let Some(keeper) = group.iter().min_by_key(rank) else { continue };
        for c in &group {
            if c.engine != keeper.engine && c.reported == Some(daemon) {
                duplicates.insert(c.engine.to_owned(), keeper.engine.to_owned());
            }
        }
    }
    duplicates
}

/// Checks the engines' daemons whenever an endpoint reports one, and every
/// [`CHECK_EVERY`], until `cancel`.
pub async fn watch(engines: Engines, cancel: CancellationToken) {
    let reports = engines.set.identities();
    loop {
        engines.check_daemons().await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = reports.notified() => {}
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

fn event(engine: &str, type_: EventType, reason: &'static str, message: String) -> NewEvent {
    NewEvent::engine(engine, type_, reason, message)
}

/// The event that tells an engine's daemon, as `identity` has it.
fn news_event(engine: &str, identity: &Identity, reported: &str) -> NewEvent {
    match identity.mismatch() {
        Some(m @ Mismatch::Duplicate { .. }) => event(engine, EventType::Warning, "DuplicateDaemon", m.message(engine)),
        Some(m @ Mismatch::Changed { .. }) => event(engine, EventType::Warning, "DaemonChanged", m.message(engine)),
        None => event(engine, EventType::Normal, "DaemonIdentified", format!("reaches Docker daemon {reported}")),
    }
}

impl Engines {
    /// The daemon that answers at a new engine's endpoint, if it answers
    /// within [`IDENTIFY_WITHIN`].
    pub(super) async fn identify(&self, name: &str, backend: &Backend) -> Option<String> {
        match tokio::time::timeout(IDENTIFY_WITHIN, backend.daemon()).await {
            Ok(Ok(daemon)) => daemon.id,
            Ok(Err(e)) => {
                tracing::info!(engine = name, error = %e, "a new engine does not answer; it is identified at its first answer");
                None
            }
            Err(_) => {
                tracing::info!(engine = name, "a new engine does not answer yet; it is identified at its first answer");
                None
            }
        }
    }

    /// Identifies the live engines whose informer has not yet (within
    /// [`IDENTIFY_WITHIN`]), so that a registration right after drover
    /// started is checked against them too.
    pub(super) async fn identify_live(&self) {
        let unknown: Vec<_> = self.set.all().into_iter().filter(|e| e.identity().reported.is_none()).collect();
        futures_util::future::join_all(unknown.iter().map(|e| e.ask_daemon(IDENTIFY_WITHIN))).await;
    }

    /// A live engine other than `except` that reaches, or is registered
    /// as, daemon `id`.
    pub(super) fn holder(&self, id: &str, except: &str) -> Option<String> {
        self.set.all().into_iter().find_map(|e| {
            let i = e.identity();
            (e.name != except && (i.reported.as_deref() == Some(id) || i.registered.as_deref() == Some(id)))
                .then(|| e.name.clone())
        })
    }

    /// The refusal of a daemon the store has registered as another engine
    /// (found after a unique violation, which does not say which).
    pub(super) async fn taken(&self, daemon: &str) -> EngineError {
        EngineError::SameDaemon { other: self.stored_holder(daemon).await, daemon: daemon.to_owned() }
    }

    /// The engine the store has registered as `daemon`, if it can say.
    async fn stored_holder(&self, daemon: &str) -> Option<String> {
        db::engines::holding_daemon(self.db.read(), daemon).await.ok().flatten()
    }

    /// Marks the duplicates, registers engines as the daemon of their first
    /// answer, and tells each engine's daemon news once. An engine whose
    /// check fails (the store) is checked again next time.
    pub async fn check_daemons(&self) {
        let live = self.set.all();
        let identities: Vec<Identity> = live.iter().map(|e| e.identity()).collect();
        let claims: Vec<Claim<'_>> = live
            .iter()
            .zip(&identities)
            .map(|(e, i)| Claim {
                engine: &e.name,
                reported: i.reported.as_deref(),
                registered: i.registered.as_deref(),
            })
            .collect();
        let duplicates = keepers(&claims);
        for (engine, mut identity) in live.iter().zip(identities.iter().cloned()) {
            identity.duplicate_of = duplicates.get(&engine.name).cloned();
            engine.set_identity(|i| i.duplicate_of = identity.duplicate_of.clone());
            if let Err(e) = self.settle(engine, identity).await {
                tracing::warn!(engine = %engine.name, error = %crate::error::error_chain(&e),
                    "checking the engine's daemon failed; trying again");
            }
        }
    }

    /// Registers `engine` as the daemon it reports when it is registered as
    /// none and is no duplicate, then tells its news unless that was told
    /// (by this replica or another). `identity` is the engine's as this
    /// check found it.
    async fn settle(&self, engine: &Engine, mut identity: Identity) -> Result<(), EngineError> {
        let Some(reported) = identity.reported.clone() else { return Ok(()) };
        let adopt = identity.registered.is_none() && identity.duplicate_of.is_none();
        if engine.name == spec::LOCAL {
            // Not stored: registered as its first daemon while the server
            // runs; that first one is no news, another one is.
            if adopt {
                identity.registered = Some(reported.clone());
            }
            let news = identity.news();
            if identity.told != news && identity.mismatch().is_some() {
                let mut tx = self.db.begin_write().await?;
                db::events::record(&mut tx, &news_event(&engine.name, &identity, &reported), crate::clock::wall())
                    .await?;
                tx.commit().await?;
            }
            engine.set_identity(|i| {
                i.registered = identity.registered;
                i.told = news;
            });
            return Ok(());
        }
        if adopt {
            let mut tx = self.db.begin_write().await?;
            match db::engines::adopt_daemon(&mut tx, &engine.name, &reported).await {
                Ok(_) => {
                    // Registered now, by this replica or another.
                    identity.registered = db::engines::registered_daemon(tx.exec(), &engine.name).await?;
                    tx.commit().await?;
                }
                Err(e) if db::engines::is_daemon_taken(&e) => {
                    // Registered as another engine through another replica.
                    drop(tx);
                    identity.duplicate_of = self.stored_holder(&reported).await;
                }
                Err(e) => return Err(e.into()),
            }
            engine.set_identity(|i| {
                i.registered = identity.registered.clone();
                i.duplicate_of = identity.duplicate_of.clone();
            });
        }
        let Some(news) = identity.news().filter(|news| identity.told.as_ref() != Some(news)) else { return Ok(()) };
        let now = crate::clock::wall();
        let mut tx = self.db.begin_write().await?;
        if db::engines::tell_daemon(&mut tx, &engine.name, &news.stored()).await? {
            db::events::record(&mut tx, &news_event(&engine.name, &identity, &reported), now).await?;
        }
        tx.commit().await?;
        engine.set_identity(|i| i.told = Some(news));
        Ok(())
    }

    /// Registers the engine as the daemon its endpoint reaches now (an
    /// admin's answer to `daemon_changed`), unless that daemon is another
    /// engine's. With several replicas, the daemon is the one that the
    /// replica taking the request reaches.
    pub async fn confirm_identity(&self, access: &Access, name: &str) -> Result<EngineInfo, EngineError> {
        access.may(Action::CHANGE, &Target::global("engine", name))?;
        let engine = self.set.get(name).ok_or_else(|| EngineError::NotFound(name.to_owned()))?;
        let identity = engine.identity();
        let Some(reported) = identity.reported.clone() else {
            return Err(EngineError::Conflict(format!(
                "engine {name:?} has not answered since it was registered or drover started: \
                 there is no daemon to confirm yet"
            )));
        };
        if let Some(other) = self.holder(&reported, name) {
            return Err(EngineError::SameDaemon { other: Some(other), daemon: reported });
        }
        let now = crate::clock::wall();
        let mut tx = self.db.begin_write().await?;
        let registered = match name {
            spec::LOCAL => identity.registered.clone(),
            _ => db::engines::registered_daemon(tx.exec(), name).await?,
        };
        if registered.as_ref() != Some(&reported) {
            if name != spec::LOCAL {
                let told = DaemonNews::Identified { daemon: reported.clone() }.stored();
                match db::engines::confirm_daemon(&mut tx, name, &reported, &told, now).await {
                    Ok(true) => {}
                    Ok(false) => return Err(EngineError::NotFound(name.to_owned())),
                    Err(e) if db::engines::is_daemon_taken(&e) => {
                        drop(tx);
                        return Err(self.taken(&reported).await);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let was = registered.as_deref().unwrap_or("none");
            let message = format!("an admin confirmed Docker daemon {reported} (registered before: {was})");
            db::events::record(&mut tx, &event(name, EventType::Normal, "DaemonConfirmed", message), now).await?;
            tracing::info!(engine = name, daemon = %reported, "engine's daemon confirmed");
        }
        tx.commit().await?;
        engine.set_identity(|i| {
            i.registered = Some(reported.clone());
            i.duplicate_of = None;
            i.told = Some(DaemonNews::Identified { daemon: reported.clone() });
        });
        self.get(access, name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(engine: &'a str, reported: Option<&'a str>, registered: Option<&'a str>) -> Claim<'a> {
        Claim { engine, reported, registered }
    }

    #[test]
    fn local_keeps_its_daemon_then_the_engine_registered_as_it_then_the_first_by_name() {
        let got = keepers(&[
            claim("b", Some("D1"), None),
            claim("local", Some("D1"), Some("D1")),
            claim("a", Some("D2"), None),
            claim("c", Some("D2"), Some("D2")),
            claim("x", Some("D3"), None),
            claim("w", Some("D3"), None),
            claim("alone", Some("D4"), None),
            claim("silent", None, None),
            claim("quiet", None, None),
        ]);
        let want: BTreeMap<String, String> =
            [("b", "local"), ("a", "c"), ("x", "w")].into_iter().map(|(d, k)| (d.to_owned(), k.to_owned())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_engine_registered_as_a_daemon_keeps_it_while_it_does_not_answer() {
        let got = keepers(&[claim("a", None, Some("D")), claim("b", Some("D"), None)]);
        assert_eq!(got.get("b").map(String::as_str), Some("a"));
        // An engine registered as a daemon and reaching another is no duplicate of the first.
        let got = keepers(&[claim("a", Some("E"), Some("D")), claim("b", Some("F"), None)]);
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn an_engine_that_moved_to_another_engines_daemon_is_the_duplicate() {
        // `a` was registered as D1 and now reaches D2, which `b` is registered as.
        let got = keepers(&[claim("a", Some("D2"), Some("D1")), claim("b", Some("D2"), Some("D2"))]);
        assert_eq!(got.get("a").map(String::as_str), Some("b"));
        assert_eq!(got.len(), 1);
    }
}
