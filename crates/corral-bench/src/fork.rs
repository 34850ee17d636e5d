//! Fork of a prepared sandbox into K sandboxes, against preparing K from
//! scratch, in the same run; and the two ways a fork travels on Docker,
//! from the same prepared source: its changes through the agents' streams
//! (a `delta` snapshot, the default for a sandbox that resets in place)
//! against `docker commit` and K creates from the image.
//!
//! The preparation is synthetic: 50 MB of files written into the root file
//! system (a cloned repository and its dependencies, in spirit). A real
//! preparation (a clone, a `pip install`) takes far longer than writing
//! 50 MB, so this understates what a fork saves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Sandbox, SnapshotOptions};
use corral_core::snapshot::SnapshotKind;
use corral_core::CommandSpec;

use crate::Bench;

/// What the preparation writes: 50 files of 1 MB under /srv/prepared.
const PREPARE: &str = "mkdir -p /srv/prepared && for i in $(seq 1 50); do \
     head -c 1048576 /dev/urandom > /srv/prepared/f$i || exit 1; done";

/// What each sandbox checks it has (not timed).
const CHECK: &str = "test $(ls /srv/prepared | wc -l) -eq 50 && test -s /srv/prepared/f50";

/// Forking against preparing, K sandboxes each way.
#[derive(Debug, Clone)]
pub(crate) struct ForkRun {
    /// Sandboxes made each way.
    pub(crate) k: usize,
    /// Preparing the one source sandbox (start and preparation).
    pub(crate) prepare_source: Duration,
    /// Keeping its snapshot (a delta through its agent's stream).
    pub(crate) snapshot: Duration,
    /// Starting K sandboxes from it, all at once (each takes the delta in).
    pub(crate) fork: Duration,
    /// The same source kept by `docker commit` (its delta applied to the
    /// container first), and K sandboxes started from the image.
    pub(crate) commit: ForkWay,
    /// Starting and preparing K sandboxes from scratch, all at once.
    pub(crate) scratch: Duration,
}

/// One way from a prepared sandbox to K: the snapshot, then the fork.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkWay {
    pub(crate) snapshot: Duration,
    pub(crate) fork: Duration,
}

impl ForkWay {
    pub(crate) fn wall(&self) -> Duration {
        self.snapshot + self.fork
    }
}

impl ForkRun {
    /// From a prepared sandbox to K prepared sandboxes: snapshot and fork.
    pub(crate) fn fork_wall(&self) -> Duration {
        self.snapshot + self.fork
    }
}

fn prepare() -> CommandSpec {
    CommandSpec::shell(PREPARE).timeout(Duration::from_secs(300))
}

async fn ok(sb: &Sandbox, cmd: CommandSpec, what: &str) -> anyhow::Result<()> {
    let r = sb.run(&cmd).await;
    if !r.success() {
        bail!(
            "{what} in sandbox {} failed: {:?} {}",
            sb.id(),
            r.failure,
            String::from_utf8_lossy(&r.stderr)
        );
    }
    Ok(())
}

async fn destroy_all(sandboxes: &[Sandbox]) {
    for r in futures_util::future::join_all(sandboxes.iter().map(Sandbox::destroy)).await {
        if let Err(e) = r {
            tracing::warn!(error = %e, "destroying a fork bench sandbox failed");
        }
    }
}

impl Bench {
    /// The snapshot this run's fork row keeps (deleted at the end and by
    /// [`Bench::clean_up`]).
    pub(crate) fn fork_snapshot_name(&self) -> String {
        format!("{}-fork", self.run_id)
    }

    /// The image snapshot the fork row's `docker commit` way keeps.
    pub(crate) fn commit_snapshot_name(&self) -> String {
        format!("{}-fork-commit", self.run_id)
    }

    /// Snapshot `name` of `source` as `kind`, then K forks of it (checked,
    /// then destroyed).
    async fn fork_one_way(
        &self,
        source: &Sandbox,
        name: &str,
        kind: SnapshotKind,
        k: usize,
    ) -> anyhow::Result<ForkWay> {
        let t = Instant::now();
        let opts = SnapshotOptions {
            kind: Some(kind),
            ..SnapshotOptions::default()
        };
        let info = source
            .snapshot(name, opts)
            .await
            .with_context(|| format!("keeping the {} snapshot", kind.as_str()))?;
        let snapshot = t.elapsed();
        if info.kind != kind {
            bail!(
                "asked for a {} snapshot, got {:?}",
                kind.as_str(),
                info.kind
            );
        }
        let t = Instant::now();
        let forks = self
            .runtime
            .fork(name, k)
            .await
            .with_context(|| format!("forking the {} snapshot", kind.as_str()))?;
        let fork = t.elapsed();
        let checked = async {
            for f in &forks {
                ok(f, CommandSpec::shell(CHECK), "checking a fork").await?;
            }
            anyhow::Ok(())
        }
        .await;
        destroy_all(&forks).await;
        checked?;
        Ok(ForkWay { snapshot, fork })
    }

    /// K sandboxes prepared from scratch (all at once), then one prepared,
    /// snapshotted and forked into K.
    pub(crate) async fn fork_vs_scratch(self: &Arc<Self>, k: usize) -> anyhow::Result<ForkRun> {
        // Pristine: its changes are a delta its agent can send, and the
        // same source can also be committed.
        let mut spec = self.spec.clone();
        spec.pristine = true;
        // From scratch: K starts and K preparations, all at once.
        let t = Instant::now();
        let made = futures_util::future::join_all((0..k).map(|_| async {
            let sb = self
                .runtime
                .create(&spec)
                .await
                .context("a scratch start")?;
            let prepared = ok(&sb, prepare(), "preparing").await;
            anyhow::Ok((sb, prepared))
        }))
        .await;
        let scratch = t.elapsed();
        let mut scratch_sandboxes = Vec::new();
        let mut failed = None;
        for m in made {
            match m {
                Ok((sb, prepared)) => {
                    scratch_sandboxes.push(sb);
                    if let Err(e) = prepared {
                        failed.get_or_insert(e);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        destroy_all(&scratch_sandboxes).await;
        if let Some(e) = failed {
            return Err(e);
        }
        self.progress.inc(k as u64);

        // Forking: one prepared source, its snapshot, K forks.
        let name = self.fork_snapshot_name();
        let t = Instant::now();
        let source = self
            .runtime
            .create(&spec)
            .await
            .context("the fork source")?;
        let prepared = ok(&source, prepare(), "preparing the source").await;
        let prepare_source = t.elapsed();
        let commit_name = self.commit_snapshot_name();
        let run = async {
            prepared?;
            let delta = self
                .fork_one_way(&source, &name, SnapshotKind::Delta, k)
                .await?;
            self.progress.inc(k as u64);
            let commit = self
                .fork_one_way(&source, &commit_name, SnapshotKind::Image, k)
                .await?;
            self.progress.inc(k as u64);
            anyhow::Ok(ForkRun {
                k,
                prepare_source,
                snapshot: delta.snapshot,
                fork: delta.fork,
                commit,
                scratch,
            })
        }
        .await;
        destroy_all(std::slice::from_ref(&source)).await;
        for n in [&name, &commit_name] {
            if self.runtime.snapshot_info(n).await.is_ok() {
                if let Err(e) = self.runtime.delete_snapshot(n).await {
                    tracing::warn!(snapshot = %n, error = %e, "deleting the bench snapshot failed");
                }
            }
        }
        run
    }
}

/// The prepared states of the pool-fork rows, in MB, and the fork counts
/// of each: 256 forks of 100 MB would hold 25 GB of tmpfs on a 24 GiB
/// host (every fork keeps its own copy of the delta in memory), so the
/// 100 MB state stops at 64.
pub(crate) const POOL_FORKS: [(usize, &[usize]); 2] = [(10, &[8, 64, 256]), (100, &[8, 64])];

/// One prepared state of the pool-fork rows and the fork counts from it
/// (`corral bench --forks MB:K,K`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRows {
    /// Size of the prepared state, MB.
    pub mb: usize,
    /// Forks made from it, one row each.
    pub counts: Vec<usize>,
}

impl ForkRows {
    /// [`POOL_FORKS`]: forks of 8, 64 and 256 from 10 MB, 8 and 64 from
    /// 100 MB.
    pub fn defaults() -> Vec<ForkRows> {
        POOL_FORKS
            .iter()
            .map(|(mb, counts)| ForkRows {
                mb: *mb,
                counts: counts.to_vec(),
            })
            .collect()
    }

    /// Parses `MB:K[,K...]` (each at least 1), or says what is wrong.
    pub fn parse(text: &str) -> Result<ForkRows, String> {
        let whole = |t: &str, what: &str| match t.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "'{text}': {what} '{t}' is not a whole number of at least 1 (expected MB:K[,K...])"
            )),
        };
        let (mb, counts) = text
            .split_once(':')
            .ok_or_else(|| format!("'{text}' is not MB:K[,K...] (e.g. 10:8,64)"))?;
        Ok(ForkRows {
            mb: whole(mb, "the state size")?,
            counts: counts
                .split(',')
                .map(|k| whole(k, "the fork count"))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// Most warm sandboxes a fork pool keeps: a pool is what a service keeps
/// ready for its next batch, not one container per fork ever asked for.
/// Forks beyond it start containers (while the pool refills behind them),
/// and the pool row says how many landed warm. On 2 cores a pool of 64
/// fills in well under a minute; one of 256 takes minutes and holds
/// memory a shared machine needs.
const POOL_WARM_MAX: usize = 64;

/// Longest one way of one row may take before the row reports it as not
/// run (its sandboxes are swept with the run's).
const WAY_TIMEOUT: Duration = Duration::from_secs(600);

/// Writes `mb` files of 1 MB under /srv/prepared.
fn prepare_mb(mb: usize) -> CommandSpec {
    CommandSpec::shell(format!(
        "mkdir -p /srv/prepared && for i in $(seq 1 {mb}); do \
         head -c 1048576 /dev/urandom > /srv/prepared/f$i || exit 1; done"
    ))
    .timeout(Duration::from_secs(300))
}

fn check_mb(mb: usize) -> CommandSpec {
    CommandSpec::shell(format!(
        "test $(ls /srv/prepared | wc -l) -eq {mb} && test -s /srv/prepared/f{mb}"
    ))
}

/// A way's wall time, or why it could not be measured.
pub(crate) type Way = Result<Duration, String>;

/// K sandboxes with one prepared state, three ways, in one run.
#[derive(Debug, Clone)]
pub(crate) struct PoolForkRun {
    /// Size of the prepared state, MB.
    pub(crate) mb: usize,
    /// Sandboxes made each way.
    pub(crate) k: usize,
    /// K sandboxes started and prepared from scratch, all at once.
    pub(crate) scratch: Way,
    /// K forks that each start a container and take the delta in.
    pub(crate) started: Way,
    /// K forks into warm pristine sandboxes of a matching pool.
    pub(crate) pooled: Way,
    /// Warm sandboxes the pool held before the forks.
    pub(crate) warm: usize,
    /// Of the forks, how many landed in a warm sandbox (the rest started one).
    pub(crate) landed: u64,
    /// Filling the pool beforehand (not in `pooled`).
    pub(crate) fill: Duration,
    /// Copying the state inside one sandbox (`cp -a` to its tmpfs upper
    /// layer): the floor of taking the delta in, without stream or tar.
    pub(crate) copy: Way,
    /// The first row of its state: it carries the copy floor.
    pub(crate) first_of_state: bool,
}

/// Keeps the error's chain on one line, for a row's note.
fn reason(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

impl Bench {
    /// The snapshot the pool-fork rows keep (deleted at the end and by
    /// [`Bench::clean_up`]).
    pub(crate) fn pool_fork_snapshot_name(&self) -> String {
        format!("{}-pool-fork", self.run_id)
    }

    /// Every size and count of [`POOL_FORKS`]: from scratch, forks that
    /// start containers, forks into a warm pool. A way that fails is
    /// reported on its row with the reason; the other ways and rows still
    /// run.
    pub(crate) async fn pool_forks(self: &Arc<Self>) -> anyhow::Result<Vec<PoolForkRun>> {
        let mut runs = Vec::new();
        for ForkRows { mb, counts } in self.options.forks.clone() {
            let counts = counts.as_slice();
            let mut spec = self.spec.clone();
            spec.pristine = true;
            let name = self.pool_fork_snapshot_name();
            let source = self
                .runtime
                .create(&spec)
                .await
                .context("the pool-fork source");
            let source = match source {
                Ok(sb) => sb,
                Err(e) => {
                    let why = reason(&e);
                    runs.extend(counts.iter().map(|&k| PoolForkRun::not_run(mb, k, &why)));
                    continue;
                }
            };
            let prepared = async {
                ok(&source, prepare_mb(mb), "preparing the source").await?;
                let copy = self.copy_floor(&source).await;
                let info = source
                    .snapshot(&name, SnapshotOptions::default())
                    .await
                    .context("the pool-fork snapshot")?;
                anyhow::Ok((info, copy))
            }
            .await;
            // Forks need only the snapshot: the source's memory goes back
            // before they start.
            destroy_all(std::slice::from_ref(&source)).await;
            match prepared {
                Ok((info, copy)) => {
                    for (i, &k) in counts.iter().enumerate() {
                        self.progress
                            .set_message(format!("fork {k} from a {mb} MB state, three ways"));
                        let mut run = self.pool_fork_run(&spec, &info, mb, k).await;
                        run.copy = copy.clone();
                        run.first_of_state = i == 0;
                        runs.push(run);
                    }
                }
                Err(e) => {
                    let why = reason(&e);
                    runs.extend(counts.iter().map(|&k| PoolForkRun::not_run(mb, k, &why)));
                }
            }
            if self.runtime.snapshot_info(&name).await.is_ok() {
                if let Err(e) = self.runtime.delete_snapshot(&name).await {
                    tracing::warn!(snapshot = %name, error = %e, "deleting the bench snapshot failed");
                }
            }
        }
        Ok(runs)
    }

    /// Times `cp -a` of the prepared state inside `sb` (then removes the
    /// copy).
    async fn copy_floor(&self, sb: &Sandbox) -> Way {
        let t = Instant::now();
        let copied = ok(
            sb,
            CommandSpec::shell("cp -a /srv/prepared /srv/copy").timeout(Duration::from_secs(300)),
            "copying the state",
        )
        .await;
        let took = t.elapsed();
        let removed = ok(
            sb,
            CommandSpec::shell("rm -rf /srv/copy"),
            "removing the copy",
        )
        .await;
        copied.and(removed).map(|()| took).map_err(|e| reason(&e))
    }

    /// One way, bounded by [`WAY_TIMEOUT`], as a row shows it.
    async fn way(
        &self,
        k: usize,
        what: &str,
        f: impl std::future::Future<Output = anyhow::Result<Duration>>,
    ) -> Way {
        let r = match tokio::time::timeout(WAY_TIMEOUT, f).await {
            Ok(r) => r.map_err(|e| reason(&e)),
            Err(_) => Err(format!("{what} took over {WAY_TIMEOUT:?}")),
        };
        if let Err(e) = &r {
            tracing::warn!(forks = k, way = what, error = %e, "a pool-fork way did not complete");
        }
        self.progress.inc(k as u64);
        r
    }

    async fn pool_fork_run(
        self: &Arc<Self>,
        spec: &corral_core::SandboxSpec,
        info: &corral_core::snapshot::SnapshotInfo,
        mb: usize,
        k: usize,
    ) -> PoolForkRun {
        let scratch = self
            .way(k, "preparing from scratch", self.scratch_way(spec, mb, k))
            .await;
        let started = self
            .way(
                k,
                "forking by starting containers",
                self.start_way(info, mb, k),
            )
            .await;
        let mut pool = (0, 0, Duration::ZERO);
        let pooled = self
            .way(k, "forking into a warm pool", async {
                let (took, warm, landed, fill) = self.pool_way(info, mb, k).await?;
                pool = (warm, landed, fill);
                Ok(took)
            })
            .await;
        PoolForkRun {
            mb,
            k,
            scratch,
            started,
            pooled,
            warm: pool.0,
            landed: pool.1,
            fill: pool.2,
            copy: Err("not measured".into()),
            first_of_state: false,
        }
    }

    /// K starts and K preparations, all at once.
    async fn scratch_way(
        &self,
        spec: &corral_core::SandboxSpec,
        mb: usize,
        k: usize,
    ) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let made = futures_util::future::join_all((0..k).map(|_| async {
            let sb = self.runtime.create(spec).await.context("a scratch start")?;
            let prepared = ok(&sb, prepare_mb(mb), "preparing").await;
            anyhow::Ok((sb, prepared))
        }))
        .await;
        let scratch = t.elapsed();
        let mut sandboxes = Vec::new();
        let mut failed = None;
        for m in made {
            match m {
                Ok((sb, prepared)) => {
                    sandboxes.push(sb);
                    if let Err(e) = prepared {
                        failed.get_or_insert(e);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        destroy_all(&sandboxes).await;
        match failed {
            Some(e) => Err(e),
            None => Ok(scratch),
        }
    }

    /// K container starts, each taking the delta in.
    async fn start_way(
        &self,
        info: &corral_core::snapshot::SnapshotInfo,
        mb: usize,
        k: usize,
    ) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let forks = self
            .runtime
            .fork(&info.qualified().to_string(), k)
            .await
            .context("forking by starting containers")?;
        let started = t.elapsed();
        let checked = match forks.first() {
            Some(f) => ok(f, check_mb(mb), "checking a fork").await,
            None => Err(anyhow::anyhow!("the fork made no sandbox")),
        };
        destroy_all(&forks).await;
        checked.map(|()| started)
    }

    /// K forks into a warm pool whose spec is the snapshot's, filled
    /// beforehand with up to [`POOL_WARM_MAX`]: the forks' time, the warm
    /// sandboxes, how many forks landed in one, and the fill's time.
    async fn pool_way(
        self: &Arc<Self>,
        info: &corral_core::snapshot::SnapshotInfo,
        mb: usize,
        k: usize,
    ) -> anyhow::Result<(Duration, usize, u64, Duration)> {
        let fork_spec = info.fork_spec();
        let base = self.runtime.fork_base(info).await?;
        let warm = k.min(POOL_WARM_MAX);
        let config = corral_core::pool::ProviderConfig {
            pools: std::collections::BTreeMap::from([(
                "forks".to_string(),
                corral_core::pool::PoolConfig {
                    spec: fork_spec.clone(),
                    warm,
                    pristine: true,
                    ..Default::default()
                },
            )]),
            // Room for every fork and the refill behind them: no fork
            // waits for room, none evicts another.
            max_live: k + warm,
            ..Default::default()
        };
        let provider = corral::Provider::new(self.runtime.clone(), config);
        *crate::lock(&self.provider) = Some(provider.clone());
        let run = async {
            let t = Instant::now();
            let fill = crate::FILL_TIMEOUT + Duration::from_secs(warm as u64);
            if !provider.wait_warm("forks", fill).await {
                bail!(
                    "the fork pool did not reach {warm} warm sandboxes within {fill:?} (it held {})",
                    provider.stats().pooled.get("forks").copied().unwrap_or(0)
                );
            }
            let filled = t.elapsed();
            let hits = provider.stats().pool_hits;
            let t = Instant::now();
            let keys: Vec<String> = (0..k).map(|i| format!("fork-{i}")).collect();
            let leases = futures_util::future::join_all(
                keys.iter()
                    .map(|key| provider.acquire_fork(key, &fork_spec, base.clone(), None)),
            )
            .await;
            let pooled = t.elapsed();
            let landed = provider.stats().pool_hits - hits;
            let mut leases = leases
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .context("forking into the pool")?;
            // The first lands warm, the last (past the pool) may not.
            for lease in [leases.first(), leases.last()].into_iter().flatten() {
                ok(lease, check_mb(mb), "checking a pool fork").await?;
            }
            leases.clear();
            anyhow::Ok((pooled, warm, landed, filled))
        }
        .await;
        provider.shutdown().await;
        crate::lock(&self.provider).take();
        run
    }
}

impl PoolForkRun {
    /// A row none of whose ways could run, for `why`.
    fn not_run(mb: usize, k: usize, why: &str) -> PoolForkRun {
        PoolForkRun {
            mb,
            k,
            scratch: Err(why.to_string()),
            started: Err(why.to_string()),
            pooled: Err(why.to_string()),
            warm: 0,
            landed: 0,
            fill: Duration::ZERO,
            copy: Err(why.to_string()),
            first_of_state: false,
        }
    }

    /// Its rows: from scratch (the floor), forks that start containers,
    /// forks into the warm pool; a way that did not complete has no
    /// samples and says why. The 10 MB and 100 MB states' first rows also
    /// carry the copy floor.
    pub(crate) fn rows(&self) -> Vec<crate::report::Row<'_>> {
        use crate::report::Row;
        use crate::stats::{ms, times, Latency};
        use serde_json::json;
        let (mb, k) = (self.mb, self.k);
        let id = |way: &str| format!("pool_fork_{mb}mb_{k}_{way}");
        let latency = |w: &Way| Latency::of(w.as_ref().map(|d| vec![*d]).unwrap_or_default());
        let failed = |w: &Way| w.as_ref().err().map(|e| format!("not run: {e}"));
        let ratio = |a: &Way, b: &Way| match (a, b) {
            (Ok(a), Ok(b)) => Some(times(*a, *b)),
            _ => None,
        };
        let shown = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}x"));
        let mut rows = vec![
            Row::new(
                id("scratch"),
                "",
                format!("prepare {k} from scratch ({mb} MB state)"),
                latency(&self.scratch),
            )
            .floor()
            .noted(failed(&self.scratch))
            .with("forks", json!(k))
            .with("state_mb", json!(mb)),
            Row::new(
                id("start"),
                "",
                format!("fork {k}, a container start each ({mb} MB)"),
                latency(&self.started),
            )
            .noted(failed(&self.started).or_else(|| {
                Some(format!(
                    "{} scratch",
                    shown(ratio(&self.scratch, &self.started))
                ))
            }))
            .with("forks", json!(k))
            .with("state_mb", json!(mb)),
        ];
        let pool_note = failed(&self.pooled).or_else(|| {
            // Only when every fork landed warm is the time all imports.
            let import = match &self.pooled {
                Ok(d) if self.landed == k as u64 => format!(
                    "; {:.0} MB/s taken in",
                    (k * mb) as f64 / d.as_secs_f64().max(1e-9)
                ),
                _ => String::new(),
            };
            Some(format!(
                "{}/{k} warm (pool of {}); {} scratch, {} container-start fork\
                 {import}; pool filled in {:.0} ms before",
                self.landed,
                self.warm,
                shown(ratio(&self.scratch, &self.pooled)),
                shown(ratio(&self.started, &self.pooled)),
                ms(self.fill)
            ))
        });
        rows.push(
            Row::new(
                id("pool"),
                "",
                format!("fork {k} into a warm pristine pool ({mb} MB)"),
                latency(&self.pooled),
            )
            .noted(pool_note)
            .with("forks", json!(k))
            .with("state_mb", json!(mb))
            .with("pool_warm", json!(self.warm))
            .with("landed_warm", json!(self.landed))
            .with("fill_ms", json!(ms(self.fill))),
        );
        if self.first_of_state {
            let copy_note = failed(&self.copy).or_else(|| {
                self.copy.as_ref().ok().map(|d| {
                    format!(
                        "{:.0} MB/s on one core",
                        mb as f64 / d.as_secs_f64().max(1e-9)
                    )
                })
            });
            rows.insert(
                0,
                Row::new(
                    format!("pool_fork_{mb}mb_copy"),
                    "",
                    format!("copy the {mb} MB state inside one sandbox"),
                    latency(&self.copy),
                )
                .floor()
                .noted(copy_note)
                .with("state_mb", json!(mb)),
            );
        }
        rows
    }
}

/// The targets of the pool-fork rows: a fork of 64 from a 10 MB state
/// at least 10x preparing 64 from scratch, and ahead of today's fork
/// (none when a way of that row did not complete: its row says why).
pub(crate) fn pool_fork_ratios(runs: &[PoolForkRun]) -> Vec<crate::report::Ratio> {
    use crate::report::Ratio;
    use crate::stats::times;
    let Some(run) = runs.iter().find(|r| r.mb == 10 && r.k == 64) else {
        return Vec::new();
    };
    let (Ok(scratch), Ok(started), Ok(pooled)) = (&run.scratch, &run.started, &run.pooled) else {
        return Vec::new();
    };
    vec![
        Ratio {
            id: "pool_fork_64_10mb_vs_prepare",
            label: "fork 64 (10 MB) into a pool vs preparing 64",
            value: times(*scratch, *pooled),
            target: 10.0,
            applies: true,
        },
        Ratio {
            id: "pool_fork_64_10mb_vs_start_fork",
            label: "fork 64 (10 MB) into a pool vs starting 64",
            value: times(*started, *pooled),
            target: 1.0,
            applies: true,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pooled: Way) -> PoolForkRun {
        PoolForkRun {
            mb: 10,
            k: 64,
            scratch: Ok(Duration::from_secs(20)),
            started: Ok(Duration::from_secs(10)),
            pooled,
            warm: 64,
            landed: 64,
            fill: Duration::from_secs(30),
            copy: Err("not measured".into()),
            first_of_state: false,
        }
    }

    #[test]
    fn a_way_that_did_not_run_says_why_and_has_no_ratio() {
        let r = run(Err("the fork pool did not reach 64 warm sandboxes".into()));
        let rows = r.rows();
        assert_eq!(rows.len(), 3);
        let pool = rows.last().expect("the pool row");
        assert_eq!(pool.latency.n, 0);
        assert_eq!(
            pool.note.as_deref(),
            Some("not run: the fork pool did not reach 64 warm sandboxes")
        );
        assert!(pool_fork_ratios(std::slice::from_ref(&r)).is_empty());
    }

    #[test]
    fn a_completed_row_has_its_ratios() {
        let r = run(Ok(Duration::from_secs(1)));
        let ratios = pool_fork_ratios(std::slice::from_ref(&r));
        let values: Vec<f64> = ratios.iter().map(|r| r.value).collect();
        assert_eq!(values, [20.0, 10.0]);
        let pool = r.rows().pop().expect("the pool row");
        assert_eq!(pool.latency.n, 1);
        assert!(
            pool.note
                .as_deref()
                .unwrap_or_default()
                .starts_with("64/64 warm (pool of 64); 20.0x scratch, 10.0x"),
            "{:?}",
            pool.note
        );
    }

    #[test]
    fn the_first_count_of_a_state_carries_its_copy_floor() {
        let mut r = run(Ok(Duration::from_secs(1)));
        r.k = 8;
        r.copy = Ok(Duration::from_millis(100));
        assert_eq!(r.rows().len(), 3, "not the first row of its state");
        r.first_of_state = true;
        let rows = r.rows();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0].note.as_deref(), Some("100 MB/s on one core"));
    }
}
