//! One module per subcommand, plus what they share.

pub mod bench;
pub mod config;
pub mod doctor;
pub mod gc;
pub mod mcp;
pub mod ps;
pub mod run;
pub mod serve;
pub mod workload;

use anyhow::Context;
use corral_docker::{BackendConfig, DockerBackend};

/// Connects to the daemon or explains why not.
pub async fn connect(config: BackendConfig) -> anyhow::Result<DockerBackend> {
    DockerBackend::connect(&config)
        .await
        .context("cannot reach a container daemon")
}

/// The image used when `--image` is not given.
pub fn default_image() -> String {
    std::env::var("CORRAL_IMAGE").unwrap_or_else(|_| "corral-test/busybox".to_string())
}
