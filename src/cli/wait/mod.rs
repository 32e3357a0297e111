//! `--wait`: follow a pool or an upgrade job until its work ends, showing
//! progress on standard error.
//!
//! The live stream (`GET .../stream`, Server-Sent Events) is tried first;
//! when it cannot be opened or breaks, the wait goes on by polling `GET`,
//! so an older server or a proxy that buffers streams only costs latency.
//! Success, failure and progress are judged from the resource's JSON alone,
//! read into the server's view type, the same way for both paths.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use super::client::{CliError, Client};
use super::output::wire_name;
use super::sse;
use crate::domain::event::{Event, EventType};
use crate::domain::upgrade::JobState;
use crate::error::error_chain;
use crate::http::wire::upgrades::UpgradeView;
use crate::http::wire::{PoolView, pools::PoolPhase};

/// How often the fallback polls.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// A stream silent this long is taken as broken (the server sends a
/// keep-alive comment every 15 s).
const STREAM_IDLE: Duration = Duration::from_secs(45);
/// Consecutive failed polls tolerated (a server restarting) before giving up.
const MAX_POLL_ERRORS: u32 = 5;
/// Upgrade steps per component (0-7), for the progress fraction.
const STEPS_PER_COMPONENT: u64 = 8;

/// What to wait for.
#[derive(Debug, Clone)]
pub enum Target {
    /// The pool's rollout or scale: every machine ready, available and up to
    /// date at the pool's current generation.
    Pool(String),
    /// An upgrade job's end.
    Upgrade(i64),
}

/// What the resource's JSON says about the wait.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Pending { label: String, done: u64, total: u64 },
    Done,
    Failed(String),
}

impl Target {
    fn path(&self) -> String {
        match self {
            Self::Pool(name) => format!("/v1/pools/{name}"),
            Self::Upgrade(id) => format!("/v1/upgrades/{id}"),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Pool(name) => format!("pool {name}"),
            Self::Upgrade(id) => format!("upgrade {id}"),
        }
    }

    /// Judges the resource's JSON; an answer that is not its view is an error.
    pub fn judge(&self, v: &Value) -> Result<Verdict, CliError> {
        let what = format!("GET {}", self.path());
        Ok(match self {
            Self::Pool(_) => judge_pool(&Client::decode(&what, v.clone())?),
            Self::Upgrade(_) => judge_upgrade(&Client::decode(&what, v.clone())?),
        })
    }
}

pub fn judge_pool(p: &PoolView) -> Verdict {
    let s = &p.status;
    let want = p.spec.replicas;
    let (total, ready, updated, available) = (s.replicas, s.ready_replicas, s.updated_replicas, s.available_replicas);
    let current_rollout = s.rollout.as_ref().filter(|r| r.revision == p.revision);
    let done = u64::from(current_rollout.map_or(updated.min(available), |r| r.updated_available));
    let paused = p.spec.paused;
    if p.phase == PoolPhase::Deleting {
        return Verdict::Failed("the pool is being deleted".into());
    }
    if s.observed_generation < p.generation {
        return Verdict::Pending { label: "waiting for the reconciler".into(), done, total: want.into() };
    }
    if current_rollout.is_some_and(|r| r.deadline_exceeded) && !paused {
        let why = s.last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default();
        return Verdict::Failed(format!(
            "the rollout stalled: no progress for {} s, {done} of {want} machines updated and available{why}",
            p.spec.progress_deadline_seconds,
        ));
    }
    if [total, ready, updated, available].iter().all(|n| *n == want) {
        return Verdict::Done;
    }
    let note = if paused { " (paused)" } else { "" };
    let label = format!("{ready} ready, {updated} updated, {total} machines, want {want}{note}");
    Verdict::Pending { label, done: done.min(want.into()), total: want.into() }
}

pub fn judge_upgrade(j: &UpgradeView) -> Verdict {
    let error = j.error.as_deref().unwrap_or("no reason given");
    match j.state {
        JobState::Succeeded => Verdict::Done,
        JobState::Failed => Verdict::Failed(format!("failed: {error}")),
        JobState::Cancelled => Verdict::Failed(format!("cancelled: {error}")),
        state => {
            let total = j.components.len() as u64 * STEPS_PER_COMPONENT;
            let (label, done) = match (&j.current, state) {
                (Some(c), JobState::Running) => {
                    let index = j.components.iter().position(|x| *x == c.component).unwrap_or(0) as u64;
                    let step = u64::try_from(c.step).unwrap_or(0);
                    let name = wire_name(&c.component);
                    (format!("{name}: step {step} ({})", c.step_name), index * STEPS_PER_COMPONENT + step)
                }
                _ => (wire_name(&state), 0),
            };
            Verdict::Pending { label, done, total }
        }
    }
}

/// Waits until `target`'s work ends: its final JSON on success,
/// `CliError::Failed` when it failed, `CliError::Timeout` after `timeout`.
pub async fn wait(client: &Client, target: &Target, timeout: Duration) -> Result<Value, CliError> {
    let mut progress = Progress::new();
    let result = tokio::time::timeout(timeout, follow(client, target, &mut progress)).await;
    progress.finish();
    result.unwrap_or(Err(CliError::Timeout(timeout)))
}

async fn follow(client: &Client, target: &Target, progress: &mut Progress) -> Result<Value, CliError> {
    match follow_stream(client, target, progress).await {
        StreamEnd::Finished(result) => result,
        StreamEnd::Broken(reason) => {
            progress.note(&format!("live stream unavailable ({reason}); polling every {POLL_INTERVAL:?}"));
            poll(client, target, progress).await
        }
    }
}

enum StreamEnd {
    Finished(Result<Value, CliError>),
    Broken(String),
}

async fn follow_stream(client: &Client, target: &Target, progress: &mut Progress) -> StreamEnd {
    let res = match client.open_stream(&format!("{}/stream", target.path()), None).await {
        Ok(res) => res,
        Err(e) => return StreamEnd::Broken(e.to_string()),
    };
    let mut body = res.bytes_stream();
    let mut parser = sse::Parser::default();
    loop {
        let chunk = match tokio::time::timeout(STREAM_IDLE, body.next()).await {
            Err(_) => return StreamEnd::Broken(format!("nothing received for {STREAM_IDLE:?}")),
            Ok(None) => return StreamEnd::Broken("the server closed the stream".into()),
            Ok(Some(Err(e))) => return StreamEnd::Broken(error_chain(&e)),
            Ok(Some(Ok(chunk))) => chunk,
        };
        for message in parser.push(&chunk) {
            if let Some(end) = on_message(target, progress, &message) {
                return StreamEnd::Finished(end);
            }
        }
    }
}

fn on_message(target: &Target, progress: &mut Progress, m: &sse::Message) -> Option<Result<Value, CliError>> {
    match m.event.as_str() {
        "status" => settle(target, progress, serde_json::from_str(&m.data).ok()?),
        "event" => {
            let ev: Event = match Client::decode("an event of the live stream", serde_json::from_str(&m.data).ok()?) {
                Ok(ev) => ev,
                Err(e) => return Some(Err(e)),
            };
            let kind = if ev.type_ == EventType::Warning { "warning" } else { "event" };
            progress.note(&format!("{kind}: {}: {}", ev.reason, ev.message));
            None
        }
        "deleted" => Some(Err(CliError::Failed(format!("{} was deleted while waiting", target.describe())))),
        _ => None,
    }
}

/// Judges one state of the resource; `Some` ends the wait.
fn settle(target: &Target, progress: &mut Progress, v: Value) -> Option<Result<Value, CliError>> {
    let verdict = match target.judge(&v) {
        Ok(verdict) => verdict,
        Err(e) => return Some(Err(e)),
    };
    match verdict {
        Verdict::Done => Some(Ok(v)),
        Verdict::Failed(why) => Some(Err(CliError::Failed(format!("{}: {why}", target.describe())))),
        Verdict::Pending { label, done, total } => {
            progress.update(&label, done, total);
            None
        }
    }
}

async fn poll(client: &Client, target: &Target, progress: &mut Progress) -> Result<Value, CliError> {
    let path = target.path();
    poll_until(progress, || client.get(&path), |progress, v| settle(target, progress, v)).await
}

/// Reads with `read` every [`POLL_INTERVAL`] until `settle` ends the wait
/// (`Some`), tolerating [`MAX_POLL_ERRORS`] unreachable servers in a row (a
/// server restarting). The one poll loop of every `--wait`.
pub(super) async fn poll_until<T, R, Fut>(
    progress: &mut Progress,
    mut read: impl FnMut() -> Fut,
    mut settle: impl FnMut(&mut Progress, T) -> Option<Result<R, CliError>>,
) -> Result<R, CliError>
where
    Fut: std::future::Future<Output = Result<T, CliError>>,
{
    let mut errors = 0;
    loop {
        match read().await {
            Ok(v) => {
                errors = 0;
                if let Some(end) = settle(progress, v) {
                    return end;
                }
            }
            Err(e @ CliError::Unreachable { .. }) if errors < MAX_POLL_ERRORS => {
                errors += 1;
                progress.note(&format!("{e}; retrying"));
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Progress on standard error: a bar redrawn in place with `\r` on a
/// terminal, one plain line per change otherwise (CI logs).
pub(super) struct Progress {
    tty: bool,
    shown: Option<Shown>,
}

/// The progress line on screen.
#[derive(PartialEq)]
struct Shown {
    label: String,
    done: u64,
    total: u64,
}

impl Progress {
    pub(super) fn new() -> Self {
        Self { tty: std::io::stderr().is_terminal(), shown: None }
    }

    pub(super) fn update(&mut self, label: &str, done: u64, total: u64) {
        let line = Shown { label: label.to_owned(), done, total };
        if self.shown.as_ref() == Some(&line) {
            return;
        }
        self.draw(&line);
        self.shown = Some(line);
    }

    fn draw(&self, line: &Shown) {
        let Shown { label, done, total } = line;
        if self.tty {
            eprint!("\r\x1b[2K{} {done}/{total} {label}", bar(*done, *total));
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{done}/{total} {label}");
        }
    }

    /// A line above the bar (an event, a fallback notice).
    pub(super) fn note(&mut self, line: &str) {
        match (&self.shown, self.tty) {
            (Some(shown), true) => {
                eprint!("\r\x1b[2K");
                eprintln!("{line}");
                self.draw(shown);
            }
            _ => eprintln!("{line}"),
        }
    }

    pub(super) fn finish(&mut self) {
        if self.tty && self.shown.is_some() {
            eprintln!();
        }
    }
}

fn bar(done: u64, total: u64) -> String {
    const WIDTH: u64 = 30;
    let filled = (done.min(total) * WIDTH).checked_div(total).unwrap_or(WIDTH);
    format!("[{}{}]", "#".repeat(filled as usize), "-".repeat((WIDTH - filled) as usize))
}

#[cfg(test)]
mod tests;
