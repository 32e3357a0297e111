//! `drover pools ...` and `drover machines ...`. Answers are read into the
//! server's own view types (`PoolView`, `MachineView`).

use std::path::PathBuf;

use clap::{ArgGroup, Args, Subcommand};
use serde_json::{Map, Value, json};

use super::args::{PageArgs, WaitArgs};
use super::client::{CliError, Client};
use super::output::{ListTable, OutputFormat, Table, more_hint, or_dash, print_fields, print_json, wire_name};
use super::wait::{self, Target};
use crate::http::machines::MachineList;
use crate::http::wire::PoolView;
use crate::http::wire::pools::PoolList;

#[derive(Debug, Subcommand)]
pub enum PoolsCommand {
    /// List pools.
    List(PageArgs),
    /// Show one pool: spec, status and conditions.
    Get { name: String },
    /// Create a pool.
    Create(CreateArgs),
    /// Set the number of machines.
    Scale {
        name: String,
        replicas: u32,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Change the machines' image (starts a rolling update).
    SetImage(SetImageArgs),
    /// Delete a pool and its machines.
    Delete { name: String },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    pub name: String,
    /// Desired number of machines (default 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Kubernetes version, `vMAJOR.MINOR.PATCH`; machines run `kindest/node:<version>`.
    #[arg(long)]
    pub version: Option<String>,
    /// Custom image instead of the version's.
    #[arg(long)]
    pub image: Option<String>,
    /// Failure domain to spread machines over (repeatable).
    #[arg(long = "failure-domain")]
    pub failure_domains: Vec<String>,
    /// Label `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Machines above `replicas` during a rollout (count or percent).
    #[arg(long)]
    pub max_surge: Option<String>,
    /// Machines below `replicas` available during a rollout (count or percent).
    #[arg(long)]
    pub max_unavailable: Option<String>,
    /// Create the pool paused.
    #[arg(long)]
    pub paused: bool,
    /// Registered cluster whose nodes the machines are.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Seconds without progress before the rollout counts as stalled.
    #[arg(long)]
    pub progress_deadline_seconds: Option<u32>,
    /// A JSON file with more of the create body; flags override its fields.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub wait: WaitArgs,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).multiple(false)))]
pub struct SetImageArgs {
    pub name: String,
    /// Run this image.
    #[arg(long, group = "target")]
    pub image: Option<String>,
    /// Run `kindest/node:<version>` (clears a custom image).
    #[arg(long, group = "target")]
    pub version: Option<String>,
    #[command(flatten)]
    pub wait: WaitArgs,
}

#[derive(Debug, Subcommand)]
pub enum MachinesCommand {
    /// List the machines of a pool.
    List {
        pool: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Remove one machine and lower the pool's replicas by one.
    Delete { pool: String, machine: String },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not key=value"))
}

/// `3` as a number, `25%` as a string: what the API accepts.
fn int_or_percent(s: &str) -> Value {
    s.parse::<u64>().map(Value::from).unwrap_or_else(|_| Value::from(s))
}

pub async fn run_pools(client: &Client, out: OutputFormat, cmd: PoolsCommand) -> Result<(), CliError> {
    match cmd {
        PoolsCommand::List(page) => {
            let path = page.query("/v1/pools");
            let page = client.get(&path).await?;
            show_pool_list(out, &format!("GET {path}"), page, client.across())
        }
        PoolsCommand::Get { name } => {
            let path = format!("/v1/pools/{name}");
            let pool = client.get(&path).await?;
            show_pool(out, &format!("GET {path}"), pool)
        }
        PoolsCommand::Create(args) => {
            let body = create_body(&args)?;
            let pool = client.post("/v1/pools", Some(&body)).await?;
            finish(client, out, &args.name, pool, args.wait, "created").await
        }
        PoolsCommand::Scale { name, replicas, wait } => {
            let pool = client.put(&format!("/v1/pools/{name}/scale"), &json!({ "replicas": replicas })).await?;
            finish(client, out, &name, pool, wait, "scaled").await
        }
        PoolsCommand::SetImage(args) => {
            let patch = match (&args.image, &args.version) {
                (Some(image), _) => json!({ "image": image }),
                (None, Some(version)) => json!({ "version": version, "image": null }),
                (None, None) => return Err(CliError::Usage("give --image or --version".into())),
            };
            let pool = client.merge_patch(&format!("/v1/pools/{}", args.name), &patch).await?;
            finish(client, out, &args.name, pool, args.wait, "updated").await
        }
        PoolsCommand::Delete { name } => {
            let pool = client.delete(&format!("/v1/pools/{name}")).await?;
            match out {
                OutputFormat::Json => print_json(&pool),
                OutputFormat::Table => println!("pool {name} is being deleted"),
            }
            Ok(())
        }
    }
}

fn create_body(args: &CreateArgs) -> Result<Value, CliError> {
    let mut body = match &args.file {
        Some(path) => {
            let raw = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
            match serde_json::from_str(&raw) {
                Ok(Value::Object(fields)) => fields,
                Ok(_) => return Err(CliError::Usage(format!("{} must hold a JSON object", path.display()))),
                Err(e) => return Err(CliError::Usage(format!("{} is not JSON: {e}", path.display()))),
            }
        }
        None => Map::new(),
    };
    body.insert("name".into(), json!(args.name));
    if args.replicas.is_some() || !body.contains_key("replicas") {
        body.insert("replicas".into(), json!(args.replicas.unwrap_or(1)));
    }
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(v) = value {
            body.insert(key.to_owned(), v);
        }
    };
    set("version", args.version.clone().map(Value::from));
    set("image", args.image.clone().map(Value::from));
    set("cluster", args.cluster.clone().map(Value::from));
    set("progress_deadline_seconds", args.progress_deadline_seconds.map(Value::from));
    set("paused", args.paused.then_some(Value::Bool(true)));
    set("failure_domains", (!args.failure_domains.is_empty()).then(|| json!(args.failure_domains)));
    let labels: Map<String, Value> = args.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    set("labels", (!labels.is_empty()).then_some(Value::Object(labels)));
    if args.max_surge.is_some() || args.max_unavailable.is_some() {
        let mut strategy = body.get("strategy").and_then(Value::as_object).cloned().unwrap_or_default();
        if let Some(s) = &args.max_surge {
            strategy.insert("max_surge".into(), int_or_percent(s));
        }
        if let Some(u) = &args.max_unavailable {
            strategy.insert("max_unavailable".into(), int_or_percent(u));
        }
        body.insert("strategy".into(), Value::Object(strategy));
    }
    if !body.contains_key("version") {
        return Err(CliError::Usage("a pool needs a version: give --version (e.g. v1.29.2)".into()));
    }
    Ok(Value::Object(body))
}

/// After a change: the answer as is, or with `--wait` the pool once its
/// machines have caught up.
pub async fn finish(
    client: &Client,
    out: OutputFormat,
    name: &str,
    answer: Value,
    wait: WaitArgs,
    what: &str,
) -> Result<(), CliError> {
    let shown =
        if wait.wait { wait::wait(client, &Target::Pool(name.to_owned()), wait.timeout).await? } else { answer };
    if out == OutputFormat::Json {
        print_json(&shown);
        return Ok(());
    }
    let pool: PoolView = Client::decode(&format!("the answer about pool {name}"), shown)?;
    if wait.wait {
        println!("pool {name} {what}: {}", summary(&pool));
    } else {
        println!("pool {name} {what} (generation {})", pool.generation);
    }
    Ok(())
}

fn summary(pool: &PoolView) -> String {
    format!(
        "{}/{} machines ready and up to date, image {}",
        pool.status.ready_replicas, pool.spec.replicas, pool.desired_image
    )
}

fn show_pool_list(out: OutputFormat, what: &str, page: Value, across: bool) -> Result<(), CliError> {
    if out == OutputFormat::Json {
        print_json(&page);
        return Ok(());
    }
    let page: PoolList = Client::decode(what, page)?;
    // Which replica drives each pool, when several share the store.
    let replicas = page.items.iter().any(|p| p.status.driver.is_some());
    let mut columns = vec!["NAME", "PHASE", "REPLICAS", "READY", "UPDATED", "PAUSED", "IMAGE"];
    if replicas {
        columns.push("DRIVER");
    }
    let mut t = ListTable::new(across, &columns);
    for p in &page.items {
        let mut row = vec![
            p.name.clone(),
            wire_name(&p.phase),
            p.spec.replicas.to_string(),
            p.status.ready_replicas.to_string(),
            p.status.updated_replicas.to_string(),
            p.spec.paused.to_string(),
            p.desired_image.clone(),
        ];
        if replicas {
            row.push(or_dash(&p.status.driver));
        }
        t.row(&p.namespace, row);
    }
    t.print();
    more_hint(&page.next_cursor);
    Ok(())
}

fn show_pool(out: OutputFormat, what: &str, answer: Value) -> Result<(), CliError> {
    if out == OutputFormat::Json {
        print_json(&answer);
        return Ok(());
    }
    let p: PoolView = Client::decode(what, answer)?;
    let s = &p.status;
    print_fields(&[
        ("name", p.name.clone()),
        ("phase", wire_name(&p.phase)),
        ("image", p.desired_image.clone()),
        ("version", p.spec.version.clone()),
        ("replicas", p.spec.replicas.to_string()),
        (
            "machines",
            format!(
                "{} total, {} ready, {} updated, {} available",
                s.replicas, s.ready_replicas, s.updated_replicas, s.available_replicas
            ),
        ),
        ("generation", format!("{} (observed {})", p.generation, s.observed_generation)),
        ("revision", p.revision.to_string()),
        ("paused", p.spec.paused.to_string()),
        ("driver", s.driver.clone().unwrap_or_else(|| "this process (one replica)".into())),
        ("last error", or_dash(&s.last_error)),
    ]);
    let mut t = Table::new(&["CONDITION", "STATUS", "REASON", "MESSAGE"]);
    for c in &s.conditions {
        t.row(vec![wire_name(&c.type_), wire_name(&c.status), c.reason.to_string(), c.message.clone()]);
    }
    println!();
    t.print();
    Ok(())
}

pub async fn run_machines(client: &Client, out: OutputFormat, cmd: MachinesCommand) -> Result<(), CliError> {
    match cmd {
        MachinesCommand::List { pool, page } => {
            let path = page.query(&format!("/v1/pools/{pool}/machines"));
            let page = client.get(&path).await?;
            if out == OutputFormat::Json {
                print_json(&page);
                return Ok(());
            }
            let page: MachineList = Client::decode(&format!("GET {path}"), page)?;
            let mut t = Table::new(&["NAME", "PHASE", "READY", "UP-TO-DATE", "FAILURE-DOMAIN", "IMAGE"]);
            for m in &page.items {
                t.row(vec![
                    m.name.clone(),
                    wire_name(&m.phase),
                    m.ready.to_string(),
                    m.up_to_date.to_string(),
                    or_dash(&m.failure_domain),
                    m.image.clone(),
                ]);
            }
            t.print();
            more_hint(&page.next_cursor);
            Ok(())
        }
        MachinesCommand::Delete { pool, machine } => {
            let m = client.delete(&format!("/v1/pools/{pool}/machines/{machine}")).await?;
            match out {
                OutputFormat::Json => print_json(&m),
                OutputFormat::Table => {
                    println!("machine {machine} of pool {pool} is being removed (replicas lowered by one)")
                }
            }
            Ok(())
        }
    }
}
