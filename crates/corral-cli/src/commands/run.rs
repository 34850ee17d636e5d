//! `corral run`: one command in a new sandbox, removed afterwards.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use corral::metrics::StartPhase;
use corral::{OutputStream, Recovered, Sandbox};
use corral_core::command::DEFAULT_MAX_OUTPUT;
use corral_core::config::Config;
use corral_core::units::{parse_bytes, parse_cpus};
use corral_core::{
    CommandResult, CommandSpec, EnvVar, FailureKind, Mount, Network, Recovery, SandboxSpec,
};
use tokio::io::AsyncReadExt;

use crate::diagnostics::{self, Diagnostic};
use crate::json;
use crate::progress::{self, Progress};

/// Run COMMAND with /bin/sh -c in a new hardened sandbox, then remove it.
///
/// Output is passed through and corral exits with the command's exit code.
/// When the command does not exit by itself, the exit code says why:
/// 124 timeout, 137 OOM-killed, 127 could not start, 125 any other failure
/// (container lost, daemon unavailable, image not found, invalid spec),
/// reported as `error: ...` with a `help: ...` line saying what to do next.
/// With --json, one JSON object describes the outcome instead.
/// On a terminal a spinner shows while the sandbox starts (--quiet: none).
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Start from the config's profile NAME instead of its `defaults:`
    /// (flags still override).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// Image to run [default: the --profile's image, else $CORRAL_IMAGE,
    /// else the config's defaults.image, else corral-test/busybox].
    #[arg(long)]
    image: Option<String>,
    /// Memory limit, e.g. 64m or 2g (swap is capped at the same value)
    /// [default: from the config, else 1g].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU limit, e.g. 0.5 or 2 [default: from the config, else 1].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_cpu_count)]
    cpus: Option<f64>,
    /// Maximum number of processes [default: from the config, else 256].
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(8..))]
    pids: Option<i64>,
    /// Writable layer size limit, e.g. 1g (only where the storage driver supports it).
    #[arg(long, value_parser = parse_size)]
    disk: Option<u64>,
    /// Network: bridge (corral's network: reaches outside, not other sandboxes)
    /// or none [default: from the config, else bridge].
    #[arg(long, value_parser = parse_network)]
    network: Option<Network>,
    /// OCI runtime, e.g. runc or runsc (gVisor).
    #[arg(long)]
    runtime: Option<String>,
    /// Isolation tier: container (runc over the host kernel) or gvisor
    /// (gVisor's user-space kernel; Docker runtime runsc, see
    /// scripts/ensure-gvisor.sh; a command there can forge another's
    /// result, and a warning says so) [default: from the config, else
    /// container].
    #[arg(long, value_parser = clap::value_parser!(corral_core::Isolation))]
    isolation: Option<corral_core::Isolation>,
    /// Kill the command's whole process tree after this many seconds (fractions allowed).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// Wait, as `docker exec` does, until every process holding the
    /// command's stdout and stderr (background jobs started with &) has
    /// exited or closed them, and pass their output through; bounded by
    /// --timeout (then they are all killed: exit 124). Without it the
    /// command ends when its main process exits and later output of its
    /// jobs is lost. The exit code is the main process's either way.
    #[arg(long)]
    wait_for_output: bool,
    /// Bytes kept per output stream (head and tail; the middle is dropped).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_size, default_value_t = DEFAULT_MAX_OUTPUT)]
    max_output: u64,
    /// Environment: NAME=value sets it, NAME alone forwards the host's value
    /// (replacing the config's entry of the same name).
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// Resolve --env values starting with $ from the host environment.
    #[arg(long)]
    expand_env: bool,
    /// Bind mount HOST:CONTAINER[:OPTS], OPTS a comma list of ro|rw and
    /// nosuid (setuid bits and device files under it have no effect inside;
    /// directories only).
    #[arg(long = "mount", short = 'v', value_name = "HOST:CONTAINER[:OPTS]")]
    mounts: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w')]
    workdir: Option<String>,
    /// Run as this user (uid, uid:gid or a name the image knows).
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// Mount the root filesystem read-only.
    #[arg(long)]
    read_only: bool,
    /// Start the sandbox for in-place reset (`pristine: true`): commands
    /// write to an overlay in memory, which a snapshot folds in.
    #[arg(long)]
    pristine: bool,
    /// Add SETUID and SETGID back (needed to switch users inside the sandbox).
    #[arg(long)]
    setuid_caps: bool,
    /// Seconds the sandbox outlives a vanished corral (the agent's dead-man
    /// switch: if corral is killed, everything in the sandbox stops this long after)
    /// [default: from the config, else 30].
    #[arg(long, value_parser = parse_timeout)]
    agent_grace: Option<Duration>,
    /// When the container is lost mid-command: fail (report container_lost)
    /// or recreate (new container from the same spec, command retried once)
    /// [default: from the config, else fail].
    #[arg(long, value_parser = parse_recovery)]
    recovery: Option<Recovery>,
    /// A shell command run in the sandbox before COMMAND (and again after a
    /// recreate), after the config's; repeatable, run in order; one failing
    /// fails the run.
    #[arg(long, value_name = "SCRIPT")]
    startup: Vec<String>,
    /// Print one JSON object with the outcome instead of passing output through.
    #[arg(long)]
    json: bool,
    /// After COMMAND exits 0, keep the sandbox's root file system as the
    /// durable snapshot NAME (replacing one of that name), for
    /// --from-snapshot; see `corral snapshots`. The snapshot records the
    /// names of the sandbox's variables, never their values.
    #[arg(long, value_name = "NAME")]
    snapshot: Option<String>,
    /// Start from snapshot NAME (TENANT/NAME for a tenant's of `corral
    /// serve`): its file system and the spec of the sandbox it was taken
    /// from (its start-up commands are not run again); the variables that
    /// sandbox set take their values from --env and the configured
    /// defaults, and are unset otherwise.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["image", "profile", "startup"])]
    from_snapshot: Option<String>,
    /// The command, run by /bin/sh -c (several words are joined with spaces).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

fn parse_cpu_count(s: &str) -> Result<f64, String> {
    parse_cpus(s).map_err(|e| e.to_string())
}

fn parse_network(s: &str) -> Result<Network, String> {
    Network::parse(s).ok_or_else(|| format!("'{s}' is not a network mode: expected bridge or none"))
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("'{s}' is not a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_recovery(s: &str) -> Result<Recovery, String> {
    Recovery::parse(s)
        .ok_or_else(|| format!("'{s}' is not a recovery policy: expected fail or recreate"))
}

fn parse_env(entries: &[String]) -> Vec<EnvVar> {
    entries
        .iter()
        .map(|e| match e.split_once('=') {
            Some((name, value)) => EnvVar::Set {
                name: name.to_string(),
                value: value.to_string(),
            },
            None => EnvVar::Forward { forward: e.clone() },
        })
        .collect()
}

fn parse_mount(entry: &str) -> anyhow::Result<Mount> {
    let bad = || {
        anyhow::anyhow!(
            "invalid value '{entry}' for '--mount': expected HOST:CONTAINER or \
             HOST:CONTAINER:OPTS with OPTS a comma list of ro, rw, nosuid"
        )
    };
    let parts: Vec<&str> = entry.split(':').collect();
    let (host, container, opts) = match parts.as_slice() {
        [h, c] => (*h, *c, ""),
        [h, c, o] => (*h, *c, *o),
        _ => return Err(bad()),
    };
    let (mut read_only, mut nosuid) = (false, false);
    for opt in opts.split(',').filter(|o| !o.is_empty()) {
        match opt {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "nosuid" => nosuid = true,
            _ => return Err(bad()),
        }
    }
    Ok(Mount {
        host: host.to_string(),
        container: container.to_string(),
        read_only,
        nosuid,
    })
}

impl RunArgs {
    /// The config's `defaults:` (or `--profile`'s spec) with the flags given
    /// on top; a flag left out keeps the config's value.
    fn spec(&self, config: &Config) -> anyhow::Result<SandboxSpec> {
        let mut spec = match &self.profile {
            Some(name) => config.profile(name)?.clone(),
            None => config.defaults.clone(),
        };
        spec.image = match &self.image {
            Some(image) => image.clone(),
            None if !spec.image.is_empty() => spec.image,
            None => super::default_image(),
        };
        if let Some(memory) = self.memory {
            spec.limits.memory = Some(memory);
        }
        if let Some(cpus) = self.cpus {
            spec.limits.cpus = Some(cpus);
        }
        if let Some(pids) = self.pids {
            spec.limits.pids = Some(pids);
        }
        if self.disk.is_some() {
            spec.limits.disk = self.disk;
        }
        if let Some(network) = self.network.clone() {
            spec.network = network;
        }
        if self.runtime.is_some() {
            spec.runtime = self.runtime.clone();
        }
        if let Some(isolation) = self.isolation {
            spec.isolation = isolation;
        }
        let flags_env = parse_env(&self.env);
        spec.env
            .retain(|base| !flags_env.iter().any(|f| env_name(f) == env_name(base)));
        spec.env.extend(flags_env);
        spec.expand_host_env |= self.expand_env;
        for m in &self.mounts {
            spec.mounts.push(parse_mount(m)?);
        }
        if self.workdir.is_some() {
            spec.workdir = self.workdir.clone();
        }
        if self.user.is_some() {
            spec.security.user = self.user.clone();
        }
        spec.security.read_only_root |= self.read_only;
        spec.pristine |= self.pristine;
        spec.security.setuid_caps |= self.setuid_caps;
        if let Some(recovery) = self.recovery {
            spec.recovery = recovery;
        }
        spec.startup.extend(self.startup.iter().cloned());
        if let Some(grace) = self.agent_grace {
            spec.agent_grace_ms = grace.as_millis().min(u64::MAX as u128) as u64;
        }
        Ok(spec)
    }
}

fn env_name(var: &EnvVar) -> &str {
    match var {
        EnvVar::Set { name, .. } => name,
        EnvVar::Forward { forward } => forward,
    }
}

/// Exit code for an outcome, as documented in `corral run --help`.
fn exit_code(result: &CommandResult) -> u8 {
    match &result.failure {
        None => match (result.exit_code, result.signal) {
            (Some(code), _) => (code & 0xff) as u8,
            (None, Some(sig)) => (128 + sig.clamp(0, 127)) as u8,
            (None, None) => 125,
        },
        Some(f) => match f.kind {
            FailureKind::Timeout => 124,
            FailureKind::OomKilled => 137,
            FailureKind::SpawnFailed => 127,
            _ => 125,
        },
    }
}

pub async fn run(
    config: crate::commands::BackendConfig,
    settings: &Config,
    args: RunArgs,
) -> anyhow::Result<ExitCode> {
    let script = args.command.join(" ");
    let spec = match args.spec(settings) {
        Ok(s) => s,
        Err(e) => return finish_early(&args, FailureKind::InvalidSpec, Diagnostic::of(&e)),
    };
    // Listen for Ctrl-C and SIGTERM before anything is created, so an
    // interrupt at any point (even mid-create) ends in teardown, not a leak.
    let mut interrupt = Interrupt::listen()?;
    let backend = match super::connect(config).await {
        Ok(b) => b,
        Err(e) => return finish_early(&args, FailureKind::DaemonUnavailable, Diagnostic::of(&e)),
    };
    let starting = Progress::spinner(
        progress::wanted(args.json),
        "run",
        match &args.from_snapshot {
            Some(name) => format!("snapshot {name}: starting a sandbox"),
            None => format!("{}: starting a sandbox", spec.image),
        },
    );
    let created = match &args.from_snapshot {
        // The snapshot keeps its variables' names, not their values: they
        // come from this run's --env flags and the configured defaults.
        Some(name) => backend
            .fork_with(name, 1, &spec.env)
            .await
            .map(|mut v| v.remove(0)),
        None => {
            let image = spec.image.clone();
            let watch =
                |phase: StartPhase| starting.message(format!("{image}: {}", phase_text(phase)));
            backend.create_watched(&spec, &watch).await
        }
    };
    starting.clear();
    let sandbox = match created {
        Ok(s) => s,
        Err(e) => return finish_early(&args, e.kind(), Diagnostic::of_core(&e)),
    };
    if let Err(why) = sandbox.result_integrity() {
        diagnostics::warn(why);
    }

    let result = tokio::select! {
        r = execute(&sandbox, &args, script) => Some(r),
        _ = interrupt.recv() => None,
    };
    let mut snapshot_failed = false;
    if let (Some(name), Some(r)) = (&args.snapshot, &result) {
        if r.success() {
            let opts = corral::SnapshotOptions {
                durable: true,
                ..Default::default()
            };
            let keeping = Progress::spinner(
                progress::wanted(args.json),
                "run",
                format!("keeping snapshot {name}"),
            );
            let kept = sandbox.snapshot(name, opts).await;
            keeping.clear();
            match kept {
                Ok(info) => eprintln!("corral: kept snapshot {} ({})", info.name, info.image),
                Err(e) => {
                    let mut d = Diagnostic::of_core(&e);
                    d.error = format!("could not keep snapshot {name}: {}", d.error);
                    d.emit();
                    snapshot_failed = true;
                }
            }
        } else {
            diagnostics::warn(format!("the command failed; no snapshot {name} kept"));
        }
    }
    if let Err(e) = sandbox.destroy().await {
        diagnostics::warn(format!("could not remove sandbox {}: {e}", sandbox.id()));
    }
    let Some(result) = result else {
        eprintln!("corral: interrupted; sandbox {} removed", sandbox.id());
        return Ok(ExitCode::from(130));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&json::result(&result, Some(sandbox.id())))?
        );
    } else if let Some(f) = &result.failure {
        Diagnostic::of_failure(f).emit();
    }
    if snapshot_failed {
        return Ok(ExitCode::from(125));
    }
    Ok(ExitCode::from(exit_code(&result)))
}

/// What the spinner of a starting sandbox says in each phase.
fn phase_text(phase: StartPhase) -> &'static str {
    match phase {
        StartPhase::BreakerWait => "waiting: the daemon has been failing (circuit breaker open)",
        StartPhase::SlotWait => "waiting for a start slot (--start-limit)",
        StartPhase::Image | StartPhase::AgentVolume => "getting the image",
        StartPhase::Create => "creating the sandbox",
        StartPhase::Start => "starting the sandbox",
        StartPhase::Attach => "connecting to the sandbox's agent",
        StartPhase::Startup => "running the start-up commands",
        StartPhase::FirstCommand => "running the command",
    }
}

/// Forwarded stdin kept for a retry after the container is recreated; a
/// command whose stdin was larger is not retried (it cannot be replayed).
const REPLAY_STDIN_MAX: usize = 16 << 20;

async fn execute(sandbox: &Sandbox, args: &RunArgs, script: String) -> CommandResult {
    let forward_stdin = !std::io::stdin().is_terminal();
    let mut cmd = CommandSpec::shell(script).max_output(args.max_output);
    cmd.timeout = args.timeout;
    cmd.wait_for_output = args.wait_for_output;
    let passthrough = !args.json;
    let sink = move |stream: OutputStream, bytes: &[u8]| {
        if passthrough {
            // A closed stdout/stderr on our side must not stop the command.
            let _ = match stream {
                OutputStream::Stdout => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(bytes).and_then(|_| out.flush())
                }
                OutputStream::Stderr => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(bytes).and_then(|_| err.flush())
                }
            };
        }
    };
    if !forward_stdin {
        // The sandbox's recovery policy applies as for any command.
        return sandbox.run_with(&cmd, sink).await;
    }
    cmd.stdin = Some(Vec::new());
    let exec = match sandbox.exec(&cmd).await {
        Ok(e) => e,
        Err(f) => return CommandResult::failed(f, Duration::ZERO),
    };
    // Stdin streams through as it comes, and is kept (up to a cap) so the
    // command can be replayed if its container is lost and recreated.
    let writer = exec.stdin();
    let recorder = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        let mut kept = Some(Vec::new());
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) => break,
                Err(_) => return None,
                Ok(n) => {
                    if let Some(k) = &mut kept {
                        if k.len() + n <= REPLAY_STDIN_MAX {
                            k.extend_from_slice(&buf[..n]);
                        } else {
                            kept = None;
                        }
                    }
                    if writer.write(&buf[..n]).await.is_err() {
                        return None;
                    }
                }
            }
        }
        let _ = writer.close().await;
        kept
    });
    let first = exec.wait_with(sink).await;
    let Some(failure) = first.failure.clone() else {
        return first;
    };
    // The sandbox's recovery policy decides, as for any command.
    match sandbox.recover_from(&failure).await {
        Recovered::Retry => {}
        Recovered::NotLost | Recovered::NoRetry => return first,
        Recovered::Failed(f) => {
            return CommandResult {
                failure: Some(f),
                ..first
            }
        }
    }
    // Stdin still open (nothing more came, no EOF): it cannot be replayed.
    let recorded = tokio::time::timeout(Duration::from_millis(200), recorder).await;
    let Ok(Ok(Some(stdin))) = recorded else {
        let mut r = first;
        if let Some(f) = &mut r.failure {
            f.message = format!(
                "{}; not retried: its stdin could not be replayed",
                f.message
            );
        }
        return r;
    };
    cmd.stdin = Some(stdin);
    sandbox.run_with(&cmd, sink).await
}

/// Reports a failure that happened before the command could run: as the
/// JSON outcome with --json, else as `error:` (the failure's kind and
/// message) and the diagnostic's help.
fn finish_early(
    args: &RunArgs,
    kind: FailureKind,
    diagnostic: Diagnostic,
) -> anyhow::Result<ExitCode> {
    let failure = corral_core::Failure::new(kind, diagnostic.error);
    if !args.json {
        Diagnostic {
            error: failure.to_string(),
            help: diagnostic.help,
        }
        .emit();
    }
    let result = CommandResult::failed(failure, Duration::ZERO);
    if args.json {
        println!("{}", serde_json::to_string(&json::result(&result, None))?);
    }
    Ok(ExitCode::from(exit_code(&result)))
}

/// Ctrl-C and SIGTERM, registered once; a signal that arrives before
/// `recv` is awaited is kept and reported then.
struct Interrupt {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupt {
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Interrupt {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_and_env_parse_or_name_the_value() {
        let m = parse_mount("/a:/b:ro").expect("valid");
        assert!(m.read_only && !m.nosuid && m.host == "/a" && m.container == "/b");
        let m = parse_mount("/a:/b:rw,nosuid").expect("valid");
        assert!(!m.read_only && m.nosuid);
        assert!(parse_mount("/a:/b:suid").is_err());
        let e = parse_mount("/a").expect_err("invalid").to_string();
        assert!(e.contains("'/a'") && e.contains("--mount"), "{e}");
        assert_eq!(
            parse_env(&["A=1".into(), "B".into()]),
            vec![
                EnvVar::Set {
                    name: "A".into(),
                    value: "1".into()
                },
                EnvVar::Forward {
                    forward: "B".into()
                }
            ]
        );
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("1.5").is_ok());
    }

    #[test]
    fn unset_flags_keep_the_configs_values() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let args = |argv: &[&str]| {
            Cli::try_parse_from(["run"].iter().chain(argv).chain(&["--", "true"]))
                .expect("valid flags")
                .run
        };
        let config = Config::from_yaml(
            "defaults: {image: cfg-image, limits: {memory: 67108864, pids: 64}, network: none}",
        )
        .expect("parses");
        let spec = args(&["--pids", "32"]).spec(&config).expect("spec");
        assert_eq!(spec.image, "cfg-image");
        assert_eq!(spec.limits.memory, Some(64 << 20));
        assert_eq!(spec.limits.pids, Some(32));
        assert_eq!(spec.limits.cpus, Some(1.0));
        assert_eq!(spec.network, Network::None);
        let spec = args(&["--image", "flag-image", "--network", "bridge"])
            .spec(&config)
            .expect("spec");
        assert_eq!(
            (spec.image.as_str(), spec.network),
            ("flag-image", Network::Bridge)
        );
    }
}
