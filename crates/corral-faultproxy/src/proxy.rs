//! The data path: accept clients on the listening socket, apply the rules,
//! forward to the daemon socket, and splice hijacked (`101`) connections.
//!
//! Each client connection is served by hyper's HTTP/1 server, so keep-alive,
//! chunked and length-delimited bodies are framed by hyper on both sides and
//! bodies stream frame by frame in both directions (`/events` and followed
//! logs arrive as the daemon sends them). Every forwarded request gets its
//! own upstream connection: a Unix connect costs microseconds, and it means
//! a stale pooled connection can never produce a failure the rules did not
//! ask for.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_http1;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::control;
use crate::glob::normalize_path;
use crate::state::{Decision, InFlight, Shared};

/// The body of every response the proxy sends.
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// Tells hyper to drop the client connection without answering; hyper
/// writes nothing for a request whose service call fails.
#[derive(Debug, thiserror::Error)]
#[error("connection reset by fault rule")]
pub(crate) struct ResetConnection;

/// A body with these bytes.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn empty() -> ProxyBody {
    Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A JSON response; `value` is already a JSON value, so rendering it cannot
/// fail.
pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut body = value.to_string();
    body.push('\n');
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An error as the daemon writes it, so clients parse it like a real one.
fn docker_error(status: u16, message: &str) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &serde_json::json!({ "message": message }))
}

fn bad_gateway(upstream: &Path, what: &str, error: &dyn std::fmt::Display) -> Response<ProxyBody> {
    docker_error(
        502,
        &format!(
            "corral-faultproxy: {what} (daemon socket {}): {error}",
            upstream.display()
        ),
    )
}

/// Runs `task` until it ends or the proxy is dropped.
pub(crate) fn spawn_until_shutdown<F>(task: F, mut shutdown: watch::Receiver<()>)
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        tokio::select! {
            () = task => {}
            // The sender is never written, only dropped with the proxy.
            _ = shutdown.changed() => {}
        }
    });
}

/// Accepts clients until the proxy is dropped.
pub(crate) async fn accept_loop(
    listener: UnixListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => spawn_until_shutdown(
                serve_connection(stream, Arc::clone(&shared), shutdown.clone()),
                shutdown.clone(),
            ),
            Err(error) => {
                // Typically EMFILE; back off instead of spinning on it.
                warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(stream: UnixStream, shared: Arc<Shared>, shutdown: watch::Receiver<()>) {
    let service = service_fn(move |request| handle(request, Arc::clone(&shared), shutdown.clone()));
    let served = server_http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(error) = served {
        debug!(%error, "client connection ended");
    }
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<()>,
) -> Result<Response<ProxyBody>, ResetConnection> {
    if control::is_control(request.uri().path()) {
        return Ok(control::handle(request, &shared).await);
    }
    let path = normalize_path(request.uri().path()).to_owned();
    let (decision, in_flight) = shared.begin(request.method().as_str(), &path);
    debug!(method = %request.method(), %path, ?decision, "request");
    match decision {
        Decision::Forward => Ok(forward(request, &shared, in_flight, shutdown).await),
        Decision::Delay(delay) => {
            tokio::time::sleep(delay).await;
            Ok(forward(request, &shared, in_flight, shutdown).await)
        }
        Decision::Error { status, message } => {
            // Reading the body first keeps the connection usable for the
            // client's next request, as the daemon's own errors do.
            drain(request.into_body()).await;
            drop(in_flight);
            Ok(docker_error(status, &message))
        }
        Decision::Reset => {
            drain(request.into_body()).await;
            Err(ResetConnection)
        }
    }
}

/// Reads and discards a request body; a client that fails mid-body is
/// simply done.
async fn drain(mut body: Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return;
        }
    }
}

async fn forward(
    mut request: Request<Incoming>,
    shared: &Shared,
    in_flight: InFlight,
    shutdown: watch::Receiver<()>,
) -> Response<ProxyBody> {
    // Taken before the request moves on: hyper hands the client's socket
    // over through this once our 101 answer is written.
    let client_upgrade = hyper::upgrade::on(&mut request);

    let mut sender = match connect(&shared.upstream, shutdown.clone()).await {
        Ok(sender) => sender,
        Err(error) => {
            shared.note_upstream_error();
            return bad_gateway(&shared.upstream, "cannot connect", &error);
        }
    };
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(error) => {
            shared.note_upstream_error();
            return bad_gateway(&shared.upstream, "request failed", &error);
        }
    };
    drop(in_flight);

    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        shared.note_forwarded(false);
        return response.map(BodyExt::boxed_unsync);
    }
    shared.note_forwarded(true);
    let upstream_upgrade = hyper::upgrade::on(&mut response);
    let cut = shared.cut.subscribe();
    spawn_until_shutdown(tunnel(client_upgrade, upstream_upgrade, cut), shutdown);
    // Headers and extensions (hyper keeps Docker's "UPGRADED" reason phrase
    // there) go back unchanged; a 101 has no body.
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, empty())
}

/// Why an upstream connection could not be set up.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Handshake(#[from] hyper::Error),
}

async fn connect(
    upstream: &Path,
    shutdown: watch::Receiver<()>,
) -> Result<client_http1::SendRequest<Incoming>, ConnectError> {
    let stream = UnixStream::connect(upstream).await?;
    let (sender, connection) = client_http1::handshake(TokioIo::new(stream)).await?;
    spawn_until_shutdown(
        async move {
            if let Err(error) = connection.with_upgrades().await {
                debug!(%error, "upstream connection ended");
            }
        },
        shutdown,
    );
    Ok(sender)
}

/// Copies bytes both ways between the two hijacked sockets. When one side
/// shuts down its write half, `copy_bidirectional` shuts down the other's
/// write half and keeps copying the remaining direction — what an exec with
/// stdin needs: the client closes stdin, the daemon still sends output.
/// A bump of `cut` drops both sockets, as a network fault would.
async fn tunnel(client: OnUpgrade, upstream: OnUpgrade, mut cut: watch::Receiver<u64>) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(error) => {
            debug!(%error, "upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    cut.mark_unchanged();
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
            Ok((to_daemon, to_client)) => debug!(to_daemon, to_client, "hijacked connection closed"),
            Err(error) => debug!(%error, "hijacked connection failed"),
        },
        _ = cut.changed() => debug!("hijacked connection cut"),
    }
}
