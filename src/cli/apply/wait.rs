//! `drover apply --wait`: every pool the apply created or changed until it
//! has converged and its rollout is complete, and every pool it pruned
//! until it is gone. The pools are read a page at a time (one request for
//! hundreds of pools), each judged as `drover pools ... --wait` judges one.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::client::{CliError, Client};
use super::super::wait::{Progress, Verdict, judge_pool, poll_until};
use crate::apply::document::Kind;
use crate::apply::plan::Action;
use crate::http::wire::PoolView;
use crate::http::wire::apply::ApplyResult;
use crate::http::wire::pools::PoolList;

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
    for o in result.objects.iter().filter(|o| o.step.kind == Kind::Pool) {
        match (o.step.action, o.revision) {
            (Action::Create | Action::Update, Some(revision)) => {
                goals.insert(o.step.name.clone(), Goal::Converged { revision });
            }
            (Action::Delete, _) => {
                goals.insert(o.step.name.clone(), Goal::Gone);
            }
            _ => {}
        }
    }
    let total = goals.len() as u64;
    if total == 0 {
        return Ok(());
    }
    let mut progress = Progress::new();
    let settle =
        |progress: &mut Progress, pools: BTreeMap<String, PoolView>| settle(&mut goals, total, progress, &pools);
    let followed = poll_until(&mut progress, || all_pools(client), settle);
    let outcome = tokio::time::timeout(timeout, followed).await.unwrap_or(Err(CliError::Timeout(timeout)));
    progress.finish();
    outcome
}

/// Judges every pool still awaited; `Some` once all are done or one failed.
fn settle(
    goals: &mut BTreeMap<String, Goal>,
    total: u64,
    progress: &mut Progress,
    pools: &BTreeMap<String, PoolView>,
) -> Option<Result<(), CliError>> {
    let mut pending = Vec::new();
    for (name, goal) in goals.iter() {
        match judge(name, goal, pools.get(name)) {
            Verdict::Done => {}
            Verdict::Failed(why) => return Some(Err(CliError::Failed(format!("pool {name}: {why}")))),
            Verdict::Pending { label, .. } => pending.push((name.clone(), label)),
        }
    }
    goals.retain(|name, _| pending.iter().any(|(p, _)| p == name));
    let done = total - goals.len() as u64;
    let label = match pending.first() {
        None => "pools converged".to_owned(),
        Some((name, label)) => format!("pools converged; {name}: {label}"),
    };
    progress.update(&label, done, total);
    goals.is_empty().then_some(Ok(()))
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
