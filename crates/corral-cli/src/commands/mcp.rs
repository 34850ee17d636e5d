//! `corral mcp`: one MCP session over stdin/stdout, for clients that start
//! their MCP servers as subprocesses.

use std::process::ExitCode;

use crate::commands::BackendConfig;
use anyhow::Context;
use clap::Args;
use corral::host::RealHost;
use corral::Provider;
use corral_core::config::Config;
use corral_core::SandboxSpec;
use corral_server::ceilings::Ceilings;
use corral_server::mcp::{serve_stdio, McpContext};

/// Serve MCP over stdin/stdout, with a sandbox of its own.
///
/// Serve MCP (Model Context Protocol) over stdin/stdout: tools to run
/// commands (run_command), read, write and list files (read_file,
/// write_file, list_files), keep shell sessions (shell_run, shell_close),
/// reset the sandbox to its state right after start (reset) and go back to
/// saved files (snapshot, restore), in a sandbox of its own, started on the
/// first tool call and removed when the client disconnects (or on
/// SIGINT/SIGTERM).
///
/// The session is the model's, not the operator's: `restore` finds only
/// the snapshots it took itself (kept apart from everyone else's) and
/// those the config's `server.mcp_snapshots` shares read-only; `snapshot`
/// never replaces another's.
///
/// Register it with an MCP client as the command `corral mcp`. Logs go to
/// stderr ($CORRAL_LOG); stdout carries only the protocol.
#[derive(Args, Debug)]
pub struct McpArgs {
    /// Make the sandbox from the config's profile NAME [default: the
    /// config's `server.mcp_profile`, else its `defaults:`].
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// Image of the sandbox [default: the image of the profile or
    /// `defaults:` in use, else $CORRAL_IMAGE, else corral-test/busybox].
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
}

impl McpArgs {
    /// The sandbox spec: the profile asked for, else `server.mcp_profile`,
    /// else `defaults:`, with the image filled in.
    fn spec(&self, config: &Config) -> anyhow::Result<SandboxSpec> {
        let mut spec = match (&self.profile, &config.server.mcp_profile) {
            (Some(name), _) => config.profile(name).context("--profile")?.clone(),
            (None, Some(name)) => config
                .profile(name)
                .context("the config's server.mcp_profile")?
                .clone(),
            (None, None) => config.defaults.clone(),
        };
        spec.image = match &self.image {
            Some(image) if image.trim().is_empty() => {
                anyhow::bail!("invalid --image '{image}': an image name is required")
            }
            Some(image) => image.clone(),
            None if !spec.image.is_empty() => spec.image,
            None => super::default_image(),
        };
        Ok(spec)
    }
}

/// Runs `corral mcp`.
pub async fn run(
    backend_config: BackendConfig,
    settings: &Config,
    args: McpArgs,
) -> anyhow::Result<ExitCode> {
    let spec = args.spec(settings)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot catch SIGTERM")?;
    let backend = super::connect(backend_config).await?;
    let provider = Provider::with_persistence_root(
        backend,
        settings.provider.clone(),
        settings.persistence_root(&RealHost),
    );
    // The CLI on the host is the operator; its session still reaches only
    // its own snapshots and those server.mcp_snapshots shares.
    let ctx = McpContext {
        tenancy: corral_server::tenancy::Tenancy::new(&settings.server, provider.clone()),
        provider: provider.clone(),
        spec,
        principal: Some(corral_core::principal::Principal::Operator),
        ceilings: Ceilings::new(&settings.server.limits, settings.server.max_body_bytes),
        ports: None,
    };
    let served = tokio::select! {
        r = serve_stdio(ctx) => r,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; ending the MCP session");
            Ok(())
        }
        _ = term.recv() => {
            tracing::info!("terminated; ending the MCP session");
            Ok(())
        }
    };
    // Whatever ended the session, no sandbox outlives it.
    provider.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: McpArgs,
    }

    fn args(argv: &[&str]) -> McpArgs {
        let mut full = vec!["mcp"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).expect("parse").args
    }

    fn config(yaml: &str) -> Config {
        Config::from_yaml(yaml).expect("config")
    }

    #[test]
    fn spec_comes_from_the_profile_then_mcp_profile_then_defaults() {
        let cfg = config(
            "defaults: {image: base-image, network: none}\n\
             profiles: {big: {image: big-image}, tool: {image: tool-image}}\n\
             server: {mcp_profile: tool}\n",
        );
        assert_eq!(args(&[]).spec(&cfg).expect("spec").image, "tool-image");
        assert_eq!(
            args(&["--profile", "big"]).spec(&cfg).expect("spec").image,
            "big-image"
        );
        assert_eq!(args(&["--image", "x"]).spec(&cfg).expect("spec").image, "x");
        let plain = config("defaults: {image: base-image}\n");
        assert_eq!(args(&[]).spec(&plain).expect("spec").image, "base-image");
        let e = args(&["--profile", "nope"])
            .spec(&cfg)
            .expect_err("unknown profile");
        assert!(format!("{e:#}").contains("nope"), "{e:#}");
        let e = args(&["--image", " "]).spec(&cfg).expect_err("blank image");
        assert!(e.to_string().contains("--image"), "{e}");
    }

    #[test]
    fn an_empty_image_falls_back_to_the_default_image() {
        let spec = args(&[]).spec(&Config::default()).expect("spec");
        assert_eq!(spec.image, crate::commands::default_image());
    }
}
