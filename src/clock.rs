//! The time as the reconciler sees it: the system clock, or a clock a test
//! moves by hand, so that settling, backoff and deadlines are tested in
//! microseconds instead of against the wall clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

#[derive(Clone, Default)]
pub enum Clock {
    #[default]
    System,
    /// Stands still until `advance`d.
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

impl Clock {
    pub fn manual(start: DateTime<Utc>) -> Self {
        Self::Manual(Arc::new(Mutex::new(start)))
    }

    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Self::System => Utc::now(),
            Self::Manual(t) => *t.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Moves a manual clock forward; the system clock moves by itself.
    pub fn advance(&self, by: Duration) {
        if let Self::Manual(t) = self {
            let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
            *t += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::System => f.write_str("Clock::System"),
            Self::Manual(_) => write!(f, "Clock::Manual({})", self.now()),
        }
    }
}
