//! Servers inside sandboxes reached through a real `corral serve` on the
//! real daemon: busybox `httpd` answers through the link the owner gets,
//! under the link's own host name (`PORT-ID.localhost`) on the port-link
//! listener only (the API's listener answers 404 there, and the port-link
//! listener serves neither the API, the dashboard nor MCP, under any
//! name), headers that reach beyond the link are dropped both ways (the
//! `Authorization` a client sent never reaches the sandbox; a CGI's output
//! streamed as it is written), a WebSocket-style upgrade
//! becomes a two-way pipe, a wrong token, another port's or another
//! sandbox's token is refused, another tenant cannot get a link, and a
//! sandbox with `network: none` is reached as well and still has no way
//! out.

use std::time::Duration;

use corral_core::config::TenantConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::service::{as_, start, Service};
use common::Guard;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";

/// A web root with a page and a CGI that writes one line, waits for
/// /tmp/go, then writes another; a WebSocket-style server on 9000 that
/// answers the upgrade and echoes what follows.
const SERVERS: &str = r#"
mkdir -p /www/cgi-bin
echo 'hello from the sandbox' > /www/index.html
cat > /www/cgi-bin/stream <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
echo first-line
while [ ! -f /tmp/go ]; do sleep 0.1; done
echo second-line
CGI
chmod +x /www/cgi-bin/stream
cat > /www/cgi-bin/sw <<'CGI'
#!/bin/sh
printf 'Content-Type: text/javascript\r\nService-Worker-Allowed: /\r\nClear-Site-Data: "*"\r\nX-Kept: yes\r\n\r\n'
echo 'self.onfetch = () => {};'
CGI
chmod +x /www/cgi-bin/sw
cat > /www/cgi-bin/env <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
echo "auth=[$HTTP_AUTHORIZATION] proxy=[$HTTP_PROXY_AUTHORIZATION] cookie=[$HTTP_COOKIE] host=[$HTTP_HOST]"
CGI
chmod +x /www/cgi-bin/env
cat > /www/cgi-bin/login <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\nSet-Cookie: mine=1; Domain=localhost; Path=/\r\n\r\n'
echo in
CGI
chmod +x /www/cgi-bin/login
cat > /ws.sh <<'WS'
#!/bin/sh
cr=$(printf '\r')
while IFS= read -r line; do line=${line%$cr}; [ -z "$line" ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
WS
chmod +x /ws.sh
httpd -p 8080 -h /www </dev/null >/dev/null 2>&1
setsid nc -ll -p 9000 -e /ws.sh </dev/null >/dev/null 2>&1 &
for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done
exit 1
"#;

async fn sandbox(s: &Service, token: &str, body: Value) -> String {
    let r = s.send(as_(token, "POST", "/v1/sandboxes").json(body)).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["id"].as_str().expect("id").to_string();
    let r = s
        .send(
            as_(token, "POST", &format!("/v1/sandboxes/{id}/exec")).json(json!({
                "command": SERVERS, "timeout_ms": 60_000
            })),
        )
        .await;
    assert_eq!(r.json["exit_code"], 0, "the servers started: {}", r.text);
    id
}

async fn link(s: &Service, token: &str, id: &str, port: u16) -> Value {
    let r = s
        .send(as_(
            token,
            "GET",
            &format!("/v1/sandboxes/{id}/ports/{port}"),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json
}

/// Sends `request` to the port-link listener on a connection of its own;
/// the connection, after the request.
async fn raw(s: &Service, request: &str) -> TcpStream {
    raw_to(s.ports, request).await
}

async fn raw_to(addr: std::net::SocketAddr, request: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request.as_bytes()).await.expect("send");
    conn
}

/// Reads until `needle` has arrived (or fails after a generous bound:
/// the thing tested is that it arrives at all before the server ends).
async fn read_until(conn: &mut TcpStream, got: &mut Vec<u8>, needle: &str) {
    let read = async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(got).contains(needle) {
            let n = conn.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before {needle:?}: {}",
                String::from_utf8_lossy(got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in: {}", String::from_utf8_lossy(got)));
}

/// `GET path` from the port-link listener, under the host name `host`
/// (a link's, as a program that cannot resolve it sends it).
async fn get(s: &Service, host: &str, path: &str) -> (u16, String) {
    get_with(s.ports, host, path, "").await
}

/// `GET path` from `addr` under its own address as the host name.
async fn get_from(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    get_with(addr, &addr.to_string(), path, "").await
}

async fn get_with(
    addr: std::net::SocketAddr,
    host: &str,
    path: &str,
    headers: &str,
) -> (u16, String) {
    let mut conn = raw_to(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"),
    )
    .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_in_a_sandbox_is_reached_through_its_link_and_nothing_else_is() {
    let label = "ports";
    let _g = Guard(label);
    let s = start(label, |c, _| {
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
    let (a, b) = tokio::join!(
        sandbox(&s, ALICE, json!({})),
        sandbox(&s, ALICE, json!({"spec": {"network": "none"}}))
    );

    // The page, through the owner's link, with no bearer token, under the
    // link's own host name.
    let l = link(&s, ALICE, &a, 8080).await;
    let path = l["path"].as_str().expect("path").to_string();
    let host = l["host"].as_str().expect("host").to_string();
    let token = l["token"].as_str().expect("token").to_string();
    assert_ne!(s.ports, s.addr);
    let a_id = s
        .send(as_(ALICE, "GET", &format!("/v1/sandboxes/{a}")))
        .await
        .json["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    assert_eq!(host, format!("8080-{a_id}.localhost:{}", s.ports.port()));
    assert_eq!(path, format!("/{token}/"));
    assert_eq!(
        l["url"].as_str().expect("url"),
        format!("http://{host}{path}"),
        "the link is an origin of its own: {l}"
    );
    assert_eq!(
        l["connect"].as_str().expect("connect"),
        format!("http://{}", s.ports)
    );
    let (status, text) = get(&s, &host, &path).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("hello from the sandbox"), "{text}");
    let (status, text) = get(&s, &host, &format!("{path}index.html")).await;
    assert_eq!(status, 200, "{text}");
    // The link's path on the listener's own name, or on another name, is
    // no link.
    let (status, text) = get(&s, &s.ports.to_string(), &path).await;
    assert_eq!(status, 404, "{text}");
    assert!(!text.contains("hello from the sandbox"), "{text}");
    // Credentials meant for something else never reach the sandbox, nor
    // a cookie its server did not set; its own cookies do, kept to the
    // link's host name.
    let cgi = format!("{path}cgi-bin/env");
    let headers = format!(
        "Authorization: Bearer {ALICE}\r\nProxy-Authorization: Basic eDp5\r\n\
         Cookie: theirs=1; mine=1\r\n"
    );
    let ask_env = || get_with(s.ports, &host, &cgi, &headers);
    let (status, text) = ask_env().await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("auth=[] proxy=[] cookie=[] "), "{text}");
    assert!(!text.contains(ALICE), "{text}");
    let (status, text) = get(&s, &host, &format!("{path}cgi-bin/login")).await;
    assert_eq!(status, 200, "{text}");
    let set_cookie = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_default();
    assert_eq!(set_cookie.trim(), "set-cookie: mine=1; Path=/", "{text}");
    let (status, text) = ask_env().await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("auth=[] proxy=[] cookie=[mine=1] "), "{text}");

    // No content from a sandbox on the API's origin: its listener has no
    // port links at all.
    let (status, text) = get_with(s.addr, &host, &path, "").await;
    assert_eq!(
        status, 403,
        "the API's listener refuses a link's name: {text}"
    );
    let (status, text) = get_from(s.addr, &path).await;
    assert_eq!(status, 401, "{text}");
    assert!(!text.contains("hello from the sandbox"), "{text}");
    let r = s.send(as_(ALICE, "GET", &path)).await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert!(!r.text.contains("hello from the sandbox"), "{}", r.text);
    // And the port-link listener serves nothing but links: not the API,
    // the dashboard, MCP or the OpenAPI document, with or without a token.
    for route in [
        "/v1/health",
        "/v1/sandboxes",
        "/dashboard",
        "/mcp",
        "/openapi.json",
        "/",
    ] {
        let (status, text) = get_from(s.ports, route).await;
        assert_eq!(status, 404, "{route}: {text}");
        let (status, text) = get_with(
            s.ports,
            &s.ports.to_string(),
            route,
            &format!("Authorization: Bearer {ALICE}\r\n"),
        )
        .await;
        assert_eq!(status, 404, "{route} with a token: {text}");
        // Under a link's name it is a path of the sandbox's server, whose
        // token it lacks.
        let (status, text) = get(&s, &host, route).await;
        assert_eq!(status, 403, "{route} under the link's name: {text}");
    }
    // A foreign Host is refused there too (DNS rebinding).
    let mut conn = raw(
        &s,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: rebind.evil.example:{}\r\nConnection: close\r\n\r\n",
            s.ports.port()
        ),
    )
    .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut out)).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 403"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // Headers that would reach beyond the link's own pages are dropped;
    // others pass.
    let (status, text) = get(&s, &host, &format!("{path}cgi-bin/sw")).await;
    assert_eq!(status, 200, "{text}");
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(head.contains("x-kept: yes"), "{text}");
    assert!(!head.contains("service-worker-allowed"), "{text}");
    assert!(!head.contains("clear-site-data"), "{text}");

    // A response streams as the server writes it.
    let mut conn = raw(
        &s,
        &format!("GET {path}cgi-bin/stream HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let mut got = Vec::new();
    read_until(&mut conn, &mut got, "first-line").await;
    assert!(!String::from_utf8_lossy(&got).contains("second-line"));
    let r = s
        .send(
            as_(ALICE, "POST", &format!("/v1/sandboxes/{a}/exec"))
                .json(json!({"command": "touch /tmp/go"})),
        )
        .await;
    assert_eq!(r.json["exit_code"], 0, "{}", r.text);
    read_until(&mut conn, &mut got, "second-line").await;

    // An upgrade becomes a two-way pipe (the WebSocket handshake's shape).
    let ws = link(&s, ALICE, &a, 9000).await;
    let ws_path = ws["path"].as_str().expect("path");
    let ws_host = ws["host"].as_str().expect("host");
    let mut conn = raw(
        &s,
        &format!(
            "GET {ws_path}echo HTTP/1.1\r\nHost: {ws_host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
    )
    .await;
    let mut got = Vec::new();
    read_until(&mut conn, &mut got, "\r\n\r\n").await;
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    for message in ["ping-1", "ping-2"] {
        conn.write_all(message.as_bytes()).await.expect("send");
        read_until(&mut conn, &mut got, message).await;
    }

    // Refused: a wrong token, another port's, another sandbox's, a name
    // under the link's.
    let wrong = path.replace(&token, &"0".repeat(token.len()));
    assert_eq!(get(&s, &host, &wrong).await.0, 403);
    let other_port = host.replace("8080-", "9000-");
    assert_eq!(
        get(&s, &other_port, &path).await.0,
        403,
        "the 8080 token does not open 9000"
    );
    let lb = link(&s, ALICE, &b, 8080).await;
    let b_token = lb["token"].as_str().expect("token");
    let b_host = lb["host"].as_str().expect("host");
    let swapped = path.replace(&token, b_token);
    assert_eq!(
        get(&s, &host, &swapped).await.0,
        403,
        "b's token does not open a"
    );
    assert_eq!(
        get(&s, b_host, &path).await.0,
        403,
        "a's token does not open b"
    );
    let (status, _) = get(&s, &format!("x.{host}"), &path).await;
    assert_eq!(status, 403, "a name under a link's is refused at the door");
    // Another tenant gets no link to it (404, as if absent).
    let r = s
        .send(as_(BOB, "GET", &format!("/v1/sandboxes/{a}/ports/8080")))
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    // Nor its usage or egress counts.
    for route in ["usage", "egress"] {
        let r = s
            .send(as_(BOB, "GET", &format!("/v1/sandboxes/{a}/{route}")))
            .await;
        assert_eq!(r.status, 404, "{route}: {}", r.text);
    }
    let r = s
        .send(as_(ALICE, "GET", &format!("/v1/sandboxes/{a}/ports/0")))
        .await;
    assert_eq!(
        (r.status, r.json["error"]["field"].as_str()),
        (400, Some("port")),
        "{}",
        r.text
    );

    // `network: none` is reached too (through its namespace) ...
    let (status, text) = get(&s, b_host, lb["path"].as_str().expect("path")).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("hello from the sandbox"), "{text}");
    // ... and still has no way out: not to the service, not to the host.
    let r = s
        .send(as_(ALICE, "POST", &format!("/v1/sandboxes/{b}/exec")).json(json!({
            "command": format!("wget -q -T 3 -O - http://{}/v1/health; echo rc=$?; ip route 2>/dev/null | wc -l", s.addr),
            "timeout_ms": 30_000
        })))
        .await;
    let out = r.json["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("rc=1"),
        "no egress from network: none: {}",
        r.text
    );
    // A port nothing listens on is a clear 502.
    let dead = link(&s, ALICE, &a, 8999).await;
    let (status, text) = get(
        &s,
        dead["host"].as_str().expect("host"),
        dead["path"].as_str().expect("path"),
    )
    .await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("8999"), "{text}");

    // A deleted sandbox's link is dead.
    let r = s
        .send(as_(ALICE, "DELETE", &format!("/v1/sandboxes/{a}")))
        .await;
    assert!(r.status < 300, "{}", r.text);
    assert_eq!(get(&s, &host, &path).await.0, 403);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn links_take_their_host_names_under_the_configured_ports_domain() {
    let label = "ports-domain";
    let _g = Guard(label);
    let s = start(label, |c, _| {
        c.server.token = Some(ALICE.into());
        c.server.ports_domain = Some("ports.example.test".into());
    })
    .await;
    let a = sandbox(&s, ALICE, json!({})).await;
    let l = link(&s, ALICE, &a, 8080).await;
    let host = l["host"].as_str().expect("host");
    let path = l["path"].as_str().expect("path");
    assert!(
        host.starts_with("8080-sb-")
            && host.ends_with(&format!(".ports.example.test:{}", s.ports.port())),
        "{l}"
    );
    assert_eq!(
        l["url"].as_str(),
        Some(format!("http://{host}{path}").as_str())
    );
    let (status, text) = get(&s, host, path).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("hello from the sandbox"), "{text}");
    // The default domain is not this service's links' any more.
    let (name, _) = host.split_once('.').expect("a dotted name");
    let (status, text) = get(&s, &format!("{name}.localhost:{}", s.ports.port()), path).await;
    assert_eq!(status, 403, "{text}");
    s.stop().await;
}
