//! The one error type of corral's runtime and its backends, each variant
//! mapped onto a typed [`Failure`] through [`Error::kind`].

use std::time::Duration;

use crate::{ContainerState, Failure, FailureKind, SpecError};

/// An engine client's own error (bollard's, kube's), kept as the source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong starting, running or looking after sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No engine answered at any endpoint tried.
    #[error("no {engine} daemon answered: {detail}")]
    EngineUnavailable {
        /// The engine ("Docker").
        engine: &'static str,
        /// Endpoints tried and what each said.
        detail: String,
    },
    /// A call failed because the engine could not be reached mid-operation.
    #[error("daemon unavailable during {op}: {source}")]
    EngineLost {
        /// The operation, with the ids involved.
        op: String,
        /// The client's error.
        source: BoxError,
    },
    /// Any other answer of the engine, classified by the backend's table.
    #[error("{op}: {source}")]
    Engine {
        /// The operation, with the ids involved.
        op: String,
        /// What the answer means for the caller.
        kind: FailureKind,
        /// The client's error.
        source: BoxError,
    },
    /// The image is missing and no registry could supply it.
    #[error("image '{image}' is not present and no registry could supply it: {reason}")]
    ImageNotFound {
        /// The image reference.
        image: String,
        /// What the pull attempt said.
        reason: String,
    },
    /// The spec was rejected.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// The engine cannot do what the spec asks.
    #[error("unsupported by this engine: {what}")]
    Unsupported {
        /// What is unsupported, and why.
        what: String,
    },
    /// corral's sandbox network cannot be made or is not fit for use
    /// (made by someone else, or inter-container traffic allowed).
    #[error("network '{network}': {reason}")]
    Network {
        /// The network's name.
        network: String,
        /// What is wrong, naming the option and its value.
        reason: String,
    },
    /// The engine has no room for the sandbox now (a pod no node can take):
    /// retryable, with the engine's own explanation.
    #[error("no room for sandbox {sandbox}: {message}")]
    Capacity {
        /// Sandbox id.
        sandbox: String,
        /// What the engine said (the scheduler's message).
        message: String,
    },
    /// The sandbox's container is gone or stopped.
    #[error("sandbox {sandbox} lost its container: {state}")]
    ContainerLost {
        /// Sandbox id.
        sandbox: String,
        /// The container's last known state.
        state: Box<ContainerState>,
    },
    /// The agent did not answer or broke the protocol.
    #[error("agent in sandbox {sandbox}: {message}")]
    Agent {
        /// Sandbox id.
        sandbox: String,
        /// What went wrong.
        message: String,
    },
    /// A start-up command of the spec failed.
    #[error("sandbox {sandbox}: start-up command {index} failed: {detail}")]
    Startup {
        /// Sandbox id.
        sandbox: String,
        /// Which of `spec.startup`.
        index: usize,
        /// What happened.
        detail: String,
    },
    /// No start or exec slot came free within the wait limit.
    #[error("no {what} slot came free within {waited:?} ({limit} in use across corral processes)")]
    SlotTimeout {
        /// Which limit ("start" or "exec").
        what: &'static str,
        /// The limit.
        limit: usize,
        /// How long the caller waited.
        waited: Duration,
    },
    /// Every live sandbox of the provider stayed in use for the whole wait.
    #[error("no room for another sandbox within {waited:?}: all {max_live} live sandboxes (provider.max_live) are in use")]
    NoRoom {
        /// The provider's `max_live`.
        max_live: usize,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The provider was shut down; it hands out nothing more.
    #[error("session {key}: the provider is shut down")]
    ShutDown {
        /// The session key asked for.
        key: String,
    },
    /// A sandbox's changes are more than a snapshot may hold
    /// (`snapshots.max_bytes`): the snapshot is not taken.
    #[error("sandbox {sandbox}: its changes exceed the snapshot limit of {cap} bytes (snapshots.max_bytes)")]
    SnapshotTooLarge {
        /// The sandbox.
        sandbox: String,
        /// The limit.
        cap: u64,
    },
    /// A step of a template build failed ([`BuildFailure`]).
    #[error("{0}")]
    Build(Box<BuildFailure>),
    /// Something on the host corral runs on failed (a key file, a
    /// directory), naming the path or operation.
    #[error("{what}: {reason}")]
    Host {
        /// What corral was doing, with the path.
        what: String,
        /// What the system said.
        reason: String,
    },
}

/// A step of a template build that failed: which, where in the
/// Dockerfile, and what it printed last.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {template}: step {step} ({instruction}{}) failed: {detail}", line.map(|l| format!(", Dockerfile line {l}")).unwrap_or_default())]
pub struct BuildFailure {
    /// The template.
    pub template: String,
    /// Which step, from 1.
    pub step: usize,
    /// Its Dockerfile line, when it came from one.
    pub line: Option<usize>,
    /// The step as the build log names it.
    pub instruction: String,
    /// What went wrong.
    pub detail: String,
    /// The end of its output.
    pub output: String,
    /// What the failure means: a timeout, an OOM kill, or a step that
    /// failed (`invalid_spec`).
    pub kind: FailureKind,
}

impl Error {
    /// What this error means for the caller: the typed failure kind.
    pub fn kind(&self) -> FailureKind {
        match self {
            Error::EngineUnavailable { .. } | Error::EngineLost { .. } => {
                FailureKind::DaemonUnavailable
            }
            Error::Engine { kind, .. } => *kind,
            Error::ImageNotFound { .. } => FailureKind::ImageNotFound,
            Error::InvalidSpec(_) | Error::SnapshotTooLarge { .. } => FailureKind::InvalidSpec,
            Error::Unsupported { .. } | Error::Network { .. } => FailureKind::Unsupported,
            Error::ContainerLost { state, .. } if state.oom_killed => FailureKind::OomKilled,
            Error::ContainerLost { .. } => FailureKind::ContainerLost,
            Error::Agent { .. } | Error::ShutDown { .. } | Error::Host { .. } => {
                FailureKind::AgentError
            }
            Error::SlotTimeout { .. } => FailureKind::DaemonUnavailable,
            Error::NoRoom { .. } | Error::Capacity { .. } => FailureKind::Capacity,
            Error::Startup { .. } => FailureKind::SpawnFailed,
            Error::Build(b) => b.kind,
        }
    }

    /// The typed failure for this error.
    pub fn failure(&self) -> Failure {
        Failure {
            kind: self.kind(),
            message: self.to_string(),
            container: match self {
                Error::ContainerLost { state, .. } => Some((**state).clone()),
                _ => None,
            },
        }
    }

    /// Whether retrying may help.
    pub fn retryable(&self) -> bool {
        self.kind().retryable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ContainerStatus;

    #[test]
    fn kinds_follow_the_variant() {
        let lost = |oom| Error::ContainerLost {
            sandbox: "sb".into(),
            state: Box::new(ContainerState {
                status: ContainerStatus::Exited,
                oom_killed: oom,
                ..Default::default()
            }),
        };
        assert_eq!(lost(false).kind(), FailureKind::ContainerLost);
        assert_eq!(lost(true).kind(), FailureKind::OomKilled);
        assert!(lost(true).failure().container.is_some());
        let no_room = Error::NoRoom {
            max_live: 4,
            waited: Duration::from_secs(60),
        };
        assert!(no_room.retryable());
        assert_eq!(no_room.kind(), FailureKind::Capacity);
        assert!(no_room.to_string().contains("provider.max_live"));
        let full = Error::Capacity {
            sandbox: "sb".into(),
            message: "0/3 nodes are available: 3 Insufficient memory".into(),
        };
        assert!(full.retryable());
        assert_eq!(full.kind(), FailureKind::Capacity);
        assert!(full.to_string().contains("3 Insufficient memory"));
        let shut = Error::ShutDown { key: "k".into() };
        assert_eq!(shut.kind(), FailureKind::AgentError);
        let engine = Error::Engine {
            op: "create sandbox sb".into(),
            kind: FailureKind::InvalidSpec,
            source: "bad".into(),
        };
        assert!(!engine.retryable());
        assert_eq!(engine.to_string(), "create sandbox sb: bad");
    }
}
