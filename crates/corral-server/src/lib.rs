//! corral as a service: the HTTP API (`corral serve`) and the MCP server
//! (`corral mcp` over stdio, and streamable HTTP at `/mcp` of the service).
//!
//! [`serve`] refuses a listener beyond loopback without authentication
//! (`ServerConfig::check_unauthenticated_reach`), generates a token when
//! none is configured (and writes it for local clients, [`runtime_file`]),
//! binds the listeners, and puts each behind one [`door`]: its [`Guard`]
//! (Host, Origin, credentials), then the budget share
//! ([`ceilings::hold`]), then its routes: [`api::router`] and the MCP
//! endpoint on the API's listeners, [`e2b::router`] on the E2B listener,
//! [`api::port_router`] (port links, nothing else) on a listener of its
//! own. On SIGINT or SIGTERM it shuts
//! down in order: remove the token file, stop accepting, give requests in
//! flight `server.shutdown_grace_ms`, cancel the rest, then remove every
//! sandbox but the persistent ones (they stay for adoption) and those
//! paused to disk (they stay stopped, with their checkpoints; the next
//! service serves them again, paused, before it listens).

pub mod api;
pub mod ceilings;
pub mod dashboard;
pub mod e2b;
pub mod error;
pub mod guard;
pub mod mcp;
pub mod metrics;
pub mod port_links;
pub mod runtime_file;
pub mod tenancy;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use corral::{Provider, Runtime};
use corral_core::config::{AuthMode, Config};
use tokio_util::sync::CancellationToken;

pub use api::{openapi, openapi_yaml, AppState};
pub use guard::{Guard, Listener, PeerUid};

/// Where the service listens.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The TCP address (with the real port when 0 was asked for).
    pub tcp: SocketAddr,
    /// The Unix socket, when one was asked for.
    pub unix: Option<String>,
    /// The E2B-compatible listener (`server.e2b_listen`), when asked for.
    pub e2b: Option<SocketAddr>,
    /// The port-link listener (`server.ports_listen`): port links only,
    /// on an origin of their own.
    pub ports: SocketAddr,
    /// How requests are authenticated.
    pub auth: AuthMode,
    /// The file holding the token the service generated (none when the
    /// token was configured, or with `auth: none`).
    pub token_file: Option<PathBuf>,
}

/// The service's routes over `state`: the API and the MCP endpoint at
/// `/mcp` (when given), without the door (see [`door`], [`app`]).
pub fn routes(state: AppState, mcp: Option<(mcp::McpContext, CancellationToken)>) -> axum::Router {
    let max_body = usize::try_from(state.config().server.max_body_bytes).unwrap_or(usize::MAX);
    let mut router = api::router(state);
    if let Some((ctx, cancel)) = mcp {
        let options = mcp::HttpOptions {
            // The guard in front of everything checks Host (on TCP only:
            // a Unix socket's Host is nominal) and Origin.
            allowed_hosts: Vec::new(),
            max_body_bytes: max_body,
            ..mcp::HttpOptions::default()
        };
        router = router.nest("/mcp", mcp::http_service_with(ctx, cancel, options));
    }
    router
}

/// One door for every listener, built here only: the listener's [`Guard`]
/// (Host, Origin, then its credentials: a request is refused before any of
/// its body is read), then the budget share ([`ceilings::hold`]: the body
/// reserved as it arrives from its principal's share, or its peer's, and
/// cut off at `server.limits.body_timeout_ms`), then the body limit and
/// `routes`. A new listener is a new router behind this same door.
pub fn door(state: &AppState, guard: Guard, routes: axum::Router) -> axum::Router {
    let max_body = usize::try_from(state.config().server.max_body_bytes).unwrap_or(usize::MAX);
    let routes = routes
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            state.ceilings().clone(),
            ceilings::hold,
        ));
    guard.layer(routes)
}

/// The whole service over `state` as one listener serves it: [`routes`]
/// behind the [`door`] of `listener` under the state's configuration,
/// whose `server.token` must be set when `server.auth` is `token`
/// ([`serve`] generates one when it is not).
pub fn app(
    state: AppState,
    mcp: Option<(mcp::McpContext, CancellationToken)>,
    listener: Listener,
) -> axum::Router {
    let guard = Guard::new(&state.config().server, listener);
    door(&state, guard, routes(state.clone(), mcp))
}

/// Runs the service until `shutdown` is cancelled (the CLI cancels it on
/// SIGINT/SIGTERM); `on_bound` is called once the listeners are bound (and
/// a generated token is in its file). Non-persistent sandboxes are gone
/// when it returns.
pub async fn serve(
    mut config: Config,
    runtime: Runtime,
    provider: Provider,
    default_image: String,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(&Bound),
) -> anyhow::Result<()> {
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);
    let generated = match (config.server.auth, &config.server.token) {
        (AuthMode::Token, None) => {
            let token = runtime_file::generate_token()?;
            config.server.token = Some(token.clone());
            Some(token)
        }
        _ => None,
    };
    let server = config.server.clone();
    // However the configuration was made: no listener beyond loopback
    // without authentication.
    server
        .check_unauthenticated_reach()
        .context("refusing to start")?;
    if server.auth == AuthMode::None {
        tracing::warn!(
            listen = %server.listen,
            "server.auth is none: NO AUTHENTICATION. Any local user or process that can \
             connect may create sandboxes and run code in them; set server.auth: token"
        );
    }
    let mut mcp_spec = match &server.mcp_profile {
        Some(p) => config.profile(p).context("server.mcp_profile")?.clone(),
        None => config.defaults.clone(),
    };
    if mcp_spec.image.is_empty() {
        mcp_spec.image = default_image.clone();
    }
    let runtime_dir = config.runtime_dir(&corral::host::RealHost);
    let state = AppState::new(provider.clone(), runtime.clone(), config, default_image);
    // Sandboxes an earlier service paused to disk are served again, paused.
    let recovered = state
        .recover_paused()
        .await
        .context("serving the sandboxes an earlier service paused to disk")?;
    let mcp_cancel = shutdown.child_token();
    let tcp = tokio::net::TcpListener::bind(server.listen.trim())
        .await
        .with_context(|| format!("cannot listen on server.listen '{}'", server.listen))?;
    let tcp_addr = tcp.local_addr().context("listener address")?;
    // Port links get an origin of their own: a page a sandbox serves must
    // never share one with the API or the dashboard.
    let ports_at = match &server.ports_listen {
        Some(addr) => addr.trim().to_string(),
        None => SocketAddr::new(tcp_addr.ip(), 0).to_string(),
    };
    let ports = tokio::net::TcpListener::bind(&ports_at)
        .await
        .with_context(|| format!("cannot listen on server.ports_listen '{ports_at}'"))?;
    let ports_addr = ports.local_addr().context("port-link listener address")?;
    let domain = match &server.ports_domain {
        Some(d) => corral_core::config::PortsDomain::parse(d)
            .map_err(|why| anyhow::anyhow!("server.ports_domain '{d}': {why}"))?,
        None => corral_core::config::PortsDomain::localhost(),
    };
    let origin = port_links::PortOrigin {
        ports: ports_addr,
        api: tcp_addr.ip(),
        domain,
    };
    state.set_port_origin(origin.clone());
    let mcp = mcp::McpContext {
        provider: provider.clone(),
        spec: mcp_spec,
        // Each session acts for the principal of the request that opened it.
        principal: None,
        tenancy: state.tenancy().clone(),
        ceilings: state.ceilings().clone(),
        ports: Some(port_links::PortLinks {
            key: state.port_key().clone(),
            origin: origin.clone(),
        }),
    };
    let routes = routes(state.clone(), Some((mcp, mcp_cancel.clone())));
    let unix = match &server.unix_socket {
        Some(path) => Some(bind_unix(path)?),
        None => None,
    };
    let e2b = match &server.e2b_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr.trim())
                .await
                .with_context(|| format!("cannot listen on server.e2b_listen '{addr}'"))?,
        ),
        None => None,
    };
    let e2b_addr = match &e2b {
        Some(l) => Some(l.local_addr().context("e2b listener address")?),
        None => None,
    };
    let token_file = match &generated {
        Some(token) => Some(runtime_file::TokenFile::write(
            &runtime_dir,
            tcp_addr,
            server.unix_socket.as_deref(),
            token,
        )?),
        None => None,
    };
    let bound = Bound {
        tcp: tcp_addr,
        unix: server.unix_socket.clone(),
        e2b: e2b_addr,
        ports: ports_addr,
        auth: server.auth,
        token_file: token_file.as_ref().map(|f| f.path().to_path_buf()),
    };
    on_bound(&bound);

    let stop = shutdown.clone();
    let tcp_app = door(
        &state,
        Guard::new(&server, Listener::Tcp(tcp_addr)),
        routes.clone(),
    );
    let tcp_server = tokio::spawn(async move {
        axum::serve(
            no_delay(tcp),
            tcp_app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
    });
    let ports_app = door(
        &state,
        Guard::port_links(&server, ports_addr, &origin),
        api::port_router(state.clone()),
    );
    let stop = shutdown.clone();
    let ports_server = tokio::spawn(async move {
        axum::serve(
            ports,
            ports_app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
    });
    let unix_server = unix.map(|(listener, owner)| {
        let stop = shutdown.clone();
        let app = door(
            &state,
            Guard::new(&server, Listener::Unix { owner }),
            routes,
        );
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<PeerUid>(),
            )
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        })
    });

    let e2b_server = e2b.zip(e2b_addr).map(|(listener, addr)| {
        let stop = shutdown.clone();
        // Its own keys and tokens authenticate; Host and browsers are
        // checked as on the main listener.
        let front = e2b::E2b::new(state.clone());
        front.recover(&recovered);
        let app = door(
            &state,
            Guard::e2b(&server, addr, front.clone()),
            e2b::router(front),
        );
        tokio::spawn(async move {
            axum::serve(
                no_delay(listener),
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        })
    });

    shutdown.cancelled().await;
    tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down");
    // New clients find no token for a service on its way out.
    drop(token_file);
    state.close();
    mcp_cancel.cancel();
    let mut servers = vec![tcp_server, ports_server];
    servers.extend(unix_server);
    servers.extend(e2b_server);
    let drained = tokio::time::timeout(grace, async {
        for s in servers.iter_mut() {
            match s.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "listener failed"),
                Err(e) => tracing::warn!(error = %e, "listener task failed"),
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("requests still in flight after the grace period; cancelling them");
        for s in &servers {
            s.abort();
        }
    }
    provider.shutdown().await;
    if let Some(path) = &bound.unix {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Binds the Unix socket at `path` (replacing a socket an earlier service
/// left), made 0600; returns it with its owner's uid, whose connections
/// need no token.
fn bind_unix(path: &str) -> anyhow::Result<(tokio::net::UnixListener, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    if std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
    {
        let _ = std::fs::remove_file(path);
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on server.unix_socket '{path}'"))?;
    // Between bind and chmod another user may connect; the peer check
    // still asks such a connection for the token.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make server.unix_socket '{path}' private"))?;
    let owner = std::fs::metadata(path)
        .with_context(|| format!("cannot inspect server.unix_socket '{path}'"))?
        .uid();
    Ok((listener, owner))
}

/// `listener` with `TCP_NODELAY` on every connection it accepts. A streamed
/// answer (an envd `process.Process/Start`, an `exec/stream`) is several
/// small writes: its headers, then each event. With Nagle's algorithm a
/// small write waits for the ACK of the one before, which a client on a
/// kept-alive connection delays by up to 40 ms; the e2b SDK's
/// `commands.run` paid that on every command.
fn no_delay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt;
    fn set(tcp: &mut tokio::net::TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
    }
    listener.tap_io(set as fn(&mut tokio::net::TcpStream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("should bind");
        let addr = tcp.local_addr().expect("should have an address");
        let mut listener = no_delay(tcp);
        let client = tokio::net::TcpStream::connect(addr);
        let ((io, _), client) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(listener.accept(), client)
        })
        .await
        .expect("should accept within 10 s");
        client.expect("should connect");
        assert!(io.nodelay().expect("should read TCP_NODELAY"));
    }
}
