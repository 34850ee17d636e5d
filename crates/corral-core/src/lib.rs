//! corral's core: the types and policies every other crate shares.
//!
//! Nothing in this crate does IO. Backends (`corral-docker`), the in-container
//! agent (`corral-agent`) and front ends (`corral-cli`) all speak in these
//! types, so a rule such as "what a hardened sandbox looks like" or "which
//! failures are retryable" lives in exactly one place.

pub mod agent_auth;
pub mod backend;
pub mod breaker;
pub mod client_policy;
pub mod command;
pub mod config;
pub mod egress;
pub mod error;
pub mod file_error;
pub mod image_pull;
pub mod image_ref;
pub mod labels;
pub mod outcome;
pub mod output;
pub mod paths;
pub mod policy;
pub mod pool;
pub mod principal;
pub mod protocol;
pub mod server_limits;
pub mod snapshot;
pub mod spec;
pub mod template;
pub mod units;

pub use backend::{Backend, Placement};
pub use command::CommandSpec;
pub use error::Error;
pub use outcome::{
    CommandResult, CommandUsage, ContainerState, ContainerStatus, Failure, FailureKind,
};
pub use policy::{Recovery, RetryPolicy};
pub use protocol::PtySize;
pub use spec::{
    EnvVar, Isolation, Limits, Mount, Network, SandboxSpec, Security, SpecError, Tmpfs,
};
