//! A machine of a pool that belongs to a cluster is cordoned and drained
//! before its container goes, and its Node deleted after (docs/drain.md). Real
//! Docker for the machines, the Kubernetes API simulator for the cluster.
//! Also: pools may only name registered clusters, and a cluster named by a
//! pool cannot be deleted.

use std::collections::HashSet;
use std::time::Duration;

use drover::config::{RuntimeKind, ServeConfig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::docker::{self, Cleanup, V1, require_docker};
use crate::helpers::{TestApp, assert_problem, config, spawn_app, start, unique, wait_for};
use crate::kube_sim::{KubeSim, Matcher, Op, SimSettings};

const CONVERGE: Duration = Duration::from_secs(90);
const TOKEN: &str = "drain-sim-token-4b7e";

/// A Docker-backed drover, a simulator registered as cluster `sim`, and a
/// pool of `replicas` machines of that cluster, converged.
struct Env {
    sim: KubeSim,
    app: TestApp,
    pool: String,
    _cleanup: Cleanup,
}

/// `termination_delay`: how long evicted pods stay, terminating.
async fn spawn(prefix: &str, replicas: u32, termination_delay: Duration, tweak: impl FnOnce(&mut ServeConfig)) -> Env {
    let settings = SimSettings { token: Some(TOKEN.into()), termination_delay, ..SimSettings::default() };
    let sim = KubeSim::start(settings).await;
    let pool = unique(prefix);
    let cleanup = Cleanup(vec![pool.clone()]);
    let tmp = tempfile::TempDir::new().expect("temporary directory");
    let mut cfg = config(tmp.path(), RuntimeKind::Docker);
    cfg.upgrade_retry_backoff = Duration::from_millis(5);
    cfg.kube_request_timeout = Duration::from_secs(2);
    cfg.drain_timeout = Duration::from_secs(5);
    cfg.drain_poll_interval = Duration::from_millis(50);
    tweak(&mut cfg);
    let app = start(cfg, Some(tmp)).await;
    let res = app
        .request(Method::POST, "/v1/clusters", Some(json!({"name": "sim", "server": sim.url(), "token": TOKEN})))
        .await;
    assert_eq!(
        res.status(),
        StatusCode::CREATED,
        "registering the simulator: {}",
        res.text().await.unwrap_or_default()
    );
    app.create_pool_ok(&pool, replicas, json!({"version": V1, "cluster": "sim"})).await;
    app.wait_converged(&pool, u64::from(replicas), CONVERGE).await;
    Env { sim, app, pool, _cleanup: cleanup }
}

impl Env {
    async fn machines(&self) -> HashSet<String> {
        self.app.machines(&self.pool).await.iter().filter_map(|m| m["name"].as_str().map(str::to_owned)).collect()
    }

    async fn containers(&self) -> HashSet<String> {
        let d = docker::client().await;
        docker::pool_containers(&d, &self.pool).await.into_iter().map(|c| c.name).collect()
    }

    /// A node per machine, each running a ReplicaSet pod, a bare pod, a
    /// DaemonSet pod and a mirror pod.
    async fn populate_nodes(&self) -> HashSet<String> {
        let machines = self.machines().await;
        for m in &machines {
            self.sim.add_node(m);
            self.sim.add_node_pod("default", &format!("web-{m}"), m, Some("ReplicaSet"), false);
            self.sim.add_node_pod("batch", &format!("bare-{m}"), m, None, false);
            self.sim.add_node_pod("kube-system", &format!("proxy-{m}"), m, Some("DaemonSet"), false);
            self.sim.add_node_pod("kube-system", &format!("static-{m}"), m, Some("Node"), true);
        }
        machines
    }

    async fn reasons(&self) -> Vec<String> {
        // Oldest first.
        let mut events = self.app.events(&self.pool).await;
        events.reverse();
        events.iter().filter_map(|e| e["reason"].as_str().map(str::to_owned)).collect()
    }
}

fn position(ops: &[Op], what: &str, found: impl Fn(&Op) -> bool) -> usize {
    ops.iter().position(found).unwrap_or_else(|| panic!("no {what} in the op log: {ops:#?}"))
}

fn is(op: &Op, verb: &str, kind: &str, name: &str, status: u16) -> bool {
    op.verb == verb && op.kind == kind && op.name.as_deref() == Some(name) && op.status == status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn scale_down_cordons_then_evicts_and_removes_the_container_only_after_the_pods_are_gone() {
    require_docker();
    let env = spawn("drain", 3, Duration::ZERO, |c| c.drain_timeout = Duration::from_secs(30)).await;
    let machines = env.populate_nodes().await;
    env.sim.block_evictions();
    env.sim.clear_ops();
    assert_eq!(env.app.scale(&env.pool, 2).await.status(), StatusCode::OK);

    // A budget refuses the evictions: the container must stay.
    let sim = &env.sim;
    wait_for(Duration::from_secs(20), "evictions refused with 429", async || {
        sim.ops().iter().filter(|o| o.verb == "evict" && o.status == 429).count() >= 4
    })
    .await;
    assert_eq!(env.containers().await, machines, "no container may go while its pods cannot be evicted");
    let ops = env.sim.ops();
    let cordon = position(&ops, "a cordon", |o| o.verb == "patch" && o.kind == "nodes");
    let victim = ops[cordon].name.clone().expect("cordoned node name");
    assert!(machines.contains(&victim), "the cordoned node {victim} is one of the machines");
    assert_eq!(env.sim.node(&victim).expect("node")["spec"]["unschedulable"], true);
    let listed =
        position(&ops, "the node's pod list", |o| o.fields.as_deref() == Some(&*format!("spec.nodeName={victim}")));
    assert!(cordon < listed, "cordon comes before the drain: {ops:#?}");

    // The budget allows it now: pods go, then the container, then the Node.
    let node_delete = env.sim.hold(Matcher::new("delete", "nodes").name(victim.clone()));
    env.sim.allow_evictions();
    node_delete.reached(Duration::from_secs(30), "the Node delete after the container").await;
    assert!(!env.containers().await.contains(&victim), "the container is gone before its Node is deleted");
    node_delete.release();
    env.app.wait_converged(&env.pool, 2, CONVERGE).await;

    let ops = env.sim.ops();
    let evicted: HashSet<String> =
        ops.iter().filter(|o| o.verb == "evict" && o.status == 201).filter_map(|o| o.name.clone()).collect();
    let want: HashSet<String> = [format!("web-{victim}"), format!("bare-{victim}")].into();
    assert_eq!(evicted, want, "exactly the non-DaemonSet, non-mirror pods of the victim are evicted");
    assert_eq!(env.sim.pods_on_node(&victim).len(), 2, "DaemonSet and mirror pods stay: {ops:#?}");
    let last_evict = ops.iter().rposition(|o| o.verb == "evict" && o.status == 201).unwrap_or_default();
    assert!(last_evict < position(&ops, "the Node delete", |o| is(o, "delete", "nodes", &victim, 200)));
    assert!(env.sim.node(&victim).is_none(), "the Node object is deleted");
    for other in machines.iter().filter(|m| **m != victim) {
        assert!(!ops.iter().any(|o| o.name.as_deref() == Some(other.as_str())), "{other} was touched: {ops:#?}");
        assert_eq!(env.sim.node(other).expect("node")["spec"]["unschedulable"], Value::Null);
    }
    // The deletion's event is written after the Node is gone, by the
    // background deletion, which may finish just after the pool converged.
    wait_for(Duration::from_secs(10), "the MachineDeleted event", async || {
        env.reasons().await.iter().any(|r| r == "MachineDeleted")
    })
    .await;
    let reasons = env.reasons().await;
    let at = |r: &str| reasons.iter().position(|x| x == r).unwrap_or_else(|| panic!("no {r} event: {reasons:?}"));
    assert!(at("MachineCordoned") < at("MachineDrained") && at("MachineDrained") < at("MachineDeleted"), "{reasons:?}");
    let events = env.app.events(&env.pool).await;
    let drained = events.iter().find(|e| e["reason"] == "MachineDrained").expect("drained event");
    assert!(drained["message"].as_str().unwrap_or_default().contains("2 pod(s) evicted"), "{drained}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_machine_whose_node_does_not_exist_is_removed_without_draining() {
    require_docker();
    let env = spawn("nonode", 2, Duration::ZERO, |_| {}).await;
    env.sim.clear_ops();
    assert_eq!(env.app.scale(&env.pool, 1).await.status(), StatusCode::OK);
    env.app.wait_converged(&env.pool, 1, CONVERGE).await;
    let ops = env.sim.ops();
    assert!(ops.iter().any(|o| o.verb == "patch" && o.kind == "nodes" && o.status == 404), "{ops:#?}");
    assert!(!ops.iter().any(|o| o.verb == "evict"), "nothing to evict: {ops:#?}");
    assert_eq!(env.containers().await.len(), 1);
    let events = env.app.events(&env.pool).await;
    assert!(
        events.iter().any(|e| e["reason"] == "MachineDrained"
            && e["message"].as_str().is_some_and(|m| m.contains("nothing to drain")))
    );
    assert!(!events.iter().any(|e| e["reason"] == "DrainFailed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_unreachable_cluster_keeps_the_machine_until_it_answers_again() {
    require_docker();
    let env = spawn("unreach", 2, Duration::ZERO, |c| c.drain_timeout = Duration::from_secs(2)).await;
    let machines = env.populate_nodes().await;
    env.sim.unreachable_for(Duration::from_secs(8));
    assert_eq!(env.app.scale(&env.pool, 1).await.status(), StatusCode::OK);
    let pool = env
        .app
        .wait_pool(&env.pool, Duration::from_secs(20), "a DrainFailed condition", |p| {
            p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| c["type"] == "Reconciled" && c["status"] == "False" && c["reason"] == "DrainFailed")
            })
        })
        .await;
    assert_eq!(env.containers().await, machines, "no container goes while its node cannot be drained");
    let error = pool["status"]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("was not drained") && error.contains("cluster \"sim\""), "{error}");
    let events = env.app.events(&env.pool).await;
    assert!(events.iter().any(|e| e["reason"] == "DrainFailed" && e["type"] == "Warning"), "{events:#?}");

    // The cluster answers again: the retry drains and removes the machine.
    env.app.wait_converged(&env.pool, 1, CONVERGE).await;
    let left = env.containers().await;
    assert_eq!(left.len(), 1);
    let gone: Vec<&String> = machines.difference(&left).collect();
    assert_eq!(gone.len(), 1);
    assert!(env.sim.node(gone[0]).is_none(), "the drained node is deleted after recovery");
    assert!(env.sim.pods_on_node(gone[0]).iter().all(|p| !p.starts_with("web-") && !p.starts_with("bare-")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn deleting_a_pool_drains_every_machine_and_frees_the_cluster() {
    require_docker();
    // Evicted pods take a while to terminate: the drain must wait for them.
    let env = spawn("pooldel", 2, Duration::from_millis(400), |_| {}).await;
    let machines = env.populate_nodes().await;
    let res = env.app.request(Method::DELETE, "/v1/clusters/sim", None).await;
    assert_problem(res, 409, None).await;
    assert_eq!(env.app.delete_pool(&env.pool).await.status(), StatusCode::ACCEPTED);
    env.app.wait_pool(&env.pool, CONVERGE, "the pool to disappear", |p| p.is_null()).await;
    assert!(env.containers().await.is_empty());
    let ops = env.sim.ops();
    for m in &machines {
        let cordon = position(&ops, "a cordon", |o| is(o, "patch", "nodes", m, 200));
        let evict = position(&ops, "an eviction", |o| is(o, "evict", "pods", &format!("web-{m}"), 201));
        let delete = position(&ops, "a Node delete", |o| is(o, "delete", "nodes", m, 200));
        assert!(cordon < evict && evict < delete, "cordon, evict, delete for {m}: {ops:#?}");
        // The pod lists between the eviction and the delete saw it terminating, then gone.
        let looks = ops[evict..delete].iter().filter(|o| o.fields.as_deref() == Some(&*format!("spec.nodeName={m}")));
        assert!(looks.count() >= 2, "the drain waited for the evicted pods of {m} to be gone: {ops:#?}");
        assert!(!ops.iter().any(|o| is(o, "evict", "pods", &format!("proxy-{m}"), 201)), "DaemonSet pod evicted");
    }
    let res = env.app.request(Method::DELETE, "/v1/clusters/sim", None).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the cluster is free once its pools are gone");
}

// ---- cluster references (simulated runtime, no Docker) --------------------------

async fn register_offline_cluster(app: &TestApp, name: &str) {
    // Registration does not contact the server; nothing listens on port 1.
    let body = json!({"name": name, "server": "http://127.0.0.1:1", "token": "t"});
    let res = app.request(Method::POST, "/v1/clusters", Some(body)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

fn broke_rule(problem: &Value, field: &str, rule: &str) -> bool {
    problem["errors"].as_array().is_some_and(|es| es.iter().any(|e| e["field"] == field && e["rule"] == rule))
}

#[tokio::test]
async fn a_pool_naming_an_unregistered_cluster_is_refused() {
    let app = spawn_app().await;
    let res = app.create_pool(json!({"name": "orphan", "replicas": 0, "version": "v1.29.2", "cluster": "nope"})).await;
    let problem = assert_problem(res, 422, Some("cluster")).await;
    assert!(broke_rule(&problem, "cluster", "cluster_exists"), "{problem:#}");
    assert_eq!(app.get_pool("orphan").await.status(), StatusCode::NOT_FOUND, "nothing half-written");

    app.create_pool_ok("plain", 0, json!({})).await;
    let res = app.patch_pool("plain", json!({"cluster": "nope"}), None).await;
    let problem = assert_problem(res, 422, Some("cluster")).await;
    assert!(broke_rule(&problem, "cluster", "cluster_exists"), "{problem:#}");
    assert_eq!(app.pool("plain").await["generation"], 1, "a refused patch changes nothing");

    register_offline_cluster(&app, "prod").await;
    assert_eq!(app.patch_pool("plain", json!({"cluster": "prod"}), None).await.status(), StatusCode::OK);
    app.create_pool_ok("bound", 0, json!({"cluster": "prod"})).await;
}

#[tokio::test]
async fn a_cluster_named_by_pools_cannot_be_deleted() {
    let app = spawn_app().await;
    register_offline_cluster(&app, "prod").await;
    app.create_pool_ok("alpha", 0, json!({"cluster": "prod"})).await;
    app.create_pool_ok("beta", 0, json!({"cluster": "prod"})).await;
    let res = app.request(Method::DELETE, "/v1/clusters/prod", None).await;
    let problem = assert_problem(res, 409, None).await;
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("alpha") && detail.contains("beta"), "the 409 names the pools: {detail}");
    assert_eq!(app.get("/v1/clusters/prod").await.status(), StatusCode::OK);

    for pool in ["alpha", "beta"] {
        assert_eq!(app.patch_pool(pool, json!({"cluster": null}), None).await.status(), StatusCode::OK);
    }
    let res = app.request(Method::DELETE, "/v1/clusters/prod", None).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
}
