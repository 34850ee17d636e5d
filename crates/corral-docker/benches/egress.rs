//! `cargo bench -p corral-docker --bench egress`: what the egress path costs.
//! The same transfers from a sandbox with an egress policy (resolver and
//! relay in its gateway) and from a plain container of the same image on
//! the servers' own network (a direct connection, no policy), same run:
//! connection setup (a fresh connection and one small GET, HTTP and HTTPS,
//! timed by curl inside) and throughput (32 MiB over HTTP). Reports p50 and
//! p90 of the setup, the best of the transfers, and egress/direct ratios.
//!
//! Needs a daemon; builds `corral-test/net` when missing (minutes).
//! Environment: `EGRESS_BENCH_N` (connections per kind, default 100,
//! 10 under `cargo test`).

use corral_testing::internet;

use std::process::Command;
use std::sync::Arc;

use corral::{Runtime, RuntimeConfig};
use corral_core::egress::EgressPolicy;
use corral_core::{CommandSpec, Network, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};

fn script(n: usize, url: &str) -> String {
    format!(
        "for i in $(seq {n}); do curl -s -o /dev/null -w '%{{time_total}}\\n' {url} || echo fail; done"
    )
}

fn big() -> String {
    "for i in 1 2 3; do curl -s -o /dev/null -w '%{speed_download}\\n' http://pypi.test/big || echo fail; done"
        .to_string()
}

fn numbers(out: &str, what: &str) -> Vec<f64> {
    let v: Vec<f64> = out
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{what}: not a number: {l:?} in {out}"))
        })
        .collect();
    assert!(!v.is_empty(), "{what}: no measurements: {out}");
    v
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

#[tokio::main]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("EGRESS_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 100 } else { 10 });
    let net = internet::internet();

    // Without a policy: a plain container beside the servers.
    let direct = format!("{}-direct", net.tag);
    internet::docker(&[
        "run",
        "-d",
        "--name",
        &direct,
        "--label",
        "corral.egtest=1",
        "--network",
        &net.network,
        &net.image,
        "sleep",
        "infinity",
    ]);
    let in_direct = |s: &str| {
        let out = Command::new("docker")
            .args(["exec", &direct, "sh", "-c", s])
            .output()
            .expect("docker exec");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // With a policy: a sandbox whose one way out is its gateway.
    let backend = Arc::new(
        DockerBackend::connect(&DockerConfig {
            egress_network: Some(net.network.clone()),
            ..DockerConfig::default()
        })
        .await
        .expect("daemon"),
    );
    let runtime = Runtime::new(backend, RuntimeConfig::default());
    let mut spec = SandboxSpec::new(&net.image);
    spec.labels.insert("corralbench".into(), "egress".into());
    spec.network = Network::Egress(EgressPolicy {
        allow: vec!["pypi.test".into()],
        deny: vec![],
    });
    let sb = runtime.create(&spec).await.expect("create the sandbox");
    if let Ok(mut s) = internet::SANDBOXES.lock() {
        s.push(sb.id().to_string());
    }
    let in_sandbox = |s: String| {
        let sb = &sb;
        async move {
            let r = sb
                .run(&CommandSpec::shell(s).timeout(std::time::Duration::from_secs(600)))
                .await;
            String::from_utf8_lossy(&r.stdout).into_owned()
        }
    };

    // Warm both paths (page cache, the resolvers, the server's first thread).
    in_direct(&script(3, "http://pypi.test/"));
    in_sandbox(script(3, "http://pypi.test/")).await;

    println!("egress path vs a direct connection (n={n} connections per kind)");
    println!(
        "{:<28} {:>12} {:>12} {:>8}",
        "", "direct", "egress", "ratio"
    );
    for (label, url) in [
        ("http setup+GET p50 (ms)", "http://pypi.test/"),
        ("https setup+GET p50 (ms)", "https://pypi.test/"),
    ] {
        let d = numbers(&in_direct(&script(n, url)), "direct");
        let e = numbers(&in_sandbox(script(n, url)).await, "egress");
        for (name, p) in [(label, 0.5), (&*label.replace("p50", "p90"), 0.9)] {
            let (dp, ep) = (pct(&d, p) * 1e3, pct(&e, p) * 1e3);
            println!("{name:<28} {dp:>12.2} {ep:>12.2} {:>7.2}x", ep / dp);
        }
    }
    let d = max(&numbers(&in_direct(&big()), "direct"));
    let e = max(&numbers(&in_sandbox(big()).await, "egress"));
    println!(
        "{:<28} {:>12.1} {:>12.1} {:>7.2}x",
        "32 MiB over http (MB/s)",
        d / 1e6,
        e / 1e6,
        e / d
    );

    sb.destroy().await.expect("remove the sandbox");
    let _ = Command::new("docker").args(["rm", "-f", &direct]).output();
}
