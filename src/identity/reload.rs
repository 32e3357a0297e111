//! The access config in use, read again whenever its file changes: OIDC
//! issuers and their rules, client-certificate subjects. Changing who may
//! do what takes no restart; each replica reads its own copy of the file
//! (a ConfigMap, a file management pushes), within `--access-reload-interval`
//! (1 s) of the change.
//!
//! A file that does not validate (unreadable, not JSON, an unknown field, a
//! broken rule) leaves the rules in use as they are: the error is logged
//! with the file and the field, and counted in
//! `drover_access_config_reloads_total{result="failed"}`, and the next
//! change is tried again. A new config's OIDC keys are fetched before it
//! takes over, and the verdicts of the old one (tokens already verified)
//! go with it, so a narrowed rule holds from the next request.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::AccessConfig;
use super::oidc::Verifier;

/// One version of the access config, with the verifier of its issuers.
pub struct Loaded {
    pub config: AccessConfig,
    /// `None` when the config names no issuer.
    pub oidc: Option<Arc<Verifier>>,
    /// Ends the key refreshes of `oidc` once another version replaces it.
    refreshes: CancellationToken,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The access config in use, and its file.
pub struct AccessRules {
    path: PathBuf,
    /// Parent of every version's `refreshes`: cancelled when the watch ends.
    root: CancellationToken,
    current: RwLock<Arc<Loaded>>,
    /// The file's bytes when last read: what a change changes.
    seen: std::sync::Mutex<Vec<u8>>,
    reloads: Family<ResultLabels, Counter>,
}

impl AccessRules {
    /// Reads the file and its issuers' keys; a file that cannot be used is
    /// an error naming it (at start, that stops drover).
    pub async fn load(path: &Path) -> anyhow::Result<Self> {
        let root = CancellationToken::new();
        let bytes = tokio::fs::read(path).await.with_context(|| format!("reading {}", path.display()))?;
        let loaded = parse(path, &bytes, root.child_token()).await?;
        Ok(Self {
            path: path.to_owned(),
            root,
            current: RwLock::new(Arc::new(loaded)),
            seen: std::sync::Mutex::new(bytes),
            reloads: Family::default(),
        })
    }

    /// The version in use now.
    pub fn current(&self) -> Arc<Loaded> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Adds `drover_access_config_reloads_total{result}` to `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "drover_access_config_reloads",
            "Reloads of --access-config after its file changed: ok, or failed (the previous rules stay in use)",
            self.reloads.clone(),
        );
    }

    /// Starts keeping the version in use's keys fresh.
    pub fn keep_fresh(&self, tasks: &TaskTracker) {
        let current = self.current();
        if let Some(oidc) = &current.oidc {
            oidc.keep_fresh(tasks, &current.refreshes);
        }
    }

    /// Reads the file again if it changed; `Ok(true)` when a new version
    /// took over. On an error the version in use stays.
    async fn reload_if_changed(&self, tasks: &TaskTracker) -> anyhow::Result<bool> {
        let bytes = tokio::fs::read(&self.path).await.with_context(|| format!("reading {}", self.path.display()))?;
        if *self.seen.lock().unwrap_or_else(|p| p.into_inner()) == bytes {
            return Ok(false);
        }
        // Tried once per change: a broken file is not read again until it changes.
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = bytes.clone();
        let loaded = Arc::new(parse(&self.path, &bytes, self.root.child_token()).await?);
        if let Some(oidc) = &loaded.oidc {
            oidc.keep_fresh(tasks, &loaded.refreshes);
        }
        let old = std::mem::replace(&mut *self.current.write().unwrap_or_else(|p| p.into_inner()), loaded);
        old.refreshes.cancel();
        Ok(true)
    }
}

async fn parse(path: &Path, bytes: &[u8], refreshes: CancellationToken) -> anyhow::Result<Loaded> {
    let config = AccessConfig::from_bytes(path, bytes)?;
    let verifier =
        Verifier::start(&config).await.with_context(|| format!("loading the OIDC keys of {}", path.display()))?;
    tracing::info!(
        issuers = config.oidc_issuer.len(),
        subjects = config.mtls.len(),
        "access config {} loaded",
        path.display()
    );
    let oidc = (!verifier.is_empty()).then(|| Arc::new(verifier));
    Ok(Loaded { config, oidc, refreshes })
}

/// Reloads `rules` whenever its file changes, until `cancel`; then ends
/// the key refreshes of the version in use too.
pub async fn watch(rules: Arc<AccessRules>, every: Duration, tasks: TaskTracker, cancel: CancellationToken) {
    let _end_refreshes = rules.root.clone().drop_guard();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        match rules.reload_if_changed(&tasks).await {
            Ok(false) => {}
            Ok(true) => {
                rules.reloads.get_or_create(&ResultLabels { result: "ok" }).inc();
                tracing::info!(file = %rules.path.display(), "access config changed: the new rules are in use");
            }
            Err(e) => {
                rules.reloads.get_or_create(&ResultLabels { result: "failed" }).inc();
                tracing::error!(
                    file = %rules.path.display(),
                    error = %crate::error::error_chain(e.as_ref()),
                    "the changed access config cannot be used; the previous rules stay in use"
                );
            }
        }
    }
}
