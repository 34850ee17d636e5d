//! `corral serve`: the HTTP API (and MCP over streamable HTTP at `/mcp`).

use std::process::ExitCode;

use crate::commands::BackendConfig;
use anyhow::Context;
use clap::Args;
use corral::host::RealHost;
use corral::Provider;
use corral_core::config::{AuthMode, Config};
use tokio_util::sync::CancellationToken;

use crate::progress::{self, Progress};

/// Serve the HTTP API (with SSE, OpenAPI, metrics) and MCP over HTTP.
///
/// Serve corral's HTTP API: sandboxes by session key, commands (JSON or
/// streamed as server-sent events), shell sessions, files, health
/// (/v1/health), Prometheus metrics (/metrics), the OpenAPI document
/// (/openapi.json, /openapi.yaml) and MCP over streamable HTTP (/mcp).
///
/// Listens on loopback unless told otherwise. Every request but /v1/health
/// needs a bearer token: `server.token` or $CORRAL_TOKEN, else one
/// generated at start and written (mode 0600, removed at shutdown) to
/// server-IP-PORT.json in the runtime directory ($CORRAL_RUNTIME_DIR,
/// `server.runtime_dir`, else $XDG_RUNTIME_DIR/corral/servers, else
/// ~/.local/share/corral/runtime), where the Python client finds it. On the
/// Unix socket (made 0600) the socket owner's connections need no token.
///
/// The token names who a request acts as: `server.admin_token` (and the
/// Unix socket's owner) is the operator, who sees everything; `server.token`
/// is tenant `default`; each `server.tenants.NAME.token` is tenant NAME,
/// with its own sandboxes, session keys and snapshots (another's are
/// answered 404) and quotas (a spent one is a retryable 503 `capacity`).
/// An MCP session at /mcp acts for the tenant whose token opened it, on its
/// own sandbox and snapshots only (plus `server.mcp_snapshots`).
///
/// Requests from web pages (an Origin not in `server.allowed_origins`) and
/// for other host names (a Host not the listen address or in
/// `server.allowed_hosts`) are refused, JSON must be sent as
/// application/json, and what a client may put in a sandbox spec is limited
/// by `server.policy` (host mounts, added capabilities, weakened hardening,
/// runtime changes, host environment and persistent sandboxes are refused;
/// profiles in the config are trusted). `server.auth: none` turns
/// authentication off (loopback only; logged as a warning).
///
/// On SIGINT or SIGTERM, requests in flight get `server.shutdown_grace_ms`,
/// then every sandbox is removed but persistent ones and those paused to
/// disk: a paused one stays stopped, with its checkpoint, and the next
/// `corral serve` serves it again (resume restores it).
///
/// On a terminal a progress bar counts the warm pools' sandboxes
/// (`provider.pools`) until they are all started (--quiet: none).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TCP address to listen on, e.g. 127.0.0.1:7070 (port 0: any free
    /// port). Overrides $CORRAL_LISTEN and the config's `server.listen`
    /// [default: 127.0.0.1:7070].
    #[arg(long, value_name = "IP:PORT")]
    listen: Option<String>,

    /// Also listen on this Unix socket (absolute path), made 0600: its
    /// owner's connections need no token, anyone else's do. Overrides the
    /// config's `server.unix_socket`.
    #[arg(long, value_name = "PATH")]
    unix_socket: Option<String>,

    /// Let clients use (and have pulled when missing) images matching
    /// PATTERN (`python:*`, `registry.example/swe/*`, or one reference);
    /// repeatable. Adds to the config's `server.policy.images`; without
    /// any, clients may use only images already on the daemon.
    #[arg(long, value_name = "PATTERN")]
    allow_image: Vec<String>,

    /// Also serve the E2B-compatible API (control plane and envd, for the
    /// `e2b` SDK with E2B_API_URL and E2B_SANDBOX_URL both set to
    /// http://IP:PORT) on this address (port 0: any free port). Overrides
    /// the config's `server.e2b_listen`.
    #[arg(long, value_name = "IP:PORT")]
    e2b_listen: Option<String>,

    /// Serve port links (`GET /v1/sandboxes/{id}/ports/{port}`) on this
    /// address, which serves nothing else; each link has a host name, so
    /// an origin, of its own (`PORT-SANDBOXID.localhost`, or under
    /// `server.ports_domain`), so a page a sandbox serves never shares an
    /// origin with another sandbox, the API or the dashboard (port 0: any
    /// free port; default: the listen IP, a free port). Overrides the
    /// config's `server.ports_listen`.
    #[arg(long, value_name = "IP:PORT")]
    ports_listen: Option<String>,

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
    if let Some(ports) = args.ports_listen {
        config.server.ports_listen = Some(ports);
    }
    if let Some(e2b) = args.e2b_listen {
        config.server.e2b_listen = Some(e2b);
    }
    config.server.policy.images.extend(args.allow_image);
    config.validate(&RealHost).context(
        "invalid --listen, --unix-socket, --ports-listen, --e2b-listen or --allow-image",
    )?;
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
    let pools = (progress::wanted(false), provider.clone(), shutdown.clone());
    corral_server::serve(config, backend, provider, image, shutdown, |bound| {
        let unix = bound
            .unix
            .as_deref()
            .map(|p| format!(" and unix:{p} (0600; its owner needs no token)"))
            .unwrap_or_default();
        let auth = match (bound.auth, &bound.token_file) {
            (AuthMode::None, _) => {
                " WITHOUT AUTHENTICATION (server.auth: none): any local process may run code"
                    .to_string()
            }
            (AuthMode::Token, Some(file)) => format!(
                " (bearer token required; generated, in {}: local clients find it there)",
                file.display()
            ),
            (AuthMode::Token, None) => " (bearer token required: the configured one)".to_string(),
        };
        eprintln!(
            "corral serve: listening on http://{}{unix}{auth}",
            bound.tcp
        );
        eprintln!(
            "corral serve: port links on http://{} (each under a host name of its own, \
             PORT-SANDBOXID.DOMAIN; it serves nothing else); the dashboard: http://{}/dashboard \
             (it asks for the token)",
            bound.ports, bound.tcp
        );
        if let Some(e2b) = bound.e2b {
            eprintln!(
                "corral serve: E2B-compatible API on http://{e2b} (E2B_API_URL and E2B_SANDBOX_URL; \
                 E2B_API_KEY is a token)"
            );
        }
        let (drawn, provider, shutdown) = pools;
        if drawn {
            tokio::spawn(show_pools_filling(provider, shutdown));
        }
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Counts the warm pools' sandboxes ready against their targets until the
/// pools are full (the bar's last line stays) or the service stops.
async fn show_pools_filling(provider: Provider, shutdown: CancellationToken) {
    let targets = &provider.config().pools;
    let target: usize = targets.values().map(|p| p.warm).sum();
    if target == 0 {
        return;
    }
    let names = targets.keys().cloned().collect::<Vec<_>>().join(", ");
    let bar = Progress::counter(true, "pools", target as u64, "sandboxes warm");
    loop {
        let ready: usize = provider
            .stats()
            .pooled
            .iter()
            .map(|(name, n)| (*n).min(targets.get(name).map_or(0, |p| p.warm)))
            .sum();
        bar.set(ready as u64);
        if ready >= target {
            bar.finish(format!("{ready}/{target} sandboxes warm (pools {names})"));
            return;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
}
