//! The `upgrade_components` table: one row per component of an upgrade
//! job, with what the runner observed of it and where it is.

use sqlx::{SqliteConnection, SqliteExecutor};

use crate::domain::upgrade::{Component, ComponentState};

/// The rows of a new job: every component pending, with its new image.
pub async fn insert_all(
    tx: &mut SqliteConnection,
    job_id: i64,
    components: &[Component],
    new_images: &[String],
) -> sqlx::Result<()> {
    for (position, (c, image)) in components.iter().zip(new_images).enumerate() {
        sqlx::query(
            "insert into upgrade_components (job_id, position, component, state, new_image) values (?, ?, ?, ?, ?)",
        )
        .bind(job_id)
        .bind(position as i64)
        .bind(c.as_str())
        .bind(ComponentState::Pending)
        .bind(image)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Components a job ended before reaching say so, rather than "pending".
pub async fn skip_pending(tx: &mut SqliteConnection, job_id: i64) -> sqlx::Result<()> {
    sqlx::query("update upgrade_components set state = ? where job_id = ? and state = ?")
        .bind(ComponentState::Skipped)
        .bind(job_id)
        .bind(ComponentState::Pending)
        .execute(tx)
        .await?;
    Ok(())
}

/// One component of a job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobComponent {
    pub position: i64,
    pub component: String,
    /// pending, upgrading, upgraded, rolled_back, cancelled, failed, skipped.
    /// A [`ComponentState`]'s text: a `String` while the API's view
    /// (src/http/upgrades.rs) takes it as one.
    pub state: String,
    pub old_pod: Option<String>,
    pub old_image: Option<String>,
    pub new_image: String,
    /// The real DaemonSet as step 0 read it, as JSON.
    pub original_daemonset: Option<String>,
}

pub async fn components(db: impl SqliteExecutor<'_>, id: i64) -> sqlx::Result<Vec<JobComponent>> {
    sqlx::query_as(
        "select position, component, state, old_pod, old_image, new_image, original_daemonset
         from upgrade_components where job_id = ? order by position",
    )
    .bind(id)
    .fetch_all(db)
    .await
}

/// What step 0 saw: the pod to be replaced and the spec to restore.
pub async fn save_observation(
    db: &mut SqliteConnection,
    id: i64,
    position: usize,
    old_pod: &str,
    old_image: Option<&str>,
    original_daemonset: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "update upgrade_components set old_pod = ?, old_image = ?, original_daemonset = ? where job_id = ? and position = ?",
    )
    .bind(old_pod)
    .bind(old_image)
    .bind(original_daemonset)
    .bind(id)
    .bind(position as i64)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn set_component_state(
    db: &mut SqliteConnection,
    id: i64,
    position: usize,
    state: ComponentState,
) -> sqlx::Result<()> {
    sqlx::query("update upgrade_components set state = ? where job_id = ? and position = ?")
        .bind(state)
        .bind(id)
        .bind(position as i64)
        .execute(db)
        .await?;
    Ok(())
}
