//! corral: run untrusted commands in hardened sandboxes, fast.
//!
//! This is the runtime and the façade users depend on. It re-exports
//! [`corral_core`] (specs, outcomes, the wire protocol, the [`Backend`]
//! trait) and holds everything that is the same whatever engine runs the
//! sandboxes: [`Runtime`] (starts under slot limits and the breaker,
//! orphans), [`Sandbox`] (the agent's control stream, commands, recovery),
//! [`Provider`] (session keys, warm pools, eviction), shells and files.
//! Engines implement [`Backend`]: `corral-docker` for Docker and Podman.
//!
//! ```ignore
//! // needs corral-docker beside corral, and a daemon
//! use std::sync::Arc;
//! use corral::{CommandSpec, Runtime, RuntimeConfig, SandboxSpec};
//! use corral_docker::{DockerBackend, DockerConfig};
//!
//! let docker = DockerBackend::connect(&DockerConfig::default()).await?;
//! let runtime = Runtime::new(Arc::new(docker), RuntimeConfig::default());
//! let sandbox = runtime.create(&SandboxSpec::new("python:3.12-slim")).await?;
//! let result = sandbox.run(&CommandSpec::shell("echo hi")).await;
//! assert_eq!(result.stdout, b"hi\n");
//! sandbox.destroy().await?;
//! ```

/// The in-sandbox agent every backend puts into its sandboxes, as the
/// bytes of its static binary (embedded once, `corral-agent-bin`): for
/// what packages it (`corral agent-image`'s image for the Kubernetes
/// backend's init container) without naming a backend.
pub mod agent {
    pub use corral_agent_bin::{hash, BINARY};
}
mod code;
mod conn;
mod delta;
pub mod doctor;
pub mod events;
mod files;
pub mod host;
pub mod limits;
pub mod metrics;
mod provider;
mod reset;
mod runtime;
mod sandbox;
pub mod seal;
mod shell;
mod snapshots;
mod templates;
mod usage;
pub mod workspace;

pub use corral_core::*;

pub use code::{CodeContext, CodeEvent, CodeOutcome, RunCode, DEFAULT_CONTEXT};
pub use delta::Delta;
pub use files::{DirEntry, EntryKind, FileError, FileOptions};
pub use provider::{Held, Lease, Provider, ProviderStats};
pub use reset::{ResetMode, ResetOutcome};
pub use runtime::{GcReport, GcStep, PhaseWatch, Runtime, RuntimeConfig, StartTimings};
pub use sandbox::{ExecEvent, Execution, OutputStream, Recovered, Sandbox, StdinWriter};
pub use shell::{SessionResult, ShellOptions, ShellSession};
pub use snapshots::SnapshotOptions;
pub use templates::{BuildEvent, BuildRequest, BuildSummary, TemplateInfo};
