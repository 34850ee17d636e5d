//! corral's Kubernetes backend.
//!
//! [`KubeBackend`] implements [`corral_core::Backend`]: a sandbox is a pod
//! whose sandbox container runs corral's agent as PID 1, copied into the
//! pod by an init container from the `corral-agent:<version>` image and
//! mounted read-only at `/.corral`; corral reaches it over TCP on the pod
//! network, or through the API server's port-forward, after a handshake
//! proving it holds the sandbox's secret (`control`). Everything above the
//! engine (commands, recovery, pools, shells, files) is the runtime's, in
//! the `corral` crate; this crate knows Kubernetes and nothing above it.

mod backend;
pub mod control;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod lease;
pub mod pod;
mod rate;
pub mod session;
pub mod state;
mod watch;

pub use backend::{default_agent_image, KubeBackend, KubeConfig};
pub use rate::RateLimiter;
