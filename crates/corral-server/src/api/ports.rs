//! Servers inside sandboxes, reached through the service: a web app under
//! test, a notebook, a dev server.
//!
//! `GET /v1/sandboxes/{id}/ports/{port}` (the sandbox's owner only, as
//! every sandbox route) answers a link,
//! `http://PORT-SANDBOXID.DOMAIN:LISTENPORT/TOKEN/`, where `token` is an
//! HMAC of the sandbox's provider key, its sandbox id and the port under a
//! key the service makes at start: it opens that port of that sandbox and
//! nothing else (another port, another sandbox, the same key's next
//! sandbox), and lives as long as the service and the sandbox. The link
//! needs no bearer token, so a browser or a tool that cannot set headers
//! can follow it.
//!
//! Each link is an origin of its own (its host name, see
//! [`port_links::PortOrigin`]), served by the port-link listener only
//! (`server.ports_listen`, [`crate::api::port_router`]), which routes by
//! `Host`: a page a sandbox serves shares cookies, storage, service
//! workers, caches and `clients` with no other sandbox's page, port, the
//! API or the dashboard. A program that cannot resolve the link's name
//! (glibc does not resolve `*.localhost`; curl and browsers do) connects to
//! the listener (`connect` in the answer) and sends that name as `Host`.
//! The proxy sends the sandbox no credential meant for something else
//! ([`port_links::DROPPED_REQUEST_HEADERS`]) and no cookie its server did
//! not set ([`port_links::CookieNames`]), and drops the response headers
//! that would reach beyond a link's pages
//! ([`port_links::DROPPED_RESPONSE_HEADERS`]).
//!
//! The proxy speaks HTTP/1.1 to the server over a connection the backend
//! opens ([`corral::Sandbox::open_port`]: the sandbox's address, or an
//! exec into its network namespace when it has none), one per request,
//! with the link's token taken off the path (`X-Forwarded-Prefix` says
//! what it was); responses stream as the server writes them, and an
//! upgrade (WebSocket) becomes a two-way byte pipe. A sandbox reached this
//! way gains no egress: nothing is opened from inside it.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;

use super::AppState;
use crate::error::ApiError;
use crate::guard::Caller;
use crate::port_links;
use crate::wire::{ErrorBody, PortLink};

/// A port number from a path, or a 400 naming it.
fn parse_port(port: &str) -> Result<u16, ApiError> {
    port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        ApiError::invalid("port", format!("port '{port}' is not a port (1 to 65535)"))
    })
}

/// A link to a port of a sandbox: its URL through this service, and the
/// token in it. The token opens only this port of this sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/ports/{port}", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id"), ("port" = u16, Path, description = "A port a server listens on inside the sandbox (1 to 65535)")),
    responses(
        (status = 200, body = PortLink),
        (status = 400, description = "Not a port", body = ErrorBody),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 410, description = "The sandbox's container is lost", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
        (status = 503, description = "The service has no port-link listener", body = ErrorBody),
    )
)]
pub(super) async fn port_link(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path((id, port)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Json<PortLink>, ApiError> {
    let port = parse_port(&port)?;
    let lease = s.lease(&caller, &id).await?;
    let Some(origin) = s.port_origin() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unsupported",
            "this service has no port-link listener (server.ports_listen): it hands out no links"
                .to_string(),
        ));
    };
    if !port_links::id_fits_a_host_name(lease.id()) {
        return Err(ApiError::invalid(
            "id",
            format!(
                "sandbox id '{}' cannot stand in a host name, which a port link is",
                lease.id()
            ),
        ));
    }
    let token = s.inner.port_key.link_token(lease.key(), lease.id(), port);
    // The guard checked Host: it is one of this service's names.
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let link = origin.link(lease.id(), port, &token, host);
    Ok(Json(PortLink {
        port,
        url: link.url,
        host: link.host,
        connect: link.connect,
        path: link.path,
        token,
    }))
}

/// The proxy: every request to the port-link listener whose `Host` is a
/// link's (the listener's own names get [`not_a_link`]).
pub(super) async fn proxy(State(s): State<AppState>, req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    let Some(origin) = s.port_origin() else {
        return not_a_link();
    };
    let Some((port, id)) = host.as_deref().and_then(|h| origin.of_host(h)) else {
        return not_a_link();
    };
    let id = id.to_string();
    let path = req.uri().path();
    let (token, rest) = match path.trim_start_matches('/').split_once('/') {
        Some((token, rest)) => (token.to_string(), rest.to_string()),
        None => (path.trim_start_matches('/').to_string(), String::new()),
    };
    forward(s, id, port, token, rest, req).await
}

/// What the port-link listener answers a `Host` that is no link's.
fn not_a_link() -> Response {
    ApiError::not_found(
        "this is the port-link listener: it serves port links only, each under a host name of \
         its own (PORT-SANDBOXID.DOMAIN; a program that cannot resolve it sends it as Host); \
         the API and the dashboard are on the service's own listener",
    )
    .into_response()
}

/// The link is not (or no longer) good: one answer for every reason, so a
/// guess learns nothing about which sandboxes exist.
fn refused() -> Response {
    let mut e = ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this port link is not valid (a wrong token, another sandbox's or port's, or the \
         sandbox is gone): ask GET /v1/sandboxes/{id}/ports/{port} for one"
            .to_string(),
    );
    e.detail.field = Some("token".into());
    e.into_response()
}

fn bad_gateway(message: String) -> Response {
    ApiError::new(StatusCode::BAD_GATEWAY, "port_unreachable", message).into_response()
}

async fn forward(
    s: AppState,
    id: String,
    port: u16,
    token: String,
    rest: String,
    mut req: Request,
) -> Response {
    if s.refuse_when_closing().is_err() {
        return refused();
    }
    let keys = &s.inner.port_key;
    // Only a sandbox a link was made for; looked up without creating
    // anything: a link never starts a sandbox.
    let Some(key) = keys.key_of(&id) else {
        return refused();
    };
    let lease = match s.inner.provider.lease(&key).await {
        Some(Ok(lease)) if lease.sandbox().id() == id => lease,
        Some(Ok(_)) | None => {
            keys.forget(&id);
            s.port_cookies().forget(&id);
            return refused();
        }
        Some(Err(_)) => return refused(),
    };
    let sandbox = lease.sandbox();
    if !keys.verify(&key, &id, port, &token) {
        return refused();
    }
    for name in port_links::DROPPED_REQUEST_HEADERS {
        req.headers_mut().remove(name);
    }
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let wait = std::time::Duration::from_millis(s.ceilings().limits().backend_timeout_ms);
    relay(
        &sandbox,
        port,
        format!("/{rest}{query}"),
        Some(format!("/{token}")),
        req,
        wait,
        s.port_cookies(),
    )
    .await
}

/// Sends `req` to `port` of `sandbox` at `path_and_query` over a
/// connection of its own, and its response back as the server writes it
/// (an upgrade becomes a two-way byte pipe). `Host` becomes
/// `localhost:PORT`; `prefix`, when the client's path had one, is sent as
/// `X-Forwarded-Prefix`. Who may reach the port is the caller's check.
/// A server that has not started its answer within `wait`
/// (`server.limits.backend_timeout_ms`) is given up on: 504. Only the
/// cookies the port's server set go to it, and its cookies stay on the
/// link's host name (`cookies`).
pub(crate) async fn relay(
    sandbox: &corral::Sandbox,
    port: u16,
    path_and_query: String,
    prefix: Option<String>,
    req: Request,
    wait: std::time::Duration,
    cookies: &port_links::CookieNames,
) -> Response {
    let answer = relay_until_answered(sandbox, port, path_and_query, prefix, req, cookies);
    match tokio::time::timeout(wait, answer).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "port_timeout",
            format!(
                "port {port} of the sandbox did not start its answer within {} ms \
                 (server.limits.backend_timeout_ms)",
                wait.as_millis()
            ),
        )
        .into_response(),
    }
}

async fn relay_until_answered(
    sandbox: &corral::Sandbox,
    port: u16,
    path_and_query: String,
    prefix: Option<String>,
    mut req: Request,
    cookies: &port_links::CookieNames,
) -> Response {
    let stream = match sandbox.open_port(port).await {
        Ok(stream) => stream,
        Err(e) => return bad_gateway(e.to_string()),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return bad_gateway(format!("port {port}: {e}")),
    };
    let sandbox_id = sandbox.id().to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(sandbox = %sandbox_id, port, error = %e, "port connection ended");
        }
    });
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .is_some()
        .then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = match path_and_query.parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => {
            return ApiError::invalid("path", format!("'{path_and_query}' is not a path: {e}"))
                .into_response()
        }
    };
    parts.version = axum::http::Version::HTTP_11;
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{port}")) {
        parts.headers.insert(header::HOST, host);
    }
    if let Some(p) = prefix.and_then(|p| HeaderValue::from_str(&p).ok()) {
        parts.headers.insert("x-forwarded-prefix", p);
    }
    cookies.filter_request(sandbox.id(), port, &mut parts.headers);
    let upstream = axum::http::Request::from_parts(parts, body);
    let mut response = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => {
            return bad_gateway(format!(
                "port {port} of the sandbox did not answer (nothing listens there, or the server \
                 closed the connection): {e}"
            ))
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client) = upgrade {
            let server = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match (client.await, server.await) {
                    (Ok(client), Ok(server)) => {
                        let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(server));
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                    (c, s) => tracing::debug!(
                        client = c.is_ok(),
                        server = s.is_ok(),
                        "a port's upgrade did not complete"
                    ),
                }
            });
        }
    }
    let (mut parts, body) = response.into_parts();
    for name in port_links::DROPPED_RESPONSE_HEADERS {
        parts.headers.remove(name);
    }
    cookies.learn_response(sandbox.id(), port, &mut parts.headers);
    Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_numbers_from_1() {
        assert_eq!(parse_port("8080").ok(), Some(8080));
        for bad in ["0", "65536", "http", ""] {
            let e = parse_port(bad).expect_err("refused");
            assert_eq!(e.detail.field.as_deref(), Some("port"), "{bad}");
        }
    }
}
