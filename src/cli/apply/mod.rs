//! `drover apply -f PATH...`, `drover diff -f PATH...` and `drover schema`:
//! fleet files sent to `POST /v1/apply`, whose server decides what
//! changes; its answer shown as a diff (or its JSON), and with `--wait`
//! followed until every pool it changed has converged.
//!
//! Exit codes: 0 success, 1 an error or a conflict (an object left alone);
//! with `--detailed-exitcode`, 0 means nothing changed (or would), 2 that
//! something did (or would), 1 any error, as `terraform plan` has it.

mod files;
mod render;
mod wait;

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::Value;

use super::args::WaitArgs;
use super::client::{CliError, Client};
use super::exit;
use super::output::{OutputFormat, print_json};
use crate::domain::names::DnsLabel;
use crate::http::wire::apply::{ApplyRequest, ApplyResult};

/// When the diff is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Colour {
    /// On a terminal (and when `NO_COLOR` is not set).
    Auto,
    Always,
    Never,
}

/// What `apply` and `diff` share: the files and how to treat what exists.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// A fleet file (YAML or JSON, one or many documents) or a directory of
    /// them (`.yaml`, `.yml`, `.json`, in name order); `-` reads standard
    /// input. Repeatable.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Read the subdirectories of directories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// The apply set: the name these documents are applied under; it owns
    /// what they create, and `--prune` deletes only its objects.
    #[arg(long, env = "DROVER_APPLY_SET")]
    pub apply_set: String,
    /// Delete the objects of the apply set that the files no longer name.
    #[arg(long)]
    pub prune: bool,
    /// With `--prune`, accept files that hold no document at all, and so
    /// delete every object of the apply set. Without it, such an apply is
    /// refused: an empty directory or a mistyped path is not a wish to
    /// delete a fleet.
    #[arg(long)]
    pub allow_empty: bool,
    /// Overwrite (or prune) objects changed by another hand since the apply
    /// set last wrote them, instead of reporting a conflict.
    #[arg(long)]
    pub force: bool,
    /// Take over objects that exist and belong to no apply set (with
    /// `--force`: to another one).
    #[arg(long)]
    pub adopt: bool,
    /// Exit 0 when nothing changes, 2 when something does, 1 on any error.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Colour the diff.
    #[arg(long, value_enum, default_value_t = Colour::Auto)]
    pub color: Colour,
}

/// `drover apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Block until every pool created or changed has converged and its
    /// rollout is complete (and every pool pruned is gone), showing
    /// progress; exit 3 when a rollout fails or is rolled back, 4 on timeout.
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// `drover apply` and `drover diff` (a dry run): the process's exit code.
pub async fn run(client: &Client, out: OutputFormat, args: ApplyArgs) -> Result<u8, CliError> {
    let detailed = args.fleet.detailed_exitcode;
    match apply(client, out, args).await {
        Ok(code) => Ok(code),
        Err(e) if detailed => {
            eprintln!("error: {e}");
            Ok(exit::ERROR)
        }
        Err(e) => Err(e),
    }
}

async fn apply(client: &Client, out: OutputFormat, args: ApplyArgs) -> Result<u8, CliError> {
    let fleet_args = &args.fleet;
    let paths = files::expand(&fleet_args.files, fleet_args.recursive)?;
    let fleet = files::read(&paths)?;
    if fleet.documents.is_empty() && fleet_args.prune && !fleet_args.allow_empty {
        return Err(CliError::Input(no_documents(&fleet_args.files, &fleet_args.apply_set)));
    }
    let apply_set = DnsLabel::parse(&fleet_args.apply_set)
        .map_err(|e| CliError::Usage(format!("--apply-set {:?}: {e}", fleet_args.apply_set)))?;
    let body = ApplyRequest {
        apply_set,
        documents: fleet.documents,
        dry_run: args.dry_run,
        prune: fleet_args.prune,
        allow_empty: fleet_args.allow_empty,
        force: fleet_args.force,
        adopt: fleet_args.adopt,
    };
    let size = serde_json::to_vec(&body).map_err(|e| CliError::Input(e.to_string()))?.len();
    if size > crate::http::extract::MAX_BODY_BYTES {
        return Err(CliError::Input(format!(
            "the {} documents make a request of {size} bytes, over the server's limit of {} bytes: split the \
             fleet into several apply sets",
            body.documents.len(),
            crate::http::extract::MAX_BODY_BYTES
        )));
    }
    let answer = client.post("/v1/apply", Some(&body)).await.map_err(|e| located(e, &fleet.origins))?;
    let result: ApplyResult = Client::decode("POST /v1/apply", answer.clone())?;
    match out {
        OutputFormat::Json => print_json(&answer),
        OutputFormat::Table => {
            let colour = match fleet_args.color {
                Colour::Always => true,
                Colour::Never => false,
                Colour::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
            };
            print!("{}", render::render(&result, &fleet.origins, render::Palette::new(colour)));
        }
    }
    if result.summary.conflict > 0 {
        return Err(CliError::Conflicts(render::conflicts(&result)));
    }
    if args.wait.wait && !args.dry_run {
        wait::converge(client, &result, args.wait.timeout).await?;
    }
    Ok(if fleet_args.detailed_exitcode && result.changed { DETAILED_CHANGES } else { 0 })
}

/// Why an apply with `--prune` and no document is refused.
fn no_documents(files: &[PathBuf], apply_set: &str) -> String {
    let named: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    format!(
        "no documents in {}: with --prune this would delete every object of apply set {apply_set:?}; check the \
         path, or pass --allow-empty if deleting them all is what you mean",
        named.join(", ")
    )
}

/// `--detailed-exitcode`: something changed (or would).
const DETAILED_CHANGES: u8 = 2;

/// A problem whose fields name documents (`documents[3].spec.replicas`,
/// counted from 0 across every file), each told instead by its file, line
/// and document as a person counts them in that file. The detail, which
/// repeats the fields in the request's numbering, goes: one numbering.
fn located(e: CliError, origins: &[files::Origin]) -> CliError {
    let CliError::Problem(mut problem) = e else { return e };
    let mut moved = false;
    for error in &mut problem.errors {
        if let Some((index, rest)) = document_of(&error.field)
            && let Some(origin) = origins.get(index)
        {
            let rest = rest.trim_start_matches('.');
            error.field = if rest.is_empty() { origin.to_string() } else { format!("{origin}: {rest}") };
            moved = true;
        }
    }
    if moved {
        problem.detail = None;
    }
    CliError::Problem(problem)
}

/// `(3, ".spec.replicas")` of `documents[3].spec.replicas`.
fn document_of(field: &str) -> Option<(usize, &str)> {
    let rest = field.strip_prefix("documents[")?;
    let (index, rest) = rest.split_once(']')?;
    Some((index.parse().ok()?, rest))
}

/// `drover schema`: the JSON Schema of a fleet document, for editors.
pub fn schema() -> anyhow::Result<Value> {
    let doc = serde_json::to_value(crate::http::openapi()?)?;
    Ok(crate::apply::schema::standalone(&doc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_naming_documents_name_their_file_line_and_document() {
        let origins = vec![files::Origin { file: "fleet/pools.yaml".into(), document: 3, item: None, line: 14 }];
        let problem = super::super::client::Problem {
            title: "The request broke a validation rule".into(),
            status: 422,
            detail: Some("documents[0].spec.replicas: out of range".into()),
            errors: vec![
                serde_json::from_value(json!({"field": "documents[0].spec.replicas", "message": "out of range"}))
                    .expect("field error"),
                serde_json::from_value(json!({"field": "documents[0]", "message": "not an object"}))
                    .expect("field error"),
                serde_json::from_value(json!({"field": "apply_set", "message": "bad"})).expect("field error"),
            ],
            ..Default::default()
        };
        let CliError::Problem(p) = located(CliError::Problem(problem), &origins) else { panic!("not a problem") };
        let fields: Vec<&str> = p.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["fleet/pools.yaml:14 (document 3): spec.replicas", "fleet/pools.yaml:14 (document 3)", "apply_set"]
        );
        assert_eq!(p.detail, None, "the detail counted documents the other way");
    }
}
