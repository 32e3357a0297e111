//! What a client can hold or write (SECURITY.md, "Limits and their
//! defaults"): slow and silent clients are closed, connections and event
//! streams are counted and capped, a stream ends with its token or its
//! lifetime, and client data reaches the log escaped.

use std::time::Duration;

use drover::cli::sse::Parser;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::hardening::{make_token, spawn_with};
use crate::helpers::{TestApp, assert_problem, client_with_token, metric, spawn_app, wait_for};

fn host(app: &TestApp) -> String {
    app.addr.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the socket; the bytes it sent, or a
/// panic naming `what` when it is still open after `limit`.
async fn closed_within(socket: &mut TcpStream, limit: Duration, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.unwrap_or_else(|_| panic!("{what}: still open after {limit:?}; a limit is not enforced"));
    got
}

#[tokio::test]
async fn silent_and_slow_clients_are_closed_by_the_header_timeout() {
    let app = spawn_with(|c| c.header_read_timeout = Duration::from_secs(1)).await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(host(&app)).await.unwrap());
    }
    let mut partial = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(host(&app)).await.unwrap();
        s.write_all(b"GET /v1/pools HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        partial.push(s);
    }
    // Slowloris: a byte of the head every 300 ms never completes it.
    let mut trickling = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(host(&app)).await.unwrap();
        s.write_all(b"G").await.unwrap();
        trickling.push(s);
    }
    let trickle = tokio::spawn(async move {
        for _ in 0..20 {
            // The client's pace (what is under test), not a wait for anything.
            tokio::time::sleep(Duration::from_millis(300)).await;
            for s in &mut trickling {
                let _ = s.write_all(b"E").await;
            }
        }
        trickling
    });
    for s in silent.iter_mut().chain(partial.iter_mut()) {
        closed_within(s, Duration::from_secs(3), "a client that sent no complete head").await;
    }
    let mut trickling = trickle.await.unwrap();
    for s in &mut trickling {
        closed_within(s, Duration::from_millis(100), "a client trickling its head").await;
    }
    assert_eq!(app.get("/v1/pools").await.status(), StatusCode::OK, "others are served meanwhile");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let app = spawn_with(|c| c.idle_timeout = Duration::from_secs(1)).await;
    let mut s = TcpStream::connect(host(&app)).await.unwrap();
    let req = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", app.admin_token);
    s.write_all(req.as_bytes()).await.unwrap();
    let answer = closed_within(&mut s, Duration::from_secs(4), "a kept-alive connection with nothing to do").await;
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
}

#[tokio::test]
async fn connections_beyond_the_cap_are_answered_503_and_closed() {
    let app = spawn_with(|c| c.max_connections = 2).await;
    let held = [TcpStream::connect(host(&app)).await.unwrap(), TcpStream::connect(host(&app)).await.unwrap()];
    wait_for(Duration::from_secs(5), "the server to accept the two held connections", async || {
        metric(&app.metrics_text(), "drover_http_connections ") == 2.0
    })
    .await;
    let mut third = TcpStream::connect(host(&app)).await.unwrap();
    let answer = closed_within(&mut third, Duration::from_secs(2), "a connection over the cap").await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("retry-after: 1") && text.contains("problems/unavailable"), "{text}");
    drop(held);
    wait_for(Duration::from_secs(5), "the server to close the connections its clients left", async || {
        metric(&app.metrics_text(), "drover_http_connections ") == 0.0
    })
    .await;
    assert_eq!(app.get("/v1/pools").await.status(), StatusCode::OK, "slots come back when clients leave");
}

/// An open event stream, read as raw chunks.
struct Stream {
    res: reqwest::Response,
    parser: Parser,
}

impl Stream {
    async fn open(client: &reqwest::Client, app: &TestApp, path: &str) -> reqwest::Response {
        client.get(app.url(path)).send().await.expect("opening a stream")
    }

    async fn ok(client: &reqwest::Client, app: &TestApp, path: &str) -> Stream {
        let res = Stream::open(client, app, path).await;
        assert_eq!(res.status(), StatusCode::OK);
        Stream { res, parser: Parser::default() }
    }

    /// Messages until the server ends the stream, which must be within `limit`.
    async fn until_end(&mut self, limit: Duration, what: &str) -> usize {
        let mut messages = 0;
        let read = tokio::time::timeout(limit, async {
            while let Ok(Some(chunk)) = self.res.chunk().await {
                messages += self.parser.push(&chunk).len();
            }
        });
        read.await.unwrap_or_else(|_| panic!("{what}: the stream is still open after {limit:?}"));
        messages
    }
}

#[tokio::test]
async fn streams_are_capped_end_with_their_lifetime_and_with_their_token() {
    let app = spawn_with(|c| {
        c.max_streams = 2;
        c.stream_lifetime = Duration::from_secs(3);
        c.stream_recheck = Duration::from_millis(300);
    })
    .await;
    app.create_pool_ok("watched", 0, json!({"paused": true})).await;
    let viewer = client_with_token(&make_token(&app, "watcher", "viewer").await);
    let mut revoked = Stream::ok(&viewer, &app, "/v1/pools/watched/stream").await;
    let mut aged = Stream::ok(&app.client, &app, "/v1/pools/watched/stream").await;
    let third = Stream::open(&app.client, &app, "/v1/pools/watched/stream").await;
    assert_eq!(third.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert_problem(third, 503, None).await;

    let res = app.request(reqwest::Method::DELETE, "/v1/tokens/watcher", None).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    revoked.until_end(Duration::from_secs(2), "a stream whose token was revoked").await;
    aged.until_end(Duration::from_secs(5), "a stream past its lifetime").await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    for reason in ["revoked", "lifetime"] {
        let line = format!("drover_event_streams_closed_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    assert!(metrics.contains("drover_event_streams 0"), "{metrics}");
}

#[tokio::test]
async fn an_idle_stream_does_not_read_the_store_until_its_pool_changes() {
    let recheck = Duration::from_secs(2);
    // No resync pass meanwhile: each pass tells the streams of its pool to look.
    let app = spawn_with(|c| {
        c.stream_recheck = recheck;
        c.resync_interval = Duration::from_secs(3600);
    })
    .await;
    app.create_pool_ok("quiet", 0, json!({"paused": true})).await;
    app.wait_converged("quiet", 0, Duration::from_secs(10)).await;
    let reads = || metric(&app.metrics_text(), "drover_event_stream_reads_total");
    let mut stream = Stream::ok(&app.client, &app, "/v1/pools/quiet/stream").await;
    let first = tokio::time::timeout(Duration::from_secs(5), stream.res.chunk()).await.expect("a first status");
    assert!(first.unwrap().is_some());
    let first_read = std::time::Instant::now();
    assert_eq!(reads(), 1.0, "the first status is one read");
    // The next read of an unchanged pool is the re-check's, one interval
    // after the stream began: a stream that polls reads again sooner.
    wait_for(recheck * 3, "the stream's re-check, which reads the store", async || reads() >= 2.0).await;
    let gap = first_read.elapsed();
    assert_eq!(reads(), 2.0, "an unchanged pool was read more than once per re-check: the stream polls");
    assert!(gap >= recheck - Duration::from_millis(500), "an unchanged pool was read again after {gap:?}: it polls");
    assert_eq!(app.scale("quiet", 1).await.status(), StatusCode::OK);
    let next = tokio::time::timeout(Duration::from_secs(2), stream.res.chunk()).await;
    assert!(next.expect("a change reaches the stream at once").unwrap().is_some());
}

#[tokio::test]
async fn client_request_ids_are_kept_only_when_short_and_printable() {
    let app = spawn_app().await;
    let id_of = |sent: Vec<u8>| {
        let value = reqwest::header::HeaderValue::from_bytes(&sent).expect("a header value");
        let req = app.client.get(app.url("/v1/pools")).header("x-request-id", value);
        async move {
            let res = req.send().await.unwrap();
            res.headers()["x-request-id"].to_str().map(str::to_owned).unwrap_or_default()
        }
    };
    assert_eq!(id_of(b"build-42.step:7".to_vec()).await, "build-42.step:7");
    for bad in [vec![b'x'; 300], b"two words".to_vec(), b"tab\there".to_vec(), b"caf\xc3\xa9".to_vec()] {
        let got = id_of(bad.clone()).await;
        assert!(
            got.len() == 16 && got.bytes().all(|b| b.is_ascii_hexdigit()),
            "{:?} became {got:?}",
            String::from_utf8_lossy(&bad)
        );
    }
}

#[tokio::test]
async fn a_field_name_with_a_newline_cannot_forge_a_log_line() {
    use std::process::Stdio;
    let data = tempfile::TempDir::new().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--runtime", "simulated", "--listen", &format!("127.0.0.1:{port}"), "--log-format", "text"])
        .arg("--data-dir")
        .arg(data.path())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting drover");
    let addr = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client.get(format!("{addr}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin = client_with_token(&crate::helpers::admin_token(data.path()));
    let create = json!({"name": "web", "replicas": 0, "version": "v1.29.2", "paused": true});
    assert_eq!(
        admin.post(format!("{addr}/v1/pools")).json(&create).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    let made = admin.post(format!("{addr}/v1/tokens")).json(&json!({"name": "op", "role": "operator"})).send();
    let op_token = made.await.unwrap().json::<serde_json::Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    let evil = "x\n2030-01-01T00:00:00.000000Z  INFO drover: forged \u{1b}[31mred";
    let patch = client_with_token(&op_token)
        .patch(format!("{addr}/v1/pools/web"))
        .header("content-type", "application/merge-patch+json")
        .body(json!({ evil: 1 }).to_string())
        .send()
        .await
        .unwrap();
    // No pool has such a field: refused before any role is considered, with
    // the name escaped in the problem, never raw.
    assert_eq!(patch.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem = patch.text().await.unwrap_or_default();
    assert!(!problem.contains('\n') && !problem.contains('\u{1b}'), "raw control characters in {problem}");
    let _ = child.start_kill();
    let mut stderr = child.stderr.take().expect("stderr");
    let mut log = String::new();
    tokio::time::timeout(Duration::from_secs(10), stderr.read_to_string(&mut log)).await.ok();
    assert!(log.contains("422"), "the refusal is logged: {log}");
    assert!(!log.lines().any(|l| l.starts_with("2030-01-01")), "a forged line: {log}");
    assert!(!log.contains('\u{1b}'), "a raw terminal escape reached the log: {log:?}");
}
