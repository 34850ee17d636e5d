//! `corral doctor`: is the daemon usable, and which protections hold.

use std::process::ExitCode;

use clap::Args;

/// Check the daemon: reachable, API version, runtimes, cgroup version,
/// storage-opt support, corral's sandbox network (isolated bridge), and
/// (with an image that has /bin/sh) which protections are actually in force
/// inside a default sandbox. With `backend: kubernetes`: the API server,
/// corral's permissions in its namespace, RuntimeClasses. Exits 1 when a
/// protection or permission does not hold.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Image for the probe sandbox [default: $CORRAL_IMAGE or corral-test/busybox].
    #[arg(long)]
    image: Option<String>,
    /// Skip the probe sandbox; report the daemon only.
    #[arg(long)]
    no_probe: bool,
}

pub async fn run(
    config: crate::commands::BackendConfig,
    args: DoctorArgs,
) -> anyhow::Result<ExitCode> {
    if config.kind == corral::config::BackendKind::Kubernetes {
        return kubernetes(config).await;
    }
    let (runtime, backend) = super::connect_docker(config).await?;
    let image = (!args.no_probe).then(|| args.image.clone().unwrap_or_else(super::default_image));
    let r = backend.doctor(image.as_deref(), runtime.owner()).await?;
    let protections = match &image {
        Some(image) => corral::doctor::probe(&runtime, image).await?,
        None => Vec::new(),
    };
    println!("daemon        {} (reachable)", r.endpoint);
    println!("version       {} (API {})", r.server_version, r.api_version);
    println!("os / kernel   {} / {}", r.os, r.kernel);
    println!(
        "cgroup        v{} ({} driver)",
        r.cgroup_version, r.cgroup_driver
    );
    println!("storage       {}", r.storage_driver);
    println!(
        "runtimes      {} (default {})",
        r.runtimes.join(", "),
        r.default_runtime
    );
    println!(
        "gVisor        {}",
        if r.runtimes.iter().any(|x| x == "runsc") {
            "available (--runtime runsc)"
        } else {
            "not registered"
        }
    );
    println!("security      {}", r.security_options.join("; "));
    println!(
        "disk limits   {}",
        match r.storage_opt {
            Some(true) => "supported (--storage-opt size=)",
            Some(false) => "NOT supported by this storage driver: --disk is refused",
            None => "not probed",
        }
    );
    println!("agent         {} bytes, embedded", r.agent_bytes);
    let mut all_ok = r.network.ok;
    println!(
        "network       [{}] {}: {}",
        if r.network.ok { " ok " } else { "FAIL" },
        r.network.name,
        r.network.detail
    );
    if let Some(image) = image {
        println!("protections in force (probe sandbox from {image}):");
        for c in &protections {
            all_ok &= c.ok;
            println!(
                "  [{}] {:<24} {}",
                if c.ok { " ok " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The Kubernetes report: the API server, corral's permissions in its
/// namespace, RuntimeClasses, and what the API cannot tell.
async fn kubernetes(config: crate::commands::BackendConfig) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let backend = corral_kube::KubeBackend::connect(&config.kube)
        .await
        .context("cannot reach a Kubernetes cluster")?;
    config.opened.push(std::sync::Arc::new(backend.clone()));
    let r = backend.doctor(&corral::host::this_owner()).await?;
    println!("api server    {} (reachable)", r.endpoint);
    println!("version       {}", r.server_version);
    println!("namespace     {}", r.namespace);
    println!(
        "agent image   {} (pulled by the nodes; checked below)",
        r.agent_image
    );
    println!("checks:");
    let mut all_ok = true;
    for c in &r.checks {
        all_ok &= c.ok;
        println!(
            "  [{}] {:<30} {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    println!("probe sandbox not run on Kubernetes yet");
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
