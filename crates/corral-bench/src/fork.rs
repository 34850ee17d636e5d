//! Fork of a prepared sandbox into K sandboxes, against preparing K from
//! scratch, in the same run.
//!
//! The preparation is synthetic: 50 MB of files written into the root file
//! system (a cloned repository and its dependencies, in spirit). A real
//! preparation (a clone, a `pip install`) takes far longer than writing
//! 50 MB, so this understates what a fork saves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Sandbox, SnapshotOptions};
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
    /// Keeping its snapshot.
    pub(crate) snapshot: Duration,
    /// Starting K sandboxes from it, all at once.
    pub(crate) fork: Duration,
    /// Starting and preparing K sandboxes from scratch, all at once.
    pub(crate) scratch: Duration,
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

    /// K sandboxes prepared from scratch (all at once), then one prepared,
    /// snapshotted and forked into K.
    pub(crate) async fn fork_vs_scratch(self: &Arc<Self>, k: usize) -> anyhow::Result<ForkRun> {
        let spec = self.spec.clone();
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
        let run = async {
            prepared?;
            let t = Instant::now();
            source
                .snapshot(&name, SnapshotOptions::default())
                .await
                .context("keeping the snapshot")?;
            let snapshot = t.elapsed();
            let t = Instant::now();
            let forks = self.runtime.fork(&name, k).await.context("forking")?;
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
            self.progress.inc(k as u64);
            anyhow::Ok(ForkRun {
                k,
                prepare_source,
                snapshot,
                fork,
                scratch,
            })
        }
        .await;
        destroy_all(std::slice::from_ref(&source)).await;
        if let Err(e) = self.runtime.delete_snapshot(&name).await {
            tracing::warn!(snapshot = %name, error = %e, "deleting the bench snapshot failed");
        }
        run
    }
}
