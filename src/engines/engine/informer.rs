//! The informer that keeps an engine's cache current: it lists once, then
//! follows the event stream, and pings while the stream is quiet. When the
//! engine goes away it reconnects with capped exponential backoff and
//! jitter, one loop per engine; pools are woken once when the engine is
//! lost and once when it is back, not on every attempt.

use crate::domain::object::PoolRef;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::runtime::docker::{ContainerEvent, DockerBackend};
use crate::runtime::{Backend, RuntimeError, Wake};

/// How a quiet event stream is checked: the engine must answer a ping.
const PING_EVERY: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(15);

impl Engine {
    /// Keeps the cache current until `cancel` (the informer), and tells
    /// when the engine is given up for lost.
    pub async fn watch(&self, cancel: CancellationToken) {
        let informer = async {
            match &self.backend {
                Backend::Docker(docker) => self.inform(docker, &cancel).await,
                // A simulated engine's cache is the engine itself.
                Backend::Simulated(_) => cancel.cancelled().await,
            }
        };
        tokio::join!(informer, self.announce_lost(&cancel));
    }

    async fn inform(&self, docker: &DockerBackend, cancel: &CancellationToken) {
        // Failures since the engine last answered.
        let mut failures = 0;
        loop {
            let seen = self.health().last_seen;
            let broke = tokio::select! {
                _ = cancel.cancelled() => return,
                e = self.follow(docker) => e,
            };
            let answered = self.health().last_seen != seen;
            self.lost_contact(&broke);
            docker.reset().await;
            // It answered since the last failure: back off from the start.
            failures = if answered { 1 } else { failures + 1 };
            let wait = crate::domain::backoff::jittered(FIRST_RETRY, failures, MAX_RETRY);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Lists, then follows events until the engine stops answering.
    async fn follow(&self, docker: &DockerBackend) -> RuntimeError {
        // Subscribe from a second before the list, so that no change falls
        // between the two; replayed events only cause a fresh inspect.
        let since = crate::clock::wall().timestamp() - 1;
        let mut events = match docker.events(since).await {
            Ok(e) => Box::pin(e),
            Err(e) => return e,
        };
        // Which daemon answers, each time it comes back: the endpoint may
        // reach another host now.
        let daemon = match docker.daemon().await {
            Ok(d) => d,
            Err(e) => return e,
        };
        self.identified(daemon.id);
        let ticket = self.cache.ticket();
        let listed = match docker.list_all().await {
            Ok(l) => l.into_iter().filter(|c| self.owns(c)).collect(),
            Err(e) => return e,
        };
        for pool in self.cache.replace_all(listed, ticket) {
            self.wake(Some(pool));
        }
        self.reached(Some(daemon.version));
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = events.next() => match next {
                    Some(Ok(Some(ev))) => {
                        if let Err(e) = self.apply(docker, ev).await {
                            return e;
                        }
                        self.reached(None);
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return e,
                    None => return RuntimeError::Unavailable("the engine closed its event stream".into()),
                },
                _ = ping.tick() => {
                    if let Err(e) = docker.ping().await {
                        return e;
                    }
                    self.reached(None);
                }
            }
        }
    }

    async fn apply(&self, docker: &DockerBackend, ev: ContainerEvent) -> Result<(), RuntimeError> {
        let pool = if ev.destroyed { self.cache.remove(&ev.id) } else { self.refresh(docker, &ev.id).await? };
        self.wake(pool);
        Ok(())
    }

    /// Puts in the cache what the engine reports of container `id` now (or
    /// drops it, if the engine no longer has it); answers the pool it
    /// belongs to.
    pub(super) async fn refresh(&self, docker: &DockerBackend, id: &str) -> Result<Option<PoolRef>, RuntimeError> {
        let ticket = self.cache.ticket();
        Ok(match docker.inspect(id.to_owned()).await? {
            Some(c) if self.owns(&c) => self.cache.upsert_as_of(c, ticket),
            _ => self.cache.remove(id),
        })
    }

    pub(super) fn wake(&self, pool: Option<PoolRef>) {
        if let Some(pool) = pool {
            // Fails only once the worker has stopped.
            let _ = self.wakes.send(Wake::Pool(pool));
        }
    }
}
