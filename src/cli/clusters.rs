//! `drover clusters ...` and `drover upgrade ...`: registered Kubernetes
//! clusters and their control-plane upgrade jobs.

use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args, Subcommand};
use serde_json::{Map, Value, json};

use super::args::{PageArgs, WaitArgs};
use super::client::{CliError, Client};
use super::output::{OutputFormat, Table, items, more_hint, print_fields, print_json, text};
use super::wait::{self, Target};

#[derive(Debug, Subcommand)]
pub enum ClustersCommand {
    /// List registered clusters.
    List(PageArgs),
    /// Show one cluster (never its credentials).
    Get { name: String },
    /// Register a cluster, from a kubeconfig or an API server URL and token.
    Create(CreateClusterArgs),
    /// Forget a cluster (refused while an upgrade job is active on it).
    Delete { name: String },
    /// Probe the cluster: version, health, and what each component runs.
    Status { name: String },
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("credentials").required(true).multiple(false)))]
pub struct CreateClusterArgs {
    pub name: String,
    /// A kubeconfig file with embedded credentials.
    #[arg(long, group = "credentials")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use (its current one by default).
    #[arg(long, requires = "kubeconfig")]
    pub context: Option<String>,
    /// API server URL, with `--api-token`.
    #[arg(long, group = "credentials", requires = "api_token")]
    pub api_server: Option<String>,
    /// Bearer token for the API server.
    #[arg(long, env = "DROVER_CLUSTER_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// PEM file of the API server's CA certificate.
    #[arg(long, requires = "api_server")]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum UpgradeCommand {
    /// Start a control-plane upgrade (or show its plan with --dry-run).
    Start(StartUpgradeArgs),
    /// Show a job: state, position and every component's progress.
    Status { id: i64 },
    /// Cancel a job at its next safe point.
    Cancel { id: i64 },
    /// List jobs, newest first.
    List {
        /// Only jobs of this cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// Only jobs in this state (pending, running, succeeded, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Args)]
pub struct StartUpgradeArgs {
    pub cluster: String,
    /// Target version, `vMAJOR.MINOR.PATCH`.
    #[arg(long)]
    pub version: String,
    /// Component to upgrade (repeatable; all three by default).
    #[arg(long = "component")]
    pub components: Vec<String>,
    /// Registry of the component images (admin token only).
    #[arg(long)]
    pub image_repository: Option<String>,
    /// Bypass the version policy (admin token only).
    #[arg(long)]
    pub force: bool,
    /// Show what would change; start nothing.
    #[arg(long, conflicts_with = "wait")]
    pub dry_run: bool,
    #[command(flatten)]
    pub wait: WaitArgs,
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))
}

pub async fn run_clusters(client: &Client, out: OutputFormat, cmd: ClustersCommand) -> Result<(), CliError> {
    let json_or = |v: &Value, table: &dyn Fn(&Value)| if out == OutputFormat::Json { print_json(v) } else { table(v) };
    match cmd {
        ClustersCommand::List(page) => {
            let page = client.get(&page.query("/v1/clusters")).await?;
            json_or(&page, &|page| {
                let mut t = Table::new(&["NAME", "SERVER", "AUTH", "CREATED"]);
                for c in items(page) {
                    t.row(vec![text(c, "name"), text(c, "server"), text(c, "auth"), text(c, "created_at")]);
                }
                t.print();
                more_hint(page);
            });
        }
        ClustersCommand::Get { name } => {
            let c = client.get(&format!("/v1/clusters/{name}")).await?;
            json_or(&c, &|c| {
                print_fields(&[("name", text(c, "name")), ("server", text(c, "server")), ("auth", text(c, "auth"))])
            });
        }
        ClustersCommand::Create(args) => {
            let mut body = Map::new();
            body.insert("name".into(), json!(args.name));
            if let Some(path) = &args.kubeconfig {
                body.insert("kubeconfig".into(), json!(read(path)?));
            }
            let optional = [
                ("context", args.context.clone()),
                ("server", args.api_server.clone()),
                ("token", args.api_token.clone()),
            ];
            for (key, value) in optional {
                if let Some(v) = value {
                    body.insert(key.into(), json!(v));
                }
            }
            if let Some(path) = &args.ca_file {
                body.insert("ca_certificate".into(), json!(read(path)?));
            }
            let c = client.post("/v1/clusters", Some(&Value::Object(body))).await?;
            json_or(&c, &|c| println!("cluster {} registered ({})", text(c, "name"), text(c, "server")));
        }
        ClustersCommand::Delete { name } => {
            client.delete(&format!("/v1/clusters/{name}")).await?;
            // 204 has no body; scripts still get one JSON document.
            json_or(&json!({ "name": name, "deleted": true }), &|_| println!("cluster {name} deleted"));
        }
        ClustersCommand::Status { name } => {
            let s = client.get(&format!("/v1/clusters/{name}/status")).await?;
            json_or(&s, &show_cluster_status);
        }
    }
    Ok(())
}

fn show_cluster_status(s: &Value) {
    print_fields(&[
        ("name", text(s, "name")),
        ("reachable", text(s, "reachable")),
        ("healthy", text(s, "healthy")),
        ("version", text(s, "version")),
        ("detail", text(s, "detail")),
    ]);
    let mut t = Table::new(&["COMPONENT", "VERSION", "PODS", "IMAGE", "ERROR"]);
    for c in s["components"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let pods = c["pods"].as_array().map(Vec::as_slice).unwrap_or_default();
        let pods: Vec<String> = pods.iter().map(|p| format!("{} ({})", text(p, "name"), text(p, "phase"))).collect();
        t.row(vec![text(c, "component"), text(c, "version"), pods.join(", "), text(c, "image"), text(c, "error")]);
    }
    println!();
    t.print();
}

pub async fn run_upgrade(client: &Client, out: OutputFormat, cmd: UpgradeCommand) -> Result<(), CliError> {
    match cmd {
        UpgradeCommand::Start(args) => start(client, out, args).await,
        UpgradeCommand::Status { id } => {
            let job = client.get(&format!("/v1/upgrades/{id}")).await?;
            show_job(out, &job);
            Ok(())
        }
        UpgradeCommand::Cancel { id } => {
            let job = client.post(&format!("/v1/upgrades/{id}/cancel"), None).await?;
            match out {
                OutputFormat::Json => print_json(&job),
                OutputFormat::Table if job["state"] == "cancelled" => println!("upgrade {id} cancelled"),
                OutputFormat::Table => println!("upgrade {id}: cancel requested; it stops at its next safe point"),
            }
            Ok(())
        }
        UpgradeCommand::List { cluster, state, page } => {
            let extra = [("cluster", cluster.as_deref()), ("state", state.as_deref())];
            let page = client.get(&page.query_with("/v1/upgrades", &extra)).await?;
            if out == OutputFormat::Json {
                print_json(&page);
                return Ok(());
            }
            let mut t = Table::new(&["ID", "CLUSTER", "FROM", "TO", "STATE", "AT", "CREATED"]);
            for j in items(&page) {
                t.row(vec![
                    text(j, "id"),
                    text(j, "cluster"),
                    text(j, "from_version"),
                    text(j, "version"),
                    text(j, "state"),
                    position(j),
                    text(j, "created_at"),
                ]);
            }
            t.print();
            more_hint(&page);
            Ok(())
        }
    }
}

async fn start(client: &Client, out: OutputFormat, args: StartUpgradeArgs) -> Result<(), CliError> {
    let mut body = json!({ "version": args.version, "force": args.force, "dry_run": args.dry_run });
    if !args.components.is_empty() {
        body["components"] = json!(args.components);
    }
    if let Some(repo) = &args.image_repository {
        body["image_repository"] = json!(repo);
    }
    let answer = client.post(&format!("/v1/clusters/{}/upgrades", args.cluster), Some(&body)).await?;
    if args.dry_run {
        if out == OutputFormat::Json {
            print_json(&answer);
            return Ok(());
        }
        println!("{} -> {}", text(&answer, "current_version"), text(&answer, "target_version"));
        let mut t = Table::new(&["COMPONENT", "CURRENT IMAGE", "NEW IMAGE"]);
        for c in answer["components"].as_array().map(Vec::as_slice).unwrap_or_default() {
            t.row(vec![text(c, "component"), text(c, "current_image"), text(c, "new_image")]);
        }
        t.print();
        return Ok(());
    }
    let id = answer["id"].as_i64().ok_or_else(|| CliError::BadResponse {
        what: "POST .../upgrades".into(),
        reason: "the job has no id".into(),
    })?;
    if !args.wait.wait {
        match out {
            OutputFormat::Json => print_json(&answer),
            OutputFormat::Table => println!("upgrade {id} started; follow it with: drover upgrade status {id}"),
        }
        return Ok(());
    }
    eprintln!("upgrade {id} started");
    let job = wait::wait(client, &Target::Upgrade(id), args.wait.timeout).await?;
    match out {
        OutputFormat::Json => print_json(&job),
        OutputFormat::Table => println!("upgrade {id} succeeded: {} runs {}", args.cluster, text(&job, "version")),
    }
    Ok(())
}

fn position(job: &Value) -> String {
    let c = &job["current"];
    if c.is_object() { format!("{} step {}", text(c, "component"), text(c, "step")) } else { "-".into() }
}

fn show_job(out: OutputFormat, j: &Value) {
    if out == OutputFormat::Json {
        return print_json(j);
    }
    let upgraded: Vec<String> =
        j["upgraded_components"].as_array().map(|a| a.iter().map(super::output::cell).collect()).unwrap_or_default();
    print_fields(&[
        ("id", text(j, "id")),
        ("cluster", text(j, "cluster")),
        ("version", format!("{} -> {}", text(j, "from_version"), text(j, "version"))),
        ("state", text(j, "state")),
        ("at", position(j)),
        ("upgraded", if upgraded.is_empty() { "-".into() } else { upgraded.join(", ") }),
        ("error", text(j, "error")),
    ]);
    let mut t = Table::new(&["COMPONENT", "STATE", "STEPS DONE", "OLD IMAGE", "NEW IMAGE"]);
    for p in j["progress"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let steps = p["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
        let done = steps.iter().filter(|s| s["state"] == "succeeded").count();
        t.row(vec![
            text(p, "component"),
            text(p, "state"),
            done.to_string(),
            text(p, "old_image"),
            text(p, "new_image"),
        ]);
    }
    println!();
    t.print();
}
