//! The harness behind `corral bench`: corral measured against floors taken
//! in the same run on the same daemon, so a noisy machine moves both sides
//! alike.
//!
//! The floors (raw create+start, raw `docker exec`, the rollout workload
//! done with them; [`floors`](crate::floors)) are the one place corral's code
//! outside the Docker backend talks to Docker itself, through
//! [`DockerBackend::docker`]: they measure what corral is compared against,
//! so they must not go through corral.
//!
//! Nothing is left behind. Every container carries the owner labels (so no
//! corral reaper elsewhere takes it for an orphan); raw ones also carry
//! `corral.sandbox=<id>` and [`BENCH_LABEL`]`=<run id>`, corral's sandboxes
//! [`SANDBOX_BENCH_LABEL`]`=<run id>` (spec labels may not use the reserved
//! `corral.` prefix). [`Bench::clean_up`] shuts the provider down and kills
//! and removes every container with this run's labels or this process's
//! owner labels, and the network rows' test internet (`corral-internet`,
//! servers the bench talks to through the `docker` CLI, as the floors
//! bypass corral); a front end calls it at the end, after an error, and on
//! an interrupt (having dropped the [`Bench::measure`] future first).
//!
//! Errors are `anyhow` with context, as they were when this lived in the
//! CLI: every one ends the run and is printed, none is acted on.

mod floors;
mod fork;
pub use fork::ForkRows;
mod isolation;
mod live;
mod net;
mod report;
mod reset;
mod stats;
mod sweep;
mod workload;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Provider, Runtime, Sandbox};
use corral_core::command::DEFAULT_MAX_OUTPUT;
use corral_core::pool::{PoolConfig, ProviderConfig};
use corral_core::{CommandResult, CommandSpec, Network, SandboxSpec};
use corral_docker::DockerBackend;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use report::Report;

use stats::Latency;
use workload::PoolMode;

/// Label on every raw container of a run; the value is the run id.
pub const BENCH_LABEL: &str = "corral.bench";
/// The run label on corral's sandboxes (`corral.` keys are reserved in specs).
pub const SANDBOX_BENCH_LABEL: &str = "corral-bench";
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

/// What one run measures. Every size is at least 1 ([`Bench::new`] checks).
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The image of every sandbox and raw container.
    pub image: String,
    /// Rollouts (sandboxes) in the workload.
    pub sandboxes: usize,
    /// Commands per rollout.
    pub commands: usize,
    /// Rollouts in flight at once.
    pub parallel: usize,
    /// Samples per latency row; `None`: 200 round trips, 50 raw execs,
    /// 50 resets, 10 starts.
    pub samples: Option<usize>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Which rows run.
    pub rows: Rows,
    /// The pool-fork rows' states and fork counts (`--rows forks`).
    pub forks: Vec<fork::ForkRows>,
}

/// Which rows a run measures (`corral bench --rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rows {
    /// Starts, round trips, resets, workloads and forks.
    #[default]
    Default,
    /// The egress gateway and port links against direct connections.
    Net,
    /// Both, default rows first.
    All,
    /// Forks of 8, 64 and 256 from 10 MB and 100 MB prepared states into
    /// warm pristine pools, against forks that start containers and
    /// against preparing each from scratch.
    Forks,
    /// gVisor against runc in the same run: cold start, round trip,
    /// reset, CPU-bound and syscall-heavy commands.
    Isolation,
    /// Live snapshots, pause to disk and live forks of 1, 8 and 32 of a
    /// gVisor sandbox holding 100 MB, against preparing 8 and 32 anew.
    Live,
}

impl Rows {
    /// Parses `default`, `net`, `all`, `forks`, `isolation` or `live`;
    /// `None` for anything else.
    pub fn parse(text: &str) -> Option<Rows> {
        match text {
            "default" => Some(Rows::Default),
            "net" => Some(Rows::Net),
            "all" => Some(Rows::All),
            "forks" => Some(Rows::Forks),
            "isolation" => Some(Rows::Isolation),
            "live" => Some(Rows::Live),
            _ => None,
        }
    }

    fn core(self) -> bool {
        matches!(self, Rows::Default | Rows::All)
    }

    fn net(self) -> bool {
        matches!(self, Rows::Net | Rows::All)
    }

    fn forks(self) -> bool {
        self == Rows::Forks
    }

    fn isolation(self) -> bool {
        self == Rows::Isolation
    }

    fn live(self) -> bool {
        self == Rows::Live
    }
}

/// How many samples each latency row takes.
struct Samples {
    starts: usize,
    raw_exec: usize,
    round_trips: usize,
    /// Resets are cheap: at least as many as starts, and more by default.
    resets: usize,
    /// Connections per kind of the network rows (HTTP, HTTPS, port links).
    connections: usize,
    /// 32 MiB transfers per side of the network rows.
    transfers: usize,
}

impl Samples {
    fn new(all: Option<usize>) -> Samples {
        match all {
            Some(n) => Samples {
                starts: n,
                raw_exec: n,
                round_trips: n,
                resets: n,
                connections: n,
                // 32 MiB each: a few tell the rate.
                transfers: n.min(5),
            },
            None => Samples {
                starts: 10,
                raw_exec: 50,
                round_trips: 200,
                resets: 50,
                connections: 100,
                transfers: 3,
            },
        }
    }

    /// Progress steps of a whole run of `options`.
    fn steps(&self, options: &BenchOptions) -> u64 {
        let mut steps = 0;
        if options.rows.core() {
            steps += self.core_steps(options);
        }
        if options.rows.net() {
            // Both sides of HTTP, HTTPS and the port links; both transfers.
            steps += (2 * 3 * self.connections + 2 * self.transfers) as u64;
        }
        if options.rows.isolation() {
            steps += isolation::steps(self.starts, self.round_trips, self.resets);
        }
        if options.rows.live() {
            steps += live::steps();
        }
        if options.rows.forks() {
            steps += options
                .forks
                .iter()
                .map(|f| 3 * f.counts.iter().sum::<usize>() as u64)
                .sum::<u64>();
        }
        steps
    }

    /// Progress steps of the default rows.
    fn core_steps(&self, options: &BenchOptions) -> u64 {
        (3 * self.starts
            + self.raw_exec
            + 2 * self.round_trips
            + self.resets
            // Seven workload passes (through corral, plain, batch pool, reused
            // pool, pristine pool, commands only through corral and raw) of
            // N x M commands.
            + 7 * options.sandboxes * options.commands
            // P sandboxes prepared from scratch, P forked each way.
            + 3 * options.parallel) as u64
    }
}

/// One bench run: the measuring context, shared with its rollout tasks.
pub struct Bench {
    /// corral's runtime over the daemon.
    runtime: Runtime,
    /// The daemon itself, for the raw floors.
    backend: DockerBackend,
    options: BenchOptions,
    samples: Samples,
    spec: SandboxSpec,
    run_id: String,
    raw_seq: AtomicUsize,
    progress: ProgressBar,
    /// The provider while one exists, so an interrupt can shut it down.
    provider: Mutex<Option<Provider>>,
    /// The network rows' servers while they exist, so an interrupt or an
    /// error removes them too.
    internet: Mutex<Option<corral_internet::Internet>>,
}

impl Bench {
    /// A run over `runtime` and the Docker daemon under it, with a fresh
    /// run id; nothing is created until [`measure`](Self::measure).
    pub fn new(
        runtime: Runtime,
        backend: DockerBackend,
        options: BenchOptions,
    ) -> anyhow::Result<Arc<Bench>> {
        for (field, value) in [
            ("sandboxes", options.sandboxes),
            ("commands", options.commands),
            ("parallel", options.parallel),
            ("samples", options.samples.unwrap_or(1)),
        ] {
            if value == 0 {
                bail!("bench option `{field}` must be at least 1, not {value}");
            }
        }
        let run_id = format!("bench-{}", corral::host::random_hex(10));
        let mut spec = SandboxSpec::new(options.image.clone());
        spec.network = Network::None;
        spec.labels
            .insert(SANDBOX_BENCH_LABEL.into(), run_id.clone());
        let samples = Samples::new(options.samples);
        let progress = progress_bar(samples.steps(&options), !options.progress);
        Ok(Arc::new(Bench {
            runtime,
            backend,
            options,
            samples,
            spec,
            run_id,
            raw_seq: AtomicUsize::new(0),
            progress,
            provider: Mutex::new(None),
            internet: Mutex::new(None),
        }))
    }

    /// This run's id, the value of its labels.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Takes the progress bar off the terminal.
    pub fn hide_progress(&self) {
        self.progress.finish_and_clear();
    }

    /// Shuts down the provider if one is live, then kills and removes
    /// every container of this run (`settle`: until the daemon shows none
    /// three times running, for requests a dropped [`measure`](Self::measure)
    /// may still have had in flight); returns how many the sweep removed.
    pub async fn clean_up(&self, settle: bool) -> anyhow::Result<usize> {
        let provider = lock(&self.provider).take();
        if let Some(provider) = provider {
            if tokio::time::timeout(SHUTDOWN_TIMEOUT, provider.shutdown())
                .await
                .is_err()
            {
                tracing::warn!("the provider did not shut down in time; sweeping by label");
            }
        }
        let swept = self.sweep(settle).await;
        // After the sweep: its sandboxes' gateways were on its network.
        let internet = lock(&self.internet).take();
        if let Some(net) = internet {
            let _ = tokio::task::spawn_blocking(move || net.tear_down()).await;
        }
        // The fork row's snapshots, if an interrupt or error left them.
        for name in [
            self.fork_snapshot_name(),
            self.commit_snapshot_name(),
            self.pool_fork_snapshot_name(),
        ] {
            if self.runtime.snapshot_info(&name).await.is_ok() {
                if let Err(e) = self.runtime.delete_snapshot(&name).await {
                    tracing::warn!(snapshot = %name, error = %e, "deleting the bench snapshot failed");
                }
            }
        }
        swept
    }

    /// Measures every row, one after the other. Dropping the future aborts
    /// the rollout tasks; [`clean_up`](Self::clean_up) removes what they
    /// had in flight.
    pub async fn measure(self: &Arc<Self>) -> anyhow::Result<Report> {
        let core = match self.options.rows.core() {
            true => Some(self.measure_core().await?),
            false => None,
        };
        let net = match self.options.rows.net() {
            true => Some(self.measure_net().await?),
            false => None,
        };
        let forks = match self.options.rows.forks() {
            true => Some(self.pool_forks().await?),
            false => None,
        };
        let isolation = match self.options.rows.isolation() {
            true => Some(self.measure_isolation().await?),
            false => None,
        };
        let live = match self.options.rows.live() {
            true => Some(self.measure_live().await?),
            false => None,
        };
        Ok(Report {
            core,
            net,
            forks,
            isolation,
            live,
        })
    }

    /// The default rows.
    async fn measure_core(self: &Arc<Self>) -> anyhow::Result<report::CoreReport> {
        let n = &self.samples;
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

        self.progress.set_message("reset (pristine sandbox)");
        let resets = self.resets(n.resets).await?;

        self.progress.set_message("workload, plain");
        let plain = self.workload(true).await?;
        self.progress.set_message("workload through corral");
        let corral = self.workload(false).await?;
        self.progress
            .set_message("workload through corral, warm pool");
        let corral_pooled = self.workload_pooled(PoolMode::Batch).await?;
        self.progress
            .set_message("workload through corral, reused pool");
        let corral_reused = self.workload_pooled(PoolMode::Reuse).await?;
        self.progress
            .set_message("workload through corral, pristine pool");
        let corral_pristine = self.workload_pooled(PoolMode::Pristine).await?;
        self.progress
            .set_message("workload commands, plain exec (started containers)");
        let plain_commands = self.workload_started(true).await?;
        self.progress
            .set_message("workload commands through corral (started sandboxes)");
        let corral_commands = self.workload_started(false).await?;
        self.progress
            .set_message("fork a prepared sandbox vs prepare each");
        let fork = self.fork_vs_scratch(self.options.parallel).await?;

        Ok(report::CoreReport {
            raw_start,
            cold_start,
            warm_acquire,
            pool_hits,
            pool_misses,
            raw_exec,
            agent,
            shell,
            reset: resets.latency,
            reset_killed: resets.killed,
            corral,
            plain,
            corral_pooled,
            corral_reused,
            corral_pristine,
            corral_commands,
            plain_commands,
            fork,
        })
    }
    /// Pulls the image and agent volume into place and the page cache warm,
    /// so no row pays a first-time cost; returns the sandbox the exec rows use.
    async fn warm_up(&self) -> anyhow::Result<Sandbox> {
        self.backend
            .ensure_image(&self.options.image)
            .await
            .with_context(|| format!("image {}", self.options.image))?;
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
                    pristine: false,
                    on_idle: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_default_per_row_or_one_count_for_all() {
        let d = Samples::new(None);
        assert_eq!(
            (d.starts, d.raw_exec, d.round_trips, d.resets),
            (10, 50, 200, 50)
        );
        let five = Samples::new(Some(5));
        assert_eq!(
            (five.starts, five.raw_exec, five.round_trips, five.resets),
            (5, 5, 5, 5)
        );
    }

    #[test]
    fn steps_count_every_sample_and_every_workload_command() {
        let options = BenchOptions {
            image: "corral-test/busybox".into(),
            sandboxes: 4,
            commands: 3,
            parallel: 2,
            samples: Some(5),
            progress: false,
            rows: Rows::Default,
            forks: ForkRows::defaults(),
        };
        // Raw and cold starts and warm acquires, raw execs, agent and
        // shell round trips, resets; seven workload passes of 4 x 3; two
        // sandboxes prepared and two forked each way.
        assert_eq!(
            Samples::new(Some(5)).steps(&options),
            3 * 5 + 5 + 2 * 5 + 5 + 7 * 12 + 3 * 2
        );
        // The network rows: both sides of HTTP, HTTPS and the port links,
        // and of the transfers (at most five each).
        let net = BenchOptions {
            rows: Rows::Net,
            ..options.clone()
        };
        assert_eq!(Samples::new(Some(5)).steps(&net), 2 * 3 * 5 + 2 * 5);
        assert_eq!(Samples::new(Some(50)).steps(&net), 2 * 3 * 50 + 2 * 5);
        let all = BenchOptions {
            rows: Rows::All,
            ..options
        };
        assert_eq!(
            Samples::new(Some(5)).steps(&all),
            3 * 5 + 5 + 2 * 5 + 5 + 7 * 12 + 3 * 2 + 2 * 3 * 5 + 2 * 5
        );
        // The pool-fork rows: three ways of each count.
        let forks = BenchOptions {
            rows: Rows::Forks,
            forks: vec![ForkRows::parse("10:8,64").expect("parses")],
            ..all
        };
        assert_eq!(Samples::new(Some(5)).steps(&forks), 3 * (8 + 64));
    }

    #[test]
    fn fork_rows_parse_or_name_what_is_wrong() {
        assert_eq!(
            ForkRows::parse("10:8,64"),
            Ok(ForkRows {
                mb: 10,
                counts: vec![8, 64]
            })
        );
        for (bad, named) in [
            ("10", "MB:K"),
            ("0:8", "state size '0'"),
            ("10:8,x", "fork count 'x'"),
            ("10:", "fork count ''"),
        ] {
            let e = ForkRows::parse(bad).expect_err(bad);
            assert!(e.contains(named), "{bad}: {e}");
        }
    }

    #[test]
    fn rows_parse_by_name_and_nothing_else() {
        assert_eq!(Rows::parse("default"), Some(Rows::Default));
        assert_eq!(Rows::parse("net"), Some(Rows::Net));
        assert_eq!(Rows::parse("all"), Some(Rows::All));
        assert_eq!(Rows::parse("network"), None);
        assert!(Rows::All.core() && Rows::All.net());
        assert!(Rows::Default.core() && !Rows::Default.net());
        assert!(!Rows::Net.core() && Rows::Net.net());
    }

    #[test]
    fn check_names_the_sandbox_and_the_exit() {
        let ok = CommandResult {
            exit_code: Some(0),
            ..CommandResult::default()
        };
        assert!(check(&ok, "sb-1").is_ok());
        let failed = CommandResult {
            exit_code: Some(1),
            ..CommandResult::default()
        };
        let e = check(&failed, "sb-1").expect_err("exit 1 fails");
        assert_eq!(
            e.to_string(),
            "`true` in sandbox sb-1 exited Some(1) (signal None)"
        );
    }
}
