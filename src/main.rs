use std::process::ExitCode;

use clap::Parser;
use drover::config::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Openapi => {
            let doc = drover::http::openapi().to_pretty_json()?;
            println!("{doc}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(config) => {
            drover::telemetry::init(&config.log_level, config.log_format)?;
            let app = drover::app::Application::build(*config).await?;
            app.run_until_stopped(drover::app::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Client(command) => Ok(drover::cli::run(cli.client, *command).await),
    }
}
