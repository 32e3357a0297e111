//! `drover namespaces ...`: the namespaces pools, clusters, upgrade jobs
//! and apply sets belong to. Listing shows those the credential holds a
//! role in; creating, changing and deleting one is a `*` admin's.

use std::collections::BTreeMap;

use clap::Subcommand;
use serde_json::json;

use super::client::{CliError, Client};
use super::engines::parse_label;
use super::output::{OutputFormat, Table, print_fields, print_json};
use crate::http::namespaces::{NamespaceList, NamespaceView};

#[derive(Debug, Subcommand)]
pub enum NamespacesCommand {
    /// List the namespaces you hold a role in.
    List,
    /// Show one namespace and its engine selector.
    Get { name: String },
    /// Create a namespace (`*` admin).
    Create {
        name: String,
        /// Fence its pools to engines with this label, `key=value` (repeatable).
        #[arg(long = "engine-selector", value_parser = parse_label)]
        engine_selector: Vec<(String, String)>,
    },
    /// Replace a namespace's engine selector; none given: any engine (`*` admin).
    SetEngineSelector {
        name: String,
        #[arg(long = "engine-selector", value_parser = parse_label)]
        engine_selector: Vec<(String, String)>,
    },
    /// Delete an empty namespace (`*` admin); `default` always stays.
    Delete { name: String },
}

fn selector(s: &BTreeMap<String, String>) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn one(out: OutputFormat, what: &str, answer: serde_json::Value) -> Result<(), CliError> {
    if out == OutputFormat::Json {
        print_json(&answer);
        return Ok(());
    }
    let ns: NamespaceView = Client::decode(what, answer)?;
    print_fields(&[
        ("name", ns.name.to_string()),
        ("engine selector", selector(&ns.engine_selector)),
        ("created", ns.created_at.to_rfc3339()),
        ("updated", ns.updated_at.to_rfc3339()),
    ]);
    Ok(())
}

pub async fn run(client: &Client, out: OutputFormat, cmd: NamespacesCommand) -> Result<(), CliError> {
    match cmd {
        NamespacesCommand::List => {
            let answer = client.get("/v1/namespaces").await?;
            if out == OutputFormat::Json {
                print_json(&answer);
                return Ok(());
            }
            let list: NamespaceList = Client::decode("GET /v1/namespaces", answer)?;
            let mut t = Table::new(&["NAME", "ENGINE SELECTOR", "CREATED"]);
            for ns in &list.items {
                t.row(vec![ns.name.to_string(), selector(&ns.engine_selector), ns.created_at.to_rfc3339()]);
            }
            t.print();
            Ok(())
        }
        NamespacesCommand::Get { name } => {
            let path = format!("/v1/namespaces/{name}");
            let answer = client.get(&path).await?;
            one(out, &path, answer)
        }
        NamespacesCommand::Create { name, engine_selector } => {
            let selector: BTreeMap<String, String> = engine_selector.into_iter().collect();
            let body = json!({"name": name, "engine_selector": selector});
            let answer = client.post("/v1/namespaces", Some(&body)).await?;
            one(out, "POST /v1/namespaces", answer)
        }
        NamespacesCommand::SetEngineSelector { name, engine_selector } => {
            let selector: BTreeMap<String, String> = engine_selector.into_iter().collect();
            let path = format!("/v1/namespaces/{name}");
            let answer = client.merge_patch(&path, &json!({"engine_selector": selector})).await?;
            one(out, &path, answer)
        }
        NamespacesCommand::Delete { name } => {
            client.delete(&format!("/v1/namespaces/{name}")).await?;
            if out == OutputFormat::Table {
                println!("namespace {name} deleted");
            }
            Ok(())
        }
    }
}
