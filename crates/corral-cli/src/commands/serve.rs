//! `corral serve`: the HTTP API (and MCP over streamable HTTP at `/mcp`).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use corral_core::config::Config;
use corral_docker::host::RealHost;
use corral_docker::{BackendConfig, Provider};
use tokio_util::sync::CancellationToken;

/// Serve corral's HTTP API: sandboxes by session key, commands (JSON or
/// streamed as server-sent events), shell sessions, files, health
/// (/v1/health), Prometheus metrics (/metrics), the OpenAPI document
/// (/openapi.json, /openapi.yaml) and MCP over streamable HTTP (/mcp).
/// Listens on loopback unless told otherwise; beyond loopback a bearer
/// token (config `server.token` or $CORRAL_TOKEN) is required. On SIGINT or
/// SIGTERM, requests in flight get `server.shutdown_grace_ms`, then every
/// non-persistent sandbox is removed.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TCP address to listen on, e.g. 127.0.0.1:7070 (port 0: any free
    /// port). Overrides $CORRAL_LISTEN and the config's `server.listen`
    /// [default: 127.0.0.1:7070].
    #[arg(long, value_name = "IP:PORT")]
    listen: Option<String>,

    /// Also listen on this Unix socket (absolute path). Overrides the
    /// config's `server.unix_socket`.
    #[arg(long, value_name = "PATH")]
    unix_socket: Option<String>,

    /// Print the OpenAPI document (YAML) and exit.
    #[arg(long)]
    openapi: bool,
}

/// Runs `corral serve`.
pub async fn run(
    backend_config: BackendConfig,
    settings: &Config,
    args: ServeArgs,
) -> anyhow::Result<ExitCode> {
    if args.openapi {
        print!("{}", corral_server::openapi_yaml());
        return Ok(ExitCode::SUCCESS);
    }
    let mut config = settings.clone();
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(sock) = args.unix_socket {
        config.server.unix_socket = Some(sock);
    }
    config
        .validate(&RealHost)
        .context("invalid --listen or --unix-socket")?;
    // Signals are caught before anything is created, so an interrupt at
    // any point ends in teardown, not a leak.
    let shutdown = CancellationToken::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot catch SIGTERM")?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("corral serve: shutting down");
        stop.cancel();
    });
    let backend = super::connect(backend_config).await?;
    let provider = Provider::with_persistence_root(
        backend.clone(),
        config.provider.clone(),
        config.persistence_root(&RealHost),
    );
    let image = if config.defaults.image.is_empty() {
        super::default_image()
    } else {
        config.defaults.image.clone()
    };
    let token = config.server.token.is_some();
    corral_server::serve(config, backend, provider, image, shutdown, |bound| {
        eprintln!(
            "corral serve: listening on http://{}{}{}",
            bound.tcp,
            bound
                .unix
                .as_deref()
                .map(|p| format!(" and unix:{p}"))
                .unwrap_or_default(),
            if token {
                " (bearer token required)"
            } else {
                ""
            }
        );
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
