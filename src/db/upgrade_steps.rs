//! The `upgrade_steps` table: the history of every step of every job,
//! one row per (component, step), with its attempts and its last end.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};

use crate::domain::upgrade::{Step, StepState};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StepRecord {
    pub position: i64,
    pub step: i64,
    pub name: String,
    pub state: StepState,
    pub attempts: i64,
    pub api_retries: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

pub async fn steps(db: Exec<'_>, id: i64) -> sqlx::Result<Vec<StepRecord>> {
    on_store!(db, |e| sqlx::query_as(
        "select position, step, name, state, attempts, api_retries, started_at, finished_at, error
         from upgrade_steps where job_id = $1 order by position, step",
    )
    .bind(id)
    .fetch_all(e)
    .await)
}

/// Marks a step running; a step started again (after a restart) counts one
/// more attempt and forgets its previous end.
pub async fn begin_step(
    db: &mut WriteTx,
    id: i64,
    position: usize,
    step: Step,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "insert into upgrade_steps (job_id, position, step, name, state, attempts, started_at)
         values ($1, $2, $3, $4, 'running', 1, $5)
         on conflict (job_id, position, step) do update set
            state = 'running', attempts = upgrade_steps.attempts + 1, finished_at = null, error = null",
    )
    .bind(id)
    .bind(position as i64)
    .bind(step.number())
    .bind(step.name())
    .bind(now)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

pub async fn end_step(
    db: &mut WriteTx,
    id: i64,
    position: usize,
    step: Step,
    error: Option<&str>,
    api_retries: u32,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update upgrade_steps set state = $1, error = $2, api_retries = api_retries + $3, finished_at = $4
         where job_id = $5 and position = $6 and step = $7",
    )
    .bind(if error.is_some() { StepState::Failed } else { StepState::Succeeded })
    .bind(error)
    .bind(i64::from(api_retries))
    .bind(now)
    .bind(id)
    .bind(position as i64)
    .bind(step.number())
    .execute(e)
    .await
    .affected())?;
    Ok(())
}
