//! How `--wait` reads a pool's and a job's JSON.

use serde_json::json;

use super::*;

/// A pool's view with `status` set over an empty status.
fn pool(replicas: u64, status: Value) -> Value {
    let mut full = serde_json::to_value(crate::domain::status::PoolStatus::default()).unwrap();
    for (k, f) in status.as_object().unwrap() {
        full[k] = f.clone();
    }
    let status = full;
    json!({"name": "p", "namespace": "default", "replicas": replicas, "version": "v1.29.2", "image": null, "failure_domains": [],
           "extra_mounts": [], "labels": {}, "paused": false, "cluster": null, "engines": [], "engine_selector": {},
           "strategy": {"max_surge": 1, "max_unavailable": 0, "batch_approval": false, "auto_rollback": false,
                        "replacement": "termination_started"},
           "min_ready_seconds": 0, "progress_deadline_seconds": 1, "machine_ready_timeout_seconds": 300,
           "desired_image": "kindest/node:v1.29.2", "generation": 2, "revision": 1, "phase": "active",
           "status": status, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})
}

fn judge_pool(v: &Value) -> Verdict {
    super::judge_pool(&serde_json::from_value(v.clone()).unwrap())
}

/// An upgrade job's view with `fields` set over a pending one.
fn job(fields: Value) -> Value {
    let mut v = json!({"id": 1, "namespace": "default", "cluster": "c", "version": "v1.30.0", "from_version": "v1.29.2",
        "components": ["kube-apiserver", "kube-scheduler"], "image_repository": "registry.k8s.io", "force": false,
        "state": "pending", "current": null, "cancel_requested": false, "driver": null, "error": null, "upgraded_components": [],
        "progress": [], "created_at": "2026-01-01T00:00:00Z", "started_at": null, "finished_at": null,
        "updated_at": "2026-01-01T00:00:00Z"});
    for (k, f) in fields.as_object().unwrap() {
        v[k] = f.clone();
    }
    v
}

fn judge_upgrade(v: &Value) -> Verdict {
    super::judge_upgrade(&serde_json::from_value(job(v.clone())).unwrap())
}

#[test]
fn a_pool_is_done_when_every_machine_is_ready_available_and_up_to_date() {
    let s = json!({"observed_generation": 2, "replicas": 5, "ready_replicas": 5, "updated_replicas": 5, "available_replicas": 5});
    assert_eq!(judge_pool(&pool(5, s)), Verdict::Done);
    let s = json!({"observed_generation": 2, "replicas": 5, "ready_replicas": 4, "updated_replicas": 5, "available_replicas": 4});
    assert!(matches!(judge_pool(&pool(5, s)), Verdict::Pending { total: 5, .. }));
}

#[test]
fn a_status_from_an_older_generation_is_not_trusted() {
    let s = json!({"observed_generation": 1, "replicas": 5, "ready_replicas": 5, "updated_replicas": 5, "available_replicas": 5});
    assert!(matches!(judge_pool(&pool(5, s)), Verdict::Pending { .. }));
}

#[test]
fn a_stalled_rollout_of_the_current_revision_fails_unless_paused() {
    let s = json!({"observed_generation": 2, "replicas": 1, "ready_replicas": 0, "updated_replicas": 1, "available_replicas": 0,
                   "rollout": {"revision": 1, "deadline_exceeded": true, "updated_available": 0, "outdated": 0,
                               "rolling_back": false, "started_at": "2026-01-01T00:00:00Z",
                               "last_progress_at": "2026-01-01T00:00:00Z", "completed_at": null}});
    let mut p = pool(1, s);
    assert!(matches!(judge_pool(&p), Verdict::Failed(m) if m.contains("stalled")));
    p["paused"] = json!(true);
    assert!(matches!(judge_pool(&p), Verdict::Pending { .. }));
    p["paused"] = json!(false);
    p["revision"] = json!(2);
    assert!(matches!(judge_pool(&p), Verdict::Pending { .. }), "a stall of an older revision is history");
}

#[test]
fn upgrade_jobs_end_in_success_or_failure_and_report_their_step() {
    assert_eq!(judge_upgrade(&json!({"state": "succeeded"})), Verdict::Done);
    assert!(
        matches!(judge_upgrade(&json!({"state": "failed", "error": "boom"})), Verdict::Failed(m) if m.contains("boom"))
    );
    assert!(matches!(judge_upgrade(&json!({"state": "cancelled"})), Verdict::Failed(_)));
    let running = json!({"state": "running",
                         "current": {"component": "kube-scheduler", "step": 3, "step_name": "update_daemonset"}});
    assert_eq!(
        judge_upgrade(&running),
        Verdict::Pending { label: "kube-scheduler: step 3 (update_daemonset)".into(), done: 11, total: 16 }
    );
}

#[test]
fn an_answer_that_is_not_the_view_ends_the_wait_with_an_error_naming_the_field() {
    let mut p = pool(1, json!({}));
    p.as_object_mut().unwrap().remove("desired_image");
    let err = Target::Pool("p".into()).judge(&p).unwrap_err().to_string();
    assert_eq!(err, "unexpected answer to GET /v1/pools/p: missing field `desired_image`");
    let mut p = pool(1, json!({}));
    p["status"].as_object_mut().unwrap().remove("ready_replicas");
    let err = Target::Pool("p".into()).judge(&p).unwrap_err().to_string();
    assert_eq!(err, "unexpected answer to GET /v1/pools/p: missing field `status.ready_replicas`");
    let err = Target::Upgrade(1).judge(&json!({"state": "running"})).unwrap_err().to_string();
    assert!(err.starts_with("unexpected answer to GET /v1/upgrades/1: missing field"), "{err}");
}

#[test]
fn bars_fill_in_proportion() {
    assert_eq!(bar(0, 4), format!("[{}]", "-".repeat(30)));
    assert_eq!(bar(2, 4), format!("[{}{}]", "#".repeat(15), "-".repeat(15)));
    assert_eq!(bar(0, 0), format!("[{}]", "#".repeat(30)));
}
