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

/// K sandboxes with one prepared state, three ways, in one run.
#[derive(Debug, Clone)]
pub(crate) struct PoolForkRun {
    /// Size of the prepared state, MB.
    pub(crate) mb: usize,
    /// Sandboxes made each way.
    pub(crate) k: usize,
    /// K sandboxes started and prepared from scratch, all at once.
    pub(crate) scratch: Duration,
    /// K forks that each start a container and take the delta in.
    pub(crate) started: Duration,
    /// K forks into warm pristine sandboxes of a matching pool.
    pub(crate) pooled: Duration,
    /// Of those, how many landed in a warm sandbox (the rest started one).
    pub(crate) landed: u64,
    /// Filling the pool with K warm sandboxes beforehand (not in `pooled`).
    pub(crate) fill: Duration,
}

impl Bench {
    /// The snapshot the pool-fork rows keep (deleted at the end and by
    /// [`Bench::clean_up`]).
    pub(crate) fn pool_fork_snapshot_name(&self) -> String {
        format!("{}-pool-fork", self.run_id)
    }

    /// Every size and count of [`POOL_FORKS`]: from scratch, forks that
    /// start containers, forks into a warm pool.
    pub(crate) async fn pool_forks(self: &Arc<Self>) -> anyhow::Result<Vec<PoolForkRun>> {
        let mut runs = Vec::new();
        for (mb, counts) in POOL_FORKS {
            let mut spec = self.spec.clone();
            spec.pristine = true;
            let name = self.pool_fork_snapshot_name();
            let source = self
                .runtime
                .create(&spec)
                .await
                .context("the pool-fork source")?;
            let measured = async {
                ok(&source, prepare_mb(mb), "preparing the source").await?;
                let info = source
                    .snapshot(&name, SnapshotOptions::default())
                    .await
                    .context("the pool-fork snapshot")?;
                for &k in counts {
                    self.progress
                        .set_message(format!("fork {k} from a {mb} MB state, three ways"));
                    runs.push(self.pool_fork_run(&spec, &info, mb, k).await?);
                }
                anyhow::Ok(())
            }
            .await;
            destroy_all(std::slice::from_ref(&source)).await;
            if self.runtime.snapshot_info(&name).await.is_ok() {
                if let Err(e) = self.runtime.delete_snapshot(&name).await {
                    tracing::warn!(snapshot = %name, error = %e, "deleting the bench snapshot failed");
                }
            }
            measured?;
        }
        Ok(runs)
    }

    async fn pool_fork_run(
        self: &Arc<Self>,
        spec: &corral_core::SandboxSpec,
        info: &corral_core::snapshot::SnapshotInfo,
        mb: usize,
        k: usize,
    ) -> anyhow::Result<PoolForkRun> {
        // From scratch: K starts and K preparations, all at once.
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
        if let Some(e) = failed {
            return Err(e);
        }
        self.progress.inc(k as u64);

        // Today's fork: K container starts, each taking the delta in.
        let name = info.qualified().to_string();
        let t = Instant::now();
        let forks = self
            .runtime
            .fork(&name, k)
            .await
            .context("forking by starting containers")?;
        let started = t.elapsed();
        let checked = ok(&forks[0], check_mb(mb), "checking a fork").await;
        destroy_all(&forks).await;
        checked?;
        self.progress.inc(k as u64);

        // Into a warm pool whose spec is the snapshot's.
        let fork_spec = info.fork_spec();
        let base = self.runtime.fork_base(info).await?;
        let config = corral_core::pool::ProviderConfig {
            pools: std::collections::BTreeMap::from([(
                "forks".to_string(),
                corral_core::pool::PoolConfig {
                    spec: fork_spec.clone(),
                    warm: k,
                    pristine: true,
                    ..Default::default()
                },
            )]),
            ..Default::default()
        };
        let provider = corral::Provider::new(self.runtime.clone(), config);
        *crate::lock(&self.provider) = Some(provider.clone());
        let run = async {
            let t = Instant::now();
            let fill = crate::FILL_TIMEOUT + Duration::from_secs(k as u64);
            if !provider.wait_warm("forks", fill).await {
                bail!("the fork pool did not reach {k} sandboxes within {fill:?}");
            }
            let filled = t.elapsed();
            let hits = provider.stats().pool_hits;
            let t = Instant::now();
            let keys: Vec<String> = (0..k).map(|i| format!("fork-{i}")).collect();
            let leases = futures_util::future::join_all(
                keys.iter()
                    .map(|key| provider.acquire_fork(key, &fork_spec, base.clone())),
            )
            .await;
            let pooled = t.elapsed();
            let landed = provider.stats().pool_hits - hits;
            let mut leases = leases
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .context("forking into the pool")?;
            ok(&leases[0], check_mb(mb), "checking a pool fork").await?;
            leases.clear();
            anyhow::Ok((pooled, landed, filled))
        }
        .await;
        provider.shutdown().await;
        crate::lock(&self.provider).take();
        let (pooled, landed, fill) = run?;
        self.progress.inc(k as u64);
        Ok(PoolForkRun {
            mb,
            k,
            scratch,
            started,
            pooled,
            landed,
            fill,
        })
    }
}

impl PoolForkRun {
    /// Its three rows: from scratch (the floor), forks that start
    /// containers, forks into the warm pool.
    pub(crate) fn rows(&self) -> Vec<crate::report::Row<'_>> {
        use crate::report::Row;
        use crate::stats::{ms, times, Latency};
        use serde_json::json;
        let (mb, k) = (self.mb, self.k);
        let id = |way: &str| format!("pool_fork_{mb}mb_{k}_{way}");
        vec![
            Row::new(
                id("scratch"),
                "",
                format!("prepare {k} from scratch ({mb} MB state)"),
                Latency::of(vec![self.scratch]),
            )
            .floor()
            .with("forks", json!(k))
            .with("state_mb", json!(mb)),
            Row::new(
                id("start"),
                "",
                format!("fork {k}, a container start each ({mb} MB)"),
                Latency::of(vec![self.started]),
            )
            .noted(Some(format!(
                "{:.1}x scratch",
                times(self.scratch, self.started)
            )))
            .with("forks", json!(k))
            .with("state_mb", json!(mb)),
            Row::new(
                id("pool"),
                "",
                format!("fork {k} into a warm pristine pool ({mb} MB)"),
                Latency::of(vec![self.pooled]),
            )
            .noted(Some(format!(
                "{}/{k} warm; {:.1}x scratch, {:.1}x container-start fork; pool filled in {:.0} ms before",
                self.landed,
                times(self.scratch, self.pooled),
                times(self.started, self.pooled),
                ms(self.fill)
            )))
            .with("forks", json!(k))
            .with("state_mb", json!(mb))
            .with("landed_warm", json!(self.landed))
            .with("fill_ms", json!(ms(self.fill))),
        ]
    }
}

/// The targets of the pool-fork rows: a fork of 64 from a 10 MB state
/// at least 10x preparing 64 from scratch, and ahead of today's fork.
pub(crate) fn pool_fork_ratios(runs: &[PoolForkRun]) -> Vec<crate::report::Ratio> {
    use crate::report::Ratio;
    use crate::stats::times;
    let Some(run) = runs.iter().find(|r| r.mb == 10 && r.k == 64) else {
        return Vec::new();
    };
    vec![
        Ratio {
            id: "pool_fork_64_10mb_vs_prepare",
            label: "fork 64 (10 MB) into a pool vs preparing 64",
            value: times(run.scratch, run.pooled),
            target: 10.0,
            applies: true,
        },
        Ratio {
            id: "pool_fork_64_10mb_vs_start_fork",
            label: "fork 64 (10 MB) into a pool vs starting 64",
            value: times(run.started, run.pooled),
            target: 1.0,
            applies: true,
        },
    ]
}
