//! `corral ps`: list sandboxes (containers carrying corral's labels).

use std::process::ExitCode;

use clap::Args;
use corral_core::labels::Ownership;
use corral_core::outcome::short;
use serde_json::json;

/// List sandboxes and whether their owners are alive.
///
/// List sandboxes: every container with a corral.sandbox label, with its
/// owner and whether that owner is still alive.
#[derive(Args, Debug)]
pub struct PsArgs {
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn ownership_name(o: Ownership) -> &'static str {
    match o {
        Ownership::LiveOwner => "owned",
        Ownership::Orphan => "orphan",
        Ownership::ForeignHost => "other-host",
        Ownership::Persistent => "persistent",
    }
}

pub async fn run(config: crate::commands::BackendConfig, args: PsArgs) -> anyhow::Result<ExitCode> {
    let backend = super::connect(config).await?;
    let list = backend.list_sandboxes().await?;
    if args.json {
        for s in &list {
            println!(
                "{}",
                json!({
                    "sandbox_id": s.sandbox_id,
                    "container_id": s.placement.0,
                    "image": s.image,
                    "state": s.state.as_str(),
                    "status": s.status,
                    "created": s.created,
                    "owner": s.owner.as_ref().map(|o| json!({"host": o.host, "pid": o.pid, "start": o.start})),
                    "ownership": ownership_name(s.ownership),
                })
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<16} {:<12} {:<24} {:<9} {:<24} OWNERSHIP",
        "SANDBOX", "CONTAINER", "IMAGE", "STATE", "OWNER"
    );
    for s in &list {
        let owner = s
            .owner
            .as_ref()
            .map(|o| format!("{}:{}", o.host, o.pid))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<16} {:<12} {:<24} {:<9} {:<24} {}",
            s.sandbox_id,
            short(&s.placement.0),
            s.image,
            s.state,
            owner,
            ownership_name(s.ownership)
        );
    }
    Ok(ExitCode::SUCCESS)
}
