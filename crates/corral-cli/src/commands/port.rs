//! `corral port SANDBOX PORT`: a local address that reaches a server
//! listening on PORT inside a sandbox, as `kubectl port-forward` does: each
//! connection to the local listener is one connection to the port, opened
//! by the backend (`Backend::open_port`: the sandbox's address, or its
//! network namespace when it has none, so a `network: none` sandbox is
//! reached too and gains no egress).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use corral::Backend;

use crate::diagnostics::CliError;

/// Forward a local port to a server inside a sandbox.
///
/// Forward a local port to a port of a server inside a sandbox (HTTP,
/// WebSocket, any TCP) until interrupted. SANDBOX is a sandbox id (or a
/// unique prefix of it, or of its container id) as `corral ps` lists it.
/// Prints `forwarding http://ADDR -> SANDBOX:PORT` once listening.
#[derive(Args, Debug)]
pub struct PortArgs {
    /// The sandbox (id or unique prefix, as `corral ps` shows).
    sandbox: String,
    /// The port the server listens on inside the sandbox.
    port: u16,
    /// The local address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "IP:PORT")]
    listen: String,
}

pub async fn run(config: super::BackendConfig, args: PortArgs) -> anyhow::Result<ExitCode> {
    if args.port == 0 {
        return Err(CliError::BadArgument {
            command: "port",
            what: "PORT",
            value: "0".into(),
            reason: "a port is 1 to 65535",
        }
        .into());
    }
    let runtime = super::connect(config).await?;
    let backend = runtime.backend().clone();
    let list = backend.list().await?;
    let sandbox = super::find_sandbox(&list, &args.sandbox)?;
    let listener = tokio::net::TcpListener::bind(args.listen.trim())
        .await
        .with_context(|| format!("cannot listen on --listen '{}'", args.listen))?;
    let local = listener.local_addr().context("the listener's address")?;
    println!(
        "forwarding http://{local} -> {}:{} (Ctrl-C to stop)",
        sandbox.sandbox_id, args.port
    );
    let placement = sandbox.placement.clone();
    let port = args.port;
    let accept = async {
        loop {
            let (mut conn, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let backend: std::sync::Arc<dyn Backend> = backend.clone();
            let placement = placement.clone();
            tokio::spawn(async move {
                match backend.open_port(&placement, port).await {
                    Ok(mut upstream) => {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    }
                    Err(e) => eprintln!("corral port: {peer}: {e}"),
                }
            });
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot catch SIGTERM")?;
    tokio::select! {
        () = accept => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(ExitCode::SUCCESS)
}
