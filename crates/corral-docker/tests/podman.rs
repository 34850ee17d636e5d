//! The same backend against Podman's Docker-compatible socket: hardened
//! sandboxes, typed timeouts and OOM kills, out-of-band removal under both
//! recovery policies, and teardown that leaves nothing.
//!
//! Runs when `CORRAL_TEST_PODMAN` names the socket (`unix:///path`), as
//! `scripts/test.sh` does after starting `scripts/podman-service.sh`; says
//! it was skipped otherwise.

mod common;

use std::process::Command;
use std::time::Duration;

use common::BackendConfig;
use corral_core::{CommandSpec, FailureKind, Network, Recovery, SandboxSpec};

const LABEL: &str = "corraltest=podman";

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(30))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `podman` against the test service's socket.
fn podman(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("podman")
        .arg("--url")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("run podman");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes what the test left in Podman, even when it fails.
struct Guard(String);

impl Guard {
    fn remaining(&self) -> Vec<String> {
        podman(
            &self.0,
            &["ps", "-aq", "--filter", &format!("label={LABEL}")],
        )
        .split_whitespace()
        .map(String::from)
        .collect()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let left = self.remaining();
        if !left.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(left.iter().map(String::as_str));
            podman(&self.0, &args);
        }
    }
}

fn spec(recovery: Recovery) -> SandboxSpec {
    let mut spec = SandboxSpec::new(common::BUSYBOX);
    spec.labels.insert("corraltest".into(), "podman".into());
    spec.network = Network::None;
    spec.limits.memory = Some(64 << 20);
    spec.recovery = recovery;
    spec
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_socket_runs_hardened_sandboxes_and_survives_removal() {
    let Ok(endpoint) = std::env::var("CORRAL_TEST_PODMAN") else {
        eprintln!("skipped: CORRAL_TEST_PODMAN is not set (scripts/test.sh sets it)");
        return;
    };
    let g = Guard(endpoint.clone());
    let b = common::connect(&BackendConfig {
        endpoint: Some(endpoint.clone()),
        shared_slots: false,
        reap_orphans: false,
        ..BackendConfig::default()
    })
    .await
    .expect("connect to Podman's socket");

    let sb = b.create(&spec(Recovery::Fail)).await.expect("create");
    let r = sb
        .run(&sh(
            "echo hi; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
        ))
        .await;
    assert_eq!((r.exit_code, r.failure.as_ref()), (Some(0), None), "{r:?}");
    let out = text(&r.stdout);
    assert!(out.starts_with("hi\n"), "{out}");
    assert!(out.contains("CapEff:\t000000000000000b"), "caps: {out}");
    assert!(out.contains("NoNewPrivs:\t1"), "no-new-privileges: {out}");
    assert!(out.trim_end().ends_with("256"), "pids limit: {out}");

    // A timed-out command loses its whole tree.
    let r = sb
        .run(&CommandSpec::shell("sleep 100 & sleep 100").timeout(Duration::from_millis(500)))
        .await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::Timeout));
    let r = sb.run(&sh("ps -o comm | grep -c '^sleep$' || true")).await;
    assert_eq!(text(&r.stdout).trim(), "0", "the timed-out tree was killed");

    // An OOM kill is typed and the sandbox lives on.
    let r = sb
        .run(&sh("dd if=/dev/zero of=/dev/null bs=200M count=1"))
        .await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::OomKilled));
    let r = sb.run(&sh("echo alive")).await;
    assert_eq!(text(&r.stdout), "alive\n");

    // Removed out-of-band under `fail`: typed, and it stays dead.
    podman(&endpoint, &["rm", "-f", &sb.container_id()]);
    let r = sb.run(&sh("echo after")).await;
    assert_eq!(
        r.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::ContainerLost),
        "{r:?}"
    );
    sb.destroy().await.expect("destroy a lost sandbox");

    // Removed out-of-band under `recreate`: the next command just works.
    let sb = b.create(&spec(Recovery::Recreate)).await.expect("create");
    let old = sb.container_id();
    podman(&endpoint, &["rm", "-f", &old]);
    let r = sb.run(&sh("echo recreated")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "recreated\n");
    assert_ne!(sb.container_id(), old);
    assert_eq!(b.metrics().recreated, 1);
    sb.destroy().await.expect("destroy");

    // Podman drops the option that keeps sandboxes apart: a sandbox with
    // network is refused clearly, and no half-made network is left.
    let mut bridged = spec(Recovery::Fail);
    bridged.network = Network::Bridge;
    match b.create(&bridged).await {
        Err(e @ corral::Error::Network { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("use network none"), "{msg}");
            assert_eq!(e.failure().kind, FailureKind::Unsupported);
        }
        Err(e) => panic!("expected a network error, got {e}"),
        Ok(sb) => {
            sb.destroy().await.ok();
            panic!("a sandbox with network started on Podman without isolation");
        }
    }
    assert_eq!(
        podman(
            &endpoint,
            &["network", "ls", "-q", "--filter", "name=^corral$"]
        )
        .trim(),
        "",
        "no unisolated network left behind"
    );

    assert_eq!(
        g.remaining(),
        Vec::<String>::new(),
        "containers left behind"
    );
}
