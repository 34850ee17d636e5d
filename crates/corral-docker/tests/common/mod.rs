//! Shared set-up for the real-daemon tests: a backend, the offline test
//! images, and a guard that removes a test's containers even when it fails.

#![allow(dead_code)]

use std::process::Command;
use std::sync::OnceLock;

use corral_core::SandboxSpec;
use corral_docker::{BackendConfig, DockerBackend};

pub const BUSYBOX: &str = "corral-test/busybox";
pub const SCRATCH: &str = "corral-test/scratch";

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

pub async fn backend() -> DockerBackend {
    images();
    DockerBackend::connect(&BackendConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README")
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
