//! How `--wait` reads a pool's and a job's JSON.

use serde_json::json;

use super::*;

fn pool(replicas: u64, status: Value) -> Value {
    json!({"name": "p", "replicas": replicas, "generation": 2, "revision": 1, "paused": false,
           "progress_deadline_seconds": 1, "phase": "active", "status": status})
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
                   "rollout": {"revision": 1, "deadline_exceeded": true, "updated_available": 0}});
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
    let running = json!({"state": "running", "components": ["kube-apiserver", "kube-scheduler"],
                         "current": {"component": "kube-scheduler", "step": 3, "step_name": "update_daemonset"}});
    assert_eq!(
        judge_upgrade(&running),
        Verdict::Pending { label: "kube-scheduler: step 3 (update_daemonset)".into(), done: 11, total: 16 }
    );
}

#[test]
fn bars_fill_in_proportion() {
    assert_eq!(bar(0, 4), format!("[{}]", "-".repeat(30)));
    assert_eq!(bar(2, 4), format!("[{}{}]", "#".repeat(15), "-".repeat(15)));
    assert_eq!(bar(0, 0), format!("[{}]", "#".repeat(30)));
}
