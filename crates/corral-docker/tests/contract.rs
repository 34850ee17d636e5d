//! The engine contract (`corral_testing::contract`) against the real
//! Docker daemon: the same cases the Kubernetes backend runs, over the
//! hardened default spec and the offline busybox image. Leftovers are
//! found and swept with the `docker` CLI, not through the backend under
//! test.

mod common;

use corral::{Runtime, SandboxSpec};
use corral_testing::contract::{BoxFuture, Target, TEST_LABEL};

struct Docker {
    runtime: Runtime,
}

impl Target for Docker {
    fn engine(&self) -> &'static str {
        "Docker"
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn base_spec(&self) -> SandboxSpec {
        SandboxSpec::new(common::BUSYBOX)
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

async fn docker(_case: &str) -> Option<Box<dyn Target>> {
    Some(Box::new(Docker {
        runtime: common::backend().await,
    }))
}

corral_testing::contract_suite!(docker);
