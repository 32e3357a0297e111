//! Observing a pool: the containers its engines report, joined with the
//! machine records, become what the planner sees (phases, readiness,
//! availability, repairs due) and the records as they should now read.
//! Pure: the engines' answers, the records and the clock go in; nothing
//! is read or written here.

use crate::domain::object::PoolRef;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::plan::Observed;
use crate::db::machines::Machine;
use crate::domain::machine::{MachinePhase, RestartPolicy};
use crate::domain::pool::PoolSpec;
use crate::engines::Unplaceable;
use crate::runtime::{Container, ContainerState, HealthState};

/// The timing rules of machines, from the server's settings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a container without a health check must have run before
    /// it counts as ready: a process that dies on start never does.
    pub settle: Duration,
    pub restart: RestartPolicy,
}

impl Default for Timing {
    fn default() -> Self {
        Self { settle: Duration::from_millis(500), restart: RestartPolicy::default() }
    }
}

/// What a pass knows of one engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineView {
    pub name: String,
    /// Listed, and answering: what its cache says is current.
    pub reachable: bool,
    /// Unreachable (or never listed) past `--engine-lost-after`.
    pub lost: bool,
    /// When it will be given up for lost, while it does not answer.
    pub lost_at: Option<DateTime<Utc>>,
    /// Why it does not answer, while it does not.
    pub error: Option<String>,
    /// The pool may place machines here: its placement names or selects the
    /// engine, and the engine is not draining. Machines elsewhere are moved.
    pub allowed: bool,
    /// The pool's namespace is fenced to engines whose labels this one's do
    /// not match (it is not `allowed` then).
    pub fenced: bool,
    /// Why no new machine of the pool's image may go here now, if none may:
    /// it does not answer, or its placement breaker is open.
    pub unplaceable: Option<Unplaceable>,
    /// Its own placement breaker is open: its creates or starts fail.
    pub failing: bool,
    /// Its first list is under way (for a few seconds at most): what it
    /// holds is not known yet, so new machines wait for it.
    pub first_list: bool,
}

impl EngineView {
    /// New machines of the pool may go here now.
    pub fn placeable(&self) -> bool {
        self.allowed && self.unplaceable.is_none()
    }
}

/// One machine as observed, with the details the planner does not need
/// but status and events do.
#[derive(Debug, Clone)]
pub struct Seen {
    pub observed: Observed,
    /// The record as it should read now.
    pub record: Machine,
}

#[derive(Debug, Default)]
pub struct Observation {
    pub machines: Vec<Seen>,
    /// Records whose container is gone from a reachable engine.
    pub vanished: Vec<Machine>,
    /// The earliest moment something observed changes by the clock alone
    /// (a machine settles, becomes available, times out, is due a restart,
    /// an engine is given up): when the next pass should look again.
    pub next_change: Option<DateTime<Utc>>,
}

impl Observation {
    pub fn observed(&self) -> Vec<Observed> {
        self.machines.iter().map(|s| s.observed.clone()).collect()
    }

    fn change_at(&mut self, t: DateTime<Utc>) {
        self.next_change = Some(self.next_change.map_or(t, |n| n.min(t)));
    }
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// What the engines and the store hold of one pool, as one pass found it.
pub struct World<'a> {
    /// Containers, each with the engine it runs on.
    pub containers: &'a [(String, Container)],
    pub records: &'a [Machine],
    pub engines: &'a [EngineView],
    /// Containers whose first start runs in the background now.
    pub starting: &'a HashSet<String>,
    /// Containers due to settle whose engine could not be asked again
    /// (see [`to_confirm`]): they do not count as ready yet.
    pub unconfirmed: &'a HashSet<String>,
}

/// The containers (engine, id) that settle in this look: running without a
/// health check, past their settle time, and not ready in their record.
/// The engine is asked about each again before it counts as ready: what the
/// cache holds may be a read sent before the settle moment (the answer to
/// its own start, say) while the event of its death is still on its way,
/// and a process that died at once must never count as ready.
pub fn to_confirm(
    containers: &[(String, Container)],
    records: &[Machine],
    engines: &[EngineView],
    timing: &Timing,
    now: DateTime<Utc>,
) -> Vec<(String, String)> {
    let ready: HashSet<&str> = records.iter().filter(|r| r.ready).map(|r| r.name.as_str()).collect();
    let reachable = |name: &str| engines.iter().any(|e| e.name == name && e.reachable);
    containers
        .iter()
        .filter(|(engine, c)| {
            c.state == ContainerState::Running
                && c.health == HealthState::None
                && now >= after(c.started_at.unwrap_or(c.created_at), timing.settle)
                && !ready.contains(c.name.as_str())
                && reachable(engine)
        })
        .map(|(engine, c)| (engine.clone(), c.id.clone()))
        .collect()
}

/// Joins containers (with the engine each runs on) and records.
pub fn observe(pool: &PoolRef, world: &World<'_>, spec: &PoolSpec, timing: &Timing, now: DateTime<Utc>) -> Observation {
    let World { containers, records, engines, starting, unconfirmed } = *world;
    let mut obs = Observation::default();
    let engine = |name: &str| engines.iter().find(|e| e.name == name);
    let by_name: HashMap<&str, &Machine> = records.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut seen_names = HashSet::new();
    for (engine_name, c) in containers {
        seen_names.insert(c.name.as_str());
        let view = engine(engine_name);
        let found = Found {
            engine: engine_name,
            reachable: view.is_some_and(|e| e.reachable),
            lost: view.is_none_or(|e| e.lost),
            allowed: view.is_some_and(|e| e.allowed),
            failing: view.is_some_and(|e| e.failing),
            starting: starting.contains(&c.id),
            confirmed: !unconfirmed.contains(&c.id),
        };
        let look = Look { pool, spec, timing, now };
        let seen = machine(look, found, c, by_name.get(c.name.as_str()).copied(), &mut obs);
        obs.machines.push(seen);
    }
    for r in records {
        if seen_names.contains(r.name.as_str()) {
            continue;
        }
        match engine(&r.engine) {
            // Its engine answers and does not have it: gone behind our back
            // (or its deletion finished).
            Some(e) if e.reachable => obs.vanished.push(r.clone()),
            // Not known to any engine that answers: keep it as unknown.
            Some(e) => {
                let mut record = r.clone();
                record.phase =
                    if r.terminating_since.is_some() { MachinePhase::Terminating } else { MachinePhase::Unknown };
                record.ready = false;
                record.ready_since = None;
                obs.machines.push(Seen { observed: from_record(&record, e, spec), record });
            }
            // Its engine was removed from drover: nothing will report it again.
            None => obs.vanished.push(r.clone()),
        }
    }
    for e in engines {
        // An engine that does not answer is given up at its lost time: that
        // changes this pool if it has machines there.
        let concerned = obs.machines.iter().any(|m| m.observed.engine == e.name);
        if let (Some(at), true) = (e.lost_at, concerned && !e.lost) {
            obs.change_at(at);
        }
    }
    obs.machines.sort_by(|a, b| a.observed.name.cmp(&b.observed.name));
    obs
}

fn from_record(r: &Machine, engine: &EngineView, spec: &PoolSpec) -> Observed {
    let lost = engine.lost;
    Observed {
        name: r.name.clone(),
        container_id: r.container_id.clone(),
        engine: r.engine.clone(),
        phase: r.phase,
        up_to_date: r.image == spec.desired_image() && engine.allowed,
        ready: false,
        available: false,
        stuck: false,
        delete_requested: r.delete_requested,
        deleting: r.terminating_since.is_some(),
        lost,
        repair_due: false,
        failed_restarts: r.failed_restarts,
        failure_domain: r.failure_domain.clone(),
        created_at: r.created_at.timestamp(),
        engine_failing: engine.failing,
        start_in_flight: false,
    }
}

/// Phase and readiness of a running container.
fn running_phase(
    c: &Container,
    record: Option<&Machine>,
    confirmed: bool,
    timing: &Timing,
    now: DateTime<Utc>,
) -> (MachinePhase, Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    match c.health {
        // The image's health check decides; ready since it was first seen healthy.
        HealthState::Healthy => (MachinePhase::Running, Some(record.and_then(|r| r.ready_since).unwrap_or(now)), None),
        HealthState::Unhealthy => (MachinePhase::Running, None, None),
        HealthState::Starting => (MachinePhase::Starting, None, None),
        HealthState::None => {
            let started = c.started_at.unwrap_or(c.created_at);
            let settled = after(started, timing.settle);
            if now >= settled && confirmed {
                (MachinePhase::Running, Some(settled), None)
            } else if now >= settled {
                // Its engine could not be asked again: ask on the next look.
                (MachinePhase::Starting, None, Some(after(now, timing.settle)))
            } else {
                (MachinePhase::Starting, None, Some(settled))
            }
        }
    }
}

/// Where a container was found, and what the pass knows of that engine.
#[derive(Clone, Copy)]
struct Found<'a> {
    engine: &'a str,
    reachable: bool,
    lost: bool,
    allowed: bool,
    /// The engine's placement breaker is open.
    failing: bool,
    /// The container's first start runs in the background now.
    starting: bool,
    /// Not among the containers whose settling could not be confirmed.
    confirmed: bool,
}

/// The pool being observed, its rules and the moment of the look.
#[derive(Clone, Copy)]
struct Look<'a> {
    pool: &'a PoolRef,
    spec: &'a PoolSpec,
    timing: &'a Timing,
    now: DateTime<Utc>,
}

fn machine(look: Look<'_>, found: Found<'_>, c: &Container, record: Option<&Machine>, obs: &mut Observation) -> Seen {
    let Look { pool, spec, timing, now } = look;
    let Found { engine, reachable, lost, allowed, failing, starting, confirmed } = found;
    let terminating = record.and_then(|r| r.terminating_since).is_some();
    let (mut phase, mut ready_since) = (MachinePhase::Unknown, None);
    if reachable {
        (phase, ready_since) = match c.state {
            ContainerState::Created => (MachinePhase::Creating, None),
            ContainerState::Restarting => (MachinePhase::Starting, None),
            ContainerState::Running => {
                let (p, since, settles_at) = running_phase(c, record, confirmed, timing, now);
                if let Some(t) = settles_at {
                    obs.change_at(t);
                }
                (p, since)
            }
            ContainerState::Paused => (MachinePhase::Paused, None),
            ContainerState::Exited => (MachinePhase::Exited, None),
            ContainerState::Dead => (MachinePhase::Dead, None),
            ContainerState::Removing => (MachinePhase::Terminating, None),
            ContainerState::Unknown => (MachinePhase::Unknown, None),
        };
    }
    if terminating {
        (phase, ready_since) = (MachinePhase::Terminating, None);
    }
    let ready = ready_since.is_some();
    let up_to_date = c.image == spec.desired_image() && allowed;
    let min_ready = Duration::from_secs(u64::from(spec.min_ready_seconds()));
    let available = ready_since.is_some_and(|since| {
        let at = after(since, min_ready);
        if now < at {
            obs.change_at(at);
        }
        now >= at
    });
    let started = c.started_at.unwrap_or(c.created_at);
    let timeout_at = after(started, Duration::from_secs(u64::from(spec.machine_ready_timeout_seconds())));
    let unready_running = matches!(phase, MachinePhase::Running | MachinePhase::Starting) && !ready;
    let stuck = up_to_date && unready_running && now > timeout_at;
    if up_to_date && unready_running && !stuck {
        obs.change_at(timeout_at);
    }
    // A machine that is ready again has recovered: its restarts stop counting.
    let failed_restarts = if ready { 0 } else { record.map_or(0, |r| r.failed_restarts) };
    let repair_due = phase.is_broken() && {
        let ended = c.finished_at.or(record.and_then(|r| r.last_restart_at)).unwrap_or(now);
        let due = after(ended, timing.restart.delay(failed_restarts));
        if now < due {
            obs.change_at(due);
        }
        now >= due
    };
    let record = Machine {
        name: c.name.clone(),
        pool: pool.clone(),
        engine: engine.to_owned(),
        container_id: c.id.clone(),
        image: c.image.clone(),
        failure_domain: c.failure_domain().map(str::to_owned),
        phase,
        state: c.state,
        health: c.health,
        exit_code: c.exit_code,
        oom_killed: c.oom_killed,
        ready,
        delete_requested: record.is_some_and(|r| r.delete_requested),
        ready_since,
        started_at: c.started_at,
        finished_at: c.finished_at,
        restarts: record.map_or(0, |r| r.restarts),
        failed_restarts,
        last_restart_at: record.and_then(|r| r.last_restart_at),
        terminating_since: record.and_then(|r| r.terminating_since),
        terminating_reason: record.and_then(|r| r.terminating_reason.clone()),
        created_at: record.map_or(c.created_at, |r| r.created_at),
        updated_at: record.map_or(now, |r| r.updated_at),
    };
    let observed = Observed {
        name: c.name.clone(),
        container_id: c.id.clone(),
        engine: engine.to_owned(),
        phase,
        up_to_date,
        ready,
        available,
        stuck,
        delete_requested: record.delete_requested,
        deleting: terminating,
        lost,
        repair_due,
        failed_restarts,
        failure_domain: record.failure_domain.clone(),
        created_at: c.created_at.timestamp(),
        engine_failing: failing,
        start_in_flight: starting,
    };
    Seen { observed, record }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::testing::{engine, pool, t0};
    use crate::runtime::labels;

    /// A container of pool `p` on engine `e`, running since `t0`.
    fn running(id: &str) -> (String, Container) {
        let c = Container {
            id: id.into(),
            name: format!("worker-{id}"),
            image: "img:1".into(),
            labels: [(labels::POOL.to_owned(), "p".to_owned())].into(),
            state: ContainerState::Running,
            health: HealthState::None,
            exit_code: None,
            oom_killed: false,
            created_at: t0(),
            started_at: Some(t0()),
            finished_at: None,
        };
        ("e".into(), c)
    }

    fn at_ms(ms: i64) -> DateTime<Utc> {
        t0() + chrono::Duration::milliseconds(ms)
    }

    fn look(
        containers: &[(String, Container)],
        records: &[Machine],
        unconfirmed: &[&str],
        now: DateTime<Utc>,
    ) -> Observation {
        let (engines, starting) = ([engine("e")], HashSet::new());
        let unconfirmed = unconfirmed.iter().map(|id| (*id).to_owned()).collect();
        let world = World { containers, records, engines: &engines, starting: &starting, unconfirmed: &unconfirmed };
        observe(
            &"p".into(),
            &world,
            &pool(serde_json::json!({"replicas": 1, "version": "v1.29.2", "image": "img:1"})).spec,
            &Timing::default(),
            now,
        )
    }

    #[test]
    fn a_container_is_read_again_once_settled_until_its_record_is_ready() {
        let mut health_checked = running("h");
        health_checked.1.health = HealthState::Healthy;
        let mut exited = running("x");
        exited.1.state = ContainerState::Exited;
        let mut elsewhere = running("o");
        elsewhere.0 = "gone".into();
        let containers = [running("a"), health_checked, exited, elsewhere];
        let due = |records: &[Machine], now| to_confirm(&containers, records, &[engine("e")], &Timing::default(), now);
        assert_eq!(due(&[], at_ms(499)), vec![], "not settled yet");
        assert_eq!(
            due(&[], at_ms(500)),
            vec![("e".to_owned(), "a".to_owned())],
            "only the settled one without a health check"
        );
        let records: Vec<Machine> =
            look(&containers, &[], &[], at_ms(600)).machines.into_iter().map(|s| s.record).collect();
        assert!(records.iter().any(|r| r.name == "worker-a" && r.ready));
        assert_eq!(due(&records, at_ms(700)), vec![], "once ready in its record it is not asked about again");
    }

    #[test]
    fn a_settled_container_that_could_not_be_read_again_is_not_ready_and_is_looked_at_again() {
        let containers = [running("a")];
        let now = at_ms(600);
        let obs = look(&containers, &[], &["a"], now);
        let m = &obs.machines[0].observed;
        assert_eq!((m.phase, m.ready), (MachinePhase::Starting, false));
        assert_eq!(obs.next_change, Some(at_ms(1100)));
        let obs = look(&containers, &[], &[], now);
        let m = &obs.machines[0].observed;
        assert_eq!((m.phase, m.ready), (MachinePhase::Running, true));
    }
}
