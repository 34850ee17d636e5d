//! corral's Docker Engine API backend (also Podman's compatible socket).
//!
//! [`DockerBackend::create`] turns a [`corral_core::SandboxSpec`] into a
//! hardened container whose PID 1 is corral's agent, and returns a
//! [`Sandbox`] whose commands travel over one attached control stream.
//! [`gc`] and [`doctor`] look after containers and the daemon.

pub mod agent_volume;
mod backend;
mod conn;
pub mod connect;
pub mod container_config;
pub mod doctor;
pub mod error;
mod events;
mod files;
mod from_config;
pub mod gc;
pub mod host;
pub mod limits;
pub mod metrics;
pub mod network;
mod provider;
mod retry;
mod sandbox;
pub mod seal;
mod shell;
pub mod state;
pub mod workspace;

pub use backend::{BackendConfig, DockerBackend, StartTimings};
pub use error::DockerError;
pub use files::{DirEntry, EntryKind, FileError, FileOptions};
pub use provider::{Lease, Provider, ProviderStats};
pub use sandbox::{ExecEvent, Execution, OutputStream, Sandbox, StdinWriter};
pub use shell::{SessionResult, ShellOptions, ShellSession};
