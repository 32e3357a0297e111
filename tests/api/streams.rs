//! The Server-Sent Events streams of pools and upgrade jobs, read over real
//! HTTP with the client's own SSE parser, on the simulated runtime.

use std::collections::VecDeque;
use std::time::Duration;

use drover::cli::sse::{Message, Parser};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app};
use crate::upgrade_env::spawn_env;

/// Longest wait for one message; the server polls every 250 ms.
const MESSAGE_LIMIT: Duration = Duration::from_secs(15);

/// One open stream, read message by message.
struct Subscription {
    res: reqwest::Response,
    parser: Parser,
    ready: VecDeque<Message>,
}

impl Subscription {
    async fn open(app: &TestApp, path: &str, last_event_id: Option<i64>) -> Subscription {
        let mut req = app.client.get(app.url(path));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req.send().await.expect("opening the stream");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let ct = res.headers()["content-type"].to_str().unwrap_or_default().to_owned();
        assert!(ct.starts_with("text/event-stream"), "content type {ct}");
        Subscription { res, parser: Parser::default(), ready: VecDeque::new() }
    }

    /// The next message, or `None` when the server ended the stream.
    async fn next(&mut self) -> Option<Message> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                return Some(m);
            }
            let chunk = tokio::time::timeout(MESSAGE_LIMIT, self.res.chunk())
                .await
                .expect("no message within 15 s: the stream stopped polling the store")
                .expect("reading the stream");
            self.ready.extend(self.parser.push(&chunk?));
        }
    }

    /// Messages until one of type `event` matches `done`; all of them, in order.
    async fn until(&mut self, what: &str, done: impl Fn(&Message, &Value) -> bool) -> Vec<(Message, Value)> {
        let mut seen = Vec::new();
        for _ in 0..1000 {
            let m = self.next().await.unwrap_or_else(|| panic!("stream ended before {what}; saw {seen:#?}"));
            let v: Value = serde_json::from_str(&m.data).unwrap_or(Value::Null);
            let stop = done(&m, &v);
            seen.push((m, v));
            if stop {
                return seen;
            }
        }
        panic!("no {what} within 1000 messages");
    }
}

fn statuses(seen: &[(Message, Value)]) -> Vec<&Value> {
    seen.iter().filter(|(m, _)| m.event == "status").map(|(_, v)| v).collect()
}

#[tokio::test]
async fn a_pool_stream_shows_every_status_of_a_scale_from_0_to_5_in_order() {
    let app = spawn_app().await;
    app.create_pool_ok("web", 0, json!({})).await;
    app.wait_converged("web", 0, Duration::from_secs(10)).await;
    let mut sub = Subscription::open(&app, "/v1/pools/web/stream", None).await;
    let first = sub.next().await.expect("a first status at once");
    assert_eq!(first.event, "status");
    let first: Value = serde_json::from_str(&first.data).expect("status JSON");
    assert_eq!((first["name"].as_str(), first["status"]["ready_replicas"].as_u64()), (Some("web"), Some(0)));

    assert_eq!(app.scale("web", 5).await.status(), StatusCode::OK);
    let seen = sub.until("ready_replicas 5", |m, v| m.event == "status" && v["status"]["ready_replicas"] == 5).await;
    let ready: Vec<u64> = statuses(&seen).iter().filter_map(|v| v["status"]["ready_replicas"].as_u64()).collect();
    assert!(ready.windows(2).all(|w| w[0] <= w[1]), "ready_replicas went backwards: {ready:?}");
    assert_eq!(ready.last(), Some(&5), "{ready:?}");
    let generations: Vec<i64> = statuses(&seen).iter().filter_map(|v| v["generation"].as_i64()).collect();
    assert!(generations.contains(&2), "the spec change (generation 2) was not sent: {generations:?}");

    let events: Vec<&Value> = seen.iter().filter(|(m, _)| m.event == "event").map(|(_, v)| v).collect();
    let created = events.iter().filter(|e| e["reason"] == "MachineCreated").count();
    assert_eq!(created, 5, "one event per new machine: {events:#?}");
    let ids: Vec<i64> = seen.iter().filter_map(|(m, _)| m.id.as_deref()?.parse().ok()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "event ids out of order: {ids:?}");
}

#[tokio::test]
async fn last_event_id_resumes_a_pool_stream_after_that_event() {
    let app = spawn_app().await;
    app.create_pool_ok("web", 3, json!({})).await;
    app.wait_converged("web", 3, Duration::from_secs(10)).await;
    let mut oldest_first = app.events("web").await;
    oldest_first.reverse();
    assert!(oldest_first.len() >= 3, "{oldest_first:#?}");
    let from = oldest_first[0]["id"].as_i64().expect("event id");

    let mut sub = Subscription::open(&app, "/v1/pools/web/stream", Some(from)).await;
    let seen = sub.until("every later event", |m, _| m.event == "status").await;
    let sent: Vec<i64> =
        seen.iter().filter(|(m, _)| m.event == "event").filter_map(|(_, v)| v["id"].as_i64()).collect();
    let expected: Vec<i64> = oldest_first[1..].iter().filter_map(|e| e["id"].as_i64()).collect();
    assert_eq!(sent, expected, "events after Last-Event-ID {from}, oldest first, before the status");
}

#[tokio::test]
async fn a_pool_stream_ends_with_deleted_when_the_pool_is_gone() {
    let app = spawn_app().await;
    app.create_pool_ok("web", 2, json!({})).await;
    app.wait_converged("web", 2, Duration::from_secs(10)).await;
    let mut sub = Subscription::open(&app, "/v1/pools/web/stream", None).await;
    assert_eq!(app.delete_pool("web").await.status(), StatusCode::ACCEPTED);
    // The simulated runtime removes machines faster than a poll, so the
    // `deleting` phase may never be seen; the end must be.
    let seen = sub.until("deleted", |m, _| m.event == "deleted").await;
    assert_eq!(seen.last().map(|(_, v)| v["subject"].clone()), Some(json!("web")));
    assert!(sub.next().await.is_none(), "the stream should end after `deleted`");
}

#[tokio::test]
async fn streams_of_missing_subjects_are_404_and_bad_event_ids_422() {
    let app = spawn_app().await;
    assert_problem(app.get("/v1/pools/nope/stream").await, 404, None).await;
    assert_problem(app.get("/v1/upgrades/999/stream").await, 404, None).await;
    app.create_pool_ok("web", 0, json!({})).await;
    let res = app.client.get(app.url("/v1/pools/web/stream")).header("last-event-id", "soon").send().await.unwrap();
    assert_problem(res, 422, Some("Last-Event-ID")).await;
}

#[tokio::test]
async fn an_open_stream_does_not_hold_up_shutdown() {
    let mut app = spawn_app().await;
    app.create_pool_ok("web", 0, json!({})).await;
    let mut sub = Subscription::open(&app, "/v1/pools/web/stream", None).await;
    assert!(sub.next().await.is_some());
    // `stop` fails the test when shutdown takes over 40 s.
    tokio::time::timeout(Duration::from_secs(10), app.stop())
        .await
        .expect("shutdown waited for the open stream: streams must end on the shutdown signal");
    // A status the last pass published may still be in flight; then the end.
    for _ in 0..10 {
        if sub.next().await.is_none() {
            return;
        }
    }
    panic!("the stream should have ended with the server");
}

#[tokio::test]
async fn an_upgrade_stream_follows_the_job_to_its_end_and_closes() {
    let env = spawn_env(|_| {}).await;
    let id = env.start_upgrade(json!({})).await;
    let mut sub = Subscription::open(&env.app, &format!("/v1/upgrades/{id}/stream"), Some(0)).await;
    let mut seen = Vec::new();
    for _ in 0..10_000 {
        match sub.next().await {
            Some(m) => seen.push(m),
            None => break,
        }
    }
    let last_status = seen.iter().rev().find(|m| m.event == "status").expect("a status");
    let job: Value = serde_json::from_str(&last_status.data).expect("job JSON");
    assert_eq!(job["state"], "succeeded", "the stream ended before the job did: {job:#}");
    let reasons: Vec<String> = seen
        .iter()
        .filter(|m| m.event == "event")
        .filter_map(|m| serde_json::from_str::<Value>(&m.data).ok()?["reason"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(reasons.first().map(String::as_str), Some("Accepted"), "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| *r == "ComponentUpgraded").count(), 3, "{reasons:?}");
    let steps: Vec<i64> = seen
        .iter()
        .filter(|m| m.event == "status")
        .filter_map(|m| serde_json::from_str::<Value>(&m.data).ok()?["current"]["step"].as_i64())
        .collect();
    assert!(steps.len() >= 3, "step changes should each be a status: {steps:?}");
}
