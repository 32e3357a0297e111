//! `drover rollout ...`: a pool's rolling update: progress, pause and
//! resume (the pool's `paused`), rollback, and approving the next batch.

use clap::Subcommand;
use serde_json::{Value, json};

use super::args::WaitArgs;
use super::client::{CliError, Client};
use super::output::{OutputFormat, or_dash, print_fields, print_json, wire_name};
use super::pools::finish;
use crate::http::rollouts::RolloutView;

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Progress of the pool's current rollout.
    Status { pool: String },
    /// Hold the rollout (and scaling): sets the pool's `paused`.
    Pause { pool: String },
    /// Let the rollout go on.
    Resume {
        pool: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Return to an earlier revision's image (the previous one by default).
    Rollback {
        pool: String,
        /// Revision to return to; see `GET /v1/pools/{name}/revisions`.
        #[arg(long)]
        revision: Option<i64>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Approve the next batch of a rollout with batch approval.
    Continue {
        pool: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

pub async fn run(client: &Client, out: OutputFormat, cmd: RolloutCommand) -> Result<(), CliError> {
    match cmd {
        RolloutCommand::Status { pool } => {
            let path = format!("/v1/pools/{pool}/rollout");
            let r = client.get(&path).await?;
            show_rollout(out, &format!("GET {path}"), r)
        }
        RolloutCommand::Pause { pool } => {
            let p = set_paused(client, &pool, true).await?;
            let no_wait = WaitArgs { wait: false, timeout: Default::default() };
            finish(client, out, &pool, p, no_wait, "paused").await
        }
        RolloutCommand::Resume { pool, wait } => {
            let p = set_paused(client, &pool, false).await?;
            finish(client, out, &pool, p, wait, "resumed").await
        }
        RolloutCommand::Rollback { pool, revision, wait } => {
            let body = revision.map(|r| json!({ "revision": r }));
            let p = client.post(&format!("/v1/pools/{pool}/rollback"), body.as_ref()).await?;
            finish(client, out, &pool, p, wait, "rolling back").await
        }
        RolloutCommand::Continue { pool, wait } => {
            let path = format!("/v1/pools/{pool}/rollout/continue");
            let r = client.post_empty(&path).await?;
            if wait.wait {
                return finish(client, out, &pool, r, wait, "rollout finished").await;
            }
            if out == OutputFormat::Json {
                print_json(&r);
                return Ok(());
            }
            let r: RolloutView = Client::decode(&format!("POST {path}"), r)?;
            let batch = r.batch.map(|b| b.approved_batches);
            println!("next batch of pool {pool} approved (batch {})", or_dash(&batch));
            Ok(())
        }
    }
}

async fn set_paused(client: &Client, pool: &str, paused: bool) -> Result<Value, CliError> {
    client.merge_patch(&format!("/v1/pools/{pool}"), &json!({ "paused": paused })).await
}

fn show_rollout(out: OutputFormat, what: &str, answer: Value) -> Result<(), CliError> {
    if out == OutputFormat::Json {
        print_json(&answer);
        return Ok(());
    }
    let r: RolloutView = Client::decode(what, answer)?;
    let c = &r.counts;
    let eta = r.estimated_seconds_remaining.map(|s| format!("{s:.0} s")).unwrap_or_else(|| "-".into());
    print_fields(&[
        ("pool", r.pool.clone()),
        ("state", wire_name(&r.state)),
        ("reason", or_dash(&r.reason)),
        ("image", r.desired_image.clone()),
        ("revision", r.revision.to_string()),
        (
            "machines",
            format!(
                "{} of {} updated and available ({} total, {} ready, {} outdated)",
                c.updated_available, r.replicas, c.total, c.ready, c.outdated
            ),
        ),
        ("remaining", r.remaining.to_string()),
        ("eta", eta),
    ]);
    Ok(())
}
