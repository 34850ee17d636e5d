//! Egress by name on Docker: per sandbox with `network: {egress: ...}`, an
//! internal network and a gateway container.
//!
//! The sandbox joins `corral-egress-<sandbox>`, a bridge made with
//! `internal: true` and `inhibit_ipv4`: the daemon forwards nothing off
//! it (no NAT; its iptables rules drop whatever tries to leave the subnet)
//! and the host's side of the bridge has no address, so the default route
//! Docker still gives the sandbox leads nowhere ("no route to host" once
//! ARP for the absent next hop fails, about 3 s for the first attempt), and
//! the host's own services are not on the network. An IP literal, another
//! port, UDP, QUIC and IPv6 have nowhere to go. The only
//! other member is the gateway, `corral-egress-gw-<sandbox>`: the agent
//! binary's `egress-gateway` mode, PID 1 of an image holding nothing else
//! (`corral-egress:<agent build>`, imported from a tar made here, no
//! registry), as its Kubernetes pod runs: uid and gid 65534, every
//! capability dropped, a read-only root (its counts on a small tmpfs),
//! no new privileges; the namespaced sysctl
//! `net.ipv4.ip_unprivileged_port_start=0` lets it bind 53, 80 and 443
//! without NET_BIND_SERVICE. It also
//! joins the outside network (`daemon.egress_network`, default corral's
//! bridge) and is the sandbox's resolver (Docker's `dns` option, behind the
//! daemon's embedded resolver), answering allowed names with its own
//! address so ordinary tools connect to it with no configuration.
//!
//! One gateway per sandbox: the policy is the sandbox's alone, its counts
//! are the sandbox's, and removing the sandbox removes it (with the
//! network). It costs a container start (about the cost of the sandbox's
//! own) and a few MB of memory.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkConnectRequest, NetworkCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use corral_core::egress::EgressPolicy;
use corral_core::Error;
use futures_util::TryStreamExt;

use crate::agent_volume::{agent_hash, AGENT_BINARY};
use crate::error::{api, is_not_found, status_code};

/// Label on egress networks and gateways; the value is the sandbox id.
pub const EGRESS_LABEL: &str = "corral.egress";

/// The bridge option that leaves the host without an address on the network.
pub const INHIBIT_IPV4: &str = "com.docker.network.bridge.inhibit_ipv4";

/// The gateway image's repository (tagged with the agent build).
pub const IMAGE_REPO: &str = "corral-egress";

/// The user and group the gateway runs as (nobody), as on Kubernetes.
pub const GATEWAY_UID: u32 = 65534;

/// The gateway's one writable directory (a tmpfs; its root is read-only).
const GATEWAY_RUN: &str = "/run";

/// Where the gateway writes its counts.
const GATEWAY_STATS: &str = "/run/egress-stats.json";

/// The internal network of `sandbox`.
pub fn network_name(sandbox: &str) -> String {
    format!("corral-egress-{sandbox}")
}

/// Whether `name` is a sandbox's internal egress network.
pub fn is_egress_network(name: &str) -> bool {
    name.starts_with("corral-egress-")
}

/// The gateway container of `sandbox`.
pub fn gateway_name(sandbox: &str) -> String {
    format!("corral-egress-gw-{sandbox}")
}

/// The gateway image of this agent build.
pub fn image() -> String {
    format!("{IMAGE_REPO}:{}", agent_hash())
}

/// What a sandbox with an egress policy is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPath {
    /// The internal network the sandbox joins (id).
    pub network: String,
    /// The gateway's address on it: the sandbox's resolver.
    pub gateway_ip: String,
}

/// Counts of one sandbox's gateway.
pub use corral_core::egress::EgressCounts as EgressStats;

fn net_error(sandbox: &str, reason: String) -> Error {
    Error::Network {
        network: network_name(sandbox),
        reason,
    }
}

/// Imports the gateway image when this daemon lacks it.
pub async fn ensure_image(docker: &Docker) -> Result<String, Error> {
    let image = image();
    match docker.inspect_image(&image).await {
        Ok(_) => return Ok(image),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(api(format!("inspect image {image}"), e)),
    }
    let tar = gateway_rootfs().map_err(|e| Error::Agent {
        sandbox: String::new(),
        message: format!("cannot pack the egress gateway image: {e}"),
    })?;
    let opts = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(IMAGE_REPO)
        .tag(&agent_hash())
        .build();
    docker
        .create_image(Some(opts), Some(bollard::body_full(tar.into())), None)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| api(format!("import image {image}"), e))?;
    Ok(image)
}

/// The gateway image's root: the agent binary and nothing else.
fn gateway_rootfs() -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(AGENT_BINARY.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    builder.append_data(&mut header, "corral-agent", AGENT_BINARY)?;
    builder.into_inner()
}

/// Makes (or finds, after a recreate) the internal network and the running
/// gateway of `sandbox`, whose outside leg joins `outside`.
pub async fn ensure(
    docker: &Docker,
    sandbox: &str,
    policy: &EgressPolicy,
    outside: &str,
) -> Result<EgressPath, Error> {
    let image = ensure_image(docker).await?;
    let net = network_name(sandbox);
    // Not the sandbox label: a gateway is not a sandbox to list or adopt.
    let labels = HashMap::from([(EGRESS_LABEL.to_string(), sandbox.to_string())]);
    let created = docker
        .create_network(NetworkCreateRequest {
            name: net.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            attachable: Some(false),
            enable_ipv6: Some(false),
            // The bridge takes no address: the host is not on this network.
            options: Some(HashMap::from([(
                INHIBIT_IPV4.to_string(),
                "true".to_string(),
            )])),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await;
    if let Err(e) = created {
        if status_code(&e) != Some(409) {
            return Err(net_error(
                sandbox,
                format!("cannot create the internal network: {e}"),
            ));
        }
    }
    let network = docker
        .inspect_network(
            &net,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .map_err(|e| api(format!("inspect network {net}"), e))?;
    if network.internal != Some(true)
        || !network
            .labels
            .unwrap_or_default()
            .contains_key(EGRESS_LABEL)
    {
        return Err(net_error(
            sandbox,
            "a network of this name exists but is not corral's internal egress network; remove it"
                .into(),
        ));
    }
    let inhibited = network
        .options
        .as_ref()
        .and_then(|o| o.get(INHIBIT_IPV4))
        .map(String::as_str)
        == Some("true");
    if !inhibited {
        let _ = docker.remove_network(&net).await;
        return Err(net_error(
            sandbox,
            format!(
                "this daemon made the internal network without {INHIBIT_IPV4}=true, so the \
                 host would sit on it and a sandbox could reach the host's services; egress \
                 policies need a daemon whose bridge driver honours it (Docker Engine does, \
                 Podman does not)"
            ),
        ));
    }
    let network_id = network.id.unwrap_or(net.clone());

    let gw = gateway_name(sandbox);
    let policy_json = serde_json::to_string(policy)
        .map_err(|e| net_error(sandbox, format!("cannot encode the egress policy: {e}")))?;
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        entrypoint: Some(vec!["/corral-agent".into(), "egress-gateway".into()]),
        cmd: Some(Vec::new()),
        env: Some(vec![
            format!("CORRAL_EGRESS_POLICY={policy_json}"),
            format!("CORRAL_EGRESS_STATS={GATEWAY_STATS}"),
        ]),
        user: Some(format!("{GATEWAY_UID}:{GATEWAY_UID}")),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some(network_id.clone()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                GATEWAY_RUN.to_string(),
                format!(
                    "rw,noexec,nosuid,nodev,size=1m,mode=0700,uid={GATEWAY_UID},gid={GATEWAY_UID}"
                ),
            )])),
            sysctls: Some(HashMap::from([(
                "net.ipv4.ip_unprivileged_port_start".to_string(),
                "0".to_string(),
            )])),
            memory: Some(128 << 20),
            pids_limit: Some(512),
            ..Default::default()
        }),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default().name(&gw).build();
    match docker.create_container(Some(opts), body).await {
        Ok(_) => {
            docker
                .connect_network(
                    outside,
                    NetworkConnectRequest {
                        container: gw.clone(),
                        endpoint_config: Some(EndpointSettings::default()),
                    },
                )
                .await
                .map_err(|e| api(format!("connect gateway {gw} to network {outside}"), e))?;
        }
        Err(e) if status_code(&e) == Some(409) => {}
        Err(e) => return Err(api(format!("create egress gateway {gw} from {image}"), e)),
    }
    match docker
        .start_container(
            &gw,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
    {
        Ok(()) => {}
        Err(e) if status_code(&e) == Some(304) => {}
        Err(e) => return Err(api(format!("start egress gateway {gw}"), e)),
    }
    let inspected = docker
        .inspect_container(
            &gw,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(|e| api(format!("inspect egress gateway {gw}"), e))?;
    let gateway_ip = inspected
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.get(&net).and_then(|e| e.ip_address.clone()))
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| {
            net_error(
                sandbox,
                format!("gateway {gw} has no address on the network"),
            )
        })?;
    Ok(EgressPath {
        network: network_id,
        gateway_ip,
    })
}

/// Removes the gateway and the internal network of `sandbox`; gone is fine.
pub async fn remove(docker: &Docker, sandbox: &str) {
    let gw = gateway_name(sandbox);
    let rm = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    if let Err(e) = docker.remove_container(&gw, Some(rm)).await {
        if !is_not_found(&e) {
            tracing::warn!(container = %gw, error = %e, "removing the egress gateway failed");
        }
    }
    let net = network_name(sandbox);
    if let Err(e) = docker.remove_network(&net).await {
        if !is_not_found(&e) {
            tracing::warn!(network = %net, error = %e, "removing the egress network failed");
        }
    }
}

/// The counts of `sandbox`'s gateway (read with `docker exec`); `None`
/// when it has none.
pub async fn stats(docker: &Docker, sandbox: &str) -> Result<Option<EgressStats>, Error> {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    let gw = gateway_name(sandbox);
    let exec = match docker
        .create_exec(
            &gw,
            CreateExecOptions::<String> {
                cmd: Some(vec!["/corral-agent".into(), "egress-stats".into()]),
                attach_stdout: Some(true),
                ..Default::default()
            },
        )
        .await
    {
        Ok(e) => e,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(api(format!("read the counts of egress gateway {gw}"), e)),
    };
    let mut out = Vec::new();
    if let StartExecResults::Attached { mut output, .. } =
        docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| api(format!("read the counts of egress gateway {gw}"), e))?
    {
        while let Some(chunk) = output
            .try_next()
            .await
            .map_err(|e| api(format!("read the counts of egress gateway {gw}"), e))?
        {
            out.extend_from_slice(&chunk.into_bytes());
        }
    }
    serde_json::from_slice(&out).map(Some).map_err(|e| {
        net_error(
            sandbox,
            format!(
                "gateway {gw} printed no counts ({e}): {}",
                String::from_utf8_lossy(&out)
            ),
        )
    })
}
