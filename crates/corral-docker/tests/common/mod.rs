//! Shared set-up for the real-daemon tests: a backend, the offline test
//! images, and a guard that removes a test's containers even when it fails.

#![allow(dead_code)]

use std::process::Command;
use std::sync::OnceLock;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corral::{Runtime, RuntimeConfig};
use corral_core::breaker::BreakerConfig;
use corral_core::{RetryPolicy, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};

pub const BUSYBOX: &str = "corral-test/busybox";
pub const SCRATCH: &str = "corral-test/scratch";

/// What a session does to poison the sandbox it leaves behind: a planted
/// file, and a `/bin/sh` that exits 0 whatever it is asked (so it also
/// passes any reset command).
pub const POISON: &str = "echo planted > /etc/planted && rm /bin/sh \
     && printf '#!/bin/busybox ash\\nexit 0\\n' > /bin/sh && chmod 755 /bin/sh";

/// Builds the offline test images once per test binary.
pub fn images() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/build-test-images.sh"
        );
        let status = Command::new("bash")
            .arg(script)
            .status()
            .expect("run build-test-images.sh");
        assert!(status.success(), "building the test images failed");
    });
}

/// The runtime over the local daemon, with the default settings.
pub async fn backend() -> Runtime {
    images();
    connect(&BackendConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README")
}

/// The Docker backend itself, for what only Docker has (the raw client,
/// the daemon report, the network).
pub async fn docker_backend() -> DockerBackend {
    images();
    DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README")
}

/// The settings a test changes: the Docker backend's and the runtime's, in
/// one struct.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub endpoint: Option<String>,
    pub retry: RetryPolicy,
    pub start_limit: usize,
    pub exec_limit: usize,
    pub shared_slots: bool,
    pub slot_dir: Option<PathBuf>,
    pub slot_wait_timeout: Duration,
    pub breaker: BreakerConfig,
    pub reap_orphans: bool,
    pub reap_interval: Duration,
    pub seal_key_file: Option<PathBuf>,
    pub pull_timeout: Duration,
    pub pull_limit: usize,
    pub registry_auth_file: Option<PathBuf>,
    pub share_deltas: bool,
}

impl Default for BackendConfig {
    fn default() -> Self {
        let r = RuntimeConfig::default();
        let d = DockerConfig::default();
        BackendConfig {
            endpoint: d.endpoint,
            retry: d.retry,
            start_limit: r.start_limit,
            exec_limit: r.exec_limit,
            shared_slots: r.shared_slots,
            slot_dir: r.slot_dir,
            slot_wait_timeout: r.slot_wait_timeout,
            breaker: r.breaker,
            reap_orphans: r.reap_orphans,
            reap_interval: r.reap_interval,
            seal_key_file: r.seal_key_file,
            pull_timeout: d.pull_timeout,
            pull_limit: d.pull_limit,
            registry_auth_file: d.registry_auth_file,
            share_deltas: d.share_deltas,
        }
    }
}

/// The runtime over a Docker backend made from `c`.
pub async fn connect(c: &BackendConfig) -> Result<Runtime, corral::Error> {
    let docker = DockerBackend::connect(&DockerConfig {
        endpoint: c.endpoint.clone(),
        retry: c.retry.clone(),
        pull_timeout: c.pull_timeout,
        pull_limit: c.pull_limit,
        registry_auth_file: c.registry_auth_file.clone(),
        egress_network: None,
        share_deltas: c.share_deltas,
    })
    .await?;
    Ok(Runtime::new(
        Arc::new(docker),
        RuntimeConfig {
            start_limit: c.start_limit,
            exec_limit: c.exec_limit,
            shared_slots: c.shared_slots,
            slot_dir: c.slot_dir.clone(),
            slot_wait_timeout: c.slot_wait_timeout,
            breaker: c.breaker.clone(),
            reap_orphans: c.reap_orphans,
            reap_interval: c.reap_interval,
            seal_key_file: c.seal_key_file.clone(),
            ..RuntimeConfig::default()
        },
    ))
}

/// Removes every container labelled `corraltest=<name>` when dropped, and
/// checks nothing is left when asked.
pub struct Guard {
    pub name: String,
}

impl Guard {
    pub fn new(name: &str) -> Self {
        Guard {
            name: name.to_string(),
        }
    }

    /// A hardened spec for `image` labelled for this guard.
    pub fn spec(&self, image: &str) -> SandboxSpec {
        let mut spec = SandboxSpec::new(image);
        spec.labels.insert("corraltest".into(), self.name.clone());
        spec
    }

    /// Ids of containers this test still has.
    pub fn remaining(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corraltest={}", self.name),
            ])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// Asserts the test left nothing behind.
    pub fn assert_clean(&self) {
        let left = self.remaining();
        assert!(
            left.is_empty(),
            "test {} leaked containers: {left:?}",
            self.name
        );
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let left = self.remaining();
        if !left.is_empty() {
            let _ = Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(&left)
                .output();
        }
    }
}

/// Runs `docker` with `args` under a 30 s hard limit (for commands that can
/// hang on a wedged daemon), returning stdout without surrounding blanks.
pub fn docker_within(args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30", "docker"])
        .args(args)
        .output()
        .expect("run docker");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `docker` with `args`, returning stdout.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Whether sandboxes of `isolation` can run on this daemon: always for
/// `container`; for `gvisor` when the daemon has the runtime, and
/// otherwise `false` after saying on stderr why `test` is skipped.
pub fn tier_available(isolation: corral::Isolation, test: &str) -> bool {
    use corral_core::spec::GVISOR_RUNTIME;
    use std::io::Write;
    if isolation == corral::Isolation::Container {
        return true;
    }
    let out = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .expect("docker info");
    let registered =
        String::from_utf8_lossy(&out.stdout).contains(&format!("\"{GVISOR_RUNTIME}\""));
    if !registered {
        // Straight to stderr: the harness captures eprintln!, and a skip
        // must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: the daemon has no runtime '{GVISOR_RUNTIME}' \
             (scripts/ensure-gvisor.sh registers it)"
        );
    }
    registered
}

/// The engine contract's target on the local daemon under one isolation
/// tier: the hardened default spec over the offline busybox image.
/// Leftovers are found and swept with the `docker` CLI, not through the
/// backend under test.
pub struct ContractTarget {
    pub runtime: Runtime,
    pub isolation: corral::Isolation,
}

impl corral_testing::contract::Target for ContractTarget {
    fn engine(&self) -> &'static str {
        match self.isolation {
            corral::Isolation::Container => "Docker",
            corral::Isolation::Gvisor => "Docker (gVisor)",
        }
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn base_spec(&self) -> SandboxSpec {
        let mut spec = SandboxSpec::new(BUSYBOX);
        spec.isolation = self.isolation;
        spec
    }

    fn leftovers<'a>(
        &'a self,
        label: &'a str,
    ) -> corral_testing::contract::BoxFuture<'a, Vec<String>> {
        Box::pin(async move {
            let filter = format!("label={}={label}", corral_testing::contract::TEST_LABEL);
            let out = tokio::process::Command::new("docker")
                .args(["ps", "-aq", "--no-trunc", "--filter", &filter])
                .output()
                .await
                .expect("docker ps");
            assert!(out.status.success(), "docker ps: {out:?}");
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from)
                .collect()
        })
    }

    fn sweep<'a>(&'a self, label: &'a str) -> corral_testing::contract::BoxFuture<'a, ()> {
        Box::pin(async move {
            let left = self.leftovers(label).await;
            if !left.is_empty() {
                let _ = tokio::process::Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&left)
                    .output()
                    .await;
            }
        })
    }
}
