//! Shared set-up for the real-daemon tests of the fault proxy: unique socket
//! paths, a bollard client pointed at a proxy, the offline test image, and a
//! guard that removes a test's containers even when the test fails.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use bollard::{Docker, API_DEFAULT_VERSION};
use corral_faultproxy::{FaultProxy, DEFAULT_UPSTREAM};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const IMAGE: &str = "corral-test/busybox";
pub const LABEL: &str = "corral.sandbox";

/// A name no other test, run or process uses.
pub fn unique(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "fp-{what}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh socket path under the temp dir (kept short: Unix socket paths
/// are limited to ~108 bytes).
pub fn socket_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.sock", unique(what)))
}

/// A proxy in front of the real daemon.
pub fn proxy(what: &str) -> Result<FaultProxy, BoxError> {
    Ok(FaultProxy::start(socket_path(what), DEFAULT_UPSTREAM)?)
}

/// A bollard client that talks through the socket at `path`.
pub fn docker_via(path: &Path) -> Result<Docker, BoxError> {
    let path = path.to_str().ok_or("socket path is not UTF-8")?;
    Ok(Docker::connect_with_unix(path, 120, API_DEFAULT_VERSION)?)
}

/// Builds the offline test image once per test binary, if missing.
pub fn ensure_image() -> Result<(), BoxError> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let present = Command::new("docker")
                .args(["image", "inspect", IMAGE])
                .output()
                .map(|out| out.status.success())
                .unwrap_or(false);
            if present {
                return Ok(());
            }
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../scripts/build-test-images.sh"
            );
            match Command::new("bash").arg(script).status() {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(format!("build-test-images.sh failed: {status}")),
                Err(e) => Err(format!("cannot run build-test-images.sh: {e}")),
            }
        })
        .clone()
        .map_err(Into::into)
}

/// Owns the containers of one test, by a unique `corral.sandbox` label
/// value: dropping it force-removes every container carrying that label,
/// including one whose create answer a test never saw.
pub struct Sandbox {
    pub label: String,
}

impl Sandbox {
    pub fn new(what: &str) -> Result<Sandbox, BoxError> {
        ensure_image()?;
        Ok(Sandbox {
            label: unique(what),
        })
    }

    /// Creates (does not start) a labelled busybox container running `cmd`.
    pub async fn create(&self, docker: &Docker, cmd: &[&str]) -> Result<String, BoxError> {
        let body = ContainerCreateBody {
            image: Some(IMAGE.to_owned()),
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            labels: Some(self.labels()),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&unique("c"))
            .build();
        Ok(docker.create_container(Some(options), body).await?.id)
    }

    /// `corral.sandbox` plus the owner labels of this test process: corral's
    /// orphan collection (which other crates' tests run on this same
    /// daemon) removes a `corral.sandbox` container without a live owner,
    /// and would pull containers out from under these tests. Names and
    /// formats follow corral-core's `labels` module.
    fn labels(&self) -> HashMap<String, String> {
        let pid = std::process::id();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        // Field 22 of /proc/self/stat, counted after the ")" ending field 2.
        let start = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|stat| {
                let rest = &stat[stat.rfind(')')? + 1..];
                rest.split_whitespace().nth(19).map(str::to_owned)
            })
            .unwrap_or_default();
        HashMap::from([
            (LABEL.to_owned(), self.label.clone()),
            ("corral.owner.host".to_owned(), host),
            ("corral.owner.pid".to_owned(), pid.to_string()),
            ("corral.owner.start".to_owned(), start),
        ])
    }

    /// Ids of this test's containers still present.
    pub fn remaining(&self) -> Vec<String> {
        Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label={LABEL}={}", self.label),
            ])
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let ids = self.remaining();
        if !ids.is_empty() {
            // Blocking in drop is fine in a test; leaking is not.
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
    }
}
