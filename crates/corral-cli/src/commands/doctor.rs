//! `corral doctor`: is the daemon usable, and which protections hold.

use std::process::ExitCode;

use clap::Args;

use crate::progress::{self, Progress};

/// Check the daemon (or cluster) and the protections in force.
///
/// Check the daemon: reachable, API version, runtimes, cgroup version,
/// storage-opt support, corral's sandbox network (isolated bridge), and
/// (with an image that has /bin/sh) which protections are actually in force
/// inside a default sandbox and whether a pristine one resets in place.
/// With `backend: kubernetes`: the API server, corral's permissions in its
/// namespace, RuntimeClasses, the agent image, whether the namespace's Pod
/// Security level admits in-place reset, what holds inside a probe pod of
/// the config's `defaults` and whether a pristine one resets in place (if
/// not, why: Pod Security, seccomp, AppArmor). Exits 1 when a protection
/// or permission does not hold (in-place reset is reported, not required).
/// On a terminal a spinner shows which check is under way (--quiet: none).
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
    settings: &corral::config::Config,
    args: DoctorArgs,
) -> anyhow::Result<ExitCode> {
    if config.kind == corral::config::BackendKind::Kubernetes {
        return kubernetes(config, settings, args).await;
    }
    let (runtime, backend) = super::connect_docker(config).await?;
    let image = (!args.no_probe).then(|| args.image.clone().unwrap_or_else(super::default_image));
    let checking = Progress::spinner(progress::wanted(false), "doctor", "checking the daemon");
    let r = backend.doctor(image.as_deref(), runtime.owner()).await?;
    let (protections, reset) = match &image {
        Some(image) => {
            let spec = corral::SandboxSpec::new(image);
            checking.phase(format!("probing a sandbox from {image}"));
            let protections = corral::doctor::probe(&runtime, &spec).await?;
            checking.phase("probing in-place reset");
            (
                protections,
                Some(corral::doctor::reset_probe(&runtime, &spec).await),
            )
        }
        None => (Vec::new(), None),
    };
    let gvisor = gvisor_check(&runtime, &r.runtimes, image.as_deref(), &checking).await;
    checking.clear();
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
    println!("gVisor        {}", gvisor);
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
    // Only egress policies need it: reported, not a failure of the daemon.
    println!(
        "egress        [{}] {}: {}",
        if r.egress.ok { " ok " } else { "WARN" },
        r.egress.name,
        r.egress.detail
    );
    // Only live snapshots and pause to disk need it.
    println!(
        "live          [{}] {}: {}",
        if r.live.ok { " ok " } else { "WARN" },
        r.live.name,
        r.live.detail
    );
    if let Some(image) = image {
        println!("protections in force (probe sandbox from {image}):");
        all_ok &= print_protections(&protections);
    }
    if let Some(reset) = &reset {
        print_capability(reset);
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Whether `isolation: gvisor` works on this daemon and why not: the
/// runtime registered, and (with a probe image) a sandbox started under it.
/// Reported, not a failure of the daemon: only gVisor specs need it.
async fn gvisor_check(
    runtime: &corral::Runtime,
    runtimes: &[String],
    image: Option<&str>,
    checking: &Progress,
) -> String {
    use corral::spec::GVISOR_RUNTIME;
    use corral::Isolation;
    if !runtimes.iter().any(|r| r == GVISOR_RUNTIME) {
        return format!(
            "[WARN] not usable: the daemon has no runtime '{GVISOR_RUNTIME}', so isolation \
             gvisor is refused (scripts/ensure-gvisor.sh installs and registers it)"
        );
    }
    let Some(image) = image else {
        return format!("[ ok ] runtime '{GVISOR_RUNTIME}' registered (not probed)");
    };
    checking.phase("probing a gVisor sandbox");
    let mut spec = corral::SandboxSpec::new(image);
    spec.isolation = Isolation::Gvisor;
    match corral::doctor::probe(runtime, &spec).await {
        Ok(_) => format!(
            "[ ok ] usable: a probe sandbox ran under runtime '{GVISOR_RUNTIME}' (isolation gvisor)"
        ),
        Err(e) => format!(
            "[WARN] runtime '{GVISOR_RUNTIME}' is registered but a sandbox cannot start under \
             it: {e}"
        ),
    }
}

/// The Kubernetes report: the API server, corral's permissions in its
/// namespace, RuntimeClasses, what the API cannot tell, and (unless
/// `--no-probe`) what holds inside a pod of the configured defaults.
async fn kubernetes(
    config: crate::commands::BackendConfig,
    settings: &corral::config::Config,
    args: DoctorArgs,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let backend = corral_kube::KubeBackend::connect(&config.kube)
        .await
        .context("cannot reach a Kubernetes cluster")?;
    let shared: std::sync::Arc<dyn corral::backend::Backend> = std::sync::Arc::new(backend.clone());
    config.opened.push(shared.clone());
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
    println!(
        "  [{}] {:<30} {}",
        if r.pristine.ok { " ok " } else { "WARN" },
        r.pristine.name,
        r.pristine.detail
    );
    if !args.no_probe {
        let mut spec = settings.defaults.clone();
        if let Some(image) = args.image {
            spec.image = image;
        } else if spec.image.is_empty() {
            spec.image = super::default_image();
        }
        let runtime = corral::Runtime::new(shared, config.runtime);
        println!(
            "protections in force (probe pod of the configured defaults, from {}):",
            spec.image
        );
        let protections = match corral::doctor::probe(&runtime, &spec).await {
            Ok(checks) => checks,
            // A spec a pod cannot express (the hardened default's pids
            // limit, say) is a finding, not a crash.
            Err(e) => vec![corral::backend::Check {
                name: "probe sandbox".into(),
                ok: false,
                detail: e.to_string(),
            }],
        };
        all_ok &= print_protections(&protections);
        print_capability(&corral::doctor::reset_probe(&runtime, &spec).await);
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Prints what a probe found of a capability (not a protection: WARN,
/// never a failure of `doctor`).
fn print_capability(c: &corral::backend::Check) {
    println!(
        "  [{}] {:<24} {}",
        if c.ok { " ok " } else { "WARN" },
        c.name,
        c.detail
    );
}

/// Prints what the probe sandbox found; true when every protection holds.
fn print_protections(checks: &[corral::backend::Check]) -> bool {
    for c in checks {
        println!(
            "  [{}] {:<24} {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    checks.iter().all(|c| c.ok)
}
