//! Egress by name on Kubernetes: the objects a sandbox with `network:
//! {egress: ...}` gets, and the probe that tells whether the cluster
//! enforces them. Pure: no API calls (the backend's side is
//! `backend/egress.rs`), so every field is unit-tested here.
//!
//! Per placement (one sandbox pod `corral-<id>-<suffix>`), made before the
//! sandbox pod and deleted with it:
//! - the **gateway pod** `corral-gw-<id>-<suffix>`: the agent image running
//!   `corral-agent egress-gateway`, the same gateway as Docker's (DNS
//!   answering allowed names with its own address, a relay routing TLS by
//!   SNI and HTTP by `Host`), as uid 65534 with every capability dropped,
//!   a read-only root and its counts on a small memory `emptyDir`; the safe
//!   sysctl `net.ipv4.ip_unprivileged_port_start=0` lets it bind 53, 80
//!   and 443 without `NET_BIND_SERVICE` (which a non-root process would
//!   not hold anyway: Kubernetes grants no ambient capabilities);
//! - the **sandbox's policy** (named as the sandbox pod, selecting it):
//!   egress only to its gateway pod, on UDP 53 and the relay's ports;
//!   nothing else (inbound stays as the namespace's ingress policy says:
//!   corral to the agent port);
//! - the **gateway's policy** (named as the gateway pod): inbound only
//!   from its sandbox on those ports; outbound DNS, and the relay's ports
//!   to the addresses the rules' CIDRs allow (all of IPv4 but link-local
//!   and the denied blocks when no CIDR is allowed), so the cluster, not
//!   only the gateway's code, bounds where an allowed name can lead.
//!
//! The sandbox pod resolves through its gateway (`dnsPolicy: None`,
//! `dnsConfig.nameservers: [gateway IP]`). A CIDR rule opens no direct
//! path from the sandbox: as on Docker, CIDRs bound where names lead.
//!
//! Everything but the sandbox pod carries [`EGRESS_LABEL`] (the sandbox
//! id), [`EGRESS_FOR_LABEL`] (the sandbox pod's name) and the owner's
//! Lease, so `gc` finds what outlived its sandbox pod.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use corral_core::egress::{EgressPolicy, Host, Rules};
use corral_core::labels;
use corral_core::{Error, Network, SandboxSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodDNSConfig, PodSecurityContext,
    PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::lease::LEASE_LABEL;
use crate::pod::{self, PodParams, NETWORK_LABEL};

/// On every egress object but the sandbox pod: the sandbox id (as on
/// Docker), or the probe's id.
pub const EGRESS_LABEL: &str = "corral.egress";
/// The sandbox pod an object belongs to (on the sandbox pod: its own name).
pub const EGRESS_FOR_LABEL: &str = "corral.egress-for";
/// A pod's part: [`ROLE_SANDBOX`] or [`ROLE_GATEWAY`].
pub const ROLE_LABEL: &str = "corral.egress-role";
/// The sandbox (or the probe's client): what the sandbox policy confines.
pub const ROLE_SANDBOX: &str = "sandbox";
/// The gateway (or the probe's listener).
pub const ROLE_GATEWAY: &str = "gateway";
/// The gateway pod's container.
pub const GATEWAY_CONTAINER: &str = "egress-gateway";
/// The probe client's container.
pub const PROBE_CONTAINER: &str = "netpol-probe";
/// Where the gateway keeps its counts (a memory `emptyDir`).
pub const STATS_DIR: &str = "/run/corral-egress";
/// The counts file (the agent's `CORRAL_EGRESS_STATS`).
pub const STATS_FILE: &str = "/run/corral-egress/stats.json";
/// The environment variable holding the gateway's policy (JSON).
pub const POLICY_ENV: &str = "CORRAL_EGRESS_POLICY";
/// The environment variable naming the counts file.
pub const STATS_ENV: &str = "CORRAL_EGRESS_STATS";
/// The sysctl that lets the non-root gateway bind ports below 1024.
pub const PORT_SYSCTL: &str = "net.ipv4.ip_unprivileged_port_start";
/// The uid and gid the gateway runs as (nobody).
const GATEWAY_UID: i64 = 65534;
/// The DNS port the gateway answers on (UDP).
const DNS_PORT: u16 = 53;
/// Cloud metadata services answer here: never reached unless a CIDR rule
/// names it (as `corral_core::egress` decides for the gateway).
const LINK_LOCAL: (Ipv4Addr, u8) = (Ipv4Addr::new(169, 254, 0, 0), 16);

/// The gateway pod of sandbox pod `sandbox_pod`: `corral-<id>-<suffix>` →
/// `corral-gw-<id>-<suffix>`.
pub fn gateway_of(sandbox_pod: &str) -> String {
    let rest = sandbox_pod.strip_prefix("corral-").unwrap_or(sandbox_pod);
    format!("corral-gw-{rest}")
}

/// [`gateway_of`], refused naming the sandbox id when it is too long a
/// pod name.
pub fn gateway_name(sandbox_pod: &str, sandbox_id: &str) -> Result<String, Error> {
    let name = gateway_of(sandbox_pod);
    if !pod::is_dns_label(&name) {
        return Err(Error::Unsupported {
            what: format!(
                "sandbox id '{sandbox_id}' with network.egress on Kubernetes: its gateway pod's \
                 name {name} is not an RFC 1123 label (at most 63 characters)"
            ),
        });
    }
    Ok(name)
}

/// What goes into a gateway pod besides the policy.
#[derive(Debug, Clone)]
pub struct GatewayParams<'a> {
    /// The gateway pod's name ([`gateway_name`]).
    pub name: &'a str,
    /// [`EGRESS_LABEL`]'s value: the sandbox id (or the probe's).
    pub egress_id: &'a str,
    /// The sandbox pod it serves.
    pub sandbox_pod: &'a str,
    /// The owner's Lease (`corral.lease`).
    pub lease: &'a str,
    /// The image holding the static agent at `/corral-agent`.
    pub agent_image: &'a str,
    /// Upstream resolvers; empty: the cluster's DNS.
    pub nameservers: &'a [String],
}

/// The labels of an egress object of `sandbox_pod`.
fn object_labels(egress_id: &str, sandbox_pod: &str, lease: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (EGRESS_LABEL.to_string(), egress_id.to_string()),
        (EGRESS_FOR_LABEL.to_string(), sandbox_pod.to_string()),
        (LEASE_LABEL.to_string(), lease.to_string()),
        (
            labels::VERSION.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ])
}

/// Selects the pod of `role` of sandbox pod `sandbox_pod`.
fn selector(sandbox_pod: &str, role: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([
            (EGRESS_FOR_LABEL.to_string(), sandbox_pod.to_string()),
            (ROLE_LABEL.to_string(), role.to_string()),
        ])),
        match_expressions: None,
    }
}

/// The hardening of the gateway and the probe client: nobody, no
/// capability, read-only root, no privilege escalation, the runtime's
/// seccomp profile.
fn hardened() -> SecurityContext {
    SecurityContext {
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_user: Some(GATEWAY_UID),
        run_as_group: Some(GATEWAY_UID),
        run_as_non_root: Some(true),
        privileged: Some(false),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod-level settings every egress pod shares.
fn pod_spec(containers: Vec<Container>, restart: &str) -> PodSpec {
    PodSpec {
        containers,
        restart_policy: Some(restart.into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        termination_grace_period_seconds: Some(1),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(GATEWAY_UID),
            run_as_group: Some(GATEWAY_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The gateway pod enforcing `policy` for `p.sandbox_pod`.
pub fn gateway_pod(policy: &EgressPolicy, p: &GatewayParams<'_>) -> Result<Pod, Error> {
    let json = serde_json::to_string(policy).map_err(|e| Error::Unsupported {
        what: format!("network.egress: cannot encode the policy for the gateway: {e}"),
    })?;
    let mut labels = object_labels(p.egress_id, p.sandbox_pod, p.lease);
    labels.insert(ROLE_LABEL.into(), ROLE_GATEWAY.into());
    let container = Container {
        name: GATEWAY_CONTAINER.into(),
        image: Some(p.agent_image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/corral-agent".into(), "egress-gateway".into()]),
        args: Some(Vec::new()),
        env: Some(vec![
            EnvVar {
                name: POLICY_ENV.into(),
                value: Some(json),
                ..Default::default()
            },
            EnvVar {
                name: STATS_ENV.into(),
                value: Some(STATS_FILE.into()),
                ..Default::default()
            },
        ]),
        resources: Some(ResourceRequirements {
            // Docker's gateway gets 128 MiB; a request well below keeps
            // a gateway per sandbox cheap to schedule.
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("1".into())),
                ("memory".to_string(), Quantity("128Mi".into())),
            ])),
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(hardened()),
        volume_mounts: Some(vec![VolumeMount {
            name: "counts".into(),
            mount_path: STATS_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    // A gateway that dies comes back in the same pod, at the same address
    // its sandbox resolves through.
    let mut spec = pod_spec(vec![container], "Always");
    spec.volumes = Some(vec![Volume {
        name: "counts".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("1Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    if let Some(sc) = spec.security_context.as_mut() {
        sc.sysctls = Some(vec![Sysctl {
            name: PORT_SYSCTL.into(),
            value: "0".into(),
        }]);
    }
    if !p.nameservers.is_empty() {
        spec.dns_policy = Some("None".into());
        spec.dns_config = Some(PodDNSConfig {
            nameservers: Some(p.nameservers.to_vec()),
            ..Default::default()
        });
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(p.name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// `spec` with `network: bridge` in place of its egress policy: what
/// [`pod::pod`] maps (the policy becomes the objects of this module).
pub fn without_egress(spec: &SandboxSpec) -> SandboxSpec {
    let mut plain = spec.clone();
    plain.network = Network::Bridge;
    plain
}

/// The sandbox pod of an egress `spec`: the pod `pod::pod` makes for it
/// (as if its network were `bridge`), labelled for its policy and
/// resolving through its gateway at `gateway_ip`.
pub fn sandbox_pod(
    spec: &SandboxSpec,
    params: &PodParams<'_>,
    gateway_ip: Ipv4Addr,
) -> Result<Pod, Error> {
    if !matches!(spec.network, Network::Egress(_)) {
        return pod::pod(spec, params);
    }
    let mut made = pod::pod(&without_egress(spec), params)?;
    let labels = made.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(EGRESS_FOR_LABEL.into(), params.name.to_string());
    labels.insert(ROLE_LABEL.into(), ROLE_SANDBOX.into());
    labels.insert(NETWORK_LABEL.into(), "egress".into());
    if let Some(s) = made.spec.as_mut() {
        s.dns_policy = Some("None".into());
        s.dns_config = Some(PodDNSConfig {
            nameservers: Some(vec![gateway_ip.to_string()]),
            ..Default::default()
        });
    }
    Ok(made)
}

fn port(p: u16, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some(protocol.into()),
        end_port: None,
    }
}

/// UDP 53 and the relay's TCP ports: what a sandbox may send its gateway.
fn gateway_ports(relay: &[u16]) -> Vec<NetworkPolicyPort> {
    std::iter::once(port(DNS_PORT, "UDP"))
        .chain(relay.iter().map(|p| port(*p, "TCP")))
        .collect()
}

fn policy_object(
    name: &str,
    egress_id: &str,
    sandbox_pod: &str,
    lease: &str,
    spec: NetworkPolicySpec,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(object_labels(egress_id, sandbox_pod, lease)),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// The sandbox's policy: out only to its gateway, on UDP 53 and `relay`'s
/// TCP ports. Named as the sandbox pod.
pub fn sandbox_policy(
    egress_id: &str,
    sandbox_pod: &str,
    lease: &str,
    relay: &[u16],
) -> NetworkPolicy {
    policy_object(
        sandbox_pod,
        egress_id,
        sandbox_pod,
        lease,
        NetworkPolicySpec {
            pod_selector: Some(selector(sandbox_pod, ROLE_SANDBOX)),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(vec![NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(selector(sandbox_pod, ROLE_GATEWAY)),
                    ..Default::default()
                }]),
                ports: Some(gateway_ports(relay)),
            }]),
            ingress: None,
        },
    )
}

/// What the gateway's policy needs besides the names.
#[derive(Debug, Clone)]
pub struct GatewayPolicyParams<'a> {
    /// The gateway pod's name (the policy's too).
    pub name: &'a str,
    /// [`EGRESS_LABEL`]'s value.
    pub egress_id: &'a str,
    /// The sandbox pod it serves.
    pub sandbox_pod: &'a str,
    /// The owner's Lease.
    pub lease: &'a str,
    /// Upstream resolvers; empty: DNS to any address.
    pub nameservers: &'a [String],
}

/// The gateway's policy: in only from its sandbox; out to DNS and, on the
/// relay's ports, to the addresses `rules`' CIDRs allow.
pub fn gateway_policy(
    policy: &EgressPolicy,
    p: &GatewayPolicyParams<'_>,
) -> Result<NetworkPolicy, Error> {
    let rules = policy.rules()?;
    let relay = policy.ports();
    let dns_ports = vec![port(DNS_PORT, "UDP"), port(DNS_PORT, "TCP")];
    let dns = NetworkPolicyEgressRule {
        to: (!p.nameservers.is_empty()).then(|| {
            p.nameservers
                .iter()
                .map(|ns| NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: format!("{ns}/32"),
                        except: None,
                    }),
                    ..Default::default()
                })
                .collect()
        }),
        ports: Some(dns_ports),
    };
    let mut egress = vec![dns];
    egress.extend(upstream_rules(&rules, &relay));
    Ok(policy_object(
        p.name,
        p.egress_id,
        p.sandbox_pod,
        p.lease,
        NetworkPolicySpec {
            pod_selector: Some(selector(p.sandbox_pod, ROLE_GATEWAY)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(selector(p.sandbox_pod, ROLE_SANDBOX)),
                    ..Default::default()
                }]),
                ports: Some(gateway_ports(&relay)),
            }]),
            egress: Some(egress),
        },
    ))
}

fn mask(addr: Ipv4Addr, len: u8) -> u32 {
    let bits = u32::from(addr);
    if len == 0 {
        0
    } else {
        bits & (u32::MAX << (32 - u32::from(len)))
    }
}

/// Whether block `inner` lies within block `outer`.
fn inside(inner: (Ipv4Addr, u8), outer: (Ipv4Addr, u8)) -> bool {
    inner.1 >= outer.1 && mask(inner.0, outer.1) == mask(outer.0, outer.1)
}

/// An IPv4 block: address and prefix length.
type Block = (Ipv4Addr, u8);

fn cidr_text((addr, len): Block) -> String {
    format!("{addr}/{len}")
}

/// The relay's way out as the cluster enforces it: one rule per allowed
/// CIDR (its port, or every relay port), or with none allowed, all of
/// IPv4 on the relay's ports; denied blocks (those of every port) and
/// link-local (unless a CIDR names it) cut out. A superset of what the
/// gateway itself allows (a deny rule with a port is the gateway's alone),
/// never less.
pub fn upstream_rules(rules: &Rules, relay: &[u16]) -> Vec<NetworkPolicyEgressRule> {
    let cidr = |h: &Host| match h {
        Host::Cidr(a, l) => Some((*a, *l)),
        _ => None,
    };
    let denied: Vec<(Ipv4Addr, u8)> = rules
        .deny
        .iter()
        .filter(|r| r.port.is_none())
        .filter_map(|r| cidr(&r.host))
        .collect();
    let allowed: Vec<((Ipv4Addr, u8), Option<u16>)> = rules
        .allow
        .iter()
        .filter_map(|r| cidr(&r.host).map(|c| (c, r.port)))
        .collect();
    // (block, its exceptions, its ports)
    let mut blocks: Vec<(Block, Vec<Block>, Vec<u16>)> = Vec::new();
    if allowed.is_empty() {
        let mut except = vec![LINK_LOCAL];
        except.extend(denied.iter().copied());
        blocks.push(((Ipv4Addr::UNSPECIFIED, 0), except, relay.to_vec()));
    } else {
        for (block, p) in allowed {
            let except: Vec<(Ipv4Addr, u8)> = denied
                .iter()
                .copied()
                .filter(|d| inside(*d, block))
                .collect();
            let ports = match p {
                Some(p) => vec![p],
                None => relay.to_vec(),
            };
            blocks.push((block, except, ports));
        }
    }
    blocks
        .into_iter()
        .filter_map(|(block, except, ports)| {
            // A block denied whole is not a way out at all.
            if except.iter().any(|e| inside(block, *e)) {
                return None;
            }
            // Only the outermost of nested exceptions.
            let mut except: Vec<(Ipv4Addr, u8)> = except
                .iter()
                .copied()
                .filter(|e| !except.iter().any(|o| o != e && inside(*e, *o)))
                .collect();
            except.sort();
            except.dedup();
            Some(NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: cidr_text(block),
                        except: (!except.is_empty())
                            .then(|| except.into_iter().map(cidr_text).collect()),
                    }),
                    ..Default::default()
                }]),
                ports: Some(ports.into_iter().map(|p| port(p, "TCP")).collect()),
            })
        })
        .collect()
}

/// The port the probe's policy allows to the listener, and the one it
/// does not (the listener, a gateway, serves both).
pub const PROBE_PORTS: (u16, u16) = (443, 80);

/// The probe's client: `corral-agent netpol-probe` from the agent image,
/// hardened as the gateway, confined by [`sandbox_policy`] as a sandbox
/// is, trying the listener at `listener_ip`.
pub fn probe_client_pod(
    name: &str,
    probe_id: &str,
    placement: &str,
    lease: &str,
    agent_image: &str,
    listener_ip: Ipv4Addr,
) -> Pod {
    let mut labels = object_labels(probe_id, placement, lease);
    labels.insert(ROLE_LABEL.into(), ROLE_SANDBOX.into());
    let container = Container {
        name: PROBE_CONTAINER.into(),
        image: Some(agent_image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![
            "/corral-agent".into(),
            "netpol-probe".into(),
            listener_ip.to_string(),
            PROBE_PORTS.0.to_string(),
            PROBE_PORTS.1.to_string(),
        ]),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("250m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(hardened()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(pod_spec(vec![container], "Never")),
        status: None,
    }
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// A policy stopped a connection it denies.
    Enforced(String),
    /// A connection the policy denies went through.
    NotEnforced(String),
}

/// Reads the probe client's output; `Err` when it could not tell.
pub fn probe_verdict(output: &str) -> Result<Enforcement, String> {
    let line = output.lines().map(str::trim).find(|l| !l.is_empty());
    match line {
        Some(l) if l.starts_with("enforced:") => Ok(Enforcement::Enforced(l.to_string())),
        Some(l) if l.starts_with("not-enforced:") => Ok(Enforcement::NotEnforced(l.to_string())),
        Some(l) => Err(l.to_string()),
        None => Err("the probe printed nothing".into()),
    }
}

/// Where a gateway (or the probe's listener) pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayProgress {
    /// Its container runs, at this address.
    Running(Ipv4Addr),
    /// Scheduling, pulling, starting.
    Pending,
    /// No node can take it now (the scheduler's message).
    Unschedulable(String),
    /// The node cannot have its image: the kubelet's reason and message.
    Image(String, String),
    /// It will not run (the sysctl refused, the gateway exiting), and why.
    Failed(String),
}

/// Reads a gateway pod's status (`container`: its container's name).
pub fn gateway_progress(pod: &Pod, container: &str) -> GatewayProgress {
    let Some(status) = pod.status.as_ref() else {
        return GatewayProgress::Pending;
    };
    let says = |reason: Option<&String>, message: Option<&String>| {
        format!(
            "{}: {}",
            reason.map_or("no reason", String::as_str),
            message.map_or("no message", String::as_str)
        )
    };
    if status.phase.as_deref() == Some("Failed") {
        return GatewayProgress::Failed(says(status.reason.as_ref(), status.message.as_ref()));
    }
    let c = status
        .container_statuses
        .as_ref()
        .and_then(|l| l.iter().find(|c| c.name == container));
    if let Some(c) = c {
        let state = c.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.clone().unwrap_or_default();
            let message = w.message.clone().unwrap_or_default();
            if crate::state::IMAGE_REASONS.contains(&reason.as_str()) {
                return GatewayProgress::Image(reason, message);
            }
            if matches!(
                reason.as_str(),
                "CrashLoopBackOff"
                    | "CreateContainerConfigError"
                    | "CreateContainerError"
                    | "RunContainerError"
            ) {
                let last = c
                    .last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.message.clone().or(t.reason.clone()))
                    .map(|m| format!(" (last exit: {m})"))
                    .unwrap_or_default();
                return GatewayProgress::Failed(format!("{reason}: {message}{last}"));
            }
        }
        // A gateway never exits on its own.
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            return GatewayProgress::Failed(format!(
                "the gateway exited with {}: {}",
                t.exit_code,
                t.message
                    .as_deref()
                    .or(t.reason.as_deref())
                    .unwrap_or("no message")
            ));
        }
        let ip = status
            .pod_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        if let (Some(_), Some(ip)) = (state.and_then(|s| s.running.as_ref()), ip) {
            return GatewayProgress::Running(ip);
        }
    }
    if let Some(cond) = status
        .conditions
        .as_ref()
        .and_then(|l| l.iter().find(|c| c.type_ == "PodScheduled"))
    {
        if cond.status == "False" && cond.reason.as_deref() == Some("Unschedulable") {
            return GatewayProgress::Unschedulable(
                cond.message
                    .clone()
                    .unwrap_or_else(|| "unschedulable".into()),
            );
        }
    }
    GatewayProgress::Pending
}

/// Whether an egress object of sandbox pod `sandbox_pod` is garbage: its
/// sandbox pod is gone and either its owner is gone too or it is older
/// than `grace` (a create makes it a moment, at most a start's wait,
/// before the sandbox pod).
pub fn is_orphan(
    sandbox_pod_exists: bool,
    owner_alive: bool,
    age_secs: i64,
    grace_secs: i64,
) -> bool {
    !sandbox_pod_exists && (!owner_alive || age_secs > grace_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::agent_auth::Secret;
    use std::collections::HashMap;

    fn rules(allow: &[&str], deny: &[&str]) -> (EgressPolicy, Rules) {
        let policy = EgressPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        let rules = policy.rules().expect("valid");
        (policy, rules)
    }

    fn gw_params<'a>(nameservers: &'a [String]) -> GatewayParams<'a> {
        GatewayParams {
            name: "corral-gw-sb-1-x",
            egress_id: "sb-1",
            sandbox_pod: "corral-sb-1-x",
            lease: "corral-owner-h-1-ff",
            agent_image: "corral-agent:9",
            nameservers,
        }
    }

    #[test]
    fn the_gateway_runs_as_nobody_with_nothing_but_a_sysctl() {
        let (policy, _) = rules(&["pypi.test", "git.test:9418"], &[]);
        let pod = gateway_pod(&policy, &gw_params(&[])).expect("maps");
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l[EGRESS_LABEL], "sb-1");
        assert_eq!(l[EGRESS_FOR_LABEL], "corral-sb-1-x");
        assert_eq!(l[ROLE_LABEL], ROLE_GATEWAY);
        assert_eq!(l[LEASE_LABEL], "corral-owner-h-1-ff");
        assert!(
            !l.contains_key(labels::SANDBOX),
            "not a sandbox: not listed, not under the sandboxes' ingress policy"
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.containers.len(), 1);
        assert!(spec.init_containers.is_none());
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("corral-agent:9"));
        assert_eq!(
            c.command,
            Some(vec!["/corral-agent".into(), "egress-gateway".into()])
        );
        let sec = c.security_context.as_ref().expect("hardened");
        assert_eq!(
            sec.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".into()])
        );
        assert_eq!(sec.capabilities.as_ref().and_then(|c| c.add.clone()), None);
        assert_eq!(sec.read_only_root_filesystem, Some(true));
        assert_eq!(sec.allow_privilege_escalation, Some(false));
        assert_eq!(sec.run_as_non_root, Some(true));
        assert_eq!(
            (sec.run_as_user, sec.run_as_group),
            (Some(65534), Some(65534))
        );
        assert_eq!(sec.privileged, Some(false));
        assert_eq!(
            sec.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let psc = spec.security_context.as_ref().expect("pod security");
        assert_eq!(psc.run_as_non_root, Some(true));
        let sysctls = psc.sysctls.as_ref().expect("sysctls");
        assert_eq!(
            sysctls
                .iter()
                .map(|s| (s.name.as_str(), s.value.as_str()))
                .collect::<Vec<_>>(),
            vec![(PORT_SYSCTL, "0")]
        );
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        // The counts on a small memory emptyDir, named to the agent.
        let vol = &spec.volumes.as_ref().expect("volumes")[0];
        let dir = vol.empty_dir.as_ref().expect("emptyDir");
        assert_eq!(dir.medium.as_deref(), Some("Memory"));
        let mount = &c.volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(
            (mount.name.as_str(), mount.mount_path.as_str()),
            ("counts", STATS_DIR)
        );
        assert!(STATS_FILE.starts_with(STATS_DIR));
        let env: HashMap<String, String> = c
            .env
            .as_ref()
            .expect("env")
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env[STATS_ENV], STATS_FILE);
        let back: EgressPolicy = serde_json::from_str(&env[POLICY_ENV]).expect("the policy");
        assert_eq!(back, policy);
        // The cluster's DNS upstream by default, the configured servers else.
        assert_eq!(spec.dns_policy, None);
        let ns = vec!["10.0.0.53".to_string()];
        let pod = gateway_pod(&policy, &gw_params(&ns)).expect("maps");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        assert_eq!(
            spec.dns_config.as_ref().and_then(|d| d.nameservers.clone()),
            Some(ns)
        );
    }

    #[test]
    fn names_follow_the_sandbox_pod() {
        assert_eq!(
            gateway_name("corral-sb-0a1b-x1", "sb-0a1b").expect("fits"),
            "corral-gw-sb-0a1b-x1"
        );
        let id = "a".repeat(47);
        let pod = format!("corral-{id}-12345678");
        assert!(pod::is_dns_label(&pod));
        let e = gateway_name(&pod, &id).expect_err("too long");
        assert!(e.to_string().contains(&format!("sandbox id '{id}'")), "{e}");
    }

    fn sandbox(spec: &SandboxSpec) -> Result<Pod, Error> {
        let labels = HashMap::from([(labels::SANDBOX.to_string(), "sb-1".to_string())]);
        sandbox_pod(
            spec,
            &PodParams {
                sandbox_id: "sb-1",
                name: "corral-sb-1-x",
                labels: &labels,
                agent_image: "corral-agent:9",
                agent_port: 7150,
                secret: &Secret::new([7; 32]),
                pristine_refused: None,
                pristine_apparmor: None,
                gvisor_runtime_class: "gvisor",
            },
            Ipv4Addr::new(10, 244, 0, 9),
        )
    }

    fn kube_spec() -> SandboxSpec {
        let mut spec = SandboxSpec::new("busybox:1");
        spec.limits.pids = None;
        for t in &mut spec.tmpfs {
            t.options.clear();
        }
        spec
    }

    #[test]
    fn the_sandbox_resolves_through_its_gateway_and_is_selected() {
        let mut spec = kube_spec();
        spec.network = Network::Egress(EgressPolicy {
            allow: vec!["pypi.test".into()],
            deny: vec![],
        });
        let pod = sandbox(&spec).expect("maps");
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l[EGRESS_FOR_LABEL], "corral-sb-1-x");
        assert_eq!(l[ROLE_LABEL], ROLE_SANDBOX);
        assert_eq!(l[NETWORK_LABEL], "egress");
        assert_eq!(l[labels::SANDBOX], "sb-1");
        assert!(!l.contains_key(EGRESS_LABEL), "gc's label is the gateway's");
        let s = pod.spec.as_ref().expect("spec");
        assert_eq!(s.dns_policy.as_deref(), Some("None"));
        let dns = s.dns_config.as_ref().expect("dns");
        assert_eq!(dns.nameservers, Some(vec!["10.244.0.9".to_string()]));
        assert_eq!(dns.searches, None, "no cluster search domains");
        // Otherwise the pod of the same spec on bridge.
        let mut bridge = spec.clone();
        bridge.network = Network::Bridge;
        let plain = sandbox(&bridge).expect("maps");
        assert_eq!(plain.spec.as_ref().and_then(|s| s.dns_policy.clone()), None);
        assert_eq!(
            plain.spec.as_ref().map(|s| s.containers.clone()),
            pod.spec.as_ref().map(|s| s.containers.clone())
        );
        // What a pod cannot express is still refused by name.
        spec.limits.pids = Some(5);
        assert!(sandbox(&spec)
            .expect_err("pids")
            .to_string()
            .contains("limits.pids"));
    }

    fn peer_labels(p: &NetworkPolicyPeer) -> BTreeMap<String, String> {
        p.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("a pod selector")
    }

    fn ports_of(ports: &Option<Vec<NetworkPolicyPort>>) -> Vec<(String, i32)> {
        ports
            .as_ref()
            .expect("ports")
            .iter()
            .map(|p| {
                let n = match p.port {
                    Some(IntOrString::Int(n)) => n,
                    _ => panic!("numeric ports"),
                };
                (p.protocol.clone().unwrap_or_default(), n)
            })
            .collect()
    }

    #[test]
    fn the_sandbox_may_send_only_to_its_gateway() {
        let (policy, _) = rules(&["pypi.test", "git.test:9418"], &[]);
        let np = sandbox_policy("sb-1", "corral-sb-1-x", "lease-1", &policy.ports());
        assert_eq!(np.metadata.name.as_deref(), Some("corral-sb-1-x"));
        let l = np.metadata.labels.as_ref().expect("labels");
        assert_eq!(
            (l[EGRESS_LABEL].as_str(), l[LEASE_LABEL].as_str()),
            ("sb-1", "lease-1")
        );
        let spec = np.spec.as_ref().expect("spec");
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        assert!(spec.ingress.is_none());
        let selected = spec
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("selector");
        assert_eq!(selected[EGRESS_FOR_LABEL], "corral-sb-1-x");
        assert_eq!(selected[ROLE_LABEL], ROLE_SANDBOX);
        let out = spec.egress.as_ref().expect("egress");
        assert_eq!(out.len(), 1, "one way out");
        let to = out[0].to.as_ref().expect("to");
        assert_eq!(to.len(), 1);
        assert!(to[0].ip_block.is_none() && to[0].namespace_selector.is_none());
        let gw = peer_labels(&to[0]);
        assert_eq!(gw[EGRESS_FOR_LABEL], "corral-sb-1-x");
        assert_eq!(gw[ROLE_LABEL], ROLE_GATEWAY);
        assert_eq!(
            ports_of(&out[0].ports),
            vec![
                ("UDP".into(), 53),
                ("TCP".into(), 80),
                ("TCP".into(), 443),
                ("TCP".into(), 9418)
            ]
        );
    }

    fn blocks(out: &[NetworkPolicyEgressRule]) -> Vec<(String, Vec<String>, Vec<i32>)> {
        out.iter()
            .map(|r| {
                let to = r.to.as_ref().expect("to");
                let b = to[0].ip_block.as_ref().expect("ip block");
                (
                    b.cidr.clone(),
                    b.except.clone().unwrap_or_default(),
                    ports_of(&r.ports).into_iter().map(|(_, p)| p).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn the_gateway_is_reached_by_its_sandbox_and_reaches_what_the_cidrs_allow() {
        let (policy, _) = rules(
            &["pypi.test"],
            &["10.0.0.0/8", "10.1.0.0/16", "192.0.2.1:443"],
        );
        let ns: Vec<String> = Vec::new();
        let np = gateway_policy(
            &policy,
            &GatewayPolicyParams {
                name: "corral-gw-sb-1-x",
                egress_id: "sb-1",
                sandbox_pod: "corral-sb-1-x",
                lease: "lease-1",
                nameservers: &ns,
            },
        )
        .expect("maps");
        assert_eq!(np.metadata.name.as_deref(), Some("corral-gw-sb-1-x"));
        let spec = np.spec.as_ref().expect("spec");
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        let sel = spec
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("selector");
        assert_eq!(sel[ROLE_LABEL], ROLE_GATEWAY);
        let inbound = spec.ingress.as_ref().expect("ingress");
        assert_eq!(inbound.len(), 1);
        let from = inbound[0].from.as_ref().expect("from");
        assert_eq!(from.len(), 1);
        assert_eq!(peer_labels(&from[0])[ROLE_LABEL], ROLE_SANDBOX);
        assert_eq!(peer_labels(&from[0])[EGRESS_FOR_LABEL], "corral-sb-1-x");
        let out = spec.egress.as_ref().expect("egress");
        // DNS anywhere (the cluster's resolver), then the relay.
        assert!(out[0].to.is_none());
        assert_eq!(
            ports_of(&out[0].ports),
            vec![("UDP".into(), 53), ("TCP".into(), 53)]
        );
        assert_eq!(
            blocks(&out[1..]),
            vec![(
                "0.0.0.0/0".into(),
                vec!["10.0.0.0/8".into(), "169.254.0.0/16".into()],
                vec![80, 443]
            )],
            "link-local and the denied blocks out (10.1/16 is inside 10/8; a deny with a \
             port is the gateway's)"
        );
        // Configured resolvers: DNS to them only.
        let ns = vec!["10.0.0.53".to_string()];
        let np = gateway_policy(
            &policy,
            &GatewayPolicyParams {
                name: "corral-gw-sb-1-x",
                egress_id: "sb-1",
                sandbox_pod: "corral-sb-1-x",
                lease: "lease-1",
                nameservers: &ns,
            },
        )
        .expect("maps");
        let out = np.spec.and_then(|s| s.egress).expect("egress");
        assert_eq!(
            out[0].to.as_ref().expect("to")[0]
                .ip_block
                .as_ref()
                .map(|b| b.cidr.as_str()),
            Some("10.0.0.53/32")
        );
    }

    #[test]
    fn allowed_cidrs_bound_the_relay() {
        let (policy, r) = rules(
            &[
                "pypi.test",
                "192.0.2.0/24",
                "198.51.100.7:8443",
                "169.254.169.254/32:80",
                "203.0.113.0/24",
            ],
            &["192.0.2.128/25", "203.0.113.0/24"],
        );
        let relay = policy.ports();
        assert_eq!(relay, vec![80, 443, 8443]);
        assert_eq!(
            blocks(&upstream_rules(&r, &relay)),
            vec![
                (
                    "192.0.2.0/24".into(),
                    vec!["192.0.2.128/25".into()],
                    vec![80, 443, 8443]
                ),
                ("198.51.100.7/32".into(), vec![], vec![8443]),
                ("169.254.169.254/32".into(), vec![], vec![80]),
            ],
            "203.0.113.0/24 is denied whole"
        );
        // Everything denied: no way out but DNS.
        let (_, r) = rules(&["pypi.test"], &["0.0.0.0/0"]);
        assert!(upstream_rules(&r, &[80, 443]).is_empty());
    }

    #[test]
    fn the_probe_client_is_confined_as_a_sandbox() {
        let pod = probe_client_pod(
            "corral-netpol-1-client",
            "probe-1",
            "corral-netpol-1",
            "lease-1",
            "corral-agent:9",
            Ipv4Addr::new(10, 244, 0, 3),
        );
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l[ROLE_LABEL], ROLE_SANDBOX);
        assert_eq!(l[EGRESS_FOR_LABEL], "corral-netpol-1");
        assert_eq!(l[EGRESS_LABEL], "probe-1");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(
            c.command,
            Some(vec![
                "/corral-agent".into(),
                "netpol-probe".into(),
                "10.244.0.3".into(),
                "443".into(),
                "80".into()
            ])
        );
        assert_eq!(
            c.security_context.as_ref().and_then(|s| s.run_as_non_root),
            Some(true)
        );
        // The policy that confines it allows the listener on 443 only.
        let np = sandbox_policy("probe-1", "corral-netpol-1", "lease-1", &[PROBE_PORTS.0]);
        let out = np.spec.and_then(|s| s.egress).expect("egress");
        assert_eq!(
            ports_of(&out[0].ports),
            vec![("UDP".into(), 53), ("TCP".into(), 443)]
        );
    }

    #[test]
    fn the_probe_says_what_it_saw() {
        assert!(matches!(
            probe_verdict("enforced: 10.0.0.1:80 could not be reached\n"),
            Ok(Enforcement::Enforced(_))
        ));
        assert!(matches!(
            probe_verdict("\nnot-enforced: reached for 5 s\n"),
            Ok(Enforcement::NotEnforced(_))
        ));
        assert_eq!(
            probe_verdict("unreachable: no answer"),
            Err("unreachable: no answer".into())
        );
        assert!(probe_verdict("").is_err());
    }

    #[test]
    fn the_gateways_progress_is_read_from_its_status() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
            ContainerStatus, PodCondition, PodStatus,
        };
        let with = |phase: &str, state: Option<ContainerState>, ip: Option<&str>| Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: ip.map(String::from),
                container_statuses: state.map(|s| {
                    vec![ContainerStatus {
                        name: GATEWAY_CONTAINER.into(),
                        state: Some(s),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Pod::default()
        };
        assert_eq!(
            gateway_progress(&Pod::default(), GATEWAY_CONTAINER),
            GatewayProgress::Pending
        );
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        assert_eq!(
            gateway_progress(
                &with("Running", Some(running.clone()), Some("10.244.0.7")),
                GATEWAY_CONTAINER
            ),
            GatewayProgress::Running(Ipv4Addr::new(10, 244, 0, 7))
        );
        assert_eq!(
            gateway_progress(&with("Running", Some(running), None), GATEWAY_CONTAINER),
            GatewayProgress::Pending,
            "no address yet"
        );
        let waiting = |reason: &str| ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some("m".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            gateway_progress(
                &with("Pending", Some(waiting("ImagePullBackOff")), None),
                GATEWAY_CONTAINER
            ),
            GatewayProgress::Image("ImagePullBackOff".into(), "m".into())
        );
        assert!(matches!(
            gateway_progress(&with("Running", Some(waiting("CrashLoopBackOff")), None), GATEWAY_CONTAINER),
            GatewayProgress::Failed(m) if m.starts_with("CrashLoopBackOff")
        ));
        assert_eq!(
            gateway_progress(
                &with("Pending", Some(waiting("ContainerCreating")), None),
                GATEWAY_CONTAINER
            ),
            GatewayProgress::Pending
        );
        let exited = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                message: Some("cannot listen on port 80".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(
            gateway_progress(&with("Running", Some(exited), None), GATEWAY_CONTAINER),
            GatewayProgress::Failed(m) if m.contains("cannot listen on port 80")
        ));
        let mut forbidden = with("Failed", None, None);
        if let Some(s) = forbidden.status.as_mut() {
            s.reason = Some("SysctlForbidden".into());
        }
        assert!(matches!(
            gateway_progress(&forbidden, GATEWAY_CONTAINER),
            GatewayProgress::Failed(m) if m.starts_with("SysctlForbidden")
        ));
        let mut full = with("Pending", None, None);
        if let Some(s) = full.status.as_mut() {
            s.conditions = Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes".into()),
                ..Default::default()
            }]);
        }
        assert_eq!(
            gateway_progress(&full, GATEWAY_CONTAINER),
            GatewayProgress::Unschedulable("0/3 nodes".into())
        );
    }

    #[test]
    fn orphans_are_judged_by_their_sandbox_pod_then_owner_and_age() {
        assert!(
            !is_orphan(true, false, 10_000, 60),
            "its sandbox pod is there"
        );
        assert!(is_orphan(false, false, 0, 60), "owner gone");
        assert!(!is_orphan(false, true, 30, 60), "being made");
        assert!(
            is_orphan(false, true, 61, 60),
            "left behind by a live owner"
        );
    }
}
