//! `drover engines ...`: the Docker engines pools may use. Answers are read
//! into the server's own view types.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::args::PageArgs;
use super::client::{CliError, Client};
use super::output::{OutputFormat, Table, print_fields, print_json};
use crate::http::engines::{EngineList, EngineView};

#[derive(Debug, Subcommand)]
pub enum EnginesCommand {
    /// List engines: reachability, version, machines.
    List(PageArgs),
    /// Show one engine (never its credentials).
    Get { name: String },
    /// Register an engine (admin).
    Add(AddEngineArgs),
    /// Move every machine off an engine, within each pool's rollout bounds (admin).
    Drain { name: String },
    /// Let pools place machines on an engine again (admin).
    Undrain { name: String },
    /// Forget an engine that holds no machine (admin).
    Remove { name: String },
    /// Accept the Docker daemon an engine's endpoint reaches now, after it
    /// changed (admin).
    ConfirmIdentity { name: String },
}

#[derive(Debug, Args)]
pub struct AddEngineArgs {
    pub name: String,
    /// `unix:///path/docker.sock` or `tcp://host:port`.
    #[arg(long)]
    pub endpoint: String,
    /// A label for pools' engine selectors, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// PEM client certificate, for tcp:// with TLS.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM client private key.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate of the engine.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
}

/// `key=value`, for `--label` and `--engine-selector`.
pub(super) fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not key=value"))
}

fn read(path: &PathBuf) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))
}

fn show(e: &EngineView) {
    let s = &e.status;
    let labels: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    print_fields(&[
        ("name", e.name.clone()),
        ("endpoint", e.endpoint.clone()),
        ("kind", e.kind.clone()),
        ("labels", if labels.is_empty() { "-".into() } else { labels.join(",") }),
        ("tls", e.tls.to_string()),
        ("draining", e.draining.to_string()),
        ("reachability", format!("{:?}", s.reachability).to_lowercase()),
        ("since", s.since.to_rfc3339()),
        ("version", s.version.clone().unwrap_or_else(|| "-".into())),
        ("daemon", daemon(e)),
        ("machines", s.machines.to_string()),
        ("last error", s.last_error.clone().unwrap_or_else(|| "-".into())),
        ("placement", placement(e)),
    ]);
    for r in &s.placement.refused_images {
        println!("refused image {} (until {}): {}", r.image, r.retry_at.to_rfc3339(), r.error);
    }
}

/// The daemon the engine is registered as, and what it reports if that differs.
fn daemon(e: &EngineView) -> String {
    let d = &e.status.daemon;
    let id = d.id.clone().unwrap_or_else(|| "-".into());
    match (&d.reported_id, &d.duplicate_of) {
        (_, Some(other)) => format!("{id} (the same daemon as engine {other})"),
        (Some(now), _) if d.id.as_ref() != Some(now) => format!("{id} (reports {now} now)"),
        _ => id,
    }
}

/// Whether new machines go to the engine, and why not.
fn placement(e: &EngineView) -> String {
    let p = &e.status.placement;
    match (p.blocked, &p.message) {
        (None, _) => "eligible".into(),
        (Some(block), Some(m)) => format!("{}: {m}", block.as_str()),
        (Some(block), None) => block.as_str().into(),
    }
}

/// One engine: the server's JSON, or its fields read as an `EngineView`.
fn one(out: OutputFormat, what: &str, answer: serde_json::Value) -> Result<(), CliError> {
    if out == OutputFormat::Json {
        print_json(&answer);
        return Ok(());
    }
    show(&Client::decode::<EngineView>(what, answer)?);
    Ok(())
}

pub async fn run(client: &Client, out: OutputFormat, cmd: EnginesCommand) -> Result<(), CliError> {
    match cmd {
        EnginesCommand::List(page) => {
            let path = page.query("/v1/engines");
            let answer = client.get(&path).await?;
            if out == OutputFormat::Json {
                print_json(&answer);
                return Ok(());
            }
            let list: EngineList = Client::decode(&format!("GET {path}"), answer)?;
            let mut t =
                Table::new(&["NAME", "ENDPOINT", "REACHABILITY", "VERSION", "MACHINES", "DRAINING", "PLACEMENT"]);
            for e in &list.items {
                t.row(vec![
                    e.name.clone(),
                    e.endpoint.clone(),
                    format!("{:?}", e.status.reachability).to_lowercase(),
                    e.status.version.clone().unwrap_or_else(|| "-".into()),
                    e.status.machines.to_string(),
                    e.draining.to_string(),
                    e.status.placement.blocked.map_or("eligible", |b| b.as_str()).to_owned(),
                ]);
            }
            t.print();
            if let Some(cursor) = &list.next_cursor {
                eprintln!("(more: repeat with --cursor {cursor})");
            }
            Ok(())
        }
        EnginesCommand::Get { name } => {
            let path = format!("/v1/engines/{name}");
            let answer = client.get(&path).await?;
            one(out, &path, answer)
        }
        EnginesCommand::Add(args) => {
            let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
            let mut body = json!({"name": args.name, "endpoint": args.endpoint, "labels": labels});
            if let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) {
                body["tls"] = json!({"cert": read(cert)?, "key": read(key)?, "ca": read(ca)?});
            }
            let answer = client.post("/v1/engines", Some(&body)).await?;
            one(out, "POST /v1/engines", answer)
        }
        EnginesCommand::Drain { name } => {
            let path = format!("/v1/engines/{name}/drain");
            let answer = client.post_empty(&path).await?;
            one(out, &path, answer)
        }
        EnginesCommand::Undrain { name } => {
            let path = format!("/v1/engines/{name}/drain");
            let answer = client.delete(&path).await?;
            one(out, &path, answer)
        }
        EnginesCommand::ConfirmIdentity { name } => {
            let path = format!("/v1/engines/{name}/confirm-identity");
            let answer = client.post_empty(&path).await?;
            one(out, &path, answer)
        }
        EnginesCommand::Remove { name } => {
            client.delete(&format!("/v1/engines/{name}")).await?;
            if out == OutputFormat::Table {
                println!("engine {name} removed");
            }
            Ok(())
        }
    }
}
