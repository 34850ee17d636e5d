//! `corral egress SANDBOX`: what the egress gateway of a sandbox with
//! `network: {egress: ...}` allowed and refused (`Backend::egress_counts`,
//! the counts `GET /v1/sandboxes/{id}/egress` serves), read from the
//! engine as `corral ps` and `corral port` do.

use std::process::ExitCode;

use clap::Args;

/// Show what a sandbox's egress policy allowed and refused.
///
/// Show the counts of the egress gateway of a sandbox with an egress
/// policy (`network: {egress: {allow: [...]}}`): DNS names resolved and
/// refused, connections relayed and refused, and the last refusals
/// (oldest first). SANDBOX is a sandbox id (or a unique prefix of it, or
/// of its container id) as `corral ps` lists it. Exit 0; 125 when there
/// is no such sandbox or it has no egress policy.
#[derive(Args, Debug)]
pub struct EgressArgs {
    /// The sandbox (id or unique prefix, as `corral ps` shows).
    sandbox: String,
    /// One JSON object (the HTTP API's `EgressCounts`) instead of lines.
    #[arg(long)]
    json: bool,
}

pub async fn run(config: super::BackendConfig, args: EgressArgs) -> anyhow::Result<ExitCode> {
    let runtime = super::connect(config).await?;
    let backend = runtime.backend().clone();
    let list = backend.list().await?;
    let sandbox = super::find_sandbox(&list, &args.sandbox)?;
    let Some(c) = backend.egress_counts(&sandbox.sandbox_id).await? else {
        return Err(crate::diagnostics::CliError::BadArgument {
            command: "egress",
            what: "SANDBOX",
            value: sandbox.sandbox_id,
            reason: "it has no egress policy (network: {egress: ...}), so nothing counts what it reaches",
        }
        .into());
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "dns_allowed": c.dns_allowed,
                "dns_refused": c.dns_refused,
                "connections_allowed": c.connections_allowed,
                "connections_refused": c.connections_refused,
                "recent_refusals": c.recent_refusals,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("sandbox              {}", sandbox.sandbox_id);
    println!("dns allowed          {}", c.dns_allowed);
    println!("dns refused          {}", c.dns_refused);
    println!("connections allowed  {}", c.connections_allowed);
    println!("connections refused  {}", c.connections_refused);
    for refusal in &c.recent_refusals {
        println!("refused              {refusal}");
    }
    Ok(ExitCode::SUCCESS)
}
