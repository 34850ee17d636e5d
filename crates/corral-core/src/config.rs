//! corral's configuration file: every knob of the backend, the base sandbox
//! spec, named profiles and the provider, in one YAML document.
//!
//! Precedence, highest first: command-line flags, `CORRAL_*` environment
//! variables ([`Config::apply_env`]), the file ([`Config::from_yaml`]), the
//! library defaults ([`Config::default`]). Every field is optional and its
//! default equals the default of the library type it feeds, so an empty file
//! and no file mean the same thing; `examples/corral.yaml` spells out every
//! key with its default and a test keeps it equal to [`Config::default`].
//!
//! Parsing is strict: an unknown key or a value of the wrong type is an
//! error naming the key path, the value and the line. [`Config::validate`]
//! then checks ranges and every sandbox spec, naming the field path
//! (`profiles.python.limits.memory`) and the value. Sizes are plain integers
//! in bytes here (no `1g`): a config file is read by programs as well as
//! people, and one spelling per value keeps it unambiguous.
//!
//! No IO: the caller reads the file and passes the environment in, as with
//! [`crate::spec::HostView`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::breaker::BreakerConfig;
use crate::client_policy::ClientPolicy;
use crate::policy::{Recovery, RetryPolicy};
use crate::pool::ProviderConfig;
use crate::server_limits::ServerLimits;
use crate::spec::{HostView, SandboxSpec, SpecError};

mod keys;

pub use keys::known_keys;

/// The example configuration shipped at `examples/corral.yaml`: every key
/// with its default value and what it does.
pub const EXAMPLE_YAML: &str = include_str!("../../../examples/corral.yaml");

/// The environment variables [`Config::apply_env`] reads, with the key each
/// one overrides. An empty variable counts as unset.
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("CORRAL_ENDPOINT", "endpoint"),
    ("CORRAL_START_LIMIT", "daemon.start_limit"),
    ("CORRAL_EXEC_LIMIT", "daemon.exec_limit"),
    ("CORRAL_IMAGE", "defaults.image"),
    ("CORRAL_RECOVERY", "defaults.recovery"),
    ("CORRAL_MAX_LIVE", "provider.max_live"),
    ("CORRAL_PERSISTENCE_ROOT", "persistence_root"),
    ("CORRAL_LISTEN", "server.listen"),
    ("CORRAL_TOKEN", "server.token"),
    ("CORRAL_RUNTIME_DIR", "server.runtime_dir"),
];

/// Everything corral can be configured with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Which engine runs sandboxes: `docker` (default; Docker or Podman's
    /// compatible socket) or `kubernetes`.
    pub backend: BackendKind,
    /// Daemon endpoint: `unix:///path`, `tcp://host:port` or a socket path.
    /// Default `None`: `DOCKER_HOST`, then Docker's default socket, then
    /// Podman's sockets.
    pub endpoint: Option<String>,
    /// How hard corral leans on the daemon.
    pub daemon: DaemonConfig,
    /// The base spec of `corral run` (flags override it). Default: the
    /// hardened [`SandboxSpec::default`]; an empty `image` means the front
    /// end's own default image.
    pub defaults: SandboxSpec,
    /// Named sandbox specs (`corral run --profile NAME`), default none. A
    /// profile is a full spec on its own: a key it leaves out takes
    /// [`SandboxSpec`]'s hardened default, not the value in `defaults`.
    pub profiles: BTreeMap<String, SandboxSpec>,
    /// Sandboxes by session key, warm pools, eviction.
    pub provider: ProviderConfig,
    /// Host directory holding persistent workspaces (made 0700; one that
    /// exists must be private already: corral never changes a directory
    /// it did not make). Default `None`:
    /// `$XDG_DATA_HOME/corral/workspaces`, else
    /// `~/.local/share/corral/workspaces` (see [`Config::persistence_root`]).
    pub persistence_root: Option<String>,
    /// `corral serve` and `corral mcp`.
    pub server: ServerConfig,
    /// The cluster, when `backend: kubernetes`.
    pub kubernetes: KubernetesConfig,
    /// Snapshots corral keeps itself (a sandbox's changes through its
    /// agent's stream).
    pub snapshots: SnapshotConfig,
}

/// Snapshots corral keeps itself: the changes of a sandbox that resets in
/// place, as its agent exports them (`corral_core::snapshot::SnapshotKind::Delta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotConfig {
    /// Largest snapshot of a sandbox's changes, in bytes (the archive its
    /// agent sends, held in corral's memory until deleted, and taken in by
    /// every fork). Default 1073741824 (1 GiB); at least 1048576.
    pub max_bytes: u64,
    /// Directory of the durable ones (a file each, 0600 in a 0700
    /// directory; one that exists must be private already). Default `None`: `$XDG_DATA_HOME/corral/snapshots`, else
    /// `~/.local/share/corral/snapshots` (see [`Config::snapshot_dir`]).
    pub dir: Option<String>,
    /// Forks read a delta written once to a file on the host, linked for
    /// each import into a directory the importing sandbox mounts read-only
    /// (its agent alone reaches it), rather than each fork getting the
    /// bytes over its own stream. Only with an engine on this host (a local
    /// socket, corral not itself in a container). Default true.
    pub share: bool,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            max_bytes: 1 << 30,
            dir: None,
            share: true,
        }
    }
}

impl SnapshotConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_bytes < 1 << 20 {
            return Err(ConfigError::invalid(
                "snapshots.max_bytes",
                self.max_bytes.to_string(),
                "at least 1048576 (1 MiB)",
            ));
        }
        if let Some(dir) = &self.dir {
            if !Path::new(dir).is_absolute() {
                return Err(ConfigError::invalid(
                    "snapshots.dir",
                    dir,
                    "must be an absolute path",
                ));
            }
        }
        Ok(())
    }
}

/// How to reach a Kubernetes cluster and how hard to lean on its API
/// server (`backend: kubernetes`). The rate-limit defaults are derived in
/// `docs/book/src/kubernetes-scale.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// Namespace of the sandboxes' pods. Default `None`: the kubeconfig
    /// context's namespace, else `default` (in a pod: its own namespace).
    pub namespace: Option<String>,
    /// The kubeconfig file (an absolute path). Default `None`:
    /// `$KUBECONFIG`, then `~/.kube/config`, then the in-cluster service
    /// account.
    pub kubeconfig: Option<String>,
    /// The kubeconfig context. Default `None`: its current context.
    pub context: Option<String>,
    /// The image of the init container that puts the agent into each pod.
    /// Default `None`: `corral-agent:<corral's version>`, as
    /// `scripts/build-agent-image.sh` builds it.
    pub agent_image: Option<String>,
    /// Pod creations and port-forwards per second, on average, across
    /// this process (a client-side token bucket). Default 10.
    pub qps: f64,
    /// Creations and port-forwards allowed at once above `qps` after a quiet
    /// spell. Default 20.
    pub burst: u32,
    /// Longest wait for a created pod to run (scheduling, image pulls,
    /// the init container), in ms. Default 300000.
    pub start_timeout_ms: u64,
    /// How corral reaches each pod's agent. Default `auto`.
    pub control: ControlPath,
    /// The TCP port the agent listens on in each pod. Default 7150.
    pub agent_port: u16,
    /// Longest wait for a direct connection to an agent, in ms (then
    /// `auto` falls back to port-forwarding). Default 3000.
    pub connect_timeout_ms: u64,
    /// Addresses (CIDRs, e.g. `10.0.0.0/8`) besides corral's own pods
    /// (label `app.kubernetes.io/name: corral`) that the sandboxes' network
    /// policy lets reach them (the agent port, and servers' ports through
    /// `open_port`): where corral runs outside the cluster. Default none.
    pub controller_cidrs: Vec<String>,
    /// How long this process's Lease (`coordination.k8s.io`) lasts
    /// unrenewed, in seconds; it is renewed every third of that. A corral
    /// on any host judges a pod's owner gone, and `gc` removes the pod,
    /// once its Lease has not been renewed for this long (plus 10 s for
    /// clocks that disagree). Default 60; 10 to 3600.
    pub lease_duration_seconds: u32,
    /// Size of a persistent session's volume (a PersistentVolumeClaim
    /// holding its workspace and home), in bytes; read when the claim is
    /// made, so a change applies to new sessions. Default 1073741824
    /// (1 GiB); at least 1048576.
    pub session_volume_size: u64,
    /// StorageClass of persistent sessions' claims. Default `None`: the
    /// cluster's default class.
    pub session_storage_class: Option<String>,
    /// The resolvers (IPv4 addresses, at most 3) the egress gateways of
    /// sandboxes with `network: {egress: ...}` look allowed names up
    /// with. Default none: the cluster's DNS (the gateway pod's
    /// `ClusterFirst`).
    pub egress_nameservers: Vec<String>,
    /// Run sandboxes with an egress policy even on a cluster whose network
    /// plugin does not enforce NetworkPolicy (corral probes it before the
    /// first such sandbox, as `doctor` does). There only the gateway's DNS
    /// answers stand between a sandbox and the network: nothing stops it
    /// connecting to an address directly. Default false: such a start is
    /// refused, naming `network.egress`.
    pub accept_unenforced_egress: bool,
    /// The AppArmor profile of a pristine sandbox's container
    /// (`appArmorProfile`), which must let its agent mount: `unconfined`,
    /// or `localhost/NAME` (a profile loaded on every node). Default
    /// `None`: the runtime's default profile, which on nodes with AppArmor
    /// denies every mount, so such sandboxes reset by replacing the pod and
    /// say why. Commands of such a sandbox still run under the agent's
    /// seccomp filter, without its extra capabilities.
    pub pristine_apparmor_profile: Option<String>,
    /// The RuntimeClass of `isolation: gvisor` sandboxes' pods (the
    /// cluster's gVisor handler). Default `gvisor`.
    pub runtime_class: String,
}

/// How corral reaches the agent in a pod. Either way the connection must
/// pass the agent's handshake with the sandbox's secret.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlPath {
    /// Directly to the pod's IP on the pod network; when that cannot be
    /// reached within `connect_timeout_ms`, through the API server's
    /// port-forward.
    #[default]
    Auto,
    /// Directly to the pod's IP only (the API server is never in the data
    /// path).
    Direct,
    /// Through the API server's port-forward only (for a corral that
    /// cannot reach the pod network).
    PortForward,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            namespace: None,
            kubeconfig: None,
            context: None,
            agent_image: None,
            qps: 10.0,
            burst: 20,
            start_timeout_ms: 300_000,
            control: ControlPath::Auto,
            agent_port: 7150,
            connect_timeout_ms: 3_000,
            controller_cidrs: Vec::new(),
            lease_duration_seconds: 60,
            session_volume_size: 1 << 30,
            session_storage_class: None,
            egress_nameservers: Vec::new(),
            accept_unenforced_egress: false,
            pristine_apparmor_profile: None,
            runtime_class: "gvisor".into(),
        }
    }
}

impl KubernetesConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(ns) = &self.namespace {
            if !is_dns_label(ns) {
                return Err(ConfigError::invalid(
                    "kubernetes.namespace",
                    ns,
                    "a namespace is at most 63 lowercase letters, digits and '-', \
                     starting and ending with a letter or digit",
                ));
            }
        }
        if let Some(file) = &self.kubeconfig {
            if !Path::new(file).is_absolute() {
                return Err(ConfigError::invalid(
                    "kubernetes.kubeconfig",
                    file,
                    "must be an absolute path",
                ));
            }
        }
        if let Some(ctx) = &self.context {
            if ctx.trim().is_empty() {
                return Err(ConfigError::invalid(
                    "kubernetes.context",
                    ctx,
                    "empty; leave it out for the kubeconfig's current context",
                ));
            }
        }
        if let Some(image) = &self.agent_image {
            if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    "kubernetes.agent_image",
                    image,
                    "expected an image reference, e.g. registry.example/corral-agent:0.1.0",
                ));
            }
        }
        if !(self.qps.is_finite() && self.qps > 0.0) {
            return Err(ConfigError::invalid(
                "kubernetes.qps",
                self.qps,
                "must be above zero",
            ));
        }
        if self.burst == 0 {
            return Err(ConfigError::invalid("kubernetes.burst", 0, "at least 1"));
        }
        if self.start_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "kubernetes.start_timeout_ms",
                0,
                "at least 1",
            ));
        }
        if self.agent_port == 0 {
            return Err(ConfigError::invalid(
                "kubernetes.agent_port",
                0,
                "a TCP port from 1 to 65535",
            ));
        }
        if self.connect_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "kubernetes.connect_timeout_ms",
                0,
                "at least 1",
            ));
        }
        for (i, cidr) in self.controller_cidrs.iter().enumerate() {
            if !is_cidr(cidr) {
                return Err(ConfigError::invalid(
                    format!("kubernetes.controller_cidrs[{i}]"),
                    cidr,
                    "expected an address block like 10.0.0.0/8 or fd00::/8",
                ));
            }
        }
        if !(10..=3600).contains(&self.lease_duration_seconds) {
            return Err(ConfigError::invalid(
                "kubernetes.lease_duration_seconds",
                self.lease_duration_seconds,
                "from 10 to 3600: shorter leases are renewed too often to survive a slow API \
                 server, longer ones keep orphans for too long",
            ));
        }
        if self.session_volume_size < 1 << 20 {
            return Err(ConfigError::invalid(
                "kubernetes.session_volume_size",
                self.session_volume_size,
                "at least 1048576 (1 MiB), in bytes",
            ));
        }
        if let Some(class) = &self.session_storage_class {
            if !(class.len() <= 253 && class.split('.').all(is_dns_label)) {
                return Err(ConfigError::invalid(
                    "kubernetes.session_storage_class",
                    class,
                    "a StorageClass name is an RFC 1123 subdomain (lowercase letters, digits, \
                     '-' and '.'); leave it out for the cluster's default class",
                ));
            }
        }
        if self.egress_nameservers.len() > 3 {
            return Err(ConfigError::invalid(
                "kubernetes.egress_nameservers",
                self.egress_nameservers.join(","),
                "at most 3 (a pod's dnsConfig takes no more)",
            ));
        }
        for (i, ns) in self.egress_nameservers.iter().enumerate() {
            if ns.parse::<std::net::Ipv4Addr>().is_err() {
                return Err(ConfigError::invalid(
                    format!("kubernetes.egress_nameservers[{i}]"),
                    ns,
                    "expected an IPv4 address such as 10.96.0.10",
                ));
            }
        }
        let class = &self.runtime_class;
        if class.is_empty()
            || class.len() > 253
            || !class
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
        {
            return Err(ConfigError::invalid(
                "kubernetes.runtime_class",
                class,
                "a RuntimeClass name: lowercase letters, digits, '-' and '.'",
            ));
        }
        if let Some(profile) = &self.pristine_apparmor_profile {
            let ok = profile == "unconfined"
                || profile.strip_prefix("localhost/").is_some_and(|name| {
                    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c == '/')
                });
            if !ok {
                return Err(ConfigError::invalid(
                    "kubernetes.pristine_apparmor_profile",
                    profile,
                    "unconfined, or localhost/NAME for a profile loaded on the nodes; leave it \
                     out for the runtime's default profile",
                ));
            }
        }
        Ok(())
    }
}

/// An IPv4 or IPv6 address block: `ADDRESS/PREFIX`.
fn is_cidr(cidr: &str) -> bool {
    let Some((addr, prefix)) = cidr.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// `server.ports_domain`, read: the wildcard domain under which each port
/// link has a host name of its own (`PORT-SANDBOXID.DOMAIN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortsDomain {
    /// `http` or `https`: the scheme links are written with.
    pub scheme: &'static str,
    /// The domain, lower case, e.g. `localhost` or `ports.example.com`.
    pub domain: String,
    /// The port links name: `None` with a scheme and no port (the
    /// scheme's own); with a bare domain, the port-link listener's
    /// (filled in by the service, so `None` here too).
    pub port: Option<u16>,
    /// Whether the value named a scheme (a proxy in front decides the
    /// port), or was a bare domain (the listener's port is the links').
    pub behind_proxy: bool,
}

impl PortsDomain {
    /// What links are named under without `server.ports_domain`:
    /// `localhost`, whose every subdomain browsers resolve to loopback.
    pub fn localhost() -> PortsDomain {
        PortsDomain {
            scheme: "http",
            domain: "localhost".into(),
            port: None,
            behind_proxy: false,
        }
    }

    /// Reads `DOMAIN`, `http://DOMAIN[:PORT]` or `https://DOMAIN[:PORT]`;
    /// the error says what is wrong with it.
    pub fn parse(value: &str) -> Result<PortsDomain, String> {
        let v = value.trim();
        let (scheme, rest) = match v.split_once("://") {
            Some(("http", rest)) => (Some("http"), rest),
            Some(("https", rest)) => (Some("https"), rest),
            Some((other, _)) => {
                return Err(format!(
                    "scheme '{other}' is not http or https (e.g. ports.example.com or \
                     https://ports.example.com)"
                ))
            }
            None => (None, v),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (domain, port) = match rest.rsplit_once(':') {
            Some((d, p)) => match p.parse::<u16>() {
                Ok(port) if port > 0 && scheme.is_some() => (d, Some(port)),
                _ if scheme.is_none() => {
                    return Err(
                        "a bare domain takes no port (the port-link listener's is used); \
                         write http://DOMAIN:PORT for another"
                            .into(),
                    )
                }
                _ => return Err(format!("port '{p}' is not a port (1 to 65535)")),
            },
            None => (rest, None),
        };
        if domain.is_empty() || domain.len() > 200 {
            return Err("must name a domain, e.g. ports.example.com".into());
        }
        for label in domain.split('.') {
            let ok = !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return Err(format!(
                    "'{label}' is not a DNS label (lower-case letters, digits and '-', 1 to 63 \
                     characters, no path)"
                ));
            }
        }
        Ok(PortsDomain {
            scheme: scheme.unwrap_or("http"),
            domain: domain.to_string(),
            port,
            behind_proxy: scheme.is_some(),
        })
    }
}

/// The service's settings (`corral serve`, `corral mcp`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// TCP address to listen on. Default `127.0.0.1:7070` (loopback only).
    pub listen: String,
    /// Also listen on this Unix socket (absolute path; made 0600). Default
    /// `None`.
    pub unix_socket: Option<String>,
    /// How requests are authenticated: `token` (default) or `none`.
    pub auth: AuthMode,
    /// Bearer token every request must carry (`Authorization: Bearer
    /// TOKEN`). Required when `listen` is not a loopback address. Default
    /// `None`: with `auth: token`, `corral serve` generates one at start
    /// and writes it to a file in `runtime_dir` for local clients.
    pub token: Option<String>,
    /// Bearer token that makes a request the operator's: it may see and
    /// act on every tenant's sandboxes and snapshots, as the CLI on the
    /// host does. Default `None`: over HTTP only the owner of
    /// `unix_socket` is the operator.
    pub admin_token: Option<String>,
    /// Tenants besides `default` (whose token is `token`), by name: each
    /// has its own token, sandboxes, session keys and snapshots, and
    /// quotas. `default` may be listed without a token to give it quotas.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The operator's snapshots (by name) every tenant may see and fork,
    /// read-only. Default none: a tenant sees only its own.
    pub shared_snapshots: Vec<String>,
    /// The operator's snapshots (by name) every MCP session may restore,
    /// read-only. Default none: a session sees only the snapshots it took.
    pub mcp_snapshots: Vec<String>,
    /// Directory (made 0700) of the files that hand a generated token to
    /// local clients, one per listen address, removed at shutdown. One
    /// that exists must be private already (this user's, no group or other
    /// access), else the service refuses to start, naming it: a shared
    /// directory such as `/tmp` is never changed. Default `None`:
    /// `$XDG_RUNTIME_DIR/corral/servers`, else
    /// `~/.local/share/corral/runtime` (see [`Config::runtime_dir`]).
    pub runtime_dir: Option<String>,
    /// Browser origins (`scheme://host[:port]`) whose requests are
    /// accepted; a request from any other origin is refused (403). Default
    /// none: no web page may call the service.
    pub allowed_origins: Vec<String>,
    /// `Host` header values (`name` or `name:port`) accepted besides the
    /// listen address itself (and, on loopback, `localhost`, `127.0.0.1`
    /// and `[::1]` with the listen port). Default none.
    pub allowed_hosts: Vec<String>,
    /// On shutdown, how long in-flight requests may take before they are
    /// cancelled, in ms. Default 10000.
    pub shutdown_grace_ms: u64,
    /// Largest request body (file uploads included), in bytes. Default
    /// 67108864 (64 MiB).
    pub max_body_bytes: u64,
    /// Profile of the sandbox each MCP session gets; `None`: `defaults`.
    pub mcp_profile: Option<String>,
    /// TCP address of the E2B-compatible listener (the control plane and
    /// the in-sandbox `envd` protocol the `e2b` SDK speaks, on one
    /// address). Default `None`: not served.
    pub e2b_listen: Option<String>,
    /// TCP address of the listener that serves port links and nothing
    /// else. Default `None`: the IP of `listen`, a free port.
    pub ports_listen: Option<String>,
    /// The wildcard domain under which each port link gets a host name of
    /// its own, `PORT-SANDBOXID.DOMAIN` (E2B's addressing), so every link
    /// is an origin of its own: `DOMAIN` (links are
    /// `http://PORT-ID.DOMAIN:LISTENPORT/TOKEN/`), or `http://DOMAIN[:PORT]`
    /// / `https://DOMAIN[:PORT]` for a TLS proxy in front (links use that
    /// scheme and port). Default `None`: `localhost`, which browsers
    /// resolve with every subdomain to loopback (links work in a browser
    /// on this machine).
    pub ports_domain: Option<String>,
    /// What API clients may ask for in a sandbox spec.
    pub policy: ClientPolicy,
    /// Ceilings on what one request may ask for, and the bytes all
    /// requests in flight may hold together.
    pub limits: ServerLimits,
    /// What `/metrics` reports about the sandboxes' usage.
    pub metrics: MetricsConfig,
}

/// Sandbox usage in `/metrics` (`server.metrics`). Label sets stay
/// bounded: per owner (tenants are configured) and profile, and the top
/// sandboxes by memory and CPU, at most `top_sandboxes` of each, whose
/// series are replaced at every sample (gone sandboxes vanish).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// How old the usage sample may be before a scrape takes a new one,
    /// in ms: every live sandbox's usage is read at most this often,
    /// however often `/metrics` is scraped (scrapes meanwhile get the
    /// last sample). 0: no usage metrics. Default 10000.
    pub usage_refresh_ms: u64,
    /// Sandboxes named in the top-memory and top-CPU series (label
    /// `sandbox`). 0: none. Default 10.
    pub top_sandboxes: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            usage_refresh_ms: 10_000,
            top_sandboxes: 10,
        }
    }
}

/// One tenant of the service (`server.tenants.NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// Its bearer token (required but for `default`, whose token is
    /// `server.token`); every token of the service must differ.
    pub token: Option<String>,
    /// Most live sandboxes at once (its MCP sessions' included); `None`:
    /// no limit beyond `provider.max_live`.
    pub max_sandboxes: Option<u64>,
    /// Most snapshots kept; `None`: no limit.
    pub max_snapshots: Option<u64>,
    /// Most bytes its snapshots hold beyond their base images; `None`: no
    /// limit.
    pub max_snapshot_bytes: Option<u64>,
}

impl TenantConfig {
    /// Its quotas.
    pub fn quota(&self) -> crate::principal::Quota {
        crate::principal::Quota {
            max_sandboxes: self.max_sandboxes,
            max_snapshots: self.max_snapshots,
            max_snapshot_bytes: self.max_snapshot_bytes,
        }
    }
}

/// Which engine runs sandboxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The Docker Engine API (Docker, or Podman's compatible socket).
    #[default]
    Docker,
    /// A Kubernetes cluster: a sandbox is a pod (`kubernetes:` section).
    Kubernetes,
}

/// How the service authenticates requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// A bearer token on every request but `/v1/health` (on the Unix
    /// socket, a connection from the socket's owner needs none).
    #[default]
    Token,
    /// No authentication at all: any process that can connect may create
    /// sandboxes. Loopback only, and logged as a warning at start.
    None,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7070".into(),
            unix_socket: None,
            auth: AuthMode::Token,
            token: None,
            admin_token: None,
            tenants: BTreeMap::new(),
            shared_snapshots: Vec::new(),
            mcp_snapshots: Vec::new(),
            runtime_dir: None,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            shutdown_grace_ms: 10_000,
            max_body_bytes: 64 << 20,
            mcp_profile: None,
            e2b_listen: None,
            ports_listen: None,
            ports_domain: None,
            policy: ClientPolicy::default(),
            limits: ServerLimits::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl ServerConfig {
    /// Every TCP listener the service opens, as its key and its address as
    /// configured (`server.ports_listen` left out takes `listen`'s IP).
    pub fn tcp_listeners(&self) -> Vec<(&'static str, &str)> {
        let mut all = vec![("server.listen", self.listen.as_str())];
        if let Some(a) = &self.e2b_listen {
            all.push(("server.e2b_listen", a.as_str()));
        }
        if let Some(a) = &self.ports_listen {
            all.push(("server.ports_listen", a.as_str()));
        }
        all
    }

    /// `auth: none` on loopback only, for every listener: the one place
    /// this is decided (`validate`, and `corral serve` before it binds
    /// anything). A listener beyond loopback without authentication lets
    /// anyone who reaches it create sandboxes and run code.
    pub fn check_unauthenticated_reach(&self) -> Result<(), ConfigError> {
        if self.auth != AuthMode::None {
            return Ok(());
        }
        for (key, addr) in self.tcp_listeners() {
            let loopback = addr
                .trim()
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback());
            if !loopback {
                return Err(ConfigError::invalid(
                    key,
                    addr,
                    "server.auth is none, and a listener without authentication is allowed on \
                     loopback only (127.0.0.1 or [::1]): anyone who reaches it could create \
                     sandboxes and run code; listen on loopback or set server.auth: token",
                ));
            }
        }
        Ok(())
    }

    fn validate(&self, profiles: &BTreeMap<String, SandboxSpec>) -> Result<(), ConfigError> {
        let addr: std::net::SocketAddr = self.listen.trim().parse().map_err(|_| {
            ConfigError::invalid(
                "server.listen",
                &self.listen,
                "expected IP:PORT, e.g. 127.0.0.1:7070",
            )
        })?;
        if let Some(token) = &self.token {
            if token.trim().is_empty() || token.chars().any(|c| c.is_whitespace()) {
                return Err(ConfigError::invalid(
                    "server.token",
                    "(hidden)",
                    "must be non-empty and without whitespace",
                ));
            }
            if self.auth == AuthMode::None {
                return Err(ConfigError::invalid(
                    "server.auth",
                    "none",
                    "contradicts server.token (or CORRAL_TOKEN): remove one",
                ));
            }
        } else if !addr.ip().is_loopback() && !self.has_tokens() {
            return Err(ConfigError::invalid(
                "server.listen",
                &self.listen,
                "listening beyond loopback needs server.token (or CORRAL_TOKEN)",
            ));
        }
        self.validate_tenants()?;
        if let Some(dir) = &self.runtime_dir {
            if !Path::new(dir).is_absolute() {
                return Err(ConfigError::invalid(
                    "server.runtime_dir",
                    dir,
                    "must be an absolute path",
                ));
            }
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            if !valid_origin(origin) {
                return Err(ConfigError::invalid(
                    format!("server.allowed_origins[{i}]"),
                    origin,
                    "expected scheme://host[:port] as a browser sends it, e.g. \
                     http://localhost:3000 (no path, no wildcard)",
                ));
            }
        }
        for (i, host) in self.allowed_hosts.iter().enumerate() {
            if host.is_empty()
                || host.contains(|c: char| c.is_whitespace() || matches!(c, '/' | '*' | '@'))
            {
                return Err(ConfigError::invalid(
                    format!("server.allowed_hosts[{i}]"),
                    host,
                    "expected a host name or host:port, e.g. corral.internal:7070",
                ));
            }
        }
        if let Some(sock) = &self.unix_socket {
            if !Path::new(sock).is_absolute() {
                return Err(ConfigError::invalid(
                    "server.unix_socket",
                    sock,
                    "must be an absolute path",
                ));
            }
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "server.max_body_bytes",
                0,
                "at least 1",
            ));
        }
        if let Some(e2b) = &self.e2b_listen {
            if e2b.trim().parse::<std::net::SocketAddr>().is_err() {
                return Err(ConfigError::invalid(
                    "server.e2b_listen",
                    e2b,
                    "must be an IP address and port, e.g. 127.0.0.1:49983",
                ));
            }
        }
        if let Some(ports) = &self.ports_listen {
            let parsed = ports.trim().parse::<std::net::SocketAddr>().map_err(|_| {
                ConfigError::invalid(
                    "server.ports_listen",
                    ports,
                    "must be an IP address and port, e.g. 127.0.0.1:7071 (port 0: a free one)",
                )
            })?;
            if parsed.port() != 0 && parsed == addr {
                return Err(ConfigError::invalid(
                    "server.ports_listen",
                    ports,
                    "must differ from server.listen: port links get an origin of their own",
                ));
            }
        }
        if let Some(domain) = &self.ports_domain {
            PortsDomain::parse(domain)
                .map_err(|why| ConfigError::invalid("server.ports_domain", domain, why))?;
        }
        self.check_unauthenticated_reach()?;
        if let Some(p) = &self.mcp_profile {
            if !profiles.contains_key(p) {
                let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
                return Err(ConfigError::invalid(
                    "server.mcp_profile",
                    p,
                    format!("no such profile (known: {})", known.join(", ")),
                ));
            }
        }
        self.limits.validate(self.max_body_bytes).map_err(|e| {
            ConfigError::invalid(format!("server.limits.{}", e.key), e.value, e.reason)
        })?;
        let m = &self.metrics;
        if m.usage_refresh_ms != 0 && m.usage_refresh_ms < 500 {
            return Err(ConfigError::invalid(
                "server.metrics.usage_refresh_ms",
                m.usage_refresh_ms,
                "0 (off) or at least 500",
            ));
        }
        if m.top_sandboxes > 1000 {
            return Err(ConfigError::invalid(
                "server.metrics.top_sandboxes",
                m.top_sandboxes,
                "at most 1000",
            ));
        }
        self.validate_policy()
    }

    /// Tenants, their tokens (each distinct from every other token of the
    /// service) and the shared snapshots' names.
    fn validate_tenants(&self) -> Result<(), ConfigError> {
        let bad_token = |t: &str| t.trim().is_empty() || t.chars().any(char::is_whitespace);
        let mut tokens: Vec<(String, &str)> = Vec::new();
        if let Some(t) = &self.token {
            tokens.push(("server.token".into(), t));
        }
        if let Some(t) = &self.admin_token {
            if bad_token(t) {
                return Err(ConfigError::invalid(
                    "server.admin_token",
                    "(hidden)",
                    "must be non-empty and without whitespace",
                ));
            }
            tokens.push(("server.admin_token".into(), t));
        }
        for (name, tenant) in &self.tenants {
            let path = format!("server.tenants.{name}");
            crate::principal::validate_tenant(name)
                .map_err(|reason| ConfigError::invalid("server.tenants", name, reason))?;
            match &tenant.token {
                Some(t) if bad_token(t) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.token"),
                        "(hidden)",
                        "must be non-empty and without whitespace",
                    ))
                }
                Some(_) if name == crate::principal::DEFAULT_TENANT && self.token.is_some() => {
                    return Err(ConfigError::invalid(
                        format!("{path}.token"),
                        "(hidden)",
                        "tenant default's token is server.token (or CORRAL_TOKEN): give one of the two",
                    ))
                }
                Some(t) => tokens.push((format!("{path}.token"), t)),
                None if name == crate::principal::DEFAULT_TENANT => {}
                None => {
                    return Err(ConfigError::invalid(
                        format!("{path}.token"),
                        "(none)",
                        "every tenant but default needs its own token",
                    ))
                }
            }
            for (key, v) in [
                ("max_sandboxes", tenant.max_sandboxes),
                ("max_snapshots", tenant.max_snapshots),
            ] {
                if v == Some(0) {
                    return Err(ConfigError::invalid(
                        format!("{path}.{key}"),
                        0,
                        "at least 1 (leave it out for no limit)",
                    ));
                }
            }
        }
        if (!self.tenants.is_empty() || self.admin_token.is_some()) && self.auth == AuthMode::None {
            return Err(ConfigError::invalid(
                "server.auth",
                "none",
                "tenants and an admin token need authentication: remove server.auth: none",
            ));
        }
        for (i, (path, t)) in tokens.iter().enumerate() {
            if let Some((other, _)) = tokens[..i].iter().find(|(_, u)| u == t) {
                return Err(ConfigError::invalid(
                    path.as_str(),
                    "(hidden)",
                    format!("the same token as {other}: every principal needs its own"),
                ));
            }
        }
        for (key, names) in [
            ("shared_snapshots", &self.shared_snapshots),
            ("mcp_snapshots", &self.mcp_snapshots),
        ] {
            for (i, name) in names.iter().enumerate() {
                crate::snapshot::validate_name(name).map_err(|e| {
                    ConfigError::invalid(format!("server.{key}[{i}]"), name, e.reason)
                })?;
            }
        }
        Ok(())
    }

    /// The principal a bearer token stands for, compared in constant time
    /// against every configured token.
    pub fn principal_of_token(&self, given: &str) -> Option<crate::principal::Principal> {
        use crate::principal::{Principal, DEFAULT_TENANT};
        let mut found = None;
        let mut consider = |token: Option<&String>, p: Principal| {
            if let Some(t) = token {
                if same_bytes(given.as_bytes(), t.as_bytes()) && found.is_none() {
                    found = Some(p);
                }
            }
        };
        consider(self.admin_token.as_ref(), Principal::Operator);
        consider(
            self.token.as_ref(),
            Principal::Tenant(DEFAULT_TENANT.to_string()),
        );
        for (name, tenant) in &self.tenants {
            consider(tenant.token.as_ref(), Principal::Tenant(name.clone()));
        }
        found
    }

    /// Whether any token is configured (else, with `auth: token`, every
    /// request is refused).
    pub fn has_tokens(&self) -> bool {
        self.token.is_some()
            || self.admin_token.is_some()
            || self.tenants.values().any(|t| t.token.is_some())
    }

    /// The quotas of `tenant` (none configured: no limits).
    pub fn quota(&self, tenant: &str) -> crate::principal::Quota {
        self.tenants
            .get(tenant)
            .map(TenantConfig::quota)
            .unwrap_or_default()
    }

    /// The operator's snapshots it shares read-only.
    pub fn sharing(&self) -> crate::principal::Sharing {
        crate::principal::Sharing {
            tenants: self.shared_snapshots.clone(),
            mcp: self.mcp_snapshots.clone(),
        }
    }

    fn validate_policy(&self) -> Result<(), ConfigError> {
        let p = &self.policy;
        for (i, image) in p.images.iter().enumerate() {
            if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    format!("server.policy.images[{i}]"),
                    image,
                    "expected an image reference, or a prefix ending in *",
                ));
            }
        }
        if p.max_memory < 6 << 20 {
            return Err(ConfigError::invalid(
                "server.policy.max_memory",
                p.max_memory,
                "at least 6291456 (Docker needs 6 MiB)",
            ));
        }
        if !(p.max_cpus.is_finite() && p.max_cpus > 0.0) {
            return Err(ConfigError::invalid(
                "server.policy.max_cpus",
                p.max_cpus,
                "must be above zero",
            ));
        }
        if p.max_pids < 8 {
            return Err(ConfigError::invalid(
                "server.policy.max_pids",
                p.max_pids,
                "at least 8",
            ));
        }
        if p.max_disk == Some(0) {
            return Err(ConfigError::invalid(
                "server.policy.max_disk",
                0,
                "must be above zero (null: no maximum)",
            ));
        }
        if let Some(allow) = &p.egress_allow {
            for (i, rule) in allow.iter().enumerate() {
                crate::egress::Rule::parse(&format!("server.policy.egress_allow[{i}]"), rule)
                    .map_err(|e| ConfigError::invalid(e.field, e.value, e.reason))?;
            }
        }
        Ok(())
    }
}

/// `scheme://host[:port]`, as browsers send in `Origin`.
fn valid_origin(origin: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !authority.is_empty()
        && !authority
            .contains(|c: char| c.is_whitespace() || matches!(c, '/' | '*' | '@' | '?' | '#'))
}

/// The backend's settings; defaults equal those of `corral-docker`'s
/// `BackendConfig::default()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Retries of transient daemon errors.
    pub retry: RetryPolicy,
    /// Container starts in flight at once (0: unlimited). Default 8.
    pub start_limit: usize,
    /// Daemon execs (agent attaches) in flight at once (0: unlimited).
    /// Default 16.
    pub exec_limit: usize,
    /// Share the two limits with every corral process of this user on the
    /// host through lock files in `slot_dir`. Default true.
    pub shared_slots: bool,
    /// Where the slot lock files live (an absolute path; made 0700 when
    /// missing, used as it is when it exists). Default `None`: the
    /// per-user default directory.
    pub slot_dir: Option<String>,
    /// Longest wait for a start or exec slot before failing, in ms.
    /// Default 600000 (10 minutes).
    pub slot_wait_timeout_ms: u64,
    /// Back-pressure on starts when the daemon's error rate or latency spikes.
    pub breaker: BreakerConfig,
    /// Remove orphaned containers (owner process gone) at connect.
    /// Default true.
    pub reap_orphans: bool,
    /// Then remove orphans again at this interval, in ms (0: only at
    /// connect). Default 300000 (5 minutes).
    pub reap_interval_ms: u64,
    /// Starts slower than this are logged with their phases, in ms.
    /// Default 5000.
    pub slow_start_ms: u64,
    /// Longest time one pull of a missing image may take, in ms; past it
    /// the start fails retryable (`daemon_unavailable`). Concurrent starts
    /// of one image share one pull. Default 600000 (10 minutes).
    pub pull_timeout_ms: u64,
    /// Pulls that may run at once; more queue (a pull holds no start
    /// slot). Default 2.
    pub pull_limit: usize,
    /// Registry credentials for pulls: a Docker client configuration file
    /// (`{"auths": {"HOST": {"auth": base64(user:password)}}}`, as
    /// `docker login` writes it without a credential helper), read at each
    /// pull; an absolute path. Clients never send credentials. Default
    /// `None`: pulls are anonymous.
    pub registry_auth_file: Option<String>,
    /// The file holding the user's secret key that seals persistent
    /// containers, so that only containers this user's corral made for a
    /// session are adopted (an absolute path; made 0600 when missing, refused
    /// when others may read it). Default `None`:
    /// `$XDG_DATA_HOME/corral/seal.key`, else `~/.local/share/corral/seal.key`.
    pub seal_key_file: Option<String>,
    /// The Docker network egress gateways (of sandboxes with `network:
    /// {egress: ...}`) reach out through and resolve names on. Default
    /// `None`: corral's own bridge network, `corral`.
    pub egress_network: Option<String>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            retry: RetryPolicy::default(),
            start_limit: 8,
            exec_limit: 16,
            shared_slots: true,
            slot_dir: None,
            slot_wait_timeout_ms: 600_000,
            breaker: BreakerConfig::default(),
            reap_orphans: true,
            reap_interval_ms: 300_000,
            slow_start_ms: 5_000,
            pull_timeout_ms: 600_000,
            pull_limit: 2,
            registry_auth_file: None,
            seal_key_file: None,
            egress_network: None,
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not YAML, a key is unknown or a value has the wrong type.
    #[error("{}{message}", prefix(path))]
    Parse {
        /// Key path of the offending value, e.g. `daemon.start_limit`; for an
        /// unknown key, the mapping holding it; empty for the document.
        path: String,
        /// What is wrong, naming the value or key and where it is.
        message: String,
        /// 1-based line of the offending text, when known.
        line: Option<usize>,
        /// 1-based column of the offending text, when known.
        column: Option<usize>,
    },
    /// A value parsed but is out of range or inconsistent.
    #[error("{path}: invalid value '{value}': {reason}")]
    Invalid {
        /// Key path, e.g. `profiles.python.limits.memory`.
        path: String,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// An environment variable override holds a bad value.
    #[error("environment variable {var}: invalid value '{value}': {reason}")]
    Env {
        /// The variable, e.g. `CORRAL_START_LIMIT`.
        var: String,
        /// Its value.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The configuration could not be written as YAML.
    #[error("cannot write the configuration as YAML: {0}")]
    Serialize(String),
}

/// Compares without an early exit on the first differing byte.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

impl ConfigError {
    /// The key path (or, for [`ConfigError::Env`], the variable) at fault.
    pub fn path(&self) -> &str {
        match self {
            ConfigError::Parse { path, .. } | ConfigError::Invalid { path, .. } => path,
            ConfigError::Env { var, .. } => var,
            ConfigError::Serialize(_) => "",
        }
    }

    fn invalid(path: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    fn env(var: &str, value: &str, reason: impl Into<String>) -> Self {
        ConfigError::Env {
            var: var.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    fn from_spec(base: &str, e: SpecError) -> Self {
        ConfigError::Invalid {
            path: format!("{base}.{}", e.field),
            value: e.value,
            reason: e.reason,
        }
    }
}

/// An RFC 1123 label, as Kubernetes requires of a namespace's name.
fn is_dns_label(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&name.len())
        && name.chars().all(|c| ok(c) || c == '-')
        && name.starts_with(ok)
        && name.ends_with(ok)
}

/// Names of profiles and pools are typed on command lines and shown in
/// logs: keep them to one plain word.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// An absolute path from a variable, ignoring empty and relative values as
/// the XDG base directory spec asks.
fn abs_var(host: &dyn HostView, name: &str) -> Option<PathBuf> {
    host.var(name)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// yaml_serde's message without its own path prefix (that of the value
/// being read when the error surfaced, `path` or a parent of it) and
/// location suffix, which [`Config::from_yaml`] puts back in one format.
fn clean_message(message: &str, path: &str) -> String {
    let mut message = message;
    if let Some(at) = message.rfind(" at line ") {
        let tail = &message[at + " at line ".len()..];
        if tail
            .split(" column ")
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            message = &message[..at];
        }
    }
    if let Some((head, rest)) = message.split_once(": ") {
        let is_parent = path == head
            || path
                .strip_prefix(head)
                .is_some_and(|r| r.starts_with('.') || r.starts_with('['));
        if is_parent {
            message = rest;
        }
    }
    // serde's words for the untagged enum say nothing a user can act on.
    if message.starts_with("data did not match any variant of untagged enum EnvVar") {
        return "expected {name: NAME, value: VALUE} or {forward: NAME}".to_string();
    }
    message.to_string()
}

impl Config {
    /// Parses a YAML document; an empty document is [`Config::default`].
    /// Does not validate: call [`Config::validate`] after any overrides.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        // A file of only comments is a valid, empty configuration, but YAML
        // reads it as no document at all.
        if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            return Ok(Config::default());
        }
        // Syntax first, on its own: the typed pass below streams, so it
        // would report a type error above a syntax error, and name a
        // syntax error by a half-read path.
        if let Err(e) = yaml_serde::from_str::<yaml_serde::Value>(text) {
            let location = e.location();
            return Err(ConfigError::Parse {
                path: String::new(),
                message: e.to_string(),
                line: location.as_ref().map(|l| l.line()),
                column: location.as_ref().map(|l| l.column()),
            });
        }
        let de = yaml_serde::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            let inner = e.into_inner();
            let location = inner.location();
            let mut message = clean_message(&inner.to_string(), &path);
            if let Some(l) = &location {
                message = format!("{message} at line {} column {}", l.line(), l.column());
            }
            ConfigError::Parse {
                path,
                message,
                line: location.as_ref().map(|l| l.line()),
                column: location.as_ref().map(|l| l.column()),
            }
        })
    }

    /// The configuration as YAML, as `corral config show` prints it.
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        yaml_serde::to_string(self).map_err(|e| ConfigError::Serialize(e.to_string()))
    }

    /// The file read when none is named: `$XDG_CONFIG_HOME/corral/config.yaml`,
    /// else `~/.config/corral/config.yaml`; `None` when neither variable is
    /// usable. The caller decides whether it exists.
    pub fn default_path(host: &dyn HostView) -> Option<PathBuf> {
        abs_var(host, "XDG_CONFIG_HOME")
            .or_else(|| abs_var(host, "HOME").map(|h| h.join(".config")))
            .map(|dir| dir.join("corral").join("config.yaml"))
    }

    /// Where persistent workspaces live: `persistence_root` when set, else
    /// `$XDG_DATA_HOME/corral/workspaces`, else
    /// `~/.local/share/corral/workspaces`, else (no usable `HOME`)
    /// `/var/lib/corral/workspaces`.
    pub fn persistence_root(&self, host: &dyn HostView) -> PathBuf {
        if let Some(root) = &self.persistence_root {
            return PathBuf::from(root);
        }
        abs_var(host, "XDG_DATA_HOME")
            .or_else(|| abs_var(host, "HOME").map(|h| h.join(".local").join("share")))
            .map(|dir| dir.join("corral").join("workspaces"))
            .unwrap_or_else(|| PathBuf::from("/var/lib/corral/workspaces"))
    }

    /// Where durable snapshots corral keeps itself go: `snapshots.dir` when
    /// set, else `$XDG_DATA_HOME/corral/snapshots`, else
    /// `~/.local/share/corral/snapshots`, else `/var/lib/corral/snapshots`.
    pub fn snapshot_dir(&self, host: &dyn HostView) -> PathBuf {
        if let Some(dir) = &self.snapshots.dir {
            return PathBuf::from(dir);
        }
        abs_var(host, "XDG_DATA_HOME")
            .or_else(|| abs_var(host, "HOME").map(|h| h.join(".local").join("share")))
            .map(|dir| dir.join("corral").join("snapshots"))
            .unwrap_or_else(|| PathBuf::from("/var/lib/corral/snapshots"))
    }

    /// Where `corral serve` writes the files that hand its generated token
    /// to local clients: `server.runtime_dir` when set, else
    /// `$XDG_RUNTIME_DIR/corral/servers`, else
    /// `~/.local/share/corral/runtime`, else (no usable `HOME`)
    /// `/var/lib/corral/runtime`. The Python client looks in the same place.
    pub fn runtime_dir(&self, host: &dyn HostView) -> PathBuf {
        if let Some(dir) = &self.server.runtime_dir {
            return PathBuf::from(dir);
        }
        abs_var(host, "XDG_RUNTIME_DIR")
            .map(|dir| dir.join("corral").join("servers"))
            .or_else(|| {
                abs_var(host, "HOME").map(|h| {
                    h.join(".local")
                        .join("share")
                        .join("corral")
                        .join("runtime")
                })
            })
            .unwrap_or_else(|| PathBuf::from("/var/lib/corral/runtime"))
    }

    /// Applies the [`ENV_OVERRIDES`] found by `vars`; a bad value is an
    /// error naming the variable and the value. Empty values are ignored.
    pub fn apply_env(&mut self, vars: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let get = |name: &str| vars(name).filter(|v| !v.trim().is_empty());
        let count = |name: &str, value: &str| {
            value.trim().parse::<usize>().map_err(|_| {
                ConfigError::env(name, value, "expected a whole number (0: unlimited)")
            })
        };
        if let Some(v) = get("CORRAL_ENDPOINT") {
            self.endpoint = Some(v);
        }
        if let Some(v) = get("CORRAL_START_LIMIT") {
            self.daemon.start_limit = count("CORRAL_START_LIMIT", &v)?;
        }
        if let Some(v) = get("CORRAL_EXEC_LIMIT") {
            self.daemon.exec_limit = count("CORRAL_EXEC_LIMIT", &v)?;
        }
        if let Some(v) = get("CORRAL_IMAGE") {
            self.defaults.image = v;
        }
        if let Some(v) = get("CORRAL_RECOVERY") {
            self.defaults.recovery = Recovery::parse(v.trim()).ok_or_else(|| {
                ConfigError::env("CORRAL_RECOVERY", &v, "expected fail or recreate")
            })?;
        }
        if let Some(v) = get("CORRAL_MAX_LIVE") {
            self.provider.max_live = count("CORRAL_MAX_LIVE", &v)?;
        }
        if let Some(v) = get("CORRAL_PERSISTENCE_ROOT") {
            if !Path::new(&v).is_absolute() {
                return Err(ConfigError::env(
                    "CORRAL_PERSISTENCE_ROOT",
                    &v,
                    "must be an absolute path",
                ));
            }
            self.persistence_root = Some(v);
        }
        if let Some(v) = get("CORRAL_LISTEN") {
            self.server.listen = v.trim().to_string();
        }
        if let Some(v) = get("CORRAL_TOKEN") {
            self.server.token = Some(v.trim().to_string());
        }
        if let Some(v) = get("CORRAL_RUNTIME_DIR") {
            if !Path::new(&v).is_absolute() {
                return Err(ConfigError::env(
                    "CORRAL_RUNTIME_DIR",
                    &v,
                    "must be an absolute path",
                ));
            }
            self.server.runtime_dir = Some(v);
        }
        Ok(())
    }

    /// The spec named `profile`, or an error naming it and the known ones.
    pub fn profile(&self, profile: &str) -> Result<&SandboxSpec, ConfigError> {
        self.profiles.get(profile).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
            ConfigError::invalid(
                "profiles",
                profile,
                if known.is_empty() {
                    "no such profile: the configuration defines none".to_string()
                } else {
                    format!("no such profile: known profiles are {}", known.join(", "))
                },
            )
        })
    }

    /// Checks ranges and every sandbox spec (mount paths and forwarded
    /// variables against `host`); the first bad value is returned, named by
    /// its key path.
    pub fn validate(&self, host: &dyn HostView) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            if endpoint.trim().is_empty() {
                return Err(ConfigError::invalid(
                    "endpoint",
                    endpoint,
                    "empty; leave it out to try DOCKER_HOST and the default sockets",
                ));
            }
        }
        self.daemon.validate()?;
        self.snapshots.validate()?;
        check_spec("defaults", &self.defaults, host, true)?;
        for (name, spec) in &self.profiles {
            if !valid_name(name) {
                return Err(ConfigError::invalid(
                    "profiles",
                    name,
                    "a profile name is letters, digits, '.', '_' and '-'",
                ));
            }
            check_spec(&format!("profiles.{name}"), spec, host, true)?;
        }
        self.validate_provider(host)?;
        if let Some(root) = &self.persistence_root {
            if !Path::new(root).is_absolute() {
                return Err(ConfigError::invalid(
                    "persistence_root",
                    root,
                    "must be an absolute path",
                ));
            }
        }
        self.server.validate(&self.profiles)?;
        self.kubernetes.validate()?;
        Ok(())
    }

    fn validate_provider(&self, host: &dyn HostView) -> Result<(), ConfigError> {
        let p = &self.provider;
        let mut warm_total = 0usize;
        for (name, pool) in &p.pools {
            let base = format!("provider.pools.{name}");
            if !valid_name(name) {
                return Err(ConfigError::invalid(
                    "provider.pools",
                    name,
                    "a pool name is letters, digits, '.', '_' and '-'",
                ));
            }
            // A pool has no front end to fill in an image for it.
            check_spec(&format!("{base}.spec"), &pool.spec, host, false)?;
            warm_total = warm_total.saturating_add(pool.warm);
            if p.max_live > 0 && warm_total > p.max_live {
                return Err(ConfigError::invalid(
                    format!("{base}.warm"),
                    pool.warm,
                    format!(
                        "the pools' warm targets add up to {warm_total}, above provider.max_live {}",
                        p.max_live
                    ),
                ));
            }
            for (i, cmd) in pool.reset.iter().enumerate() {
                if cmd.trim().is_empty() {
                    return Err(ConfigError::invalid(
                        format!("{base}.reset[{i}]"),
                        cmd,
                        "an empty command",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl DaemonConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.retry.attempts == 0 {
            return Err(ConfigError::invalid(
                "daemon.retry.attempts",
                0,
                "at least 1 (1 disables retrying)",
            ));
        }
        if self.pull_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "daemon.pull_timeout_ms",
                0,
                "at least 1 (every pull would time out)",
            ));
        }
        if let Some(dir) = &self.slot_dir {
            if !Path::new(dir).is_absolute() {
                return Err(ConfigError::invalid(
                    "daemon.slot_dir",
                    dir,
                    "must be an absolute path",
                ));
            }
        }
        if self.pull_limit == 0 {
            return Err(ConfigError::invalid(
                "daemon.pull_limit",
                0,
                "at least 1 (no pull could ever run)",
            ));
        }
        if let Some(file) = &self.registry_auth_file {
            if !Path::new(file).is_absolute() {
                return Err(ConfigError::invalid(
                    "daemon.registry_auth_file",
                    file,
                    "must be an absolute path",
                ));
            }
        }
        if let Some(file) = &self.seal_key_file {
            if !Path::new(file).is_absolute() {
                return Err(ConfigError::invalid(
                    "daemon.seal_key_file",
                    file,
                    "must be an absolute path",
                ));
            }
        }
        let b = &self.breaker;
        // A rate of 0 would open the breaker on a window with no error at all.
        if !(b.error_rate.is_finite() && b.error_rate > 0.0 && b.error_rate <= 1.0) {
            return Err(ConfigError::invalid(
                "daemon.breaker.error_rate",
                b.error_rate,
                "a fraction above 0 and at most 1",
            ));
        }
        if b.window == 0 {
            return Err(ConfigError::invalid(
                "daemon.breaker.window",
                0,
                "at least 1",
            ));
        }
        // The window never holds more than `window` outcomes, so a larger
        // minimum would silently keep the breaker closed forever.
        if b.min_samples > b.window {
            return Err(ConfigError::invalid(
                "daemon.breaker.min_samples",
                b.min_samples,
                format!("at most daemon.breaker.window ({})", b.window),
            ));
        }
        Ok(())
    }
}

/// Validates `spec` with its errors prefixed by `base`; with `image_optional`
/// an empty image stands for the front end's default and is not an error.
fn check_spec(
    base: &str,
    spec: &SandboxSpec,
    host: &dyn HostView,
    image_optional: bool,
) -> Result<(), ConfigError> {
    let result = if image_optional && spec.image.is_empty() {
        let mut with_image = spec.clone();
        with_image.image = "default-image".to_string();
        with_image.validate(host)
    } else {
        spec.validate(host)
    };
    result.map_err(|e| ConfigError::from_spec(base, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_egress_allow_rule_is_named() {
        let mut c = Config::default();
        c.server.policy.egress_allow = Some(vec!["*.test".into(), "pypi.test:http".into()]);
        let e = c.validate(&FakeHost).expect_err("bad rule");
        let text = e.to_string();
        assert!(text.contains("server.policy.egress_allow[1]"), "{text}");
        assert!(text.contains("pypi.test:http"), "{text}");
    }
    use crate::spec::EnvVar;
    use crate::spec::Network;

    struct FakeHost;
    impl HostView for FakeHost {
        fn var(&self, name: &str) -> Option<String> {
            match name {
                "HOME" => Some("/home/ada".into()),
                _ => None,
            }
        }
        fn path_exists(&self, path: &str) -> bool {
            path == "/srv/data"
        }
    }

    fn parse_err(text: &str) -> ConfigError {
        Config::from_yaml(text).expect_err("should be rejected")
    }

    fn invalid(text: &str) -> ConfigError {
        Config::from_yaml(text)
            .expect("parses")
            .validate(&FakeHost)
            .expect_err("should be rejected")
    }

    #[test]
    fn defaults_round_trip_and_empty_is_default() {
        let yaml = Config::default().to_yaml().expect("serializes");
        assert_eq!(Config::from_yaml(&yaml).expect("parses"), Config::default());
        for empty in ["", "\n", "# only a comment\n", "{}"] {
            assert_eq!(
                Config::from_yaml(empty).expect("parses"),
                Config::default(),
                "{empty:?}"
            );
        }
        Config::default()
            .validate(&FakeHost)
            .expect("defaults are valid");
        let d = DaemonConfig::default();
        assert_eq!(
            (d.start_limit, d.exec_limit, d.shared_slots, d.slot_dir),
            (8, 16, true, None)
        );
        assert_eq!(
            (d.slot_wait_timeout_ms, d.reap_interval_ms, d.slow_start_ms),
            (600_000, 300_000, 5_000)
        );
        assert_eq!(d.pull_timeout_ms, 600_000);
        assert_eq!((d.pull_limit, d.registry_auth_file.as_deref()), (2, None));
        assert!(d.reap_orphans);
        assert_eq!(d.breaker, BreakerConfig::default());
        assert_eq!(d.retry, RetryPolicy::default());
    }

    #[test]
    fn the_example_file_is_the_defaults_with_every_key() {
        let example = Config::from_yaml(EXAMPLE_YAML).expect("examples/corral.yaml parses");
        assert_eq!(example, Config::default());
        example.validate(&FakeHost).expect("the example is valid");
        // Equal to the defaults could still mean keys left out; require each
        // key the code knows to be spelled out.
        let want = yaml_serde::to_value(Config::default()).expect("to value");
        let have: yaml_serde::Value = yaml_serde::from_str(EXAMPLE_YAML).expect("yaml");
        let mut missing = Vec::new();
        missing_keys(&want, &have, "", &mut missing);
        assert!(missing.is_empty(), "examples/corral.yaml lacks {missing:?}");
    }

    #[test]
    fn the_example_files_egress_map_parses() {
        let line = "  network: bridge\n";
        assert!(
            EXAMPLE_YAML.contains(line),
            "examples/corral.yaml sets network"
        );
        let want = crate::egress::EgressPolicy {
            allow: vec![
                "pypi.org".into(),
                "*.pythonhosted.org".into(),
                "git.example.com:9418".into(),
            ],
            deny: vec!["169.254.0.0/16".into()],
        };
        // The flow form the example's comment shows, and the block form.
        let flow = "  network: {egress: {allow: [pypi.org, \"*.pythonhosted.org\", \
                    \"git.example.com:9418\"], deny: [169.254.0.0/16]}}\n";
        let block = "  network:\n    egress:\n      allow:\n        - pypi.org\n        \
                     - \"*.pythonhosted.org\"\n        - git.example.com:9418\n      \
                     deny: [169.254.0.0/16]\n";
        for form in [flow, block] {
            let text = EXAMPLE_YAML.replacen(line, form, 1);
            let c = Config::from_yaml(&text).unwrap_or_else(|e| panic!("{form}: {e}"));
            assert_eq!(c.defaults.network, Network::Egress(want.clone()), "{form}");
            c.validate(&FakeHost).expect("valid");
            // What `corral config show` prints reads back the same, in the
            // map form rather than a YAML tag.
            let shown = c.to_yaml().expect("to yaml");
            assert!(
                shown.contains("egress:") && !shown.contains("!egress"),
                "{shown}"
            );
            assert_eq!(Config::from_yaml(&shown).expect("reads back"), c);
        }
        // The strings and the tagged form keep working.
        for (text, want) in [
            ("defaults: {network: none}", Network::None),
            ("defaults: {network: bridge}", Network::Bridge),
            (
                "defaults: {network: !egress {allow: [pypi.org]}}",
                Network::Egress(crate::egress::EgressPolicy {
                    allow: vec!["pypi.org".into()],
                    deny: vec![],
                }),
            ),
        ] {
            let c = Config::from_yaml(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(c.defaults.network, want, "{text}");
        }
    }

    #[test]
    fn a_bad_network_names_the_field_and_the_value() {
        for (text, field, value) in [
            ("defaults: {network: bogus}", "defaults.network", "bogus"),
            ("defaults: {network: 7}", "defaults.network", "7"),
            (
                "defaults: {network: {egres: {allow: [pypi.org]}}}",
                "defaults.network",
                "egres",
            ),
            (
                "defaults: {network: {egress: {alow: [pypi.org]}}}",
                "defaults.network",
                "alow",
            ),
            (
                "defaults: {network: {egress: {allow: [pypi.org]}, deny: []}}",
                "defaults.network",
                "deny",
            ),
            ("profiles: {p: {network: {}}}", "profiles.p.network", "map"),
        ] {
            let e = Config::from_yaml(text).expect_err(text).to_string();
            assert!(e.contains(field), "{text}: {e}");
            assert!(e.contains(value), "{text}: {e}");
        }
        // A rule that parses as YAML but not as a rule: named by validation.
        let c = Config::from_yaml("defaults: {network: {egress: {allow: [\"pypi.org:http\"]}}}")
            .expect("parses");
        let e = c.validate(&FakeHost).expect_err("bad rule").to_string();
        assert!(
            e.contains("network.egress.allow[0]") && e.contains("pypi.org:http"),
            "{e}"
        );
    }

    fn missing_keys(
        want: &yaml_serde::Value,
        have: &yaml_serde::Value,
        path: &str,
        out: &mut Vec<String>,
    ) {
        use yaml_serde::Value;
        match (want, have) {
            (Value::Mapping(w), Value::Mapping(h)) => {
                for (k, v) in w {
                    let name = k.as_str().unwrap_or("?");
                    let sub = if path.is_empty() {
                        name.to_string()
                    } else {
                        format!("{path}.{name}")
                    };
                    match h.get(k) {
                        Some(hv) => missing_keys(v, hv, &sub, out),
                        None => out.push(sub),
                    }
                }
            }
            (Value::Sequence(w), Value::Sequence(h)) => {
                for (i, (wv, hv)) in w.iter().zip(h).enumerate() {
                    missing_keys(wv, hv, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn a_full_file_parses() {
        let c = Config::from_yaml(
            "endpoint: unix:///run/docker.sock
daemon:
  start_limit: 4
  retry: {attempts: 3}
  breaker: {error_rate: 0.25}
defaults:
  image: debian:bookworm
  env: [{name: GREETING, value: hi}, {forward: TERM}]
  limits: {memory: 536870912, cpus: 2}
profiles:
  python:
    image: python:3.12
    network: none
provider:
  max_live: 8
  pools:
    python:
      warm: 2
      spec: {image: python:3.12}
persistence_root: /srv/corral
",
        )
        .expect("parses");
        c.validate(&FakeHost).expect("valid");
        assert_eq!(c.endpoint.as_deref(), Some("unix:///run/docker.sock"));
        assert_eq!(c.daemon.start_limit, 4);
        assert_eq!(c.daemon.exec_limit, 16, "untouched keys keep defaults");
        assert_eq!(c.daemon.retry.attempts, 3);
        assert_eq!(c.daemon.retry.initial_delay_ms, 500);
        assert_eq!(c.defaults.limits.cpus, Some(2.0));
        assert_eq!(c.defaults.limits.pids, Some(256));
        assert_eq!(
            c.defaults.env[0],
            EnvVar::Set {
                name: "GREETING".into(),
                value: "hi".into()
            }
        );
        let py = c.profile("python").expect("profile");
        assert_eq!(py.network, crate::Network::None);
        assert!(py.env.is_empty(), "profiles do not inherit defaults");
        assert_eq!(c.provider.pools["python"].warm, 2);
        assert_eq!(c.persistence_root(&FakeHost), PathBuf::from("/srv/corral"));
    }

    #[test]
    fn type_errors_name_the_path_the_value_and_the_line() {
        let e = parse_err("daemon:\n  start_limit: lots\n");
        assert_eq!(e.path(), "daemon.start_limit");
        let text = e.to_string();
        assert!(
            text.starts_with("daemon.start_limit: invalid type: string \"lots\", expected usize"),
            "{text}"
        );
        assert!(text.contains("line 2"), "{text}");
        assert!(
            matches!(e, ConfigError::Parse { line: Some(2), .. }),
            "{e:?}"
        );

        let e = parse_err("profiles:\n  python:\n    limits:\n      memory: 1g\n");
        assert_eq!(e.path(), "profiles.python.limits.memory");
        assert!(e.to_string().contains("\"1g\""), "{e}");

        let e = parse_err("daemon:\n  breaker:\n    error_rate: half\n");
        assert_eq!(e.path(), "daemon.breaker.error_rate");
        assert!(e.to_string().contains("half"), "{e}");

        let e = parse_err("defaults:\n  env: [{nam: X, value: y}]\n");
        assert_eq!(e.path(), "defaults.env[0]");
        assert!(e.to_string().contains("{forward: NAME}"), "{e}");

        let e = parse_err("defaults:\n  recovery: retry\n");
        assert_eq!(e.path(), "defaults.recovery");
        assert!(e.to_string().contains("retry"), "{e}");

        let e = parse_err("provider:\n  pools:\n    py:\n      warm: -1\n");
        assert_eq!(e.path(), "provider.pools.py.warm");
        assert!(e.to_string().contains("-1"), "{e}");
    }

    #[test]
    fn a_bad_e2b_listen_is_named_with_its_value() {
        let mut c = Config::default();
        c.server.e2b_listen = Some("localhost:99999".into());
        let e = c.validate(&FakeHost).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("server.e2b_listen") && text.contains("localhost:99999"),
            "{text}"
        );
        c.server.e2b_listen = Some("127.0.0.1:0".into());
        c.validate(&FakeHost).expect("a free port is fine");
    }

    #[test]
    fn port_links_listen_on_an_address_of_their_own() {
        let mut c = Config::default();
        for (bad, why) in [
            ("localhost:7071", "IP address and port"),
            ("127.0.0.1:7070", "must differ from server.listen"),
        ] {
            c.server.ports_listen = Some(bad.into());
            let text = c.validate(&FakeHost).expect_err(bad).to_string();
            assert!(
                text.contains("server.ports_listen") && text.contains(bad) && text.contains(why),
                "{text}"
            );
        }
        c.server.ports_listen = Some("127.0.0.1:0".into());
        c.validate(&FakeHost).expect("a free port is fine");
    }

    #[test]
    fn the_ports_domain_is_a_domain_with_an_optional_scheme_and_port() {
        let mut c = Config::default();
        for (bad, why) in [
            ("ftp://ports.example.com", "not http or https"),
            ("ports.example.com:8443", "a bare domain takes no port"),
            ("https://ports.example.com:0", "not a port"),
            ("Ports.Example.com", "not a DNS label"),
            ("*.ports.example.com", "not a DNS label"),
            ("ports.example.com/x", "not a DNS label"),
            ("-a.example.com", "not a DNS label"),
            ("", "must name a domain"),
        ] {
            c.server.ports_domain = Some(bad.into());
            let text = c.validate(&FakeHost).expect_err(bad).to_string();
            assert!(
                text.contains("server.ports_domain") && text.contains(bad) && text.contains(why),
                "{text}"
            );
        }
        let d = PortsDomain::parse("ports.example.com").expect("bare");
        assert_eq!((d.scheme, d.port, d.behind_proxy), ("http", None, false));
        let d = PortsDomain::parse("https://ports.example.com/").expect("https");
        assert_eq!(
            (d.scheme, d.domain.as_str(), d.port),
            ("https", "ports.example.com", None)
        );
        let d = PortsDomain::parse("http://box.lan:8081").expect("port");
        assert_eq!((d.port, d.behind_proxy), (Some(8081), true));
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let e = parse_err("daemon:\n  start_limt: 3\n");
        assert_eq!(e.path(), "daemon.start_limt");
        let text = e.to_string();
        assert!(
            text.starts_with(
                "daemon.start_limt: unknown field `start_limt`, expected one of `retry`"
            ),
            "{text}"
        );
        assert!(text.contains("line 2"), "{text}");

        let e = parse_err("endpiont: tcp://x:1\n");
        assert!(e.to_string().contains("unknown field `endpiont`"), "{e}");

        let e = parse_err("profiles:\n  py:\n    limits:\n      mem: 1\n");
        assert_eq!(e.path(), "profiles.py.limits.mem");
        assert!(e.to_string().contains("`mem`"), "{e}");
    }

    #[test]
    fn broken_yaml_reports_the_line() {
        let e = parse_err("daemon:\n  start_limit: 1\ndefaults: {image: a\n");
        assert!(
            matches!(e, ConfigError::Parse { line: Some(4), .. }),
            "{e:?}"
        );
        assert_eq!(e.path(), "");
        assert!(e.to_string().contains("line 4"), "{e}");
        // A syntax error wins over a type error above it.
        let e = parse_err("daemon:\n  start_limit: lots\n  x: [\n");
        assert_eq!(e.path(), "", "{e}");
    }

    #[test]
    fn range_errors_name_the_path_and_value() {
        let e = invalid("daemon:\n  breaker:\n    error_rate: 1.5\n");
        assert_eq!(
            e.to_string(),
            "daemon.breaker.error_rate: invalid value '1.5': a fraction above 0 and at most 1"
        );
        let e = invalid("daemon:\n  retry:\n    attempts: 0\n");
        assert_eq!(e.path(), "daemon.retry.attempts");
        let e = invalid("daemon:\n  breaker:\n    window: 5\n    min_samples: 6\n");
        assert_eq!(e.path(), "daemon.breaker.min_samples");
        assert!(e.to_string().contains("'6'"), "{e}");
        let e = invalid("daemon:\n  slot_dir: slots\n");
        assert_eq!(e.path(), "daemon.slot_dir");
        let e = invalid("daemon:\n  seal_key_file: key\n");
        assert_eq!(e.path(), "daemon.seal_key_file");
        let e = invalid("persistence_root: rel/dir\n");
        assert_eq!(e.path(), "persistence_root");
        let e = invalid("endpoint: ''\n");
        assert_eq!(e.path(), "endpoint");
    }

    #[test]
    fn every_spec_is_validated_under_its_path() {
        let e = invalid("profiles:\n  python:\n    limits:\n      memory: 1024\n");
        assert_eq!(
            e.to_string(),
            "profiles.python.limits.memory: invalid value '1024': Docker needs at least 6 MiB"
        );
        let e = invalid("defaults:\n  mounts: [{host: /missing, container: /m}]\n");
        assert_eq!(e.path(), "defaults.mounts[0].host");
        assert!(e.to_string().contains("'/missing'"), "{e}");
        // Mounts that exist on the caller's host pass.
        Config::from_yaml("defaults:\n  mounts: [{host: /srv/data, container: /m}]\n")
            .expect("parses")
            .validate(&FakeHost)
            .expect("valid");
        let e = invalid("provider:\n  pools:\n    py:\n      spec: {}\n");
        assert_eq!(e.path(), "provider.pools.py.spec.image");
        let e = invalid(
            "provider:
  max_live: 3
  pools:
    a: {warm: 2, spec: {image: x}}
    b: {warm: 2, spec: {image: x}}
",
        );
        assert_eq!(e.path(), "provider.pools.b.warm");
        assert!(e.to_string().contains("add up to 4"), "{e}");
        let e = invalid("profiles:\n  'two words': {}\n");
        assert_eq!(e.path(), "profiles");
        assert!(e.to_string().contains("'two words'"), "{e}");
    }

    #[test]
    fn env_overrides_apply_and_bad_values_name_the_variable() {
        let vars: BTreeMap<&str, &str> = [
            ("CORRAL_ENDPOINT", "tcp://127.0.0.1:2375"),
            ("CORRAL_START_LIMIT", "3"),
            ("CORRAL_EXEC_LIMIT", "0"),
            ("CORRAL_IMAGE", "alpine:3"),
            ("CORRAL_RECOVERY", "recreate"),
            ("CORRAL_MAX_LIVE", "12"),
            ("CORRAL_PERSISTENCE_ROOT", "/data/ws"),
            ("CORRAL_LISTEN", "0.0.0.0:8080"),
            ("CORRAL_TOKEN", "s3cret"),
            ("CORRAL_RUNTIME_DIR", "/run/c"),
        ]
        .into_iter()
        .collect();
        let mut c = Config::default();
        c.apply_env(|n| vars.get(n).map(|v| v.to_string()))
            .expect("valid overrides");
        assert_eq!(c.endpoint.as_deref(), Some("tcp://127.0.0.1:2375"));
        assert_eq!((c.daemon.start_limit, c.daemon.exec_limit), (3, 0));
        assert_eq!(c.defaults.image, "alpine:3");
        assert_eq!(c.defaults.recovery, Recovery::Recreate);
        assert_eq!(c.provider.max_live, 12);
        assert_eq!(c.persistence_root(&FakeHost), PathBuf::from("/data/ws"));
        assert_eq!(c.server.listen, "0.0.0.0:8080");
        assert_eq!(c.server.token.as_deref(), Some("s3cret"));
        assert_eq!(c.runtime_dir(&FakeHost), PathBuf::from("/run/c"));
        c.validate(&FakeHost)
            .expect("a token makes a wide listen valid");
        c.server.token = None;
        let e = c.validate(&FakeHost).expect_err("no token beyond loopback");
        assert!(e.to_string().contains("server.listen"), "{e}");
        assert_eq!(ENV_OVERRIDES.len(), vars.len(), "every override is listed");

        let bad = |name: &str, value: &str| {
            let mut c = Config::default();
            c.apply_env(|n| (n == name).then(|| value.to_string()))
                .expect_err("should be rejected")
        };
        let e = bad("CORRAL_START_LIMIT", "lots");
        assert_eq!(
            e.to_string(),
            "environment variable CORRAL_START_LIMIT: invalid value 'lots': expected a whole number (0: unlimited)"
        );
        assert!(bad("CORRAL_RECOVERY", "retry")
            .to_string()
            .contains("'retry'"));
        assert_eq!(bad("CORRAL_MAX_LIVE", "-1").path(), "CORRAL_MAX_LIVE");
        assert_eq!(
            bad("CORRAL_PERSISTENCE_ROOT", "ws").path(),
            "CORRAL_PERSISTENCE_ROOT"
        );

        // Empty counts as unset: the file's value stays.
        let mut c = Config::from_yaml("daemon: {start_limit: 2}").expect("parses");
        c.apply_env(|_| Some(String::new())).expect("ignored");
        assert_eq!(c.daemon.start_limit, 2);
    }

    #[test]
    fn file_locations_follow_xdg() {
        struct Xdg;
        impl HostView for Xdg {
            fn var(&self, name: &str) -> Option<String> {
                match name {
                    "XDG_CONFIG_HOME" => Some("/cfg".into()),
                    "XDG_DATA_HOME" => Some("relative/ignored".into()),
                    "HOME" => Some("/home/ada".into()),
                    _ => None,
                }
            }
            fn path_exists(&self, _: &str) -> bool {
                false
            }
        }
        assert_eq!(
            Config::default_path(&Xdg),
            Some(PathBuf::from("/cfg/corral/config.yaml"))
        );
        assert_eq!(
            Config::default_path(&FakeHost),
            Some(PathBuf::from("/home/ada/.config/corral/config.yaml"))
        );
        assert_eq!(
            Config::default().persistence_root(&Xdg),
            PathBuf::from("/home/ada/.local/share/corral/workspaces")
        );
        assert_eq!(
            Config::default().runtime_dir(&FakeHost),
            PathBuf::from("/home/ada/.local/share/corral/runtime")
        );
        struct Runtime;
        impl HostView for Runtime {
            fn var(&self, name: &str) -> Option<String> {
                (name == "XDG_RUNTIME_DIR").then(|| "/run/user/1000".into())
            }
            fn path_exists(&self, _: &str) -> bool {
                false
            }
        }
        assert_eq!(
            Config::default().runtime_dir(&Runtime),
            PathBuf::from("/run/user/1000/corral/servers")
        );
    }

    #[test]
    fn server_trust_settings_are_checked() {
        let c = Config::from_yaml(
            "server:
  allowed_origins: [http://localhost:3000]
  allowed_hosts: [corral.internal:7070]
  policy: {images: [python:3.12*], max_memory: 1073741824}
",
        )
        .expect("parses");
        c.validate(&FakeHost).expect("valid");
        assert_eq!(c.server.policy.max_memory, 1 << 30);
        assert_eq!(c.server.auth, AuthMode::Token);
        let e = invalid("server:\n  auth: none\n  token: abc\n");
        assert_eq!(e.path(), "server.auth");
        let e = invalid("server:\n  auth: none\n  listen: 0.0.0.0:7070\n");
        assert_eq!(e.path(), "server.listen");
        // Every listener, not only `listen`: each named with its address.
        for (key, yaml) in [
            ("server.e2b_listen", "e2b_listen: 0.0.0.0:49983"),
            ("server.e2b_listen", "e2b_listen: '[::]:49983'"),
            ("server.ports_listen", "ports_listen: 10.0.0.5:7071"),
        ] {
            let e = invalid(&format!("server:\n  auth: none\n  {yaml}\n"));
            assert_eq!(e.path(), key, "{e}");
            assert!(e.to_string().contains("loopback only"), "{e}");
        }
        Config::from_yaml(
            "server:\n  auth: none\n  e2b_listen: '[::1]:49983'\n  ports_listen: 127.0.0.1:0\n",
        )
        .expect("parses")
        .validate(&FakeHost)
        .expect("loopback listeners need no authentication");
        Config::from_yaml("server:\n  token: abc\n  e2b_listen: 0.0.0.0:49983\n")
            .expect("parses")
            .validate(&FakeHost)
            .expect("with a token any address will do");
        let e = invalid("server:\n  allowed_origins: ['*']\n");
        assert_eq!(e.path(), "server.allowed_origins[0]");
        let e = invalid("server:\n  allowed_origins: [http://a.example/path]\n");
        assert_eq!(e.path(), "server.allowed_origins[0]");
        let e = invalid("server:\n  allowed_hosts: ['http://x']\n");
        assert_eq!(e.path(), "server.allowed_hosts[0]");
        let e = invalid("server:\n  runtime_dir: rel\n");
        assert_eq!(e.path(), "server.runtime_dir");
        let e = invalid("server:\n  policy: {max_cpus: 0}\n");
        assert_eq!(e.path(), "server.policy.max_cpus");
        let e = invalid("server:\n  policy: {max_memory: 1}\n");
        assert_eq!(e.path(), "server.policy.max_memory");
        let e = invalid("server:\n  policy: {images: ['a b']}\n");
        assert_eq!(e.path(), "server.policy.images[0]");
        let e = parse_err("server:\n  auth: maybe\n");
        assert_eq!(e.path(), "server.auth");
    }

    #[test]
    fn kubernetes_settings_are_checked_by_name() {
        let c = Config::from_yaml(
            "backend: kubernetes\nkubernetes:\n  namespace: sandboxes\n  qps: 5.5\n  burst: 3\n",
        )
        .expect("parses");
        assert_eq!(c.backend, BackendKind::Kubernetes);
        assert_eq!(c.kubernetes.namespace.as_deref(), Some("sandboxes"));
        assert_eq!((c.kubernetes.qps, c.kubernetes.burst), (5.5, 3));
        assert_eq!(c.kubernetes.control, ControlPath::Auto);
        c.validate(&FakeHost).expect("valid");
        let c = Config::from_yaml(
            "kubernetes: {control: port_forward, controller_cidrs: [10.0.0.0/8, 'fd00::/8']}",
        )
        .expect("parses");
        assert_eq!(c.kubernetes.control, ControlPath::PortForward);
        c.validate(&FakeHost).expect("valid");
        let c = Config::from_yaml(
            "kubernetes:\n  lease_duration_seconds: 15\n  session_volume_size: 1048576\n  \
             session_storage_class: fast.ssd\n",
        )
        .expect("parses");
        assert_eq!(c.kubernetes.lease_duration_seconds, 15);
        assert_eq!(c.kubernetes.session_volume_size, 1 << 20);
        assert_eq!(
            c.kubernetes.session_storage_class.as_deref(),
            Some("fast.ssd")
        );
        c.validate(&FakeHost).expect("valid");
        for profile in ["unconfined", "localhost/corral-pristine"] {
            let c = Config::from_yaml(&format!(
                "kubernetes: {{pristine_apparmor_profile: {profile}}}"
            ))
            .expect("parses");
            c.validate(&FakeHost).expect("valid");
        }
        for (text, path, value) in [
            (
                "kubernetes: {namespace: Bad_NS}",
                "kubernetes.namespace",
                "Bad_NS",
            ),
            ("kubernetes: {namespace: -x}", "kubernetes.namespace", "-x"),
            (
                "kubernetes: {kubeconfig: kube.yaml}",
                "kubernetes.kubeconfig",
                "kube.yaml",
            ),
            ("kubernetes: {context: ' '}", "kubernetes.context", " "),
            (
                "kubernetes: {agent_image: 'a b'}",
                "kubernetes.agent_image",
                "a b",
            ),
            ("kubernetes: {qps: 0}", "kubernetes.qps", "0"),
            ("kubernetes: {qps: .nan}", "kubernetes.qps", "NaN"),
            ("kubernetes: {burst: 0}", "kubernetes.burst", "0"),
            ("kubernetes: {agent_port: 0}", "kubernetes.agent_port", "0"),
            (
                "kubernetes: {connect_timeout_ms: 0}",
                "kubernetes.connect_timeout_ms",
                "0",
            ),
            (
                "kubernetes: {controller_cidrs: [10.0.0.0/8, 10.1.2.3]}",
                "kubernetes.controller_cidrs[1]",
                "10.1.2.3",
            ),
            (
                "kubernetes: {controller_cidrs: [10.0.0.0/33]}",
                "kubernetes.controller_cidrs[0]",
                "10.0.0.0/33",
            ),
            (
                "kubernetes: {egress_nameservers: [10.96.0.10, kube-dns]}",
                "kubernetes.egress_nameservers[1]",
                "kube-dns",
            ),
            (
                "kubernetes: {egress_nameservers: [1.1.1.1, 1.1.1.2, 1.1.1.3, 1.1.1.4]}",
                "kubernetes.egress_nameservers",
                "1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4",
            ),
            (
                "kubernetes: {start_timeout_ms: 0}",
                "kubernetes.start_timeout_ms",
                "0",
            ),
            (
                "kubernetes: {lease_duration_seconds: 9}",
                "kubernetes.lease_duration_seconds",
                "9",
            ),
            (
                "kubernetes: {lease_duration_seconds: 3601}",
                "kubernetes.lease_duration_seconds",
                "3601",
            ),
            (
                "kubernetes: {session_volume_size: 1048575}",
                "kubernetes.session_volume_size",
                "1048575",
            ),
            (
                "kubernetes: {session_storage_class: Fast_SSD}",
                "kubernetes.session_storage_class",
                "Fast_SSD",
            ),
            (
                "kubernetes: {pristine_apparmor_profile: localhost/}",
                "kubernetes.pristine_apparmor_profile",
                "localhost/",
            ),
            (
                "kubernetes: {pristine_apparmor_profile: runtime/default}",
                "kubernetes.pristine_apparmor_profile",
                "runtime/default",
            ),
        ] {
            match invalid(text) {
                ConfigError::Invalid {
                    path: p, value: v, ..
                } => {
                    assert_eq!((p.as_str(), v.as_str()), (path, value), "{text}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = parse_err("backend: nomad");
        assert_eq!(e.path(), "backend", "{e}");
    }

    #[test]
    fn unknown_profiles_list_the_known_ones() {
        let c = Config::from_yaml("profiles: {python: {}, node: {}}").expect("parses");
        let e = c.profile("ruby").expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "profiles: invalid value 'ruby': no such profile: known profiles are node, python"
        );
        let e = Config::default().profile("ruby").expect_err("unknown");
        assert!(e.to_string().contains("defines none"), "{e}");
    }
}
