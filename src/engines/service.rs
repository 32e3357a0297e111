//! Engines as a resource: registering, draining and removing the Docker
//! engines pools may use, and bringing the registered ones up at start.
//! The store holds what was registered; [`EngineSet`] holds the live
//! clients, their informers and caches.
//!
//! A TLS identity is stored (write-only, like cluster credentials) and written, for the engine client, to files of mode 0600
//! under `<data dir>/engines/<name>/`, since the client reads them by path.

use crate::domain::names::DnsLabel;
use crate::engines::engine::identity::DaemonNews;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{Engine, EngineSet};
use crate::db::page::{Page, PageRequest};
use crate::db::{self, Db, engines::StoredEngine};
use crate::domain::ValidationErrors;
use crate::domain::event::{Event, EventType, NewEvent};
use crate::domain::object::ObjectRef;
use crate::engines::spec::{self, Endpoint as Address, RawEngine, Tls};
use crate::identity::{Access, Action, Target};
use crate::runtime::Backend;
use crate::runtime::docker::{DockerBackend, Endpoint};
use crate::runtime::simulated::SimulatedBackend;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("engine {0:?} is already registered")]
    Exists(String),
    #[error("no engine named {0:?}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "the Docker daemon at this endpoint (ID {daemon}) is already registered as {}; one daemon is one failure domain",
        other.as_deref().map(|o| format!("engine {o:?}")).unwrap_or_else(|| "another engine".into())
    )]
    SameDaemon { other: Option<String>, daemon: String },
    #[error(transparent)]
    Denied(#[from] crate::identity::Denied),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("writing the TLS identity of engine {name:?}: {source}")]
    Files {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// A TLS client identity for a `tcp://` engine: PEM documents. Write-only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsInput {
    /// Client certificate (PEM).
    pub cert: String,
    /// Client private key (PEM).
    pub key: String,
    /// CA certificate that signed the engine's server certificate (PEM).
    pub ca: String,
}

/// An engine's registration without its name: the `spec` of an `Engine`
/// document of `POST /v1/apply`, and beside a `name` the body of
/// `POST /v1/engines` (`http::wire::named::RegisterEngine`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineSpecInput {
    /// `unix:///path/docker.sock` or `tcp://host:port` (with `tls` unless
    /// the host is loopback). `ssh://` is not supported (see docs/engines.md).
    #[schema(example = "tcp://10.0.0.12:2376")]
    pub endpoint: String,
    /// Labels for pools' `engine_selector`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub tls: Option<TlsInput>,
}

impl EngineSpecInput {
    /// The registration of an engine named `name`, for its rules.
    pub fn into_raw(self, name: DnsLabel) -> RawEngine {
        let tls = self.tls.map(|t| Tls { cert: t.cert, key: t.key, ca: t.ca });
        RawEngine { name, endpoint: self.endpoint, labels: self.labels, tls }
    }
}

/// The engines service: the store's registrations and the live engines.
#[derive(Clone)]
pub struct Engines {
    pub db: Db,
    pub set: EngineSet,
    pub data_dir: PathBuf,
    /// The server runs simulated engines: `sim://` endpoints only.
    pub simulated: bool,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// An engine, and whether a TLS identity is registered for it (which is
/// never shown).
pub struct EngineInfo {
    pub engine: Arc<Engine>,
    pub tls: bool,
}

fn tls_dir(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("engines").join(name)
}

/// Writes the identity where the client reads it, owner-only.
fn write_tls(data_dir: &Path, name: &str, tls: &Tls) -> std::io::Result<(PathBuf, PathBuf, PathBuf)> {
    let dir = tls_dir(data_dir, name);
    std::fs::create_dir_all(&dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let mut paths = Vec::new();
    for (file, pem) in [("cert.pem", &tls.cert), ("key.pem", &tls.key), ("ca.pem", &tls.ca)] {
        let path = dir.join(file);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        std::io::Write::write_all(&mut options.open(&path)?, pem.as_bytes())?;
        paths.push(path);
    }
    let [cert, key, ca]: [PathBuf; 3] = paths.try_into().map_err(|_| std::io::Error::other("three files"))?;
    Ok((cert, key, ca))
}

/// The engine client for a registration.
fn backend(
    reg: &Engines,
    name: &str,
    address: &str,
    endpoint: &Address,
    tls: Option<&Tls>,
) -> Result<Backend, EngineError> {
    Ok(match (endpoint, tls) {
        (Address::Simulated, _) => Backend::Simulated(SimulatedBackend::at(address)),
        (Address::Tcp { .. }, Some(tls)) => {
            let files = |source| EngineError::Files { name: name.to_owned(), source };
            let (cert, key, ca) = write_tls(&reg.data_dir, name, tls).map_err(files)?;
            Backend::Docker(DockerBackend::new(Endpoint::Tls { address: address.to_owned(), key, cert, ca }))
        }
        _ => Backend::Docker(DockerBackend::new(Endpoint::Plain(address.to_owned()))),
    })
}

fn bring_up(reg: &Engines, stored: &StoredEngine) -> Result<Arc<Engine>, EngineError> {
    let name = DnsLabel::parse(&stored.name)
        .map_err(|e| EngineError::Invalid(crate::domain::ValidationErrors::single("name", "dns_label", e)))?;
    let raw = spec::RawEngine {
        name,
        endpoint: stored.endpoint.clone(),
        labels: stored.labels.clone(),
        tls: stored.tls.clone(),
    };
    let spec = spec::validate(raw, reg.simulated).map_err(EngineError::Invalid)?;
    let backend = backend(reg, &spec.name, &spec.address, &spec.endpoint, spec.tls.as_ref())?;
    let engine = reg.set.add(&spec.name, spec.labels.clone(), backend);
    engine.set_draining(stored.draining);
    engine.set_identity(|i| i.registered = stored.daemon_id.clone());
    Ok(engine)
}

/// How often a replica looks for engines registered, drained or removed
/// through another replica (PostgreSQL).
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

/// With several replicas: keeps this replica's live engines in step with
/// the store, so that an engine registered, drained or removed through any
/// replica is used, or not, by all of them within [`FOLLOW_EVERY`].
pub async fn follow(reg: Engines, cancel: tokio_util::sync::CancellationToken) {
    let mut refused = std::collections::HashSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        if let Err(e) = reg.sync(&mut refused).await {
            tracing::warn!(error = %crate::error::error_chain(&e), "reading the registered engines failed");
        }
    }
}

fn event(engine: &str, type_: EventType, reason: &'static str, message: String) -> NewEvent {
    NewEvent::engine(engine, type_, reason, message)
}

impl Engines {
    /// Adds every registered engine to the live set; one that cannot be
    /// brought up (a registration no longer valid for this server, files that
    /// cannot be written) is logged and left out, not fatal.
    pub async fn load(&self) -> Result<(), EngineError> {
        let reg = self;
        for stored in db::engines::list(reg.db.read()).await? {
            if let Err(e) = bring_up(reg, &stored) {
                tracing::error!(engine = %stored.name, error = %crate::error::error_chain(&e), "engine left out");
            }
        }
        Ok(())
    }

    /// Brings the live engines in line with the registrations: adds new
    /// ones, follows draining, drops removed ones. A registration that
    /// cannot be brought up is logged once (`refused`).
    async fn sync(&self, refused: &mut std::collections::HashSet<String>) -> Result<(), EngineError> {
        let stored = db::engines::list(self.db.background()).await?;
        for s in &stored {
            match self.set.get(&s.name) {
                Some(live) => {
                    if live.draining() != s.draining {
                        live.set_draining(s.draining);
                    }
                    if live.identity().registered != s.daemon_id {
                        // Confirmed, or first identified, through another replica.
                        live.set_identity(|i| i.registered = s.daemon_id.clone());
                    }
                }
                None => match bring_up(self, s) {
                    Ok(_) => tracing::info!(engine = %s.name, "engine registered through another replica"),
                    Err(e) if refused.insert(s.name.clone()) => {
                        tracing::error!(engine = %s.name, error = %crate::error::error_chain(&e), "engine left out");
                    }
                    Err(_) => {}
                },
            }
        }
        for live in self.set.all() {
            if live.name != spec::LOCAL && !stored.iter().any(|s| s.name == live.name) {
                self.set.remove(&live.name);
                self.metrics.forget_engine(&live.name);
                tracing::info!(engine = %live.name, "engine removed through another replica");
            }
        }
        Ok(())
    }

    /// The engine, with whether it has a TLS identity.
    pub async fn get(&self, access: &Access, name: &str) -> Result<EngineInfo, EngineError> {
        let engine = self.set.get(name);
        allow(access, Action::READ, name)?;
        let engine = engine.ok_or_else(|| EngineError::NotFound(name.to_owned()))?;
        Ok(EngineInfo { tls: self.with_tls().await?.contains(&engine.name), engine })
    }

    /// Names of the engines registered with a TLS identity.
    async fn with_tls(&self) -> Result<Vec<String>, EngineError> {
        Ok(db::engines::list(self.db.read()).await?.into_iter().filter(|e| e.tls.is_some()).map(|e| e.name).collect())
    }

    /// A page of engines in name order, `local` among them.
    pub async fn list(&self, access: &Access, req: &PageRequest) -> Result<Page<EngineInfo>, EngineError> {
        allow(access, Action::READ, "*")?;
        let with_tls = self.with_tls().await?;
        let after = req.after.clone().unwrap_or_default();
        let rows: Vec<EngineInfo> = self
            .set
            .all()
            .into_iter()
            .filter(|e| e.name > after)
            .take(req.fetch() as usize)
            .map(|engine| EngineInfo { tls: with_tls.contains(&engine.name), engine })
            .collect();
        Ok(Page::from_rows(rows, req.limit, |e| e.engine.name.clone()))
    }

    /// A page of the engine's events, newest first.
    pub async fn events(
        &self,
        access: &Access,
        name: &str,
        req: &PageRequest<i64>,
    ) -> Result<Page<Event>, EngineError> {
        let engine = self.set.get(name);
        allow(access, Action::READ, name)?;
        engine.ok_or_else(|| EngineError::NotFound(name.to_owned()))?;
        Ok(db::events::page(self.db.read(), &ObjectRef::Engine(name.to_owned()), req).await?)
    }

    /// Registers an engine and starts its informer. The daemon at its
    /// endpoint, when it answers, must not be registered already.
    #[tracing::instrument(name = "engines.register", skip_all)]
    pub async fn register(&self, access: &Access, raw: RawEngine) -> Result<EngineInfo, EngineError> {
        allow(access, Action::CHANGE, raw.name.as_str())?;
        let spec = spec::validate(raw, self.simulated).map_err(EngineError::Invalid)?;
        if self.set.get(&spec.name).is_some() {
            return Err(EngineError::Exists(spec.name));
        }
        let backend = backend(self, &spec.name, &spec.address, &spec.endpoint, spec.tls.as_ref())?;
        let (daemon, ()) = tokio::join!(self.identify(&spec.name, &backend), self.identify_live());
        let stored = self.store_registration(&spec, daemon.as_deref()).await;
        if let Err(e) = stored {
            // Nothing of a refused registration stays: its TLS identity neither.
            if spec.tls.is_some() {
                let _ = std::fs::remove_dir_all(tls_dir(&self.data_dir, &spec.name));
            }
            return Err(e);
        }
        tracing::info!(engine = %spec.name, address = %spec.address, daemon = ?daemon, "engine registered");
        let engine = self.set.add(&spec.name, spec.labels, backend);
        engine.set_identity(|i| {
            i.registered = daemon.clone();
            i.reported = daemon.clone();
            i.told = daemon.map(|daemon| DaemonNews::Identified { daemon });
        });
        Ok(EngineInfo { tls: spec.tls.is_some(), engine })
    }

    /// Stores a registration, refused when its daemon is another engine's.
    async fn store_registration(&self, spec: &spec::EngineSpec, daemon: Option<&str>) -> Result<(), EngineError> {
        if let Some(id) = daemon
            && let Some(other) = self.holder(id, &spec.name)
        {
            return Err(EngineError::SameDaemon { other: Some(other), daemon: id.to_owned() });
        }
        let mut tx = self.db.begin_write().await?;
        match self.insert_in(&mut tx, spec, daemon, None, crate::clock::wall()).await {
            Err(EngineError::SameDaemon { other: None, daemon }) => {
                drop(tx);
                Err(self.taken(&daemon).await)
            }
            Err(e) => Err(e),
            Ok(()) => Ok(tx.commit().await?),
        }
    }

    /// Stores a registration that passed its rules, with its event, in the
    /// caller's transaction; once it commits, [`Self::activate`] brings the
    /// engine up. `daemon` is the daemon its endpoint reached, if it
    /// answered (else it is identified at its first answer); `by` names
    /// who asked (an apply set), for the event.
    pub async fn insert_in(
        &self,
        tx: &mut db::WriteTx,
        spec: &spec::EngineSpec,
        daemon: Option<&str>,
        by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), EngineError> {
        if let Some(id) = daemon
            && let Some(other) = db::engines::holding_daemon(tx.exec(), id).await?
        {
            return Err(EngineError::SameDaemon { other: Some(other), daemon: id.to_owned() });
        }
        let told = daemon.map(|d| DaemonNews::Identified { daemon: d.to_owned() }.stored());
        let new = db::engines::NewEngine {
            name: &spec.name,
            endpoint: &spec.address,
            labels: &spec.labels,
            tls: spec.tls.as_ref(),
            daemon_id: daemon,
            daemon_told: told.as_deref(),
        };
        if let Err(e) = db::engines::insert(tx, &new, now).await {
            return Err(match e {
                e if db::engines::is_daemon_taken(&e) => {
                    EngineError::SameDaemon { other: None, daemon: daemon.unwrap_or_default().to_owned() }
                }
                sqlx::Error::Database(d) if d.is_unique_violation() => EngineError::Exists(spec.name.clone()),
                other => other.into(),
            });
        }
        let tls = if spec.tls.is_some() { " with TLS" } else { "" };
        let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let daemon = daemon.map(|d| format!(", Docker daemon {d}")).unwrap_or_default();
        let message = format!("registered at {}{tls}{daemon}{by}", spec.address);
        db::events::record(tx, &event(&spec.name, EventType::Normal, "Registered", message), now).await?;
        Ok(())
    }

    /// Brings up an engine whose registration was committed: its client
    /// (and TLS files) and informer.
    pub fn activate(&self, spec: spec::EngineSpec) -> Result<EngineInfo, EngineError> {
        let backend = backend(self, &spec.name, &spec.address, &spec.endpoint, spec.tls.as_ref())?;
        tracing::info!(engine = %spec.name, address = %spec.address, "engine registered");
        Ok(EngineInfo { tls: spec.tls.is_some(), engine: self.set.add(&spec.name, spec.labels, backend) })
    }

    /// Why the engine cannot be removed now, if it cannot: it holds
    /// machines and is not lost (drain it first).
    pub async fn held(&self, name: &str) -> Result<Option<String>, EngineError> {
        let Some(engine) = self.set.get(name) else { return Ok(None) };
        if engine.lost(crate::clock::wall()) {
            return Ok(None);
        }
        let mut held = db::engines::machines_on(self.db.read(), name, 10).await?;
        if held.is_empty() {
            held = engine.machine_names(10);
        }
        let total = engine.container_count().max(held.len());
        Ok((!held.is_empty()).then(|| {
            format!("it holds {total} machine(s) ({}); drain it first (POST /v1/engines/{name}/drain)", held.join(", "))
        }))
    }

    /// Starts (or stops) moving every machine off the engine.
    #[tracing::instrument(name = "engines.drain", skip_all)]
    pub async fn drain(&self, access: &Access, name: &str, on: bool) -> Result<EngineInfo, EngineError> {
        allow(access, Action::CHANGE, name)?;
        let reg = self;
        let engine = reg.set.get(name).ok_or_else(|| EngineError::NotFound(name.to_owned()))?;
        if name == spec::LOCAL {
            // The local engine is not stored; its draining lasts until restart.
            engine.set_draining(on);
        } else {
            let now = crate::clock::wall();
            let mut tx = reg.db.begin_write().await?;
            if !db::engines::set_draining(&mut tx, name, on, now).await? {
                return Err(EngineError::NotFound(name.to_owned()));
            }
            let (reason, what) = if on {
                ("Draining", "draining: its machines move to other engines")
            } else {
                ("Undrained", "no longer draining")
            };
            db::events::record(&mut tx, &event(name, EventType::Normal, reason, what.to_owned()), now).await?;
            tx.commit().await?;
            engine.set_draining(on);
        }
        let tls = self.with_tls().await?.contains(&engine.name);
        Ok(EngineInfo { engine, tls })
    }

    /// Forgets an engine that holds no machine, or one given up for lost (its
    /// host is gone for good, so its machines can neither be drained nor
    /// stopped): then its machines are forgotten with it, each pool records them
    /// as vanished on its next pass, and a pool being deleted can finish.
    #[tracing::instrument(name = "engines.remove", skip_all)]
    pub async fn remove(&self, access: &Access, name: &str) -> Result<(), EngineError> {
        allow(access, Action::CHANGE, name)?;
        let mut tx = self.db.begin_write().await?;
        let removed = self.remove_in(&mut tx, name).await?;
        tx.commit().await?;
        self.forget(removed);
        Ok(())
    }

    /// Deletes an engine's registration in the caller's transaction, by the
    /// rules of [`Self::remove`]; once it commits, [`Self::forget`] drops
    /// the live engine.
    pub async fn remove_in(&self, tx: &mut db::WriteTx, name: &str) -> Result<Removed, EngineError> {
        let reg = self;
        if name == spec::LOCAL {
            return Err(EngineError::Conflict(
                "`local` is the server's own engine (--docker-host); it cannot be removed, only drained".into(),
            ));
        }
        let engine = reg.set.get(name).ok_or_else(|| EngineError::NotFound(name.to_owned()))?;
        let lost = engine.lost(crate::clock::wall());
        let mut held = db::engines::machines_on(tx.exec(), name, 10).await?;
        if held.is_empty() {
            held = engine.machine_names(10);
        }
        let total = engine.container_count().max(held.len());
        if !held.is_empty() && !lost {
            return Err(EngineError::Conflict(format!(
                "engine {name:?} still holds {total} machine(s) ({}); drain it first (POST /v1/engines/{name}/drain) \
             and delete it once it is empty",
                held.join(", ")
            )));
        }
        if !db::engines::delete(tx, name).await? {
            return Err(EngineError::NotFound(name.to_owned()));
        }
        db::events::purge(tx, &ObjectRef::Engine(name.to_owned())).await?;
        Ok(Removed { engine, lost, machines: total })
    }

    /// Drops an engine whose removal was committed.
    pub fn forget(&self, removed: Removed) {
        let Removed { engine, lost, machines } = removed;
        let name = engine.name.clone();
        self.set.remove(&name);
        if lost {
            // Its machines' records now name an engine that is not there: each
            // pool's next pass drops them.
            engine.wake_all();
            tracing::warn!(engine = %name, machines, "lost engine removed; its machines are forgotten");
        }
        self.metrics.forget_engine(&name);
        let _ = std::fs::remove_dir_all(tls_dir(&self.data_dir, &name));
        tracing::info!(engine = %name, "engine removed");
    }
}

/// An engine whose registration a transaction deleted.
pub struct Removed {
    engine: Arc<Engine>,
    lost: bool,
    machines: usize,
}

/// Engines belong to no namespace: anyone with a grant somewhere sees
/// them, and only a `*` admin changes them.
fn allow(access: &Access, action: Action, name: &str) -> Result<(), EngineError> {
    Ok(access.may(action, &Target::global("engine", name))?)
}
