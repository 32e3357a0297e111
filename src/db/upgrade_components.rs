//! The `upgrade_components` table: one row per component of an upgrade
//! job, with what the runner observed of it and where it is.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use crate::domain::upgrade::{Component, ComponentState, StepState};

/// The rows of a new job: every component pending, with its new image.
pub async fn insert_all(
    tx: &mut WriteTx,
    job_id: i64,
    components: &[Component],
    new_images: &[String],
) -> sqlx::Result<()> {
    for (position, (c, image)) in components.iter().zip(new_images).enumerate() {
        on_store!(tx.exec(), |e| {
            sqlx::query(
            "insert into upgrade_components (job_id, position, component, state, new_image) values ($1, $2, $3, $4, $5)",
        )
        .bind(job_id)
        .bind(position as i64)
        .bind(c.as_str())
        .bind(ComponentState::Pending)
        .bind(image)
        .execute(e).await.affected()
        })?;
    }
    Ok(())
}

/// Components a job ended before reaching say so, rather than "pending".
pub async fn skip_pending(tx: &mut WriteTx, job_id: i64) -> sqlx::Result<()> {
    on_store!(tx.exec(), |e| sqlx::query("update upgrade_components set state = $1 where job_id = $2 and state = $3")
        .bind(ComponentState::Skipped)
        .bind(job_id)
        .bind(ComponentState::Pending)
        .execute(e)
        .await
        .affected())?;
    Ok(())
}

/// One component of a job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobComponent {
    pub position: i64,
    pub component: Component,
    pub state: ComponentState,
    pub old_pod: Option<String>,
    pub old_image: Option<String>,
    pub new_image: String,
    /// The real DaemonSet as step 0 read it, as JSON.
    pub original_daemonset: Option<String>,
}

pub async fn components(db: Exec<'_>, id: i64) -> sqlx::Result<Vec<JobComponent>> {
    on_store!(db, |e| sqlx::query_as(
        "select position, component, state, old_pod, old_image, new_image, original_daemonset
         from upgrade_components where job_id = $1 order by position",
    )
    .bind(id)
    .fetch_all(e)
    .await)
}

/// What step 0 saw: the pod to be replaced and the spec to restore.
pub async fn save_observation(
    db: &mut WriteTx,
    id: i64,
    position: usize,
    old_pod: &str,
    old_image: Option<&str>,
    original_daemonset: &str,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| {
        sqlx::query(
        "update upgrade_components set old_pod = $1, old_image = $2, original_daemonset = $3 where job_id = $4 and position = $5",
    )
    .bind(old_pod)
    .bind(old_image)
    .bind(original_daemonset)
    .bind(id)
    .bind(position as i64)
    .execute(e).await.affected()
    })?;
    Ok(())
}

pub async fn set_component_state(
    db: &mut WriteTx,
    id: i64,
    position: usize,
    state: ComponentState,
) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update upgrade_components set state = $1 where job_id = $2 and position = $3"
    )
    .bind(state)
    .bind(id)
    .bind(position as i64)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// A component of a job with the history of its steps, in step order.
#[derive(Debug, Clone)]
pub struct ComponentSteps {
    pub component: JobComponent,
    pub steps: Vec<super::upgrade_steps::StepRecord>,
}

/// The components of jobs `ids`, each with its steps, by job id: one query
/// for a page of jobs, components joined with their steps.
pub async fn with_steps(
    db: Exec<'_>,
    ids: &[i64],
) -> sqlx::Result<std::collections::HashMap<i64, Vec<ComponentSteps>>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        job_id: i64,
        #[sqlx(flatten)]
        component: JobComponent,
        step: Option<i64>,
        name: Option<String>,
        step_state: Option<StepState>,
        attempts: Option<i64>,
        api_retries: Option<i64>,
        started_at: Option<DateTime<Utc>>,
        finished_at: Option<DateTime<Utc>>,
        error: Option<String>,
    }
    // The list is bound as one JSON array, which each store unpacks.
    let in_ids = db.dialect().pick(
        "c.job_id in (select value from json_each($1))",
        "c.job_id in (select jsonb_array_elements_text($1::jsonb)::bigint)",
    );
    let sql = format!(
        "select c.job_id, c.position, c.component, c.state, c.old_pod, c.old_image, c.new_image,
                c.original_daemonset, s.step, s.name, s.state as step_state, s.attempts, s.api_retries,
                s.started_at, s.finished_at, s.error
         from upgrade_components c
         left join upgrade_steps s on s.job_id = c.job_id and s.position = c.position
         where {in_ids}
         order by c.job_id, c.position, s.step"
    );
    let ids = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(e.into()))?;
    let rows: Vec<Row> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(sql)).bind(ids).fetch_all(e).await)?;
    let mut by_job: std::collections::HashMap<i64, Vec<ComponentSteps>> = std::collections::HashMap::new();
    for r in rows {
        let components = by_job.entry(r.job_id).or_default();
        if components.last().is_none_or(|c| c.component.position != r.component.position) {
            components.push(ComponentSteps { component: r.component.clone(), steps: Vec::new() });
        }
        let (Some(step), Some(name), Some(state), Some(started_at)) = (r.step, r.name, r.step_state, r.started_at)
        else {
            continue;
        };
        if let Some(c) = components.last_mut() {
            c.steps.push(super::upgrade_steps::StepRecord {
                position: r.component.position,
                step,
                name,
                state,
                attempts: r.attempts.unwrap_or(0),
                api_retries: r.api_retries.unwrap_or(0),
                started_at,
                finished_at: r.finished_at,
                error: r.error,
            });
        }
    }
    Ok(by_job)
}
