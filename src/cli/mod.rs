//! `drover pools|machines|rollout|clusters|upgrade|engines ...`: a client for the
//! API, in the same binary as the server, for people at a terminal and for
//! CI steps.
//!
//! - [`client`]: the HTTP calls, bearer token, and errors (problem documents,
//!   unreachable servers) turned into messages and exit codes.
//! - [`output`]: tables for people, the server's JSON for scripts. Tables
//!   read answers into the server's own view types (`Client::decode`), so
//!   a field the server renamed or dropped is an error naming it.
//! - [`wait`] and [`sse`]: `--wait`, following the server's event streams
//!   (or polling when a stream fails) until the work ends.
//! - [`args`]: `--wait`/`--timeout` and paging, shared by the command groups.
//! - [`pools`], [`rollout`], [`clusters`]: one module per command group.
//! - [`apply`]: `drover apply` and `drover diff`, fleet files applied by the
//!   server, and `drover schema`.

pub mod apply;
pub mod args;
pub mod client;
pub mod clusters;
pub mod engines;
pub mod namespaces;
pub mod output;
pub mod pools;
pub mod rollout;
pub mod sse;
pub mod wait;

use std::process::ExitCode;

use clap::{Args, Subcommand};

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

    /// Namespace the command works in (`default` when not given); a list
    /// also takes `*`, every namespace you may see. Engines and namespaces
    /// themselves belong to none.
    #[arg(short = 'n', long, global = true, env = "DROVER_NAMESPACE", help_heading = "Client options")]
    pub namespace: Option<String>,

    /// Command (run by `sh -c`) that prints the bearer token, instead of
    /// `--token`: run before the first request and again whenever the
    /// server refuses the token, so a short-lived CI token is renewed
    /// during a long `--wait`.
    #[arg(long, global = true, env = "DROVER_TOKEN_COMMAND", help_heading = "Client options")]
    pub token_command: Option<String>,

    /// PEM CA certificate(s) to trust for an https:// `--server` instead of
    /// the system's roots (a private CA).
    #[arg(long, global = true, env = "DROVER_CA_CERT", help_heading = "Client options")]
    pub ca_cert: Option<std::path::PathBuf>,

    /// PEM client certificate for mutual TLS (with `--client-key`).
    #[arg(long, global = true, env = "DROVER_CLIENT_CERT", help_heading = "Client options")]
    pub client_cert: Option<std::path::PathBuf>,

    /// PEM private key of `--client-cert`.
    #[arg(long, global = true, env = "DROVER_CLIENT_KEY", help_heading = "Client options")]
    pub client_key: Option<std::path::PathBuf>,

    /// `table` for people, `json` (the server's answer, pretty-printed) for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = OutputFormat::Table, help_heading = "Client options")]
    pub output: OutputFormat,
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
    /// Namespaces: what each team's pools, clusters and jobs belong to.
    #[command(subcommand)]
    Namespaces(namespaces::NamespacesCommand),
    /// Apply fleet files (pools, engines, clusters): the server plans and
    /// makes the changes as one; `--dry-run` shows the diff (docs/apply.md).
    Apply(apply::ApplyArgs),
    /// Show what `drover apply` would change (a dry run).
    Diff(apply::FleetArgs),
}

/// Runs one client command and answers the process's exit code; errors are
/// printed on standard error.
pub async fn run(args: ClientArgs, command: ClientCommand) -> ExitCode {
    match dispatch(&args, command).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn dispatch(args: &ClientArgs, command: ClientCommand) -> Result<u8, CliError> {
    let tls = client::TlsOptions {
        ca_cert: args.ca_cert.clone(),
        client_cert: args.client_cert.clone(),
        client_key: args.client_key.clone(),
    };
    let mut client = Client::new(&args.server, args.token.clone(), &tls)?;
    if let Some(command) = args.token_command.as_deref().filter(|c| !c.trim().is_empty()) {
        if args.token.as_deref().is_some_and(|t| !t.trim().is_empty()) {
            let why = "give --token (DROVER_TOKEN) or --token-command (DROVER_TOKEN_COMMAND), not both";
            return Err(CliError::Usage(why.into()));
        }
        client = client.with_token_command(command);
    }
    if let Some(namespace) = args.namespace.as_deref().filter(|n| !n.trim().is_empty()) {
        client = client.in_namespace(namespace.trim());
    }
    let out = args.output;
    let done = match command {
        ClientCommand::Pools(cmd) => pools::run_pools(&client, out, cmd).await,
        ClientCommand::Machines(cmd) => pools::run_machines(&client, out, cmd).await,
        ClientCommand::Rollout(cmd) => rollout::run(&client, out, cmd).await,
        ClientCommand::Clusters(cmd) => clusters::run_clusters(&client, out, cmd).await,
        ClientCommand::Upgrade(cmd) => clusters::run_upgrade(&client, out, cmd).await,
        ClientCommand::Engines(cmd) => engines::run(&client, out, cmd).await,
        ClientCommand::Namespaces(cmd) => namespaces::run(&client, out, cmd).await,
        ClientCommand::Apply(cmd) => return apply::run(&client, out, cmd).await,
        ClientCommand::Diff(fleet) => {
            let wait = args::WaitArgs { wait: false, timeout: std::time::Duration::ZERO };
            return apply::run(&client, out, apply::ApplyArgs { fleet, dry_run: true, wait }).await;
        }
    };
    done.map(|()| 0)
}
