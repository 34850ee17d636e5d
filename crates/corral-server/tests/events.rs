//! `GET /v1/events` through a real `corral serve` on the real daemon: a
//! scripted lifecycle (create, a command that succeeds, one that exits 3,
//! one that times out, a reset, a removal) arrives in order with its
//! outcomes; a reader resumes after an id; a tenant sees only its own
//! sandboxes' events and the operator sees everyone's.

use std::time::Duration;

use corral_core::config::TenantConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

mod common;
use common::service::{as_, start, Service};
use common::Guard;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

/// Reads SSE events from `path` until `until` says stop (or a generous
/// bound passes); (event name, data) in order.
async fn read_events(
    s: &Service,
    token: &str,
    path: &str,
    until: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let mut conn = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n",
        s.addr
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut lines = BufReader::new(conn).lines();
    let mut got = Vec::new();
    let (mut name, mut data) = (String::new(), String::new());
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(v) = line
                .strip_prefix("event: ")
                .or_else(|| line.strip_prefix("event:"))
            {
                name = v.trim().to_string();
            } else if let Some(v) = line
                .strip_prefix("data: ")
                .or_else(|| line.strip_prefix("data:"))
            {
                data.push_str(v.trim());
            } else if line.is_empty() && !name.is_empty() {
                let value = serde_json::from_str(&data).unwrap_or(Value::String(data.clone()));
                got.push((std::mem::take(&mut name), value));
                data.clear();
                if until(&got) {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(90), read).await;
    got
}

fn kinds(events: &[(String, Value)], sandbox: &str) -> Vec<String> {
    events
        .iter()
        .filter(|(_, v)| v["sandbox"] == sandbox)
        .map(|(k, v)| match v["outcome"].as_str() {
            Some(o) => format!("{k}:{o}"),
            None => k.clone(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lifecycle_arrives_in_order_resumes_and_stays_with_its_owner() {
    let label = "events";
    let _g = Guard(label);
    let s = start(label, |c, _| {
        c.server.admin_token = Some(ADMIN.into());
        for (name, token) in [("alice", ALICE), ("bob", BOB)] {
            c.server.tenants.insert(
                name.into(),
                TenantConfig {
                    token: Some(token.into()),
                    ..TenantConfig::default()
                },
            );
        }
    })
    .await;

    // Bob has a sandbox of his own, with a command.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes").json(json!({"session": "bobs"})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    s.send(as_(BOB, "POST", "/v1/sandboxes/bobs/exec").json(json!({"command": "true"})))
        .await;

    // Alice's scripted lifecycle.
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes").json(json!({"session": "ep"})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    for (command, timeout) in [("true", 60_000), ("exit 3", 60_000), ("sleep 30", 200)] {
        let r = s
            .send(
                as_(ALICE, "POST", "/v1/sandboxes/ep/exec")
                    .json(json!({"command": command, "timeout_ms": timeout})),
            )
            .await;
        assert!(r.status < 500, "{}", r.text);
    }
    let r = s.send(as_(ALICE, "POST", "/v1/sandboxes/ep/reset")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = s.send(as_(ALICE, "DELETE", "/v1/sandboxes/ep")).await;
    assert!(r.status < 300, "{}", r.text);

    let done = |evs: &[(String, Value)]| {
        evs.iter()
            .any(|(k, v)| k == "removed" && v["session"] == "ep")
    };
    let alice = read_events(&s, ALICE, "/v1/events?after=0", done).await;
    let sandbox = alice
        .iter()
        .find(|(k, _)| k == "created")
        .map(|(_, v)| v["sandbox"].as_str().expect("sandbox").to_string())
        .expect("a created event");
    assert_eq!(
        kinds(&alice, &sandbox),
        [
            "created",
            "command:ok",
            "command:exit",
            "command:timeout",
            "reset:ok",
            "removed"
        ],
        "{alice:?}"
    );
    let ids: Vec<u64> = alice.iter().filter_map(|(_, v)| v["id"].as_u64()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    for (_, v) in &alice {
        assert_eq!(v["owner"], "tenant:alice", "only Alice's: {v}");
        assert_eq!(
            v["session"], "ep",
            "her own key, without its namespace: {v}"
        );
    }
    assert!(
        alice.iter().all(|(_, v)| v["session"] != "bobs"),
        "none of Bob's"
    );

    // Resuming after the second event gives the rest, in order.
    let second = ids[1];
    let rest = read_events(&s, ALICE, &format!("/v1/events?after={second}"), done).await;
    let rest_ids: Vec<u64> = rest.iter().filter_map(|(_, v)| v["id"].as_u64()).collect();
    assert_eq!(rest_ids, ids[2..], "{rest:?}");

    // Bob sees his, not hers; the operator sees both.
    let bob = read_events(&s, BOB, "/v1/events?after=0", |evs| {
        evs.iter().any(|(k, _)| k == "command")
    })
    .await;
    assert!(kinds(&bob, &sandbox).is_empty(), "{bob:?}");
    let bob_sb = bob
        .iter()
        .find(|(k, v)| k == "created" && v["session"] == "bobs")
        .map(|(_, v)| v["sandbox"].as_str().expect("sandbox").to_string())
        .expect("Bob sees his sandbox created");
    assert_eq!(kinds(&bob, &bob_sb), ["created", "command:ok"], "{bob:?}");
    let all = read_events(&s, ADMIN, "/v1/events?after=0", |evs| {
        evs.iter()
            .any(|(k, v)| k == "removed" && v["sandbox"] == sandbox.as_str())
    })
    .await;
    assert!(!kinds(&all, &sandbox).is_empty() && !kinds(&all, &bob_sb).is_empty());
    // The operator sees another's key whole.
    assert!(
        all.iter().any(|(_, v)| v["session"] == "bob:bobs"),
        "{all:?}"
    );

    // A bad Last-Event-ID is named.
    let r = s
        .send(as_(ALICE, "GET", "/v1/events").header("Last-Event-ID", "yesterday"))
        .await;
    assert_eq!(
        (r.status, r.json["error"]["field"].as_str()),
        (400, Some("Last-Event-ID")),
        "{}",
        r.text
    );
    s.stop().await;
}
