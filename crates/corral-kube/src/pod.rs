//! Turns a validated [`SandboxSpec`] into the pod that runs it, and the
//! namespace's network policies that isolate sandboxes.
//!
//! Pure: no API calls, so every field of the mapping is unit-tested here.
//! What a pod cannot express (a per-pod pids limit is a node setting, a
//! host bind mount reaches a host the pod is not on, a name for a user) is
//! an [`Error::Unsupported`] naming the field and its value, never dropped.

use std::collections::{BTreeMap, HashMap};

use corral_core::agent_auth::{self, Secret};
use corral_core::labels;
use corral_core::protocol::{AGENT_DIR, AGENT_PATH};
use corral_core::spec::PRISTINE_AGENT_CAPS;
use corral_core::{Error, Isolation, Network, SandboxSpec};
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, Pod,
    PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

/// The pod's container that runs the sandbox (its PID 1 is the agent).
pub const SANDBOX_CONTAINER: &str = "sandbox";
/// The init container that copies the agent into the pod.
pub const AGENT_INIT_CONTAINER: &str = "corral-agent";
/// The `emptyDir` volume holding the agent binary.
pub const AGENT_VOLUME: &str = "corral-agent";
/// Label of pods with `network: none`; the egress policy selects it.
pub const NETWORK_LABEL: &str = "corral.network";
/// Name stem of the policy that denies every sandbox all inbound traffic
/// but the controller's.
pub const INGRESS_POLICY: &str = "corral-sandbox-ingress";
/// The label (and value) of corral's own pods, which the ingress policy
/// lets reach sandboxes (a sandbox may not carry it).
pub const CONTROLLER_LABEL: (&str, &str) = ("app.kubernetes.io/name", "corral");
/// The name of the agent's container port.
pub const AGENT_PORT_NAME: &str = "corral-agent";
/// Name stem of the policy that denies `network: none` sandboxes all
/// outbound traffic.
pub const EGRESS_POLICY: &str = "corral-network-none-deny-egress";
/// The uid the init container copies the agent as (nobody).
const INIT_UID: i64 = 65534;

/// Everything besides the spec that goes into a pod.
#[derive(Debug, Clone)]
pub struct PodParams<'a> {
    /// The sandbox id (label value).
    pub sandbox_id: &'a str,
    /// The pod's name ([`pod_name`]).
    pub name: &'a str,
    /// The runtime's labels: sandbox id, owner, and for a persistent
    /// sandbox its session, spec digest and seal.
    pub labels: &'a HashMap<String, String>,
    /// The image holding the static agent at `/corral-agent`.
    pub agent_image: &'a str,
    /// The port the agent listens on for corral.
    pub agent_port: u16,
    /// The sandbox's secret, which a connection to the agent must prove.
    pub secret: &'a Secret,
    /// Why pods of this namespace cannot hold what in-place reset needs
    /// (its Pod Security level, an admission refusal): a spec that asks
    /// for it gets a pod without the agent's extra capabilities, whose
    /// agent tells the runtime this reason. `None`: they may.
    pub pristine_refused: Option<&'a str>,
    /// The AppArmor profile of a container whose agent may reset in place
    /// (`kubernetes.pristine_apparmor_profile`: `unconfined` or
    /// `localhost/NAME`); `None`: the runtime's default.
    pub pristine_apparmor: Option<&'a str>,
    /// The RuntimeClass of an `isolation: gvisor` spec
    /// (`kubernetes.runtime_class`).
    pub gvisor_runtime_class: &'a str,
}

fn unsupported(field: &str, value: impl std::fmt::Display, why: &str) -> Error {
    Error::Unsupported {
        what: format!("{field} '{value}' on Kubernetes: {why}"),
    }
}

/// An RFC 1123 label: at most 63 lowercase letters, digits and '-',
/// starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&name.len())
        && name.chars().all(|c| ok(c) || c == '-')
        && name.starts_with(ok)
        && name.ends_with(ok)
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// A label value: empty, or at most 63 alphanumerics, '-', '_' and '.',
/// starting and ending with an alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    value.is_empty()
        || (value.len() <= 63
            && value.chars().all(|c| ok(c) || matches!(c, '-' | '_' | '.'))
            && value.starts_with(ok)
            && value.ends_with(ok))
}

/// A label key: an optional DNS-subdomain prefix and '/', then a name
/// that follows the rules of a non-empty label value.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// The pod name of one placement of a sandbox: `corral-<id>-<suffix>`. A
/// fresh suffix per create lets a recreated sandbox start while its old
/// pod is still terminating.
pub fn pod_name(sandbox_id: &str, suffix: &str) -> Result<String, Error> {
    let name = format!("corral-{sandbox_id}-{suffix}");
    if !is_dns_label(&name) {
        return Err(unsupported(
            "sandbox id",
            sandbox_id,
            "a pod name must be an RFC 1123 label (lowercase letters, digits, '-', at most 63)",
        ));
    }
    Ok(name)
}

/// `uid` or `uid:gid` as the pod's numeric ids.
fn parse_user(user: &str) -> Result<(i64, Option<i64>), Error> {
    let numeric = |s: &str| s.parse::<i64>().ok().filter(|n| *n >= 0);
    let parsed = match user.split_once(':') {
        Some((u, g)) => numeric(u).zip(numeric(g)).map(|(u, g)| (u, Some(g))),
        None => numeric(user).map(|u| (u, None)),
    };
    parsed.ok_or_else(|| {
        unsupported(
            "security.user",
            user,
            "a pod runs as numeric ids only (uid or uid:gid), not a name the image knows",
        )
    })
}

/// Labels or annotations.
type Map = BTreeMap<String, String>;

/// The labels and annotations of a sandbox's pod: the spec's labels and
/// the runtime's selectable ones as labels; every runtime label (the seal
/// and the session key do not fit a label value) as an annotation, so
/// nothing is lost and [`labels_of`] reads them back whole.
fn metadata_maps(spec: &SandboxSpec, p: &PodParams<'_>) -> Result<(Map, Map), Error> {
    let mut pod_labels = BTreeMap::new();
    for (key, value) in &spec.labels {
        let field = format!("labels.{key}");
        if !is_label_key(key) {
            return Err(unsupported(
                &field,
                key,
                "not a Kubernetes label key (optional DNS prefix and '/', then at most 63 \
                 alphanumerics, '-', '_' and '.')",
            ));
        }
        if !is_label_value(value) {
            return Err(unsupported(
                &field,
                value,
                "not a Kubernetes label value (at most 63 alphanumerics, '-', '_' and '.', \
                 starting and ending with an alphanumeric)",
            ));
        }
        if (key.as_str(), value.as_str()) == CONTROLLER_LABEL {
            return Err(unsupported(
                &field,
                value,
                "the label of corral's own pods, which the ingress policy lets reach every \
                 sandbox's ports: a sandbox may not carry it",
            ));
        }
        pod_labels.insert(key.clone(), value.clone());
    }
    let mut ours: BTreeMap<String, String> = p
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ours.insert(labels::SANDBOX.into(), p.sandbox_id.into());
    ours.insert(labels::VERSION.into(), env!("CARGO_PKG_VERSION").into());
    if !is_label_value(p.sandbox_id) {
        return Err(unsupported(
            "sandbox id",
            p.sandbox_id,
            "not a Kubernetes label value",
        ));
    }
    for (k, v) in &ours {
        if is_label_value(v) {
            pod_labels.insert(k.clone(), v.clone());
        }
    }
    if spec.network == Network::None {
        pod_labels.insert(NETWORK_LABEL.into(), "none".into());
    }
    if let Network::Egress(policy) = &spec.network {
        return Err(unsupported(
            "network.egress",
            policy.allow.join(","),
            "a sandbox with an egress policy needs its gateway: its pod is made by \
             egress::sandbox_pod, never by pod::pod alone",
        ));
    }
    Ok((pod_labels, ours))
}

/// The labels corral put on a pod, as the runtime gave them: its
/// annotations under `corral.`, then its labels.
pub fn labels_of(meta: &ObjectMeta) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = meta
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if let Some(annotations) = &meta.annotations {
        for (k, v) in annotations {
            if k.starts_with(labels::PREFIX) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// The millicores of a CPU count, as a quantity (`1500m`).
fn cpu_quantity(cpus: f64) -> Quantity {
    Quantity(format!("{}m", (cpus * 1000.0).round().max(1.0) as u64))
}

/// What of `spec` a pod cannot express, each naming the field and value:
/// all of it at once, so a spec (the hardened default has a pids limit and
/// tmpfs options) is fixed in one go rather than one refusal at a time.
pub fn inexpressible(spec: &SandboxSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut say = |field: &str, value: &dyn std::fmt::Display, why: &str| {
        out.push(format!("{field} '{value}' on Kubernetes: {why}"));
    };
    for (i, m) in spec.mounts.iter().enumerate() {
        say(
            &format!("mounts[{i}].host"),
            &m.host,
            "a pod cannot bind-mount a directory of corral's host; move files in with the \
             file commands instead",
        );
    }
    if let Some(pids) = spec.limits.pids {
        say(
            "limits.pids",
            &pids,
            "a pids limit is a node setting (the kubelet's podPidsLimit), not a pod's; set \
             limits.pids to null",
        );
    }
    for (i, t) in spec.tmpfs.iter().enumerate() {
        if !t.options.trim().is_empty() {
            say(
                &format!("tmpfs[{i}].options"),
                &t.options,
                "a memory-backed emptyDir takes no mount options (noexec, nosuid, nodev); \
                 set options to ''",
            );
        }
    }
    out
}

/// The pod for `spec`.
pub fn pod(spec: &SandboxSpec, p: &PodParams<'_>) -> Result<Pod, Error> {
    let refused = inexpressible(spec);
    if !refused.is_empty() {
        return Err(Error::Unsupported {
            what: refused.join("; "),
        });
    }
    if let Some(runtime) = &spec.runtime {
        if !is_dns_subdomain(runtime) {
            return Err(unsupported(
                "runtime",
                runtime,
                "a RuntimeClass name is an RFC 1123 subdomain (lowercase)",
            ));
        }
    }
    let sec = &spec.security;
    let (run_as_user, run_as_group) = match &sec.user {
        Some(user) => {
            let (u, g) = parse_user(user)?;
            (Some(u), g)
        }
        None => (None, None),
    };
    let (pod_labels, annotations) = metadata_maps(spec, p)?;

    let mut volumes = vec![Volume {
        name: AGENT_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: AGENT_VOLUME.into(),
        mount_path: AGENT_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    for (i, t) in spec.tmpfs.iter().enumerate() {
        let name = format!("tmpfs-{i}");
        volumes.push(Volume {
            name: name.clone(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(t.size.to_string())),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name,
            mount_path: t.path.clone(),
            ..Default::default()
        });
    }

    let mut limits = BTreeMap::new();
    if let Some(memory) = spec.limits.memory {
        limits.insert("memory".to_string(), Quantity(memory.to_string()));
    }
    if let Some(cpus) = spec.limits.cpus {
        limits.insert("cpu".to_string(), cpu_quantity(cpus));
    }
    if let Some(disk) = spec.limits.disk {
        limits.insert("ephemeral-storage".to_string(), Quantity(disk.to_string()));
    }

    // In-place reset as on Docker: the agent alone holds three capabilities
    // more (commands drop them and the agent's seccomp filter refuses what
    // they would open), unless the namespace forbids them.
    let pristine = spec.in_place_reset().is_ok();
    let granted = pristine && p.pristine_refused.is_none();
    let capabilities = sec.drop_all_caps.then(|| {
        // Commands' and the agent's own, which commands drop (`--agent-caps`).
        let mut add = sec.container_caps();
        if granted {
            add.extend(PRISTINE_AGENT_CAPS.iter().map(|c| c.to_string()));
            add.sort();
            add.dedup();
        }
        Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: Some(add),
        }
    });
    let mut command = vec![
        AGENT_PATH.to_string(),
        "init".to_string(),
        "--grace-ms".to_string(),
        spec.effective_grace_ms().to_string(),
    ];
    let own = sec.agent_only_caps();
    if !own.is_empty() {
        command.extend(["--agent-caps".to_string(), own.join(",")]);
    }
    match p.pristine_refused {
        _ if !pristine => {}
        None => {
            command.push("--pristine".to_string());
            if let Some(size) = spec.pristine_state_size() {
                command.extend(["--pristine-size".to_string(), size.to_string()]);
            }
        }
        Some(reason) => command.extend(["--pristine-refused".to_string(), reason.to_string()]),
    }
    let sandbox = Container {
        name: SANDBOX_CONTAINER.into(),
        image: Some(spec.image.clone()),
        // A start must not wait on a registry for an image the node holds
        // (Kubernetes' default for `:latest` is to ask every time), as on
        // Docker; a changed image needs a new tag.
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(command),
        args: Some(Vec::new()),
        // Only the agent's own variables, which PID 1 takes out of the
        // environment commands get. The spec's environment reaches the agent
        // at each handshake, so whoever may read pods does not read its
        // values here.
        env: Some(
            [
                (agent_auth::LISTEN_ENV.to_string(), p.agent_port.to_string()),
                (agent_auth::SECRET_ENV.to_string(), p.secret.to_hex()),
            ]
            .into_iter()
            .map(|(name, value)| EnvVar {
                name,
                value: Some(value),
                ..Default::default()
            })
            .collect(),
        ),
        working_dir: spec.workdir.clone(),
        ports: Some(vec![ContainerPort {
            name: Some(AGENT_PORT_NAME.into()),
            container_port: i32::from(p.agent_port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // The control stream is a TCP connection, not PID 1's stdin.
        stdin: Some(false),
        tty: Some(false),
        resources: Some(ResourceRequirements {
            limits: (!limits.is_empty()).then_some(limits),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            capabilities,
            allow_privilege_escalation: Some(!sec.no_new_privileges),
            read_only_root_filesystem: Some(sec.read_only_root),
            run_as_user,
            run_as_group,
            privileged: Some(false),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            // The runtime's default AppArmor profile denies mount: an
            // operator may name one that lets the agent build its worlds.
            app_armor_profile: p
                .pristine_apparmor
                .filter(|_| granted)
                .map(apparmor_profile),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut init = agent_container(p.agent_image, &["/corral-agent", "install", AGENT_DIR]);
    init.volume_mounts = Some(vec![VolumeMount {
        name: AGENT_VOLUME.into(),
        mount_path: AGENT_DIR.into(),
        ..Default::default()
    }]);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(p.name.to_string()),
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![init]),
            containers: vec![sandbox],
            volumes: Some(volumes),
            // A dead PID 1 stays dead: its terminated state tells an OOM.
            restart_policy: Some("Never".into()),
            // Commands in a sandbox must never hold an API credential.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            runtime_class_name: match spec.isolation {
                Isolation::Container => spec.runtime.clone(),
                Isolation::Gvisor => Some(p.gvisor_runtime_class.to_string()),
            },
            // The agent never stops on SIGTERM; the kubelet's SIGKILL
            // ends the sandbox this long after a delete (Docker's stop
            // timeout).
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        }),
        status: None,
    })
}

/// `unconfined` or `localhost/NAME` (validated by the config) as a
/// container's AppArmor profile.
fn apparmor_profile(profile: &str) -> AppArmorProfile {
    match profile.strip_prefix("localhost/") {
        Some(name) => AppArmorProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(name.to_string()),
        },
        None => AppArmorProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        },
    }
}

/// A policy's name: `base` and a digest of its spec. Another version of
/// corral, or another `agent_port` or `controller_cidrs`, makes policies of
/// its own beside these instead of finding a name taken by another spec;
/// policies only ever add allowances, so those of an older spec left in
/// the namespace widen nothing.
fn policy_name(base: &str, spec: &NetworkPolicySpec) -> String {
    use sha2::{Digest, Sha256};
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{base}-{hex}")
}

/// A container running `command` from the agent's image as the init
/// container does: as nobody, every capability dropped, read-only, small
/// limits (the sandbox's init container; `doctor`'s version check).
pub fn agent_container(agent_image: &str, command: &[&str]) -> Container {
    Container {
        name: AGENT_INIT_CONTAINER.into(),
        image: Some(agent_image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(command.iter().map(|c| c.to_string()).collect()),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("250m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_user: Some(INIT_UID),
            run_as_group: Some(INIT_UID),
            run_as_non_root: Some(true),
            privileged: Some(false),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The namespace's two policies: no sandbox accepts inbound connections
/// (Docker's bridge without inter-container traffic) but corral's own
/// (from its pods, labelled [`CONTROLLER_LABEL`], or from
/// `controller_cidrs`): to the agent port, and to servers in the sandbox
/// (`Backend::open_port`, as the Docker host reaches its containers);
/// and a `network: none` sandbox sends nothing out. Enforced only where
/// the cluster's network plugin enforces policies; the agent's handshake
/// holds either way.
pub fn network_policies(controller_cidrs: &[String]) -> [NetworkPolicy; 2] {
    let policy = |base: &str,
                  selector: LabelSelector,
                  types: &[&str],
                  ingress: Option<Vec<NetworkPolicyIngressRule>>| {
        let spec = NetworkPolicySpec {
            pod_selector: Some(selector),
            policy_types: Some(types.iter().map(|t| t.to_string()).collect()),
            // No egress rules: nothing goes out where Egress is a type.
            ingress,
            egress: None,
        };
        NetworkPolicy {
            metadata: ObjectMeta {
                name: Some(policy_name(base, &spec)),
                labels: Some(BTreeMap::from([(
                    labels::VERSION.to_string(),
                    env!("CARGO_PKG_VERSION").to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(spec),
        }
    };
    let mut from = vec![NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                CONTROLLER_LABEL.0.to_string(),
                CONTROLLER_LABEL.1.to_string(),
            )])),
            match_expressions: None,
        }),
        ..Default::default()
    }];
    from.extend(controller_cidrs.iter().map(|cidr| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.clone(),
            except: None,
        }),
        ..Default::default()
    }));
    let controller = NetworkPolicyIngressRule {
        from: Some(from),
        // Every port: the agent's and the servers' a user opens.
        ports: None,
    };
    [
        policy(
            INGRESS_POLICY,
            LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: labels::SANDBOX.into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
                match_labels: None,
            },
            &["Ingress"],
            Some(vec![controller]),
        ),
        // Policies add up: the controller's rule above still lets corral
        // in; this one adds no inbound allowance and denies all outbound.
        policy(
            EGRESS_POLICY,
            LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    NETWORK_LABEL.to_string(),
                    "none".to_string(),
                )])),
                match_expressions: None,
            },
            &["Egress"],
            None,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::{Mount, Tmpfs};

    /// A spec that maps: the hardened default less what pods cannot do.
    fn kube_spec() -> SandboxSpec {
        let mut spec = SandboxSpec::new("busybox:1");
        spec.limits.pids = None;
        for t in &mut spec.tmpfs {
            t.options.clear();
        }
        spec
    }

    fn run(spec: &SandboxSpec) -> Result<Pod, Error> {
        run_refused(spec, None)
    }

    fn run_refused(spec: &SandboxSpec, pristine_refused: Option<&str>) -> Result<Pod, Error> {
        run_with(spec, pristine_refused, None)
    }

    fn run_with(
        spec: &SandboxSpec,
        pristine_refused: Option<&str>,
        pristine_apparmor: Option<&str>,
    ) -> Result<Pod, Error> {
        let labels = HashMap::from([
            (labels::SANDBOX.to_string(), "sb-1".to_string()),
            (labels::OWNER_HOST.to_string(), "node-a".to_string()),
            (labels::SEAL.to_string(), "ab".repeat(32)),
        ]);
        pod(
            spec,
            &PodParams {
                sandbox_id: "sb-1",
                name: "corral-sb-1-x",
                labels: &labels,
                agent_image: "corral-agent:9",
                agent_port: 7150,
                secret: &Secret::new([0xa5; 32]),
                pristine_refused,
                pristine_apparmor,
                gvisor_runtime_class: "sandboxed",
            },
        )
    }

    fn sandbox(pod: &Pod) -> &Container {
        &pod.spec.as_ref().expect("spec").containers[0]
    }

    fn sec(pod: &Pod) -> &SecurityContext {
        sandbox(pod)
            .security_context
            .as_ref()
            .expect("security context")
    }

    fn unsupported_text(spec: &SandboxSpec) -> String {
        match run(spec) {
            Err(e @ Error::Unsupported { .. }) => e.to_string(),
            other => panic!("expected unsupported, got {other:?}"),
        }
    }

    #[test]
    fn an_egress_policy_is_refused_not_ignored() {
        let mut spec = kube_spec();
        spec.network = Network::Egress(corral_core::egress::EgressPolicy {
            allow: vec!["pypi.org".into()],
            deny: vec![],
        });
        let text = unsupported_text(&spec);
        assert!(text.contains("network.egress 'pypi.org'"), "{text}");
    }

    #[test]
    fn hardening_maps_onto_the_security_context() {
        let pod = run(&kube_spec()).expect("maps");
        let s = sec(&pod);
        let caps = s.capabilities.as_ref().expect("caps");
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
        // The commands' three and the agent's own four (`--agent-caps`).
        assert_eq!(
            caps.add,
            Some(
                [
                    "CHOWN",
                    "DAC_OVERRIDE",
                    "FOWNER",
                    "KILL",
                    "SETGID",
                    "SETPCAP",
                    "SETUID"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(s.allow_privilege_escalation, Some(false));
        assert_eq!(s.read_only_root_filesystem, Some(false));
        assert_eq!(s.privileged, Some(false));
        assert_eq!(s.run_as_user, None);
        assert_eq!(
            s.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.runtime_class_name, None);

        let mut s2 = kube_spec();
        s2.security.setuid_caps = true;
        s2.security.cap_add = vec!["cap_net_raw".into()];
        s2.security.no_new_privileges = false;
        s2.security.read_only_root = true;
        s2.security.user = Some("1000:2000".into());
        let pod = run(&s2).expect("maps");
        let s = sec(&pod);
        // The agent keeps KILL (and SETPCAP to take it from commands).
        assert_eq!(
            s.capabilities.as_ref().and_then(|c| c.add.clone()),
            Some(vec![
                "KILL".into(),
                "NET_RAW".into(),
                "SETGID".into(),
                "SETPCAP".into(),
                "SETUID".into()
            ])
        );
        let command = sandbox(&pod).command.clone().unwrap_or_default();
        assert_eq!(
            command[command.len() - 2..],
            ["--agent-caps", "KILL,SETPCAP"]
        );
        assert_eq!(s.allow_privilege_escalation, Some(true));
        assert_eq!(s.read_only_root_filesystem, Some(true));
        assert_eq!((s.run_as_user, s.run_as_group), (Some(1000), Some(2000)));

        let mut s3 = kube_spec();
        s3.security.drop_all_caps = false;
        s3.security.user = Some("1000".into());
        let pod = run(&s3).expect("maps");
        assert_eq!(sec(&pod).capabilities, None, "the runtime's default set");
        assert_eq!(
            (sec(&pod).run_as_user, sec(&pod).run_as_group),
            (Some(1000), None)
        );
    }

    #[test]
    fn a_pristine_spec_gives_its_agent_the_reset_capabilities() {
        let mut spec = kube_spec();
        spec.pristine = true;
        spec.limits.memory = Some(64 << 20);
        let pod = run(&spec).expect("maps");
        let add = sec(&pod)
            .capabilities
            .as_ref()
            .and_then(|c| c.add.clone())
            .expect("caps");
        for cap in PRISTINE_AGENT_CAPS {
            assert!(add.iter().any(|c| c == cap), "{cap} missing: {add:?}");
        }
        assert!(add.windows(2).all(|w| w[0] < w[1]), "sorted once: {add:?}");
        // Without the prefix: Kubernetes refuses `CAP_SYS_ADMIN` beside
        // allowPrivilegeEscalation false, and the runtime adds it.
        assert!(add.iter().all(|c| !c.starts_with("CAP_")), "{add:?}");
        assert_eq!(sec(&pod).allow_privilege_escalation, Some(false));
        assert_eq!(sec(&pod).privileged, Some(false));
        let command = sandbox(&pod).command.clone().unwrap_or_default();
        assert_eq!(
            command[command.len() - 3..],
            ["--pristine", "--pristine-size", "67108864"]
        );

        // Refused by the namespace: no extra capability, and the agent
        // says why at the handshake.
        let why = "namespace ns enforces Pod Security 'baseline'";
        let pod = run_refused(&spec, Some(why)).expect("maps");
        let add = sec(&pod)
            .capabilities
            .as_ref()
            .and_then(|c| c.add.clone())
            .expect("caps");
        assert_eq!(
            add,
            vec![
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "KILL",
                "SETGID",
                "SETPCAP",
                "SETUID"
            ]
        );
        let command = sandbox(&pod).command.clone().unwrap_or_default();
        assert_eq!(command[command.len() - 2..], ["--pristine-refused", why]);
        assert!(!command.contains(&"--pristine".to_string()));

        // The runtime's AppArmor profile unless the operator names one,
        // and only for a pod whose agent may reset in place.
        assert_eq!(sec(&run(&spec).expect("maps")).app_armor_profile, None);
        let local = run_with(&spec, None, Some("localhost/corral-pristine")).expect("maps");
        assert_eq!(
            sec(&local).app_armor_profile,
            Some(AppArmorProfile {
                type_: "Localhost".into(),
                localhost_profile: Some("corral-pristine".into()),
            })
        );
        let open = run_with(&spec, None, Some("unconfined")).expect("maps");
        assert_eq!(
            sec(&open)
                .app_armor_profile
                .as_ref()
                .map(|p| p.type_.as_str()),
            Some("Unconfined")
        );
        for (s, refused) in [(kube_spec(), None), (spec.clone(), Some(why))] {
            let pod = run_with(&s, refused, Some("unconfined")).expect("maps");
            assert_eq!(sec(&pod).app_armor_profile, None, "{refused:?}");
        }

        // A spec that cannot reset in place, or does not ask: neither.
        spec.security.read_only_root = true;
        for s in [spec.clone(), kube_spec()] {
            for refused in [None, Some(why)] {
                let pod = run_refused(&s, refused).expect("maps");
                let command = sandbox(&pod).command.clone().unwrap_or_default();
                assert!(
                    command.iter().all(|a| !a.starts_with("--pristine")),
                    "{command:?}"
                );
                let add = sec(&pod).capabilities.as_ref().and_then(|c| c.add.clone());
                assert!(
                    add.is_some_and(|a| !a.contains(&"SYS_ADMIN".to_string())),
                    "{pod:?}"
                );
            }
        }
    }

    #[test]
    fn limits_map_onto_resources() {
        let mut spec = kube_spec();
        spec.limits.memory = Some(64 << 20);
        spec.limits.cpus = Some(1.5);
        spec.limits.disk = Some(1 << 30);
        let pod = run(&spec).expect("maps");
        let limits = sandbox(&pod)
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits["memory"], Quantity("67108864".into()));
        assert_eq!(limits["cpu"], Quantity("1500m".into()));
        assert_eq!(limits["ephemeral-storage"], Quantity("1073741824".into()));

        spec.limits = corral_core::Limits {
            memory: None,
            cpus: Some(0.0001),
            pids: None,
            disk: None,
        };
        let pod = run(&spec).expect("maps");
        let limits = sandbox(&pod)
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits.len(), 1);
        assert_eq!(limits["cpu"], Quantity("1m".into()), "never zero");
        spec.limits.cpus = None;
        let pod = run(&spec).expect("maps");
        assert_eq!(
            sandbox(&pod)
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone()),
            None
        );
    }

    #[test]
    fn tmpfs_maps_onto_memory_empty_dirs() {
        let mut spec = kube_spec();
        spec.tmpfs = vec![Tmpfs {
            path: "/scratch".into(),
            size: 1 << 20,
            options: String::new(),
        }];
        let pod = run(&spec).expect("maps");
        let vols = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .expect("volumes");
        let dir = vols[1].empty_dir.as_ref().expect("emptyDir");
        assert_eq!(dir.medium.as_deref(), Some("Memory"));
        assert_eq!(dir.size_limit, Some(Quantity("1048576".into())));
        let mounts = sandbox(&pod).volume_mounts.clone().expect("mounts");
        assert_eq!(mounts[1].name, vols[1].name);
        assert_eq!(mounts[1].mount_path, "/scratch");
        assert_ne!(mounts[1].read_only, Some(true));
    }

    #[test]
    fn the_agent_comes_from_an_init_container_read_only() {
        let mut spec = kube_spec();
        // The spec's environment reaches the agent at the handshake: the
        // pod (which whoever may read pods reads) holds none of its values.
        spec.env = vec![corral_core::EnvVar::Set {
            name: "API_KEY".into(),
            value: "sk-in-spec".into(),
        }];
        let pod = run(&spec).expect("maps");
        let json = serde_json::to_string(&pod).expect("serializes");
        assert!(!json.contains("sk-in-spec"), "{json}");
        let spec = pod.spec.as_ref().expect("spec");
        let init = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(init.image.as_deref(), Some("corral-agent:9"));
        assert_eq!(
            init.command,
            Some(vec![
                "/corral-agent".into(),
                "install".into(),
                AGENT_DIR.into()
            ])
        );
        let init_mount = &init.volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(
            (init_mount.name.as_str(), init_mount.mount_path.as_str()),
            (AGENT_VOLUME, AGENT_DIR)
        );
        let isec = init.security_context.as_ref().expect("init sec");
        assert_eq!(isec.run_as_non_root, Some(true));
        assert_eq!(isec.allow_privilege_escalation, Some(false));

        let c = sandbox(&pod);
        assert_eq!(c.name, SANDBOX_CONTAINER);
        assert_eq!(c.image.as_deref(), Some("busybox:1"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.command,
            Some(vec![
                AGENT_PATH.into(),
                "init".into(),
                "--grace-ms".into(),
                "30000".into(),
                "--agent-caps".into(),
                "KILL,SETGID,SETPCAP,SETUID".into()
            ])
        );
        assert_eq!((c.stdin, c.tty), (Some(false), Some(false)));
        let port = &c.ports.as_ref().expect("ports")[0];
        assert_eq!(
            (port.container_port, port.name.as_deref()),
            (7150, Some(AGENT_PORT_NAME))
        );
        let m = &c.volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (AGENT_DIR, Some(true))
        );
        let env: Vec<(String, String)> = c
            .env
            .as_ref()
            .expect("env")
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            env,
            vec![
                (agent_auth::LISTEN_ENV.to_string(), "7150".to_string()),
                (agent_auth::SECRET_ENV.to_string(), "a5".repeat(32)),
            ]
        );
    }

    #[test]
    fn labels_and_owner_map_onto_labels_and_annotations() {
        let mut spec = kube_spec();
        spec.labels.insert("team".into(), "rl".into());
        spec.labels.insert("example.com/run".into(), "r-7".into());
        let pod = run(&spec).expect("maps");
        let meta = &pod.metadata;
        let l = meta.labels.as_ref().expect("labels");
        assert_eq!(l["team"], "rl");
        assert_eq!(l["example.com/run"], "r-7");
        assert_eq!(l[labels::SANDBOX], "sb-1");
        assert_eq!(l[labels::OWNER_HOST], "node-a");
        assert!(
            !l.contains_key(labels::SEAL),
            "64 characters: not a label value"
        );
        assert!(!l.contains_key(NETWORK_LABEL));
        let a = meta.annotations.as_ref().expect("annotations");
        assert_eq!(a[labels::SEAL], "ab".repeat(32));
        assert_eq!(a[labels::SANDBOX], "sb-1");
        let back = labels_of(meta);
        assert_eq!(back[labels::SEAL], "ab".repeat(32));
        assert_eq!(back["team"], "rl");

        spec.labels.insert("bad key!".into(), "x".into());
        assert!(unsupported_text(&spec).contains("labels.bad key!"));
        spec.labels.remove("bad key!");
        spec.labels
            .insert(CONTROLLER_LABEL.0.into(), CONTROLLER_LABEL.1.into());
        let text = unsupported_text(&spec);
        assert!(
            text.contains("labels.app.kubernetes.io/name 'corral'"),
            "{text}"
        );
        spec.labels.remove(CONTROLLER_LABEL.0);
        spec.labels.insert("ok".into(), "no spaces please".into());
        let text = unsupported_text(&spec);
        assert!(
            text.contains("labels.ok") && text.contains("no spaces please"),
            "{text}"
        );
    }

    #[test]
    fn network_none_is_selected_by_the_egress_policy() {
        let mut spec = kube_spec();
        spec.network = Network::None;
        let pod = run(&spec).expect("maps");
        assert_eq!(
            pod.metadata.labels.as_ref().expect("labels")[NETWORK_LABEL],
            "none"
        );
        let [ingress, egress] = network_policies(&["10.0.0.0/8".to_string()]);
        // Named by stem and spec: stable for one spec, new for another.
        let name = |p: &NetworkPolicy| p.metadata.name.clone().expect("name");
        assert!(name(&ingress).starts_with(&format!("{INGRESS_POLICY}-")));
        assert!(name(&egress).starts_with(&format!("{EGRESS_POLICY}-")));
        assert!(is_dns_label(&name(&ingress)) && is_dns_label(&name(&egress)));
        let [again, _] = network_policies(&["10.0.0.0/8".to_string()]);
        assert_eq!(name(&again), name(&ingress));
        let [other_cidrs, same_egress] = network_policies(&["10.1.0.0/16".to_string()]);
        assert_ne!(name(&other_cidrs), name(&ingress));
        assert_eq!(name(&same_egress), name(&egress));
        let sel = |p: &NetworkPolicy| {
            p.spec
                .as_ref()
                .and_then(|s| s.pod_selector.clone())
                .expect("selector")
        };
        let types = |p: &NetworkPolicy| {
            p.spec
                .as_ref()
                .and_then(|s| s.policy_types.clone())
                .expect("types")
        };
        assert_eq!(types(&ingress), vec!["Ingress".to_string()]);
        assert_eq!(
            sel(&ingress).match_expressions.expect("exprs")[0].key,
            labels::SANDBOX
        );
        assert_eq!(types(&egress), vec!["Egress".to_string()]);
        assert_eq!(
            sel(&egress).match_labels.expect("labels")[NETWORK_LABEL],
            "none"
        );
        // Inbound: only corral (to the agent and to servers it opens).
        let rules = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress.clone())
            .expect("one ingress rule");
        assert_eq!(rules.len(), 1);
        let from = rules[0].from.clone().expect("from");
        assert_eq!(
            from[0]
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone())
                .expect("controller selector")[CONTROLLER_LABEL.0],
            CONTROLLER_LABEL.1
        );
        assert_eq!(
            from[1].ip_block.as_ref().map(|b| b.cidr.as_str()),
            Some("10.0.0.0/8")
        );
        assert!(from[0].namespace_selector.is_none() && from[1].pod_selector.is_none());
        assert_eq!(rules[0].ports, None, "every port, for corral alone");
        // Outbound of network: none: nothing.
        let e = egress.spec.as_ref().expect("spec");
        assert!(e.egress.is_none() && e.ingress.is_none());
    }

    #[test]
    fn runtime_maps_onto_the_runtime_class() {
        let mut spec = kube_spec();
        spec.runtime = Some("gvisor".into());
        let pod = run(&spec).expect("maps");
        assert_eq!(
            pod.spec
                .as_ref()
                .and_then(|s| s.runtime_class_name.clone())
                .as_deref(),
            Some("gvisor")
        );
        spec.runtime = Some("Kata_QEMU".into());
        assert!(unsupported_text(&spec).contains("runtime 'Kata_QEMU'"));
    }

    #[test]
    fn gvisor_isolation_maps_onto_the_configured_runtime_class() {
        let class = |spec: &SandboxSpec| {
            run(spec)
                .expect("maps")
                .spec
                .and_then(|s| s.runtime_class_name)
        };
        let mut spec = kube_spec();
        assert_eq!(class(&spec), None);
        spec.isolation = Isolation::Gvisor;
        assert_eq!(class(&spec).as_deref(), Some("sandboxed"));
    }

    #[test]
    fn what_cannot_map_is_refused_by_name() {
        // The hardened default: every field at once.
        let text = unsupported_text(&SandboxSpec::new("busybox:1"));
        assert!(text.contains("limits.pids '256'"), "{text}");
        assert!(text.contains("tmpfs[0].options 'nosuid,nodev'"), "{text}");
        assert!(text.contains("tmpfs[2].options"), "{text}");
        assert_eq!(inexpressible(&SandboxSpec::new("busybox:1")).len(), 4);
        assert!(inexpressible(&kube_spec()).is_empty());

        let mut spec = kube_spec();
        spec.tmpfs[1].options = "noexec".into();
        assert!(unsupported_text(&spec).contains("tmpfs[1].options 'noexec'"));

        let mut spec = kube_spec();
        spec.mounts.push(Mount {
            host: "/srv/data".into(),
            container: "/data".into(),
            read_only: true,
            nosuid: false,
        });
        assert!(unsupported_text(&spec).contains("mounts[0].host '/srv/data'"));

        let mut spec = kube_spec();
        spec.security.user = Some("nobody".into());
        assert!(unsupported_text(&spec).contains("security.user 'nobody'"));
        spec.security.user = Some("1:x".into());
        assert!(unsupported_text(&spec).contains("security.user '1:x'"));
        spec.security.user = Some("-1".into());
        assert!(unsupported_text(&spec).contains("security.user '-1'"));
    }

    #[test]
    fn names_follow_kubernetes_rules() {
        assert_eq!(
            pod_name("sb-0a1b", "x1").expect("valid"),
            "corral-sb-0a1b-x1"
        );
        assert!(pod_name("SB", "x").is_err());
        assert!(pod_name(&"a".repeat(60), "x").is_err());
        assert!(is_label_key("a.b/c_d") && is_label_key("corral.sandbox"));
        assert!(!is_label_key("/c") && !is_label_key("A_B/c") && !is_label_key("a/"));
        assert!(is_label_value("") && is_label_value("a-b.c_d"));
        assert!(!is_label_value("-a") && !is_label_value(&"a".repeat(64)));
        assert!(is_dns_subdomain("runsc") && !is_dns_subdomain("run sc"));
    }
}
