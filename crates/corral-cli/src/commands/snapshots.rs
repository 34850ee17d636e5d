//! `corral snapshots`: list and delete snapshots.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::ps::ownership_name;

/// List or delete snapshots.
///
/// List snapshots (`corral run --snapshot NAME` keeps one; the API and the
/// library take them too), or delete them.
///
/// A snapshot is a sandbox's root file system and spec (its variables'
/// names, not their values): an image the engine keeps (KIND image;
/// Docker: corral-snapshot:NAME), or the changes of a sandbox that resets
/// in place, kept by corral (KIND delta: a file in snapshots.dir when
/// durable, else the memory of the process that took it). Durable ones are
/// kept until deleted; others go with the process that took them
/// (`corral gc` removes images whose owner is gone). The CLI is the operator:
/// it lists every principal's snapshots; those of `corral serve`'s tenants
/// and MCP sessions are named NAMESPACE/NAME (OWNER says whose).
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
        /// Snapshot names (NAMESPACE/NAME for a tenant's or an MCP session's).
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
                    crate::diagnostics::Diagnostic::of_core(&e).emit();
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
                    "name": s.qualified().to_string(),
                    "kind": s.kind.as_str(),
                    "owner": s.qualified().owner().id(),
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
        "{:<28} {:<16} {:<6} {:<28} {:>10} {:<8} SOURCE",
        "NAME", "OWNER", "KIND", "BASE IMAGE", "SIZE", "KEPT"
    );
    for s in &list {
        let kept = if s.durable {
            "durable"
        } else {
            ownership_name(s.ownership)
        };
        let owner = s.qualified().owner().id();
        println!(
            "{:<28} {:<16} {:<6} {:<28} {:>10} {:<8} {}",
            s.qualified().to_string(),
            owner.split(':').take(2).collect::<Vec<_>>().join(":"),
            s.kind.as_str(),
            s.spec.image,
            format!("{:.1}M", s.size as f64 / 1e6),
            kept,
            s.source_sandbox
        );
    }
    Ok(ExitCode::SUCCESS)
}
