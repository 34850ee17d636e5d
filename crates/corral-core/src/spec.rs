//! What a sandbox is: image, environment, mounts, limits, security, network.
//!
//! [`SandboxSpec::default`] is the hardened sandbox every front end starts
//! from; each protection is a field that can be turned off on purpose, never
//! a missing flag. [`SandboxSpec::validate`] is the one place a spec is checked,
//! and its errors name the field and the value.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::labels;
use crate::policy::Recovery;
use crate::protocol::AGENT_DIR;

/// Everything needed to create one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSpec {
    /// Image reference, e.g. `debian:bookworm` or `corral-test/busybox`.
    pub image: String,
    /// Working directory for commands; `None` keeps the image's.
    pub workdir: Option<String>,
    /// Environment variables, in order. Every command gets them (under its
    /// own `env`); the agent receives them at each handshake, so they are
    /// never in the engine's configuration of the container (`docker
    /// inspect`, a pod's spec, a snapshot image). At most
    /// [`MAX_ENV_BYTES`] in all.
    pub env: Vec<EnvVar>,
    /// Resolve `Set` values starting with `$` (e.g. `$HOME`) from the host
    /// environment; an unset host variable is an error.
    pub expand_host_env: bool,
    /// Bind mounts from the host.
    pub mounts: Vec<Mount>,
    /// Resource limits.
    pub limits: Limits,
    /// Size-limited tmpfs mounts.
    pub tmpfs: Vec<Tmpfs>,
    /// Privilege restrictions.
    pub security: Security,
    /// Network attachment.
    pub network: Network,
    /// OCI runtime, e.g. `runc` or `runsc` (gVisor); `None` is the daemon's default.
    pub runtime: Option<String>,
    /// The wall between commands and the host kernel: `container` (runc,
    /// the default) or `gvisor` (gVisor's user-space kernel). Picks the
    /// runtime, so `runtime` stays unset with `gvisor`.
    pub isolation: Isolation,
    /// Extra container labels; keys starting with `corral.` are reserved.
    pub labels: BTreeMap<String, String>,
    /// How long the agent keeps the sandbox alive with no controller attached
    /// before it kills everything and exits (the dead-man switch), in ms.
    pub agent_grace_ms: u64,
    /// What happens when the container is lost (removed, killed, crashed).
    pub recovery: Recovery,
    /// Shell commands run (with `/bin/sh -c`, in order) after the sandbox
    /// starts and again after a recreate; one failing fails the start.
    pub startup: Vec<String>,
    /// Session key of a persistent sandbox: its container carries
    /// `corral.persistent=true` and `corral.session=<key>`, outlives its
    /// owner (no orphan reaping, no dead-man switch) and is adopted by the
    /// next corral that asks for the key. Set by the provider.
    pub persistent: Option<String>,
    /// Start the sandbox so that [`reset`](crate::SandboxSpec::in_place_reset)
    /// can return it to its state after the start-up commands in place, in
    /// milliseconds: the agent (never a command) gets CAP_SYS_ADMIN,
    /// CAP_SYS_CHROOT and CAP_SETPCAP, and commands write to an overlay
    /// whose changes live in memory (they count against the memory limit).
    /// Where a spec cannot reset in place, a reset replaces the container.
    pub pristine: bool,
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            image: String::new(),
            workdir: None,
            env: Vec::new(),
            expand_host_env: false,
            mounts: Vec::new(),
            limits: Limits::default(),
            tmpfs: Tmpfs::hardened_defaults(),
            security: Security::default(),
            network: Network::default(),
            runtime: None,
            isolation: Isolation::default(),
            labels: BTreeMap::new(),
            agent_grace_ms: 30_000,
            recovery: Recovery::default(),
            startup: Vec::new(),
            persistent: None,
            pristine: false,
        }
    }
}

/// The isolation tier of a sandbox, weakest first (so an operator's floor
/// compares with `<`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces, cgroups, seccomp and dropped capabilities over
    /// the host's kernel (runc, or whatever `runtime` names).
    #[default]
    Container,
    /// gVisor: commands' system calls go to gVisor's user-space kernel,
    /// never straight to the host's. Docker runtime [`GVISOR_RUNTIME`],
    /// Kubernetes RuntimeClass `kubernetes.runtime_class`.
    Gvisor,
}

/// The Docker runtime name of [`Isolation::Gvisor`], as
/// `scripts/ensure-gvisor.sh` registers it.
pub const GVISOR_RUNTIME: &str = "runsc";

/// The Docker runtime of [`Isolation::Gvisor`] sandboxes with
/// [`Network::None`], where the daemon has it (`scripts/ensure-gvisor.sh`
/// registers it as runsc with `--network=none --overlay`): gVisor
/// checkpoints such a sandbox, which it refuses on the host network stack
/// [`GVISOR_RUNTIME`] uses. `--overlay` keeps the root file system's
/// changes in the sandbox's memory, so a checkpoint carries them.
pub const GVISOR_LIVE_RUNTIME: &str = "runsc-live";

/// Host tasks the engine's pids cgroup allows per sandbox process under
/// [`Isolation::Gvisor`] (measured: about nine on the ptrace platform).
pub const GVISOR_HOST_TASKS_PER_PROCESS: i64 = 16;

/// Host tasks the engine's pids cgroup allows under [`Isolation::Gvisor`]
/// for gVisor's kernel itself (measured: about 45 with one process).
pub const GVISOR_KERNEL_TASKS: i64 = 128;

/// The host's `pid_max` assumed where corral cannot read the engine
/// host's own (a daemon reached over TCP): Linux's default, the smallest
/// a host commonly has.
pub const DEFAULT_HOST_PID_MAX: i64 = 32_768;

/// The largest `limits.pids` of an [`Isolation::Gvisor`] sandbox on a host
/// whose `pid_max` is `host_pid_max`: the one whose engine pids limit
/// ([`SandboxSpec::engine_pids_limit`]) is at most half the host's pids,
/// so that one sandbox cannot exhaust them (gVisor's kernel dies when it
/// cannot make a host task; the host's other processes do not).
pub fn gvisor_max_pids(host_pid_max: i64) -> i64 {
    (host_pid_max / 2 - GVISOR_KERNEL_TASKS) / GVISOR_HOST_TASKS_PER_PROCESS
}

impl Isolation {
    /// Every tier, weakest first.
    pub const ALL: [Isolation; 2] = [Isolation::Container, Isolation::Gvisor];

    /// The tier's name in a spec: `container` or `gvisor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Isolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Isolation::ALL
            .into_iter()
            .find(|i| i.as_str() == s)
            .ok_or_else(|| format!("isolation '{s}': expected container or gvisor"))
    }
}

/// One environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvVar {
    /// `NAME=value`.
    Set {
        /// Variable name.
        name: String,
        /// Its value.
        value: String,
    },
    /// Take `NAME`'s value from the host environment; skipped when the host
    /// does not have it (forwarding is best effort, like `docker run -e NAME`).
    Forward {
        /// Variable name.
        forward: String,
    },
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Absolute path on the daemon's host; must exist.
    pub host: String,
    /// Absolute path inside the sandbox.
    pub container: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Setuid/setgid bits and device files under the mount have no effect
    /// inside the sandbox (mounted `nosuid,nodev`, through an overlay whose
    /// upper layer is the host directory itself, so every write still lands
    /// there). Directories only; the path must not contain `,`, `:`, `\`
    /// or whitespace. Persistent sessions' workspace and home always are.
    #[serde(default)]
    pub nosuid: bool,
}

/// A size-limited tmpfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tmpfs {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size limit in bytes.
    pub size: u64,
    /// Mount options besides the size, e.g. `noexec,nosuid,nodev`.
    #[serde(default)]
    pub options: String,
}

impl Tmpfs {
    /// `/tmp` (nosuid, executables allowed: build tools need it), `/var/tmp` and
    /// `/run` (noexec, nosuid).
    pub fn hardened_defaults() -> Vec<Tmpfs> {
        vec![
            Tmpfs {
                path: "/tmp".into(),
                size: 512 << 20,
                options: "nosuid,nodev".into(),
            },
            Tmpfs {
                path: "/var/tmp".into(),
                size: 256 << 20,
                options: "noexec,nosuid,nodev".into(),
            },
            Tmpfs {
                path: "/run".into(),
                size: 64 << 20,
                options: "noexec,nosuid,nodev".into(),
            },
        ]
    }
}

/// Resource limits; `None` means unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Memory in bytes; swap is set equal so an OOM is a real OOM, not paging.
    pub memory: Option<u64>,
    /// CPUs, e.g. 1.5.
    pub cpus: Option<f64>,
    /// Maximum number of processes (fork bombs stop here).
    pub pids: Option<i64>,
    /// Writable layer size in bytes (`--storage-opt size=`); only some storage
    /// drivers support it, and asking for it where unsupported is an error.
    pub disk: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: Some(1 << 30),
            cpus: Some(1.0),
            pids: Some(256),
            disk: None,
        }
    }
}

/// Privilege restrictions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Security {
    /// Drop every Linux capability, then add back [`Security::cap_add`].
    pub drop_all_caps: bool,
    /// Capabilities added back after dropping all.
    pub cap_add: Vec<String>,
    /// Also add SETUID and SETGID, which root needs to switch users (su,
    /// package managers dropping privileges). Commands holding them can
    /// also take the agent's uid (65500) or a relay's: under runc PID 1
    /// stays non-dumpable and the kernel drops SIGSTOP and SIGKILL sent to
    /// it from inside, so results hold; under gVisor such a command can
    /// stop the agent and speak for it.
    pub setuid_caps: bool,
    /// Forbid gaining privileges through setuid binaries.
    pub no_new_privileges: bool,
    /// Mount the root filesystem read-only (tmpfs mounts stay writable).
    pub read_only_root: bool,
    /// Run as this user (`uid`, `uid:gid` or a name the image knows).
    pub user: Option<String>,
}

impl Default for Security {
    fn default() -> Self {
        Security {
            drop_all_caps: true,
            cap_add: vec!["CHOWN".into(), "DAC_OVERRIDE".into(), "FOWNER".into()],
            setuid_caps: false,
            no_new_privileges: true,
            read_only_root: false,
            user: None,
        }
    }
}

impl Security {
    /// The capabilities the sandbox gets back after dropping all.
    pub fn effective_cap_add(&self) -> Vec<String> {
        let mut caps: Vec<String> = self.cap_add.iter().map(|c| normalize_cap(c)).collect();
        if self.setuid_caps {
            caps.extend(["SETUID".to_string(), "SETGID".to_string()]);
        }
        caps.sort();
        caps.dedup();
        caps
    }

    /// Capabilities the container gets for its agent (PID 1) alone: every
    /// command drops them from all its sets and its bounding set before it
    /// runs. The agent runs under a uid of its own and starts commands as
    /// the sandbox's user and code contexts' relays under relay uids
    /// (SETUID, SETGID); a process of another uid can be signalled only
    /// with KILL, which the agent needs to end what commands start (a
    /// timeout, an exclusive command, a reset); SETPCAP takes them out of
    /// each command's bounding set. Those the spec gives commands
    /// themselves are not listed (`setuid_caps` gives SETUID and SETGID:
    /// such commands can take the agent's uid); empty when commands keep
    /// the engine's default set (which has all four).
    pub fn agent_only_caps(&self) -> Vec<String> {
        if !self.drop_all_caps {
            return Vec::new();
        }
        let caps = self.effective_cap_add();
        let has = |cap: &str| caps.iter().any(|c| c == cap || c == "ALL");
        AGENT_CAPS
            .into_iter()
            .filter(|c| !has(c))
            .map(String::from)
            .collect()
    }

    /// Every capability the container is given after dropping all: the
    /// commands' ([`Security::effective_cap_add`]) and the agent's own
    /// ([`Security::agent_only_caps`]), sorted.
    pub fn container_caps(&self) -> Vec<String> {
        let mut caps = self.effective_cap_add();
        caps.extend(self.agent_only_caps());
        caps.sort();
        caps.dedup();
        caps
    }
}

/// What the agent holds for itself in every sandbox (see
/// [`Security::agent_only_caps`]), sorted.
pub const AGENT_CAPS: [&str; 4] = ["KILL", "SETGID", "SETPCAP", "SETUID"];

/// What the agent of a sandbox that resets in place holds on top of
/// [`Security::container_caps`], for itself alone: commands drop them
/// (corral-agent's `pristine` and `confine`).
pub const PRISTINE_AGENT_CAPS: [&str; 3] = ["SETPCAP", "SYS_ADMIN", "SYS_CHROOT"];

/// A capability's name as Docker spells it: upper case, no `CAP_` prefix.
pub(crate) fn normalize_cap(cap: &str) -> String {
    let upper = cap.trim().to_ascii_uppercase();
    upper.strip_prefix("CAP_").unwrap_or(&upper).to_string()
}

/// Network attachment: `bridge`, `none`, or `{egress: {allow, deny}}`.
///
/// Written as a string or a one-key map in YAML and JSON alike (serde's
/// derive would want a YAML tag, `!egress`, which is still read); see
/// [`Network`]'s `Deserialize`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    /// Network access through corral's own bridge network (`corral`), made
    /// with inter-container communication off: the sandbox reaches outside
    /// (and the host, through the gateway), not other sandboxes or other
    /// containers. Never the daemon's default `bridge` network.
    #[default]
    Bridge,
    /// No network at all (loopback only).
    None,
    /// Only the destinations the policy allows, by name: the sandbox sits
    /// on a network of its own with no route out, and its one way out is
    /// corral's egress gateway (a resolver answering allowed names only and
    /// a proxy routing TLS by SNI and HTTP by Host).
    Egress(crate::egress::EgressPolicy),
}

/// What a network value may be, in error messages.
const NETWORK_EXPECTED: &str = "bridge, none or {egress: {allow: [...], deny: [...]}}";

impl Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Network::Bridge => serializer.serialize_str("bridge"),
            Network::None => serializer.serialize_str("none"),
            Network::Egress(policy) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("egress", policy)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Network {
    /// `bridge`, `none`, `{egress: {...}}` (YAML or JSON), or YAML's tagged
    /// `!egress {...}`; anything else is an error quoting the value.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NetworkVisitor;

        fn unit<E: serde::de::Error>(name: &str) -> Result<Network, E> {
            Network::parse(name).ok_or_else(|| {
                E::invalid_value(serde::de::Unexpected::Str(name), &NETWORK_EXPECTED)
            })
        }

        impl<'de> serde::de::Visitor<'de> for NetworkVisitor {
            type Value = Network;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(NETWORK_EXPECTED)
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Network, E> {
                unit(v)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Network, A::Error> {
                use serde::de::Error;
                let Some(key) = map.next_key::<String>()? else {
                    return Err(A::Error::invalid_value(
                        serde::de::Unexpected::Map,
                        &NETWORK_EXPECTED,
                    ));
                };
                if key != "egress" {
                    return Err(A::Error::unknown_field(&key, &["egress"]));
                }
                let policy = map.next_value::<crate::egress::EgressPolicy>()?;
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(A::Error::unknown_field(&extra, &[]));
                }
                Ok(Network::Egress(policy))
            }

            fn visit_enum<A: serde::de::EnumAccess<'de>>(
                self,
                data: A,
            ) -> Result<Network, A::Error> {
                use serde::de::VariantAccess;
                let (name, variant) = data.variant::<String>()?;
                if name == "egress" {
                    variant.newtype_variant().map(Network::Egress)
                } else {
                    variant.unit_variant()?;
                    unit(&name)
                }
            }
        }

        deserializer.deserialize_any(NetworkVisitor)
    }
}

impl Network {
    /// The mode's name in specs and on command lines.
    pub fn as_str(&self) -> &'static str {
        match self {
            Network::Bridge => "bridge",
            Network::None => "none",
            Network::Egress(_) => "egress",
        }
    }

    /// Parses `bridge` or `none` (an egress policy is only written in a spec).
    pub fn parse(text: &str) -> Option<Network> {
        match text {
            "bridge" => Some(Network::Bridge),
            "none" => Some(Network::None),
            _ => None,
        }
    }

    /// The egress policy, when the sandbox has one.
    pub fn egress(&self) -> Option<&crate::egress::EgressPolicy> {
        match self {
            Network::Egress(p) => Some(p),
            _ => None,
        }
    }
}

/// A spec field holds a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} '{value}': {reason}")]
pub struct SpecError {
    /// Which field, e.g. `env[2].name` or `mounts[0].host`.
    pub field: String,
    /// The rejected value.
    pub value: String,
    /// Why it was rejected.
    pub reason: String,
}

impl SpecError {
    fn new(field: impl Into<String>, value: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// What validation needs to know about the host; kept behind a trait so this
/// crate stays free of IO.
pub trait HostView {
    /// A host environment variable.
    fn var(&self, name: &str) -> Option<String>;
    /// Whether a host path exists.
    fn path_exists(&self, path: &str) -> bool;
}

/// Most bytes (names and values, with `=` and a terminator each) a
/// sandbox's resolved environment may hold: half the kernel's usual
/// `ARG_MAX`, so every command still has room for its own arguments and
/// variables.
pub const MAX_ENV_BYTES: usize = 1024 * 1024;

/// True for a POSIX-portable environment variable name.
pub fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn valid_runtime_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn valid_cap_name(cap: &str) -> bool {
    !cap.is_empty() && cap.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

fn check_container_path(field: &str, path: &str) -> Result<(), SpecError> {
    if !path.starts_with('/') {
        return Err(SpecError::new(field, path, "must be an absolute path"));
    }
    if path == "/" {
        return Err(SpecError::new(field, path, "cannot be the root directory"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(SpecError::new(field, path, "must not contain '..'"));
    }
    if path == AGENT_DIR || path.starts_with(&format!("{AGENT_DIR}/")) {
        return Err(SpecError::new(
            field,
            path,
            format!("{AGENT_DIR} is reserved for corral's agent"),
        ));
    }
    Ok(())
}

/// The agent's grace for persistent sandboxes: ten years, i.e. never (a
/// persistent sandbox outlives its owner).
const PERSISTENT_GRACE_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

impl SandboxSpec {
    /// Why a reset of this spec's sandboxes cannot happen in place (and
    /// replaces the container instead), naming the field; `Ok` when it can
    /// (the backend and the image may still refuse: then the agent says
    /// why at the handshake).
    pub fn in_place_reset(&self) -> Result<(), String> {
        let sec = &self.security;
        if !self.pristine {
            return Err("pristine is false: the sandbox was not started for in-place reset".into());
        }
        if self.persistent.is_some() {
            return Err("persistent: a persistent sandbox keeps its state by design".into());
        }
        if sec.read_only_root {
            return Err("security.read_only_root: the overlay would make the root writable".into());
        }
        if !sec.no_new_privileges {
            return Err("security.no_new_privileges is false: commands could not be kept from the agent's extra capabilities".into());
        }
        if !sec.drop_all_caps {
            return Err("security.drop_all_caps is false: commands would keep the daemon's default capabilities next to the agent's".into());
        }
        if !self.starts_as_root() {
            let user = sec.user.as_deref().unwrap_or_default();
            return Err(format!("security.user '{user}': in-place reset needs the agent to run as root (commands keep only the usual capabilities)"));
        }
        if self.isolation == Isolation::Gvisor {
            return Err("isolation gvisor: in-place reset is only supported under runc".into());
        }
        match self.runtime.as_deref() {
            None | Some("runc") => Ok(()),
            Some(other) => Err(format!(
                "runtime '{other}': in-place reset is only supported under runc"
            )),
        }
    }

    /// Whether the sandbox runs under gVisor: `isolation: gvisor`, or a
    /// runsc runtime named directly.
    pub fn runs_gvisor(&self) -> bool {
        self.isolation == Isolation::Gvisor
            || matches!(
                self.runtime.as_deref(),
                Some(GVISOR_RUNTIME) | Some(GVISOR_LIVE_RUNTIME)
            )
    }

    /// Whether PID 1 starts as root (`security.user` unset, `root` or 0).
    pub fn starts_as_root(&self) -> bool {
        self.security.user.as_deref().is_none_or(|user| {
            let uid = user.split(':').next().unwrap_or("");
            uid == "0" || uid == "root"
        })
    }

    /// Whether the agent and commands run in a PID namespace and under a
    /// `/proc` of their own, behind a door that holds the engine's pipes
    /// (corral-agent's `init --pid-ns`): under gVisor, for a sandbox that
    /// starts as root (the split needs `CAP_SYS_ADMIN`, which the agent
    /// drops once `/proc` is mounted).
    pub fn agent_pid_namespace(&self) -> bool {
        self.runs_gvisor() && self.starts_as_root()
    }

    /// Why a command in this spec's sandboxes could forge what corral
    /// reports of a command (its own result, a later command's, an
    /// `exclusive` grader's), naming the field; `Ok` when the tier holds
    /// result integrity. The one place that decides it: clients may raise
    /// `isolation` only to a tier that holds it
    /// ([`crate::client_policy::ClientPolicy::check_spec`]), and the
    /// service's create answer says when a sandbox's does not.
    ///
    /// Under gVisor, whose procfs reopens `/proc/PID/fd/N` without a
    /// ptrace check, the agent holds it only from a PID namespace of its
    /// own behind a door ([`SandboxSpec::agent_pid_namespace`]), which
    /// needs the sandbox to start as root; `setuid_caps` lets a command
    /// take the agent's uid, which gVisor's checks do not keep out.
    pub fn result_integrity(&self) -> Result<(), String> {
        let gvisor = self.runs_gvisor();
        if gvisor && !self.agent_pid_namespace() {
            return Err(format!(
                "isolation gvisor with security.user '{}': results are not integrity-protected \
                 (the agent needs root to keep its stream out of commands' reach; a command can \
                 open it through /proc/1/fd)",
                self.security.user.as_deref().unwrap_or_default()
            ));
        }
        if gvisor && self.security.setuid_caps {
            return Err(
                "isolation gvisor with security.setuid_caps: results are not integrity-protected \
                 (a command can switch to the agent's uid and stop or trace it)"
                    .into(),
            );
        }
        match self.runtime.as_deref() {
            None | Some("runc") | Some(GVISOR_RUNTIME) | Some(GVISOR_LIVE_RUNTIME) => Ok(()),
            Some(other) => Err(format!(
                "runtime '{other}': result integrity is established under runc and gVisor only"
            )),
        }
    }

    /// `size=` of the tmpfs that holds an in-place-reset sandbox's
    /// changes: the disk limit bounds them, else the memory limit (which
    /// they count against anyway); `None`: the kernel's default.
    pub fn pristine_state_size(&self) -> Option<u64> {
        self.limits.disk.or(self.limits.memory)
    }

    /// The engine's pids limit: what the container's pids cgroup may hold,
    /// on a host whose `pid_max` is `host_pid_max`.
    ///
    /// Under [`Isolation::Container`] that is `limits.pids`, the sandbox's
    /// processes. Under [`Isolation::Gvisor`] the cgroup holds gVisor's own
    /// host tasks (its kernel's threads, and a host process with stub
    /// threads per address space: about nine per sandbox process on
    /// gVisor's ptrace platform), and gVisor's kernel stops when it cannot
    /// make one. So the cgroup gets [`GVISOR_HOST_TASKS_PER_PROCESS`] per
    /// process plus [`GVISOR_KERNEL_TASKS`], and the sandbox's processes
    /// are bounded inside gVisor instead ([`SandboxSpec::command_nproc`]).
    /// That must stay within half the host's pids: a `limits.pids` above
    /// [`gvisor_max_pids`], or none, is refused naming `limits.pids`.
    pub fn engine_pids_limit(&self, host_pid_max: i64) -> Result<Option<i64>, SpecError> {
        let pids = self.limits.pids;
        match self.isolation {
            Isolation::Container => Ok(pids),
            Isolation::Gvisor => {
                let max = gvisor_max_pids(host_pid_max);
                match pids {
                    Some(p) if p <= max => Ok(Some(
                        p.saturating_mul(GVISOR_HOST_TASKS_PER_PROCESS)
                            .saturating_add(GVISOR_KERNEL_TASKS),
                    )),
                    _ => Err(SpecError::new(
                        "limits.pids",
                        pids.map_or_else(|| "null".to_string(), |p| p.to_string()),
                        format!(
                            "under isolation gvisor each process costs gVisor up to \
                             {GVISOR_HOST_TASKS_PER_PROCESS} host tasks, and one sandbox may \
                             hold at most half of the host's {host_pid_max} pids \
                             (kernel.pid_max): at most {max}"
                        ),
                    )),
                }
            }
        }
    }

    /// The `RLIMIT_NPROC` every command runs with, where the process
    /// limit is kept inside the sandbox: `limits.pids` under
    /// [`Isolation::Gvisor`], whose kernel counts only the sandbox's own
    /// processes (per uid, as Linux does). `None` under runc, where the
    /// host kernel would count every process of the uid on the host.
    pub fn command_nproc(&self) -> Option<u64> {
        match self.isolation {
            Isolation::Container => None,
            Isolation::Gvisor => self.limits.pids.and_then(|p| u64::try_from(p).ok()),
        }
    }

    /// The dead-man grace the agent runs with, in ms: `agent_grace_ms`,
    /// or never for a persistent sandbox.
    pub fn effective_grace_ms(&self) -> u64 {
        if self.persistent.is_some() {
            PERSISTENT_GRACE_MS
        } else {
            self.agent_grace_ms
        }
    }

    /// How often corral pings the agent when nothing else is sent: three
    /// times per dead-man grace period, so one late ping never fires the
    /// switch, and at least every ten seconds.
    pub fn keepalive(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.effective_grace_ms() / 3).clamp(50, 10_000))
    }

    /// A hardened spec for `image`.
    pub fn new(image: impl Into<String>) -> Self {
        SandboxSpec {
            image: image.into(),
            ..SandboxSpec::default()
        }
    }

    /// Checks every field; the first bad one is returned, named.
    pub fn validate(&self, host: &dyn HostView) -> Result<(), SpecError> {
        let image = self.image.trim();
        if image.is_empty() {
            return Err(SpecError::new("image", &self.image, "an image is required"));
        }
        if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(SpecError::new(
                "image",
                &self.image,
                "must not contain whitespace",
            ));
        }
        if let Some(dir) = &self.workdir {
            if !dir.starts_with('/') {
                return Err(SpecError::new("workdir", dir, "must be an absolute path"));
            }
        }
        self.resolve_env(host)?;
        if let Network::Egress(policy) = &self.network {
            let rules = policy.rules()?;
            if !rules
                .allow
                .iter()
                .any(|r| !matches!(r.host, crate::egress::Host::Cidr(..)))
            {
                return Err(SpecError::new(
                    "network.egress.allow",
                    policy.allow.join(","),
                    "name at least one domain name to allow (CIDRs only bound where allowed \
                     names may lead); for no network at all use network: none",
                ));
            }
        }
        let mut seen = HashSet::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let field = format!("mounts[{i}]");
            if !m.host.starts_with('/') {
                return Err(SpecError::new(
                    format!("{field}.host"),
                    &m.host,
                    "must be an absolute host path",
                ));
            }
            if m.nosuid {
                if let Some(c) = m
                    .host
                    .chars()
                    .find(|c| matches!(c, ',' | ':' | '\\') || c.is_whitespace())
                {
                    return Err(SpecError::new(
                        format!("{field}.host"),
                        &m.host,
                        format!(
                            "a nosuid mount's host path cannot contain {c:?} (overlay options)"
                        ),
                    ));
                }
            }
            if !host.path_exists(&m.host) {
                return Err(SpecError::new(
                    format!("{field}.host"),
                    &m.host,
                    "no such file or directory on the host",
                ));
            }
            check_container_path(&format!("{field}.container"), &m.container)?;
            if !seen.insert(m.container.trim_end_matches('/').to_string()) {
                return Err(SpecError::new(
                    format!("{field}.container"),
                    &m.container,
                    "mounted twice",
                ));
            }
        }
        for (i, t) in self.tmpfs.iter().enumerate() {
            let field = format!("tmpfs[{i}]");
            check_container_path(&format!("{field}.path"), &t.path)?;
            if !seen.insert(t.path.trim_end_matches('/').to_string()) {
                return Err(SpecError::new(
                    format!("{field}.path"),
                    &t.path,
                    "mounted twice",
                ));
            }
            if t.size == 0 {
                return Err(SpecError::new(
                    format!("{field}.size"),
                    "0",
                    "a tmpfs needs a size limit above zero",
                ));
            }
            if t.options.split(',').any(|o| o.trim().starts_with("size=")) {
                return Err(SpecError::new(
                    format!("{field}.options"),
                    &t.options,
                    "set the size with the size field",
                ));
            }
        }
        if let Some(mem) = self.limits.memory {
            if mem < 6 << 20 {
                return Err(SpecError::new(
                    "limits.memory",
                    mem.to_string(),
                    "Docker needs at least 6 MiB",
                ));
            }
        }
        if let Some(cpus) = self.limits.cpus {
            if !(cpus.is_finite() && cpus > 0.0) {
                return Err(SpecError::new(
                    "limits.cpus",
                    cpus.to_string(),
                    "must be above zero",
                ));
            }
        }
        if let Some(pids) = self.limits.pids {
            if pids < 8 {
                return Err(SpecError::new(
                    "limits.pids",
                    pids.to_string(),
                    "at least 8 (the agent and a shell need a few)",
                ));
            }
        }
        if self.limits.disk == Some(0) {
            return Err(SpecError::new("limits.disk", "0", "must be above zero"));
        }
        for (i, cap) in self.security.cap_add.iter().enumerate() {
            if !valid_cap_name(&normalize_cap(cap)) {
                return Err(SpecError::new(
                    format!("security.cap_add[{i}]"),
                    cap,
                    "not a capability name such as CHOWN",
                ));
            }
        }
        if let Some(user) = &self.security.user {
            if user.is_empty() || user.contains(char::is_whitespace) {
                return Err(SpecError::new(
                    "security.user",
                    user,
                    "expected uid, uid:gid or a name",
                ));
            }
        }
        if let Some(rt) = &self.runtime {
            if !valid_runtime_name(rt) {
                return Err(SpecError::new(
                    "runtime",
                    rt,
                    "not a runtime name such as runc or runsc",
                ));
            }
            if self.isolation == Isolation::Gvisor {
                return Err(SpecError::new(
                    "runtime",
                    rt,
                    "isolation gvisor picks the runtime itself; leave runtime unset",
                ));
            }
        }
        for key in self.labels.keys() {
            if key.starts_with(labels::PREFIX) {
                return Err(SpecError::new(
                    "labels",
                    key,
                    format!("keys starting with '{}' are reserved", labels::PREFIX),
                ));
            }
        }
        for (i, cmd) in self.startup.iter().enumerate() {
            if cmd.trim().is_empty() {
                return Err(SpecError::new(
                    format!("startup[{i}]"),
                    cmd,
                    "an empty command",
                ));
            }
        }
        if self.agent_grace_ms < 100 {
            return Err(SpecError::new(
                "agent_grace_ms",
                self.agent_grace_ms.to_string(),
                "at least 100 ms",
            ));
        }
        Ok(())
    }

    /// The environment the sandbox gets, as `(name, value)` pairs: names
    /// validated, duplicates rejected, forwarded names looked up on the host.
    pub fn resolve_env(&self, host: &dyn HostView) -> Result<Vec<(String, String)>, SpecError> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, var) in self.env.iter().enumerate() {
            let name = match var {
                EnvVar::Set { name, .. } => name,
                EnvVar::Forward { forward } => forward,
            };
            let field = format!("env[{i}]");
            if !valid_env_name(name) {
                return Err(SpecError::new(
                    field,
                    name,
                    "a variable name is letters, digits and '_', not starting with a digit",
                ));
            }
            if crate::agent_auth::is_reserved_env(name) {
                return Err(SpecError::new(
                    field,
                    name,
                    format!(
                        "names starting with {} are reserved for corral's agent",
                        crate::agent_auth::RESERVED_ENV_PREFIX
                    ),
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(SpecError::new(field, name, "set more than once"));
            }
            match var {
                EnvVar::Set { name, value } => {
                    let value = match value.strip_prefix('$') {
                        Some(host_name) if self.expand_host_env => {
                            host.var(host_name).ok_or_else(|| {
                                SpecError::new(
                                    format!("{field}.value"),
                                    value,
                                    format!("host variable {host_name} is not set"),
                                )
                            })?
                        }
                        _ => value.clone(),
                    };
                    if value.contains('\0') {
                        return Err(SpecError::new(
                            format!("{field}.value"),
                            name,
                            "contains a NUL byte",
                        ));
                    }
                    out.push((name.clone(), value));
                }
                EnvVar::Forward { forward } => {
                    if let Some(value) = host.var(forward) {
                        out.push((forward.clone(), value));
                    }
                }
            }
        }
        let bytes: usize = out.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if bytes > MAX_ENV_BYTES {
            return Err(SpecError::new(
                "env",
                format!("{bytes} bytes"),
                format!("the environment holds at most {MAX_ENV_BYTES} bytes (names and values)"),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeHost;
    impl HostView for FakeHost {
        fn var(&self, name: &str) -> Option<String> {
            (name == "HOST_TOKEN").then(|| "secret".to_string())
        }
        fn path_exists(&self, path: &str) -> bool {
            path == "/srv/data"
        }
    }

    #[test]
    fn result_integrity_is_held_by_runc_and_named_where_it_is_not() {
        let mut spec = SandboxSpec::new("img");
        assert_eq!(spec.result_integrity(), Ok(()));
        spec.runtime = Some("runc".into());
        assert_eq!(spec.result_integrity(), Ok(()));
        spec.runtime = Some("kata".into());
        let why = spec.result_integrity().expect_err("an untested runtime");
        assert!(why.starts_with("runtime 'kata'"), "{why}");
        spec.runtime = Some(GVISOR_RUNTIME.into());
        let by_runtime = spec.result_integrity();
        spec.runtime = None;
        spec.isolation = Isolation::Gvisor;
        assert_eq!(spec.result_integrity(), by_runtime, "runsc is the tier");
        spec.security.setuid_caps = true;
        let why = spec
            .result_integrity()
            .expect_err("setuid_caps under gVisor");
        assert!(why.starts_with("isolation gvisor"), "{why}");
        spec.security.setuid_caps = false;
        assert_eq!(spec.result_integrity(), Ok(()), "behind the door");
        assert!(spec.agent_pid_namespace());
        for root in ["root", "0", "0:0", "root:root"] {
            spec.security.user = Some(root.into());
            assert_eq!(spec.result_integrity(), Ok(()), "{root}");
        }
        spec.security.user = Some("1000:1000".into());
        assert!(!spec.agent_pid_namespace());
        let why = spec.result_integrity().expect_err("gVisor as a user");
        assert!(why.contains("security.user '1000:1000'"), "{why}");
        assert!(why.contains("not integrity-protected"), "{why}");
        spec.isolation = Isolation::Container;
        assert_eq!(spec.result_integrity(), Ok(()), "runc keeps its uids");
        assert!(!spec.agent_pid_namespace());
    }

    #[test]
    fn under_gvisor_the_engine_pids_limit_stays_under_the_hosts_pid_max() {
        let mut spec = SandboxSpec::new("img");
        spec.isolation = Isolation::Gvisor;
        // Linux's default, this suite's hosts, and the kernel's ceiling.
        for pid_max in [DEFAULT_HOST_PID_MAX, 65_536, 1 << 22] {
            let max = gvisor_max_pids(pid_max);
            assert!(max >= 8, "{pid_max}: {max}");
            spec.limits.pids = Some(max);
            let engine = spec
                .engine_pids_limit(pid_max)
                .expect("the largest allowed")
                .expect("a limit");
            assert!(engine <= pid_max / 2, "{pid_max}: {engine}");
            for refused in [Some(max + 1), Some(i64::MAX), None] {
                spec.limits.pids = refused;
                let e = spec.engine_pids_limit(pid_max).expect_err("refused");
                assert_eq!(e.field, "limits.pids", "{e}");
                assert!(e.reason.contains(&format!("at most {max}")), "{e}");
            }
        }
        // The review's case: the policy's largest (4096) was 65,664 host
        // tasks on a host of 32,768.
        spec.limits.pids = Some(crate::client_policy::ClientPolicy::default().max_pids);
        let e = spec
            .engine_pids_limit(DEFAULT_HOST_PID_MAX)
            .expect_err("4096 under gvisor");
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("limits.pids", "4096")
        );
        // runc's limit is the sandbox's processes, whatever the host.
        spec.isolation = Isolation::Container;
        assert_eq!(spec.engine_pids_limit(1024), Ok(Some(4096)));
        spec.limits.pids = None;
        assert_eq!(spec.engine_pids_limit(1024), Ok(None));
    }

    #[test]
    fn network_reads_the_same_from_json_as_from_yaml() {
        let read = |json: &str| -> Result<Network, String> {
            let mut de = serde_json::Deserializer::from_str(json);
            serde_path_to_error::deserialize::<_, SandboxSpec>(&mut de)
                .map(|s| s.network)
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))
        };
        assert_eq!(read(r#"{"network": "none"}"#), Ok(Network::None));
        assert_eq!(read(r#"{"network": "bridge"}"#), Ok(Network::Bridge));
        assert_eq!(
            read(r#"{"network": {"egress": {"allow": ["pypi.org"], "deny": ["10.0.0.0/8"]}}}"#),
            Ok(Network::Egress(crate::egress::EgressPolicy {
                allow: vec!["pypi.org".into()],
                deny: vec!["10.0.0.0/8".into()],
            }))
        );
        // What it writes is what it reads.
        let policy = Network::Egress(crate::egress::EgressPolicy {
            allow: vec!["pypi.org".into()],
            deny: vec![],
        });
        let json = serde_json::to_string(&policy).expect("json");
        assert_eq!(json, r#"{"egress":{"allow":["pypi.org"],"deny":[]}}"#);
        for (json, value) in [
            (r#"{"network": "bogus"}"#, "bogus"),
            (r#"{"network": {"egres": {}}}"#, "egres"),
            (
                r#"{"network": {"egress": {"allow": "pypi.org"}}}"#,
                "pypi.org",
            ),
            (r#"{"network": ["none"]}"#, "sequence"),
        ] {
            let e = read(json).expect_err(json);
            assert!(e.starts_with("network"), "{json}: {e}");
            assert!(e.contains(value), "{json}: {e}");
        }
    }

    fn err(spec: &SandboxSpec) -> SpecError {
        spec.validate(&FakeHost).expect_err("should be rejected")
    }

    #[test]
    fn defaults_are_hardened_and_valid() {
        let spec = SandboxSpec::new("img");
        spec.validate(&FakeHost).expect("valid");
        assert!(spec.security.drop_all_caps && spec.security.no_new_privileges);
        assert_eq!(
            spec.security.effective_cap_add(),
            ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
        );
        assert_eq!(spec.limits.pids, Some(256));
        let tmp: Vec<_> = spec.tmpfs.iter().map(|t| t.path.as_str()).collect();
        assert_eq!(tmp, ["/tmp", "/var/tmp", "/run"]);
        assert!(spec.tmpfs[2].options.contains("noexec"));
    }

    #[test]
    fn setuid_caps_only_on_request() {
        let mut s = Security {
            setuid_caps: true,
            ..Security::default()
        };
        s.cap_add.push("cap_chown".into());
        assert_eq!(
            s.effective_cap_add(),
            ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]
        );
    }

    #[test]
    fn the_agent_holds_what_commands_do_not() {
        let mut s = Security::default();
        assert_eq!(s.agent_only_caps(), ["KILL", "SETGID", "SETPCAP", "SETUID"]);
        assert_eq!(
            s.container_caps(),
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "KILL",
                "SETGID",
                "SETPCAP",
                "SETUID"
            ]
        );
        s.setuid_caps = true;
        assert_eq!(s.agent_only_caps(), ["KILL", "SETPCAP"]);
        assert_eq!(
            s.container_caps(),
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "KILL",
                "SETGID",
                "SETPCAP",
                "SETUID"
            ]
        );
        // SETUID from a profile's list counts the same.
        let mut p = Security::default();
        p.cap_add.push("cap_setuid".into());
        assert_eq!(p.agent_only_caps(), ["KILL", "SETGID", "SETPCAP"]);
        // Commands given SETPCAP keep it; the agent only adds KILL.
        s.cap_add.push("SETPCAP".into());
        assert_eq!(s.agent_only_caps(), ["KILL"]);
        // Commands that may kill anyway, or keep the default set: nothing.
        s.cap_add.push("KILL".into());
        assert!(s.agent_only_caps().is_empty());
        s.cap_add = vec!["ALL".into()];
        assert!(s.agent_only_caps().is_empty());
        let d = Security {
            drop_all_caps: false,
            setuid_caps: true,
            ..Security::default()
        };
        assert!(d.agent_only_caps().is_empty());
    }

    #[test]
    fn env_names_are_checked_and_forwarded() {
        let mut spec = SandboxSpec::new("img");
        spec.env = vec![
            EnvVar::Set {
                name: "A".into(),
                value: "1".into(),
            },
            EnvVar::Forward {
                forward: "HOST_TOKEN".into(),
            },
            EnvVar::Forward {
                forward: "NOT_ON_HOST".into(),
            },
            EnvVar::Set {
                name: "LITERAL".into(),
                value: "$HOST_TOKEN".into(),
            },
        ];
        let env = spec.resolve_env(&FakeHost).expect("valid");
        assert_eq!(
            env,
            vec![
                ("A".to_string(), "1".to_string()),
                ("HOST_TOKEN".to_string(), "secret".to_string()),
                ("LITERAL".to_string(), "$HOST_TOKEN".to_string()),
            ]
        );
        spec.expand_host_env = true;
        let env = spec.resolve_env(&FakeHost).expect("valid");
        assert_eq!(env[2], ("LITERAL".to_string(), "secret".to_string()));

        spec.env.push(EnvVar::Set {
            name: "MISSING".into(),
            value: "$NOPE".into(),
        });
        let e = err(&spec);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("env[4].value", "$NOPE")
        );

        spec.env = vec![EnvVar::Set {
            name: "1BAD".into(),
            value: String::new(),
        }];
        assert_eq!(err(&spec).field, "env[0]");
        spec.env = vec![
            EnvVar::Set {
                name: "X".into(),
                value: String::new(),
            },
            EnvVar::Forward {
                forward: "X".into(),
            },
        ];
        let e = err(&spec);
        assert_eq!(
            (e.field.as_str(), e.reason.as_str()),
            ("env[1]", "set more than once")
        );
        // The agent's own variables cannot be set or forwarded by a spec.
        for var in [
            EnvVar::Set {
                name: "CORRAL_AGENT_SECRET".into(),
                value: "00".into(),
            },
            EnvVar::Forward {
                forward: "CORRAL_AGENT_LISTEN".into(),
            },
        ] {
            spec.env = vec![var];
            let e = err(&spec);
            assert_eq!(e.field, "env[0]");
            assert!(e.value.starts_with("CORRAL_AGENT_"), "{e}");
            assert!(e.reason.contains("reserved"), "{e}");
        }
        // The whole environment is bounded (it travels in the handshake).
        let big = |n: usize| EnvVar::Set {
            name: "BIG".into(),
            value: "x".repeat(n),
        };
        spec.env = vec![big(MAX_ENV_BYTES - 5)];
        spec.resolve_env(&FakeHost).expect("exactly the limit");
        spec.env = vec![big(MAX_ENV_BYTES - 4)];
        let e = err(&spec);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("env", format!("{} bytes", MAX_ENV_BYTES + 1).as_str())
        );
    }

    #[test]
    fn mounts_are_checked_never_skipped() {
        let mut spec = SandboxSpec::new("img");
        spec.mounts = vec![Mount {
            host: "/srv/data".into(),
            container: "/data".into(),
            read_only: true,
            nosuid: false,
        }];
        spec.validate(&FakeHost).expect("valid");
        spec.mounts.push(Mount {
            host: "/missing".into(),
            container: "/m".into(),
            read_only: false,
            nosuid: false,
        });
        let e = err(&spec);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("mounts[1].host", "/missing")
        );
        spec.mounts[1] = Mount {
            host: "/srv/data".into(),
            container: "rel".into(),
            read_only: false,
            nosuid: false,
        };
        assert_eq!(err(&spec).field, "mounts[1].container");
        spec.mounts[1].container = "/data/".into();
        assert_eq!(err(&spec).reason, "mounted twice");
        spec.mounts[1].container = "/.corral/x".into();
        assert_eq!(err(&spec).field, "mounts[1].container");
        spec.mounts[1].container = "/tmp".into();
        assert_eq!(err(&spec).field, "tmpfs[0].path");
        spec.mounts.truncate(1);
        spec.mounts[0].nosuid = true;
        spec.validate(&FakeHost)
            .expect("a plain path can be nosuid");
        spec.mounts[0].host = "/srv/data,upperdir=/etc".into();
        let e = err(&spec);
        assert_eq!(e.field, "mounts[0].host");
        assert!(e.reason.contains("','"), "{e}");
    }

    #[test]
    fn limits_and_names_are_checked() {
        let mut spec = SandboxSpec::new("img");
        spec.limits.memory = Some(1024);
        assert_eq!(err(&spec).field, "limits.memory");
        spec.limits.memory = None;
        spec.limits.pids = Some(2);
        assert_eq!(err(&spec).field, "limits.pids");
        spec.limits.pids = None;
        spec.runtime = Some("runsc".into());
        spec.isolation = Isolation::Gvisor;
        let e = err(&spec);
        assert!(
            e.field == "runtime" && e.to_string().contains("isolation gvisor"),
            "{e}"
        );
        spec.isolation = Isolation::Container;
        spec.runtime = Some("run sc".into());
        assert_eq!(err(&spec).field, "runtime");
        spec.runtime = Some("runsc".into());
        spec.labels.insert("corral.sandbox".into(), "x".into());
        assert_eq!(err(&spec).field, "labels");
        spec.labels.clear();
        spec.image = " ".into();
        assert_eq!(err(&spec).field, "image");
    }
}
