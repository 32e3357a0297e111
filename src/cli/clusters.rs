//! `drover clusters ...` and `drover upgrade ...`: registered Kubernetes
//! clusters and their control-plane upgrade jobs. Answers are read into
//! the server's own view types.

use std::path::{Path, PathBuf};

use chrono::SecondsFormat;
use clap::{ArgGroup, Args, Subcommand};
use serde_json::{Map, Value, json};

use super::args::{PageArgs, WaitArgs};
use super::client::{CliError, Client};
use super::output::{ListTable, OutputFormat, Table, more_hint, or_dash, print_fields, print_json, show, wire_name};
use super::wait::{self, Target};
use crate::domain::upgrade::JobState;
use crate::domain::upgrade::StepState;
use crate::http::clusters::{ClusterList, ClusterStatus, ClusterView};
use crate::http::upgrades::{UpgradeList, UpgradePlan};
use crate::http::wire::upgrades::UpgradeView;

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
    match cmd {
        ClustersCommand::List(page) => {
            let path = page.query("/v1/clusters");
            let page = client.get(&path).await?;
            show(out, &format!("GET {path}"), page, |page: ClusterList| {
                let mut t = ListTable::new(client.across(), &["NAME", "SERVER", "AUTH", "CREATED"]);
                for c in page.items {
                    let created = c.created_at.to_rfc3339_opts(SecondsFormat::Secs, true);
                    t.row(&c.namespace, vec![c.name, c.server, c.auth, created]);
                }
                t.print();
                more_hint(&page.next_cursor);
            })?;
        }
        ClustersCommand::Get { name } => {
            let path = format!("/v1/clusters/{name}");
            let c = client.get(&path).await?;
            show(out, &format!("GET {path}"), c, |c: ClusterView| {
                print_fields(&[("name", c.name), ("server", c.server), ("auth", c.auth)])
            })?;
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
            show(out, "POST /v1/clusters", c, |c: ClusterView| {
                println!("cluster {} registered ({})", c.name, c.server)
            })?;
        }
        ClustersCommand::Delete { name } => {
            client.delete(&format!("/v1/clusters/{name}")).await?;
            match out {
                // 204 has no body; scripts still get one JSON document.
                OutputFormat::Json => print_json(&json!({ "name": name, "deleted": true })),
                OutputFormat::Table => println!("cluster {name} deleted"),
            }
        }
        ClustersCommand::Status { name } => {
            let path = format!("/v1/clusters/{name}/status");
            let s = client.get(&path).await?;
            show(out, &format!("GET {path}"), s, show_cluster_status)?;
        }
    }
    Ok(())
}

fn show_cluster_status(s: ClusterStatus) {
    print_fields(&[
        ("name", s.name),
        ("reachable", s.reachable.to_string()),
        ("healthy", s.healthy.to_string()),
        ("version", or_dash(&s.version)),
        ("detail", or_dash(&s.detail)),
    ]);
    let mut t = Table::new(&["COMPONENT", "VERSION", "PODS", "IMAGE", "ERROR"]);
    for c in s.components {
        let pods: Vec<String> = c.pods.iter().map(|p| format!("{} ({})", p.name, or_dash(&p.phase))).collect();
        t.row(vec![
            wire_name(&c.component),
            or_dash(&c.version),
            pods.join(", "),
            or_dash(&c.image),
            or_dash(&c.error),
        ]);
    }
    println!();
    t.print();
}

pub async fn run_upgrade(client: &Client, out: OutputFormat, cmd: UpgradeCommand) -> Result<(), CliError> {
    match cmd {
        UpgradeCommand::Start(args) => start(client, out, args).await,
        UpgradeCommand::Status { id } => {
            let path = format!("/v1/upgrades/{id}");
            let job = client.get(&path).await?;
            show(out, &format!("GET {path}"), job, show_job)
        }
        UpgradeCommand::Cancel { id } => {
            let path = format!("/v1/upgrades/{id}/cancel");
            let job = client.post_empty(&path).await?;
            show(out, &format!("POST {path}"), job, |job: UpgradeView| match job.state {
                JobState::Cancelled => println!("upgrade {id} cancelled"),
                _ => println!("upgrade {id}: cancel requested; it stops at its next safe point"),
            })
        }
        UpgradeCommand::List { cluster, state, page } => {
            let extra = [("cluster", cluster.as_deref()), ("state", state.as_deref())];
            let path = page.query_with("/v1/upgrades", &extra);
            let page = client.get(&path).await?;
            show(out, &format!("GET {path}"), page, |page: UpgradeList| {
                let columns = ["ID", "CLUSTER", "FROM", "TO", "STATE", "AT", "DRIVER", "CREATED"];
                let mut t = ListTable::new(client.across(), &columns);
                for j in &page.items {
                    t.row(
                        &j.namespace,
                        vec![
                            j.id.to_string(),
                            j.cluster.clone(),
                            or_dash(&j.from_version),
                            j.version.to_string(),
                            wire_name(&j.state),
                            position(j),
                            or_dash(&j.driver),
                            j.created_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                        ],
                    );
                }
                t.print();
                more_hint(&page.next_cursor);
            })
        }
    }
}

async fn start(client: &Client, out: OutputFormat, args: StartUpgradeArgs) -> Result<(), CliError> {
    let mut body = json!({ "version": args.version, "force": args.force });
    if !args.components.is_empty() {
        body["components"] = json!(args.components);
    }
    if let Some(repo) = &args.image_repository {
        body["image_repository"] = json!(repo);
    }
    let path = format!("/v1/clusters/{}/upgrades", args.cluster);
    if args.dry_run {
        // The plan has its own route, which answers the same body's plan.
        let path = format!("{path}/plan");
        let answer = client.post(&path, Some(&body)).await?;
        return show(out, &format!("POST {path}"), answer, |plan: UpgradePlan| {
            println!("{} -> {}", or_dash(&plan.current_version), plan.target_version);
            let mut t = Table::new(&["COMPONENT", "CURRENT IMAGE", "NEW IMAGE"]);
            for c in plan.components {
                t.row(vec![wire_name(&c.component), or_dash(&c.current_image), c.new_image]);
            }
            t.print();
        });
    }
    let answer = client.post(&path, Some(&body)).await?;
    let what = format!("POST {path}");
    let id = Client::decode::<UpgradeView>(&what, answer.clone())?.id;
    if !args.wait.wait {
        match out {
            OutputFormat::Json => print_json(&answer),
            OutputFormat::Table => println!("upgrade {id} started; follow it with: drover upgrade status {id}"),
        }
        return Ok(());
    }
    eprintln!("upgrade {id} started");
    let job = wait::wait(client, &Target::Upgrade(id), args.wait.timeout).await?;
    let cluster = args.cluster;
    show(out, &format!("GET /v1/upgrades/{id}"), job, |job: UpgradeView| {
        println!("upgrade {id} succeeded: {cluster} runs {}", job.version)
    })
}

fn position(job: &UpgradeView) -> String {
    match &job.current {
        Some(c) => format!("{} step {}", wire_name(&c.component), c.step),
        None => "-".into(),
    }
}

fn show_job(j: UpgradeView) {
    let upgraded = j.upgraded_components.iter().map(wire_name).collect::<Vec<_>>().join(", ");
    print_fields(&[
        ("id", j.id.to_string()),
        ("cluster", j.cluster.clone()),
        ("version", format!("{} -> {}", or_dash(&j.from_version), j.version)),
        ("state", wire_name(&j.state)),
        ("at", position(&j)),
        ("driver", or_dash(&j.driver)),
        ("upgraded", if upgraded.is_empty() { "-".into() } else { upgraded }),
        ("error", or_dash(&j.error)),
    ]);
    let mut t = Table::new(&["COMPONENT", "STATE", "STEPS DONE", "OLD IMAGE", "NEW IMAGE"]);
    for p in j.progress {
        let done = p.steps.iter().filter(|s| s.state == StepState::Succeeded).count();
        t.row(vec![wire_name(&p.component), wire_name(&p.state), done.to_string(), or_dash(&p.old_image), p.new_image]);
    }
    println!();
    t.print();
}
