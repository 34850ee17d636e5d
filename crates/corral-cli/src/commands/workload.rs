//! `corral workload`: a rollout-shaped load (N sandboxes, M commands each)
//! that reports what happened, for soak and fault-injection runs.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use corral_core::{CommandSpec, Network, Recovery, SandboxSpec};
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::progress::{self, Progress};

/// Run a rollout-shaped load and print a JSON summary.
///
/// Run N sandboxes with M commands each (`echo` round trips checked for
/// their output), P sandboxes at a time, and print a JSON summary: commands
/// that succeeded, failures by kind, sandboxes affected, the backend's
/// retry/slot/breaker counters. A sandbox stops at its first failure.
/// Exits 0 when every command succeeded, 1 otherwise. On a terminal a
/// progress bar on stderr counts the sandboxes done (--quiet: none).
#[derive(Args, Debug)]
pub struct WorkloadArgs {
    /// Image [default: $CORRAL_IMAGE or corral-test/busybox].
    #[arg(long)]
    image: Option<String>,
    /// Sandboxes in all.
    #[arg(long, default_value = "16")]
    sandboxes: usize,
    /// Commands per sandbox.
    #[arg(long, default_value = "10")]
    commands: usize,
    /// Sandboxes alive at once.
    #[arg(long, default_value = "8")]
    parallel: usize,
    /// Recovery policy of every sandbox: fail or recreate.
    #[arg(long, default_value = "fail", value_parser = |s: &str| Recovery::parse(s).ok_or_else(|| format!("'{s}' is not a recovery policy: expected fail or recreate")))]
    recovery: Recovery,
    /// Pause between a sandbox's commands, in ms (gives out-of-band chaos a window).
    #[arg(long, default_value = "0")]
    pause_ms: u64,
}

pub async fn run(
    config: crate::commands::BackendConfig,
    args: WorkloadArgs,
) -> anyhow::Result<ExitCode> {
    let backend = super::connect(config).await?;
    let mut spec = SandboxSpec::new(args.image.clone().unwrap_or_else(super::default_image));
    spec.network = Network::None;
    spec.recovery = args.recovery;
    spec.limits.memory = Some(128 << 20);
    let gate = Arc::new(Semaphore::new(args.parallel.max(1)));
    let started = Instant::now();
    let tasks = (0..args.sandboxes).map(|i| {
        let (backend, spec, gate) = (backend.clone(), spec.clone(), gate.clone());
        let (commands, pause) = (args.commands, Duration::from_millis(args.pause_ms));
        tokio::spawn(async move {
            let _permit = gate.acquire_owned().await;
            let mut ok = 0usize;
            let sandbox = match backend.create(&spec).await {
                Ok(s) => s,
                Err(e) => return (i, ok, Some(e.failure().kind.as_str().to_string())),
            };
            let mut failure = None;
            for j in 0..commands {
                let r = sandbox
                    .run(
                        &CommandSpec::shell(format!("echo {i}-{j}"))
                            .timeout(Duration::from_secs(60)),
                    )
                    .await;
                match (&r.failure, r.exit_code) {
                    (None, Some(0)) if r.stdout == format!("{i}-{j}\n").as_bytes() => ok += 1,
                    (Some(f), _) => {
                        failure = Some(f.kind.as_str().to_string());
                        break;
                    }
                    _ => {
                        failure = Some("wrong_output".to_string());
                        break;
                    }
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            if let Err(e) = sandbox.destroy().await {
                tracing::warn!(sandbox = sandbox.id(), error = %e, "teardown failed");
            }
            (i, ok, failure)
        })
    });
    let bar = Progress::counter(
        progress::wanted(false),
        "workload",
        args.sandboxes as u64,
        "sandboxes done",
    );
    let mut pending: FuturesUnordered<_> = tasks.collect();
    let mut results = Vec::with_capacity(args.sandboxes);
    while let Some(r) = pending.next().await {
        bar.inc();
        results.push(r);
    }
    let mut ok_total = 0;
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    let mut affected = Vec::new();
    for r in results {
        match r {
            Ok((i, ok, failure)) => {
                ok_total += ok;
                if let Some(kind) = failure {
                    *failures.entry(kind).or_default() += 1;
                    affected.push(i);
                }
            }
            Err(e) => {
                *failures.entry(format!("panic: {e}")).or_default() += 1;
            }
        }
    }
    affected.sort_unstable();
    let m = backend.metrics();
    let expected = args.sandboxes * args.commands;
    bar.finish(format!(
        "{} sandboxes done, {ok_total}/{expected} commands ok",
        args.sandboxes
    ));
    println!(
        "{}",
        json!({
            "sandboxes": args.sandboxes,
            "commands_expected": expected,
            "commands_ok": ok_total,
            "failures": failures,
            "affected_sandboxes": affected,
            "duration_ms": started.elapsed().as_millis() as u64,
            "metrics": {
                "sandboxes_started": m.sandboxes_started,
                "start_failures": m.start_failures,
                "recreated": m.recreated,
                "retries": m.retries,
                "slot_waits": m.slot_waits,
                "slot_wait_ms": m.slot_wait_us / 1000,
                "slot_wait_max_ms": m.slot_wait_max_us / 1000,
                "breaker_opened": m.breaker_opened,
                "start_phase_mean_ms": crate::json::start_phase_means(&m),
            },
        })
    );
    Ok(if ok_total == expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
