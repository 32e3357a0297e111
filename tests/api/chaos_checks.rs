//! What must hold through a chaos run (`chaos.rs`), checked on its record:
//! the engine's own events, the requests each replica sent the engine, the
//! database's log of who wrote what, and every answer a client got.
//!
//! - no machine created for a pool that already held its desired size and
//!   surge (a second driver would), nor a running one removed below its
//!   availability bound;
//! - every acknowledged change still there at the end, in the order it was
//!   acknowledged (generations grow with the acknowledgements);
//! - no answer but 2xx, 4xx, or 503 with `Retry-After`; no answer at all
//!   only from a replica killed or paused;
//! - no write of a pass (machine record, status, event) for a pool whose
//!   lease its replica did not hold;
//! - no panic in any replica's log;
//! - every pool converged within [`CONVERGE`] of the last fault.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::chaos::CONVERGE;
use crate::docker::{EngineEvent, Seen};
use crate::rig::{Request, Write};

/// How old a spec a pass may act on: it reads the spec once, then acts
/// on what it planned for the rest of the pass. Up to 0.2 s was seen in
/// 300 s runs on this loaded 2-core machine; 3 s leaves CI room. The
/// summary says how much of it each run used.
const STALE: Duration = Duration::from_secs(3);
/// Right after SIGCONT, a replica may still send what it decided before
/// it was paused (docs/ha.md, "The residual window").
const RESIDUAL: Duration = Duration::from_secs(1);

pub struct Setting {
    pub seed: u64,
    pub faults_for: Duration,
    pub lease: &'static str,
    pub started: SystemTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Kill,
    Pause,
    RestartDb,
    Cut,
}

pub struct Fault {
    pub kind: FaultKind,
    /// The replica it hit (none: the database's restart hits all).
    pub slot: Option<usize>,
    pub began: SystemTime,
    pub ended: SystemTime,
    pub note: String,
}

/// A change of a pool's spec (or its creation), as the client saw it.
#[derive(Debug, Clone)]
pub struct Change {
    pub replicas: Option<u32>,
    pub version: Option<&'static str>,
    /// When it was first sent, and when a 2xx acknowledged it.
    pub sent: SystemTime,
    pub acked: Option<SystemTime>,
    /// A 4xx answered it: not applied.
    pub refused: bool,
    /// The generation the acknowledgement carried.
    pub generation: Option<i64>,
}

impl Change {
    pub fn of(replicas: Option<u32>, version: Option<&'static str>) -> Change {
        Change { replicas, version, sent: SystemTime::now(), acked: None, refused: false, generation: None }
    }

    /// The spec after `next` applied to this one.
    pub fn then(&self, next: &Change) -> Change {
        Change {
            replicas: next.replicas.or(self.replicas),
            version: next.version.or(self.version),
            generation: next.generation.or(self.generation),
            ..next.clone()
        }
    }
}

/// One pool of the run: its strategy and every change, in the order sent.
pub struct PoolRun {
    pub name: String,
    pub surge: u32,
    pub unavailable: u32,
    pub changes: Vec<Change>,
}

/// One answer a client got, or its absence (`status` none).
#[derive(Debug, Clone)]
pub struct Answer {
    pub what: &'static str,
    pub slot: usize,
    pub sent: SystemTime,
    pub at: SystemTime,
    pub status: Option<u16>,
    pub retry_after: bool,
    pub body: Option<Value>,
}

/// A pool at the end: as a replica serves it, its containers, its records.
pub struct Final {
    pub view: Value,
    pub containers: Vec<Seen>,
    pub records: HashSet<String>,
}

/// Everything a run recorded.
pub struct Record {
    pub setting: Setting,
    pub faults: Vec<Fault>,
    pub pools: Vec<PoolRun>,
    pub answers: Vec<Answer>,
    /// The engine's events of each pool, in `pools`' order.
    pub events: Vec<Vec<EngineEvent>>,
    /// What each replica (every incarnation, with its slot) asked the engine.
    pub requests: Vec<(usize, Vec<Request>)>,
    pub writes: Vec<Write>,
    pub last_fault: SystemTime,
    /// How long after the last fault (or the last change, if later) every
    /// pool was at its spec.
    pub converged: Option<Duration>,
    pub final_pools: Vec<Final>,
    /// Logs of replicas that panicked.
    pub panics: Vec<String>,
    /// Every replica process of the run: (slot, pid).
    pub processes: Vec<(usize, u32)>,
}

pub struct Report {
    pub summary: String,
    pub violations: Vec<String>,
    /// Around each broken bound, what every party did: for a report.
    pub evidence: String,
}

/// Whether a pool is at its spec, by its status and by the engine.
pub fn converged(view: &Value, seen: &[Seen]) -> bool {
    let (s, n) = (&view["status"], view["replicas"].as_u64());
    n.is_some()
        && [&s["replicas"], &s["ready_replicas"], &s["updated_replicas"]].iter().all(|v| v.as_u64() == n)
        && s["terminating_replicas"] == 0
        && s["observed_generation"] == view["generation"]
        && seen.len() as u64 == n.unwrap_or(0)
        && seen.iter().all(|c| c.running && view["desired_image"] == c.image.as_str())
}

pub fn check(r: &Record) -> Report {
    let mut v = Vec::new();
    let mut summary = String::new();
    let at = |t: SystemTime| t.duration_since(r.setting.started).map_or(0.0, |d| d.as_secs_f64());
    let s = &r.setting;
    let _ = writeln!(
        summary,
        "chaos run: seed {} (replay: DROVER_CHAOS_SEED={}), {} pools, lease {}, {:?} of faults",
        s.seed,
        s.seed,
        r.pools.len(),
        s.lease,
        s.faults_for
    );
    for f in &r.faults {
        let _ = writeln!(summary, "  fault {:>6.1}s..{:>6.1}s  {}", at(f.began), at(f.ended), f.note);
    }
    check_answers(r, &mut v, &mut summary);
    let creators = creators(r);
    let mut evidence = String::new();
    for (i, p) in r.pools.iter().enumerate() {
        check_changes(p, &r.final_pools[i], &mut v, &mut summary);
        let broken = v.len();
        if let Some(first) = check_bounds(r, p, &r.events[i], &creators, &mut v, &mut summary) {
            let _ = writeln!(
                evidence,
                "{} ({} bounds broken), 15 s before the first to 5 s after:",
                p.name,
                v.len() - broken
            );
            let from = first.checked_sub(Duration::from_secs(15)).unwrap_or(first);
            evidence.push_str(&timeline(r, i, from, first + Duration::from_secs(5)));
        }
    }
    check_writes(r, &mut v, &mut summary);
    match r.converged {
        Some(d) => {
            let (d, last) = (d.as_secs_f64(), at(r.last_fault));
            let _ = writeln!(summary, "every pool converged {d:.1}s after the last fault (undone at {last:.1}s)");
        }
        None => v.push(format!(
            "not every pool converged within {CONVERGE:?} of the last fault: {:#}",
            Value::Array(r.final_pools.iter().map(|f| f.view.clone()).collect())
        )),
    }
    for (i, f) in r.final_pools.iter().enumerate() {
        let name = &r.pools[i].name;
        let names: HashSet<String> = f.containers.iter().map(|c| c.name.clone()).collect();
        if names != f.records {
            v.push(format!("{name}: machine records {:?} are not its containers {names:?}", f.records));
        }
    }
    v.extend(r.panics.iter().map(|p| format!("a replica panicked: {p}")));
    let _ = writeln!(summary, "violations: {}", v.len());
    Report { summary, violations: v, evidence }
}

/// Every answer is 2xx, 4xx or 503 with Retry-After; no answer comes only
/// from a replica killed or paused meanwhile.
fn check_answers(r: &Record, v: &mut Vec<String>, summary: &mut String) {
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for a in &r.answers {
        let key = a.status.map_or("no answer".to_owned(), |s| s.to_string());
        *tally.entry(format!("{} {key}", a.what)).or_default() += 1;
        match a.status {
            Some(s) if (200..300).contains(&s) || (400..500).contains(&s) => {}
            Some(503) if a.retry_after => {}
            Some(s) => v.push(format!(
                "a {} to replica {} answered {s} (Retry-After: {}): {:?}",
                a.what, a.slot, a.retry_after, a.body
            )),
            None => {
                let excused = r.faults.iter().any(|f| {
                    matches!(f.kind, FaultKind::Kill | FaultKind::Pause)
                        && f.slot == Some(a.slot)
                        && f.began <= a.at
                        && f.ended >= a.sent
                });
                if !excused {
                    v.push(format!("a {} to replica {}, neither killed nor paused, got no answer", a.what, a.slot));
                }
            }
        }
    }
    let _ = writeln!(summary, "answers: {tally:?}");
}

/// Acknowledged changes grow the generation in acknowledgement order, and
/// the last one is what the pool holds at the end.
fn check_changes(p: &PoolRun, end: &Final, v: &mut Vec<String>, summary: &mut String) {
    let name = &p.name;
    let acked: Vec<&Change> = p.changes.iter().filter(|c| c.acked.is_some()).collect();
    let refused = p.changes.iter().filter(|c| c.refused).count();
    for c in p.changes.iter().filter(|c| c.acked.is_none() && !c.refused) {
        v.push(format!("{name}: a change was neither acknowledged nor refused in its retries: {c:?}"));
    }
    for pair in acked.windows(2) {
        if pair[1].generation <= pair[0].generation {
            v.push(format!(
                "{name}: generations did not grow with the acknowledgements: {:?} then {:?}",
                pair[0], pair[1]
            ));
        }
    }
    let spec = acked.iter().fold(p.changes[0].clone(), |spec, c| spec.then(c));
    let view = &end.view;
    if view["replicas"].as_u64() != spec.replicas.map(u64::from)
        || view["version"].as_str() != spec.version
        || view["generation"].as_i64() != spec.generation
    {
        v.push(format!(
            "{name}: the last acknowledged change is not what the pool holds: acknowledged {spec:?}, holds replicas \
             {} version {} generation {}",
            view["replicas"], view["version"], view["generation"]
        ));
    }
    let _ = writeln!(
        summary,
        "  {name}: {} changes, {} acknowledged, {refused} refused",
        p.changes.len() - 1,
        acked.len() - 1
    );
}

/// How old a spec an action at `t` must have been planned on for `fits`
/// to hold of its desired replicas: zero when a value possibly in effect
/// at `t` fits (a change counts from its sending until the next one is
/// acknowledged); none when no value sent before `t` ever fits.
fn staleness(p: &PoolRun, t: SystemTime, fits: impl Fn(u32) -> bool) -> Option<Duration> {
    let changes: Vec<(u32, &Change)> =
        p.changes.iter().filter(|c| !c.refused).filter_map(|c| Some((c.replicas?, c))).collect();
    let in_effect = |i: usize| {
        let until = changes.get(i + 1).and_then(|(_, next)| next.acked);
        until.filter(|u| *u < t).map_or(Duration::ZERO, |u| t.duration_since(u).unwrap_or_default())
    };
    changes.iter().enumerate().filter(|(_, (n, c))| c.sent <= t && fits(*n)).map(|(i, _)| in_effect(i)).min()
}

/// Which replica (slot) asked for each container, and when.
fn creators(r: &Record) -> HashMap<String, (usize, SystemTime)> {
    let mut out = HashMap::new();
    for (slot, requests) in &r.requests {
        for q in requests {
            if let Some(name) = q.creates() {
                out.insert(name.to_owned(), (*slot, q.at));
            }
        }
    }
    out
}

/// Who asked to stop a container (by its id or name) last before `at`,
/// and who began its deletion in the store: evidence for a report.
fn stopped_by(r: &Record, e: &EngineEvent) -> String {
    let at = |t: SystemTime| t.duration_since(r.setting.started).map_or(0.0, |d| d.as_secs_f64());
    let stops = r.requests.iter().flat_map(|(slot, qs)| qs.iter().map(move |q| (slot, q)));
    let stop = stops
        .filter(|(_, q)| q.at <= e.at && q.changes() && !q.path.contains("/create"))
        .filter(|(_, q)| [&e.id, &e.name].iter().any(|c| !c.is_empty() && q.path.contains(&format!("/containers/{c}"))))
        .max_by_key(|(_, q)| q.at)
        .map_or("no stop request seen".to_owned(), |(slot, q)| format!("{q} by replica {slot} at {:.1}s", at(q.at)));
    let begun = r
        .writes
        .iter()
        .filter(|w| w.tbl == "machines" && w.what == "terminating" && w.detail.as_deref() == Some(e.name.as_str()))
        .map(|w| format!("deletion begun by {} at {:.1}s", w.session, at(SystemTime::from(w.at))))
        .next()
        .unwrap_or_else(|| "no deletion begun in the store".to_owned());
    format!("{stop}; {begun}")
}

/// No create above desired + surge, no running machine removed below
/// desired - unavailable, by the engine's own events. A pass plans on the
/// spec it read when it began, and a deletion once begun is finished, by
/// whichever replica drives the pool next (DESIGN.md): a stop is judged
/// from when its deletion began, and either may rest on a spec up to
/// [`STALE`] old.
fn check_bounds(
    r: &Record,
    p: &PoolRun,
    events: &[EngineEvent],
    creators: &HashMap<String, (usize, SystemTime)>,
    v: &mut Vec<String>,
    summary: &mut String,
) -> Option<SystemTime> {
    let (name, surge, unavailable) = (&p.name, p.surge, p.unavailable);
    let mut first_broken = None;
    let at = |t: SystemTime| t.duration_since(r.setting.started).map_or(0.0, |d| d.as_secs_f64());
    let (mut existing, mut peak) = (0u32, 0u32);
    let mut running: HashSet<&str> = HashSet::new();
    let mut by_slot: BTreeMap<String, usize> = BTreeMap::new();
    let mut residual = Vec::new();
    // The oldest spec an event was within the bounds of: how much of STALE is used.
    let mut oldest = Duration::ZERO;
    let mut judge = |what: String, stale: Option<Duration>, bound: String, at: SystemTime, v: &mut Vec<String>| {
        match stale {
            Some(s) if s <= STALE => oldest = oldest.max(s),
            Some(s) => v.push(format!("{name}: {what}, {bound} until {:.1}s before", s.as_secs_f64())),
            None => v.push(format!("{name}: {what}, {bound} never")),
        }
        if stale.is_none_or(|s| s > STALE) {
            first_broken = first_broken.or(Some(at));
        }
    };
    for e in events {
        match e.action.as_str() {
            "create" => {
                let creator = creators.get(&e.name).map(|c| c.0);
                *by_slot.entry(creator.map_or("?".to_owned(), |c| c.to_string())).or_default() += 1;
                if sent_on_resuming(r, creators.get(&e.name)) {
                    residual.push(e.name.clone());
                } else {
                    let what =
                        format!("{} created by replica {creator:?} at {:.1}s with {existing} there", e.name, at(e.at));
                    let stale = staleness(p, e.at, |d| existing < d + surge);
                    judge(what, stale, format!("desired + surge {surge} allowed it"), e.at, v);
                }
                existing += 1;
                peak = peak.max(existing);
            }
            "destroy" => existing = existing.saturating_sub(1),
            "start" => {
                running.insert(&e.name);
            }
            "die" => {
                running.remove(e.name.as_str());
                let left = running.len() as u32;
                let begun = deletion_begun(r, &e.name).map_or(e.at, |b| b.min(e.at));
                // A machine not ready when its deletion began costs no
                // availability (the planner removes those first, freely).
                if !ready_at(r, &e.name, begun) {
                    continue;
                }
                // Judged by any count in effect from its deletion's start to its stop.
                let stale = staleness(p, e.at, |d| left >= d.saturating_sub(unavailable))
                    .map(|s| s.saturating_sub(e.at.duration_since(begun).unwrap_or_default()));
                let what = format!("{} stopped at {:.1}s leaving {left} running", e.name, at(e.at));
                let bound = format!("desired - unavailable {unavailable} allowed it ({})", stopped_by(r, e));
                judge(what, stale, bound, begun, v);
            }
            _ => {}
        }
    }
    let _ = writeln!(
        summary,
        "  {name}: surge {surge} unavailable {unavailable}, peak {peak} containers, creates by replica {by_slot:?}, \
         the oldest spec acted on {:.1}s old{}",
        oldest.as_secs_f64(),
        if residual.is_empty() { String::new() } else { format!(", sent right after a SIGCONT: {residual:?}") }
    );
    first_broken
}

/// What happened to pool `i` from `from` to `to`, in time order: its changes,
/// the engine's events, the engine requests of every replica for its
/// containers, its writes in the store, and the faults.
fn timeline(r: &Record, i: usize, from: SystemTime, to: SystemTime) -> String {
    let at = |t: SystemTime| t.duration_since(r.setting.started).map_or(0.0, |d| d.as_secs_f64());
    let who = |session: &str| {
        // drover/<host>-<pid>-<random>
        let pid = session.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        let slot = r.processes.iter().find(|(_, p)| Some(*p) == pid).map(|(s, _)| *s);
        format!("replica {} ({session})", slot.map_or("?".to_owned(), |s| s.to_string()))
    };
    let (p, events) = (&r.pools[i], &r.events[i]);
    let mut lines: Vec<(SystemTime, String)> = Vec::new();
    for c in &p.changes {
        let what = format!("replicas {:?} version {:?}", c.replicas, c.version);
        lines.push((c.sent, format!("client: change sent: {what}")));
        if let Some(acked) = c.acked {
            lines.push((acked, format!("client: change acknowledged: {what}, generation {:?}", c.generation)));
        }
    }
    let ours: HashSet<&str> = events.iter().flat_map(|e| [e.name.as_str(), e.id.as_str()]).collect();
    for e in events {
        lines.push((e.at, format!("engine: {} {}", e.action, e.name)));
    }
    for (slot, requests) in &r.requests {
        for q in requests.iter().filter(|q| q.changes()) {
            let target = q.creates().or_else(|| q.path.split("/containers/").nth(1)?.split(['/', '?']).next());
            if target.is_some_and(|t| ours.contains(t)) {
                lines.push((q.at, format!("replica {slot} asked: {q}")));
            }
        }
    }
    for w in r.writes.iter().filter(|w| w.pool.as_deref() == Some(p.name.as_str())) {
        let lease = format!("lease {:?} token {:?}", w.holder, w.token);
        let line = format!("store: {} wrote {} {} {:?} under {lease}", who(&w.session), w.tbl, w.what, w.detail);
        lines.push((SystemTime::from(w.at), line));
    }
    for f in &r.faults {
        lines.push((f.began, format!("fault begins: {}", f.note)));
        lines.push((f.ended, "fault ends".to_owned()));
    }
    lines.sort_by_key(|(t, _)| *t);
    let mut out = String::new();
    for (t, line) in lines.into_iter().filter(|(t, _)| *t >= from && *t <= to) {
        let _ = writeln!(out, "  {:>8.3}s  {line}", at(t));
    }
    out
}

/// Whether the store held machine `name` as ready at `t`.
fn ready_at(r: &Record, name: &str, t: SystemTime) -> bool {
    let flips = r.writes.iter().filter(|w| w.tbl == "machines" && w.detail.as_deref() == Some(name));
    let mut before = flips.filter(|w| SystemTime::from(w.at) <= t && (w.what == "ready" || w.what == "unready"));
    before.next_back().is_some_and(|w| w.what == "ready")
}

/// When the store first marked machine `name` as being deleted.
fn deletion_begun(r: &Record, name: &str) -> Option<SystemTime> {
    r.writes
        .iter()
        .find(|w| w.tbl == "machines" && w.what == "terminating" && w.detail.as_deref() == Some(name))
        .map(|w| SystemTime::from(w.at))
}

/// Whether a create was sent by a replica in its first moment after
/// SIGCONT: decided before the pause.
fn sent_on_resuming(r: &Record, creator: Option<&(usize, SystemTime)>) -> bool {
    creator.is_some_and(|(slot, sent)| {
        r.faults.iter().any(|f| {
            f.kind == FaultKind::Pause && f.slot == Some(*slot) && *sent >= f.began && *sent <= f.ended + RESIDUAL
        })
    })
}

/// A pass writes only under its pool's lease.
fn check_writes(r: &Record, v: &mut Vec<String>, summary: &mut String) {
    let names: HashSet<&str> = r.pools.iter().map(|p| p.name.as_str()).collect();
    let ours = |w: &&Write| w.pool.as_deref().is_some_and(|p| names.contains(p));
    let by_passes: Vec<&Write> = r.writes.iter().filter(ours).filter(|w| w.by_a_pass()).collect();
    let unfenced: Vec<&&Write> = by_passes.iter().filter(|w| !w.under_own_lease()).collect();
    let late = by_passes.iter().filter(|w| w.expires_at.is_some_and(|e| e < w.at)).count();
    let _ = writeln!(
        summary,
        "store: {} writes by passes, {} under a lease not the writer's, {late} committed after their lease's expiry",
        by_passes.len(),
        unfenced.len()
    );
    for w in unfenced.iter().take(10) {
        v.push(format!("a pass wrote under a lease its replica did not hold: {w:?}"));
    }
}

// The checks themselves, on made-up records: each rule catches what it is
// for, and lets pass what the product may do.

#[cfg(test)]
fn record_of(pool: PoolRun, events: Vec<EngineEvent>, requests: Vec<Request>, faults: Vec<Fault>) -> Record {
    let started = SystemTime::UNIX_EPOCH;
    let view = serde_json::json!({"replicas": 2, "version": crate::docker::V1, "generation": 1});
    Record {
        setting: Setting { seed: 1, faults_for: Duration::ZERO, lease: "3s", started },
        faults,
        pools: vec![pool],
        answers: Vec::new(),
        events: vec![events],
        requests: vec![(0, requests)],
        writes: Vec::new(),
        last_fault: started,
        converged: Some(Duration::ZERO),
        final_pools: vec![Final { view, containers: Vec::new(), records: HashSet::new() }],
        panics: Vec::new(),
        processes: Vec::new(),
    }
}

#[cfg(test)]
fn secs(s: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(s)
}

#[cfg(test)]
fn change_at(replicas: Option<u32>, version: Option<&'static str>, sent: f64, acked: f64, generation: i64) -> Change {
    Change {
        replicas,
        version,
        sent: secs(sent),
        acked: Some(secs(acked)),
        refused: false,
        generation: Some(generation),
    }
}

#[cfg(test)]
fn event(at: f64, action: &str, name: &str) -> EngineEvent {
    EngineEvent { at: secs(at), action: action.to_owned(), name: name.to_owned(), id: String::new() }
}

#[test]
fn a_change_counts_as_desired_from_its_sending_until_the_next_is_acknowledged() {
    let first = change_at(Some(2), Some(crate::docker::V1), 0.0, 0.1, 1);
    let p = PoolRun {
        name: "p".into(),
        surge: 1,
        unavailable: 0,
        changes: vec![first, change_at(Some(4), None, 10.0, 11.0, 2)],
    };
    assert_eq!(staleness(&p, secs(5.0), |d| d == 2), Some(Duration::ZERO));
    assert_eq!(staleness(&p, secs(5.0), |d| d == 4), None, "not sent yet");
    assert_eq!(staleness(&p, secs(10.5), |d| d == 2), Some(Duration::ZERO), "sent, not yet acknowledged: either");
    assert_eq!(staleness(&p, secs(10.5), |d| d == 4), Some(Duration::ZERO));
    assert_eq!(
        staleness(&p, secs(13.0), |d| d == 2),
        Some(Duration::from_secs(2)),
        "2 s after the next was acknowledged"
    );
}

#[test]
fn a_create_beyond_desired_and_surge_is_caught_unless_sent_right_after_a_sigcont() {
    let first = change_at(Some(2), Some(crate::docker::V1), 0.0, 0.1, 1);
    let pool = || PoolRun { name: "p".into(), surge: 1, unavailable: 0, changes: vec![first.clone()] };
    let events = || ["a", "b", "c", "d"].iter().map(|n| event(20.0, "create", n)).collect::<Vec<_>>();
    let sent = |name: &str, at: f64| Request {
        method: "POST".into(),
        path: format!("/v1.41/containers/create?name={name}"),
        at: secs(at),
    };
    let requests = vec![sent("a", 19.0), sent("b", 19.0), sent("c", 19.0), sent("d", 19.5)];
    let r = record_of(pool(), events(), requests.clone(), Vec::new());
    let report = check(&r);
    assert_eq!(report.violations.len(), 1, "the 4th container, over 2 + 1: {:?}", report.violations);
    assert!(report.violations[0].contains("d created by replica Some(0)"), "{:?}", report.violations);
    let pause =
        Fault { kind: FaultKind::Pause, slot: Some(0), began: secs(15.0), ended: secs(19.2), note: String::new() };
    let r = record_of(pool(), events(), requests, vec![pause]);
    assert!(check(&r).violations.is_empty(), "decided before the pause (docs/ha.md, the residual window)");
}

#[test]
fn a_running_machine_stopped_below_the_availability_bound_is_caught() {
    let first = change_at(Some(2), Some(crate::docker::V1), 0.0, 0.1, 1);
    let p = PoolRun { name: "p".into(), surge: 1, unavailable: 0, changes: vec![first] };
    let mut events =
        vec![event(1.0, "create", "a"), event(1.1, "start", "a"), event(1.0, "create", "b"), event(1.1, "start", "b")];
    events.extend([
        event(30.0, "create", "c"),
        event(30.1, "start", "c"),
        event(31.0, "die", "a"),
        event(31.1, "destroy", "a"),
        event(32.0, "die", "b"),
        event(32.1, "destroy", "b"),
        // Never ready: its removal costs nothing.
        event(33.0, "create", "d"),
        event(33.1, "start", "d"),
        event(33.5, "die", "d"),
    ]);
    let mut r = record_of(p, events, Vec::new(), Vec::new());
    let wrote = |at: f64, what: &str, machine: &str| Write {
        at: chrono::DateTime::from(secs(at)),
        session: "drover/h-1-x".into(),
        tbl: "machines".into(),
        pool: Some("p".into()),
        what: what.into(),
        detail: Some(machine.into()),
        holder: Some("h-1-x".into()),
        token: Some(1),
        expires_at: None,
    };
    r.writes = vec![wrote(2.0, "ready", "a"), wrote(2.0, "ready", "b"), wrote(30.9, "terminating", "a")];
    r.writes.extend([wrote(31.9, "terminating", "b"), wrote(33.4, "terminating", "d")]);
    let report = check(&r);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    assert!(report.violations[0].contains("b stopped at 32.0s leaving 1 running"), "{:?}", report.violations);
    assert!(report.evidence.contains("32.000s  engine: die b"), "{}", report.evidence);
}

#[test]
fn a_lost_or_reordered_acknowledged_change_is_caught() {
    let first = change_at(Some(2), Some(crate::docker::V1), 0.0, 0.1, 1);
    let later = |g| change_at(Some(3), None, 5.0, 5.1, g);
    let p = PoolRun { name: "p".into(), surge: 1, unavailable: 0, changes: vec![first.clone(), later(2)] };
    let report = check(&record_of(p, Vec::new(), Vec::new(), Vec::new()));
    assert!(report.violations.iter().any(|v| v.contains("is not what the pool holds")), "{:?}", report.violations);
    let p = PoolRun { name: "p".into(), surge: 1, unavailable: 0, changes: vec![first, later(1)] };
    let report = check(&record_of(p, Vec::new(), Vec::new(), Vec::new()));
    assert!(report.violations.iter().any(|v| v.contains("did not grow")), "{:?}", report.violations);
}

#[test]
fn only_2xx_4xx_and_503_with_retry_after_are_answers_and_silence_only_from_a_killed_replica() {
    let first = change_at(Some(2), Some(crate::docker::V1), 0.0, 0.1, 1);
    let p = PoolRun { name: "p".into(), surge: 1, unavailable: 0, changes: vec![first] };
    let kill =
        Fault { kind: FaultKind::Kill, slot: Some(1), began: secs(10.0), ended: secs(12.0), note: String::new() };
    let mut r = record_of(p, Vec::new(), Vec::new(), vec![kill]);
    let answer = |slot, at: f64, status, retry_after| Answer {
        what: "read",
        slot,
        sent: secs(at),
        at: secs(at + 0.1),
        status,
        retry_after,
        body: None,
    };
    r.answers = vec![
        answer(0, 1.0, Some(200), false),
        answer(0, 1.0, Some(404), false),
        answer(0, 1.0, Some(503), true),
        answer(1, 11.0, None, false),
        answer(0, 1.0, Some(503), false),
        answer(0, 1.0, Some(500), true),
        answer(0, 11.0, None, false),
    ];
    let report = check(&r);
    assert_eq!(report.violations.len(), 3, "{:?}", report.violations);
}
