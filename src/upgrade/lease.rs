//! One runner's claim on one job. A job is claimed in one statement that
//! only takes a pending or running job nobody else holds; from then on,
//! every write of the job is made in a transaction that first proves the
//! claim still stands ([`Lease::begin`]). A job that was cancelled before
//! it started, finished, or was taken over is therefore never written by
//! this runner again, and the runner stops before it touches the cluster.

use std::sync::Mutex;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::Claims;
use crate::db::{self, Db, upgrades::Job};
use crate::domain::event::{EventType, NewEvent};

/// Why a job's run stopped without ending the job.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("storing the job's progress failed")]
    Store(#[from] sqlx::Error),
    /// The job ended, was cancelled before it started, or another runner
    /// took it over: this runner must not write to it or touch the cluster.
    #[error("upgrade job {0} is no longer driven by this runner")]
    Lost(i64),
}

/// The claim of one runner on one job.
pub struct Lease {
    db: Db,
    pub job: i64,
    owner: String,
    /// How often the heartbeat is written while the runner only waits.
    heartbeat: Duration,
    /// When the heartbeat was last written, to write it only every `heartbeat`.
    last_beat: Mutex<Instant>,
}

/// What [`Lease::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub cancel_requested: bool,
}

impl Lease {
    /// Claims job `id` for `owner`, with the event that says so (started
    /// or resumed) in the same transaction. `None` when the job is not
    /// there to take: ended, cancelled, missing, or held by a live owner.
    pub async fn claim(db: &Db, id: i64, owner: &str, claims: Claims) -> Result<Option<(Lease, Job)>, sqlx::Error> {
        let stale = chrono::Duration::from_std(claims.stale_after).unwrap_or(chrono::Duration::MAX);
        let mut tx = db.begin_background().await?;
        let now = Utc::now();
        let Some((job, started)) = db::upgrades::claim(&mut tx, id, owner, now, now - stale).await? else {
            return Ok(None);
        };
        let message = if started {
            format!("upgrading to {}", job.version)
        } else {
            let c = job.components.get(job.component_index).map_or("?", |c| c.as_str());
            let step = job.step;
            match job.wind_down {
                Some(kind) => format!("resuming the {} of {c}", kind.as_str()),
                None => format!("resuming at step {} ({}) of {c}", step.number(), step.name()),
            }
        };
        let reason = if started { "Started" } else { "Resumed" };
        db::events::record(&mut tx, &NewEvent::job(id, EventType::Normal, reason, message), now).await?;
        tx.commit().await?;
        tracing::info!(job = id, owner, started, "upgrade job claimed");
        let lease = Lease {
            db: db.clone(),
            job: id,
            owner: owner.to_owned(),
            heartbeat: claims.heartbeat,
            last_beat: Mutex::new(Instant::now()),
        };
        Ok(Some((lease, job)))
    }

    /// A write transaction in which the claim is proven to stand (and the
    /// heartbeat refreshed) before anything else is written.
    pub async fn begin(&self) -> Result<db::WriteTx, JobError> {
        let mut tx = self.db.begin_background().await?;
        if !db::upgrades::touch(&mut tx, self.job, &self.owner, Utc::now()).await? {
            return Err(JobError::Lost(self.job));
        }
        self.beaten();
        Ok(tx)
    }

    fn beaten(&self) {
        *self.last_beat.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn beat_due(&self) -> bool {
        self.last_beat.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= self.heartbeat
    }

    /// Gives the job up, for a stop at a safe point: the next runner (the
    /// next start of drover) takes it without waiting for the claim to age.
    pub async fn release(&self) -> Result<(), JobError> {
        let mut tx = self.begin().await?;
        db::upgrades::release(&mut tx, self.job, &self.owner).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Between two looks at the cluster: is the claim still ours, and was
    /// a cancel asked for? Reads, and writes the heartbeat only when due.
    pub async fn check(&self) -> Result<Standing, JobError> {
        if self.beat_due() {
            self.begin().await?.commit().await?;
        }
        let claim = db::upgrades::claim_of(self.db.background(), self.job, &self.owner).await?;
        if !claim.held {
            return Err(JobError::Lost(self.job));
        }
        Ok(Standing { cancel_requested: claim.cancel_requested })
    }
}
