//! The isolation rows (`corral bench --rows isolation`): what gVisor
//! (`isolation: gvisor`) costs against runc (`isolation: container`),
//! both measured in the same run, one after the other per row, over the
//! bench's image and spec.
//!
//! Per tier: a cold start (create until the agent answers, as the default
//! row times it), an agent round trip of `true`, a reset of a pristine
//! sandbox after a write (in place under runc, by replacement under
//! gVisor, which cannot reset in place), a CPU-bound shell loop, a
//! syscall-heavy `find` over the image's file system, and, where the image
//! has `python3`, a Python start with a few standard-library imports.
//! Each workload row times the whole command round trip, so it includes
//! one agent round trip (negligible next to the work). Ratios are runc's
//! p50 over gVisor's (1 would be free); their targets are what this crate
//! holds the tier to (the book's security model reports the measured ratios).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use corral::{Isolation, Sandbox};
use corral_core::CommandSpec;

use crate::report::{Ratio, Row};
use crate::stats::{times, Latency};
use crate::Bench;

/// A CPU-bound command: a shell loop, all in user space.
const CPU_BOUND: &str = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done";

/// A syscall-heavy command: `stat` of every file of the image, thrice.
const SYSCALL_HEAVY: &str = "for i in 1 2 3; do find / -xdev >/dev/null 2>&1; done; true";

/// A Python start with imports: many small file opens and `mmap`s.
const PYTHON_IMPORT: &str =
    "python3 -c 'import json, email.parser, http.client, xml.dom.minidom, decimal, argparse'";

/// Samples of each workload row per tier: each takes from a tenth of a
/// second (runc) to seconds (gVisor).
const WORKLOAD_SAMPLES: usize = 5;

/// How long one workload command may take.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// One tier's rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TierRows {
    pub(crate) cold_start: Latency,
    pub(crate) round_trip: Latency,
    pub(crate) reset: Latency,
    pub(crate) cpu_bound: Latency,
    pub(crate) syscall_heavy: Latency,
    /// `None` when the image has no `python3`.
    pub(crate) python_import: Option<Latency>,
}

/// What the isolation rows measured.
pub(crate) struct IsolationReport {
    pub(crate) container: TierRows,
    pub(crate) gvisor: TierRows,
}

impl IsolationReport {
    /// The line under the table's header.
    pub(crate) fn describe(&self) -> String {
        format!(
            "isolation: runc against gVisor, {} starts, {} round trips, {} resets, {} runs per workload each",
            self.container.cold_start.n,
            self.container.round_trip.n,
            self.container.reset.n,
            self.container.cpu_bound.n
        )
    }

    pub(crate) fn rows(&self) -> Vec<Row<'_>> {
        let (c, g) = (&self.container, &self.gvisor);
        let mut rows = Vec::new();
        let mut pair = |id: &'static str, num: &'static str, what: &str, c: Latency, g: Latency| {
            rows.push(Row::new(format!("{id}_runc"), "", format!("{what}, runc"), c).floor());
            rows.push(Row::new(
                format!("{id}_gvisor"),
                num,
                format!("{what}, gVisor"),
                g,
            ));
        };
        pair(
            "iso_cold_start",
            "14",
            "cold start",
            c.cold_start,
            g.cold_start,
        );
        pair(
            "iso_round_trip",
            "15",
            "agent round trip (true)",
            c.round_trip,
            g.round_trip,
        );
        pair(
            "iso_reset",
            "16",
            "pristine reset (gVisor: replaced)",
            c.reset,
            g.reset,
        );
        pair(
            "iso_cpu_bound",
            "17",
            "CPU-bound (shell loop)",
            c.cpu_bound,
            g.cpu_bound,
        );
        pair(
            "iso_syscall_heavy",
            "18",
            "syscall-heavy (find / x3)",
            c.syscall_heavy,
            g.syscall_heavy,
        );
        if let (Some(cp), Some(gp)) = (c.python_import, g.python_import) {
            pair("iso_python_import", "19", "python3 start + imports", cp, gp);
        }
        rows
    }

    /// runc over gVisor (higher is better, 1 would be free). The targets
    /// are what corral holds gVisor's cost to at most: starts and
    /// round trips within 3x, resets within 100x (a replacement against
    /// an in-place reset), CPU-bound work within 1.25x, syscall-heavy work
    /// within 10x.
    pub(crate) fn ratios(&self) -> Vec<Ratio> {
        let (c, g) = (&self.container, &self.gvisor);
        let ratio = |id, label, c: Latency, g: Latency, target| Ratio {
            id,
            label,
            value: times(c.p50, g.p50),
            target,
            applies: true,
        };
        let mut v = vec![
            ratio(
                "isolation_cold_start",
                "cold start p50, runc vs gVisor",
                c.cold_start,
                g.cold_start,
                0.33,
            ),
            ratio(
                "isolation_round_trip",
                "round trip p50, runc vs gVisor",
                c.round_trip,
                g.round_trip,
                0.33,
            ),
            ratio(
                "isolation_reset",
                "reset p50, runc in place vs gVisor replaced",
                c.reset,
                g.reset,
                0.01,
            ),
            ratio(
                "isolation_cpu_bound",
                "CPU-bound p50, runc vs gVisor",
                c.cpu_bound,
                g.cpu_bound,
                0.8,
            ),
            ratio(
                "isolation_syscall_heavy",
                "syscall-heavy p50, runc vs gVisor",
                c.syscall_heavy,
                g.syscall_heavy,
                0.1,
            ),
        ];
        if let (Some(cp), Some(gp)) = (c.python_import, g.python_import) {
            v.push(ratio(
                "isolation_python_import",
                "python3 imports p50, runc vs gVisor",
                cp,
                gp,
                0.1,
            ));
        }
        v
    }
}

/// Progress steps of the isolation rows of `samples`.
pub(crate) fn steps(starts: usize, round_trips: usize, resets: usize) -> u64 {
    (2 * (starts + round_trips + resets + 3 * WORKLOAD_SAMPLES)) as u64
}

impl Bench {
    /// Both tiers' rows, runc first.
    pub(crate) async fn measure_isolation(&self) -> anyhow::Result<IsolationReport> {
        let container = self.tier_rows(Isolation::Container).await?;
        let gvisor = self.tier_rows(Isolation::Gvisor).await.context(
            "the gVisor rows (the daemon needs runtime runsc: scripts/ensure-gvisor.sh)",
        )?;
        Ok(IsolationReport { container, gvisor })
    }

    async fn tier_rows(&self, isolation: Isolation) -> anyhow::Result<TierRows> {
        let tier = isolation.as_str();
        let n = &self.samples;
        let mut spec = self.spec.clone();
        spec.isolation = isolation;

        self.progress.set_message(format!("{tier}: cold start"));
        // One start first, so no sample pays a first-time cost.
        self.runtime
            .create(&spec)
            .await
            .with_context(|| format!("a {tier} sandbox"))?
            .destroy()
            .await
            .context("destroying a warm-up sandbox")?;
        let mut samples = Vec::with_capacity(n.starts);
        for _ in 0..n.starts {
            let t = Instant::now();
            let sb = self
                .runtime
                .create(&spec)
                .await
                .with_context(|| format!("cold start of a {tier} sandbox"))?;
            samples.push(t.elapsed());
            sb.destroy().await.context("destroying a cold start")?;
            self.progress.inc(1);
        }
        let cold_start = Latency::of(samples);

        let mut pristine = spec.clone();
        pristine.pristine = true;
        let sb = self
            .runtime
            .create(&pristine)
            .await
            .with_context(|| format!("a pristine {tier} sandbox"))?;
        let measured = self.tier_workloads(&sb, tier, cold_start).await;
        let destroyed = sb.destroy().await;
        let rows = measured?;
        destroyed.context("destroying the isolation sandbox")?;
        Ok(rows)
    }

    async fn tier_workloads(
        &self,
        sb: &Sandbox,
        tier: &str,
        cold_start: Latency,
    ) -> anyhow::Result<TierRows> {
        let n = &self.samples;
        self.progress.set_message(format!("{tier}: round trip"));
        for _ in 0..10 {
            crate::check(&sb.run(&crate::true_cmd()).await, sb.id())?;
        }
        let mut samples = Vec::with_capacity(n.round_trips);
        for _ in 0..n.round_trips {
            let t = Instant::now();
            let r = sb.run(&crate::true_cmd()).await;
            samples.push(t.elapsed());
            crate::check(&r, sb.id())?;
            self.progress.inc(1);
        }
        let round_trip = Latency::of(samples);

        self.progress.set_message(format!("{tier}: reset"));
        let mut samples = Vec::with_capacity(n.resets);
        for _ in 0..n.resets {
            workload(sb, "echo mess > /tmp/mess && echo mess > /etc/mess").await?;
            let t = Instant::now();
            sb.reset()
                .await
                .with_context(|| format!("resetting {tier} sandbox {}", sb.id()))?;
            samples.push(t.elapsed());
            let left = workload(sb, "cat /tmp/mess /etc/mess 2>/dev/null; true").await?;
            if !left.is_empty() {
                bail!("a reset of {tier} sandbox {} left {left:?}", sb.id());
            }
            self.progress.inc(1);
        }
        let reset = Latency::of(samples);

        let timed = |script: &'static str, what: &str| {
            self.progress.set_message(format!("{tier}: {what}"));
            async move {
                workload(sb, script).await?;
                let mut samples = Vec::with_capacity(WORKLOAD_SAMPLES);
                for _ in 0..WORKLOAD_SAMPLES {
                    let t = Instant::now();
                    workload(sb, script).await?;
                    samples.push(t.elapsed());
                    self.progress.inc(1);
                }
                anyhow::Ok(Latency::of(samples))
            }
        };
        let cpu_bound = timed(CPU_BOUND, "CPU-bound").await?;
        let syscall_heavy = timed(SYSCALL_HEAVY, "syscall-heavy").await?;
        let has_python = workload(sb, "command -v python3 >/dev/null && echo yes; true").await?;
        let python_import = if has_python.trim() == "yes" {
            Some(timed(PYTHON_IMPORT, "python imports").await?)
        } else {
            self.progress.inc(WORKLOAD_SAMPLES as u64);
            None
        };
        Ok(TierRows {
            cold_start,
            round_trip,
            reset,
            cpu_bound,
            syscall_heavy,
            python_import,
        })
    }
}

/// Runs `script` in `sb`; its stdout, or an error naming the sandbox,
/// the script and how it failed.
pub(crate) async fn workload(sb: &Sandbox, script: &str) -> anyhow::Result<String> {
    let r = sb
        .run(&CommandSpec::shell(script).timeout(WORKLOAD_TIMEOUT))
        .await;
    if !r.success() {
        bail!(
            "`{script}` in sandbox {} failed: exit {:?}, failure {:?}, stderr {:?}",
            sb.id(),
            r.exit_code,
            r.failure.map(|f| f.to_string()),
            String::from_utf8_lossy(&r.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}
