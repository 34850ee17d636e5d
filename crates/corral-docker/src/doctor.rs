//! `corral doctor`: what the daemon offers and which protections are in force.
//!
//! The daemon's own answers (version, runtimes, cgroup version, storage
//! driver, corral's network) say what is possible; the runtime's probe
//! sandbox (`corral::doctor`) says what actually holds.

use corral_core::backend::{Backend, Check};
use corral_core::spec::GVISOR_LIVE_RUNTIME;

use crate::DockerBackend;
use corral_core::Error;

/// Everything `corral doctor` reports.
#[derive(Debug, Clone, Default)]
pub struct DoctorReport {
    /// Endpoint in use.
    pub endpoint: String,
    /// Daemon version.
    pub server_version: String,
    /// Daemon's API version.
    pub api_version: String,
    /// Daemon's operating system.
    pub os: String,
    /// Kernel version.
    pub kernel: String,
    /// cgroup version ("1" or "2").
    pub cgroup_version: String,
    /// cgroup driver.
    pub cgroup_driver: String,
    /// Storage driver.
    pub storage_driver: String,
    /// OCI runtimes the daemon knows.
    pub runtimes: Vec<String>,
    /// The default runtime.
    pub default_runtime: String,
    /// Daemon security options (seccomp, apparmor, userns, rootless...).
    pub security_options: Vec<String>,
    /// Whether `--storage-opt size=` works; `None` when not probed.
    pub storage_opt: Option<bool>,
    /// Size of the embedded agent binary.
    pub agent_bytes: usize,
    /// corral's sandbox network: present, made by corral, inter-container
    /// communication off.
    pub network: Check,
    /// Egress policies by name: whether the daemon makes an internal
    /// network whose bridge has no host address (probed with a network
    /// made and removed at once).
    pub egress: Check,
    /// Live snapshots and pause to disk: the daemon on this host, with
    /// runtime `runsc-live` and its checkpoint API (`experimental`).
    pub live: Check,
}

impl DockerBackend {
    /// Gathers the report; with `image`, also probes storage-opt support
    /// (with `owner`'s labels on the probe container). The protections in
    /// force inside a sandbox are the runtime's probe (`corral::doctor`).
    pub async fn doctor(
        &self,
        image: Option<&str>,
        owner: &corral_core::labels::Owner,
    ) -> Result<DoctorReport, Error> {
        let docker = self.docker();
        let version = docker
            .version()
            .await
            .map_err(|e| crate::error::api("daemon version", e))?;
        let info = docker
            .info()
            .await
            .map_err(|e| crate::error::api("daemon info", e))?;
        let mut runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        runtimes.sort();
        let mut report = DoctorReport {
            endpoint: self.endpoint().to_string(),
            server_version: version.version.unwrap_or_default(),
            api_version: version.api_version.unwrap_or_default(),
            os: info.operating_system.unwrap_or_default(),
            kernel: info.kernel_version.unwrap_or_default(),
            cgroup_version: info
                .cgroup_version
                .map(|v| v.to_string())
                .unwrap_or_default(),
            cgroup_driver: info
                .cgroup_driver
                .map(|v| v.to_string())
                .unwrap_or_default(),
            storage_driver: info.driver.unwrap_or_default(),
            runtimes,
            default_runtime: info.default_runtime.unwrap_or_default(),
            security_options: info.security_options.unwrap_or_default(),
            storage_opt: None,
            agent_bytes: crate::agent_volume::AGENT_BINARY.len(),
            network: Check::default(),
            egress: Check::default(),
            live: Check::default(),
        };
        if let Some(image) = image {
            self.ensure_image(image).await?;
            report.storage_opt = Some(self.storage_opt_supported(image, owner).await?);
        }
        report.network = self.network_check().await?;
        report.egress = self.egress_check().await;
        let name = "live snapshots".to_string();
        let refusal = if report.runtimes.iter().any(|r| r == GVISOR_LIVE_RUNTIME) {
            self.live_refusal().await
        } else {
            Some(format!(
                "runtime {GVISOR_LIVE_RUNTIME} is not registered (scripts/ensure-gvisor.sh)"
            ))
        };
        report.live = match refusal {
            Some(why) => Check {
                name,
                ok: false,
                detail: format!("{why}: a live snapshot is refused, pause freezes"),
            },
            None => Check {
                name,
                ok: true,
                detail:
                    "gVisor sandboxes without network can be snapshotted live and paused to disk"
                        .into(),
            },
        };
        Ok(report)
    }
}

impl DockerBackend {
    /// The state of corral's sandbox network, without creating it.
    async fn network_check(&self) -> Result<Check, Error> {
        use crate::network::{find, ICC_OPTION, NETWORK_NAME};
        let name = format!("network {NETWORK_NAME}");
        Ok(match find(self.docker()).await {
            Ok(Some(n)) => Check {
                name,
                ok: true,
                detail: format!(
                    "bridge {}, {ICC_OPTION}=false: sandboxes reach outside, not each other",
                    n.subnets.join(",")
                ),
            },
            Ok(None) => Check {
                name,
                ok: true,
                detail: "not made yet: created for the first sandbox with network".into(),
            },
            Err(Error::Network { reason, .. }) => Check {
                name,
                ok: false,
                detail: reason,
            },
            Err(e) => return Err(e),
        })
    }
}

impl DockerBackend {
    /// Whether sandboxes with an egress policy can be made: an internal
    /// network with `inhibit_ipv4` is made, inspected and removed.
    async fn egress_check(&self) -> Check {
        use crate::egress::INHIBIT_IPV4;
        let docker = self.docker();
        let name = format!("corral-egress-probe-{}", std::process::id());
        let check = |ok: bool, detail: String| Check {
            name: "egress by name".into(),
            ok,
            detail,
        };
        let made = docker
            .create_network(bollard::models::NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".into()),
                internal: Some(true),
                options: Some(std::collections::HashMap::from([(
                    INHIBIT_IPV4.to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            })
            .await;
        if let Err(e) = made {
            return check(
                false,
                format!(
                    "cannot make an internal network: {e}; network: {{egress: ...}} is refused"
                ),
            );
        }
        let inspected = docker
            .inspect_network(
                &name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await;
        let _ = docker.remove_network(&name).await;
        match inspected {
            Ok(n) if n.internal == Some(true)
                && n.options.as_ref().and_then(|o| o.get(INHIBIT_IPV4)).map(String::as_str)
                    == Some("true") =>
            {
                check(
                    true,
                    "internal network, no host address: sandboxes with an egress policy reach \
                     only their gateway"
                        .into(),
                )
            }
            Ok(_) => check(
                false,
                format!(
                    "this daemon drops internal or {INHIBIT_IPV4}: network: {{egress: ...}} is refused"
                ),
            ),
            Err(e) => check(false, format!("cannot inspect the probe network: {e}")),
        }
    }
}
