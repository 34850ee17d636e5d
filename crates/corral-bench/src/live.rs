//! The live-state rows (`corral bench --rows live`): live snapshots,
//! pause to disk, and forks of a running sandbox, against preparing the
//! same state from scratch, in the same run.
//!
//! The state: a gVisor sandbox without network (the tier that checkpoints)
//! whose Python process holds 100 MB of random bytes in memory and serves
//! their length over TCP on loopback. Preparing it is a cold start, the
//! process's start and the 100 MB; every fork and every resume must answer
//! on that server with the length before it counts (not timed). Rows: a
//! live snapshot (the checkpoint and the source's restore in place), a
//! pause to disk and a resume, forks of 1, 8 and 32, and preparing 8 and
//! 32 at once. Ratios: re-preparing N over forking N (the target:
//! 5x); the absolute times are in the table (targets: snapshot and resume
//! within 500 ms, a fork of 8 within 2 s).

use std::time::Instant;

use anyhow::{bail, Context};
use corral::snapshot::SnapshotKind;
use corral::{Isolation, Network, Sandbox, SandboxSpec, SnapshotOptions};

use crate::isolation::workload as run;
use crate::report::{Ratio, Row};
use crate::stats::{times, Latency};
use crate::Bench;

/// Starts the server holding the state and waits until it listens.
const PREPARE: &str = concat!(
    "python3 -c 'import os, socket\n",
    "data = bytearray(os.urandom(100 << 20))\n",
    "s = socket.socket()\n",
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n",
    "s.bind((\"127.0.0.1\", 8080))\n",
    "s.listen()\n",
    "open(\"/tmp/ready\", \"w\").write(\"1\")\n",
    "while True: c, _ = s.accept(); c.sendall(b\"%d\" % len(data)); c.close()\n",
    "' </dev/null >/dev/null 2>&1 &\n",
    // Bounded: a server that cannot start fails the row, not the timeout.
    "for i in $(seq 1500); do [ -f /tmp/ready ] && exit 0; sleep 0.02; done; exit 1"
);

/// Asks the server for the length of what it holds.
const CHECK: &str = "python3 -c 'import socket; \
s = socket.create_connection((\"127.0.0.1\", 8080)); print(s.recv(64).decode())'";

/// What [`CHECK`] prints where the state is there.
const HELD: &str = "104857600";

/// Samples of the snapshot and pause rows.
const SAMPLES: usize = 3;

/// The fork counts, and the counts prepared from scratch to compare.
const FORKS: [usize; 3] = [1, 8, 32];
const PREPARED: [usize; 2] = [8, 32];

/// What the live rows measured.
pub(crate) struct LiveReport {
    pub(crate) prepare: Latency,
    pub(crate) snapshot: Latency,
    pub(crate) snapshot_bytes: i64,
    pub(crate) pause: Latency,
    pub(crate) resume: Latency,
    /// By count, as [`FORKS`].
    pub(crate) forks: Vec<(usize, Latency)>,
    /// By count, as [`PREPARED`].
    pub(crate) prepared: Vec<(usize, Latency)>,
}

impl LiveReport {
    /// The line under the table's header.
    pub(crate) fn describe(&self) -> String {
        format!(
            "live: gVisor without network, a Python process holding 100 MB and serving TCP; \
             a live snapshot of {} MB",
            self.snapshot_bytes / 1_000_000
        )
    }

    pub(crate) fn rows(&self) -> Vec<Row<'_>> {
        let mut rows = vec![
            Row::new(
                "live_prepare",
                "",
                "prepare one (cold start + state)",
                self.prepare,
            )
            .floor(),
            Row::new(
                "live_snapshot",
                "20",
                "live snapshot (checkpoint + restore in place)",
                self.snapshot,
            ),
            Row::new("live_pause", "21", "pause to disk", self.pause),
            Row::new("live_resume", "22", "resume from disk", self.resume),
        ];
        for (n, l) in &self.forks {
            rows.push(Row::new(
                format!("live_fork_{n}"),
                "23",
                format!("fork {n} (live)"),
                *l,
            ));
        }
        for (n, l) in &self.prepared {
            rows.push(
                Row::new(
                    format!("live_prepare_{n}"),
                    "",
                    format!("prepare {n} at once"),
                    *l,
                )
                .floor(),
            );
        }
        rows
    }

    /// Re-preparing N over forking N (5x is the target).
    pub(crate) fn ratios(&self) -> Vec<Ratio> {
        let mut v = Vec::new();
        for (n, prepared) in &self.prepared {
            let Some((_, forked)) = self.forks.iter().find(|(k, _)| k == n) else {
                continue;
            };
            let (id, label) = match n {
                8 => ("live_fork_8", "fork 8 vs preparing 8, p50"),
                _ => ("live_fork_32", "fork 32 vs preparing 32, p50"),
            };
            v.push(Ratio {
                id,
                label,
                value: times(prepared.p50, forked.p50),
                target: 5.0,
                applies: true,
            });
        }
        v
    }
}

/// Progress steps of the live rows.
pub(crate) fn steps() -> u64 {
    (1 + 3 * SAMPLES + FORKS.iter().sum::<usize>() + PREPARED.iter().sum::<usize>()) as u64
}

impl Bench {
    /// The live rows; every sandbox and the snapshot are removed, whatever
    /// happens.
    pub(crate) async fn measure_live(&self) -> anyhow::Result<LiveReport> {
        let mut spec = self.spec.clone();
        spec.isolation = Isolation::Gvisor;
        spec.network = Network::None;
        let name = format!("bench-live-{}", corral::host::random_hex(8));
        let mut made: Vec<Sandbox> = Vec::new();
        let measured = self.live_rows(&spec, &name, &mut made).await;
        for sb in made {
            if let Err(e) = sb.destroy().await {
                tracing::warn!(sandbox = sb.id(), error = %e, "destroying a live-rows sandbox failed");
            }
        }
        if let Err(e) = self.runtime.delete_snapshot(&name).await {
            tracing::debug!(snapshot = %name, error = %e, "no live-rows snapshot to delete");
        }
        measured
    }

    async fn live_rows(
        &self,
        spec: &SandboxSpec,
        name: &str,
        made: &mut Vec<Sandbox>,
    ) -> anyhow::Result<LiveReport> {
        self.progress.set_message("live: preparing the state");
        let t = Instant::now();
        let sb = self.runtime.create(spec).await.context(
            "a gVisor sandbox without network (scripts/ensure-gvisor.sh registers runsc-live)",
        )?;
        made.push(sb.clone());
        let has = run(&sb, "command -v python3 >/dev/null && echo yes; true").await?;
        if has.trim() != "yes" {
            bail!("the live rows need python3 in the image (e.g. --image corral-test/python)");
        }
        run(&sb, PREPARE).await?;
        let prepare = Latency::of(vec![t.elapsed()]);
        held(&sb).await?;
        self.progress.inc(1);

        let live = SnapshotOptions {
            kind: Some(SnapshotKind::Live),
            ..Default::default()
        };
        self.progress.set_message("live: snapshots");
        let mut samples = Vec::with_capacity(SAMPLES);
        let mut snapshot_bytes = 0;
        for _ in 0..SAMPLES {
            let t = Instant::now();
            let info = sb
                .snapshot(name, live.clone())
                .await
                .context("a live snapshot")?;
            samples.push(t.elapsed());
            snapshot_bytes = info.size;
            held(&sb).await?;
            self.progress.inc(1);
        }
        let snapshot = Latency::of(samples);

        self.progress.set_message("live: pause to disk and resume");
        let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            let t = Instant::now();
            sb.pause().await.context("pause")?;
            pauses.push(t.elapsed());
            if !sb.is_paused_to_disk() {
                bail!("sandbox {} was frozen, not paused to disk", sb.id());
            }
            let t = Instant::now();
            sb.resume().await.context("resume")?;
            resumes.push(t.elapsed());
            held(&sb).await?;
            self.progress.inc(2);
        }

        let mut forks = Vec::new();
        for n in FORKS {
            self.progress.set_message(format!("live: fork {n}"));
            let t = Instant::now();
            let forked = self.runtime.fork(name, n).await;
            let took = t.elapsed();
            let forked = forked.with_context(|| format!("a live fork of {n}"))?;
            made.extend(forked.iter().cloned());
            for f in &forked {
                held(f).await?;
            }
            forks.push((n, Latency::of(vec![took])));
            for f in forked {
                made.retain(|m| m.id() != f.id());
                f.destroy().await.context("destroying a fork")?;
            }
            self.progress.inc(n as u64);
        }

        let mut prepared = Vec::new();
        for n in PREPARED {
            self.progress
                .set_message(format!("live: prepare {n} at once"));
            let t = Instant::now();
            let starts = (0..n).map(|_| async {
                let sb = self.runtime.create(spec).await?;
                let r = run(&sb, PREPARE).await;
                anyhow::Ok((sb, r))
            });
            let results = futures_util::future::join_all(starts).await;
            let took = t.elapsed();
            let mut failed = None;
            let mut these = Vec::new();
            for r in results {
                match r {
                    Ok((sb, r)) => {
                        these.push(sb.clone());
                        if let Err(e) = r {
                            failed.get_or_insert(e);
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            made.extend(these.iter().cloned());
            if let Some(e) = failed {
                return Err(e.context(format!("preparing {n} at once")));
            }
            for sb in these {
                held(&sb).await?;
                made.retain(|m| m.id() != sb.id());
                sb.destroy()
                    .await
                    .context("destroying a prepared sandbox")?;
            }
            prepared.push((n, Latency::of(vec![took])));
            self.progress.inc(n as u64);
        }
        Ok(LiveReport {
            prepare,
            snapshot,
            snapshot_bytes,
            pause: Latency::of(pauses),
            resume: Latency::of(resumes),
            forks,
            prepared,
        })
    }
}

/// Checks that `sb`'s server still holds the state.
async fn held(sb: &Sandbox) -> anyhow::Result<()> {
    let got = run(sb, CHECK).await?;
    if got.trim() != HELD {
        bail!(
            "sandbox {} lost its state: its server said {got:?}",
            sb.id()
        );
    }
    Ok(())
}
