//! One module per subcommand, plus what they share.

pub mod bench;
pub mod config;
pub mod doctor;
pub mod gc;
pub mod mcp;
pub mod ps;
pub mod run;
pub mod serve;
pub mod snapshots;
pub mod workload;

use std::sync::Arc;

use anyhow::Context;
use corral::config::{BackendKind, Config};
use corral::{Runtime, RuntimeConfig};
use corral_docker::{DockerBackend, DockerConfig};
use corral_kube::{KubeBackend, KubeConfig};

/// The engine settings of the config file: which backend, how to reach
/// it, and the runtime's limits over it.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Which engine (`backend:`).
    pub kind: BackendKind,
    /// How to reach the Docker daemon.
    pub docker: DockerConfig,
    /// How to reach the Kubernetes cluster.
    pub kube: KubeConfig,
    /// Limits, the breaker, orphan reaping, the seal key.
    pub runtime: RuntimeConfig,
}

impl From<&Config> for BackendConfig {
    fn from(config: &Config) -> Self {
        BackendConfig {
            kind: config.backend,
            docker: DockerConfig::from(config),
            kube: KubeConfig::from(config),
            runtime: RuntimeConfig::from(config),
        }
    }
}

/// Connects to the configured engine or explains why not; the runtime
/// over it.
pub async fn connect(config: BackendConfig) -> anyhow::Result<Runtime> {
    match config.kind {
        BackendKind::Docker => Ok(connect_docker(config).await?.0),
        BackendKind::Kubernetes => {
            let kube = KubeBackend::connect(&config.kube)
                .await
                .context("cannot reach a Kubernetes cluster")?;
            Ok(Runtime::new(Arc::new(kube), config.runtime))
        }
    }
}

/// Like [`connect`], also handing back the Docker backend itself, for
/// what only Docker has (`doctor`'s daemon report, bench's raw floors).
pub async fn connect_docker(config: BackendConfig) -> anyhow::Result<(Runtime, DockerBackend)> {
    match config.kind {
        BackendKind::Docker => {
            let docker = DockerBackend::connect(&config.docker)
                .await
                .context("cannot reach a container daemon")?;
            let runtime = Runtime::new(Arc::new(docker.clone()), config.runtime);
            Ok((runtime, docker))
        }
        BackendKind::Kubernetes => anyhow::bail!(
            "this command needs the Docker backend (backend: docker); it does not run on \
             Kubernetes yet"
        ),
    }
}

/// The image used when `--image` is not given.
pub fn default_image() -> String {
    std::env::var("CORRAL_IMAGE").unwrap_or_else(|_| "corral-test/busybox".to_string())
}
