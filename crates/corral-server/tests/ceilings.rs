//! The operator's ceilings (`server.limits`) against a real `corral serve`
//! on the real daemon, attacked with raw HTTP requests (`common::service`):
//! a client asking for more output, time, stdin or file bytes than the
//! ceilings is refused naming the field, its value and the ceiling; and
//! concurrent commands that together would hold more than the buffer
//! budget are refused typed (503 `overloaded`, `Retry-After`) while the
//! ones that fit run, and room comes back when they finish. Nothing here
//! measures memory or time: the refusals are what a client sees.

use serde_json::{json, Value};

mod common;
use common::service::{start, Req, Resp, Service};
use common::{remaining, Guard};

fn exec(svc: &Service, id: &str, body: Value) -> Req {
    svc.req("POST", &format!("/v1/sandboxes/{id}/exec"))
        .json(body)
}

async fn create(svc: &Service, session: &str) {
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": session})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
}

fn over_ceiling(r: &Resp, field: &str, value: &str, ceiling: &str, key: &str) {
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.field(), field, "{}", r.text);
    assert_eq!(r.json["error"]["kind"], "invalid_request", "{}", r.text);
    let m = r.message();
    assert!(
        m.contains(&format!("{field} {value}"))
            && m.contains(&format!("ceiling of {ceiling}"))
            && m.contains(&format!("server.limits.{key}")),
        "{m}"
    );
}

#[tokio::test]
async fn asks_above_the_ceilings_are_refused_naming_field_value_and_ceiling() {
    const LABEL: &str = "api-ceilings-ask";
    let _g = Guard(LABEL);
    // The default ceilings: 64 MiB of output, 24 h, 256 MiB reads.
    let svc = start(LABEL, |_, _| {}).await;
    create(&svc, "big").await;
    // The attack: 512 MiB of output asked for (and 8 MiB printed); the
    // service would hold whatever the command prints up to the ask.
    let attack = json!({
        "command": "head -c 8388608 /dev/zero | tr '\\0' x",
        "max_output": 536870912u64,
    });
    let r = svc.send(exec(&svc, "big", attack.clone())).await;
    over_ceiling(&r, "max_output", "536870912", "67108864", "max_output");
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes/big/exec/stream")
                .json(attack.clone()),
        )
        .await;
    over_ceiling(&r, "max_output", "536870912", "67108864", "max_output");
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes/big/shells/main/exec")
                .json(attack),
        )
        .await;
    over_ceiling(&r, "max_output", "536870912", "67108864", "max_output");
    let r = svc
        .send(exec(
            &svc,
            "big",
            json!({"command": "true", "timeout_ms": 86400001u64}),
        ))
        .await;
    over_ceiling(&r, "timeout_ms", "86400001", "86400000", "max_timeout_ms");
    let r = svc
        .send(svc.req(
            "GET",
            "/v1/sandboxes/big/files?path=/etc/passwd&max_bytes=268435457",
        ))
        .await;
    over_ceiling(&r, "max_bytes", "268435457", "268435456", "max_read_bytes");
    // The ceiling itself is allowed, and what it keeps is what was asked.
    let r = svc
        .send(exec(
            &svc,
            "big",
            json!({"command": "head -c 2097152 /dev/zero | tr '\\0' x",
                   "max_output": 67108864u64}),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(500)]);
    assert_eq!(r.json["stdout_truncated"], false);
    assert_eq!(r.json["stdout_total_bytes"], 2097152);
    svc.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

/// A small budget: two commands keeping 256 KiB per stream (512 KiB each)
/// fit, a third does not; file operations of a few bytes still do.
fn small_budget(c: &mut corral_core::config::Config) {
    c.server.max_body_bytes = 64 << 10;
    c.server.limits.max_output = 256 << 10;
    c.server.limits.max_stdin_bytes = 64 << 10;
    c.server.limits.max_read_bytes = 64 << 10;
    c.server.limits.buffer_bytes = 1280 << 10;
    // The whole budget, not a tenant's share of it (tests/budgets.rs).
    c.server.limits.share_percent = 100;
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_past_the_buffer_budget_are_refused_typed_and_room_comes_back() {
    const LABEL: &str = "api-ceilings-budget";
    let _g = Guard(LABEL);
    let svc = start(LABEL, |c, _| small_budget(c)).await;
    create(&svc, "busy").await;
    // Two commands that hold their reservation until the test lets them go.
    let mut held = Vec::new();
    for i in 0..2 {
        let req = exec(
            &svc,
            "busy",
            json!({
                "command": format!(
                    "touch /tmp/started-{i}; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done-{i}"
                ),
                "max_output": 262144,
                "timeout_ms": 300000,
            }),
        );
        let addr = svc.addr;
        held.push(tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            req.send(&mut stream, &addr.to_string()).await
        }));
    }
    // They hold their reservations once they run: wait for both to start
    // (reads of 16 bytes fit beside them).
    for i in 0..2 {
        let path = format!("/v1/sandboxes/busy/files?path=/tmp/started-{i}&max_bytes=16");
        let mut tries = 0;
        loop {
            let r = svc.send(svc.req("GET", &path)).await;
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 404, "{}", r.text);
            tries += 1;
            assert!(tries < 1200, "command {i} never started");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    // The excess: refused before anything runs, typed, with Retry-After.
    let excess = json!({"command": "touch /tmp/excess-ran", "max_output": 262144});
    for route in ["exec", "exec/stream"] {
        let r = svc
            .send(
                svc.req("POST", &format!("/v1/sandboxes/busy/{route}"))
                    .json(excess.clone()),
            )
            .await;
        assert_eq!(r.status, 503, "{route}: {}", r.text);
        assert_eq!(r.json["error"]["kind"], "overloaded", "{}", r.text);
        assert_eq!(r.json["error"]["retryable"], true, "{}", r.text);
        assert!(
            r.message().contains("server.limits.buffer_bytes"),
            "{}",
            r.text
        );
        let head = r.text.split("\r\n\r\n").next().unwrap_or_default();
        assert!(
            head.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
            "{head}"
        );
    }
    // The operator sees it: the refusals, and what is held.
    let m = svc.send(svc.req("GET", "/metrics")).await;
    assert!(
        m.text
            .contains("corral_server_overloaded_total{limit=\"buffer_bytes\"} 2\n")
            && m.text.contains("corral_server_in_flight 2"),
        "{}",
        m.text
    );
    // A command that fits beside them runs; nothing of the refused ones did.
    let r = svc
        .send(exec(
            &svc,
            "busy",
            json!({"command": "ls /tmp/excess-ran 2>&1; echo small", "max_output": 1024}),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let out = r.json["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("No such file") && out.ends_with("small\n"),
        "{out}"
    );
    // Let the two go: both succeed.
    let r = svc
        .send(
            svc.req("PUT", "/v1/sandboxes/busy/files?path=/tmp/go")
                .body_as("application/octet-stream", "go"),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    for (i, task) in held.into_iter().enumerate() {
        let r = task.await.expect("join");
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["stdout"], format!("done-{i}\n"), "{}", r.text);
    }
    // Their answers are sent, so their room is back: the same ask runs now.
    for route in ["exec", "exec/stream"] {
        let r = svc
            .send(
                svc.req("POST", &format!("/v1/sandboxes/busy/{route}"))
                    .json(json!({"command": "echo again", "max_output": 262144})),
            )
            .await;
        assert_eq!(r.status, 200, "{route}: {}", r.text);
        assert!(r.text.contains("again"), "{route}: {}", r.text);
    }
    svc.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}
