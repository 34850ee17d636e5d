//! The one table that says what an API server's answer means for corral:
//! transient (retried, then `daemon_unavailable`) or not, and of which
//! kind; and the conversion of a kube error into corral's [`Error`].

use corral_core::{Error, FailureKind};

/// The HTTP status of an API error, if the server answered.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Whether the object is not there.
pub fn is_not_found(e: &kube::Error) -> bool {
    status_code(e) == Some(404)
}

/// Whether the server could not be reached or the connection broke (as
/// opposed to an answer).
pub fn is_connection_error(e: &kube::Error) -> bool {
    matches!(
        e,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::UpgradeConnection(_)
    )
}

/// What an error means for the caller. Throttling (429), server errors
/// (5xx, 504 included) and broken connections are transient; a refused
/// object (400, 422) is a bad spec; refused credentials or permissions
/// (401, 403) will not change by retrying.
pub fn classify(e: &kube::Error) -> FailureKind {
    match e {
        kube::Error::Api(status) => match status.code {
            429 | 500..=599 => FailureKind::DaemonUnavailable,
            400 | 422 => FailureKind::InvalidSpec,
            404 | 409 => FailureKind::ContainerLost,
            _ => FailureKind::Unsupported,
        },
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::UpgradeConnection(_)
        | kube::Error::ReadEvents(_) => FailureKind::DaemonUnavailable,
        _ => FailureKind::Unsupported,
    }
}

/// corral's error for a failed API call named `op` (with the ids involved).
pub fn api(op: impl Into<String>, e: kube::Error) -> Error {
    let op = op.into();
    if is_connection_error(&e) {
        return Error::EngineLost {
            op,
            source: Box::new(e),
        };
    }
    Error::Engine {
        op,
        kind: classify(&e),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            message: format!("code {code}"),
            reason: "Test".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn the_table() {
        for code in [429, 500, 503, 504] {
            assert_eq!(
                classify(&api_error(code)),
                FailureKind::DaemonUnavailable,
                "{code}"
            );
            assert!(api("create pod p", api_error(code)).retryable(), "{code}");
        }
        for code in [400, 422] {
            assert_eq!(
                classify(&api_error(code)),
                FailureKind::InvalidSpec,
                "{code}"
            );
        }
        for code in [401, 403] {
            let e = api("create pod p", api_error(code));
            assert_eq!(e.kind(), FailureKind::Unsupported, "{code}");
            assert!(!e.retryable());
            assert!(e.to_string().starts_with("create pod p: "), "{e}");
        }
        assert!(is_not_found(&api_error(404)));
        assert!(!is_not_found(&api_error(500)));
        let broken = kube::Error::ReadEvents(std::io::Error::other("reset"));
        assert_eq!(classify(&broken), FailureKind::DaemonUnavailable);
        let serde = kube::Error::SerdeError(serde_json::from_str::<u8>("x").expect_err("not json"));
        assert_eq!(classify(&serde), FailureKind::Unsupported);
    }
}
