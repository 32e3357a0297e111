//! `drover pools|machines|rollout|clusters|upgrade|engines ...`: a client for the
//! API, in the same binary as the server, for people at a terminal and for
//! CI steps.
//!
//! - [`client`]: the HTTP calls, bearer token, and errors (problem documents,
//!   unreachable servers) turned into messages and exit codes.
//! - [`output`]: tables for people, the server's JSON for scripts.
//! - [`wait`] and [`sse`]: `--wait`, following the server's event streams
//!   (or polling when a stream fails) until the work ends.
//! - [`pools`], [`rollout`], [`clusters`]: one module per command group.

pub mod client;
pub mod clusters;
pub mod engines;
pub mod output;
pub mod pools;
pub mod rollout;
pub mod sse;
pub mod wait;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::config::parse_duration;
use client::{CliError, Client};
use output::OutputFormat;

/// Exit codes of the client commands, so that scripts can tell a refused
/// request from work that failed or did not finish in time.
pub mod exit {
    /// The server refused the request, or could not be reached.
    pub const ERROR: u8 = 1;
    /// A bad command line (clap uses 2 for its own usage errors too).
    pub const USAGE: u8 = 2;
    /// `--wait`: the work failed (rollout stalled, upgrade failed or
    /// cancelled, pool deleted meanwhile).
    pub const FAILED: u8 = 3;
    /// `--wait`: `--timeout` passed before the work ended.
    pub const TIMEOUT: u8 = 4;
}

/// Settings every client command shares; accepted before or after the
/// subcommand.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// drover server the client commands talk to.
    #[arg(
        long,
        global = true,
        env = "DROVER_SERVER",
        default_value = "http://127.0.0.1:8080",
        help_heading = "Client options"
    )]
    pub server: String,

    /// Bearer token sent with every request (`Authorization: Bearer ...`).
    #[arg(long, global = true, env = "DROVER_TOKEN", hide_env_values = true, help_heading = "Client options")]
    pub token: Option<String>,

    /// `table` for people, `json` (the server's answer, pretty-printed) for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = OutputFormat::Table, help_heading = "Client options")]
    pub output: OutputFormat,
}

/// `--wait` and `--timeout`, for commands that start work.
#[derive(Debug, Clone, Copy, Args)]
pub struct WaitArgs {
    /// Block until the work finishes, showing progress; exit 3 if it fails, 4 on timeout.
    #[arg(long)]
    pub wait: bool,

    /// Longest `--wait` (e.g. 90s, 10m, 1h).
    #[arg(long, value_parser = parse_duration, default_value = "10m", requires = "wait")]
    pub timeout: Duration,
}

/// One page of a list: the server answers at most `--limit` items and a
/// cursor for the next page.
#[derive(Debug, Clone, Default, Args)]
pub struct PageArgs {
    /// Items per page, 1-500 (the server's default is 50).
    #[arg(long)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[arg(long)]
    pub cursor: Option<String>,
}

impl PageArgs {
    /// `path` with the paging parameters and `extra` ones as a query string.
    pub fn query(&self, path: &str) -> String {
        self.query_with(path, &[])
    }

    pub fn query_with(&self, path: &str, extra: &[(&str, Option<&str>)]) -> String {
        let limit = self.limit.map(|l| l.to_string());
        let params: Vec<String> = [("limit", limit.as_deref()), ("cursor", self.cursor.as_deref())]
            .iter()
            .chain(extra)
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
            .collect();
        if params.is_empty() { path.to_owned() } else { format!("{path}?{}", params.join("&")) }
    }
}

/// Everything but RFC 3986's unreserved characters is escaped in a query value.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

fn encode(v: &str) -> String {
    utf8_percent_encode(v, QUERY_VALUE).to_string()
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Machine pools: list, read, create, scale, change image, delete.
    #[command(subcommand)]
    Pools(pools::PoolsCommand),
    /// The machines of a pool.
    #[command(subcommand)]
    Machines(pools::MachinesCommand),
    /// Rollouts of a pool: progress, pause, resume, rollback, next batch.
    #[command(subcommand)]
    Rollout(rollout::RolloutCommand),
    /// Registered Kubernetes clusters.
    #[command(subcommand)]
    Clusters(clusters::ClustersCommand),
    /// Control-plane upgrade jobs.
    #[command(subcommand)]
    Upgrade(clusters::UpgradeCommand),
    /// Docker engines pools may use, each a failure domain.
    #[command(subcommand)]
    Engines(engines::EnginesCommand),
}

/// Runs one client command and answers the process's exit code; errors are
/// printed on standard error.
pub async fn run(args: ClientArgs, command: ClientCommand) -> ExitCode {
    match dispatch(&args, command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn dispatch(args: &ClientArgs, command: ClientCommand) -> Result<(), CliError> {
    let client = Client::new(&args.server, args.token.clone())?;
    let out = args.output;
    match command {
        ClientCommand::Pools(cmd) => pools::run_pools(&client, out, cmd).await,
        ClientCommand::Machines(cmd) => pools::run_machines(&client, out, cmd).await,
        ClientCommand::Rollout(cmd) => rollout::run(&client, out, cmd).await,
        ClientCommand::Clusters(cmd) => clusters::run_clusters(&client, out, cmd).await,
        ClientCommand::Upgrade(cmd) => clusters::run_upgrade(&client, out, cmd).await,
        ClientCommand::Engines(cmd) => engines::run(&client, out, cmd).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_queries_carry_only_what_was_given_and_encode_it() {
        let none = PageArgs::default();
        assert_eq!(none.query("/v1/pools"), "/v1/pools");
        let page = PageArgs { limit: Some(5), cursor: Some("a b".into()) };
        assert_eq!(
            page.query_with("/v1/upgrades", &[("state", Some("failed")), ("cluster", None)]),
            "/v1/upgrades?limit=5&cursor=a%20b&state=failed"
        );
    }
}
