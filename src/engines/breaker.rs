//! Whether an engine takes new machines, and why not when it does not.
//!
//! Placement is a preference, never a reason to remove a machine: an engine
//! that is not placeable only gets no *new* machine. An engine is placeable
//! when it answers, is not draining, and its breaker is closed for the
//! image to run. The breaker opens when the engine accepts connections but
//! fails what placement asks of it (a create or a first start), so that one
//! broken host does not swallow every pool's new machines while the others
//! could take them. It stays open for a backoff that doubles with each
//! failure in a row; once the backoff has passed, the next placement is the
//! trial: a success closes the breaker, a failure opens it for longer.
//!
//! A missing image is the engine's problem only for that image (another
//! pool's image may be there), so it trips a breaker of its own per image.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The first backoff after a failure; it doubles with each failure in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest backoff: a broken engine is tried again at least this often.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Why an engine takes no new machine now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// Its machines move away; none goes there.
    Draining,
    /// It reaches the same Docker daemon as another engine, which keeps it.
    DuplicateDaemon,
    /// Its endpoint now reaches another Docker daemon than the one
    /// registered, until an admin confirms it.
    DaemonChanged,
    /// It has not answered yet since it was registered (or since drover
    /// started): what it holds is known only from the store.
    NotReached,
    /// It answered once and does not now.
    Unreachable,
    /// It answers, but its creates or starts failed: backed off.
    Failing,
}

impl Block {
    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::DuplicateDaemon => "duplicate_daemon",
            Self::DaemonChanged => "daemon_changed",
            Self::NotReached => "not_reached",
            Self::Unreachable => "unreachable",
            Self::Failing => "failing",
        }
    }
}

/// What a placement failure is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The engine itself: daemon errors, storage, a start that fails.
    Engine,
    /// One image is not on the engine (no registry can be reached).
    Image(String),
}

/// An open (or half-open) breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trip {
    /// Failures in a row.
    pub failures: u32,
    /// No placement before this; after it, the next one is a trial.
    pub until: DateTime<Utc>,
    /// The last failure, for status and events.
    pub error: String,
}

/// The breakers of one engine: its own and one per image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breaker {
    engine: Option<Trip>,
    images: BTreeMap<String, Trip>,
}

/// The backoff after `failures` failures in a row.
pub fn backoff(failures: u32) -> Duration {
    crate::domain::backoff::exponential(FIRST_BACKOFF, failures, MAX_BACKOFF)
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl Breaker {
    /// Records a failed placement; answers the trip when this failure
    /// opened the breaker (it was closed, or half-open after its backoff),
    /// `None` when it was open already (placements in flight when it
    /// opened fail too, and must not lengthen the backoff).
    pub fn failed(&mut self, scope: Scope, error: &str, now: DateTime<Utc>) -> Option<Trip> {
        let current = match &scope {
            Scope::Engine => self.engine.clone(),
            Scope::Image(image) => self.images.get(image).cloned(),
        };
        if current.as_ref().is_some_and(|t| now < t.until) {
            return None;
        }
        let failures = current.map_or(1, |t| t.failures.saturating_add(1));
        let trip = Trip { failures, until: after(now, backoff(failures)), error: error.to_owned() };
        match scope {
            Scope::Engine => self.engine = Some(trip.clone()),
            Scope::Image(image) => {
                self.images.insert(image, trip.clone());
            }
        }
        Some(trip)
    }

    /// Records a successful placement of `scope`; answers whether it closed
    /// a tripped breaker.
    pub fn succeeded(&mut self, scope: &Scope) -> bool {
        match scope {
            Scope::Engine => self.engine.take().is_some(),
            Scope::Image(image) => self.images.remove(image).is_some(),
        }
    }

    /// The engine's own breaker, open now.
    pub fn engine_open(&self, now: DateTime<Utc>) -> Option<&Trip> {
        self.engine.as_ref().filter(|t| now < t.until)
    }

    /// Why a machine of `image` may not be placed now, if it may not.
    pub fn open_for(&self, image: &str, now: DateTime<Utc>) -> Option<&Trip> {
        self.engine_open(now).or_else(|| self.images.get(image).filter(|t| now < t.until))
    }

    /// Images the engine refused, until one of them is placed there: backed
    /// off until their trip's `until`, and on trial after it.
    pub fn images(&self) -> impl Iterator<Item = (&str, &Trip)> {
        self.images.iter().map(|(i, t)| (i.as_str(), t))
    }

    /// The earliest moment a breaker open now for `image` becomes a trial.
    pub fn retry_at(&self, image: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.open_for(image, now).map(|_| {
            let engine = self.engine_open(now).map(|t| t.until);
            let image = self.images.get(image).filter(|t| now < t.until).map(|t| t.until);
            engine.into_iter().chain(image).max().unwrap_or(now)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    fn secs(s: i64) -> chrono::Duration {
        chrono::Duration::seconds(s)
    }

    #[test]
    fn blocks_read_as_the_api_writes_them() {
        let all = [
            Block::Draining,
            Block::DuplicateDaemon,
            Block::DaemonChanged,
            Block::NotReached,
            Block::Unreachable,
            Block::Failing,
        ];
        for b in all {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
    }

    #[test]
    fn the_backoff_doubles_from_five_seconds_to_five_minutes() {
        let got: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn a_failure_opens_the_engine_and_failures_while_open_do_not_lengthen_it() {
        let mut b = Breaker::default();
        let trip = b.failed(Scope::Engine, "storage full", t0()).expect("opened");
        assert_eq!((trip.failures, trip.until), (1, t0() + secs(5)));
        assert!(b.failed(Scope::Engine, "storage full", t0() + secs(1)).is_none(), "already open");
        assert_eq!(b.open_for("any:1", t0() + secs(4)).map(|t| t.error.as_str()), Some("storage full"));
        assert!(b.open_for("any:1", t0() + secs(5)).is_none(), "half-open: the next placement is a trial");
        let trip = b.failed(Scope::Engine, "still full", t0() + secs(6)).expect("the trial failed");
        assert_eq!((trip.failures, trip.until), (2, t0() + secs(16)));
        assert!(b.succeeded(&Scope::Engine));
        assert!(b.open_for("any:1", t0() + secs(7)).is_none(), "a success closes it");
        assert!(!b.succeeded(&Scope::Engine), "closed already");
    }

    #[test]
    fn a_missing_image_blocks_that_image_only() {
        let mut b = Breaker::default();
        b.failed(Scope::Image("app:2".into()), "image missing", t0()).expect("opened");
        assert!(b.open_for("app:2", t0()).is_some());
        assert!(b.open_for("app:1", t0()).is_none(), "another image still goes there");
        assert!(b.engine_open(t0()).is_none());
        assert_eq!(b.images().map(|(i, _)| i).collect::<Vec<_>>(), ["app:2"]);
        assert!(b.open_for("app:2", t0() + secs(5)).is_none(), "on trial");
        assert_eq!(b.images().count(), 1, "still shown until an app:2 machine is placed");
        assert_eq!(b.retry_at("app:2", t0()), Some(t0() + secs(5)));
        assert!(b.succeeded(&Scope::Image("app:2".into())));
        assert_eq!(b.images().count(), 0);
    }

    #[test]
    fn retry_is_when_every_breaker_in_the_way_has_passed() {
        let mut b = Breaker::default();
        b.failed(Scope::Image("app:2".into()), "missing", t0());
        b.failed(Scope::Engine, "daemon error", t0() + secs(3));
        assert_eq!(b.retry_at("app:2", t0() + secs(4)), Some(t0() + secs(8)));
        assert_eq!(b.retry_at("app:1", t0() + secs(4)), Some(t0() + secs(8)));
        assert_eq!(b.retry_at("app:1", t0() + secs(9)), None);
    }
}
