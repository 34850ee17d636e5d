//! Errors of the HTTP API: a status and a JSON body naming the field at
//! fault, with `retryable` for daemon trouble (and a `Retry-After` header
//! when the engine said it has no room, or the service's own budget is
//! full).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral::{Error, FileError};
use corral_core::{Failure, FailureKind};

use crate::wire::{ErrorBody, ErrorDetail};

/// Seconds a client is asked to wait (`Retry-After`) before trying again
/// after a `capacity` failure: room comes back as sandboxes end or the
/// cluster grows, not within the client's usual sub-second backoff.
pub const CAPACITY_RETRY_AFTER_SECS: u64 = 10;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What the body says.
    pub detail: ErrorDetail,
    /// `Retry-After` in seconds, when the service can tell.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            detail: ErrorDetail {
                kind: kind.to_string(),
                message: message.into(),
                field: None,
                retryable: false,
            },
            retry_after: None,
        }
    }

    /// 400: a request field is wrong.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message);
        e.detail.field = Some(field.into());
        e
    }

    /// 404: no such thing.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 401: no or a wrong bearer token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        e.detail.field = Some("Authorization".into());
        e
    }

    /// 403: the request, or a field of it, is not allowed (a header such as
    /// `Origin` or `Host`, or a spec field the policy refuses).
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::FORBIDDEN, "forbidden", message);
        e.detail.field = Some(field.into());
        e
    }

    /// 403 for a request the service's client policy refuses; the refused
    /// field is named under `field_prefix` (e.g. `spec`).
    pub fn refused(refusal: &corral_core::client_policy::Refusal, field_prefix: &str) -> Self {
        let field = if field_prefix.is_empty() {
            refusal.field.clone()
        } else {
            format!("{field_prefix}.{}", refusal.field)
        };
        let message = format!(
            "{field} '{}' is not allowed: {}",
            refusal.value, refusal.reason
        );
        ApiError::forbidden(field, message)
    }

    /// 415: a JSON body without `Content-Type: application/json`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        );
        e.detail.field = Some("Content-Type".into());
        e
    }

    /// 503 (retryable): the service is shutting down.
    pub fn shutting_down() -> Self {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is shutting down",
        );
        e.detail.retryable = true;
        e
    }

    /// 503 (retryable, with `Retry-After`): the service's own ceilings on
    /// work in flight (`server.limits`) are reached; nothing of the
    /// request ran.
    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message);
        e.detail.retryable = true;
        e.retry_after = Some(retry_after);
        e
    }

    /// The answer for a typed failure. Retryable trouble of the engine is a
    /// 503 (`capacity` with `Retry-After`), as when the service itself is
    /// shutting down.
    pub fn failure(f: &Failure) -> Self {
        let status = match f.kind {
            FailureKind::DaemonUnavailable | FailureKind::Capacity => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            FailureKind::ContainerLost | FailureKind::OomKilled => StatusCode::GONE,
            FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            FailureKind::InvalidSpec | FailureKind::ImageNotFound | FailureKind::Unsupported => {
                StatusCode::BAD_REQUEST
            }
            FailureKind::AgentError | FailureKind::ProtocolViolation => StatusCode::BAD_GATEWAY,
            FailureKind::SpawnFailed => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut e = ApiError::new(status, f.kind.as_str(), f.message.clone());
        e.detail.retryable = f.retryable();
        if f.kind == FailureKind::Capacity {
            e.retry_after = Some(CAPACITY_RETRY_AFTER_SECS);
        }
        e
    }

    /// 503 `capacity` (retryable, `Retry-After`): a tenant's quota is
    /// spent; room comes back as its sandboxes or snapshots go. `field`
    /// names the quota (`max_sandboxes`, ...).
    pub fn quota(q: &corral_core::principal::QuotaExceeded) -> Self {
        let mut e = ApiError::failure(&Failure::new(FailureKind::Capacity, q.to_string()));
        e.detail.field = Some(q.what.to_string());
        e
    }

    /// The answer for a backend error; a bad spec names its field under
    /// `field_prefix` (e.g. `spec`).
    pub fn runtime(err: &Error, field_prefix: &str) -> Self {
        if let Error::SnapshotTooLarge { .. } = err {
            let mut e = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", err.to_string());
            e.detail.field = Some("snapshots.max_bytes".into());
            return e;
        }
        let mut e = ApiError::failure(&err.failure());
        if let Error::InvalidSpec(spec) = err {
            e.detail.field = Some(if field_prefix.is_empty() {
                spec.field.clone()
            } else {
                format!("{field_prefix}.{}", spec.field)
            });
        }
        if matches!(err, Error::SlotTimeout { .. }) {
            e.detail.retryable = true;
        }
        e
    }

    /// The answer for a file operation's error.
    pub fn file(err: &FileError) -> Self {
        let message = err.to_string();
        match err {
            FileError::NotFound { .. } => {
                let mut e = ApiError::not_found(message);
                e.detail.field = Some("path".into());
                e
            }
            FileError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            FileError::Escapes { .. } | FileError::Unsafe { .. } => {
                ApiError::invalid("path", message)
            }
            FileError::InvalidPath { field, .. } => ApiError::invalid(*field, message),
            FileError::InvalidOption { field, .. } => ApiError::invalid(*field, message),
            FileError::Failed { .. } => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "file_error", message);
                e.detail.field = Some("path".into());
                e
            }
            FileError::Host { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
            FileError::Sandbox(f) => ApiError::failure(f),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ErrorBody { error: self.detail })).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_trouble_is_a_retryable_503_and_bad_specs_name_the_field() {
        let e = ApiError::failure(&Failure::new(FailureKind::DaemonUnavailable, "down"));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.detail.retryable);
        let spec = Error::InvalidSpec(corral_core::SpecError {
            field: "limits.memory".into(),
            value: "0".into(),
            reason: "too small".into(),
        });
        let e = ApiError::runtime(&spec, "spec");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.detail.kind, "invalid_spec");
        assert_eq!(e.detail.field.as_deref(), Some("spec.limits.memory"));
        assert!(!e.detail.retryable);
        assert_eq!(e.retry_after, None);
    }

    #[test]
    fn a_full_cluster_is_a_retryable_503_with_retry_after() {
        let full = Error::Capacity {
            sandbox: "sb-1".into(),
            message: "0/3 nodes are available: 3 Insufficient memory.".into(),
        };
        let e = ApiError::runtime(&full, "");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.detail.kind, "capacity");
        assert!(e.detail.retryable);
        assert!(e.detail.message.contains("3 Insufficient memory"));
        assert_eq!(e.retry_after, Some(CAPACITY_RETRY_AFTER_SECS));
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from(CAPACITY_RETRY_AFTER_SECS))
        );
        let down = ApiError::failure(&Failure::new(FailureKind::DaemonUnavailable, "down"));
        assert!(down
            .into_response()
            .headers()
            .get(header::RETRY_AFTER)
            .is_none());
    }
}
