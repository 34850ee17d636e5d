//! The daemon's errors: which are transient, which mean a lost container,
//! and how each becomes corral's [`Error`] (one table, [`classify`]).

use corral_core::{Error, FailureKind};

/// Wraps a daemon error from operation `op`, telling connection trouble
/// (the daemon is unavailable) from an answer, which [`classify`] types.
pub fn api(op: impl Into<String>, source: bollard::errors::Error) -> Error {
    let op = op.into();
    if is_connection_error(&source) {
        Error::EngineLost {
            op,
            source: Box::new(source),
        }
    } else {
        Error::Engine {
            op,
            kind: classify(&source),
            source: Box::new(source),
        }
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

/// The runtime a create named that the daemon does not know (Docker's
/// 400 "Unknown runtime specified NAME"), if that is what `e` says.
pub fn unknown_runtime(e: &bollard::errors::Error) -> Option<&str> {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 400,
            message,
        } => message
            .strip_prefix("Unknown runtime specified ")
            .map(str::trim),
        _ => None,
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
            assert_eq!(api("op", e).failure().kind, want);
        }
    }

    #[test]
    fn an_unknown_runtime_is_recognised_by_name() {
        assert_eq!(
            unknown_runtime(&server(400, "Unknown runtime specified runsc")),
            Some("runsc")
        );
        assert_eq!(unknown_runtime(&server(400, "invalid mount")), None);
        assert_eq!(
            unknown_runtime(&server(500, "Unknown runtime specified runsc")),
            None
        );
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
