//! Errors of the HTTP API: a status and a JSON body naming the field at
//! fault, with `retryable` for daemon trouble.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral::{Error, FileError};
use corral_core::{Failure, FailureKind};

use crate::wire::{ErrorBody, ErrorDetail};

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What the body says.
    pub detail: ErrorDetail,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            detail: ErrorDetail {
                kind: kind.to_string(),
                message: message.into(),
                field: None,
                retryable: false,
            },
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

    /// The answer for a typed failure.
    pub fn failure(f: &Failure) -> Self {
        let status = match f.kind {
            FailureKind::DaemonUnavailable => StatusCode::SERVICE_UNAVAILABLE,
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
        e
    }

    /// The answer for a backend error; a bad spec names its field under
    /// `field_prefix` (e.g. `spec`).
    pub fn runtime(err: &Error, field_prefix: &str) -> Self {
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
        (self.status, Json(ErrorBody { error: self.detail })).into_response()
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
    }
}
