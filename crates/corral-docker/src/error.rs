//! Errors of the Docker backend, each mapped to a typed [`Failure`].

use corral_core::{ContainerState, Failure, FailureKind, SpecError};

/// What can go wrong between corral and the daemon.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// No daemon answered at any endpoint tried.
    #[error("no Docker daemon answered: {detail}")]
    DaemonUnavailable {
        /// Endpoints tried and what each said.
        detail: String,
    },
    /// A call failed because the daemon could not be reached mid-operation.
    #[error("daemon unavailable during {op}: {source}")]
    DaemonLost {
        /// The operation, with the ids involved.
        op: String,
        /// The client's error.
        source: bollard::errors::Error,
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
    /// The daemon cannot do what the spec asks.
    #[error("unsupported by this daemon: {what}")]
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
        waited: std::time::Duration,
    },
    /// Any other daemon answer.
    #[error("{op}: {source}")]
    Api {
        /// The operation, with the ids involved.
        op: String,
        /// The client's error.
        source: bollard::errors::Error,
    },
}

impl DockerError {
    /// Wraps a daemon error from operation `op`, telling connection trouble
    /// (the daemon is unavailable) from an answer.
    pub fn api(op: impl Into<String>, source: bollard::errors::Error) -> Self {
        let op = op.into();
        if is_connection_error(&source) {
            DockerError::DaemonLost { op, source }
        } else {
            DockerError::Api { op, source }
        }
    }

    /// The typed failure for this error.
    pub fn failure(&self) -> Failure {
        let kind = match self {
            DockerError::DaemonUnavailable { .. } | DockerError::DaemonLost { .. } => {
                FailureKind::DaemonUnavailable
            }
            DockerError::ImageNotFound { .. } => FailureKind::ImageNotFound,
            DockerError::InvalidSpec(_) => FailureKind::InvalidSpec,
            DockerError::Unsupported { .. } | DockerError::Network { .. } => {
                FailureKind::Unsupported
            }
            DockerError::ContainerLost { state, .. } if state.oom_killed => FailureKind::OomKilled,
            DockerError::ContainerLost { .. } => FailureKind::ContainerLost,
            DockerError::Agent { .. } => FailureKind::AgentError,
            DockerError::SlotTimeout { .. } => FailureKind::DaemonUnavailable,
            DockerError::Startup { .. } => FailureKind::SpawnFailed,
            DockerError::Api { source, .. } => classify(source),
        };
        let container = match self {
            DockerError::ContainerLost { state, .. } => Some((**state).clone()),
            _ => None,
        };
        Failure {
            kind,
            message: self.to_string(),
            container,
        }
    }

    /// Whether retrying may help.
    pub fn retryable(&self) -> bool {
        self.failure().retryable()
    }
}

/// Daemon error texts that mean the request itself is wrong: retrying the
/// same request fails the same way, whatever the status code says.
const PERMANENT_MARKERS: &[&str] = &[
    "unable to find user",
    "no matching entries in passwd",
    "executable file not found",
    "no such file or directory",
    "unknown runtime",
    "invalid reference format",
    "invalid mount config",
    "invalid argument",
    "permission denied",
    "not a directory",
    "storage-opt",
];

/// Daemon error texts known to be transient: the same request may succeed
/// moments later.
const TRANSIENT_MARKERS: &[&str] = &[
    "database is locked",
    "retrieving exec session",
    "timed out waiting for file",
    "connection reset",
    "connection refused",
    "unexpected eof",
    "context deadline exceeded",
    "i/o timeout",
    "resource temporarily unavailable",
];

/// Daemon error texts that mean the container exists but is not running
/// (Docker answers 409 "is not running"; Podman's compatible API answers 500
/// "container state improper"): a lost container, never worth a retry.
const NOT_RUNNING_MARKERS: &[&str] = &[
    "is not running",
    "container state improper",
    "can only kill running containers",
];

/// True when a daemon error text says the container is not running.
fn says_not_running(message: &str) -> bool {
    let text = message.to_ascii_lowercase();
    NOT_RUNNING_MARKERS.iter().any(|m| text.contains(m))
}

/// Classifies a daemon error: connection trouble and transient daemon
/// errors are `DaemonUnavailable` (retryable); a rejected request is
/// `InvalidSpec`. A 5xx with no known permanent cause counts as transient.
pub fn classify(e: &bollard::errors::Error) -> FailureKind {
    if is_connection_error(e) {
        return FailureKind::DaemonUnavailable;
    }
    let bollard::errors::Error::DockerResponseServerError {
        status_code,
        message,
    } = e
    else {
        return FailureKind::AgentError;
    };
    let text = message.to_ascii_lowercase();
    if says_not_running(message) {
        return FailureKind::ContainerLost;
    }
    if TRANSIENT_MARKERS.iter().any(|m| text.contains(m)) {
        return FailureKind::DaemonUnavailable;
    }
    if PERMANENT_MARKERS.iter().any(|m| text.contains(m)) {
        return FailureKind::InvalidSpec;
    }
    match status_code {
        400 | 403 | 406 | 422 => FailureKind::InvalidSpec,
        404 => FailureKind::ContainerLost,
        s if *s >= 500 => FailureKind::DaemonUnavailable,
        _ => FailureKind::InvalidSpec,
    }
}

/// The HTTP status of a daemon answer, if it was one.
pub fn status_code(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// True when the daemon said the container is not running (Docker: 409;
/// Podman: 500 "container state improper").
pub fn is_not_running(e: &bollard::errors::Error) -> bool {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => *status_code == 409 || says_not_running(message),
        _ => false,
    }
}

/// True when the daemon answered 404.
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    status_code(e) == Some(404)
}

/// True when the error means the daemon could not be reached or the
/// connection broke, as opposed to an answer.
pub fn is_connection_error(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    matches!(
        e,
        E::IOError { .. }
            | E::HyperResponseError { .. }
            | E::HyperLegacyError { .. }
            | E::HttpClientError { .. }
            | E::DockerStreamError { .. }
            | E::RequestTimeoutError
            | E::SocketNotFoundError(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::errors::Error;

    fn server(status_code: u16, message: &str) -> Error {
        Error::DockerResponseServerError {
            status_code,
            message: message.into(),
        }
    }

    #[test]
    fn classification_table() {
        use FailureKind::*;
        let cases = [
            (server(500, "database is locked"), DaemonUnavailable),
            (
                server(500, "error retrieving exec session: x"),
                DaemonUnavailable,
            ),
            (
                server(500, "timed out waiting for file /x"),
                DaemonUnavailable,
            ),
            (server(503, "something odd"), DaemonUnavailable),
            (
                server(
                    500,
                    "unable to find user bob: no matching entries in passwd file",
                ),
                InvalidSpec,
            ),
            (server(400, "Unknown runtime specified nope"), InvalidSpec),
            (
                server(
                    500,
                    "OCI runtime create failed: exec: \"/x\": no such file or directory",
                ),
                InvalidSpec,
            ),
            (server(404, "No such container: abc"), ContainerLost),
            (Error::RequestTimeoutError, DaemonUnavailable),
            (
                server(409, "Container abc is not running"),
                ContainerLost,
            ),
            // Podman's answer to a kill or exec of a stopped container: a
            // 500 that must not be retried as a transient daemon error.
            (
                server(
                    500,
                    "can only kill running containers. abc is in state created: container state improper",
                ),
                ContainerLost,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(classify(&e), want, "{e}");
            assert_eq!(DockerError::api("op", e).failure().kind, want);
        }
    }

    #[test]
    fn not_running_is_recognised_from_docker_and_podman() {
        assert!(is_not_running(&server(409, "Container abc is not running")));
        assert!(is_not_running(&server(
            500,
            "abc is in state exited: container state improper"
        )));
        assert!(!is_not_running(&server(500, "database is locked")));
        assert!(!is_not_running(&server(404, "No such container: abc")));
        assert!(!is_not_running(&Error::RequestTimeoutError));
    }
}
