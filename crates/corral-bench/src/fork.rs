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
