//! `drover rollout ...`: a pool's rolling update: progress, pause and
//! resume (the pool's `paused`), rollback, and approving the next batch.

use clap::Subcommand;
use serde_json::{Value, json};

use super::args::WaitArgs;
use super::client::{CliError, Client};
use super::output::{OutputFormat, print_fields, print_json, text};
use super::pools::finish;

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
            let r = client.get(&format!("/v1/pools/{pool}/rollout")).await?;
            show_rollout(out, &r);
            Ok(())
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
            let r = client.post(&format!("/v1/pools/{pool}/rollout/continue"), None).await?;
            if wait.wait {
                return finish(client, out, &pool, r, wait, "rollout finished").await;
            }
            match out {
                OutputFormat::Json => print_json(&r),
                OutputFormat::Table => {
                    println!("next batch of pool {pool} approved (batch {})", text(&r["batch"], "approved_batches"))
                }
            }
            Ok(())
        }
    }
}

async fn set_paused(client: &Client, pool: &str, paused: bool) -> Result<Value, CliError> {
    client.merge_patch(&format!("/v1/pools/{pool}"), &json!({ "paused": paused })).await
}

fn show_rollout(out: OutputFormat, r: &Value) {
    if out == OutputFormat::Json {
        return print_json(r);
    }
    let c = &r["counts"];
    let eta = r["estimated_seconds_remaining"].as_f64().map(|s| format!("{s:.0} s")).unwrap_or_else(|| "-".into());
    print_fields(&[
        ("pool", text(r, "pool")),
        ("state", text(r, "state")),
        ("reason", text(r, "reason")),
        ("image", text(r, "desired_image")),
        ("revision", text(r, "revision")),
        (
            "machines",
            format!(
                "{} of {} updated and available ({} total, {} ready, {} outdated)",
                text(c, "updated_available"),
                text(r, "replicas"),
                text(c, "total"),
                text(c, "ready"),
                text(c, "outdated")
            ),
        ),
        ("remaining", text(r, "remaining")),
        ("eta", eta),
    ]);
}
