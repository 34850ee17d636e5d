//! `corral-faultproxy`: the fault proxy as a process, for tests that run
//! corral in other processes. Rules and stats are driven through the
//! control paths under `/_faultproxy/` on the listen socket.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use corral_faultproxy::{Config, FaultProxy, Matcher, DEFAULT_UPSTREAM};
use tokio::signal::unix::{signal, SignalKind};

/// Fault-injection proxy for the Docker Engine API.
///
/// Forwards every request on --listen to the daemon socket, except those a
/// rule answers with an error, a connection reset or a delay. Control API on
/// the same socket: GET /_faultproxy/stats, POST /_faultproxy/stats/reset,
/// GET|PUT /_faultproxy/rules, /_faultproxy/tracked, /_faultproxy/seed,
/// /_faultproxy/config.
#[derive(Debug, Parser)]
#[command(name = "corral-faultproxy", version)]
struct Args {
    /// Unix socket to listen on (a stale socket file there is replaced).
    #[arg(long)]
    listen: PathBuf,
    /// Daemon socket to forward to.
    #[arg(long, default_value = DEFAULT_UPSTREAM)]
    upstream: PathBuf,
    /// JSON file: a list of rules, or {"seed": N, "rules": [...], "tracked": [...]}.
    #[arg(long)]
    rules: Option<PathBuf>,
    /// Seed for rule probabilities (overrides the file's).
    #[arg(long)]
    seed: Option<u64>,
    /// Track the concurrency of matching requests, e.g. "POST /containers/*/start"
    /// (repeatable; added to the file's).
    #[arg(long = "track", value_name = "METHOD PATH")]
    track: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();

    let mut config = match &args.rules {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read rules file {}", path.display()))?;
            Config::from_json(&text)
                .with_context(|| format!("invalid rules file {}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    for spec in &args.track {
        config
            .tracked
            .push(Matcher::parse(spec).with_context(|| format!("invalid --track {spec:?}"))?);
    }

    let proxy = FaultProxy::start_with(&args.listen, &args.upstream, config)
        .context("cannot start the fault proxy")?;

    // Stop on SIGINT or SIGTERM so the proxy's drop removes the socket.
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot watch SIGINT")?,
        _ = terminate.recv() => {}
    }
    tracing::info!(listen = %proxy.socket_path().display(), "stopping");
    drop(proxy);
    Ok(())
}
