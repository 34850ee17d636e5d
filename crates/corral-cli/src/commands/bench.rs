//! `corral bench`: corral measured against floors taken in the same run on
//! the same daemon, so a noisy machine moves both sides alike.
//!
//! The floors (raw create+start, raw `docker exec`, the rollout workload
//! done with them) are the one place a front end talks to Docker itself,
//! through [`DockerBackend::docker`]: they measure what corral is compared
//! against, so they must not go through corral.
//!
//! Nothing is left behind. Every container carries the owner labels (so no
//! corral reaper elsewhere takes it for an orphan); raw ones also carry
//! `corral.sandbox=<id>` and `corral.bench=<run id>`, corral's sandboxes
//! `corral-bench=<run id>` (spec labels may not use the reserved `corral.`
//! prefix). At the end, after an error, and on Ctrl-C or SIGTERM (then exit
//! 130) the work is dropped, the provider shut down, and every container
//! with this run's labels or this process's owner labels killed and removed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use clap::Args;
use corral::{Provider, Runtime, Sandbox};
use corral_core::command::DEFAULT_MAX_OUTPUT;
use corral_core::labels;
use corral_core::pool::{PoolConfig, ProviderConfig};
use corral_core::{CommandResult, CommandSpec, Network, SandboxSpec};
use corral_docker::error::{is_not_found, status_code};
use corral_docker::DockerBackend;
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Label on every raw container of a run; the value is the run id.
const BENCH_LABEL: &str = "corral.bench";
/// The run label on corral's sandboxes (`corral.` keys are reserved in specs).
const SANDBOX_BENCH_LABEL: &str = "corral-bench";
/// The provider pool the warm-acquire row draws from.
const POOL: &str = "bench";
/// Longest any single command or raw exec may take before the bench fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the warm pool to fill: this plus a second per sandbox.
const FILL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the provider to destroy what it holds.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest warm pool the bench fills at once. An interrupt waits for the
/// provider's refills in flight, so this bounds how long Ctrl-C takes.
const POOL_ROUND: usize = 16;
/// The throughput target is set for this workload: rollouts, commands, parallel.
const TARGET_SHAPE: (usize, usize, usize) = (16, 10, 8);
/// What the reusing pool runs on release before handing a sandbox to the
/// next rollout: clear the scratch directories a rollout writes to.
const REUSE_RESET: &str = "rm -rf /tmp/* /var/tmp/*";

/// Measure corral against floors taken in the same run: raw container
/// create+start and raw `docker exec` through the Engine API, and a rollout
/// workload (N sandboxes x M commands, P at a time) done through corral and
/// done plainly with raw calls. Prints p50/p90/p99 per row, throughput, and
/// the ratios against their targets (warm acquire and agent round trip at
/// least 20x faster than their floors; the workload's commands at least 10x
/// the commands/s of exec-per-command on started containers, with the
/// end-to-end ratios beside it: starts and removals included, from a warm
/// pool, and from a pool that resets and reuses sandboxes).
/// Every container it makes is removed, also on Ctrl-C (exit 130).
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Image [default: $CORRAL_IMAGE or corral-test/busybox].
    #[arg(long)]
    image: Option<String>,
    /// Rollouts (sandboxes) in the workload.
    #[arg(long, default_value = "16", value_parser = at_least_one)]
    sandboxes: usize,
    /// Commands per rollout.
    #[arg(long, default_value = "10", value_parser = at_least_one)]
    commands: usize,
    /// Rollouts in flight at once.
    #[arg(long, default_value = "8", value_parser = at_least_one)]
    parallel: usize,
    /// Samples per latency row [default: 200 round trips, 50 raw execs, 10 starts].
    #[arg(long, value_parser = at_least_one)]
    samples: Option<usize>,
    /// Print one JSON object instead of the table (and no progress bar).
    #[arg(long)]
    json: bool,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{text}' is not a whole number of at least 1")),
    }
}

pub async fn run(
    config: crate::commands::BackendConfig,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    // Before anything exists, so no signal finds a container unaccounted for.
    let mut interrupt = Interrupt::listen()?;
    let (runtime, backend) = super::connect_docker(config).await?;
    let image = args.image.clone().unwrap_or_else(super::default_image);
    let run_id = format!("bench-{}", corral::host::random_hex(10));
    let mut spec = SandboxSpec::new(image.clone());
    spec.network = Network::None;
    spec.labels
        .insert(SANDBOX_BENCH_LABEL.into(), run_id.clone());
    let samples = Samples::new(args.samples);
    let steps = 3 * samples.starts
        + samples.raw_exec
        + 2 * samples.round_trips
        + 5 * args.sandboxes * args.commands;
    let bench = Arc::new(Bench {
        runtime,
        backend,
        spec,
        image,
        run_id,
        raw_seq: AtomicUsize::new(0),
        progress: progress_bar(steps as u64, args.json || !std::io::stderr().is_terminal()),
        provider: Mutex::new(None),
    });

    let outcome = tokio::select! {
        r = bench.measure(&args, &samples) => Some(r),
        _ = interrupt.recv() => None,
    };
    // The measurement is dropped here: its rollout tasks are aborted, and
    // whatever they had in flight is swept below.
    bench.progress.finish_and_clear();
    if outcome.is_none() {
        eprintln!(
            "corral: interrupted; removing the containers of run {}",
            bench.run_id
        );
    }
    let provider = lock(&bench.provider).take();
    if let Some(provider) = provider {
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, provider.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("the provider did not shut down in time; sweeping by label");
        }
    }
    let swept = bench.sweep(!matches!(outcome, Some(Ok(_)))).await;
    match outcome {
        None => {
            let removed = swept?;
            eprintln!("corral: removed {removed} container(s)");
            Ok(ExitCode::from(130))
        }
        Some(Err(e)) => {
            if let Err(s) = swept {
                eprintln!("corral: {s:#}");
            }
            Err(e)
        }
        Some(Ok(report)) => {
            let removed = swept?;
            if removed > 0 {
                // Everything measured tears down after itself: this is a leak.
                tracing::warn!(
                    removed,
                    "the final sweep found containers the bench had not removed"
                );
            }
            if args.json {
                println!("{}", report.json(&bench, &args));
            } else {
                print!("{}", report.table(&bench, &args));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How many samples each latency row takes.
struct Samples {
    starts: usize,
    raw_exec: usize,
    round_trips: usize,
}

impl Samples {
    fn new(all: Option<usize>) -> Samples {
        match all {
            Some(n) => Samples {
                starts: n,
                raw_exec: n,
                round_trips: n,
            },
            None => Samples {
                starts: 10,
                raw_exec: 50,
                round_trips: 200,
            },
        }
    }
}

fn progress_bar(steps: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {msg:<26} [{wide_bar}] {pos}/{len} {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// p50/p90/p99 of a row's samples (nearest rank).
#[derive(Debug, Clone, Copy)]
struct Latency {
    n: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort();
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples
                .get(rank.clamp(1, samples.len().max(1)) - 1)
                .copied()
                .unwrap_or_default()
        };
        Latency {
            n: samples.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// One run of the N x M workload.
struct Workload {
    /// Per rollout: start, M commands, removal.
    per_rollout: Latency,
    commands: usize,
    wall: Duration,
}

impl Workload {
    fn per_second(&self) -> f64 {
        self.commands as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Everything measured.
struct Report {
    raw_start: Latency,
    cold_start: Latency,
    warm_acquire: Latency,
    pool_hits: u64,
    pool_misses: u64,
    raw_exec: Latency,
    agent: Latency,
    shell: Latency,
    corral: Workload,
    plain: Workload,
    /// The workload end to end, each rollout taking its sandbox from a warm
    /// pool sized to the batch (filled before the clock).
    corral_pooled: Workload,
    /// The same with a pool that reuses sandboxes: each rollout's sandbox is
    /// reset and handed back instead of destroyed and replaced.
    corral_reused: Workload,
    /// The commands of the workload alone, on sandboxes started beforehand.
    corral_commands: Workload,
    /// The same on plain containers started beforehand, one raw exec each.
    plain_commands: Workload,
}

/// The measuring context, shared with rollout tasks.
struct Bench {
    /// corral's runtime over the daemon.
    runtime: Runtime,
    /// The daemon itself, for the raw floors.
    backend: DockerBackend,
    spec: SandboxSpec,
    image: String,
    run_id: String,
    raw_seq: AtomicUsize,
    progress: ProgressBar,
    /// The provider while one exists, so an interrupt can shut it down.
    provider: Mutex<Option<Provider>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn true_cmd() -> CommandSpec {
    CommandSpec::argv(["true"]).timeout(COMMAND_TIMEOUT)
}

fn check(r: &CommandResult, sandbox: &str) -> anyhow::Result<()> {
    if r.success() {
        return Ok(());
    }
    match &r.failure {
        Some(f) => bail!("`true` in sandbox {sandbox} failed: {f}"),
        None => bail!(
            "`true` in sandbox {sandbox} exited {:?} (signal {:?})",
            r.exit_code,
            r.signal
        ),
    }
}

impl Bench {
    async fn measure(self: &Arc<Self>, args: &BenchArgs, n: &Samples) -> anyhow::Result<Report> {
        self.progress.set_message("warming up");
        let sb = self.warm_up().await?;

        self.progress.set_message("filling the warm pool");
        let (warm_acquire, pool_hits, pool_misses) = self.warm_acquire(n.starts).await?;

        self.progress.set_message("raw create+start");
        let mut samples = Vec::with_capacity(n.starts);
        for _ in 0..n.starts {
            let t = Instant::now();
            let id = self.raw_start().await?;
            samples.push(t.elapsed());
            self.raw_remove(&id).await?;
            self.progress.inc(1);
        }
        let raw_start = Latency::of(samples);

        self.progress.set_message("cold start");
        let mut samples = Vec::with_capacity(n.starts);
        for _ in 0..n.starts {
            let t = Instant::now();
            let cold = self
                .runtime
                .create(&self.spec)
                .await
                .context("cold start")?;
            samples.push(t.elapsed());
            cold.destroy()
                .await
                .context("destroying a cold-started sandbox")?;
            self.progress.inc(1);
        }
        let cold_start = Latency::of(samples);

        self.progress.set_message("raw docker exec");
        let container = sb.container_id();
        let mut samples = Vec::with_capacity(n.raw_exec);
        for _ in 0..n.raw_exec {
            let t = Instant::now();
            self.raw_exec(&container).await?;
            samples.push(t.elapsed());
            self.progress.inc(1);
        }
        let raw_exec = Latency::of(samples);

        self.progress.set_message("agent round trip");
        let mut samples = Vec::with_capacity(n.round_trips);
        for _ in 0..n.round_trips {
            let t = Instant::now();
            let r = sb.run(&true_cmd()).await;
            samples.push(t.elapsed());
            check(&r, sb.id())?;
            self.progress.inc(1);
        }
        let agent = Latency::of(samples);

        self.progress.set_message("shell session round trip");
        let shell = self.shell_round_trips(&sb, n.round_trips).await?;
        sb.destroy()
            .await
            .context("destroying the warm-up sandbox")?;

        self.progress.set_message("workload, plain");
        let plain = self.workload(args, true).await?;
        self.progress.set_message("workload through corral");
        let corral = self.workload(args, false).await?;
        self.progress
            .set_message("workload through corral, warm pool");
        let corral_pooled = self.workload_pooled(args, false).await?;
        self.progress
            .set_message("workload through corral, reused pool");
        let corral_reused = self.workload_pooled(args, true).await?;
        self.progress
            .set_message("workload commands, plain exec (started containers)");
        let plain_commands = self.workload_started(args, true).await?;
        self.progress
            .set_message("workload commands through corral (started sandboxes)");
        let corral_commands = self.workload_started(args, false).await?;

        Ok(Report {
            raw_start,
            cold_start,
            warm_acquire,
            pool_hits,
            pool_misses,
            raw_exec,
            agent,
            shell,
            corral,
            plain,
            corral_pooled,
            corral_reused,
            corral_commands,
            plain_commands,
        })
    }

    /// Pulls the image and agent volume into place and the page cache warm,
    /// so no row pays a first-time cost; returns the sandbox the exec rows use.
    async fn warm_up(&self) -> anyhow::Result<Sandbox> {
        self.backend
            .ensure_image(&self.image)
            .await
            .with_context(|| format!("image {}", self.image))?;
        let sb = self
            .runtime
            .create(&self.spec)
            .await
            .context("starting the warm-up sandbox")?;
        for _ in 0..20 {
            check(&sb.run(&true_cmd()).await, sb.id())?;
        }
        let raw = self.raw_start().await?;
        for _ in 0..5 {
            self.raw_exec(&sb.container_id()).await?;
        }
        self.raw_remove(&raw).await?;
        Ok(sb)
    }

    /// Times `acquire` from a full warm pool through the provider, in
    /// rounds of at most [`POOL_ROUND`] sandboxes.
    async fn warm_acquire(&self, n: usize) -> anyhow::Result<(Latency, u64, u64)> {
        // Even rounds, so the last refill is not mostly wasted.
        let size = n.div_ceil(n.div_ceil(POOL_ROUND));
        let config = ProviderConfig {
            // Room for exactly the pool: once it is full the refiller cannot
            // start more, so the acquires time the hand-over rather than a
            // hand-over competing with replacement starts for the CPU.
            max_live: size,
            idle_timeout_ms: 0,
            max_lifetime_ms: 0,
            pools: BTreeMap::from([(
                POOL.to_string(),
                PoolConfig {
                    spec: self.spec.clone(),
                    warm: size,
                    reuse: false,
                    reset: Vec::new(),
                },
            )]),
            ..ProviderConfig::default()
        };
        let provider = Provider::new(self.runtime.clone(), config);
        *lock(&self.provider) = Some(provider.clone());
        let fill = FILL_TIMEOUT + Duration::from_secs(size as u64);
        let mut samples = Vec::with_capacity(n);
        while samples.len() < n {
            self.progress.set_message("filling the warm pool");
            if !provider.wait_warm(POOL, fill).await {
                bail!(
                    "the warm pool did not reach {size} sandboxes within {}s",
                    fill.as_secs()
                );
            }
            self.progress.set_message("warm acquire");
            let round = size.min(n - samples.len());
            let mut leases = Vec::with_capacity(round);
            for _ in 0..round {
                let key = format!("{}-{}", self.run_id, samples.len());
                let t = Instant::now();
                let lease = provider
                    .acquire(&key, POOL)
                    .await
                    .with_context(|| format!("acquiring session {key}"))?;
                samples.push(t.elapsed());
                leases.push(lease);
                self.progress.inc(1);
            }
            // What was handed over must be a working sandbox (not timed).
            for lease in &leases {
                check(&lease.run(&true_cmd()).await, lease.id())?;
            }
            if samples.len() < n {
                // Releasing destroys them; the pool refills for the next round.
                let keys: Vec<String> = leases.iter().map(|l| l.key().to_string()).collect();
                drop(leases);
                for released in
                    futures_util::future::join_all(keys.iter().map(|k| provider.release(k))).await
                {
                    released.context("releasing a warm sandbox")?;
                }
            }
        }
        let stats = provider.stats();
        provider.shutdown().await;
        lock(&self.provider).take();
        Ok((Latency::of(samples), stats.pool_hits, stats.pool_misses))
    }

    /// Round trips of `/bin/true` through a shell session: by path, so the
    /// shell spawns a process as the agent row does (`true` alone is a
    /// builtin and would time only the session's framing).
    async fn shell_round_trips(&self, sb: &Sandbox, n: usize) -> anyhow::Result<Latency> {
        const CMD: &str = "/bin/true";
        let session = sb.shell("bench");
        // The first command starts the shell: not a round trip.
        let first = session
            .run(CMD, Some(COMMAND_TIMEOUT), DEFAULT_MAX_OUTPUT)
            .await;
        check(&first.result, sb.id())?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let r = session
                .run(CMD, Some(COMMAND_TIMEOUT), DEFAULT_MAX_OUTPUT)
                .await;
            samples.push(t.elapsed());
            check(&r.result, sb.id())?;
            if r.restarted {
                bail!("shell session in sandbox {} restarted mid-bench", sb.id());
            }
            self.progress.inc(1);
        }
        sb.close_shell("bench").await;
        Ok(Latency::of(samples))
    }

    /// N rollouts of M commands, P at a time: through corral, or `plain`
    /// (raw create+start, a raw exec per command, removal).
    async fn workload(self: &Arc<Self>, args: &BenchArgs, plain: bool) -> anyhow::Result<Workload> {
        let gate = Arc::new(Semaphore::new(args.parallel));
        let commands = args.commands;
        let started = Instant::now();
        // Dropping the set (on error or interrupt) aborts every rollout.
        let mut rollouts = JoinSet::new();
        for _ in 0..args.sandboxes {
            let (bench, gate) = (self.clone(), gate.clone());
            rollouts.spawn(async move {
                let _permit = gate.acquire_owned().await?;
                let t = Instant::now();
                if plain {
                    bench.plain_rollout(commands).await?;
                } else {
                    bench.corral_rollout(commands).await?;
                }
                anyhow::Ok(t.elapsed())
            });
        }
        let mut per_rollout = Vec::with_capacity(args.sandboxes);
        while let Some(joined) = rollouts.join_next().await {
            per_rollout.push(joined.context("a rollout panicked")??);
        }
        Ok(Workload {
            per_rollout: Latency::of(per_rollout),
            commands: args.sandboxes * commands,
            wall: started.elapsed(),
        })
    }

    /// The workload end to end as a trainer runs it with corral: a provider
    /// keeps a warm pool the size of the batch (N), filled before the clock
    /// starts as it would be while the learner works between batches; each
    /// rollout acquires one (a hand-over), runs its commands and releases it
    /// (destroyed, awaited inside the clock); the pool refills for the next
    /// batch in the background.
    ///
    /// With `reuse`, the pool is configured to reuse sandboxes: a release
    /// runs the pool's reset command ([`REUSE_RESET`]) and hands the sandbox
    /// back, so no container is started or removed inside the clock; the
    /// live limit equals the batch, so nothing refills behind the rollouts.
    async fn workload_pooled(
        self: &Arc<Self>,
        args: &BenchArgs,
        reuse: bool,
    ) -> anyhow::Result<Workload> {
        const ROLLOUT_POOL: &str = "rollout";
        let warm = args.sandboxes.max(1);
        let config = ProviderConfig {
            max_live: if reuse { warm } else { warm * 2 },
            idle_timeout_ms: 0,
            max_lifetime_ms: 0,
            pools: BTreeMap::from([(
                ROLLOUT_POOL.to_string(),
                PoolConfig {
                    spec: self.spec.clone(),
                    warm,
                    reuse,
                    reset: if reuse {
                        vec![REUSE_RESET.to_string()]
                    } else {
                        Vec::new()
                    },
                },
            )]),
            ..ProviderConfig::default()
        };
        let provider = Provider::new(self.runtime.clone(), config);
        *lock(&self.provider) = Some(provider.clone());
        let fill = FILL_TIMEOUT + Duration::from_secs(warm as u64);
        let timed = async {
            if !provider.wait_warm(ROLLOUT_POOL, fill).await {
                bail!(
                    "the rollout pool did not reach {warm} sandboxes within {}s",
                    fill.as_secs()
                );
            }
            let gate = Arc::new(Semaphore::new(args.parallel));
            let commands = args.commands;
            let started = Instant::now();
            let mut rollouts = JoinSet::new();
            for i in 0..args.sandboxes {
                let (bench, gate, provider) = (self.clone(), gate.clone(), provider.clone());
                rollouts.spawn(async move {
                    let _permit = gate.acquire_owned().await?;
                    let t = Instant::now();
                    let key = format!("{}-rollout-{i}", bench.run_id);
                    let lease = provider
                        .acquire(&key, ROLLOUT_POOL)
                        .await
                        .with_context(|| format!("acquiring session {key}"))?;
                    for _ in 0..commands {
                        check(&lease.run(&true_cmd()).await, lease.id())?;
                        bench.progress.inc(1);
                    }
                    drop(lease);
                    provider
                        .release(&key)
                        .await
                        .with_context(|| format!("releasing session {key}"))?;
                    anyhow::Ok(t.elapsed())
                });
            }
            let mut per_rollout = Vec::with_capacity(args.sandboxes);
            while let Some(joined) = rollouts.join_next().await {
                per_rollout.push(joined.context("a rollout panicked")??);
            }
            Ok(Workload {
                per_rollout: Latency::of(per_rollout),
                commands: args.sandboxes * commands,
                wall: started.elapsed(),
            })
        }
        .await;
        provider.shutdown().await;
        lock(&self.provider).take();
        timed
    }

    /// The workload's command phase alone: N sandboxes (or, `plain`, raw
    /// containers) are started before the clock starts and removed after it
    /// stops; the clock covers N x M commands, P rollouts at a time.
    async fn workload_started(
        self: &Arc<Self>,
        args: &BenchArgs,
        plain: bool,
    ) -> anyhow::Result<Workload> {
        enum Target {
            Sandbox(Sandbox),
            Raw(String),
        }
        let mut starting = JoinSet::new();
        for _ in 0..args.sandboxes {
            let bench = self.clone();
            starting.spawn(async move {
                if plain {
                    bench.raw_start().await.map(Target::Raw)
                } else {
                    bench
                        .runtime
                        .create(&bench.spec)
                        .await
                        .map(Target::Sandbox)
                        .context("rollout start")
                }
            });
        }
        let mut targets = Vec::with_capacity(args.sandboxes);
        let mut failed = None;
        while let Some(joined) = starting.join_next().await {
            match joined.context("a start panicked") {
                Ok(Ok(t)) => targets.push(Arc::new(t)),
                Ok(Err(e)) | Err(e) => failed = Some(e),
            }
        }
        let timed = async {
            if let Some(e) = failed {
                return Err(e);
            }
            let gate = Arc::new(Semaphore::new(args.parallel));
            let commands = args.commands;
            let started = Instant::now();
            let mut rollouts = JoinSet::new();
            for target in &targets {
                let (bench, gate, target) = (self.clone(), gate.clone(), target.clone());
                rollouts.spawn(async move {
                    let _permit = gate.acquire_owned().await?;
                    let t = Instant::now();
                    for _ in 0..commands {
                        match &*target {
                            Target::Sandbox(sb) => check(&sb.run(&true_cmd()).await, sb.id())?,
                            Target::Raw(id) => bench.raw_exec(id).await?,
                        }
                        bench.progress.inc(1);
                    }
                    anyhow::Ok(t.elapsed())
                });
            }
            let mut per_rollout = Vec::with_capacity(targets.len());
            while let Some(joined) = rollouts.join_next().await {
                per_rollout.push(joined.context("a rollout panicked")??);
            }
            Ok(Workload {
                per_rollout: Latency::of(per_rollout),
                commands: targets.len() * commands,
                wall: started.elapsed(),
            })
        }
        .await;
        let mut teardown = Ok(());
        for target in &targets {
            let r = match &**target {
                Target::Sandbox(sb) => sb.destroy().await.context("rollout teardown"),
                Target::Raw(id) => self.raw_remove(id).await,
            };
            if let Err(e) = r {
                teardown = Err(e);
            }
        }
        let w = timed?;
        teardown.map(|()| w)
    }

    async fn corral_rollout(&self, commands: usize) -> anyhow::Result<()> {
        let sb = self
            .runtime
            .create(&self.spec)
            .await
            .context("rollout start")?;
        let ran = async {
            for _ in 0..commands {
                check(&sb.run(&true_cmd()).await, sb.id())?;
                self.progress.inc(1);
            }
            anyhow::Ok(())
        }
        .await;
        let destroyed = sb.destroy().await.context("rollout teardown");
        ran.and(destroyed)
    }

    async fn plain_rollout(&self, commands: usize) -> anyhow::Result<()> {
        let container = self.raw_start().await?;
        let ran = async {
            for _ in 0..commands {
                self.raw_exec(&container).await?;
                self.progress.inc(1);
            }
            anyhow::Ok(())
        }
        .await;
        let removed = self.raw_remove(&container).await;
        ran.and(removed)
    }

    /// Raw create+start of the bench image running `sleep`, with corral's
    /// labels; returns the container id.
    async fn raw_start(&self) -> anyhow::Result<String> {
        let seq = self.raw_seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-raw-{seq}", self.run_id);
        let labels: HashMap<String, String> = [
            (labels::SANDBOX.to_string(), id.clone()),
            (BENCH_LABEL.to_string(), self.run_id.clone()),
        ]
        .into_iter()
        .chain(self.runtime.owner().labels())
        .collect();
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(vec!["sleep".into(), "600".into()]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                // As the sandboxes: the network is part of a start's cost.
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let docker = self.backend.docker();
        let name = format!("corral-{id}");
        let created = docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .with_context(|| format!("raw create of {name}"))?;
        if let Err(e) = docker.start_container(&created.id, None).await {
            let _ = self.raw_remove(&created.id).await;
            return Err(e).with_context(|| format!("raw start of {name}"));
        }
        Ok(created.id)
    }

    async fn raw_remove(&self, container: &str) -> anyhow::Result<()> {
        let rm = RemoveContainerOptionsBuilder::default().force(true).build();
        match self
            .backend
            .docker()
            .remove_container(container, Some(rm))
            .await
        {
            Err(e) if !is_not_found(&e) => {
                Err(e).with_context(|| format!("raw remove of {container}"))
            }
            _ => Ok(()),
        }
    }

    /// One raw `docker exec` of `true`: create, start attached and drained,
    /// inspect for the exit code.
    async fn raw_exec(&self, container: &str) -> anyhow::Result<()> {
        let docker = self.backend.docker();
        let exec = async {
            let exec = docker
                .create_exec(
                    container,
                    CreateExecOptions::<String> {
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        cmd: Some(vec!["true".into()]),
                        ..Default::default()
                    },
                )
                .await?;
            if let StartExecResults::Attached { mut output, .. } =
                docker.start_exec(&exec.id, None).await?
            {
                while let Some(item) = output.next().await {
                    item?;
                }
            }
            docker.inspect_exec(&exec.id).await
        };
        let info = tokio::time::timeout(COMMAND_TIMEOUT, exec)
            .await
            .with_context(|| format!("raw exec in {container} timed out"))?
            .with_context(|| format!("raw exec in {container}"))?;
        if info.exit_code != Some(0) {
            bail!(
                "raw exec of `true` in {container} exited {:?}",
                info.exit_code
            );
        }
        Ok(())
    }

    /// Kills and removes every container of this run, repeating until the
    /// daemon shows none (`settle`: three empty looks, for requests a
    /// dropped measurement may still have had in flight); returns how many
    /// it removed.
    async fn sweep(&self, settle: bool) -> anyhow::Result<usize> {
        let quiet_needed = if settle { 3 } else { 1 };
        let (mut quiet, mut removed) = (0, 0);
        let mut left = BTreeSet::new();
        for _ in 0..100 {
            left = match self.ours().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "listing the bench's containers failed");
                    quiet = 0;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if left.is_empty() {
                quiet += 1;
                if quiet >= quiet_needed {
                    return Ok(removed);
                }
            } else {
                quiet = 0;
                let results =
                    futures_util::future::join_all(left.iter().map(|id| self.kill_remove(id)))
                        .await;
                removed += results.iter().filter(|ok| **ok).count();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!(
            "run {}: containers left behind: {}",
            self.run_id,
            left.into_iter().collect::<Vec<_>>().join(" ")
        )
    }

    /// Ids of containers with this run's labels or this process's owner labels.
    async fn ours(&self) -> anyhow::Result<BTreeSet<String>> {
        let owner: Vec<String> = self
            .runtime
            .owner()
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let filters = [
            vec![format!("{BENCH_LABEL}={}", self.run_id)],
            vec![format!("{SANDBOX_BENCH_LABEL}={}", self.run_id)],
            // Several label filters must all match: this process's containers.
            owner,
        ];
        let mut ids = BTreeSet::new();
        for labels in filters {
            let filters = HashMap::from([("label", labels)]);
            let opts = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let list = self.backend.docker().list_containers(Some(opts)).await?;
            ids.extend(list.into_iter().filter_map(|c| c.id));
        }
        Ok(ids)
    }

    /// Kill, then force-remove; a container already gone counts as removed.
    async fn kill_remove(&self, id: &str) -> bool {
        let docker = self.backend.docker();
        let kill = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        // 404 gone, 409 not running: removal below settles it either way.
        let _ = docker.kill_container(id, Some(kill)).await;
        let rm = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match docker.remove_container(id, Some(rm)).await {
            Ok(()) => true,
            Err(e) if is_not_found(&e) || status_code(&e) == Some(409) => true,
            Err(e) => {
                tracing::warn!(container = id, error = %e, "removing a bench container failed");
                false
            }
        }
    }
}

/// One line of the table.
struct Row<'a> {
    id: &'static str,
    num: &'static str,
    label: &'static str,
    floor: bool,
    latency: Latency,
    workload: Option<&'a Workload>,
    note: Option<String>,
}

impl<'a> Row<'a> {
    fn new(id: &'static str, num: &'static str, label: &'static str, latency: Latency) -> Self {
        Row {
            id,
            num,
            label,
            floor: false,
            latency,
            workload: None,
            note: None,
        }
    }

    fn floor(mut self) -> Self {
        self.floor = true;
        self
    }

    fn workload(mut self, w: &'a Workload) -> Self {
        self.workload = Some(w);
        self
    }
}

/// A ratio against its target (higher is better).
struct Ratio {
    id: &'static str,
    label: &'static str,
    value: f64,
    target: f64,
    /// False when the target was set for another workload shape than the
    /// one run.
    applies: bool,
}

impl Ratio {
    fn met(&self) -> bool {
        self.value >= self.target
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// `a / b`, with a zero denominator read as one nanosecond.
fn times(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

impl Report {
    fn rows(&self) -> Vec<Row<'_>> {
        let mut warm = Row::new(
            "warm_acquire",
            "3",
            "warm acquire (provider pool)",
            self.warm_acquire,
        );
        warm.note = Some(format!(
            "{}/{} from the pool",
            self.pool_hits,
            self.pool_hits + self.pool_misses
        ));
        vec![
            Row::new("raw_create_start", "1", "raw create+start", self.raw_start).floor(),
            Row::new(
                "cold_start",
                "2",
                "cold start (hardened sandbox, agent)",
                self.cold_start,
            ),
            warm,
            Row::new("raw_exec", "4", "raw docker exec `true`", self.raw_exec).floor(),
            Row::new(
                "agent_round_trip",
                "5",
                "agent round trip `true`",
                self.agent,
            ),
            Row::new(
                "shell_round_trip",
                "6",
                "shell session round trip `/bin/true`",
                self.shell,
            ),
            Row::new(
                "workload_corral",
                "7",
                "workload through corral, per rollout",
                self.corral.per_rollout,
            )
            .workload(&self.corral),
            Row::new(
                "workload_plain",
                "",
                "workload plain, per rollout",
                self.plain.per_rollout,
            )
            .floor()
            .workload(&self.plain),
            Row::new(
                "workload_pooled_corral",
                "",
                "workload through corral, batch-sized pool",
                self.corral_pooled.per_rollout,
            )
            .workload(&self.corral_pooled),
            Row::new(
                "workload_reused_corral",
                "",
                "workload through corral, reused pool (reset)",
                self.corral_reused.per_rollout,
            )
            .workload(&self.corral_reused),
            Row::new(
                "workload_commands_corral",
                "8",
                "workload commands only, through corral",
                self.corral_commands.per_rollout,
            )
            .workload(&self.corral_commands),
            Row::new(
                "workload_commands_plain",
                "",
                "workload commands only, raw exec",
                self.plain_commands.per_rollout,
            )
            .floor()
            .workload(&self.plain_commands),
        ]
    }

    fn ratios(&self, args: &BenchArgs) -> Vec<Ratio> {
        vec![
            Ratio {
                id: "warm_acquire_vs_raw_start",
                label: "warm acquire p50 vs raw create+start p50",
                value: times(self.raw_start.p50, self.warm_acquire.p50),
                target: 20.0,
                applies: true,
            },
            Ratio {
                id: "agent_vs_raw_exec",
                label: "agent round trip p50 vs raw exec p50",
                value: times(self.raw_exec.p50, self.agent.p50),
                target: 20.0,
                applies: true,
            },
            Ratio {
                id: "workload_vs_plain",
                label: "workload commands/s vs plain (starts incl.)",
                value: self.corral.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_pooled_vs_plain",
                label: "workload (batch pool) commands/s vs plain",
                value: self.corral_pooled.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_reused_vs_plain",
                label: "workload (reused pool) commands/s vs plain",
                value: self.corral_reused.per_second() / self.plain.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
            Ratio {
                id: "workload_commands_vs_plain_exec",
                label: "workload commands/s vs exec-per-command",
                value: self.corral_commands.per_second()
                    / self.plain_commands.per_second().max(1e-9),
                target: 10.0,
                applies: (args.sandboxes, args.commands, args.parallel) == TARGET_SHAPE,
            },
        ]
    }

    fn table(&self, bench: &Bench, args: &BenchArgs) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let _ = writeln!(
            out,
            "corral bench: image {}, network none, {cpus} CPUs, run {}",
            bench.image, bench.run_id
        );
        let _ = writeln!(
            out,
            "workload: {} rollouts x {} commands, {} in parallel; times in ms\n",
            args.sandboxes, args.commands, args.parallel
        );
        let _ = writeln!(
            out,
            "   {:<46} {:>5} {:>9} {:>9} {:>9}  throughput",
            "", "n", "p50", "p90", "p99"
        );
        for row in self.rows() {
            let label = if row.floor {
                format!("{:<38} [floor]", row.label)
            } else {
                row.label.to_string()
            };
            let l = row.latency;
            let _ = write!(
                out,
                "{:>2} {label:<46} {:>5} {:>9.3} {:>9.3} {:>9.3}",
                row.num,
                l.n,
                ms(l.p50),
                ms(l.p90),
                ms(l.p99)
            );
            if let Some(w) = row.workload {
                let _ = write!(
                    out,
                    "  {:.1} cmd/s ({} in {:.2} s)",
                    w.per_second(),
                    w.commands,
                    w.wall.as_secs_f64()
                );
            }
            if let Some(note) = &row.note {
                let _ = write!(out, "  {note}");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "\nratios (higher is better)");
        for r in self.ratios(args) {
            let verdict = match (r.met(), r.applies) {
                (true, true) => "met",
                (false, true) => "missed",
                (true, false) => "met (target set for 16x10, 8 parallel)",
                (false, false) => "missed (target set for 16x10, 8 parallel)",
            };
            let _ = writeln!(
                out,
                "   {:<46} {:>9.1}x  target >= {:.0}x  {verdict}",
                r.label, r.value, r.target
            );
        }
        out
    }

    fn json(&self, bench: &Bench, args: &BenchArgs) -> Value {
        let rows: serde_json::Map<String, Value> = self
            .rows()
            .into_iter()
            .map(|row| {
                let l = row.latency;
                let mut v = json!({
                    "label": row.label,
                    "floor": row.floor,
                    "n": l.n,
                    "p50_ms": ms(l.p50),
                    "p90_ms": ms(l.p90),
                    "p99_ms": ms(l.p99),
                });
                if let Some(w) = row.workload {
                    v["commands"] = json!(w.commands);
                    v["wall_ms"] = json!(ms(w.wall));
                    v["commands_per_s"] = json!(w.per_second());
                }
                if row.id == "warm_acquire" {
                    v["pool_hits"] = json!(self.pool_hits);
                    v["pool_misses"] = json!(self.pool_misses);
                }
                (row.id.to_string(), v)
            })
            .collect();
        let ratios: serde_json::Map<String, Value> = self
            .ratios(args)
            .into_iter()
            .map(|r| {
                let v = json!({
                    "label": r.label,
                    "value": r.value,
                    "target": r.target,
                    "met": r.met(),
                    "target_applies": r.applies,
                });
                (r.id.to_string(), v)
            })
            .collect();
        let m = bench.runtime.metrics();
        json!({
            "run_id": bench.run_id,
            "image": bench.image,
            "network": "none",
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "workload": {
                "sandboxes": args.sandboxes,
                "commands": args.commands,
                "parallel": args.parallel,
            },
            "rows": rows,
            "ratios": ratios,
            "metrics": {
                "sandboxes_started": m.sandboxes_started,
                "start_failures": m.start_failures,
                "retries": m.retries,
                "slot_waits": m.slot_waits,
                "breaker_opened": m.breaker_opened,
                "start_phase_mean_ms": crate::json::start_phase_means(&m),
            },
        })
    }
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
            int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
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
    fn percentiles_are_nearest_rank() {
        let l = Latency::of((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(l.n, 100);
        assert_eq!(l.p50, Duration::from_millis(50));
        assert_eq!(l.p90, Duration::from_millis(90));
        assert_eq!(l.p99, Duration::from_millis(99));
        let few = Latency::of(vec![Duration::from_millis(3), Duration::from_millis(1)]);
        assert_eq!(
            (few.p50, few.p99),
            (Duration::from_millis(1), Duration::from_millis(3))
        );
        assert_eq!(Latency::of(Vec::new()).p50, Duration::ZERO);
    }

    #[test]
    fn sizes_must_be_positive_and_name_the_value() {
        assert_eq!(at_least_one("3"), Ok(3));
        for bad in ["0", "-1", "x"] {
            assert!(at_least_one(bad)
                .expect_err("rejected")
                .contains(&format!("'{bad}'")));
        }
    }
}
