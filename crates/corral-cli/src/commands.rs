//! One module per subcommand, plus what they share.

pub mod agent_image;
pub mod bench;
pub mod build;
pub mod config;
pub mod doctor;
pub mod egress;
pub mod events;
pub mod gc;
pub mod images;
pub mod loadgen;
pub mod mcp;
pub mod port;
pub mod ps;
pub mod pull;
pub mod run;
pub mod serve;
pub mod snapshots;
pub mod top;
pub mod workload;

use std::sync::{Arc, Mutex};

use anyhow::Context;
use corral::config::{BackendKind, Config};
use corral::{Backend, Runtime, RuntimeConfig};
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
    /// The backends connected with this configuration, closed before the
    /// process exits.
    pub opened: Opened,
}

impl From<&Config> for BackendConfig {
    fn from(config: &Config) -> Self {
        BackendConfig {
            kind: config.backend,
            docker: DockerConfig::from(config),
            kube: KubeConfig::from(config),
            runtime: RuntimeConfig::from(config),
            opened: Opened::default(),
        }
    }
}

/// Every backend a command connected, so that `main` can close them
/// (`Backend::close`: the Kubernetes backend gives up its Lease) once the
/// command is done, however it ended.
#[derive(Clone, Default)]
pub struct Opened(Arc<Mutex<Vec<Arc<dyn Backend>>>>);

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|v| v.len()).unwrap_or_default();
        write!(f, "Opened({n} backends)")
    }
}

impl Opened {
    /// Remembers `backend` for [`Opened::close_all`].
    pub fn push(&self, backend: Arc<dyn Backend>) {
        if let Ok(mut v) = self.0.lock() {
            v.push(backend);
        }
    }

    /// Closes every backend remembered, once.
    pub async fn close_all(&self) {
        let backends = match self.0.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => return,
        };
        for backend in backends {
            backend.close().await;
        }
    }
}

/// Connects to the configured engine or explains why not; the runtime
/// over it.
pub async fn connect(config: BackendConfig) -> anyhow::Result<Runtime> {
    match config.kind {
        BackendKind::Docker => Ok(connect_docker(config).await?.0),
        BackendKind::Kubernetes => {
            let kube: Arc<dyn Backend> = Arc::new(
                KubeBackend::connect(&config.kube)
                    .await
                    .context("cannot reach a Kubernetes cluster")?,
            );
            config.opened.push(kube.clone());
            Ok(Runtime::new(kube, config.runtime))
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
            let backend: Arc<dyn Backend> = Arc::new(docker.clone());
            config.opened.push(backend.clone());
            let runtime = Runtime::new(backend, config.runtime);
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

/// The one sandbox of the engine's `list` whose id (or container id)
/// starts with `wanted`, as `corral ps` shows them; otherwise the error
/// naming none or the several it matches.
pub fn find_sandbox(
    list: &[corral_core::backend::SandboxInfo],
    wanted: &str,
) -> Result<corral_core::backend::SandboxInfo, crate::diagnostics::CliError> {
    use crate::diagnostics::CliError;
    let wanted = wanted.trim();
    let matches: Vec<_> = list
        .iter()
        .filter(|s| {
            !wanted.is_empty()
                && (s.sandbox_id.starts_with(wanted) || s.placement.id().starts_with(wanted))
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(CliError::NoSandbox {
            wanted: wanted.to_string(),
        }),
        many => Err(CliError::AmbiguousSandbox {
            wanted: wanted.to_string(),
            ids: many.iter().map(|s| s.sandbox_id.clone()).collect(),
        }),
    }
}
