//! Which Docker daemon an engine reaches. One daemon is one failure domain:
//! two engines reaching the same daemon would let a pool's spread put
//! "different" failure domains on one host, and an endpoint that now
//! reaches another daemon (a host rebuilt, an address reused) is not the
//! engine that was registered. Each engine keeps the daemon it is
//! registered as, what its endpoint reports now, and whether another
//! engine already holds that daemon; [`crate::engines::daemons`] decides
//! the latter and stores the former.

use super::Engine;

/// What drover knows of the daemon behind an engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The daemon the engine is registered as: learned at registration or
    /// at first contact, changed only by an admin's confirmation.
    pub registered: Option<String>,
    /// What the endpoint reported last.
    pub reported: Option<String>,
    /// Another engine that reaches the same daemon and keeps it.
    pub duplicate_of: Option<String>,
    /// The last news this replica has told of the daemon (in events), so
    /// that each is told once.
    pub told: Option<DaemonNews>,
}

/// What an engine's events say of its daemon, as things stand: each
/// different one is told once. Compared as a value, here and (serialized)
/// in the store's `engines.daemon_told`, never as the words of an event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DaemonNews {
    /// The endpoint reaches this daemon, as registered.
    Identified {
        daemon: String,
    },
    Mismatch(Mismatch),
}

impl DaemonNews {
    /// The form `engines.daemon_told` keeps.
    pub fn stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why an engine's daemon keeps it from taking new machines.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mismatch {
    /// The daemon is another engine's.
    Duplicate { of: String, daemon: String },
    /// The endpoint now reaches another daemon than the one registered.
    Changed { registered: String, reported: String },
}

impl Identity {
    pub fn mismatch(&self) -> Option<Mismatch> {
        if let (Some(of), Some(daemon)) = (&self.duplicate_of, &self.reported) {
            return Some(Mismatch::Duplicate { of: of.clone(), daemon: daemon.clone() });
        }
        match (&self.registered, &self.reported) {
            (Some(registered), Some(reported)) if registered != reported => {
                Some(Mismatch::Changed { registered: registered.clone(), reported: reported.clone() })
            }
            _ => None,
        }
    }
}

impl Identity {
    /// The news of its daemon, once the endpoint has reported one.
    pub fn news(&self) -> Option<DaemonNews> {
        let reported = self.reported.clone()?;
        Some(match self.mismatch() {
            Some(m) => DaemonNews::Mismatch(m),
            None => DaemonNews::Identified { daemon: reported },
        })
    }
}

impl Mismatch {
    /// For the engine's status and events.
    pub fn message(&self, engine: &str) -> String {
        match self {
            Self::Duplicate { of, daemon } => format!(
                "reaches the same Docker daemon as engine {of:?} (ID {daemon}): one daemon is one failure domain; \
                 remove one of the two"
            ),
            Self::Changed { registered, reported } => format!(
                "now reaches another Docker daemon (ID {reported}) than the one registered (ID {registered}); \
                 if that is intended, confirm it (POST /v1/engines/{engine}/confirm-identity)"
            ),
        }
    }
}

impl Engine {
    pub fn identity(&self) -> Identity {
        self.identity.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes what is known of the daemon: the daemons' check runs when
    /// the endpoint reports another, and pools are woken when whether the
    /// engine takes machines changes.
    pub fn set_identity(&self, change: impl FnOnce(&mut Identity)) {
        let (before, after) = {
            let mut identity = self.identity.lock().unwrap_or_else(|p| p.into_inner());
            let before = identity.clone();
            change(&mut identity);
            (before, identity.clone())
        };
        if before.reported != after.reported {
            self.identities.notify_one();
        }
        if before.mismatch() != after.mismatch() {
            self.wake_all();
        }
    }

    /// Asks the endpoint now which daemon answers there (for an engine not
    /// identified yet, whose informer has not asked so far); `None` when it
    /// does not answer within `within`.
    pub async fn ask_daemon(&self, within: std::time::Duration) -> Option<String> {
        let id = tokio::time::timeout(within, self.backend.daemon()).await.ok()?.ok()?.id;
        self.identified(id.clone());
        id
    }

    /// The endpoint answered as daemon `id`.
    pub(super) fn identified(&self, id: Option<String>) {
        if id.is_some() {
            self.set_identity(|i| i.reported = id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_news_of_a_daemon_is_a_value_whatever_an_event_says_of_it() {
        let mut identity = Identity { reported: Some("D1".into()), ..Identity::default() };
        assert_eq!(identity.news(), Some(DaemonNews::Identified { daemon: "D1".into() }));
        identity.registered = Some("D0".into());
        let changed = identity.news().expect("news");
        assert_eq!(changed, DaemonNews::Mismatch(Mismatch::Changed { registered: "D0".into(), reported: "D1".into() }));
        let stored = changed.stored();
        assert_eq!(serde_json::from_str::<DaemonNews>(&stored).ok(), Some(changed), "{stored}");
        assert!(!stored.contains("confirm"), "the store keeps the news, not an event's words: {stored}");
        assert_eq!(Identity::default().news(), None, "nothing reported, no news");
    }
}
