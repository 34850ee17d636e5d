//! `corral port` as a user runs it: a server inside a real sandbox on the
//! real daemon (busybox `httpd`) is reached through the local address the
//! command prints, for a sandbox on corral's network and for one with
//! `network: none` (reached through its namespace, still without egress).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use corral::{CommandSpec, Runtime, RuntimeConfig, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const LABEL: &str = "cli-port";

/// Removes this test's containers however it ends.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corraltest={LABEL}"),
            ])
            .output();
        if let Ok(out) = out {
            let ids = String::from_utf8_lossy(&out.stdout).to_string();
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(ids)
                    .output();
            }
        }
    }
}

/// `GET /` through `addr`; the whole answer.
fn get(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the forwarded port");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_port_forwards_a_local_address_to_a_server_in_a_sandbox() {
    images();
    let _cleanup = Cleanup;
    let docker = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("a Docker daemon");
    let rt = Runtime::new(
        Arc::new(docker),
        RuntimeConfig {
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    for (name, network) in [
        ("bridge", corral::Network::Bridge),
        ("none", corral::Network::None),
    ] {
        let mut spec = SandboxSpec::new("corral-test/busybox");
        spec.labels.insert("corraltest".into(), LABEL.into());
        spec.network = network;
        let sb = rt.create(&spec).await.expect("start a sandbox");
        let out = sb
            .run(&CommandSpec::shell(format!(
                "mkdir -p /www && echo served-over-{name} > /www/index.html && \
                 httpd -p 8080 -h /www </dev/null >/dev/null 2>&1 && \
                 for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1"
            )))
            .await;
        assert_eq!(out.exit_code, Some(0), "{out:?}");

        let mut child = Command::new(CORRAL)
            .args(["port", &sb.id()[..12], "8080"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run corral port");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("read the first line");
        let addr = first
            .strip_prefix("forwarding http://")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {first:?}"))
            .to_string();
        let page = tokio::task::spawn_blocking(move || get(&addr))
            .await
            .expect("get");
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            page.starts_with("HTTP/1.") && page.contains(&format!("served-over-{name}")),
            "{page}"
        );
        sb.destroy().await.expect("destroy");
    }

    // A sandbox that does not exist is named.
    let out = Command::new(CORRAL)
        .args(["port", "no-such-sandbox", "8080"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sandbox 'no-such-sandbox'"));
}
