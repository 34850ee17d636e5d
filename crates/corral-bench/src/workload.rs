//! The rollout workload: N rollouts of M commands, P at a time, through
//! corral (starting a sandbox each, from a warm pool, from a pool that
//! reuses sandboxes, or from a pool that resets them pristine) and done
//! plainly with raw calls; end to end, and the command phase alone on
//! sandboxes or containers started beforehand.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::metrics::MetricsSnapshot;
use corral::{Provider, Sandbox};
use corral_core::pool::{PoolConfig, ProviderConfig};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::stats::Latency;
use crate::{check, lock, true_cmd, Bench, FILL_TIMEOUT};

/// What the reusing pool runs on release before handing a sandbox to the
/// next rollout: clear the scratch directories a rollout writes to.
const REUSE_RESET: &str = "rm -rf /tmp/* /var/tmp/*";

/// Sandboxes the pristine pool holds beyond one per rollout in flight.
const PRISTINE_SLACK: usize = 2;

/// Longest wait, inside the clock, for the last releases' resets.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a pool-backed workload's release does with a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolMode {
    /// Destroys it (in the background); the pool is the size of the batch
    /// (N) and refills behind the rollouts.
    Batch,
    /// Runs the pool's reset command ([`REUSE_RESET`]) and hands it back;
    /// the pool is the size of the batch.
    Reuse,
    /// Resets it in place to its state after start (`pristine: true`) in
    /// the background and hands it back; the pool is P plus
    /// [`PRISTINE_SLACK`], each sandbox used and reset once before the
    /// clock, so every rollout gets a sandbox an earlier episode used and a
    /// reset cleaned, and waits for one when none is ready. The clock
    /// stops when every reset is done.
    Pristine,
}

/// One run of the N x M workload.
pub(crate) struct Workload {
    /// Per rollout: start, M commands, removal.
    pub(crate) per_rollout: Latency,
    pub(crate) commands: usize,
    pub(crate) wall: Duration,
    /// Rollouts that got a sandbox an earlier episode had used and a reset
    /// had cleaned (pristine pool only).
    pub(crate) reused: Option<usize>,
}

impl Workload {
    pub(crate) fn per_second(&self) -> f64 {
        self.commands as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

impl Bench {
    /// N rollouts of M commands, P at a time: through corral, or `plain`
    /// (raw create+start, a raw exec per command, removal).
    pub(crate) async fn workload(self: &Arc<Self>, plain: bool) -> anyhow::Result<Workload> {
        let args = &self.options;
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
            reused: None,
        })
    }

    /// The workload end to end as a trainer runs it with corral: a provider
    /// keeps a warm pool, filled before the clock starts as it would be
    /// while the learner works between batches; each rollout acquires a
    /// sandbox from it (a hand-over), runs its commands and releases it,
    /// inside the clock. What a release does depends on `mode`
    /// ([`PoolMode`]).
    pub(crate) async fn workload_pooled(
        self: &Arc<Self>,
        mode: PoolMode,
    ) -> anyhow::Result<Workload> {
        let args = &self.options;
        const ROLLOUT_POOL: &str = "rollout";
        let warm = match mode {
            PoolMode::Batch | PoolMode::Reuse => args.sandboxes.max(1),
            // Enough for every rollout in flight, and a little slack for
            // the resets in flight behind them: not the batch.
            PoolMode::Pristine => args.parallel + PRISTINE_SLACK,
        };
        let config = ProviderConfig {
            // Where released sandboxes go back to the pool, the live limit
            // equals the pool, so nothing is started inside the clock: a
            // rollout that finds the pool empty waits for a release.
            max_live: match mode {
                PoolMode::Batch => warm * 2,
                PoolMode::Reuse | PoolMode::Pristine => warm,
            },
            idle_timeout_ms: 0,
            max_lifetime_ms: 0,
            pools: BTreeMap::from([(
                ROLLOUT_POOL.to_string(),
                PoolConfig {
                    spec: self.spec.clone(),
                    warm,
                    reuse: mode == PoolMode::Reuse,
                    reset: if mode == PoolMode::Reuse {
                        vec![REUSE_RESET.to_string()]
                    } else {
                        Vec::new()
                    },
                    pristine: mode == PoolMode::Pristine,
                    on_idle: None,
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
            // Every pool sandbox serves one episode and is reset before the
            // clock starts, so every rollout below gets a sandbox in the
            // state a trainer's second batch finds: used, then reset.
            let primed = if mode == PoolMode::Pristine {
                self.prime(&provider, ROLLOUT_POOL, warm).await?
            } else {
                HashSet::new()
            };
            let before = self.runtime.metrics();
            let stats_before = provider.stats();
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
                    // Released before the lease is dropped: a dropped lease
                    // leaves the session idle, and an acquire waiting at the
                    // live limit would evict it (destroy it and start a new
                    // sandbox) before the release could hand it back.
                    provider
                        .release(&key)
                        .await
                        .with_context(|| format!("releasing session {key}"))?;
                    let id = lease.id().to_string();
                    drop(lease);
                    anyhow::Ok((t.elapsed(), id))
                });
            }
            let mut per_rollout = Vec::with_capacity(args.sandboxes);
            let mut reused = 0;
            while let Some(joined) = rollouts.join_next().await {
                let (took, id) = joined.context("a rollout panicked")??;
                per_rollout.push(took);
                reused += usize::from(primed.contains(&id));
            }
            if mode == PoolMode::Pristine {
                // The last releases' resets, inside the clock: the batch is
                // done when every sandbox is pristine in the pool again.
                provider.settled(SETTLE_TIMEOUT).await;
            }
            let wall = started.elapsed();
            if mode == PoolMode::Pristine {
                let stats = provider.stats();
                check_pristine_run(
                    args.sandboxes as u64,
                    &before,
                    &self.runtime.metrics(),
                    stats.pool_hits.saturating_sub(stats_before.pool_hits),
                    stats.evicted_lru.saturating_sub(stats_before.evicted_lru),
                )?;
                if reused != args.sandboxes {
                    bail!(
                        "{reused} of {} rollouts got a sandbox of the primed pristine pool",
                        args.sandboxes
                    );
                }
            }
            Ok(Workload {
                per_rollout: Latency::of(per_rollout),
                commands: args.sandboxes * commands,
                wall,
                reused: (mode == PoolMode::Pristine).then_some(reused),
            })
        }
        .await;
        provider.shutdown().await;
        lock(&self.provider).take();
        timed
    }

    /// Before the pristine workload's clock: takes every sandbox of the
    /// full pool, runs a command in each, releases them all and waits for
    /// their resets; returns their ids.
    async fn prime(
        &self,
        provider: &Provider,
        pool: &str,
        warm: usize,
    ) -> anyhow::Result<HashSet<String>> {
        let mut ids = HashSet::with_capacity(warm);
        let mut leases = Vec::with_capacity(warm);
        for i in 0..warm {
            let key = format!("{}-prime-{i}", self.run_id);
            let lease = provider
                .acquire(&key, pool)
                .await
                .with_context(|| format!("acquiring session {key}"))?;
            check(&lease.run(&true_cmd()).await, lease.id())?;
            ids.insert(lease.id().to_string());
            leases.push(lease);
        }
        for lease in leases {
            let key = lease.key().to_string();
            provider
                .release(&key)
                .await
                .with_context(|| format!("releasing session {key}"))?;
        }
        provider.settled(SETTLE_TIMEOUT).await;
        let fill = FILL_TIMEOUT + Duration::from_secs(warm as u64);
        if !provider.wait_warm(pool, fill).await {
            bail!("the primed pristine pool did not return to {warm} sandboxes");
        }
        Ok(ids)
    }

    /// The workload's command phase alone: N sandboxes (or, `plain`, raw
    /// containers) are started before the clock starts and removed after it
    /// stops; the clock covers N x M commands, P rollouts at a time.
    pub(crate) async fn workload_started(
        self: &Arc<Self>,
        plain: bool,
    ) -> anyhow::Result<Workload> {
        let args = &self.options;
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
                reused: None,
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
}

/// After the pristine workload: every release was reset in place (none
/// replaced the container, none was evicted instead) and every rollout took
/// its sandbox from the pool; `hits` and `evicted` are the provider's pool
/// hits and LRU evictions during the run.
fn check_pristine_run(
    rollouts: u64,
    before: &MetricsSnapshot,
    after: &MetricsSnapshot,
    hits: u64,
    evicted: u64,
) -> anyhow::Result<()> {
    let in_place = after.resets_in_place.saturating_sub(before.resets_in_place);
    let replaced = after.resets_replaced.saturating_sub(before.resets_replaced);
    if replaced != 0 {
        bail!("{replaced} of the pristine pool's resets replaced the container instead of resetting in place");
    }
    if evicted != 0 {
        bail!("{evicted} released sandboxes of the pristine pool were evicted (destroyed, a new one started) instead of reset");
    }
    if in_place != rollouts {
        bail!("the pristine pool reset {in_place} sandboxes in place for {rollouts} releases");
    }
    if hits != rollouts {
        bail!("{hits} of {rollouts} rollouts took their sandbox from the pristine pool");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(commands: usize, wall: Duration) -> Workload {
        Workload {
            per_rollout: Latency::of(Vec::new()),
            commands,
            wall,
            reused: None,
        }
    }

    #[test]
    fn per_second_is_commands_over_the_wall_clock() {
        assert_eq!(workload(12, Duration::from_secs(3)).per_second(), 4.0);
        assert_eq!(workload(5, Duration::from_millis(500)).per_second(), 10.0);
        // A zero wall clock reads as one nanosecond, not a division by zero.
        assert!((workload(1, Duration::ZERO).per_second() - 1e9).abs() < 1.0);
    }

    fn resets(in_place: u64, replaced: u64) -> MetricsSnapshot {
        MetricsSnapshot {
            resets_in_place: in_place,
            resets_replaced: replaced,
            ..MetricsSnapshot::default()
        }
    }

    #[test]
    fn a_pristine_run_needs_every_release_reset_in_place_and_every_rollout_pooled() {
        let before = resets(3, 1);
        assert!(check_pristine_run(16, &before, &resets(19, 1), 16, 0).is_ok());
        let replaced =
            check_pristine_run(16, &before, &resets(18, 2), 16, 0).expect_err("replaced");
        assert_eq!(
            replaced.to_string(),
            "1 of the pristine pool's resets replaced the container instead of resetting in place"
        );
        let evicted = check_pristine_run(16, &before, &resets(18, 1), 15, 1).expect_err("evicted");
        assert_eq!(
            evicted.to_string(),
            "1 released sandboxes of the pristine pool were evicted (destroyed, a new one started) \
             instead of reset"
        );
        let missing = check_pristine_run(16, &before, &resets(18, 1), 16, 0).expect_err("missing");
        assert_eq!(
            missing.to_string(),
            "the pristine pool reset 15 sandboxes in place for 16 releases"
        );
        let started = check_pristine_run(16, &before, &resets(19, 1), 15, 0).expect_err("a start");
        assert_eq!(
            started.to_string(),
            "15 of 16 rollouts took their sandbox from the pristine pool"
        );
    }
}
