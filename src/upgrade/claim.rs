//! One runner's claim on one job. A job is claimed in one transaction that
//! only takes a pending or running job nobody else holds; from then on,
//! every write of the job is made in a transaction that first proves the
//! claim still stands ([`JobClaim::begin`]). A job that was cancelled before
//! it started, finished, or was taken over is therefore never written by
//! this runner again, and the runner stops before it touches the cluster.
//!
//! With several replicas (PostgreSQL) the claim is a lease like a pool's
//! ([`crate::replicas`]): its expiry is on the database's clock, its
//! token grows at each hand-over, the replica's keeper renews it, every
//! write proves holder and token in its transaction, and every Kubernetes
//! call first checks the lease's local deadline ([`JobClaim::fence`]). A
//! replica whose clock is off, or that was paused past the lease, neither
//! takes a live job nor goes on acting on one it lost. With SQLite (one
//! process) the claim is the job row's owner and heartbeat.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Claims;
use crate::db::{self, Db, upgrades::Job};
use crate::domain::event::{EventType, NewEvent};
use crate::replicas::{Fence, FenceError, Key, Leases};

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

impl JobError {
    /// Why job `id`'s fence refused a write.
    fn fenced(id: i64, e: FenceError) -> Self {
        match e {
            FenceError::Lost(lost) => {
                tracing::debug!(%lost, "upgrade job lease lost");
                Self::Lost(id)
            }
            FenceError::Store(e) => Self::Store(e),
        }
    }
}

/// The claim of one runner on one job.
pub struct JobClaim {
    db: Db,
    pub job: i64,
    owner: String,
    /// The job's lease (several replicas), or [`Fence::Sole`]: what every
    /// write proves and every Kubernetes call checks.
    pub fence: Fence,
    /// Where the lease is kept (several replicas): it is forgotten when
    /// the run ends.
    leases: Option<std::sync::Arc<Leases>>,
    /// How often the heartbeat is written while the runner only waits.
    heartbeat: Duration,
    /// When the heartbeat was last written, to write it only every `heartbeat`.
    last_beat: Mutex<Instant>,
}

/// What [`JobClaim::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub cancel_requested: bool,
}

impl JobClaim {
    /// Claims job `id` for `owner`, with the event that says so (started
    /// or resumed) in the same transaction. `None` when the job is not
    /// there to take: ended, cancelled, missing, or held by a live owner.
    pub async fn claim(
        db: &Db,
        leases: Option<&std::sync::Arc<Leases>>,
        id: i64,
        owner: &str,
        claims: Claims,
    ) -> Result<Option<(JobClaim, Job)>, sqlx::Error> {
        let mut tx = db.begin_background().await?;
        let now = crate::clock::wall();
        // With leases, holding the job's lease is the claim; otherwise an
        // owner whose heartbeat went stale gives the job up.
        let (taken, stale_before) = match leases {
            Some(leases) => match leases.claim_job(&mut tx, id).await? {
                Some(taken) => (Some(taken), None),
                None => return Ok(None),
            },
            None => {
                let stale = chrono::Duration::from_std(claims.stale_after).unwrap_or(chrono::Duration::MAX);
                (None, Some(now - stale))
            }
        };
        let Some((job, started)) = db::upgrades::claim(&mut tx, id, owner, now, stale_before).await? else {
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
        let fence = taken.map_or(Fence::Sole, |t| t.held());
        tracing::info!(job = id, owner, started, token = fence.token(), "upgrade job claimed");
        let lease = JobClaim {
            db: db.clone(),
            job: id,
            owner: owner.to_owned(),
            fence,
            leases: leases.cloned(),
            heartbeat: claims.heartbeat,
            last_beat: Mutex::new(Instant::now()),
        };
        Ok(Some((lease, job)))
    }

    /// A write transaction in which the claim is proven to stand (and the
    /// heartbeat refreshed) before anything else is written.
    pub async fn begin(&self) -> Result<db::WriteTx, JobError> {
        let mut tx = self.db.begin_background().await?;
        self.fence.prove(&mut tx).await.map_err(|e| JobError::fenced(self.job, e))?;
        if !db::upgrades::touch(&mut tx, self.job, &self.owner, crate::clock::wall()).await? {
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
        if let (Some(leases), Some(token)) = (&self.leases, self.fence.token()) {
            leases.give_up(&mut tx, &Key::job(self.job), token).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Between two looks at the cluster: is the claim still ours, and was
    /// a cancel asked for? Reads, and writes the heartbeat only when due.
    pub async fn check(&self) -> Result<Standing, JobError> {
        self.fence.check().map_err(|_| JobError::Lost(self.job))?;
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

impl Drop for JobClaim {
    /// The run is over: the keeper stops renewing the job's lease, which
    /// runs out unless [`JobClaim::release`] gave it up already.
    fn drop(&mut self) {
        if let (Some(leases), Some(token)) = (&self.leases, self.fence.token()) {
            leases.forget(&Key::job(self.job), token);
        }
    }
}
