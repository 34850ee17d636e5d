//! A client for the control API of a proxy running in another process (the
//! `corral-faultproxy` binary), so multi-process tests need not speak HTTP.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use crate::control::CONTROL_PREFIX;
use crate::rule::{Config, Matcher, Rule};
use crate::stats::Stats;

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The proxy socket could not be connected to.
    #[error("cannot connect to fault proxy at {path}: {source}")]
    Connect {
        /// The proxy socket.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The HTTP exchange failed (connection dropped, malformed answer).
    #[error("fault proxy at {path}: {source}")]
    Http {
        /// The proxy socket.
        path: PathBuf,
        /// The transport error.
        source: hyper::Error,
    },
    /// The request could not be built, e.g. an invalid path.
    #[error("invalid control request {what:?}: {source}")]
    Request {
        /// The control path asked for.
        what: String,
        /// Why `http` rejected it.
        source: http::Error,
    },
    /// The proxy answered with an error status.
    #[error("fault proxy at {path} answered {status}: {message}")]
    Rejected {
        /// The proxy socket.
        path: PathBuf,
        /// HTTP status of the answer.
        status: u16,
        /// The proxy's message.
        message: String,
        /// The rejected field, when the proxy named one.
        field: Option<String>,
    },
    /// A body could not be encoded, or the answer was not the JSON expected.
    #[error("fault proxy at {path}: bad JSON: {source}")]
    Json {
        /// The proxy socket.
        path: PathBuf,
        /// The serde error.
        source: serde_json::Error,
    },
}

/// Talks to the control API of the proxy listening at a socket path.
#[derive(Clone, Debug)]
pub struct ControlClient {
    socket: PathBuf,
}

impl ControlClient {
    /// A client for the proxy listening at `socket`; nothing is connected
    /// until a request is made.
    pub fn new(socket: impl AsRef<Path>) -> ControlClient {
        ControlClient {
            socket: socket.as_ref().to_path_buf(),
        }
    }

    /// Replaces the proxy's rules.
    pub async fn set_rules(&self, rules: &[Rule]) -> Result<(), ControlError> {
        self.put("rules", rules).await
    }

    /// The proxy's current rules.
    pub async fn rules(&self) -> Result<Vec<Rule>, ControlError> {
        self.get("rules").await
    }

    /// Replaces the tracked matchers (their gauges start from zero).
    pub async fn set_tracked(&self, tracked: &[Matcher]) -> Result<(), ControlError> {
        self.put("tracked", tracked).await
    }

    /// Sets the seed and restarts the generator from it.
    pub async fn set_seed(&self, seed: u64) -> Result<(), ControlError> {
        self.put("seed", &seed).await
    }

    /// Replaces seed, rules and tracked matchers at once.
    pub async fn set_config(&self, config: &Config) -> Result<(), ControlError> {
        self.put("config", config).await
    }

    /// The proxy's counters.
    pub async fn stats(&self) -> Result<Stats, ControlError> {
        self.get("stats").await
    }

    /// Zeroes the counters (see [`FaultProxy::reset_stats`](crate::FaultProxy::reset_stats)).
    pub async fn reset_stats(&self) -> Result<(), ControlError> {
        self.send(Method::POST, "stats/reset", Bytes::new())
            .await
            .and_then(|answer| self.check(answer))
            .map(drop)
    }

    /// Sends one raw request to `/_faultproxy/{route}` and returns the
    /// status and body whatever they are; for testing the API itself.
    pub async fn send(
        &self,
        method: Method,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, Bytes), ControlError> {
        let what = format!("{CONTROL_PREFIX}/{route}");
        let request = Request::builder()
            .method(method)
            .uri(&what)
            // HTTP/1.1 requires a Host; a Unix socket has none.
            .header(HOST, "faultproxy")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body.into()))
            .map_err(|source| ControlError::Request { what, source })?;
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ControlError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let http = |source| ControlError::Http {
            path: self.socket.clone(),
            source,
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        // The connection future drives the socket; it ends with the request.
        tokio::spawn(connection);
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(http)?;
        Ok((status, body.to_bytes()))
    }

    fn check(&self, (status, body): (StatusCode, Bytes)) -> Result<Bytes, ControlError> {
        if status.is_success() {
            return Ok(body);
        }
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Err(ControlError::Rejected {
            path: self.socket.clone(),
            status: status.as_u16(),
            message: parsed["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned()),
            field: parsed["field"].as_str().map(str::to_owned),
        })
    }

    fn json_error(&self, source: serde_json::Error) -> ControlError {
        ControlError::Json {
            path: self.socket.clone(),
            source,
        }
    }

    async fn get<T: DeserializeOwned>(&self, route: &str) -> Result<T, ControlError> {
        let answer = self.send(Method::GET, route, Bytes::new()).await?;
        let body = self.check(answer)?;
        serde_json::from_slice(&body).map_err(|e| self.json_error(e))
    }

    async fn put<T: Serialize + ?Sized>(&self, route: &str, value: &T) -> Result<(), ControlError> {
        let body = serde_json::to_vec(value).map_err(|e| self.json_error(e))?;
        let answer = self.send(Method::PUT, route, body).await?;
        self.check(answer).map(drop)
    }
}
