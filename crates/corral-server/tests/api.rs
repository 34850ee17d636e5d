//! The HTTP API against the real daemon: requests go through the whole
//! router (token check and body limit included) in process, and through a
//! real listener for the shutdown test.

use std::process::Command;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral::{Provider, RuntimeConfig};
use corral_core::config::{AuthMode, Config};
use corral_server::{app, AppState, Listener};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

mod common;
use common::{images, remaining, Guard, BUSYBOX};

fn config(label: &str, token: Option<&str>) -> Config {
    let mut c = Config::default();
    c.defaults.image = BUSYBOX.into();
    c.defaults.labels.insert("corraltest".into(), label.into());
    c.server.token = token.map(String::from);
    if token.is_none() {
        // These tests exercise the routes; authentication has its own
        // tests (here and in trust.rs).
        c.server.auth = AuthMode::None;
    }
    c.server.max_body_bytes = 1 << 20;
    c.persistence_root = Some(
        std::env::temp_dir()
            .join(format!("corral-api-{label}"))
            .display()
            .to_string(),
    );
    c
}

/// The address the in-process app believes it listens on (its Host check).
const LISTEN: &str = "127.0.0.1:7070";

async fn service(config: Config) -> (axum::Router, Provider) {
    images();
    let backend = common::service::runtime(RuntimeConfig::default()).await;
    let provider = Provider::with_persistence_root(
        backend.clone(),
        config.provider.clone(),
        config.persistence_root(&corral::host::RealHost),
    );
    let state = AppState::new(provider.clone(), backend, config, BUSYBOX.into());
    (
        app(state, None, Listener::Tcp(LISTEN.parse().expect("addr"))),
        provider,
    )
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", LISTEN);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = match body {
        Some(v) => Body::from(v.to_string()),
        None => Body::empty(),
    };
    let resp = app
        .clone()
        .oneshot(req.body(body).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

#[tokio::test]
async fn sandboxes_commands_shells_and_files() {
    let _g = Guard("api-main");
    let (app, provider) = service(config("api-main", None)).await;

    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "ep-1"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["id"], "ep-1");
    assert_eq!(sb["image"], BUSYBOX);
    // The same key is the same sandbox.
    let (st, again) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "ep-1"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(again["sandbox_id"], sb["sandbox_id"]);

    let (st, r) = call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/exec",
        Some(json!({"command": "echo out; echo err >&2; printf '\\377'; exit 7"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["exit_code"], 7);
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["stdout_base64"], "b3V0Cv8=");
    assert_eq!(r["failure"], Value::Null);

    let (_, r) = call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/exec",
        Some(json!({"argv": ["cat"], "stdin": "fed", "env": {"K": "v"}})),
        None,
    )
    .await;
    assert_eq!(r["stdout"], "fed");

    // A timeout is an outcome, not an HTTP error.
    let (st, r) = call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/exec",
        Some(json!({"command": "sleep 30 & sleep 30", "timeout_ms": 500})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["failure"]["kind"], "timeout");
    assert_eq!(r["failure"]["retryable"], false);

    // Shell sessions keep state.
    call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/shells/main/exec",
        Some(json!({"command": "cd /tmp && export X=1"})),
        None,
    )
    .await;
    let (_, r) = call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/shells/main/exec",
        Some(json!({"command": "echo $PWD $X"})),
        None,
    )
    .await;
    assert_eq!(r["stdout"], "/tmp 1\n");
    assert_eq!(r["restarted"], false);
    let (_, shells) = call(&app, "GET", "/v1/sandboxes/ep-1/shells", None, None).await;
    assert_eq!(shells["shells"], json!(["main"]));
    let (st, _) = call(&app, "DELETE", "/v1/sandboxes/ep-1/shells/main", None, None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = call(&app, "DELETE", "/v1/sandboxes/ep-1/shells/main", None, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Files: binary round trip, missing file, body above the limit.
    let bytes: Vec<u8> = (0..=255u8).collect();
    let req = Request::put("/v1/sandboxes/ep-1/files?path=/tmp/d/b.bin&mkdirs=true")
        .header("host", LISTEN)
        .body(Body::from(bytes.clone()))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let req = Request::get("/v1/sandboxes/ep-1/files?path=/tmp/d/b.bin")
        .header("host", LISTEN)
        .body(Body::empty())
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let got = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(got.as_ref(), bytes.as_slice());
    let (st, l) = call(
        &app,
        "GET",
        "/v1/sandboxes/ep-1/files/list?path=/tmp/d",
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{l}");
    let entries = l["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{l}");
    let b = &entries[0];
    for (key, want) in [
        ("name", json!("b.bin")),
        ("type", json!("file")),
        ("size", json!(256)),
        ("mode", json!(0o644)),
        ("uid", json!(0)),
        ("gid", json!(0)),
        ("owner", json!("root")),
        ("group", json!("root")),
    ] {
        assert_eq!(b[key], want, "{key} of {b}");
    }
    assert!(
        b["mtime"].as_f64().is_some_and(|t| t > 1.0e9),
        "mtime of {b}"
    );
    let (st, e) = call(
        &app,
        "GET",
        "/v1/sandboxes/ep-1/files?path=/tmp/none",
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["field"], "path");
    let (st, e) = call(&app, "GET", "/v1/sandboxes/ep-1/files", None, None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(e["error"]["field"], "path", "{e}");
    let req = Request::put("/v1/sandboxes/ep-1/files?path=/tmp/big")
        .header("host", LISTEN)
        .body(Body::from(vec![0u8; (1 << 20) + 1]))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let (_, list) = call(&app, "GET", "/v1/sandboxes", None, None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(1));
    let (st, _) = call(&app, "DELETE", "/v1/sandboxes/ep-1", None, None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, e) = call(
        &app,
        "POST",
        "/v1/sandboxes/ep-1/exec",
        Some(json!({"command": "true"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["kind"], "not_found");

    let (st, m) = call(&app, "GET", "/metrics", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let m = m.as_str().unwrap_or_default().to_string();
    assert!(
        m.contains("corral_command_duration_seconds_count{via=\"exec\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("corral_command_failures_total{kind=\"timeout\"} 1"),
        "{m}"
    );
    assert!(m.contains("corral_sandboxes_started_total"), "{m}");
    assert!(
        m.contains("corral_evictions_total{reason=\"changed_base\"} 0"),
        "{m}"
    );
    // Every start phase is exported; the ones a start always goes through
    // took time, and so did the sandbox's first command.
    let phase = |name: &str| -> f64 {
        let key = format!("corral_start_phase_seconds_total{{phase=\"{name}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {m}"))
    };
    for name in ["create", "start", "attach", "first_command"] {
        assert!(phase(name) > 0.0, "phase {name}: {m}");
    }
    assert!(phase("breaker_wait") >= 0.0);
    assert!(m.contains("corral_first_commands_total 1"), "{m}");
    provider.shutdown().await;
    assert_eq!(remaining("api-main"), Vec::<String>::new());
}

#[tokio::test]
async fn reset_returns_a_sandbox_to_its_start_and_says_how() {
    let _g = Guard("api-reset");
    let (app, provider) = service(config("api-reset", None)).await;
    let exec = |id: &'static str, cmd: &'static str| {
        let app = app.clone();
        async move {
            let (st, r) = call(
                &app,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": cmd, "timeout_ms": 30000})),
                None,
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{cmd}: {r}");
            assert_eq!(r["failure"], Value::Null, "{cmd}: {r}");
            r["stdout"].as_str().unwrap_or_default().to_string()
        }
    };

    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "pure", "pristine": true})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["resets_in_place"], true, "{sb}");
    assert_eq!(sb["reset_unavailable_reason"], Value::Null, "{sb}");
    exec(
        "pure",
        "echo dirty > /etc/marker; echo t > /tmp/marker; (sleep 1000 &) ; true",
    )
    .await;
    let (st, r) = call(&app, "POST", "/v1/sandboxes/pure/reset", None, None).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["mode"], "in_place", "{r}");
    assert_eq!(r["fallback_reason"], Value::Null, "{r}");
    assert!(r["killed"].as_u64().unwrap_or(0) >= 1, "{r}");
    assert!(r["elapsed_ms"].as_f64().unwrap_or(-1.0) >= 0.0, "{r}");
    let after = exec(
        "pure",
        "ls /etc/marker /tmp/marker 2>&1; ps -o comm | grep -c '^sleep' || true",
    )
    .await;
    assert!(after.contains("No such file"), "{after}");
    assert!(!after.contains("/etc/marker\n"), "{after}");
    assert_eq!(after.lines().last(), Some("0"), "{after}");

    // A sandbox not started for it is replaced, and the answer says why.
    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "plain"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["resets_in_place"], false, "{sb}");
    let why = sb["reset_unavailable_reason"].as_str().unwrap_or_default();
    assert!(why.starts_with("pristine is false"), "{sb}");
    exec("plain", "echo dirty > /etc/marker").await;
    let (st, r) = call(&app, "POST", "/v1/sandboxes/plain/reset", None, None).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["mode"], "replaced", "{r}");
    assert_eq!(r["killed"], 0, "{r}");
    let why = r["fallback_reason"].as_str().unwrap_or_default();
    assert!(why.starts_with("pristine is false"), "{r}");
    let (st, info) = call(&app, "GET", "/v1/sandboxes/plain", None, None).await;
    assert_eq!(st, StatusCode::OK, "{info}");
    assert_eq!(info["alive"], true, "{info}");
    assert_eq!(info["sandbox_id"], sb["sandbox_id"], "the id stays: {info}");
    assert_ne!(info["container_id"], sb["container_id"], "{info}");
    let after = exec("plain", "cat /etc/marker 2>&1 || true").await;
    assert!(after.contains("No such file"), "{after}");

    let (st, e) = call(&app, "POST", "/v1/sandboxes/nope/reset", None, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    assert_eq!(e["error"]["kind"], "not_found");
    assert_eq!(e["error"]["field"], "id");

    let (_, m) = call(&app, "GET", "/metrics", None, None).await;
    let m = m.as_str().unwrap_or_default().to_string();
    assert!(
        m.contains("corral_resets_total{mode=\"replaced\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("corral_resets_total{mode=\"in_place\"} 1"),
        "{m}"
    );
    assert!(m.contains("corral_reset_in_place_seconds_total"), "{m}");

    for id in ["pure", "plain"] {
        let (st, _) = call(&app, "DELETE", &format!("/v1/sandboxes/{id}"), None, None).await;
        assert_eq!(st, StatusCode::NO_CONTENT);
    }
    provider.shutdown().await;
    assert_eq!(remaining("api-reset"), Vec::<String>::new());
}

#[tokio::test]
async fn a_pristine_pool_hands_out_sandboxes_that_reset_in_place() {
    let _g = Guard("api-pool");
    let mut c = config("api-pool", None);
    let mut pool = corral::pool::PoolConfig {
        spec: c.defaults.clone(),
        warm: 1,
        pristine: true,
        ..Default::default()
    };
    pool.spec.image = BUSYBOX.into();
    c.provider.pools.insert("pure".into(), pool);
    let (app, provider) = service(c).await;
    let warm = || provider.wait_warm("pure", Duration::from_secs(60));

    assert!(warm().await, "the pool never got warm");
    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "from-pool", "profile": "pure"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["profile"], "pure");
    assert_eq!(sb["resets_in_place"], true, "{sb}");
    assert_eq!(provider.stats().pool_hits, 1, "{:?}", provider.stats());
    assert!(warm().await, "the pool was not refilled");
    // Asking the pool's profile for a sandbox that is not pristine gets one
    // of its own, not a pristine one from the pool.
    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "not-pure", "profile": "pure", "pristine": false})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["resets_in_place"], false, "{sb}");
    assert_eq!(
        provider.stats().pool_hits,
        1,
        "only the first came from the pool: {:?}",
        provider.stats()
    );
    let (st, r) = call(&app, "POST", "/v1/sandboxes/from-pool/reset", None, None).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["mode"], "in_place", "{r}");
    for id in ["from-pool", "not-pure"] {
        let (st, _) = call(&app, "DELETE", &format!("/v1/sandboxes/{id}"), None, None).await;
        assert_eq!(st, StatusCode::NO_CONTENT);
    }
    provider.shutdown().await;
    assert_eq!(remaining("api-pool"), Vec::<String>::new());
}

#[tokio::test]
async fn bad_requests_name_the_field_and_lost_containers_are_typed() {
    let _g = Guard("api-bad");
    let (app, provider) = service(config("api-bad", None)).await;
    let cases = [
        (
            json!({"spec": {"limits": {"memory": "lots"}}}),
            "spec.limits.memory",
        ),
        (json!({"session": "a/b"}), "session"),
        (json!({"profile": "nope"}), "profile"),
        (json!({"sesion": "x"}), "sesion"),
        (json!({"spec": {"startup": [" "]}}), "spec.startup[0]"),
    ];
    for (body, field) in cases {
        let (st, e) = call(&app, "POST", "/v1/sandboxes", Some(body.clone()), None).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert_eq!(e["error"]["field"], field, "{body}: {e}");
        assert_eq!(e["error"]["retryable"], false);
    }
    // An image the daemon does not have is the policy's refusal (nothing is
    // pulled for a client); trust.rs has the rest of the policy.
    let (st, e) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"image": "corral-test/absent:1"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{e}");
    assert_eq!(e["error"]["field"], "image", "{e}");
    let (st, e) = call(
        &app,
        "POST",
        "/v1/sandboxes/none/exec",
        Some(json!({"command": "true"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    let (st, e) = call(&app, "GET", "/no/such/route", None, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");

    // A spec is merged over the defaults: only the memory limit changes,
    // the defaults' labels (and so the leak guard) stay.
    let (st, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "small", "spec": {"limits": {"memory": 67_108_864}}})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{sb}");
    assert_eq!(remaining("api-bad").len(), 1);
    let (_, r) = call(
        &app,
        "POST",
        "/v1/sandboxes/small/exec",
        Some(json!({"command": "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"})),
        None,
    )
    .await;
    assert_eq!(r["stdout"], "67108864\n", "{r}");

    // A container removed out of band: the command's outcome says so, and
    // keeps saying so (policy fail) until the sandbox is deleted.
    let (_, sb) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "lost"})),
        None,
    )
    .await;
    let cid = sb["container_id"]
        .as_str()
        .expect("container id")
        .to_string();
    let rm = Command::new("docker")
        .args(["rm", "-f", &cid])
        .output()
        .expect("docker rm");
    assert!(rm.status.success());
    for attempt in 0..2 {
        let (st, r) = call(
            &app,
            "POST",
            "/v1/sandboxes/lost/exec",
            Some(json!({"command": "true"})),
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{r}");
        assert_eq!(r["failure"]["kind"], "container_lost", "{r}");
        assert_eq!(r["failure"]["retryable"], true, "{r}");
        // The first command ran in the sandbox and saw it lost; the next
        // ran in none: null, as in `corral run --json` (once "").
        assert_eq!(r["sandbox_id"].is_string(), attempt == 0, "{r}");
        let msg = r["failure"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&cid[..12]),
            "the message names the container: {msg}"
        );
    }
    let (st, e) = call(
        &app,
        "GET",
        "/v1/sandboxes/lost/files?path=/etc/hostname",
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::GONE, "{e}");
    let (_, list) = call(&app, "GET", "/v1/sandboxes", None, None).await;
    let lost = list["sandboxes"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["id"] == "lost").cloned())
        .expect("a lost sandbox is still listed");
    assert_eq!(lost["alive"], false);
    let (st, _) = call(&app, "DELETE", "/v1/sandboxes/lost", None, None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, e) = call(
        &app,
        "POST",
        "/v1/sandboxes/lost/exec",
        Some(json!({"command": "true"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["field"], "id");
    provider.shutdown().await;
    assert_eq!(remaining("api-bad"), Vec::<String>::new());
}

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let _g = Guard("api-token");
    let (app, provider) = service(config("api-token", Some("s3cret"))).await;
    let (st, e) = call(&app, "GET", "/v1/sandboxes", None, None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(e["error"]["kind"], "unauthorized");
    let (st, _) = call(&app, "GET", "/v1/sandboxes", None, Some("wrong")).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = call(&app, "GET", "/v1/sandboxes", None, Some("s3cret")).await;
    assert_eq!(st, StatusCode::OK);
    // Health needs no token, so probes work.
    let (st, h) = call(&app, "GET", "/v1/health", None, None).await;
    assert_eq!(st, StatusCode::OK, "{h}");
    assert_eq!(h["daemon"]["reachable"], true);
    let (st, doc) = call(&app, "GET", "/openapi.json", None, Some("s3cret")).await;
    assert_eq!(st, StatusCode::OK);
    assert!(doc["paths"]["/v1/sandboxes/{id}/exec"].is_object());
    provider.shutdown().await;
}

/// Raw HTTP/1.1 over TCP, so the test needs no client library.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

#[tokio::test]
async fn shutdown_cancels_commands_past_the_grace_and_removes_sandboxes() {
    let _g = Guard("api-shutdown");
    images();
    let mut cfg = config("api-shutdown", None);
    cfg.server.listen = "127.0.0.1:0".into();
    cfg.server.shutdown_grace_ms = 1_000;
    let backend = common::service::runtime(RuntimeConfig::default()).await;
    let provider = Provider::with_persistence_root(
        backend.clone(),
        cfg.provider.clone(),
        cfg.persistence_root(&corral::host::RealHost),
    );
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(corral_server::serve(
        cfg,
        backend,
        provider,
        BUSYBOX.into(),
        stop.clone(),
        move |b| {
            let _ = tx.send(b.tcp);
        },
    ));
    let addr = rx.await.expect("bound");
    let created = http(addr, "POST", "/v1/sandboxes", r#"{"session":"s"}"#).await;
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    assert_eq!(remaining("api-shutdown").len(), 1);
    let in_flight = tokio::spawn(http(
        addr,
        "POST",
        "/v1/sandboxes/s/exec",
        r#"{"command":"sleep 60"}"#,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = std::time::Instant::now();
    stop.cancel();
    let done = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("shutdown within the grace plus teardown");
    done.expect("join").expect("serve");
    assert!(asked.elapsed() < Duration::from_secs(30));
    let _ = in_flight.await;
    assert_eq!(remaining("api-shutdown"), Vec::<String>::new());
}
