//! `drover apply --wait`: every pool the apply created or changed until it
//! has converged and its rollout is complete, and every pool it pruned
//! until it is gone. The pools are read a page at a time (one request for
//! hundreds of pools), each judged as `drover pools ... --wait` judges one.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use super::super::client::{CliError, Client};
use super::super::wait::{Verdict, judge_pool};
use crate::apply::document::Kind;
use crate::apply::plan::Action;
use crate::http::apply::ApplyResult;
use crate::http::wire::PoolView;
use crate::http::wire::pools::PoolList;

const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Consecutive failed reads tolerated (a server restarting) before giving up.
const MAX_POLL_ERRORS: u32 = 5;

/// What a pool must come to.
#[derive(Debug, Clone, PartialEq)]
enum Goal {
    /// Converged at this revision (a rollback would move it).
    Converged {
        revision: i64,
    },
    Gone,
}

/// Waits for every pool of `result` to reach its goal.
pub async fn converge(client: &Client, result: &ApplyResult, timeout: Duration) -> Result<(), CliError> {
    let mut goals: BTreeMap<String, Goal> = BTreeMap::new();
    for o in result.objects.iter().filter(|o| o.kind == Kind::Pool) {
        match (o.action, o.revision) {
            (Action::Create | Action::Update, Some(revision)) => {
                goals.insert(o.name.clone(), Goal::Converged { revision });
            }
            (Action::Delete, _) => {
                goals.insert(o.name.clone(), Goal::Gone);
            }
            _ => {}
        }
    }
    let total = goals.len();
    if total == 0 {
        return Ok(());
    }
    let tty = std::io::stderr().is_terminal();
    let followed = follow(client, &mut goals, total, tty);
    let outcome = tokio::time::timeout(timeout, followed).await.unwrap_or(Err(CliError::Timeout(timeout)));
    if tty {
        eprintln!();
    }
    outcome
}

async fn follow(client: &Client, goals: &mut BTreeMap<String, Goal>, total: usize, tty: bool) -> Result<(), CliError> {
    let mut errors = 0;
    let mut shown = String::new();
    loop {
        let pools = match all_pools(client).await {
            Ok(pools) => {
                errors = 0;
                pools
            }
            Err(e @ CliError::Unreachable { .. }) if errors < MAX_POLL_ERRORS => {
                errors += 1;
                eprintln!("{e}; retrying");
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut pending = Vec::new();
        for (name, goal) in goals.iter() {
            match judge(name, goal, pools.get(name)) {
                Verdict::Done => {}
                Verdict::Failed(why) => return Err(CliError::Failed(format!("pool {name}: {why}"))),
                Verdict::Pending { label, .. } => pending.push((name.clone(), label)),
            }
        }
        goals.retain(|name, _| pending.iter().any(|(p, _)| p == name));
        let done = total - goals.len();
        let line = match pending.first() {
            None => format!("{done}/{total} pools converged"),
            Some((name, label)) => format!("{done}/{total} pools converged; {name}: {label}"),
        };
        if line != shown {
            if tty {
                eprint!("\r\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
            shown = line;
        }
        if goals.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Where one pool stands against its goal.
fn judge(name: &str, goal: &Goal, pool: Option<&PoolView>) -> Verdict {
    match (goal, pool) {
        (Goal::Gone, None) => Verdict::Done,
        (Goal::Gone, Some(_)) => Verdict::Pending { label: "being deleted".into(), done: 0, total: 1 },
        (Goal::Converged { .. }, None) => Verdict::Failed(format!("{name} was deleted while waiting")),
        (Goal::Converged { revision }, Some(p)) if p.revision != *revision => {
            let why = p.status.last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default();
            Verdict::Failed(format!(
                "the rollout was rolled back (or changed by another hand): revision {revision} is now {}, running {}{why}",
                p.revision, p.desired_image
            ))
        }
        (Goal::Converged { .. }, Some(p)) => judge_pool(p),
    }
}

/// Every pool, a page of 500 at a time.
async fn all_pools(client: &Client) -> Result<BTreeMap<String, PoolView>, CliError> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/v1/pools?limit=500".to_owned(),
            Some(c) => format!("/v1/pools?limit=500&cursor={c}"),
        };
        let page: PoolList = Client::decode(&format!("GET {path}"), client.get(&path).await?)?;
        out.extend(page.items.into_iter().map(|p| (p.name.clone(), p)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}
