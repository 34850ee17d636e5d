//! corral's Docker Engine API backend (also Podman's compatible socket).
//!
//! [`DockerBackend`] implements [`corral_core::Backend`]: a sandbox is a
//! hardened container whose PID 1 is corral's agent, reached through the
//! daemon's attach to PID 1's stdin and stdout. Everything above the
//! engine (commands, recovery, pools, shells, files) is the runtime's, in
//! the `corral` crate; this crate knows Docker and nothing above it.

pub mod agent_volume;
mod backend;
mod checkpoint;
pub mod connect;
pub mod container_config;
pub mod doctor;
pub mod egress;
pub mod error;
mod events;
pub mod gc;
pub mod network;
mod ports;
mod pull;
mod registry_auth;
mod retry;
pub mod snapshot;
pub mod state;
mod template;
mod usage;

pub use backend::{DockerBackend, DockerConfig};
pub use corral_core::backend::{ImageInfo, PullProgress, PullStatus};
