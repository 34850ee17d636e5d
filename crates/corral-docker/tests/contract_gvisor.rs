//! The engine contract (`corral_testing::contract`) against the real
//! Docker daemon with every sandbox under `isolation: gvisor` (runtime
//! `runsc`, registered by `scripts/ensure-gvisor.sh`). A case that cannot
//! hold under gVisor is listed in [`CANNOT_HOLD`] with why; what a user
//! sees instead is asserted by the gVisor-only tests at the end. Without
//! the runtime every case prints that it was skipped and why. Cases run
//! in parallel (`--test-threads`): each has its own sandboxes and label.

mod common;

use std::io::Write;

use corral::{Isolation, Runtime, SandboxSpec};
use corral_core::spec::GVISOR_RUNTIME;
use corral_testing::contract::{BoxFuture, Target, TEST_LABEL};

/// Contract cases that cannot hold under gVisor, and why.
const CANNOT_HOLD: &[(&str, &str)] = &[];

struct Gvisor {
    runtime: Runtime,
}

impl Target for Gvisor {
    fn engine(&self) -> &'static str {
        "Docker (gVisor)"
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn base_spec(&self) -> SandboxSpec {
        let mut spec = SandboxSpec::new(common::BUSYBOX);
        spec.isolation = Isolation::Gvisor;
        spec
    }

    fn leftovers<'a>(&'a self, label: &'a str) -> BoxFuture<'a, Vec<String>> {
        Box::pin(async move {
            let filter = format!("label={TEST_LABEL}={label}");
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

    fn sweep<'a>(&'a self, label: &'a str) -> BoxFuture<'a, ()> {
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

/// Whether the daemon has the gVisor runtime; `false` after saying why
/// `test` is skipped.
fn gvisor_registered(test: &str) -> bool {
    let out = std::process::Command::new("docker")
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

async fn gvisor(case: &str) -> Option<Box<dyn Target>> {
    if let Some((_, why)) = CANNOT_HOLD.iter().find(|(name, _)| *name == case) {
        let _ = writeln!(std::io::stderr(), "not under gVisor: {case}: {why}");
        return None;
    }
    if !gvisor_registered(case) {
        return None;
    }
    Some(Box::new(Gvisor {
        runtime: common::backend().await,
    }))
}

corral_testing::contract_suite!(gvisor);
