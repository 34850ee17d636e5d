//! Connect-RPC as the `e2b` SDK speaks it to `envd`: the JSON codec over
//! HTTP/1.1. A unary call is a plain JSON body answered by a JSON body (or
//! an error status with `{"code", "message"}`); a server stream answers
//! enveloped messages (1 flag byte, 4-byte big-endian length, JSON) ending
//! with an end-of-stream envelope (flag `0x02`) that carries `{}` or
//! `{"error": {...}}`; a client stream sends envelopes the same way.
//!
//! Only this module knows the framing; the services in `process.rs` and
//! `filesystem.rs` deal in JSON values and [`RpcError`]s.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// The end-of-stream flag of an envelope.
const END_STREAM: u8 = 0x02;

/// The compressed flag: the SDK disables compression, and so does this
/// service (it never announces an encoding).
const COMPRESSED: u8 = 0x01;

/// The largest message accepted in a request envelope (file contents go
/// through `/files`, not RPC).
const MAX_MESSAGE: usize = 16 << 20;

/// A Connect error code (the protocol's names on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (Connect's table).
    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A failed call: a code and a message that names the field or header at
/// fault.
#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// A bad request field.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        RpcError::new(Code::InvalidArgument, format!("{field}: {message}"))
    }

    /// A call or field this service does not serve.
    pub fn unimplemented(what: &str, why: &str) -> Self {
        RpcError::new(
            Code::Unimplemented,
            format!("{what} is not supported by corral's envd: {why}"),
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.name(), "message": self.message})
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        let code = match e.status.as_u16() {
            400 => Code::InvalidArgument,
            413 => Code::ResourceExhausted,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            410 => Code::Unavailable,
            429 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        let message = match &e.detail.field {
            Some(f) if !e.detail.message.contains(f.as_str()) => {
                format!("{f}: {}", e.detail.message)
            }
            _ => e.detail.message,
        };
        RpcError::new(code, message)
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

/// The answer of a unary call.
pub(crate) fn unary(result: Result<serde_json::Value, RpcError>) -> Response {
    match result {
        Ok(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v.to_string(),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn refuse_compression(headers: &HeaderMap) -> Result<(), RpcError> {
    for name in ["content-encoding", "connect-content-encoding"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            if !v.eq_ignore_ascii_case("identity") {
                return Err(RpcError::unimplemented(
                    &format!("header {name} '{v}'"),
                    "messages must be sent uncompressed",
                ));
            }
        }
    }
    Ok(())
}

/// Decodes a message, naming the field at fault.
pub(crate) fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, RpcError> {
    let text: &[u8] = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        json
    };
    let de = &mut serde_json::Deserializer::from_slice(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "message" } else { &path };
        RpcError::invalid(field, e.inner())
    })
}

/// The request message of a unary call (`application/json`).
pub(crate) fn unary_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    refuse_compression(headers)?;
    let ct = content_type(headers);
    if !ct.starts_with("application/json") {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!(
                "header Content-Type '{ct}': this service speaks Connect's JSON codec \
                 (application/json for unary calls), not the binary one"
            ),
        ));
    }
    decode(body)
}

/// Splits a body of envelopes (a client stream, or the one message of a
/// server-stream request) into messages; the end-of-stream envelope ends it.
pub(crate) fn envelopes(headers: &HeaderMap, mut body: &[u8]) -> Result<Vec<Bytes>, RpcError> {
    refuse_compression(headers)?;
    let ct = content_type(headers);
    if !ct.starts_with("application/connect+json") {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!(
                "header Content-Type '{ct}': this service speaks Connect's JSON codec \
                 (application/connect+json for streaming calls)"
            ),
        ));
    }
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 5 {
            return Err(RpcError::invalid(
                "body",
                format!("a truncated envelope header ({} bytes)", body.len()),
            ));
        }
        let flags = body[0];
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("body: a message of {len} bytes is above the {MAX_MESSAGE}-byte limit"),
            ));
        }
        if body.len() < 5 + len {
            return Err(RpcError::invalid(
                "body",
                format!(
                    "an envelope announces {len} bytes but {} follow",
                    body.len() - 5
                ),
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err(RpcError::unimplemented(
                "a compressed envelope",
                "messages must be sent uncompressed",
            ));
        }
        let message = Bytes::copy_from_slice(&body[5..5 + len]);
        body = &body[5 + len..];
        if flags & END_STREAM != 0 {
            break;
        }
        out.push(message);
    }
    Ok(out)
}

/// The one request message of a server-streaming call.
pub(crate) fn stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    let messages = envelopes(headers, body)?;
    match messages.as_slice() {
        [one] => decode(one),
        other => Err(RpcError::invalid(
            "body",
            format!(
                "a server-streaming call takes exactly one message, got {}",
                other.len()
            ),
        )),
    }
}

/// `Connect-Timeout-Ms`: the deadline the client gave the call.
pub(crate) fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, RpcError> {
    let Some(v) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or("");
    match text.trim().parse::<u64>() {
        Ok(0) | Err(_) => Err(RpcError::invalid(
            "header Connect-Timeout-Ms",
            format!("'{text}' is not a positive number of milliseconds"),
        )),
        Ok(ms) => Ok(Some(Duration::from_millis(ms))),
    }
}

fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    Bytes::from(out)
}

/// What a server-streaming handler sends: messages, then at most one end.
pub(crate) enum Item {
    Message(serde_json::Value),
    End(Option<RpcError>),
}

/// A server stream: the handler sends [`Item`]s on the returned sender and
/// the response carries them as envelopes; the end envelope closes it (`{}`
/// when the sender is dropped without one).
pub(crate) fn server_stream() -> (mpsc::Sender<Item>, Response) {
    let (tx, mut rx) = mpsc::channel::<Item>(64);
    // Dropping the body (the client went away) closes `out`, which ends
    // the task and so closes `tx` for the handler.
    let (out, body) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut ended = false;
        while let Some(item) = rx.recv().await {
            let frame = match item {
                Item::Message(v) => envelope(0, v.to_string().as_bytes()),
                Item::End(err) => {
                    ended = true;
                    let end = match err {
                        None => serde_json::json!({}),
                        Some(e) => serde_json::json!({"error": e.json()}),
                    };
                    envelope(END_STREAM, end.to_string().as_bytes())
                }
            };
            if out.send(Ok(frame)).await.is_err() || ended {
                return;
            }
        }
        let _ = out.send(Ok(envelope(END_STREAM, b"{}"))).await;
    });
    let response = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body)),
    )
        .into_response();
    (tx, response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, ct.parse().expect("should work"));
        h
    }

    #[test]
    fn envelopes_split_and_stop_at_the_end_of_the_stream() {
        let mut body = envelope(0, br#"{"a":1}"#).to_vec();
        body.extend_from_slice(&envelope(0, br#"{"b":2}"#));
        body.extend_from_slice(&envelope(END_STREAM, b"{}"));
        body.extend_from_slice(&envelope(0, b"ignored"));
        let got = envelopes(&headers("application/connect+json"), &body).expect("should work");
        assert_eq!(
            got,
            vec![Bytes::from(r#"{"a":1}"#), Bytes::from(r#"{"b":2}"#)]
        );
    }

    #[test]
    fn bad_envelopes_are_named() {
        let h = headers("application/connect+json");
        let e = envelopes(&h, &[0, 0, 0]).expect_err("should fail");
        assert!(e.message.contains("truncated envelope"), "{}", e.message);
        let e = envelopes(&h, &[0, 0, 0, 0, 9, b'{']).expect_err("should fail");
        assert!(e.message.contains("announces 9 bytes"), "{}", e.message);
        let e = envelopes(&h, &envelope(COMPRESSED, b"x")).expect_err("should fail");
        assert_eq!(e.code, Code::Unimplemented);
        let e = envelopes(&headers("application/connect+proto"), &[]).expect_err("should fail");
        assert!(e
            .message
            .contains("Content-Type 'application/connect+proto'"));
    }

    #[test]
    fn a_wrong_field_type_names_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct M {
            path: String,
        }
        let e = unary_request::<M>(&headers("application/json"), br#"{"path": 3}"#)
            .expect_err("should fail");
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.starts_with("path:"), "{}", e.message);
        let e = unary_request::<M>(&headers("application/proto"), b"").expect_err("should fail");
        assert_eq!(e.code, Code::Unimplemented);
    }

    #[test]
    fn timeouts_are_read_or_refused_by_name() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h).expect("should work"), None);
        h.insert("connect-timeout-ms", "1500".parse().expect("should work"));
        assert_eq!(
            timeout(&h).expect("should work"),
            Some(Duration::from_millis(1500))
        );
        h.insert("connect-timeout-ms", "soon".parse().expect("should work"));
        assert!(timeout(&h)
            .expect_err("should fail")
            .message
            .contains("Connect-Timeout-Ms"));
    }
}
