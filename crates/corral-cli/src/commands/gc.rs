//! `corral gc`: remove orphaned sandboxes.

use std::process::ExitCode;

use clap::Args;
use corral::GcStep;
use corral_core::outcome::short;

use crate::diagnostics::Diagnostic;
use crate::progress::{self, Progress};

/// Remove orphaned sandboxes, volumes and snapshots.
///
/// Remove orphans: corral containers whose owning corral process is gone
/// (killed, crashed), per-sandbox volumes no container uses any more, and
/// snapshots whose owner is gone. Containers of live corral processes, of
/// other hosts and persistent ones are kept, as are durable snapshots. On
/// Kubernetes an owner is alive while its Lease is renewed, whatever host
/// it runs on: pods whose Lease expired are removed, and so are expired
/// Leases; persistent sessions' volumes are never removed.
///
/// On a terminal a progress bar counts the sandboxes removed (--quiet: none).
#[derive(Args, Debug)]
pub struct GcArgs {
    /// Also remove sandboxes and snapshots whose owner is alive or on
    /// another host (persistent sandboxes and durable snapshots are still
    /// kept).
    #[arg(long)]
    all: bool,
}

pub async fn run(config: crate::commands::BackendConfig, args: GcArgs) -> anyhow::Result<ExitCode> {
    let backend = super::connect(config).await?;
    let bar = Progress::spinner(progress::wanted(false), "gc", "listing sandboxes");
    let report = backend
        .gc_with(args.all, |step| match step {
            GcStep::Sandboxes { total } => {
                bar.message("sandboxes removed");
                bar.count(total as u64);
            }
            GcStep::SandboxDone => bar.inc(),
            GcStep::Volumes => bar.phase("removing unused volumes"),
            GcStep::Snapshots => bar.phase("removing orphaned snapshots"),
        })
        .await?;
    let done = report.removed.len() + report.failed.len();
    bar.finish(format!(
        "{}/{done} sandboxes removed, {} volumes, {} snapshots",
        report.removed.len(),
        report.volumes_removed.len(),
        report.snapshots_removed.len()
    ));
    for s in &report.removed {
        println!(
            "removed {} ({}, {})",
            s.sandbox_id,
            short(&s.placement.0),
            s.state
        );
    }
    for v in &report.volumes_removed {
        // `kind/name` for what is not a volume (a Kubernetes `lease/NAME`).
        match v.split_once('/') {
            Some((kind, name)) => println!("removed {kind} {name}"),
            None => println!("removed volume {}", short(v)),
        }
    }
    for name in &report.snapshots_removed {
        println!("removed snapshot {name}");
    }
    for (s, e) in &report.failed {
        Diagnostic::new(format!(
            "could not remove {} ({}): {e}",
            s.sandbox_id,
            short(&s.placement.0)
        ))
        .emit();
    }
    println!(
        "{} removed, {} kept, {} failed",
        report.removed.len(),
        report.kept.len(),
        report.failed.len()
    );
    Ok(if report.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
