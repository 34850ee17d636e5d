//! The service's front door: every request, to the REST API and to MCP at
//! `/mcp` alike, passes these checks before any handler sees it.
//!
//! 1. `Host` (TCP listeners): the listen address, on loopback also
//!    `localhost`, `127.0.0.1` and `[::1]`, with the listen port, plus
//!    `server.allowed_hosts`. A DNS-rebinding page reaches a loopback
//!    service under its own host name, so it stops here. A Unix socket has
//!    no host names to rebind and skips this check.
//! 2. Browsers: a request with an `Origin` header not in
//!    `server.allowed_origins`, or without one but marked by the browser as
//!    cross-site (`Sec-Fetch-Site`), is refused. A web page can send a
//!    `text/plain` POST to loopback without a CORS preflight; this is what
//!    makes that harmless even with `auth: none`. On the API's own
//!    listeners an `Origin` that is the request's own (`http://` or
//!    `https://` and the `Host` that passed check 1) is the service's own
//!    page, the dashboard, as `Sec-Fetch-Site: same-origin` is: no page of
//!    a sandbox is ever served on that origin (port links have their own).
//! 3. Authentication (all but `/v1/health` and the dashboard's page, which
//!    holds no data and asks for the token in a form): the bearer token, compared in
//!    constant time with every configured token, decides the request's
//!    [`Principal`] (`server.admin_token`: the operator; `server.token`:
//!    tenant `default`; `server.tenants.NAME.token`: tenant `NAME`); on the
//!    Unix socket, a connection whose peer (as the kernel reports it,
//!    `SO_PEERCRED`) is the socket's owner needs none and is the operator.
//!    With `auth: none` every request is tenant `default`. The principal
//!    goes into the request's extensions for the routes ([`Caller`]).
//! 4. MCP POSTs must be `application/json` (the REST routes check theirs
//!    where they read JSON, in `api::JsonBody`).
//!
//! The E2B-compatible listener (`server.e2b_listen`, [`Guard::e2b`])
//! passes checks 1 and 2 the same way (a rebinding page or a cross-site
//! request is refused there as here), and check 3 with E2B's credentials
//! (`E2b::admit`: an API key, a sandbox's access token, a signed URL):
//! a request that carries a body and none of them is refused 401 before
//! any of its body is read. The routes still check which sandbox a
//! credential opens.
//!
//! The port-link listener (`server.ports_listen`, [`Guard::port_links`])
//! serves port links only (see `api/ports.rs`), each under a host name of
//! its own, `PORT-SANDBOXID.DOMAIN`: its requests pass the Host check only
//! (the listener's names, or a link's under the links' domain), the link's
//! own token being their authentication and the pages a sandbox's server
//! answers there being meant for browsers. Its requests, and those the
//! E2B listener relays to a sandbox's port, are marked
//! [`crate::ceilings::Relayed`]: their bodies stream on.
//!
//! Every listener is built by [`crate::door`]: this guard, then the budget
//! share ([`crate::ceilings::hold`]), then the routes; a new listener is a
//! new router behind the same door. The API's listeners serve no
//! port link at all, so no page a sandbox controls ever shares an origin
//! with the API, the dashboard or another link (where a service worker or
//! a script of it would see a token).
//!
//! Refusals are JSON errors naming the header at fault: 403 for Host and
//! Origin, 401 for authentication, 415 for the content type.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use corral_core::config::{AuthMode, ServerConfig};
use corral_core::principal::{Principal, DEFAULT_TENANT};

use crate::error::ApiError;

/// The route every client may call without a token (health probes).
const HEALTH: &str = "/v1/health";

/// The dashboard's page: static, no data in it; it asks for the token in
/// a form (never in its address, which a browser keeps in its history) and
/// sends it as any client does.
const DASHBOARD: &str = "/dashboard";

/// Where requests come in: decides the Host check and whether the peer's
/// uid may stand in for the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// A TCP listener bound to this address (the real port).
    Tcp(SocketAddr),
    /// A Unix socket owned by this uid.
    Unix {
        /// The socket file's owner: connections from this uid need no token.
        owner: u32,
    },
}

/// The uid of a Unix socket connection's peer, as the kernel reports it;
/// `None` when it could not be read (then the token is required).
#[derive(Debug, Clone, Copy)]
pub struct PeerUid(pub Option<u32>);

impl Connected<IncomingStream<'_, tokio::net::UnixListener>> for PeerUid {
    fn connect_info(stream: IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        PeerUid(stream.io().peer_cred().ok().map(|c| c.uid()))
    }
}

/// How requests are authenticated.
#[derive(Clone)]
enum Auth {
    /// The bearer tokens of the service's principals.
    Tokens(Arc<ServerConfig>),
    /// `auth: token` but no token was given: refuse everything (fail closed).
    Missing,
    /// `auth: none`.
    Off,
}

/// Who a request acts as, put in its extensions by the [`Guard`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub Principal);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        // Fail closed: a route reached without the guard acts as no one.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("this request was not authenticated"))
    }
}

/// The checks of one listener, built from the configuration.
#[derive(Clone)]
pub struct Guard {
    listener: Listener,
    auth: Auth,
    origins: Arc<[String]>,
    hosts: Arc<[String]>,
    /// Also accept E2B's sandbox addressing, `PORT-ID.HOST` for an allowed
    /// `HOST` (the E2B listener behind a wildcard proxy).
    sandbox_hosts: bool,
    /// The port-link listener: the Host check only.
    port_links: bool,
    /// The links' domain on the port-link listener: `PORT-ID.DOMAIN` is
    /// one of its names.
    link_domain: Option<Arc<str>>,
    /// The E2B listener: its own credentials (`E2b::admit`).
    e2b: Option<crate::e2b::E2b>,
}

impl Guard {
    /// The checks for `listener` under `server` (whose `token` must be set,
    /// generated if need be, when `auth` is `token`: without one every
    /// request but the health check is refused).
    pub fn new(server: &ServerConfig, listener: Listener) -> Guard {
        let auth = match server.auth {
            AuthMode::None => Auth::Off,
            AuthMode::Token if server.has_tokens() => Auth::Tokens(Arc::new(server.clone())),
            AuthMode::Token => Auth::Missing,
        };
        Guard {
            listener,
            auth,
            origins: server
                .allowed_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            hosts: server
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            sandbox_hosts: false,
            port_links: false,
            link_domain: None,
            e2b: None,
        }
    }

    /// The checks of the E2B listener at `addr` over `e2b`: Host (E2B's
    /// `PORT-ID.HOST` too, for an allowed `HOST`: a rebinding page's own
    /// name is still not one), browsers, and E2B's credentials.
    pub fn e2b(server: &ServerConfig, addr: SocketAddr, e2b: crate::e2b::E2b) -> Guard {
        Guard {
            sandbox_hosts: true,
            e2b: Some(e2b),
            ..Guard::new(server, Listener::Tcp(addr))
        }
    }

    /// The checks of the port-link listener at `addr`: its Host only (the
    /// same names as any listener's, with its own port, and a link's,
    /// `PORT-ID.DOMAIN` under `origin`'s domain). A link's token is its
    /// authentication, checked by the proxy; the listener serves nothing
    /// else.
    pub fn port_links(
        server: &ServerConfig,
        addr: SocketAddr,
        origin: &crate::port_links::PortOrigin,
    ) -> Guard {
        Guard {
            port_links: true,
            link_domain: Some(origin.domain.domain.as_str().into()),
            ..Guard::new(server, Listener::Tcp(addr))
        }
    }

    /// Wraps `router` in these checks (as [`crate::door`] does, outermost).
    pub fn layer(self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(self, check))
    }

    fn check_host(&self, req: &Request) -> Result<(), ApiError> {
        let Listener::Tcp(addr) = self.listener else {
            return Ok(());
        };
        let refuse = |value: &str, why: &str| {
            Err(ApiError::forbidden(
                "Host",
                format!("Host '{value}' refused: {why}"),
            ))
        };
        // Two Host headers could be read differently by a proxy in front.
        if req.headers().get_all(header::HOST).iter().count() > 1 {
            return refuse("(several)", "a request names one host");
        }
        let given = req
            .headers()
            .get(header::HOST)
            .map(|v| v.to_str().map(str::to_string))
            .or_else(|| req.uri().authority().map(|a| Ok(a.to_string())));
        let host = match given {
            None => return refuse("", "a request must name the host it is for"),
            Some(Err(_)) => return refuse("(not text)", "not a host name"),
            Some(Ok(h)) => h.to_ascii_lowercase(),
        };
        let sandbox_host = || {
            let (label, rest) = host.split_once('.')?;
            let (port, id) = label.split_once('-')?;
            (port.parse::<u16>().is_ok() && !id.is_empty()).then_some(rest)
        };
        let link = |domain: &str| crate::port_links::of_host(&host, domain).is_some();
        let allowed = host_allowed(&host, addr, &self.hosts)
            || self.link_domain.as_deref().is_some_and(link)
            || (self.sandbox_hosts
                && sandbox_host().is_some_and(|rest| host_allowed(rest, addr, &self.hosts)));
        if allowed {
            Ok(())
        } else {
            refuse(
                &host,
                &format!(
                    "this service answers to {} (add other names to server.allowed_hosts)",
                    listen_names(addr).join(", ")
                ),
            )
        }
    }

    fn check_browser(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let mut origins = headers.get_all(header::ORIGIN).iter().peekable();
        if origins.peek().is_some() {
            // The request's own origin: the service's page (the Host was
            // checked first). Where sandboxes' host names are served (the
            // E2B listener), only a page of a sandbox's port posting to
            // itself: relayed to that same port, never to the API or envd.
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_ascii_lowercase);
            let own = match (&self.listener, self.sandbox_hosts) {
                (Listener::Tcp(_), false) => host,
                (Listener::Tcp(_), true) => {
                    host.filter(|h| crate::e2b::relayed_to_its_port(h, headers))
                }
                _ => None,
            };
            let is_own = |origin: &str| {
                own.as_deref().is_some_and(|host| {
                    origin
                        .strip_prefix("http://")
                        .or_else(|| origin.strip_prefix("https://"))
                        == Some(host)
                })
            };
            // Every Origin given must be allowed (a browser sends one).
            for origin in origins {
                let text = origin.to_str().unwrap_or("(not text)");
                let normalized = text.trim_end_matches('/').to_ascii_lowercase();
                if !self.origins.contains(&normalized) && !is_own(&normalized) {
                    return Err(ApiError::forbidden(
                        "Origin",
                        format!(
                            "Origin '{text}' refused: requests from web pages are refused unless \
                             server.allowed_origins lists their origin"
                        ),
                    ));
                }
            }
            return Ok(());
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = site.to_str().unwrap_or("(not text)");
            if !matches!(site, "same-origin" | "none") {
                return Err(ApiError::forbidden(
                    "Sec-Fetch-Site",
                    format!("Sec-Fetch-Site '{site}' refused: a browser sent this request for another site"),
                ));
            }
        }
        Ok(())
    }

    /// Who the request acts as, or why it is refused. `/v1/health` needs
    /// no token and acts as no one.
    fn check_auth(&self, req: &Request) -> Result<Option<Principal>, ApiError> {
        if req.uri().path() == HEALTH || req.uri().path() == DASHBOARD {
            return Ok(None);
        }
        if let Listener::Unix { owner } = self.listener {
            let peer = req
                .extensions()
                .get::<ConnectInfo<PeerUid>>()
                .and_then(|c| c.0 .0);
            if peer == Some(owner) {
                return Ok(Some(Principal::Operator));
            }
        }
        let server = match &self.auth {
            Auth::Off => return Ok(Some(Principal::Tenant(DEFAULT_TENANT.into()))),
            Auth::Missing => {
                return Err(ApiError::unauthorized(
                    "this service has no token to check (server.auth is token but no \
                     server.token was set or generated): every request is refused",
                ))
            }
            Auth::Tokens(server) => server,
        };
        let from_header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .map(str::to_string);
        let given = from_header.as_deref();
        match given {
            Some(g) => match server.principal_of_token(g) {
                Some(p) => Ok(Some(p)),
                None => Err(ApiError::unauthorized(
                    "the bearer token is wrong (a service that generated its token writes it to \
                     a file in its runtime directory; see `corral serve --help`)",
                )),
            },
            None => Err(ApiError::unauthorized(
                "this service requires 'Authorization: Bearer TOKEN' (the Python client finds \
                 the token of a local service by itself; else set CORRAL_TOKEN)",
            )),
        }
    }
}

/// Who a request acts as once past the door, and whether its body streams
/// on to a sandbox (a relay).
pub(crate) struct Admitted {
    /// The principal its credential names; `None`: no credential (the
    /// health check, a port link, a public E2B port, or a request without a
    /// body that the route authenticates itself).
    pub principal: Option<Principal>,
    /// Its body streams on to a sandbox's server.
    pub relayed: bool,
}

/// Whether `req` carries a body (one the door must not let a handler read
/// before its sender is known): hyper's body of a request without
/// `Content-Length` or `Transfer-Encoding`, or with a length of 0, ends
/// before it starts.
pub(crate) fn has_body(req: &Request) -> bool {
    use axum::body::HttpBody;
    !req.body().is_end_stream()
}

impl Guard {
    /// The checks of this listener, in order; the refusal as it is answered.
    fn admit(&self, req: &Request) -> Result<Admitted, Box<Response>> {
        self.check_host(req).map_err(refused(req))?;
        if self.port_links {
            return Ok(Admitted {
                principal: None,
                relayed: true,
            });
        }
        self.check_browser(req.headers()).map_err(refused(req))?;
        if let Some(e2b) = &self.e2b {
            return e2b.admit(req);
        }
        let principal = self.check_auth(req).map_err(refused(req))?;
        check_mcp_content_type(req).map_err(refused(req))?;
        Ok(Admitted {
            principal,
            relayed: false,
        })
    }
}

/// Logs a refusal at the door and answers it.
fn refused(req: &Request) -> impl FnOnce(ApiError) -> Box<Response> + '_ {
    move |e| {
        // A 403 is a browser or a rebinding page at the door; a 401 or
        // 415 is more likely a misconfigured client.
        let (method, path) = (req.method(), req.uri().path());
        let field = e.detail.field.as_deref().unwrap_or_default();
        if e.status == axum::http::StatusCode::FORBIDDEN {
            tracing::warn!(%method, path, field, "request refused: {}", e.detail.message);
        } else {
            tracing::info!(%method, path, field, status = e.status.as_u16(), "request refused: {}", e.detail.message);
        }
        Box::new(e.into_response())
    }
}

/// The middleware: the checks in order (Host, browsers, credentials, MCP's
/// content type), then the budget share and the route. Nothing of a
/// request's body is read here.
async fn check(State(guard): State<Guard>, mut req: Request, next: Next) -> Response {
    let admitted = match guard.admit(&req) {
        Ok(a) => a,
        Err(refusal) => return *refusal,
    };
    // Set here only: a client cannot put them in by a header.
    req.extensions_mut().remove::<Caller>();
    req.extensions_mut().remove::<crate::ceilings::Relayed>();
    if let Some(p) = admitted.principal {
        req.extensions_mut().insert(Caller(p));
    }
    if admitted.relayed {
        req.extensions_mut().insert(crate::ceilings::Relayed);
    }
    next.run(req).await
}

/// MCP messages are JSON; anything else is refused before rmcp reads it.
fn check_mcp_content_type(req: &Request) -> Result<(), ApiError> {
    let path = req.uri().path();
    if req.method() != Method::POST || !(path == "/mcp" || path.starts_with("/mcp/")) {
        return Ok(());
    }
    require_json(req.headers(), true)
}

/// Requires `Content-Type: application/json` on a request that carries a
/// body (`has_body`); one without a body may leave it out.
pub fn require_json(headers: &HeaderMap, has_body: bool) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE) {
        None if !has_body => Ok(()),
        None => Err(ApiError::unsupported_media_type(
            "a JSON body needs 'Content-Type: application/json' (none was given)",
        )),
        Some(v) => {
            let text = v.to_str().unwrap_or("(not text)");
            let essence = text.split(';').next().unwrap_or_default().trim();
            if essence.eq_ignore_ascii_case("application/json") {
                Ok(())
            } else {
                Err(ApiError::unsupported_media_type(format!(
                    "Content-Type '{text}' refused: this request carries JSON and must say \
                     'application/json'"
                )))
            }
        }
    }
}

/// The names a TCP listener answers to, for messages.
fn listen_names(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let ip = addr.ip();
    let mut names = vec![format!("{}:{port}", host_of(ip))];
    if ip.is_loopback() {
        for n in ["localhost", "127.0.0.1", "[::1]"] {
            let name = format!("{n}:{port}");
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    if ip.is_unspecified() {
        names.push(format!("localhost:{port}"));
        names.push(format!("any IP address:{port}"));
    }
    names
}

pub(crate) fn host_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// Whether `host` (a lower-case `Host` header) names this listener. A
/// rebinding attack needs a DNS name, so IP literals are safe on an
/// unspecified (all-interfaces) listen address.
fn host_allowed(host: &str, addr: SocketAddr, extra: &[String]) -> bool {
    let (name, port) = split_host(host);
    if extra
        .iter()
        .any(|e| e == host || (e.as_str() == name && !e.contains(':')))
    {
        return true;
    }
    if port.unwrap_or(80) != addr.port() {
        return false;
    }
    let ip = addr.ip();
    if name == host_of(ip) {
        return true;
    }
    if (ip.is_loopback() || ip.is_unspecified())
        && matches!(name, "localhost" | "127.0.0.1" | "[::1]")
    {
        return true;
    }
    if ip.is_unspecified() {
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        return bare.parse::<IpAddr>().is_ok();
    }
    false
}

/// `name[:port]`, with IPv6 literals kept in brackets. A port that is not
/// a number counts as none that matches.
pub(crate) fn split_host(host: &str) -> (&str, Option<u16>) {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((_, tail)) => {
                let name = &host[..host.len() - tail.len()];
                (name, tail.strip_prefix(':'))
            }
            None => (host, None),
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    match port {
        None => (name, None),
        Some(p) => (name, Some(p.parse().unwrap_or(0))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn hosts_are_the_listen_address_and_loopback_names() {
        let lo = addr("127.0.0.1:7070");
        for ok in ["127.0.0.1:7070", "localhost:7070", "[::1]:7070"] {
            assert!(host_allowed(ok, lo, &[]), "{ok}");
        }
        for bad in [
            "evil.example:7070",
            "localhost:7071",
            "localhost",
            "127.0.0.1",
            "127.0.0.2:7070",
            "localhost.evil.example:7070",
            "",
            "[::1",
            "localhost:70x0",
        ] {
            assert!(!host_allowed(bad, lo, &[]), "{bad}");
        }
        let extra = ["corral.internal:7070".to_string(), "box".to_string()];
        assert!(host_allowed("corral.internal:7070", lo, &extra));
        assert!(!host_allowed("corral.internal:8080", lo, &extra));
        assert!(host_allowed("box:1234", lo, &extra));
        let v6 = addr("[::1]:80");
        assert!(host_allowed("[::1]", v6, &[]));
        assert!(host_allowed("localhost", v6, &[]));
        let any = addr("0.0.0.0:7070");
        assert!(host_allowed("10.1.2.3:7070", any, &[]));
        assert!(host_allowed("[fe80::1]:7070", any, &[]));
        assert!(!host_allowed("rebind.evil.example:7070", any, &[]));
        let lan = addr("10.1.2.3:7070");
        assert!(host_allowed("10.1.2.3:7070", lan, &[]));
        assert!(!host_allowed("localhost:7070", lan, &[]));
    }

    #[test]
    fn json_content_types() {
        let mut h = HeaderMap::new();
        assert!(require_json(&h, false).is_ok());
        assert_eq!(
            require_json(&h, true).expect_err("no type").status.as_u16(),
            415
        );
        h.insert(header::CONTENT_TYPE, "text/plain".parse().expect("value"));
        assert!(require_json(&h, false).is_err());
        h.insert(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().expect("value"),
        );
        assert!(require_json(&h, true).is_ok());
    }

    #[test]
    fn tokens_name_their_principals_and_compare_whole() {
        let mut server = ServerConfig {
            token: Some("secret".into()),
            admin_token: Some("admin".into()),
            ..ServerConfig::default()
        };
        server.tenants.insert(
            "alice".into(),
            corral_core::config::TenantConfig {
                token: Some("alice-t".into()),
                ..Default::default()
            },
        );
        let p = |t: &str| server.principal_of_token(t);
        assert_eq!(p("secret"), Some(Principal::Tenant(DEFAULT_TENANT.into())));
        assert_eq!(p("admin"), Some(Principal::Operator));
        assert_eq!(p("alice-t"), Some(Principal::Tenant("alice".into())));
        for wrong in ["secreT", "secret2", "", "alice"] {
            assert_eq!(p(wrong), None, "{wrong}");
        }
    }
}
