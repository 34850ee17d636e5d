//! MCP over streamable HTTP against the real daemon, mounted as the docs of
//! `mcp::http_service` say (`.nest("/mcp", ..)`): the handshake, a tool
//! call in the session's own sandbox, and the sandbox released when the
//! client deletes the session or the service is cancelled; tool calls held
//! to the service's ceilings and budget. The Python
//! client's test (`clients/python/tests/test_mcp.py`) covers the tools in
//! depth; this one pins the mounting and the session lifecycle in Rust.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral::{Provider, RuntimeConfig};
use corral_core::principal::Principal;
use corral_core::SandboxSpec;
use corral_server::mcp::{http_service, http_service_with, HttpOptions, McpContext};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

mod common;
use common::{images, remaining, Guard, BUSYBOX};

/// Waits until at most `n` containers carry the label; returns them.
async fn settle(label: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = remaining(label);
        if left.len() <= n || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The ceilings of the default configuration.
fn default_ceilings() -> corral_server::ceilings::Ceilings {
    let server = corral_core::config::ServerConfig::default();
    corral_server::ceilings::Ceilings::new(&server.limits, server.max_body_bytes)
}

async fn mounted(label: &str) -> (axum::Router, Provider, CancellationToken) {
    mounted_with(label, default_ceilings()).await
}

/// [`mounted`] with the service's `ceilings`.
async fn mounted_with(
    label: &str,
    ceilings: corral_server::ceilings::Ceilings,
) -> (axum::Router, Provider, CancellationToken) {
    images();
    let backend = common::service::runtime(RuntimeConfig::default()).await;
    let provider = Provider::new(backend, Default::default());
    let mut spec = SandboxSpec::new(BUSYBOX);
    spec.labels.insert("corraltest".into(), label.into());
    let cancel = CancellationToken::new();
    // No guard in front here: the sessions act for tenant `default`.
    let ctx = McpContext::new(
        provider.clone(),
        spec,
        Some(Principal::Tenant("default".into())),
        ceilings,
    );
    let app = axum::Router::new().nest("/mcp", http_service(ctx, cancel.clone()));
    (app, provider, cancel)
}

/// One HTTP exchange: status, session id header, and the JSON-RPC message
/// in the body (plain JSON, or the `data:` of an SSE event carrying one).
async fn post(
    app: &axum::Router,
    session: Option<&str>,
    host: &str,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    let mut req = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let bytes = tokio::time::timeout(Duration::from_secs(120), resp.into_body().collect())
        .await
        .expect("the response ends")
        .expect("body")
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let msg = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or(Value::String(text.clone()))
    });
    (status, sid, msg)
}

/// Initializes a session; returns its id.
async fn initialize(app: &axum::Router) -> String {
    let (st, sid, msg) = post(
        app,
        None,
        "127.0.0.1:7070",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "corral-test", "version": "0"}
        }}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{msg}");
    assert_eq!(msg["result"]["serverInfo"]["name"], "corral", "{msg}");
    assert!(
        msg["result"]["instructions"]
            .as_str()
            .is_some_and(|i| i.contains(BUSYBOX)),
        "{msg}"
    );
    let sid = sid.expect("a session id");
    let (st, _, msg) = post(
        app,
        Some(&sid),
        "localhost",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{msg}");
    sid
}

async fn call_tool(app: &axum::Router, sid: &str, id: u64, name: &str, args: Value) -> Value {
    let (st, _, msg) = post(
        app,
        Some(sid),
        "localhost",
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": args}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{msg}");
    msg
}

#[tokio::test(flavor = "multi_thread")]
async fn each_session_gets_a_sandbox_released_when_the_session_is_deleted() {
    const LABEL: &str = "mcp-http-delete";
    let _g = Guard(LABEL);
    let (app, provider, _cancel) = mounted(LABEL).await;

    let sid = initialize(&app).await;
    let (_, _, list) = post(
        &app,
        Some(&sid),
        "localhost",
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let tools = list["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(tools.len(), 12, "{list}");
    assert!(
        tools.iter().any(|t| t["name"] == "egress"),
        "no egress tool: {list}"
    );
    assert!(
        remaining(LABEL).is_empty(),
        "listing tools started a sandbox"
    );

    let r = call_tool(
        &app,
        &sid,
        3,
        "run_command",
        json!({"command": "echo hello"}),
    )
    .await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(r["result"]["structuredContent"]["stdout"], "hello\n", "{r}");
    assert_eq!(remaining(LABEL).len(), 1);

    // A second session has a sandbox of its own.
    let other = initialize(&app).await;
    let r = call_tool(&app, &other, 2, "run_command", json!({"command": "true"})).await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(remaining(LABEL).len(), 2);

    // Bad arguments are invalid params naming the field.
    let r = call_tool(&app, &sid, 4, "read_file", json!({"path": 7})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("path") && m.contains('7')),
        "{r}"
    );

    // Deleting a session releases its sandbox only.
    let resp = app
        .clone()
        .oneshot(
            Request::builder()
                .method("DELETE")
                .uri("/mcp")
                .header("host", "localhost")
                .header("mcp-session-id", &other)
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(
        settle(LABEL, 1).await.len(),
        1,
        "the deleted session's sandbox stayed"
    );
    let r = call_tool(&app, &sid, 5, "run_command", json!({"command": "true"})).await;
    assert_eq!(
        r["result"]["isError"], false,
        "the other session lost its sandbox: {r}"
    );
    assert_eq!(provider.stats().sessions, 1);

    // A deleted session is gone; a foreign Host is refused.
    let (st, _, _) = post(
        &app,
        Some(&other),
        "localhost",
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _, _) = post(
        &app,
        None,
        "attacker.example:7070",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    provider.shutdown().await;
    assert!(settle(LABEL, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_service_releases_every_session() {
    const LABEL: &str = "mcp-http-cancel";
    let _g = Guard(LABEL);
    let (app, provider, cancel) = mounted(LABEL).await;
    for _ in 0..2 {
        let sid = initialize(&app).await;
        let r = call_tool(
            &app,
            &sid,
            2,
            "write_file",
            json!({"path": "/tmp/f", "content": "x"}),
        )
        .await;
        assert_eq!(r["result"]["isError"], false, "{r}");
    }
    assert_eq!(remaining(LABEL).len(), 2);
    cancel.cancel();
    // Without the provider's shutdown: the sessions' own release did it.
    let left = settle(LABEL, 0).await;
    assert!(
        left.is_empty(),
        "cancelled sessions kept their sandboxes: {left:?}"
    );
    assert_eq!(provider.stats().sessions, 0);
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_above_the_limit_is_refused() {
    images();
    let backend = common::service::runtime(RuntimeConfig::default()).await;
    let provider = Provider::new(backend, Default::default());
    let ctx = McpContext::new(
        provider.clone(),
        SandboxSpec::new(BUSYBOX),
        None,
        default_ceilings(),
    );
    let options = HttpOptions {
        max_body_bytes: 1024,
        ..HttpOptions::default()
    };
    let app = axum::Router::new().nest(
        "/mcp",
        http_service_with(ctx, CancellationToken::new(), options),
    );
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"padding": "x".repeat(4096)}});
    let (st, _, msg) = post(&app, None, "localhost", big).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{msg}");
    assert!(msg.as_str().is_some_and(|m| m.contains("1024")), "{msg}");
    // Below the limit, the same endpoint answers.
    let sid = initialize(&app).await;
    assert!(!sid.is_empty());
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_go_through_the_service_ceilings_and_budget() {
    const LABEL: &str = "mcp-http-ceilings";
    let _g = Guard(LABEL);
    let limits = corral_core::server_limits::ServerLimits {
        max_timeout_ms: 60_000,
        max_concurrent: 3,
        ..Default::default()
    };
    let ceilings = corral_server::ceilings::Ceilings::new(&limits, 32 << 20);
    let (app, provider, _cancel) = mounted_with(LABEL, ceilings.clone()).await;
    let sid = initialize(&app).await;

    // A time limit above the operator's ceiling: invalid params naming it.
    for tool in ["run_command", "shell_run"] {
        let r = call_tool(
            &app,
            &sid,
            2,
            tool,
            json!({"command": "true", "timeout_secs": 61}),
        )
        .await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        let m = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("timeout_secs 61 is above this service's ceiling of 60")
                && m.contains("server.limits.max_timeout_ms"),
            "{m}"
        );
    }

    // Requests elsewhere in the service hold every slot: a tool call is
    // refused typed, and starts no sandbox.
    // (Three tenants: each may hold only its share of the slots.)
    let held: Vec<_> = ["a", "b", "c"]
        .map(|t| {
            let other = corral_server::ceilings::Holder::Tenant(t.into());
            ceilings.command(&other, 1, 0, false).expect("a slot")
        })
        .into_iter()
        .collect();
    for (tool, args) in [
        ("run_command", json!({"command": "echo hi"})),
        ("read_file", json!({"path": "/etc/passwd"})),
        ("write_file", json!({"path": "/tmp/f", "content": "x"})),
    ] {
        let r = call_tool(&app, &sid, 3, tool, args).await;
        assert_eq!(r["result"]["isError"], true, "{tool}: {r}");
        let error = &r["result"]["structuredContent"]["error"];
        assert_eq!(error["kind"], "overloaded", "{tool}: {r}");
        assert_eq!(error["retryable"], true, "{tool}: {r}");
        assert!(
            r["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("server.limits.max_concurrent")),
            "{tool}: {r}"
        );
    }
    assert!(
        remaining(LABEL).is_empty(),
        "a refused call started a sandbox"
    );

    // Room again: the same call runs, and its default timeout fits the
    // ceiling.
    drop(held);
    let r = call_tool(&app, &sid, 4, "run_command", json!({"command": "echo hi"})).await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(r["result"]["structuredContent"]["stdout"], "hi\n", "{r}");

    provider.shutdown().await;
    assert!(settle(LABEL, 0).await.is_empty());
}
