//! `cargo bench -p corral-docker --bench roundtrip`: the cost of one trivial
//! command through corral's agent against a raw `docker exec` through the
//! Engine API, and of a sandbox start against a raw create+start, all
//! measured in the same run. Reports p50/p90/p99 and the ratios.
//!
//! Needs a daemon and the test images (`scripts/build-test-images.sh`).
//! Environment: `ROUNDTRIP_N` (agent commands, default 500),
//! `ROUNDTRIP_EXEC_N` (raw execs, default 100), `ROUNDTRIP_START_N` (default 10).
//! Under `cargo test` it runs as a smoke test with a twentieth of the counts.

use std::process::Command;
use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use corral::{Runtime, RuntimeConfig};
use corral_core::{CommandSpec, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};
use futures_util::StreamExt;

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

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Stats {
    p50: Duration,
    p90: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
    }
}

fn row(name: &str, n: usize, s: &Stats) {
    println!(
        "{name:<44} n={n:<5} p50={:>9.3} ms  p90={:>9.3} ms  p99={:>9.3} ms",
        s.p50.as_secs_f64() * 1e3,
        s.p90.as_secs_f64() * 1e3,
        s.p99.as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() {
    let tag = std::process::id().to_string();
    let _cleanup = Cleanup(tag.clone());
    let docker_backend = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("daemon");
    let docker = docker_backend.docker().clone();
    let backend = Runtime::new(
        std::sync::Arc::new(docker_backend),
        RuntimeConfig::default(),
    );
    let mut spec = SandboxSpec::new(IMAGE);
    spec.labels.insert("corralbench".into(), tag.clone());
    spec.network = corral_core::Network::None;

    // Warm up: the agent volume, the image, the page cache.
    let sb = backend.create(&spec).await.expect("create sandbox");
    let trivial = CommandSpec::argv(["true"]);
    for _ in 0..20 {
        sb.run(&trivial).await;
    }

    // Raw docker exec of `true`: create, start attached, drain, inspect.
    let exec_n = env_n("ROUNDTRIP_EXEC_N", 100);
    let mut raw_exec = Vec::with_capacity(exec_n);
    for _ in 0..exec_n {
        let t = Instant::now();
        let exec = docker
            .create_exec(
                &sb.container_id(),
                CreateExecOptions::<String> {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec!["true".into()]),
                    ..Default::default()
                },
            )
            .await
            .expect("create exec");
        if let StartExecResults::Attached { mut output, .. } =
            docker.start_exec(&exec.id, None).await.expect("start exec")
        {
            while let Some(item) = output.next().await {
                item.expect("exec output");
            }
        }
        let info = docker.inspect_exec(&exec.id).await.expect("inspect exec");
        assert_eq!(info.exit_code, Some(0));
        raw_exec.push(t.elapsed());
    }

    // The same command through the agent.
    let n = env_n("ROUNDTRIP_N", 500);
    let mut agent = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = sb.run(&trivial).await;
        agent.push(t.elapsed());
        assert!(r.success(), "{r:?}");
    }
    let shell = CommandSpec::shell("true");
    let mut agent_sh = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = sb.run(&shell).await;
        agent_sh.push(t.elapsed());
        assert!(r.success(), "{r:?}");
    }
    sb.destroy().await.expect("destroy");

    // Raw create+start against a corral sandbox start (agent attached).
    let start_n = env_n("ROUNDTRIP_START_N", 10);
    let mut raw_start = Vec::with_capacity(start_n);
    for i in 0..start_n {
        let name = format!("corral-bench-{tag}-{i}");
        let t = Instant::now();
        let body = ContainerCreateBody {
            image: Some(IMAGE.into()),
            cmd: Some(vec!["sleep".into(), "60".into()]),
            labels: Some(
                [
                    ("corral.sandbox".to_string(), name.clone()),
                    ("corralbench".to_string(), tag.clone()),
                ]
                .into_iter()
                // Owner labels, so a concurrent reaper leaves it alone.
                .chain(backend.owner().labels())
                .collect(),
            ),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .expect("create");
        docker.start_container(&c.id, None).await.expect("start");
        raw_start.push(t.elapsed());
        docker
            .remove_container(
                &c.id,
                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
            )
            .await
            .expect("remove");
    }
    let mut corral_start = Vec::with_capacity(start_n);
    for _ in 0..start_n {
        let t = Instant::now();
        let sb = backend.create(&spec).await.expect("create sandbox");
        corral_start.push(t.elapsed());
        sb.destroy().await.expect("destroy");
    }

    let (raw_exec, agent, agent_sh) = (stats(raw_exec), stats(agent), stats(agent_sh));
    let (raw_start, corral_start) = (stats(raw_start), stats(corral_start));
    println!("corral round trip benchmark ({IMAGE}, network none)");
    row(
        "raw docker exec `true` (API create/start/inspect)",
        exec_n,
        &raw_exec,
    );
    row("agent: `true` (argv)", n, &agent);
    row("agent: `/bin/sh -c true`", n, &agent_sh);
    row("raw container create+start", start_n, &raw_start);
    row(
        "corral sandbox create (hardened, agent ready)",
        start_n,
        &corral_start,
    );
    println!(
        "ratio raw exec / agent (p50): {:.1}x   raw exec / agent sh (p50): {:.1}x   corral start / raw start (p50): {:.2}x",
        raw_exec.p50.as_secs_f64() / agent.p50.as_secs_f64(),
        raw_exec.p50.as_secs_f64() / agent_sh.p50.as_secs_f64(),
        corral_start.p50.as_secs_f64() / raw_start.p50.as_secs_f64()
    );
}
