//! corral as a service: the HTTP API (`corral serve`) and the MCP server
//! (`corral mcp` over stdio, and streamable HTTP at `/mcp` of the service).
//!
//! [`serve`] binds the listeners, mounts [`api::router`] (and the MCP
//! endpoint) behind the token check and the body limit, and on SIGINT or
//! SIGTERM shuts down in order: stop accepting, give requests in flight
//! `server.shutdown_grace_ms`, cancel the rest, then remove every
//! non-persistent sandbox (persistent ones stay for adoption).

pub mod api;
pub mod error;
pub mod mcp;
pub mod metrics;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use corral_core::config::Config;
use corral_docker::{DockerBackend, Provider};
use tokio_util::sync::CancellationToken;

pub use api::{openapi, openapi_yaml, AppState};

/// Where the service listens.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The TCP address (with the real port when 0 was asked for).
    pub tcp: SocketAddr,
    /// The Unix socket, when one was asked for.
    pub unix: Option<String>,
}

/// The whole service over `state`: the API, the MCP endpoint at `/mcp`
/// (when given), the body limit and the token check of the state's
/// configuration.
pub fn app(state: AppState, mcp: Option<(mcp::McpContext, CancellationToken)>) -> axum::Router {
    let server = state.config().server.clone();
    let token: Option<Arc<str>> = server.token.as_deref().map(Arc::from);
    let max_body = usize::try_from(server.max_body_bytes).unwrap_or(usize::MAX);
    let mut router = api::router(state);
    if let Some((ctx, cancel)) = mcp {
        let options = mcp::HttpOptions {
            // The token check guards a wide listen; the Host check is for
            // DNS rebinding against a loopback service.
            allowed_hosts: if server.token.is_some() {
                Vec::new()
            } else {
                mcp::HttpOptions::default().allowed_hosts
            },
            max_body_bytes: max_body,
            ..mcp::HttpOptions::default()
        };
        router = router.nest("/mcp", mcp::http_service_with(ctx, cancel, options));
    }
    router = router.layer(axum::extract::DefaultBodyLimit::max(max_body));
    router.layer(axum::middleware::from_fn_with_state(
        token,
        api::require_token,
    ))
}

/// Runs the service until `shutdown` is cancelled (the CLI cancels it on
/// SIGINT/SIGTERM); `on_bound` is called once the listeners are bound.
/// Non-persistent sandboxes are gone when it returns.
pub async fn serve(
    config: Config,
    backend: DockerBackend,
    provider: Provider,
    default_image: String,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(&Bound),
) -> anyhow::Result<()> {
    let server = &config.server;
    let grace = Duration::from_millis(server.shutdown_grace_ms);
    let mut mcp_spec = match &server.mcp_profile {
        Some(p) => config.profile(p).context("server.mcp_profile")?.clone(),
        None => config.defaults.clone(),
    };
    if mcp_spec.image.is_empty() {
        mcp_spec.image = default_image.clone();
    }
    let state = AppState::new(
        provider.clone(),
        backend.clone(),
        config.clone(),
        default_image,
    );
    let mcp_cancel = shutdown.child_token();
    let mcp = mcp::McpContext {
        provider: provider.clone(),
        spec: mcp_spec,
    };
    let app = app(state.clone(), Some((mcp, mcp_cancel.clone())));

    let tcp = tokio::net::TcpListener::bind(server.listen.trim())
        .await
        .with_context(|| format!("cannot listen on server.listen '{}'", server.listen))?;
    let bound = Bound {
        tcp: tcp.local_addr().context("listener address")?,
        unix: server.unix_socket.clone(),
    };
    let unix = match &server.unix_socket {
        Some(path) => {
            // A socket file left by an earlier service is in the way.
            if std::fs::symlink_metadata(path)
                .map(|m| {
                    use std::os::unix::fs::FileTypeExt;
                    m.file_type().is_socket()
                })
                .unwrap_or(false)
            {
                let _ = std::fs::remove_file(path);
            }
            Some(
                tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on server.unix_socket '{path}'"))?,
            )
        }
        None => None,
    };
    on_bound(&bound);

    let stop = shutdown.clone();
    let tcp_app = app.clone();
    let tcp_server = tokio::spawn(async move {
        axum::serve(tcp, tcp_app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    let unix_server = unix.map(|listener| {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        })
    });

    shutdown.cancelled().await;
    tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down");
    state.close();
    mcp_cancel.cancel();
    let mut servers = vec![tcp_server];
    servers.extend(unix_server);
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
