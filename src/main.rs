use std::process::ExitCode;

use clap::{Parser, Subcommand};
use drover::config::ServeConfig;

/// mimalloc in place of glibc's malloc: every request and every pass
/// allocates (strings, spans, rows); glibc's `malloc`/`free` were about 12%
/// of the CPU in a profile of reads, and the allocator measured build
/// against build takes a fifth off a pass (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The whole command line: the server's settings belong to `config`, the
/// client's to `cli`; only the binary joins them.
#[derive(Debug, Parser)]
#[command(
    name = "drover",
    version,
    about = "Keeps Docker machine pools at their desired size and image, and upgrades self-hosted Kubernetes control planes"
)]
struct Cli {
    /// Settings of the client commands (`--server`, `--token`, `-o`).
    #[command(flatten)]
    client: drover::cli::ClientArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP API server and its background workers.
    Serve(Box<ServeConfig>),
    /// Print the OpenAPI document to standard output.
    Openapi,
    /// Print the JSON Schema of fleet files (`drover apply -f`), for editors.
    Schema,
    /// The client commands: `pools`, `machines`, `rollout`, `clusters`, `upgrade`.
    #[command(flatten)]
    Client(Box<drover::cli::ClientCommand>),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Openapi => {
            let doc = drover::http::openapi()?.to_pretty_json()?;
            println!("{doc}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&drover::cli::apply::schema()?)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(config) => {
            let telemetry = drover::telemetry::init(&config.log_level, config.log_format, &config.traces)?;
            let app = drover::app::Application::build(*config).await?;
            let ran = app.run_until_stopped(drover::app::shutdown_signal()).await;
            telemetry.shutdown().await;
            ran?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Client(command) => Ok(drover::cli::run(cli.client, *command).await),
    }
}
