//! What every local-backend test shares: a runtime over a fresh
//! [`LocalProcessBackend`] and a guard that kills every child it started,
//! even when the test fails (the guard runs on unwind).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use corral::{Runtime, RuntimeConfig, SandboxSpec};
use corral_testing::{LocalConfig, LocalProcessBackend};

/// A runtime over a local backend; dropping it kills every child.
pub struct Harness {
    pub backend: LocalProcessBackend,
    pub runtime: Runtime,
    _seal_dir: TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.backend.kill_all();
    }
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn harness() -> Harness {
    let backend = LocalProcessBackend::new(LocalConfig::default());
    let seal_dir = std::env::temp_dir().join(format!(
        "corral-local-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&seal_dir).expect("seal dir");
    let config = RuntimeConfig {
        // Tests must not share slots with other corral processes, nor reap
        // sandboxes of other runtimes.
        shared_slots: false,
        reap_orphans: false,
        seal_key_file: Some(seal_dir.join("seal.key")),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(Arc::new(backend.clone()), config);
    Harness {
        backend,
        runtime,
        _seal_dir: TempDir(seal_dir),
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 32)
}

/// A spec for local sandboxes: short dead-man grace so a leaked agent
/// stops itself quickly.
pub fn spec() -> SandboxSpec {
    let mut s = SandboxSpec::new("local-process");
    s.agent_grace_ms = 3_000;
    s
}

/// Fails the test if `f` takes longer than `limit`.
pub async fn within<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .expect("took too long for a local-backend test")
}
