//! `cargo bench -p corral-kube --bench control`: what the Kubernetes
//! backend's control path (a TCP connection to the agent opened by the
//! secret's handshake) costs against the Docker backend's (the daemon's
//! attach to PID 1's stdin and stdout), measured in the same run on the
//! same host and image:
//! - a trivial command's round trip through the runtime over each;
//! - opening the control stream: TCP connect plus handshake, against an
//!   attach request to the daemon.
//!
//! The TCP side runs in the pod-network test double (`tests/double`: a
//! real container whose agent listens as in a pod) because no cluster is
//! reachable from CI; on a cluster the connect adds the pod network's
//! latency and nothing else: the API server is not involved.
//!
//! Needs a daemon and the test images (`scripts/build-test-images.sh`).
//! `CONTROL_N` commands per path (default 500), `CONTROL_CONNECT_N`
//! connections (default 50). Under `cargo test` (no `--bench`) it runs a
//! tenth of the counts as a smoke test.

#[path = "../tests/double/mod.rs"]
mod double;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Runtime, RuntimeConfig};
use corral_core::backend::Backend;
use corral_core::{CommandSpec, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};
use corral_kube::control;
use double::{container_ip, DockerAsPodNetworkDouble, PORT};

const IMAGE: &str = "corral-test/busybox";

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corralbench={}", self.0),
            ])
            .output();
        if let Ok(out) = out {
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

fn env_n(name: &str, default: usize, scale: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default / scale)
        .max(3)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Prints a row and returns its p50.
fn row(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p50 = percentile(&samples, 0.5);
    println!(
        "{name:<46} n={:<5} p50={:>8.3} ms  p90={:>8.3} ms  p99={:>8.3} ms",
        samples.len(),
        ms(p50),
        ms(percentile(&samples, 0.9)),
        ms(percentile(&samples, 0.99)),
    );
    p50
}

async fn command_round_trips(rt: &Runtime, spec: &SandboxSpec, n: usize) -> Vec<Duration> {
    let sb = rt.create(spec).await.expect("create");
    let cmd = CommandSpec::argv(["true"]);
    for _ in 0..10 {
        sb.run(&cmd).await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = sb.run(&cmd).await;
        samples.push(t.elapsed());
        assert_eq!(r.exit_code, Some(0), "{r:?}");
    }
    sb.destroy().await.expect("destroy");
    samples
}

#[tokio::main]
async fn main() {
    let scale = if std::env::args().any(|a| a == "--bench") {
        1
    } else {
        10
    };
    let n = env_n("CONTROL_N", 500, scale);
    let connects = env_n("CONTROL_CONNECT_N", 50, scale);
    let tag = format!("control-{}", std::process::id());
    let _cleanup = Cleanup(tag.clone());
    let mut spec = SandboxSpec::new(IMAGE);
    spec.labels.insert("corralbench".into(), tag.clone());
    let config = || RuntimeConfig {
        shared_slots: false,
        reap_orphans: false,
        ..RuntimeConfig::default()
    };

    let attach_backend = Arc::new(
        DockerBackend::connect(&DockerConfig::default())
            .await
            .expect("these benches need a Docker daemon"),
    );
    let double = Arc::new(DockerAsPodNetworkDouble::new(
        DockerBackend::connect(&DockerConfig::default())
            .await
            .expect("daemon"),
    ));
    let attach_rt = Runtime::new(attach_backend.clone(), config());
    let tcp_rt = Runtime::new(double.clone(), config());

    println!("control path: daemon attach vs TCP + handshake (same host, same image)");
    let attach = row(
        "command round trip, daemon attach [floor]",
        command_round_trips(&attach_rt, &spec, n).await,
    );
    let tcp = row(
        "command round trip, TCP + secret handshake",
        command_round_trips(&tcp_rt, &spec, n).await,
    );

    // Opening the stream: a sandbox kept for it, connected to again and
    // again (each new controller takes over from the one before).
    let sb = tcp_rt.create(&spec).await.expect("create");
    let placement = sb.placement();
    let secret = double.secret_of(&placement).expect("secret");
    let ip = container_ip(placement.id()).expect("ip");
    let mut tcp_connects = Vec::with_capacity(connects);
    for _ in 0..connects {
        let t = Instant::now();
        let stream = control::connect_direct(ip, PORT, &secret, Duration::from_secs(5))
            .await
            .expect("connect");
        tcp_connects.push(t.elapsed());
        drop(stream);
    }
    let mut attach_connects = Vec::with_capacity(connects);
    for _ in 0..connects {
        let t = Instant::now();
        let stream = attach_backend
            .connect(&placement, sb.id())
            .await
            .expect("attach");
        attach_connects.push(t.elapsed());
        drop(stream);
    }
    sb.destroy().await.expect("destroy");
    let attach_open = row(
        "open the control stream, daemon attach [floor]",
        attach_connects,
    );
    let tcp_open = row("open the control stream, TCP + handshake", tcp_connects);

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "ratio: command round trip TCP / attach = {:.2}x; open TCP / attach = {:.2}x",
        ratio(tcp, attach),
        ratio(tcp_open, attach_open)
    );
}
