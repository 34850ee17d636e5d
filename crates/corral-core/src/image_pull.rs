//! What a failed image pull means, from the text the engine reports it
//! with (Docker's answer or progress item; a kubelet's waiting message or
//! pod event): a name or tag that cannot be had, which retrying does not
//! change, or a registry or engine that could not be reached, which a
//! later try may get past. One reading for every backend.

/// Why a pull failed, for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullCause {
    /// The registry does not have this name or tag, refuses it, or the
    /// name leads to no registry: retrying fails the same way
    /// (`image_not_found`).
    NotFound,
    /// The registry or the engine could not be reached, failed (5xx) or
    /// took too long: retryable (`daemon_unavailable`).
    Unavailable,
}

/// What a registry says when the name or tag does not exist or may not be
/// pulled (a login missing or wrong included).
const NOT_FOUND_MARKERS: &[&str] = &[
    "manifest unknown",
    "not found",
    "name unknown",
    "does not exist",
    "pull access denied",
    "invalid reference format",
    "unauthorized",
    "denied",
    "no basic auth credentials",
    "authentication required",
];

/// What a registry that cannot be reached looks like, whatever the status.
const UNREACHABLE_MARKERS: &[&str] = &[
    "connection refused",
    "i/o timeout",
    "timeout",
    "connection reset",
    "eof",
    "500 internal server error",
    "502 bad gateway",
    "503 service unavailable",
    "504 gateway timeout",
];

/// Reads a failed pull's `message` (with the HTTP `status` of the engine's
/// answer, when there is one).
pub fn classify(status: Option<u16>, message: &str) -> PullCause {
    let text = message.to_ascii_lowercase();
    // A registry host that does not resolve is a name that does not lead
    // to an image (a typo in the host, or no registry on this network):
    // retrying would not help, unlike a registry that is down.
    if text.contains("no such host") {
        return PullCause::NotFound;
    }
    if UNREACHABLE_MARKERS.iter().any(|m| text.contains(m)) {
        return PullCause::Unavailable;
    }
    if matches!(status, Some(400 | 404)) || NOT_FOUND_MARKERS.iter().any(|m| text.contains(m)) {
        return PullCause::NotFound;
    }
    PullCause::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_messages_read_as_dockers_do() {
        // containerd behind a kubelet, as `kubectl describe pod` shows them.
        assert_eq!(
            classify(None, "failed to pull and unpack image \"127.0.0.1:5000/x:nope\": failed to resolve reference \"127.0.0.1:5000/x:nope\": 127.0.0.1:5000/x:nope: not found"),
            PullCause::NotFound
        );
        assert_eq!(
            classify(None, "rpc error: code = Unknown desc = failed to pull and unpack image \"r:5000/x:1\": failed to do request: Head \"http://r:5000/v2/x/manifests/1\": dial tcp 10.0.0.9:5000: connect: connection refused"),
            PullCause::Unavailable
        );
        assert_eq!(
            classify(None, "failed to authorize: failed to fetch anonymous token: unexpected status: 401 Unauthorized"),
            PullCause::NotFound
        );
    }
}
