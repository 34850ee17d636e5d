//! `corral snapshots`: list and delete snapshots.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::ps::ownership_name;

/// List snapshots (`corral run --snapshot NAME` keeps one; the API and the
/// library take them too), or delete them.
///
/// A snapshot is a sandbox's root file system and spec, kept by the
/// backend (Docker: the image corral-snapshot:NAME). Durable ones are kept
/// until deleted; others go with the process that took them (`corral gc`).
#[derive(Args, Debug)]
pub struct SnapshotsArgs {
    #[command(subcommand)]
    action: Option<Action>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Delete snapshots (refused while sandboxes started from one exist).
    Rm {
        /// Snapshot names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub async fn run(
    config: crate::commands::BackendConfig,
    args: SnapshotsArgs,
) -> anyhow::Result<ExitCode> {
    let runtime = super::connect(config).await?;
    if let Some(Action::Rm { names }) = args.action {
        let mut failed = false;
        for name in &names {
            match runtime.delete_snapshot(name).await {
                Ok(()) => println!("deleted {name}"),
                Err(e) => {
                    eprintln!("corral: {e}");
                    failed = true;
                }
            }
        }
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let list = runtime.snapshots().await?;
    if args.json {
        for s in &list {
            println!(
                "{}",
                json!({
                    "name": s.name,
                    "image": s.image,
                    "source_sandbox": s.source_sandbox,
                    "base_image": s.spec.image,
                    "created": s.created,
                    "size": s.size,
                    "durable": s.durable,
                    "ownership": ownership_name(s.ownership),
                })
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<28} {:<28} {:>10} {:<8} SOURCE",
        "NAME", "BASE IMAGE", "SIZE", "KEPT"
    );
    for s in &list {
        let kept = if s.durable {
            "durable"
        } else {
            ownership_name(s.ownership)
        };
        println!(
            "{:<28} {:<28} {:>10} {:<8} {}",
            s.name,
            s.spec.image,
            format!("{:.1}M", s.size as f64 / 1e6),
            kept,
            s.source_sandbox
        );
    }
    Ok(ExitCode::SUCCESS)
}
