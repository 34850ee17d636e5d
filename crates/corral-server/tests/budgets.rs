//! The service's budget attacked through every listener of a real
//! `corral serve` on the real daemon (`common::service`), with raw HTTP so
//! every byte is what an attacker sends: connections that announce big
//! bodies and send a few bytes, without a key or with one, slow uploads,
//! many big commands and background E2B commands of one tenant, and a
//! sandbox's server that never answers. None of it may make another
//! tenant's command answer 503; a request no credential names is answered
//! 401 without its body being read; a slow body and a silent backend are
//! given up at their deadlines; and no listener starts beyond loopback
//! without authentication.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corral::{Provider, RuntimeConfig};
use corral_core::config::{AuthMode, Config, TenantConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::service::{as_, start, Req, Service};
use common::{remaining, Guard, BUSYBOX};

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";

/// 64 MiB: what the attacks announce.
const BIG: u64 = 64 << 20;

fn tenants(c: &mut Config) {
    for (name, token) in [("alice", ALICE), ("bob", BOB)] {
        c.server.tenants.insert(
            name.into(),
            TenantConfig {
                token: Some(token.into()),
                ..TenantConfig::default()
            },
        );
    }
}

async fn sandbox(s: &Service, token: &str) -> String {
    let r = s
        .send(as_(token, "POST", "/v1/sandboxes").json(json!({})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.json["id"].as_str().expect("id").to_string()
}

/// `true` in sandbox `id` as `token`'s tenant: the exec every attack must
/// leave alone.
async fn exec_true(s: &Service, token: &str, id: &str) -> common::service::Resp {
    s.send(
        as_(token, "POST", &format!("/v1/sandboxes/{id}/exec"))
            .json(json!({"command": "echo fine", "timeout_ms": 30_000})),
    )
    .await
}

/// Opens a connection to `addr` and sends `head` (which announces a body)
/// and the first `sent` bytes of that body; the connection stays open.
async fn partial(addr: SocketAddr, head: &str, sent: &[u8]) -> TcpStream {
    let mut conn = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
        .await
        .expect("connects within 10 s")
        .expect("connect");
    conn.write_all(head.as_bytes()).await.expect("send head");
    conn.write_all(sent).await.expect("send the first bytes");
    conn
}

/// The status of the answer on `conn` within `within` (0: none came).
async fn status_within(conn: &mut TcpStream, within: Duration) -> (u16, String) {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&got);
            // The head and a JSON body are all a test needs.
            if let Some((_, body)) = text.split_once("\r\n\r\n") {
                if body.trim_end().ends_with('}') {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// One Connect envelope of `message`.
fn envelope(message: &Value) -> Vec<u8> {
    let json = message.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_slow_bodies_are_refused_unread_and_starve_no_one() {
    const LABEL: &str = "budgets-unauthenticated";
    let _g = Guard(LABEL);
    // The default budget (2 GiB): 40 x 64 MiB announced is more.
    let s = start(LABEL, |c, _| {
        c.server.e2b_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let e2b = s.e2b.expect("an E2B listener");
    let id = sandbox(&s, s.token.as_deref().expect("token")).await;

    // The attack: 40 connections to each listener, no key, 64 MiB
    // announced, 16 bytes sent, held open.
    let mut conns = Vec::new();
    for i in 0..40 {
        let head = format!(
            "POST /sandboxes HTTP/1.1\r\nHost: {e2b}\r\nContent-Type: application/json\r\n\
             Content-Length: {BIG}\r\n\r\n"
        );
        conns.push(("e2b", partial(e2b, &head, b"{\"templateID\": \"").await));
        let head = format!(
            "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: {}\r\n\
             Content-Type: application/json\r\nContent-Length: {BIG}\r\n\r\n",
            s.addr
        );
        conns.push(("rest", partial(s.addr, &head, b"{\"command\": \"ec").await));
        if i == 0 {
            // Let the first ones reach the service before the rest.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The tenant's command runs while they stay open.
    let r = exec_true(&s, s.token.as_deref().expect("token"), &id).await;
    assert_eq!(r.status, 200, "the tenant's exec: {}", r.text);
    assert_eq!(r.json["stdout"], "fine\n", "{}", r.text);

    // Each was answered 401 at once, its body unread (only 16 of its 64
    // MiB were ever sent).
    for (listener, conn) in conns.iter_mut() {
        let (status, text) = status_within(conn, Duration::from_secs(10)).await;
        assert_eq!(status, 401, "{listener}: {text}");
        let says = match *listener {
            "e2b" => "carries no credential of this service: X-API-KEY (set E2B_API_KEY",
            _ => "requires 'Authorization: Bearer TOKEN'",
        };
        assert!(text.contains(says), "{listener}: {text}");
    }
    drop(conns);
    s.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn one_tenant_cannot_starve_another() {
    const LABEL: &str = "budgets-tenants";
    let _g = Guard(LABEL);
    // The default budget and ceilings.
    let s = start(LABEL, |c, _| {
        tenants(c);
        c.server.e2b_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let e2b = s.e2b.expect("an E2B listener");
    let (a, b) = tokio::join!(sandbox(&s, ALICE), sandbox(&s, BOB));

    // alice, 1: background E2B commands (the SDK's
    // `commands.run(..., background=True)`), which hold their
    // reservation for the command's life.
    let r = s
        .send_e2b(
            Req::new("POST", "/sandboxes")
                .header("X-API-Key", ALICE)
                .json(json!({"templateID": BUSYBOX, "timeout": 300})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let sid = r.json["sandboxID"].as_str().expect("sandboxID").to_string();
    let envd = r.json["envdAccessToken"]
        .as_str()
        .expect("token")
        .to_string();
    let mut background = Vec::new();
    for _ in 0..8 {
        let body = envelope(&json!({
            "process": {"cmd": "/bin/sh", "args": ["-c", "sleep 120"]}
        }));
        let head = format!(
            "POST /process.Process/Start HTTP/1.1\r\nHost: {e2b}\r\n\
             Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n\
             X-Access-Token: {envd}\r\nE2b-Sandbox-Id: {sid}\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        let mut conn = partial(e2b, &head, &body).await;
        // Started (its first event names its pid), or refused.
        let mut got = Vec::new();
        let started = async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("\"pid\"") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), started).await;
        background.push((conn, got));
    }

    // alice, 2: slow uploads, 64 MiB announced, 16 bytes sent.
    let mut uploads = Vec::new();
    for i in 0..20 {
        let head = format!(
            "PUT /v1/sandboxes/{a}/files?path=/tmp/up-{i} HTTP/1.1\r\nHost: {}\r\n\
             Authorization: Bearer {ALICE}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {BIG}\r\n\r\n",
            s.addr
        );
        uploads.push(partial(s.addr, &head, b"0123456789abcdef").await);
    }

    // alice, 3: commands at the output ceiling (64 MiB per stream), each
    // holding its reservation while it sleeps.
    let mut execs = Vec::new();
    for _ in 0..15 {
        let req = as_(ALICE, "POST", &format!("/v1/sandboxes/{a}/exec")).json(json!({
            "command": "sleep 120", "max_output": BIG, "timeout_ms": 150_000
        }));
        let addr = s.addr;
        execs.push(tokio::spawn(async move {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            req.send(&mut conn, &addr.to_string()).await
        }));
    }

    // The commands that got their reservation hold it now; the rest were
    // refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while execs.iter().filter(|t| t.is_finished()).count() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // bob's command runs.
    let r = exec_true(&s, BOB, &b).await;
    assert_eq!(r.status, 200, "bob's exec beside alice's load: {}", r.text);
    assert_eq!(r.json["stdout"], "fine\n", "{}", r.text);
    // alice's background commands run (each holds 4 x e2b_max_output,
    // not 4 x the ceiling).
    for (_, got) in &background {
        let text = String::from_utf8_lossy(got);
        assert!(text.contains("\"pid\""), "a background command: {text}");
    }

    // alice was refused past her own share, and told so.
    let mut refused = 0;
    for t in execs.iter_mut().filter(|t| t.is_finished()) {
        let r = t.await.expect("join");
        assert_eq!(r.status, 503, "{}", r.text);
        assert_eq!(r.json["error"]["kind"], "overloaded", "{}", r.text);
        assert!(
            r.message().contains("tenant 'alice'")
                && r.message().contains("server.limits.share_percent"),
            "{}",
            r.text
        );
        refused += 1;
    }
    assert!(refused >= 5, "alice's excess was refused: {refused}");
    for t in &execs {
        t.abort();
    }
    drop((uploads, background));
    s.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_body_is_cut_off_at_its_deadline_on_every_listener() {
    const LABEL: &str = "budgets-slow-body";
    let _g = Guard(LABEL);
    let s = start(LABEL, |c, _| {
        tenants(c);
        c.server.e2b_listen = Some("127.0.0.1:0".into());
        c.server.limits.body_timeout_ms = 1_500;
    })
    .await;
    let e2b = s.e2b.expect("an E2B listener");
    let id = sandbox(&s, ALICE).await;
    let head = format!(
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        s.addr
    );
    let rest = partial(s.addr, &head, b"{\"command\": ");
    let head = format!(
        "POST /sandboxes HTTP/1.1\r\nHost: {e2b}\r\nX-API-Key: {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    let e2b_conn = partial(e2b, &head, b"{\"templateID\": ");
    let began = Instant::now();
    let (mut rest, mut e2b_conn) = tokio::join!(rest, e2b_conn);
    for (listener, conn) in [("rest", &mut rest), ("e2b", &mut e2b_conn)] {
        let (status, text) = status_within(conn, Duration::from_secs(20)).await;
        assert_eq!(
            status, 408,
            "{listener}: the slow body was not cut off: {text}"
        );
        assert!(
            text.contains("request_timeout") && text.contains("server.limits.body_timeout_ms"),
            "{listener}: {text}"
        );
    }
    assert!(
        began.elapsed() >= Duration::from_millis(1_400),
        "cut off before its deadline: {:?}",
        began.elapsed()
    );
    // The same tenant's next request is served.
    let r = exec_true(&s, ALICE, &id).await;
    assert_eq!(r.status, 200, "{}", r.text);
    s.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_backend_is_given_up_at_its_deadline() {
    const LABEL: &str = "budgets-silent-backend";
    let _g = Guard(LABEL);
    let s = start(LABEL, |c, _| {
        tenants(c);
        c.server.limits.backend_timeout_ms = 1_500;
    })
    .await;
    let id = sandbox(&s, ALICE).await;
    // A server that accepts and never answers.
    let r = s
        .send(
            as_(ALICE, "POST", &format!("/v1/sandboxes/{id}/exec")).json(json!({
                "command": "setsid sh -c 'sleep 3600 | nc -l -p 8081 >/dev/null' \
                            </dev/null >/dev/null 2>&1 & sleep 1; netstat -ltn | grep -q ':8081 '",
                "timeout_ms": 30_000
            })),
        )
        .await;
    assert_eq!(
        r.json["exit_code"], 0,
        "the silent server listens: {}",
        r.text
    );
    let r = s
        .send(as_(ALICE, "GET", &format!("/v1/sandboxes/{id}/ports/8081")))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let path = r.json["path"].as_str().expect("path").to_string();
    // The link's own host name, sent as Host (no wildcard DNS needed).
    let host = r.json["host"].as_str().expect("host").to_string();
    let began = Instant::now();
    let mut conn = partial(
        s.ports,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        b"",
    )
    .await;
    let (status, text) = status_within(&mut conn, Duration::from_secs(20)).await;
    assert_eq!(status, 504, "the silent backend was waited for: {text}");
    assert!(text.contains("server.limits.backend_timeout_ms"), "{text}");
    assert!(
        began.elapsed() >= Duration::from_millis(1_400),
        "{:?}",
        began.elapsed()
    );
    s.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_public_e2b_port_relay_to_a_silent_server_pins_nothing() {
    const LABEL: &str = "budgets-e2b-relay";
    let _g = Guard(LABEL);
    // The default budget; a short wait for the silent server.
    let s = start(LABEL, |c, _| {
        tenants(c);
        c.server.e2b_listen = Some("127.0.0.1:0".into());
        c.server.limits.backend_timeout_ms = 3_000;
    })
    .await;
    let e2b = s.e2b.expect("an E2B listener");
    let b = sandbox(&s, BOB).await;
    // alice's E2B sandbox (public ports, E2B's default) runs a server that
    // accepts and never answers.
    let r = s
        .send_e2b(
            Req::new("POST", "/sandboxes")
                .header("X-API-Key", ALICE)
                .json(json!({"templateID": BUSYBOX, "timeout": 300})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let sid = r.json["sandboxID"].as_str().expect("sandboxID").to_string();
    let envd = r.json["envdAccessToken"]
        .as_str()
        .expect("token")
        .to_string();
    let body = envelope(&json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", "nc -ll -p 8082 -e sleep 3600"]}
    }));
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {e2b}\r\n\
         Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n\
         X-Access-Token: {envd}\r\nE2b-Sandbox-Id: {sid}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _server = partial(e2b, &head, &body).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The attack: 40 relays to it, no credential (the ports are public),
    // 64 MiB announced, 16 bytes sent, held open.
    let mut relays = Vec::new();
    for _ in 0..40 {
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: {e2b}\r\nE2b-Sandbox-Id: {sid}\r\n\
             E2b-Sandbox-Port: 8082\r\nContent-Length: {BIG}\r\n\r\n"
        );
        relays.push(partial(e2b, &head, b"0123456789abcdef").await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = exec_true(&s, BOB, &b).await;
    assert_eq!(r.status, 200, "bob's exec beside the relays: {}", r.text);
    // Each relay is given up at the server's deadline.
    for conn in relays.iter_mut() {
        let (status, text) = status_within(conn, Duration::from_secs(30)).await;
        assert_eq!(status, 504, "{text}");
    }
    drop(relays);
    s.stop().await;
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn no_listener_starts_beyond_loopback_without_authentication() {
    const LABEL: &str = "budgets-auth-none";
    let _g = Guard(LABEL);
    common::images();
    for (key, wide) in [
        ("server.e2b_listen", "e2b"),
        ("server.ports_listen", "ports"),
        ("server.listen", "listen"),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "corral-budgets-{wide}-{}",
            corral::host::random_hex(8)
        ));
        let mut c = Config::default();
        c.defaults.image = BUSYBOX.into();
        c.server.auth = AuthMode::None;
        c.server.listen = "127.0.0.1:0".into();
        c.server.runtime_dir = Some(dir.join("runtime").display().to_string());
        match wide {
            "e2b" => c.server.e2b_listen = Some("0.0.0.0:0".into()),
            "ports" => c.server.ports_listen = Some("0.0.0.0:0".into()),
            _ => c.server.listen = "0.0.0.0:0".into(),
        }
        let backend = common::service::runtime(RuntimeConfig {
            reap_orphans: false,
            ..RuntimeConfig::default()
        })
        .await;
        let provider = Provider::new(backend.clone(), c.provider.clone());
        let stop = tokio_util::sync::CancellationToken::new();
        let bound = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = bound.clone();
        let serve = corral_server::serve(
            c,
            backend,
            provider,
            BUSYBOX.into(),
            stop.clone(),
            move |_| seen.store(true, std::sync::atomic::Ordering::SeqCst),
        );
        // A service that starts runs until stopped: give it 10 s.
        let stopper = stop.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            stopper.cancel();
        });
        let result = tokio::time::timeout(Duration::from_secs(60), serve)
            .await
            .expect("serve returns");
        timer.abort();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            !bound.load(std::sync::atomic::Ordering::SeqCst),
            "{key} beyond loopback with auth none was bound"
        );
        let e = format!("{:#}", result.expect_err("refused at start"));
        assert!(
            e.contains(key)
                && e.contains("0.0.0.0:0")
                && e.contains("allowed on loopback only")
                && !e.contains("  "),
            "{e}"
        );
    }
    assert_eq!(remaining(LABEL), Vec::<String>::new());
}
