//! `POST /v1/apply` and `drover apply`: plans, conflicts, ownership and
//! prune, atomicity under concurrent applies, roles, bad input end to end
//! through the CLI, and a fleet on the real Docker engine.

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::cli::drover_at;
use crate::helpers::{TestApp, assert_problem, spawn_app};

fn pool(name: &str, replicas: u32) -> Value {
    json!({"kind": "Pool", "name": name, "spec": {"replicas": replicas, "version": "v1.29.2"}})
}

fn body(set: &str, documents: Vec<Value>) -> Value {
    json!({"apply_set": set, "documents": documents})
}

async fn post(app: &TestApp, body: Value) -> Response {
    app.request(Method::POST, "/v1/apply", Some(body)).await
}

/// An apply that must succeed; its answer.
async fn applied(app: &TestApp, body: Value) -> Value {
    let res = post(app, body).await;
    let status = res.status();
    let answer: Value = res.json().await.expect("apply JSON");
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    answer
}

/// `(kind name, action)` of every object of an answer.
fn actions(answer: &Value) -> Vec<(String, String)> {
    answer["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| {
            (
                format!("{} {}", o["kind"].as_str().unwrap_or("?"), o["name"].as_str().unwrap_or("?")),
                o["action"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

fn pair(object: &str, action: &str) -> (String, String) {
    (object.to_owned(), action.to_owned())
}

#[tokio::test]
async fn a_dry_run_plans_every_object_and_changes_nothing() {
    let app = spawn_app().await;
    let mut dry = body("fleet", vec![pool("web", 2), pool("api", 1)]);
    dry["dry_run"] = json!(true);
    let answer = applied(&app, dry).await;
    assert_eq!(actions(&answer), [pair("Pool web", "create"), pair("Pool api", "create")]);
    assert_eq!((answer["changed"].as_bool(), answer["dry_run"].as_bool()), (Some(true), Some(true)));
    assert_eq!(answer["needs_role"], "admin");
    let replicas =
        answer["objects"][0]["changes"].as_array().expect("changes").iter().find(|c| c["path"] == "replicas");
    assert_eq!(replicas.map(|c| c["after"].clone()), Some(json!(2)), "{answer:#}");
    assert_eq!(app.get_pool("web").await.status(), StatusCode::NOT_FOUND, "a dry run creates nothing");
    assert_eq!(answer["revision"], Value::Null, "the set was never applied");
}

#[tokio::test]
async fn an_apply_creates_the_fleet_and_the_same_apply_again_changes_nothing() {
    let app = spawn_app().await;
    let first = applied(&app, body("fleet", vec![pool("web", 2), pool("api", 1)])).await;
    assert_eq!(first["revision"], 1);
    assert_eq!(first["objects"][0]["generation"], 1);
    let web = app.wait_converged("web", 2, Duration::from_secs(20)).await;
    assert_eq!(web["replicas"], 2);
    let events = app.events("web").await;
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Created"
                && e["message"].as_str().is_some_and(|m| m.contains("apply set \"fleet\""))),
        "{events:#?}"
    );

    let again = applied(&app, body("fleet", vec![pool("web", 2), pool("api", 1)])).await;
    assert_eq!(actions(&again), [pair("Pool web", "unchanged"), pair("Pool api", "unchanged")]);
    assert_eq!(
        (again["changed"].as_bool(), again["revision"].as_i64()),
        (Some(false), Some(1)),
        "a no-op writes nothing"
    );

    let scaled = applied(&app, body("fleet", vec![pool("web", 3), pool("api", 1)])).await;
    assert_eq!(actions(&scaled)[0], pair("Pool web", "update"));
    assert_eq!(
        scaled["objects"][0]["changes"],
        json!([{"path": "replicas", "before": 2, "after": 3, "secret": false}])
    );
    assert_eq!((scaled["revision"].as_i64(), scaled["needs_role"].as_str()), (Some(2), Some("operator")));
    app.wait_converged("web", 3, Duration::from_secs(20)).await;
}

#[tokio::test]
async fn an_image_change_plans_the_rollout_and_starts_one() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 2)])).await;
    app.wait_converged("web", 2, Duration::from_secs(20)).await;
    let mut moved = pool("web", 2);
    moved["spec"]["image"] = json!("example/node:2");
    let mut dry = body("fleet", vec![moved.clone()]);
    dry["dry_run"] = json!(true);
    let plan = applied(&app, dry).await;
    let rollout = &plan["objects"][0]["rollout"];
    assert_eq!(rollout["desired_image"], "example/node:2", "{plan:#}");
    assert_eq!(rollout["observed"]["outdated"], 2, "{plan:#}");
    assert!(!rollout["plan"]["create"].as_array().expect("creations").is_empty(), "{plan:#}");
    let done = applied(&app, body("fleet", vec![moved])).await;
    assert_eq!(done["objects"][0]["revision"], 2, "a new image is a new revision: {done:#}");
    app.wait_pool("web", Duration::from_secs(30), "the rollout", |p| {
        p["status"]["updated_replicas"] == 2 && p["status"]["replicas"] == 2
    })
    .await;
}

#[tokio::test]
async fn every_invalid_document_is_reported_with_its_path_and_nothing_changes() {
    let app = spawn_app().await;
    let docs = vec![
        pool("good", 1),
        json!({"kind": "Pool", "name": "bad", "spec": {"replicas": "three", "version": "v1.29.2"}}),
        json!({"kind": "Pool", "name": "odd", "spec": {"replicas": 1, "version": "v1.29.2", "colour": "red"}}),
        json!({"kind": "Gadget", "name": "g"}),
        pool("good", 2),
        json!({"kind": "Pool", "name": "orphan", "spec": {"replicas": 1, "version": "v1.29.2", "cluster": "nowhere"}}),
    ];
    let problem = assert_problem(post(&app, body("fleet", docs)).await, 422, Some("documents[1].spec.replicas")).await;
    let fields: Vec<&str> =
        problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
    for field in ["documents[2].spec.colour", "documents[3].kind", "documents[4].name"] {
        assert!(fields.contains(&field), "{field} missing from {fields:?}");
    }
    assert_eq!(app.get_pool("good").await.status(), StatusCode::NOT_FOUND, "nothing is applied when a document is bad");
    let problem = assert_problem(post(&app, body("fleet", vec![pool("good", 1), json!({"kind": "Pool", "name": "orphan", "spec": {"replicas": 1, "version": "v1.29.2", "cluster": "nowhere"}})])).await, 422, Some("documents[1].spec.cluster")).await;
    assert_eq!(problem["errors"][0]["rule"], "cluster_exists");
    assert_problem(post(&app, body("Not A Set", vec![pool("a", 1)])).await, 422, Some("apply_set")).await;
    let many: Vec<Value> = (0..5001).map(|i| pool(&format!("p{i}"), 0)).collect();
    assert_problem(post(&app, body("fleet", many)).await, 422, Some("documents")).await;
    assert_eq!(app.get_pool("good").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_object_changed_by_another_hand_is_a_conflict_left_alone_unless_forced() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 2), pool("api", 1)])).await;
    assert_eq!(app.scale("web", 4).await.status(), StatusCode::OK);
    let answer = applied(&app, body("fleet", vec![pool("web", 2), pool("api", 2)])).await;
    assert_eq!(actions(&answer), [pair("Pool web", "conflict"), pair("Pool api", "update")]);
    let conflict = &answer["objects"][0]["conflict"];
    assert_eq!(
        (conflict["reason"].as_str(), conflict["resolution"].as_str()),
        (Some("changed_elsewhere"), Some("force"))
    );
    assert_eq!(app.pool("web").await["replicas"], 4, "the conflict is left alone");
    assert_eq!(app.pool("api").await["replicas"], 2, "the rest is applied");

    let mut forced = body("fleet", vec![pool("web", 2), pool("api", 2)]);
    forced["force"] = json!(true);
    let answer = applied(&app, forced).await;
    assert_eq!(actions(&answer)[0], pair("Pool web", "update"));
    assert_eq!(app.pool("web").await["replicas"], 2);
    let calm = applied(&app, body("fleet", vec![pool("web", 2), pool("api", 2)])).await;
    assert_eq!(calm["changed"], false, "after force the set owns the pool as it is: {calm:#}");

    // Another hand changing it to just what the set asks is no conflict.
    assert_eq!(app.scale("web", 5).await.status(), StatusCode::OK);
    let same = applied(&app, body("fleet", vec![pool("web", 5), pool("api", 2)])).await;
    assert_eq!(actions(&same)[0], pair("Pool web", "unchanged"), "{same:#}");
}

#[tokio::test]
async fn prune_deletes_only_the_sets_own_objects_and_never_takes_what_it_did_not_create() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 1), pool("old", 1)])).await;
    applied(&app, body("other", vec![pool("theirs", 1)])).await;
    app.create_pool_ok("handmade", 1, json!({})).await;

    let kept = applied(&app, body("fleet", vec![pool("web", 1)])).await;
    assert_eq!(kept["unlisted"], json!([{"kind": "Pool", "name": "old"}]), "without prune it is listed and kept");
    assert_eq!(app.get_pool("old").await.status(), StatusCode::OK);

    let mut prune = body("fleet", vec![pool("web", 1)]);
    prune["prune"] = json!(true);
    let pruned = applied(&app, prune).await;
    assert_eq!(actions(&pruned), [pair("Pool web", "unchanged"), pair("Pool old", "delete")]);
    let old = app.get_pool("old").await;
    assert!(old.status() == StatusCode::NOT_FOUND || old.json::<Value>().await.expect("JSON")["phase"] == "deleting");
    for untouched in ["theirs", "handmade"] {
        assert_eq!(app.pool(untouched).await["phase"], "active", "{untouched} is not this set's");
    }

    // A pool nobody owns is taken over only with adopt; another set's only with adopt and force.
    let taken = applied(&app, body("fleet", vec![pool("web", 1), pool("handmade", 1), pool("theirs", 1)])).await;
    assert_eq!(actions(&taken)[1..], [pair("Pool handmade", "conflict"), pair("Pool theirs", "conflict")]);
    assert_eq!(taken["objects"][1]["conflict"]["reason"], "not_owned");
    assert_eq!(taken["objects"][2]["conflict"]["reason"], "owned_by_another_set");
    let mut adopt = body("fleet", vec![pool("web", 1), pool("handmade", 1), pool("theirs", 1)]);
    adopt["adopt"] = json!(true);
    let adopted = applied(&app, adopt).await;
    assert_eq!(actions(&adopted)[1..], [pair("Pool handmade", "unchanged"), pair("Pool theirs", "conflict")]);
    assert_eq!(adopted["objects"][1]["adopted"], true);
    let mut prune = body("fleet", vec![pool("web", 1)]);
    prune["prune"] = json!(true);
    let pruned = applied(&app, prune).await;
    assert_eq!(
        actions(&pruned),
        [pair("Pool web", "unchanged"), pair("Pool handmade", "delete")],
        "adopted, it is the set's"
    );
    assert_eq!(app.pool("theirs").await["phase"], "active");
}

#[tokio::test]
async fn a_prune_with_no_documents_is_refused_unless_the_request_allows_an_empty_set() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 1), pool("api", 1)])).await;
    for dry_run in [true, false] {
        let mut empty = body("fleet", vec![]);
        empty["prune"] = json!(true);
        empty["dry_run"] = json!(dry_run);
        let res = post(&app, empty).await;
        let problem = assert_problem(res, 422, Some("documents")).await;
        assert_eq!(problem["errors"][0]["field"], "documents", "{problem:#}");
        assert_eq!(problem["errors"][0]["rule"], "prune_without_documents", "{problem:#}");
        assert!(problem["errors"][0]["message"].as_str().is_some_and(|m| m.contains("allow_empty")), "{problem:#}");
    }
    for name in ["web", "api"] {
        assert_eq!(app.pool(name).await["phase"], "active", "{name} was not pruned");
    }
    let mut allowed = body("fleet", vec![]);
    allowed["prune"] = json!(true);
    allowed["allow_empty"] = json!(true);
    let answer = applied(&app, allowed).await;
    assert_eq!(actions(&answer), [pair("Pool api", "delete"), pair("Pool web", "delete")], "pruned in name order");
}

#[tokio::test]
async fn drover_apply_prune_refuses_an_empty_directory_an_empty_file_and_a_comments_only_file() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 1)])).await;
    let dir = fleet_dir(&[("empty.yaml", ""), ("comments.yaml", "# nothing yet\n---\n# still nothing\n")]);
    std::fs::create_dir(dir.path().join("none")).expect("mkdir");
    for input in ["none", "empty.yaml", "comments.yaml"] {
        let path = dir.path().join(input);
        let path = path.to_str().expect("utf-8");
        let run =
            drover_at(&app.addr, Some(&app.admin_token), &["apply", "--prune", "--apply-set", "fleet", "-f", path])
                .await;
        assert_eq!(run.code, 1, "{input}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains("no documents in"), "{input}: {}", run.stderr);
        assert!(run.stderr.contains("--allow-empty"), "{input}: the error names the flag: {}", run.stderr);
        assert_eq!(app.pool("web").await["phase"], "active", "{input}: nothing was pruned");
    }
    let path = dir.path().join("none");
    let path = path.to_str().expect("utf-8");
    let args = ["apply", "--prune", "--allow-empty", "--apply-set", "fleet", "-f", path];
    let run = drover_at(&app.addr, Some(&app.admin_token), &args).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("- Pool web  delete"), "{}", run.stdout);
}

#[tokio::test]
async fn an_apply_whose_every_object_is_a_conflict_says_nothing_was_applied_and_how_to_resolve_it() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 1)])).await;
    app.create_pool_ok("handmade", 1, json!({})).await;
    assert_eq!(app.scale("web", 3).await.status(), StatusCode::OK);
    let dir = fleet_dir(&[(
        "pools.yaml",
        "kind: Pool\nname: web\nspec: {replicas: 2, version: v1.29.2}\n---\nkind: Pool\nname: handmade\nspec: {replicas: 2, version: v1.29.2}\n",
    )]);
    let path = dir.path().join("pools.yaml");
    let path = path.to_str().expect("utf-8");
    let run = drover_at(&app.addr, Some(&app.admin_token), &["apply", "--apply-set", "fleet", "-f", path]).await;
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("apply set fleet (revision 1; nothing applied: 2 conflicts)"), "{}", run.stdout);
    assert!(!run.stdout.contains("; applied)"), "{}", run.stdout);
    assert!(run.stderr.contains("2 objects were left alone as conflicts"), "{}", run.stderr);
    assert!(run.stderr.contains("nothing was applied"), "{}", run.stderr);
    assert!(run.stderr.contains("1: --force overwrites"), "{}", run.stderr);
    assert!(run.stderr.contains("1: --adopt takes over"), "{}", run.stderr);
    assert!(!run.stderr.contains("(409)"), "an answer of 200 is not shown as a 409: {}", run.stderr);
}

#[tokio::test]
async fn two_applies_of_one_set_at_once_one_wins_and_the_loser_changes_nothing() {
    race(&spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn two_applies_of_one_set_at_once_on_docker_one_wins_and_the_loser_changes_nothing() {
    crate::docker::require_docker();
    // Pools of no machines: the race is the store's, and no container is made.
    race(&crate::helpers::spawn_docker_app().await).await;
}

/// Two applies of one set, each of 150 pools of its own, sent at once,
/// until one loses: the loser answers 409 and none of its pools exist; the
/// winner's all do.
async fn race(app: &TestApp) {
    let fleet = |prefix: &str| (0..150).map(|i| pool(&format!("{prefix}{i}"), 0)).collect::<Vec<_>>();
    let mut raced = false;
    for round in 0..5 {
        let (a, b) = (format!("a{round}-"), format!("b{round}-"));
        let (ra, rb) = tokio::join!(post(app, body("race", fleet(&a))), post(app, body("race", fleet(&b))));
        let (sa, sb) = (ra.status(), rb.status());
        assert!([sa, sb].iter().all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT), "{sa} {sb}");
        assert!(sa == StatusCode::OK || sb == StatusCode::OK, "one of the two always wins");
        for (status, prefix, res) in [(sa, &a, ra), (sb, &b, rb)] {
            let answer: Value = res.json().await.expect("JSON");
            let exist = existing(app, prefix).await;
            if status == StatusCode::CONFLICT {
                raced = true;
                assert_eq!(answer["type"], "https://drover.dev/problems/conflict", "{answer:#}");
                assert_eq!(exist, 0, "the loser applied nothing of its {prefix} pools");
            } else {
                assert_eq!(exist, 150, "the winner applied all of its {prefix} pools");
            }
        }
        if raced {
            break;
        }
    }
    assert!(raced, "in five rounds of two simultaneous applies, none lost the race: the guard never ran");
}

/// How many pools named `prefix...` exist (every page).
async fn existing(app: &TestApp, prefix: &str) -> usize {
    let (mut count, mut path) = (0, "/v1/pools?limit=500".to_owned());
    loop {
        let page: Value = app.get(&path).await.json().await.expect("list");
        let items = page["items"].as_array().expect("items");
        count += items.iter().filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with(prefix))).count();
        match page["next_cursor"].as_str() {
            Some(next) => path = format!("/v1/pools?limit=500&cursor={next}"),
            None => return count,
        }
    }
}

#[tokio::test]
async fn each_change_needs_the_role_its_single_object_route_needs() {
    let app = spawn_app().await;
    applied(&app, body("fleet", vec![pool("web", 1)])).await;
    let operator = crate::helpers::client_with_token(&crate::hardening::make_token(&app, "op", "operator").await);
    let viewer = crate::helpers::client_with_token(&crate::hardening::make_token(&app, "view", "viewer").await);
    let send = |client: &reqwest::Client, body: Value| client.post(app.url("/v1/apply")).json(&body).send();

    let res = send(&operator, body("fleet", vec![pool("web", 3)])).await.expect("sent");
    assert_eq!(res.status(), StatusCode::OK, "an operator scales");
    let res = send(&operator, body("fleet", vec![pool("web", 3), pool("new", 1)])).await.expect("sent");
    let problem = assert_problem(res, 403, None).await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("admin")), "{problem:#}");
    assert_eq!(app.get_pool("new").await.status(), StatusCode::NOT_FOUND);

    let mut dry = body("fleet", vec![pool("web", 9)]);
    dry["dry_run"] = json!(true);
    let res = send(&viewer, dry).await.expect("sent");
    assert_eq!(res.status(), StatusCode::OK, "a viewer may plan");
    let res = send(&viewer, body("fleet", vec![pool("web", 3)])).await.expect("sent");
    assert_eq!(res.status(), StatusCode::OK, "a no-op needs no role above viewer");
    assert_problem(send(&viewer, body("fleet", vec![pool("web", 4)])).await.expect("sent"), 403, None).await;
}

#[tokio::test]
async fn if_match_pins_the_revision_and_idempotency_keys_replay() {
    let app = spawn_app().await;
    let keyed = |key: &str, body: Value| {
        app.client.post(app.url("/v1/apply")).header("idempotency-key", key.to_owned()).json(&body).send()
    };
    let first = keyed("k1", body("fleet", vec![pool("web", 1)])).await.expect("sent");
    assert_eq!((first.status(), first.headers()["etag"].to_str().ok()), (StatusCode::OK, Some("\"1\"")));
    let replay = keyed("k1", body("fleet", vec![pool("web", 1)])).await.expect("sent");
    assert_eq!(replay.headers().get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));

    let pinned = |tag: &str, body: Value| {
        app.client.post(app.url("/v1/apply")).header("if-match", tag.to_owned()).json(&body).send()
    };
    assert_problem(pinned("\"7\"", body("fleet", vec![pool("web", 2)])).await.expect("sent"), 412, None).await;
    assert_eq!(app.pool("web").await["replicas"], 1);
    let ok = pinned("\"1\"", body("fleet", vec![pool("web", 2)])).await.expect("sent");
    assert_eq!((ok.status(), ok.headers()["etag"].to_str().ok()), (StatusCode::OK, Some("\"2\"")));
    let new_set = pinned("\"0\"", body("fresh", vec![pool("api", 1)])).await.expect("sent");
    assert_eq!(new_set.status(), StatusCode::OK, "\"0\" is a set never applied");
}

#[tokio::test]
async fn engines_and_clusters_are_created_pruned_when_unused_and_never_changed_in_place() {
    let app = spawn_app().await;
    let engine =
        |labels: Value| json!({"kind": "Engine", "name": "sim-b", "spec": {"endpoint": "sim://b", "labels": labels}});
    let cluster = |token: &str| json!({"kind": "Cluster", "name": "prod", "spec": {"server": "http://127.0.0.1:1", "token": token}});
    let mut pooled = pool("web", 1);
    pooled["spec"]["cluster"] = json!("prod");
    let answer = applied(&app, body("infra", vec![engine(json!({"zone": "a"})), cluster("t1"), pooled])).await;
    assert_eq!(
        actions(&answer),
        [pair("Engine sim-b", "create"), pair("Cluster prod", "create"), pair("Pool web", "create")]
    );
    let secret = answer["objects"][1]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .find(|c| c["path"] == "credentials")
        .cloned();
    assert_eq!(secret, Some(json!({"path": "credentials", "before": null, "after": null, "secret": true})));
    assert!(!answer.to_string().contains("t1"), "no secret in the answer");
    assert_eq!(app.get("/v1/engines/sim-b").await.status(), StatusCode::OK, "the engine is live");

    let rotated = applied(&app, body("infra", vec![engine(json!({"zone": "a"})), cluster("t2"), pool("web", 1)])).await;
    assert_eq!(actions(&rotated)[1], pair("Cluster prod", "update"), "{rotated:#}");
    let relabelled =
        applied(&app, body("infra", vec![engine(json!({"zone": "b"})), cluster("t2"), pool("web", 1)])).await;
    assert_eq!(relabelled["objects"][0]["conflict"]["reason"], "immutable", "{relabelled:#}");

    let mut prune = body("infra", vec![pool("web", 1)]);
    prune["prune"] = json!(true);
    let pruned = applied(&app, prune).await;
    let reasons: Vec<(String, String)> = pruned["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| (o["name"].as_str().unwrap_or("").to_owned(), o["action"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert!(reasons.contains(&("sim-b".into(), "delete".into())), "an engine without machines goes: {pruned:#}");
    assert!(reasons.contains(&("prod".into(), "delete".into())), "{pruned:#}");
    assert_eq!(app.get("/v1/engines/sim-b").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn only_an_admins_apply_compares_secrets_so_a_dry_run_is_no_oracle_for_guesses() {
    let app = spawn_app().await;
    let cluster = |token: &str| json!({"kind": "Cluster", "name": "prod", "spec": {"server": "http://127.0.0.1:1", "token": token}});
    applied(&app, body("infra", vec![cluster("the-real-token")])).await;
    let viewer = crate::helpers::client_with_token(&crate::hardening::make_token(&app, "view", "viewer").await);
    let mut guess = body("infra", vec![cluster("a-guess")]);
    guess["dry_run"] = json!(true);
    let res = viewer.post(app.url("/v1/apply")).json(&guess).send().await.expect("sent");
    let answer: Value = res.json().await.expect("JSON");
    assert_eq!(
        actions(&answer),
        [pair("Cluster prod", "unchanged")],
        "a viewer learns nothing of the token: {answer:#}"
    );
    let as_admin = applied(&app, guess).await;
    assert_eq!(actions(&as_admin), [pair("Cluster prod", "update")], "an admin sees the rotation: {as_admin:#}");
}

#[tokio::test]
async fn a_cluster_a_pool_uses_is_not_pruned() {
    let app = spawn_app().await;
    let cluster = json!({"kind": "Cluster", "name": "prod", "spec": {"server": "http://127.0.0.1:1", "token": "t"}});
    let mut pooled = pool("web", 1);
    pooled["spec"]["cluster"] = json!("prod");
    applied(&app, body("infra", vec![cluster, pooled.clone()])).await;
    let mut prune = body("infra", vec![pooled]);
    prune["prune"] = json!(true);
    let pruned = applied(&app, prune).await;
    assert_eq!(pruned["objects"][1]["conflict"]["reason"], "in_use", "{pruned:#}");
    assert_eq!(app.get("/v1/clusters/prod").await.status(), StatusCode::OK);
}

// ---- the CLI -----------------------------------------------------------------

/// Writes `files` (name, text) into a fresh directory.
fn fleet_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::TempDir::new().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

const POOLS: &str = "\
apiVersion: drover.dev/v1
kind: Pool
name: web
spec:
  replicas: 2
  version: v1.29.2
---
kind: Pool
name: api
spec: {replicas: 1, version: v1.29.2, labels: {team: infra}}
";

#[tokio::test]
async fn drover_apply_shows_a_diff_and_its_detailed_exit_codes_tell_change_from_none() {
    let app = spawn_app().await;
    let dir = fleet_dir(&[("pools.yaml", POOLS)]);
    let path = dir.path().to_str().expect("utf-8");
    let run = |args: &'static [&'static str]| {
        let mut all = vec!["--apply-set", "fleet", "-f", path];
        all.extend_from_slice(args);
        let token = app.admin_token.clone();
        let addr = app.addr.clone();
        async move {
            let mut argv = vec!["apply"];
            argv.extend(all);
            drover_at(&addr, Some(&token), &argv).await
        }
    };
    let dry = run(&["--dry-run", "--detailed-exitcode"]).await;
    assert_eq!(dry.code, 2, "{}{}", dry.stdout, dry.stderr);
    assert!(dry.stdout.contains("+ Pool web  create") && dry.stdout.contains("replicas: 2"), "{}", dry.stdout);
    assert!(dry.stdout.contains("pools.yaml:1 (document 1)"), "{}", dry.stdout);
    assert!(!dry.stdout.contains('\x1b'), "no colour off a terminal");
    assert_eq!(app.get_pool("web").await.status(), StatusCode::NOT_FOUND);

    let done = run(&["--detailed-exitcode", "--wait", "--timeout", "60s"]).await;
    assert_eq!(done.code, 2, "{}{}", done.stdout, done.stderr);
    assert_eq!(app.pool("web").await["status"]["ready_replicas"], 2, "--wait waited for convergence");
    let again = run(&["--detailed-exitcode"]).await;
    assert_eq!(again.code, 0, "the same apply again changes nothing: {}{}", again.stdout, again.stderr);
    assert!(again.stdout.contains("No changes"), "{}", again.stdout);
    let json = run(&["-o", "json"]).await.ok();
    let answer: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(answer["summary"]["unchanged"], 2);

    let diff = drover_at(&app.addr, Some(&app.admin_token), &["diff", "--apply-set", "fleet", "-f", path]).await;
    assert_eq!(diff.code, 0, "{}", diff.stderr);
    assert!(diff.stdout.contains("dry run"), "{}", diff.stdout);

    // A conflict exits 1, naming it.
    assert_eq!(app.scale("api", 3).await.status(), StatusCode::OK);
    std::fs::write(dir.path().join("pools.yaml"), POOLS.replace("replicas: 1", "replicas: 2")).expect("write");
    let conflict = run(&["--detailed-exitcode"]).await;
    assert_eq!(conflict.code, 1, "{}{}", conflict.stdout, conflict.stderr);
    assert!(conflict.stdout.contains("! Pool api  conflict"), "{}", conflict.stdout);
}

#[tokio::test]
async fn drover_apply_prune_and_wait_follow_the_files() {
    let app = spawn_app().await;
    let dir = fleet_dir(&[("a.yaml", POOLS)]);
    let path = dir.path().to_str().expect("utf-8");
    let apply = |extra: &[&str]| {
        let mut argv = vec!["apply", "--apply-set", "fleet", "-f", path];
        argv.extend_from_slice(extra);
        let argv: Vec<String> = argv.into_iter().map(str::to_owned).collect();
        let (addr, token) = (app.addr.clone(), app.admin_token.clone());
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            drover_at(&addr, Some(&token), &argv).await
        }
    };
    apply(&["--wait", "--timeout", "60s"]).await.ok();
    std::fs::write(dir.path().join("a.yaml"), POOLS.split("---").next().expect("first")).expect("write");
    let pruned = apply(&["--prune", "--wait", "--timeout", "60s"]).await.ok();
    assert!(pruned.stdout.contains("- Pool api  delete"), "{}", pruned.stdout);
    assert_eq!(
        app.get_pool("api").await.status(),
        StatusCode::NOT_FOUND,
        "--wait waited until the pruned pool was gone"
    );
}

#[tokio::test]
async fn drover_apply_wait_fails_when_a_rollout_stalls_or_is_rolled_back() {
    let app = spawn_app().await;
    let fleet = |image: &str| {
        format!(
            "kind: Pool\nname: web\nspec:\n  replicas: 1\n  version: v1.29.2\n  image: {image}\n  \
             progress_deadline_seconds: 1\n  strategy: {{auto_rollback: true}}\n"
        )
    };
    let dir = fleet_dir(&[("fleet.yaml", &fleet("example/node:1"))]);
    let path = dir.path().to_str().expect("utf-8").to_owned();
    let apply = |extra: &'static [&'static str]| {
        let (addr, token, path) = (app.addr.clone(), app.admin_token.clone(), path.clone());
        async move {
            let mut argv = vec!["apply", "--apply-set", "fleet", "-f", path.as_str(), "--wait", "--timeout", "60s"];
            argv.extend_from_slice(extra);
            drover_at(&addr, Some(&token), &argv).await
        }
    };
    apply(&[]).await.ok();
    std::fs::write(dir.path().join("fleet.yaml"), fleet("example/crash:1")).expect("write");
    let failed = apply(&[]).await;
    assert_eq!(failed.code, 3, "{}{}", failed.stdout, failed.stderr);
    assert!(failed.stderr.contains("pool web: "), "{}", failed.stderr);
    assert!(failed.stderr.contains("rolled back") || failed.stderr.contains("stalled"), "{}", failed.stderr);
    let detailed = apply(&["--detailed-exitcode", "--force"]).await;
    assert_eq!(detailed.code, 1, "a failed wait is an error: {}{}", detailed.stdout, detailed.stderr);
}

/// Runs `drover apply --dry-run -f <file>` on `text` and answers (exit code, stderr).
async fn dry_run_of(app: &TestApp, name: &str, text: &str) -> (i32, String) {
    let dir = fleet_dir(&[(name, text)]);
    let path = dir.path().join(name);
    let path = path.to_str().expect("utf-8");
    let run =
        drover_at(&app.addr, Some(&app.admin_token), &["apply", "--dry-run", "--apply-set", "fleet", "-f", path]).await;
    (run.code, run.stderr)
}

#[tokio::test]
async fn bad_input_is_an_error_naming_the_file_the_document_and_the_path() {
    let app = spawn_app().await;
    let cases: [(&str, &str, &[&str]); 7] = [
        (
            "unknown kind",
            "kind: Pool\nname: a\nspec: {replicas: 1, version: v1.29.2}\n---\nkind: Gadget\nname: g\n",
            &["bad.yaml:5 (document 2)", "unknown kind \"Gadget\""],
        ),
        (
            "unknown field",
            "kind: Pool\nname: a\nspec:\n  replicas: 1\n  version: v1.29.2\n  colour: red\n",
            &["bad.yaml:1 (document 1): spec.colour", "unknown field"],
        ),
        (
            "the same name twice",
            "kind: Pool\nname: a\nspec: {replicas: 1, version: v1.29.2}\n---\nkind: Pool\nname: a\nspec: {replicas: 2, version: v1.29.2}\n",
            &["bad.yaml:1 (document 1): name", "bad.yaml:5 (document 2): name", "named by more than one document"],
        ),
        (
            "a wrong type",
            "kind: Pool\nname: a\nspec: {replicas: three, version: v1.29.2}\n",
            &["(document 1): spec.replicas", "invalid type"],
        ),
        (
            "a duplicate key",
            "kind: Pool\nname: a\nname: b\n",
            &["bad.yaml:3:1: key \"name\" appears twice in one mapping; write each key once"],
        ),
        (
            "an error after an empty document",
            "kind: Pool\nname: a\nspec: {replicas: 1, version: v1.29.2}\n---\n# nothing here yet\n---\nkind: Pool\nname: b\nspec: {replicas: x, version: v1.29.2}\n",
            &["bad.yaml:7 (document 3): spec.replicas"],
        ),
        (
            "an inline secret",
            "kind: Cluster\nname: c\nspec: {server: 'https://10.0.0.1:6443', token: hunter2}\n",
            &["bad.yaml:1 (document 1): spec.token: secrets are not written"],
        ),
    ];
    for (what, text, expected) in cases {
        let (code, stderr) = dry_run_of(&app, "bad.yaml", text).await;
        assert_eq!(code, 1, "{what}: {stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{what}: {e:?} missing from {stderr}");
        }
        assert!(!stderr.contains("hunter2"), "{what}: a secret in an error");
        assert!(!stderr.contains("documents["), "{what}: one numbering, the file's: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_bomb_deep_nesting_too_many_documents_and_a_100_mb_file_are_refused_quickly() {
    let app = spawn_app().await;
    let mut bomb = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..10 {
        bomb.push_str(&format!("a{level}: &a{level} [{}]\n", vec![format!("*a{}", level - 1); 10].join(", ")));
    }
    bomb.push_str("kind: Pool\nname: bomb\nspec: *a9\n");
    let deep = format!("kind: Pool\nname: deep\nspec: {}1{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let many = "kind: Pool\nname: p\nspec: {replicas: 1, version: v1.29.2}\n---\n".repeat(5_001);
    let started = std::time::Instant::now();
    for (what, text, expected) in [
        ("a billion laughs", bomb.as_str(), "alias"),
        ("deep nesting", deep.as_str(), "bad.yaml:"),
        ("too many documents", many.as_str(), "more than 5000 documents"),
    ] {
        let (code, stderr) = dry_run_of(&app, "bad.yaml", text).await;
        assert_eq!(code, 1, "{what}: {stderr}");
        assert!(stderr.contains(expected), "{what}: {expected:?} missing from {stderr}");
    }
    assert!(started.elapsed() < Duration::from_secs(30), "refusing took {:?}", started.elapsed());
    // The bomb and a 100 MB file (sparse: refused by its size before a byte
    // is read), each in a process whose peak memory is measured.
    let dir = fleet_dir(&[("bomb.yaml", &bomb)]);
    let huge = dir.path().join("huge.yaml");
    std::fs::File::create(&huge).and_then(|f| f.set_len(100 * 1024 * 1024)).expect("sparse file");
    std::fs::write(dir.path().join("small.yaml"), "kind: Pool\nname: a\nname: b\n").expect("write");
    let (_, _, baseline_kib) = measured(&app, dir.path().join("small.yaml").to_str().expect("utf-8"));
    for (file, expected) in [("bomb.yaml", "alias"), ("huge.yaml", "104857600 bytes")] {
        let path = dir.path().join(file);
        let (code, stderr, peak_kib) = measured(&app, path.to_str().expect("utf-8"));
        assert_eq!(code, 1, "{file}: {stderr}");
        assert!(stderr.contains(expected), "{file}: {expected:?} missing from {stderr}");
        let grew = peak_kib - baseline_kib;
        assert!(grew < 40 * 1024, "{file}: drover grew by {grew} KiB (to {peak_kib}) refusing it");
    }
    assert_eq!(app.get_pool("bomb").await.status(), StatusCode::NOT_FOUND);
}

/// Runs `drover apply --dry-run -f path` and answers its exit code, standard
/// error and peak resident memory in KiB (from `wait4`).
// The child is reaped by `wait4`, which clippy does not know of.
#[allow(clippy::zombie_processes)]
fn measured(app: &TestApp, path: &str) -> (i32, String, i64) {
    use std::io::Read as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["apply", "--dry-run", "--apply-set", "fleet", "-f", path])
        .env("DROVER_SERVER", &app.addr)
        .env("DROVER_TOKEN", &app.admin_token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running drover");
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("reading stderr");
    let mut status = 0;
    // SAFETY: wait4 writes the status and usage it is given, for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = i32::try_from(child.id()).expect("pid");
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid, "waiting for drover");
    (libc::WEXITSTATUS(status), stderr, usage.ru_maxrss)
}

#[tokio::test]
async fn secrets_are_read_from_files_and_environment_variables_and_never_shown() {
    let app = spawn_app().await;
    let dir = fleet_dir(&[
        ("token", "s3cret-token"),
        ("cluster.yaml", "kind: Cluster\nname: prod\nspec:\n  server: http://127.0.0.1:1\n  token: {file: token}\n"),
    ]);
    let path = dir.path().to_str().expect("utf-8");
    let run =
        drover_at(&app.addr, Some(&app.admin_token), &["apply", "--apply-set", "infra", "-f", path, "-o", "json"])
            .await
            .ok();
    assert!(!run.stdout.contains("s3cret"), "{}", run.stdout);
    assert_eq!(app.get("/v1/clusters/prod").await.status(), StatusCode::OK);
    let again = drover_at(
        &app.addr,
        Some(&app.admin_token),
        &["apply", "--apply-set", "infra", "-f", path, "--detailed-exitcode"],
    )
    .await;
    assert_eq!(again.code, 0, "the same secret is no change: {}{}", again.stdout, again.stderr);
    std::fs::write(dir.path().join("token"), "rotated").expect("write");
    let rotated =
        drover_at(&app.addr, Some(&app.admin_token), &["apply", "--apply-set", "infra", "-f", path]).await.ok();
    assert!(rotated.stdout.contains("credentials: (secret, changed)"), "{}", rotated.stdout);
}

#[tokio::test]
async fn drover_schema_prints_a_json_schema_of_fleet_documents_made_from_the_api() {
    let run = drover_at("http://127.0.0.1:1", None, &["schema"]).await.ok();
    let schema: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let defs = &schema["definitions"];
    let spec = &defs["PoolSpecInput"]["properties"];
    assert!(spec["replicas"].is_object() && spec["strategy"].is_object(), "the pool spec is the API's: {spec:#}");
    let tls = &defs["FleetEngineDocument"]["properties"]["spec"]["properties"]["tls"];
    assert!(tls.to_string().contains("#/definitions/SecretRef"), "{tls:#}");
    assert!(!run.stdout.contains("#/components/"), "every reference is the schema's own");
}

// ---- the real Docker engine --------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_fleet_on_docker_is_created_rolled_pruned_and_another_sets_pool_is_untouched() {
    use crate::docker::{Cleanup, V1, V2, pool_containers, require_docker};
    require_docker();
    let (web, db, theirs) =
        (crate::helpers::unique("ap-web"), crate::helpers::unique("ap-db"), crate::helpers::unique("ap-theirs"));
    let _cleanup = Cleanup(vec![web.clone(), db.clone(), theirs.clone()]);
    let app = crate::helpers::spawn_docker_app().await;
    let d = crate::docker::client().await;
    let text = |version: &str, with_db: bool| {
        let mut t = format!("kind: Pool\nname: {web}\nspec: {{replicas: 1, version: {version}}}\n");
        if with_db {
            t.push_str(&format!("---\nkind: Pool\nname: {db}\nspec: {{replicas: 1, version: {V1}}}\n"));
        }
        t
    };
    let dir = fleet_dir(&[("fleet.yaml", &text(V1, true))]);
    let other =
        fleet_dir(&[("other.yaml", &format!("kind: Pool\nname: {theirs}\nspec: {{replicas: 1, version: {V1}}}\n"))]);
    let path = dir.path().to_str().expect("utf-8").to_owned();
    let apply = |set: &'static str, path: String, extra: &'static [&'static str]| {
        let (addr, token) = (app.addr.clone(), app.admin_token.clone());
        async move {
            let mut argv = vec!["apply", "--apply-set", set, "-f", path.as_str(), "--detailed-exitcode"];
            argv.extend_from_slice(extra);
            drover_at(&addr, Some(&token), &argv).await
        }
    };
    let created = apply("fleet", path.clone(), &["--wait", "--timeout", "120s"]).await;
    assert_eq!(created.code, 2, "{}{}", created.stdout, created.stderr);
    let other_path = other.path().to_str().expect("utf-8").to_owned();
    assert_eq!(apply("other", other_path, &["--wait", "--timeout", "120s"]).await.code, 2);
    for pool in [&web, &db, &theirs] {
        assert_eq!(pool_containers(&d, pool).await.len(), 1, "{pool} runs one container");
    }
    let again = apply("fleet", path.clone(), &[]).await;
    assert_eq!(again.code, 0, "nothing changes: {}{}", again.stdout, again.stderr);

    std::fs::write(dir.path().join("fleet.yaml"), text(V2, true)).expect("write");
    let rolled = apply("fleet", path.clone(), &["--wait", "--timeout", "120s"]).await;
    assert_eq!(rolled.code, 2, "{}{}", rolled.stdout, rolled.stderr);
    let running = pool_containers(&d, &web).await;
    assert!(running.iter().any(|c| c.image == format!("kindest/node:{V2}")), "the pool rolled to {V2}: {running:?}");
    // The old machine may still be stopping when the rollout counts as done.
    crate::helpers::wait_for(Duration::from_secs(60), "the old machine to go", async || {
        let seen = pool_containers(&d, &web).await;
        seen.len() == 1 && seen[0].image == format!("kindest/node:{V2}")
    })
    .await;

    std::fs::write(dir.path().join("fleet.yaml"), text(V2, false)).expect("write");
    let pruned = apply("fleet", path.clone(), &["--prune", "--wait", "--timeout", "120s"]).await;
    assert_eq!(pruned.code, 2, "{}{}", pruned.stdout, pruned.stderr);
    assert!(pool_containers(&d, &db).await.is_empty(), "the pruned pool's containers are gone");
    assert_eq!(app.get_pool(&db).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(pool_containers(&d, &theirs).await.len(), 1, "another apply set's pool is untouched");
    assert_eq!(app.pool(&theirs).await["phase"], "active");
}
