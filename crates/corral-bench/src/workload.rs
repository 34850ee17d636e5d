//! The rollout workload: N rollouts of M commands, P at a time, through
//! corral (starting a sandbox each, from a warm pool, or from a pool that
//! reuses sandboxes) and done plainly with raw calls; end to end, and the
//! command phase alone on sandboxes or containers started beforehand.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Provider, Sandbox};
use corral_core::pool::{PoolConfig, ProviderConfig};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::stats::Latency;
use crate::{check, lock, true_cmd, Bench, FILL_TIMEOUT};

/// What the reusing pool runs on release before handing a sandbox to the
/// next rollout: clear the scratch directories a rollout writes to.
const REUSE_RESET: &str = "rm -rf /tmp/* /var/tmp/*";

/// One run of the N x M workload.
pub(crate) struct Workload {
    /// Per rollout: start, M commands, removal.
    pub(crate) per_rollout: Latency,
    pub(crate) commands: usize,
    pub(crate) wall: Duration,
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
    pub(crate) async fn workload_pooled(self: &Arc<Self>, reuse: bool) -> anyhow::Result<Workload> {
        let args = &self.options;
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
                    pristine: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(commands: usize, wall: Duration) -> Workload {
        Workload {
            per_rollout: Latency::of(Vec::new()),
            commands,
            wall,
        }
    }

    #[test]
    fn per_second_is_commands_over_the_wall_clock() {
        assert_eq!(workload(12, Duration::from_secs(3)).per_second(), 4.0);
        assert_eq!(workload(5, Duration::from_millis(500)).per_second(), 10.0);
        // A zero wall clock reads as one nanosecond, not a division by zero.
        assert!((workload(1, Duration::ZERO).per_second() - 1e9).abs() < 1.0);
    }
}
