//! `corral bench`: the flags, Ctrl-C and SIGTERM, and the call into the
//! harness, `corral-bench` (floors, workloads, statistics, report).
//!
//! Nothing is left behind: at the end, after an error, and on Ctrl-C or
//! SIGTERM (then exit 130) the measurement is dropped and
//! [`Bench::clean_up`] shuts the provider down and removes every container
//! of the run.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use corral_bench::{Bench, BenchOptions, ForkRows, Rows};

/// Measure corral against floors taken in the same run.
///
/// Measure corral against floors taken in the same run: raw container
/// create+start and raw `docker exec` through the Engine API, and a rollout
/// workload (N sandboxes x M commands, P at a time) done through corral and
/// done plainly with raw calls. Also times the in-place reset of a pristine
/// sandbox after a mess (files written, a process left running). Prints
/// p50/p90/p99 per row, throughput, and the ratios against their targets
/// (warm acquire and agent round trip at least 20x faster than their
/// floors, a reset at least 20x faster than a cold start; the workload's
/// commands at least 10x the commands/s of exec-per-command on started
/// containers, with the end-to-end ratios beside it: starts and removals
/// included, from a warm pool, from a pool that resets and reuses
/// sandboxes, and from a pristine pool that resets every released sandbox
/// in place for the next episode). Last, P sandboxes forked from a
/// prepared pristine one (50 MB written; snapshot, then fork) against P
/// prepared from scratch at once, the fork done both ways from the same
/// source: its changes through the agents' streams (the default) and
/// `docker commit` with P creates from the image.
/// With `--rows net` (or `all`): the egress gateway against direct
/// connections to the same servers (HTTP and HTTPS connection setup, 32 MiB)
/// and a port link of a `corral serve` against the container's address,
/// on a test internet made for the run (needs `corral-test/net`,
/// `openssl` and the `docker` CLI).
/// Every container (and the fork row's snapshots) it makes is removed, also
/// on Ctrl-C (exit 130).
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
    /// Samples per latency row [default: 200 round trips, 50 raw execs, 50 resets, 10 starts].
    #[arg(long, value_parser = at_least_one)]
    samples: Option<usize>,
    /// Print one JSON object instead of the table (and no progress bar).
    #[arg(long)]
    json: bool,
    /// Which rows: default (starts, round trips, resets, workloads, forks),
    /// net (egress gateway and port links against direct), all (both), or
    /// forks (forks of 8/64/256 from 10 MB and 100 MB states into warm
    /// pristine pools of at most 64, against container-start forks and
    /// from scratch; a way that cannot complete is reported on its row
    /// with the reason, and the other rows still run), or
    /// isolation (gVisor against runc in the same run: cold start, round
    /// trip, reset, CPU-bound, syscall-heavy and, where the image has
    /// python3, a Python start with imports; needs runtime runsc), or
    /// live (live snapshot, pause to disk and resume, live forks of 1, 8
    /// and 32 of a gVisor sandbox whose Python process holds 100 MB and
    /// serves TCP, against preparing 8 and 32 anew; needs runtime
    /// runsc-live and an image with python3).
    #[arg(long, default_value = "default", value_parser = rows, value_name = "default|net|all|forks|isolation|live")]
    rows: Rows,
    /// With --rows forks: a prepared state's size in MB and the fork
    /// counts from it, one row each; repeat for more states [default:
    /// 10:8,64,256 and 100:8,64].
    #[arg(long = "forks", value_parser = ForkRows::parse, value_name = "MB:K[,K...]")]
    forks: Vec<ForkRows>,
}

fn rows(text: &str) -> Result<Rows, String> {
    Rows::parse(text)
        .ok_or_else(|| format!("'{text}' is not default, net, all, forks, isolation or live"))
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{text}' is not a whole number of at least 1")),
    }
}

impl BenchArgs {
    fn options(&self) -> BenchOptions {
        BenchOptions {
            image: self.image.clone().unwrap_or_else(super::default_image),
            sandboxes: self.sandboxes,
            commands: self.commands,
            parallel: self.parallel,
            samples: self.samples,
            // corral-bench draws its own bar, on the CLI's terms.
            progress: crate::progress::wanted(self.json),
            rows: self.rows,
            forks: match self.forks.is_empty() {
                true => ForkRows::defaults(),
                false => self.forks.clone(),
            },
        }
    }
}

pub async fn run(
    config: crate::commands::BackendConfig,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    // Before anything exists, so no signal finds a container unaccounted for.
    let mut interrupt = Interrupt::listen()?;
    let (runtime, backend) = super::connect_docker(config).await?;
    let bench = Bench::new(runtime, backend, args.options())?;

    let outcome = tokio::select! {
        r = bench.measure() => Some(r),
        _ = interrupt.recv() => None,
    };
    // The measurement is dropped here: its rollout tasks are aborted, and
    // whatever they had in flight is swept below.
    bench.hide_progress();
    if outcome.is_none() {
        eprintln!(
            "corral: interrupted; removing the containers of run {}",
            bench.run_id()
        );
    }
    let swept = bench.clean_up(!matches!(outcome, Some(Ok(_)))).await;
    match outcome {
        None => {
            let removed = swept?;
            eprintln!("corral: removed {removed} container(s)");
            Ok(ExitCode::from(130))
        }
        Some(Err(e)) => {
            if let Err(s) = swept {
                crate::diagnostics::Diagnostic::of(&s).emit();
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
                println!("{}", report.json(&bench));
            } else {
                print!("{}", report.table(&bench));
            }
            Ok(ExitCode::SUCCESS)
        }
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
    fn sizes_must_be_positive_and_name_the_value() {
        assert_eq!(at_least_one("3"), Ok(3));
        for bad in ["0", "-1", "x"] {
            assert!(at_least_one(bad)
                .expect_err("rejected")
                .contains(&format!("'{bad}'")));
        }
    }
}
