//! `corral`: run untrusted commands in hardened, disposable containers.
//!
//! Each subcommand lives in `commands/<name>.rs` and turns its flags into
//! library calls on `corral-docker`; none talks to Docker directly.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;
mod diagnostics;
mod json;
mod progress;

use diagnostics::{CliError, Diagnostic};

/// Hardened container sandboxes for AI agents and RL rollouts.
#[derive(Parser)]
#[command(
    name = "corral",
    version,
    about = "Hardened container sandboxes for AI agents and RL rollouts",
    long_about = None,
    after_help = "Settings come from, highest precedence first: command-line flags, CORRAL_* \
environment variables, the config file, the built-in defaults. The config file is --config \
(or $CORRAL_CONFIG), else $XDG_CONFIG_HOME/corral/config.yaml or ~/.config/corral/config.yaml \
when it exists. `corral config example` prints every key with its default; \
`corral config check` validates a file."
)]
struct Cli {
    /// YAML config file [default: $XDG_CONFIG_HOME/corral/config.yaml or
    /// ~/.config/corral/config.yaml, when it exists].
    #[arg(long, global = true, env = "CORRAL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Daemon endpoint: unix:///path, tcp://host:port or a socket path.
    /// Overrides $CORRAL_ENDPOINT and the config's `endpoint`.
    /// Default: DOCKER_HOST, then /var/run/docker.sock, then Podman's sockets.
    #[arg(long, global = true)]
    endpoint: Option<String>,

    /// Container starts in flight at once, shared by every corral process
    /// of this user on the host (0: unlimited). Overrides
    /// $CORRAL_START_LIMIT and the config's `daemon.start_limit` [default: 8].
    #[arg(long, global = true)]
    start_limit: Option<usize>,

    /// Daemon execs in flight at once, shared like --start-limit. Overrides
    /// $CORRAL_EXEC_LIMIT and the config's `daemon.exec_limit` [default: 16].
    #[arg(long, global = true)]
    exec_limit: Option<usize>,

    /// Draw no progress bars or spinners (they are drawn only when stderr
    /// is a terminal anyway).
    #[arg(long, short = 'q', global = true)]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(Box<commands::run::RunArgs>),
    Ps(commands::ps::PsArgs),
    Pull(commands::pull::PullArgs),
    Build(commands::build::BuildArgs),
    Images(commands::images::ImagesArgs),
    Port(commands::port::PortArgs),
    Egress(commands::egress::EgressArgs),
    Top(commands::top::TopArgs),
    Events(commands::events::EventsArgs),
    Gc(commands::gc::GcArgs),
    Snapshots(commands::snapshots::SnapshotsArgs),
    Doctor(commands::doctor::DoctorArgs),
    Workload(commands::workload::WorkloadArgs),
    Bench(commands::bench::BenchArgs),
    Loadgen(commands::loadgen::LoadgenArgs),
    Config(commands::config::ConfigArgs),
    Serve(commands::serve::ServeArgs),
    Mcp(commands::mcp::McpArgs),
    AgentImage(commands::agent_image::AgentImageArgs),
    Completions(CompletionsArgs),
    Man(ManArgs),
}

/// Print shell completions for corral.
///
/// Source the output (bash: `source <(corral completions bash)`; zsh: put
/// it in a file named `_corral` on $fpath; fish: `corral completions fish >
/// ~/.config/fish/completions/corral.fish`).
#[derive(clap::Args)]
struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

/// Print the man page of corral, or of one of its commands.
///
/// roff, for `man -l -`: `corral man | man -l -`, `corral man serve | man
/// -l -`; or write them to a directory on $MANPATH.
#[derive(clap::Args)]
struct ManArgs {
    /// The command (e.g. `serve`); none: corral itself.
    command: Option<String>,
}

/// Writes `corral completions SHELL` or `corral man [COMMAND]`.
fn generated(command: &Command) -> Option<ExitCode> {
    let mut cli = Cli::command();
    match command {
        Command::Completions(args) => {
            clap_complete::generate(args.shell, &mut cli, "corral", &mut std::io::stdout());
            Some(ExitCode::SUCCESS)
        }
        Command::Man(args) => {
            let page = match &args.command {
                None => cli,
                Some(name) => match cli.find_subcommand(name) {
                    Some(sub) => sub.clone().name(format!("corral-{name}")),
                    None => {
                        let e = CliError::NoCommand { name: name.clone() };
                        Diagnostic::of(&e.into()).emit();
                        return Some(ExitCode::from(125));
                    }
                },
            };
            match clap_mangen::Man::new(page).render(&mut std::io::stdout()) {
                Ok(()) => Some(ExitCode::SUCCESS),
                Err(e) => {
                    Diagnostic::new(format!("cannot write the man page: {e}")).emit();
                    Some(ExitCode::from(125))
                }
            }
        }
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    progress::set_quiet(cli.quiet);
    let flags = commands::config::Flags {
        endpoint: cli.endpoint,
        start_limit: cli.start_limit,
        exec_limit: cli.exec_limit,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // `corral config` reports a bad file itself; everything else needs a
    // good one before it starts.
    let command = match cli.command {
        Command::Config(args) => return commands::config::run(cli.config.as_deref(), &flags, args),
        other => other,
    };
    if let Some(code) = generated(&command) {
        return code;
    }
    let settings = match commands::config::load(cli.config.as_deref(), &flags) {
        Ok(c) => c,
        Err(e) => {
            Diagnostic::of(&e).emit();
            return ExitCode::from(125);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            Diagnostic::new(format!("cannot start the async runtime: {e}")).emit();
            return ExitCode::from(125);
        }
    };
    let config = commands::BackendConfig::from(&settings);
    let opened = config.opened.clone();
    let result = runtime.block_on(async move {
        let result = match command {
            Command::Run(args) => commands::run::run(config, &settings, *args).await,
            Command::Ps(args) => commands::ps::run(config, args).await,
            Command::Pull(args) => commands::pull::run(config, args).await,
            Command::Build(args) => commands::build::run(config, &settings, args).await,
            Command::Images(args) => commands::images::run(config, args).await,
            Command::Port(args) => commands::port::run(config, args).await,
            Command::Egress(args) => commands::egress::run(config, args).await,
            Command::Top(args) => commands::top::run(config, args).await,
            Command::Events(args) => commands::events::run(&settings, args).await,
            Command::Gc(args) => commands::gc::run(config, args).await,
            Command::Snapshots(args) => commands::snapshots::run(config, args).await,
            Command::Doctor(args) => commands::doctor::run(config, &settings, args).await,
            Command::Workload(args) => commands::workload::run(config, args).await,
            Command::Bench(args) => commands::bench::run(config, args).await,
            Command::Loadgen(args) => commands::loadgen::run(args).await,
            Command::Serve(args) => commands::serve::run(config, &settings, args).await,
            Command::Mcp(args) => commands::mcp::run(config, &settings, args).await,
            Command::AgentImage(args) => commands::agent_image::run(&settings, args),
            Command::Config(_) | Command::Completions(_) | Command::Man(_) => {
                unreachable!("handled before the runtime starts")
            }
        };
        // What the backends hold for this process (a Lease) goes now
        // rather than expiring later.
        opened.close_all().await;
        result
    });
    // Don't wait for a blocked stdin reader thread at exit.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            Diagnostic::of(&e).emit();
            ExitCode::from(125)
        }
    }
}
