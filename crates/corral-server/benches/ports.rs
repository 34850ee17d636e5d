//! `cargo bench -p corral-server --bench ports`: one HTTP round trip (a new
//! connection, `GET /`, the answer, the close) to busybox `httpd` in a
//! sandbox, three ways in the same run: straight to the container's
//! address (the floor), through a port link of a real `corral serve` to a
//! sandbox on corral's network (a TCP connect from the service), and
//! through a link to a `network: none` sandbox (an exec of the agent's
//! port relay per connection). Reports p50/p90/p99 and the ratios to the
//! floor.
//!
//! Needs a daemon and the test images (`scripts/build-test-images.sh`).
//! `PORTS_N` requests per row (default 200). Under `cargo test` it runs as
//! a smoke test with a twentieth of that.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use corral::{Provider, Runtime, RuntimeConfig};
use corral_core::config::Config;
use corral_docker::{DockerBackend, DockerConfig};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "corral-test/busybox";
const TOKEN: &str = "bench-token-0123456789";

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label=corralbench={}", self.0);
        if let Ok(out) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from)
                .collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
    }
}

/// One HTTP/1.0 exchange on a new connection; the answer.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> String {
    http_to(addr, addr, method, path, body)
}

/// [`http`] under the host name `host` (a port link's).
fn http_to(addr: &str, host: &str, method: &str, path: &str, body: Option<&Value>) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn json_of(answer: &str) -> Value {
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"))
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn row(name: &str, mut samples: Vec<Duration>, floor: Option<Duration>) -> Duration {
    samples.sort();
    let (p50, p90, p99) = (
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
    );
    let ratio = floor
        .map(|f| format!("  x{:.1} of the floor", p50.as_secs_f64() / f.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{name:<46} n={:<5} p50={:>8.3} ms  p90={:>8.3} ms  p99={:>8.3} ms{ratio}",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    p50
}

/// `n` round trips of `GET path` through `addr`, each checked.
/// `(host, path)` of a port link, or `(addr, path)` direct.
fn measure(addr: &str, (host, path): (&str, &str), n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let answer = http_to(addr, host, "GET", path, None);
            let took = t.elapsed();
            assert!(answer.contains("bench-page"), "{answer}");
            took
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let smoke = std::env::args().all(|a| a != "--bench");
    let n = std::env::var("PORTS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let n = if smoke { (n / 20).max(3) } else { n };
    let tag = format!("ports-{}", std::process::id());
    let _cleanup = Cleanup(tag.clone());

    let mut config = Config::default();
    config.defaults.image = IMAGE.into();
    config
        .defaults
        .labels
        .insert("corralbench".into(), tag.clone());
    config.server.listen = "127.0.0.1:0".into();
    config.server.token = Some(TOKEN.into());
    let docker = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("a daemon");
    let runtime = Runtime::new(
        std::sync::Arc::new(docker),
        RuntimeConfig {
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    let provider = Provider::new(runtime.clone(), config.provider.clone());
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let service = tokio::spawn(corral_server::serve(
        config,
        runtime,
        provider,
        IMAGE.into(),
        stop.clone(),
        move |b| {
            let _ = tx.send((b.tcp, b.ports));
        },
    ));
    let (addr, ports) = rx.await.expect("the service listens");
    let (addr, ports) = (addr.to_string(), ports.to_string());

    let (floor, via_link, via_relay) = tokio::task::spawn_blocking(move || {
        let mut links = Vec::new();
        let mut container_ip = String::new();
        for network in ["bridge", "none"] {
            let created = json_of(&http(&addr, "POST", "/v1/sandboxes", Some(&json!({"spec": {"network": network}}))));
            let id = created["id"].as_str().expect("id").to_string();
            let started = json_of(&http(&addr, "POST", &format!("/v1/sandboxes/{id}/exec"), Some(&json!({
                "command": "mkdir -p /www && echo bench-page > /www/index.html && httpd -p 8080 -h /www </dev/null >/dev/null 2>&1 && \
                            for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1",
                "timeout_ms": 60_000
            }))));
            assert_eq!(started["exit_code"], 0, "{started}");
            let link = json_of(&http(&addr, "GET", &format!("/v1/sandboxes/{id}/ports/8080"), None));
            links.push((
                link["host"].as_str().expect("host").to_string(),
                link["path"].as_str().expect("path").to_string(),
            ));
            if network == "bridge" {
                let container = created["container_id"].as_str().expect("container_id");
                let out = Command::new("docker")
                    .args(["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container])
                    .output()
                    .expect("docker inspect");
                container_ip = String::from_utf8_lossy(&out.stdout).trim().to_string();
            }
        }
        // Warm up each path.
        let direct = format!("{container_ip}:8080");
        let link = |i: usize| (links[i].0.as_str(), links[i].1.as_str());
        measure(&direct, (&direct, "/"), 3);
        measure(&ports, link(0), 3);
        measure(&ports, link(1), 3);
        (
            measure(&direct, (&direct, "/"), n),
            measure(&ports, link(0), n),
            measure(&ports, link(1), n),
        )
    })
    .await
    .expect("the measurements");

    println!("one HTTP round trip (new connection) to httpd in a sandbox:");
    let f = row("direct to the container's address (floor)", floor, None);
    row("port link through corral serve", via_link, Some(f));
    row("port link, network: none (exec relay)", via_relay, Some(f));
    stop.cancel();
    let _ = service.await;
}
