//! The service's front door, attack by attack, against the real service
//! with raw HTTP/1.1 requests (`common::service`): a web page's
//! cross-origin `text/plain` POST, JSON not sent as JSON, a DNS-rebinding
//! `Host`, a foreign `Origin` on MCP, requests without or with a wrong
//! token, another local user on the Unix socket. Each refusal is checked by
//! status and by the header it names, and none may leave a container
//! behind. Also: a trusted profile with a mount still works where the same
//! mount in a client's spec is refused, and closing an SSE stream kills a
//! command that prints nothing. `policy.rs` has the spec attacks.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corral_core::spec::Mount;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::service::{initialize, mcp, start, Req, Service};
use common::{remaining, Guard};

#[tokio::test]
async fn a_web_page_cannot_post_cross_origin() {
    let _g = Guard("api-trust-origin");
    let svc = start("api-trust-origin", |c, _| {
        c.server.allowed_origins = vec!["http://localhost:3000".into()];
    })
    .await;
    // What a page can send to loopback without a CORS preflight: a
    // text/plain POST whose body is JSON. With and without the token.
    let attack =
        json!({"session": "pwn", "spec": {"mounts": [{"host": "/etc", "container": "/host-etc"}]}});
    for token in [false, true] {
        let mut req = Req::new("POST", "/v1/sandboxes")
            .header("Origin", "http://evil.example")
            .body_as("text/plain", attack.to_string());
        if token {
            req = req.header("Authorization", &svc.bearer());
        }
        let r = svc.send(req).await;
        assert_eq!(r.status, 403, "{}", r.text);
        assert_eq!(r.field(), "Origin", "{}", r.text);
        assert!(r.message().contains("http://evil.example"), "{}", r.text);
    }
    // No Origin, but the browser says it is another site's request (an
    // image or a form): refused too.
    let r = svc
        .send(
            svc.req("GET", "/v1/sandboxes")
                .header("Sec-Fetch-Site", "cross-site"),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "Sec-Fetch-Site"), "{}", r.text);
    // `Origin: null` (sandboxed frames, file:// pages) is foreign as well.
    let r = svc
        .send(svc.req("GET", "/v1/sandboxes").header("Origin", "null"))
        .await;
    assert_eq!((r.status, r.field()), (403, "Origin"), "{}", r.text);
    // An allowed Origin next to a foreign one.
    let r = svc
        .send(
            svc.req("GET", "/v1/sandboxes")
                .header("Origin", "http://localhost:3000")
                .header("Origin", "http://evil.example"),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "Origin"), "{}", r.text);
    // An origin the operator listed gets through.
    let r = svc
        .send(
            svc.req("GET", "/v1/sandboxes")
                .header("Origin", "http://localhost:3000"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The service's own origin (its dashboard, whose POSTs carry it) gets
    // through; the same name on another port is another origin.
    let own = format!("http://{}", svc.addr);
    let r = svc
        .send(svc.req("GET", "/v1/sandboxes").header("Origin", &own))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let elsewhere = format!("http://{}:1", svc.addr.ip());
    let r = svc
        .send(svc.req("GET", "/v1/sandboxes").header("Origin", &elsewhere))
        .await;
    assert_eq!((r.status, r.field()), (403, "Origin"), "{}", r.text);
    // The own origin does not vouch for a foreign Host: check 1 refuses it.
    let r = svc
        .send(
            svc.req("GET", "/v1/sandboxes")
                .header("Host", "evil.example")
                .header("Origin", "http://evil.example"),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "Host"), "{}", r.text);
    assert_eq!(remaining("api-trust-origin"), Vec::<String>::new());
    svc.stop().await;
}

#[tokio::test]
async fn json_must_be_sent_as_json() {
    let _g = Guard("api-trust-json");
    let svc = start("api-trust-json", |_, _| {}).await;
    let body = json!({"session": "plain"}).to_string();
    // No Origin, the right token: still refused, since a browser could
    // have sent it (some strip Origin, e.g. from extensions or old versions).
    for (ty, path) in [
        (Some("text/plain"), "/v1/sandboxes"),
        (Some("application/x-www-form-urlencoded"), "/v1/sandboxes"),
        (None, "/v1/sandboxes"),
        (Some("text/plain"), "/v1/sandboxes/plain/exec"),
        (Some("text/plain"), "/v1/sandboxes/plain/exec/stream"),
        (Some("text/plain"), "/v1/sandboxes/plain/shells/main/exec"),
    ] {
        let mut req = svc.req("POST", path);
        req.body = body.clone().into_bytes();
        if let Some(ty) = ty {
            req = req.header("Content-Type", ty);
        }
        let r = svc.send(req).await;
        assert_eq!(r.status, 415, "{ty:?} {path}: {}", r.text);
        assert_eq!(r.field(), "Content-Type", "{}", r.text);
    }
    // MCP too.
    let r = svc
        .send(mcp(svc.req("POST", "/mcp")).body_as("text/plain", initialize().to_string()))
        .await;
    assert_eq!((r.status, r.field()), (415, "Content-Type"), "{}", r.text);
    assert_eq!(remaining("api-trust-json"), Vec::<String>::new());
    svc.stop().await;
}

#[tokio::test]
async fn a_trusted_profile_may_mount_what_a_client_may_not() {
    let _g = Guard("api-trust-profile");
    let svc = start("api-trust-profile", |c, dir| {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        std::fs::write(data.join("hello"), "from the host\n").expect("data file");
        let mut spec = c.defaults.clone();
        spec.mounts.push(Mount {
            host: data.display().to_string(),
            container: "/data".into(),
            read_only: true,
            nosuid: false,
        });
        c.profiles.insert("data".into(), spec);
    })
    .await;
    let mount = json!([{"host": svc.dir.join("data").display().to_string(), "container": "/data", "read_only": true}]);
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "inline", "spec": {"mounts": mount}})),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "spec.mounts[0]"), "{}", r.text);
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "trusted", "profile": "data"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes/trusted/exec")
                .json(json!({"command": "cat /data/hello"})),
        )
        .await;
    assert_eq!(r.json["stdout"], "from the host\n", "{}", r.text);
    svc.stop().await;
    assert_eq!(remaining("api-trust-profile"), Vec::<String>::new());
}

#[tokio::test]
async fn bad_host_headers_are_refused() {
    let _g = Guard("api-trust-host");
    let svc = start("api-trust-host", |c, _| {
        c.server.allowed_hosts = vec!["corral.internal".into()];
    })
    .await;
    let port = svc.addr.port();
    // A DNS-rebinding page talks to 127.0.0.1 under its own name.
    for host in [
        format!("rebind.evil.example:{port}"),
        "rebind.evil.example".to_string(),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        format!("localhost.evil.example:{port}"),
    ] {
        let r = svc
            .send(svc.req("GET", "/v1/sandboxes").header("Host", &host))
            .await;
        assert_eq!((r.status, r.field()), (403, "Host"), "{host}: {}", r.text);
        let r = svc
            .send(mcp(svc.req("POST", "/mcp").header("Host", &host)).json(initialize()))
            .await;
        assert_eq!(
            (r.status, r.field()),
            (403, "Host"),
            "MCP {host}: {}",
            r.text
        );
    }
    // Two Host headers, one of them right.
    let r = svc
        .send(
            svc.req("GET", "/v1/sandboxes")
                .header("Host", &format!("127.0.0.1:{port}"))
                .header("Host", &format!("rebind.evil.example:{port}")),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "Host"), "{}", r.text);
    // A request with no Host at all (HTTP/1.0 style).
    let r = svc
        .send(svc.req("GET", "/v1/sandboxes").header("Host", ""))
        .await;
    assert_eq!((r.status, r.field()), (403, "Host"), "{}", r.text);
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "corral.internal:8443".to_string(),
    ] {
        let r = svc
            .send(svc.req("GET", "/v1/sandboxes").header("Host", &host))
            .await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
    svc.stop().await;
}

#[tokio::test]
async fn mcp_refuses_foreign_origins() {
    let _g = Guard("api-trust-mcp");
    let svc = start("api-trust-mcp", |_, _| {}).await;
    for origin in ["http://evil.example", "http://localhost:8080", "null"] {
        let r = svc
            .send(mcp(svc.req("POST", "/mcp").header("Origin", origin)).json(initialize()))
            .await;
        assert_eq!(
            (r.status, r.field()),
            (403, "Origin"),
            "{origin}: {}",
            r.text
        );
    }
    let r = svc
        .send(mcp(Req::new("POST", "/mcp")).json(initialize()))
        .await;
    assert_eq!(r.status, 401, "MCP without the token: {}", r.text);
    let r = svc
        .send(mcp(svc.req("POST", "/mcp")).json(initialize()))
        .await;
    assert_eq!(r.status, 200, "MCP with the token: {}", r.text);
    assert!(r.text.contains("\"corral\""), "{}", r.text);
    assert_eq!(remaining("api-trust-mcp"), Vec::<String>::new());
    svc.stop().await;
}

#[tokio::test]
async fn a_token_is_generated_and_required() {
    let _g = Guard("api-trust-token");
    // The default configuration: no token configured.
    let svc = start("api-trust-token", |_, _| {}).await;
    let file = svc
        .token_file
        .clone()
        .expect("a generated token has a file");
    let token = svc.token.clone().expect("token");
    assert_eq!(token.len(), 64, "256 random bits in hex");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().expect("dir")), 0o700);
    for (auth, why) in [
        (None, "no token"),
        (Some("Bearer wrong".to_string()), "a wrong token"),
        (
            Some(format!("Bearer {}", &token[..63])),
            "a prefix of the token",
        ),
        (
            Some(format!("Basic {token}")),
            "the token in another scheme",
        ),
    ] {
        let mut req = Req::new("POST", "/v1/sandboxes").json(json!({}));
        if let Some(a) = &auth {
            req = req.header("Authorization", a);
        }
        let r = svc.send(req).await;
        assert_eq!(r.status, 401, "{why}: {}", r.text);
        assert_eq!(r.json["error"]["kind"], "unauthorized", "{}", r.text);
        assert!(!r.text.contains(&token), "the answer leaks the token");
    }
    // Health probes need none.
    let r = svc.send(Req::new("GET", "/v1/health")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = svc.send(svc.req("GET", "/v1/sandboxes")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(remaining("api-trust-token"), Vec::<String>::new());
    svc.stop().await;

    // A configured token is the operator's to hand out: no file.
    let svc = start("api-trust-token", |c, _| {
        c.server.token = Some("configured".into())
    })
    .await;
    assert!(svc.token_file.is_none());
    assert!(!svc
        .dir
        .join("runtime")
        .join(format!("server-127.0.0.1-{}.json", svc.addr.port()))
        .exists());
    let r = svc.send(svc.req("GET", "/v1/sandboxes")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    svc.stop().await;
}

// curl runs as a blocking child process: the service needs threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_lets_its_owner_in_and_asks_others_for_the_token() {
    let _g = Guard("api-trust-unix");
    // Another user must be able to reach the socket's directory for the
    // socket's own mode to be what keeps them out.
    let sock_dir = [env!("CARGO_TARGET_TMPDIR"), "/var/tmp", "/dev/shm"]
        .into_iter()
        .map(PathBuf::from)
        .find(|d| {
            d.ancestors()
                .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
        })
        .expect("a directory other users can traverse")
        .join(format!("corral-trust-{}", corral::host::random_hex(8)));
    std::fs::create_dir_all(&sock_dir).expect("socket dir");
    std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sock_path = sock_dir.join("corral.sock");
    let svc = start("api-trust-unix", |c, _| {
        c.server.unix_socket = Some(sock_path.display().to_string());
    })
    .await;
    let sock = svc.unix.clone().expect("socket");
    let meta = std::fs::metadata(&sock).expect("socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The owner (this test's user) needs no token.
    let mut s = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect");
    let r = Req::new("GET", "/v1/sandboxes")
        .send(&mut s, "corral")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Another local user: the socket's mode keeps it out...
    let other = |auth: Option<&str>| {
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "curl",
            "-s",
        ])
        .args(["--max-time", "30", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("--unix-socket")
        .arg(&sock);
        if let Some(a) = auth {
            cmd.args(["-H", a]);
        }
        cmd.arg("http://corral/v1/sandboxes");
        let out = cmd.output().expect("setpriv and curl (util-linux, curl)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        other(None),
        "000",
        "another user connected to a 0600 socket"
    );
    // ...and where an operator opens it up (or in the instant between bind
    // and chmod), the kernel-reported peer uid is not the owner's: the
    // token is required.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(other(None), "401");
    assert_eq!(other(Some("Authorization: Bearer wrong")), "401");
    assert_eq!(
        other(Some(&format!("Authorization: {}", svc.bearer()))),
        "200"
    );
    svc.stop().await;
    assert!(!sock_path.exists(), "the socket outlived the service");
    let _ = std::fs::remove_dir_all(&sock_dir);
}

/// Processes in the sandbox whose command line contains `needle`.
async fn processes(svc: &Service, id: &str, needle: &str) -> Vec<String> {
    let r = svc
        .send(
            svc.req("POST", &format!("/v1/sandboxes/{id}/exec"))
                .json(json!({"command": "ps -o pid,args"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["stdout"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle) && !l.contains("ps -o"))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn closing_an_sse_stream_kills_a_quiet_command() {
    let _g = Guard("api-trust-sse");
    let svc = start("api-trust-sse", |_, _| {}).await;
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "sse"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);

    // A command that prints nothing, then would leave a mark.
    let mut stream = tokio::net::TcpStream::connect(svc.addr)
        .await
        .expect("connect");
    let req = svc
        .req("POST", "/v1/sandboxes/sse/exec/stream")
        .json(json!({"command": "sleep 30; touch /tmp/marker"}));
    let mut bytes = req.head(&svc.addr.to_string()).into_bytes();
    bytes.extend_from_slice(&req.body);
    stream.write_all(&bytes).await.expect("write");
    let mut head = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut head))
        .await
        .expect("the stream opens")
        .expect("read");
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes(&svc, "sse", "sleep 30").await.is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The client goes away.
    drop(stream);
    let closed = Instant::now();
    loop {
        let left = processes(&svc, "sse", "sleep 30").await;
        if left.is_empty() {
            break;
        }
        assert!(
            closed.elapsed() < Duration::from_secs(10),
            "the abandoned command still runs 10 s after the client closed the stream: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes/sse/exec")
                .json(json!({"command": "test -e /tmp/marker && echo marker || echo none"})),
        )
        .await;
    assert_eq!(r.json["stdout"], "none\n", "{}", r.text);
    svc.stop().await;
    assert_eq!(remaining("api-trust-sse"), Vec::<String>::new());
}

/// Every listener has the same front door: a DNS-rebinding page (a foreign
/// `Host`) and a browser's cross-site request (`Sec-Fetch-Site` without
/// an `Origin`, or a foreign `Origin`) are refused on the main listener,
/// the Unix socket (no host names there to rebind: fetch metadata only)
/// and the E2B-compatible listener, control plane and envd alike, even
/// with `auth: none`, where such a page would otherwise list sandboxes and
/// read their files.
#[tokio::test(flavor = "multi_thread")]
async fn every_listener_refuses_rebinding_and_cross_site_requests() {
    let label = "api-trust-listeners";
    let _g = Guard(label);
    let sock = std::env::temp_dir().join(format!(
        "corral-trust-l-{}.sock",
        corral::host::random_hex(8)
    ));
    let svc = start(label, |c, _| {
        c.server.auth = corral_core::config::AuthMode::None;
        c.server.e2b_listen = Some("127.0.0.1:0".into());
        c.server.unix_socket = Some(sock.display().to_string());
    })
    .await;
    let main = svc.addr.port();
    let e2b = svc.e2b.expect("e2b listener").port();
    // What a rebinding page or a cross-site request sends.
    let attacks = |port: u16| {
        vec![
            (
                vec![("Host", format!("rebind.evil.example:{port}"))],
                "Host",
            ),
            (
                vec![("Host", format!("localhost.evil.example:{port}"))],
                "Host",
            ),
            (
                vec![("Sec-Fetch-Site", "cross-site".to_string())],
                "Sec-Fetch-Site",
            ),
            (
                vec![("Sec-Fetch-Site", "same-site".to_string())],
                "Sec-Fetch-Site",
            ),
            (
                vec![("Origin", "http://evil.example".to_string())],
                "Origin",
            ),
        ]
    };
    let with = |mut req: Req, headers: &[(&str, String)]| {
        for (n, v) in headers {
            req = req.header(n, v);
        }
        req
    };
    for (headers, field) in attacks(main) {
        let r = svc
            .send(with(Req::new("GET", "/v1/sandboxes"), &headers))
            .await;
        assert_eq!(
            (r.status, r.field()),
            (403, field),
            "main {headers:?}: {}",
            r.text
        );
    }
    let mut e2b_attacks = attacks(e2b);
    // E2B's sandbox addressing under a rebinding page's own name.
    e2b_attacks.push((
        vec![("Host", format!("49983-x.rebind.evil.example:{e2b}"))],
        "Host",
    ));
    for (headers, field) in e2b_attacks {
        for (method, path) in [
            ("GET", "/sandboxes"),
            ("GET", "/v2/sandboxes"),
            ("POST", "/sandboxes"),
            ("GET", "/files?path=/etc/passwd"),
        ] {
            let mut req = with(Req::new(method, path), &headers);
            if method == "POST" {
                req = req.json(json!({"templateID": "base"}));
            }
            let r = svc.send_e2b(req).await;
            assert_eq!(
                (r.status, r.field()),
                (403, field),
                "e2b {method} {path} {headers:?}: {}",
                r.text
            );
        }
    }
    // The Unix socket: fetch metadata and Origin (a Host names nothing there).
    for (headers, field) in attacks(0).into_iter().skip(2) {
        let mut s = tokio::net::UnixStream::connect(&sock)
            .await
            .expect("connect");
        let r = with(Req::new("GET", "/v1/sandboxes"), &headers)
            .send(&mut s, "corral")
            .await;
        assert_eq!(
            (r.status, r.field()),
            (403, field),
            "unix {headers:?}: {}",
            r.text
        );
    }
    // Nothing was created, and the right names still get in.
    assert_eq!(remaining(label), Vec::<String>::new());
    for host in [
        format!("127.0.0.1:{e2b}"),
        format!("localhost:{e2b}"),
        format!("49983-x.localhost:{e2b}"),
    ] {
        let r = svc
            .send_e2b(
                Req::new("GET", "/sandboxes")
                    .header("Host", &host)
                    .header("Sec-Fetch-Site", "same-origin"),
            )
            .await;
        assert_eq!(r.status, 200, "e2b {host}: {}", r.text);
    }
    let r = svc.send(Req::new("GET", "/v1/sandboxes")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    svc.stop().await;
}
