//! The Docker backend: containers whose PID 1 is corral's agent, reached
//! through the daemon's attach to PID 1's own stdin and stdout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::container::{AttachContainerResults, LogOutput};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use corral_core::backend::{
    AgentOutput, AgentStream, Backend, BackendCounters, BoxFuture, ImageInfo, ImagePresence,
    OnDeath, Placement, Prepared, PullProgress, PullStatus, SandboxInfo, StartRequest,
};
use corral_core::config::Config;
use corral_core::outcome::short;
use corral_core::{ContainerState, Error, RetryPolicy, SandboxSpec};
use futures_util::StreamExt;
use tokio::sync::OnceCell;

use crate::agent_volume;
use crate::container_config::{container_name, create_body, CreateParams};
use crate::error::{api, is_connection_error, is_not_found, status_code};
use crate::events::EventRouter;
use crate::retry::retry;

/// How long a container killed by SIGKILL is given for the daemon's `oom`
/// event to arrive, when its state does not say OOM.
const OOM_EVENT_WAIT: Duration = Duration::from_millis(750);

/// An `oom` event this recent counts as the cause of a SIGKILLed container.
const OOM_EVENT_RECENT: Duration = Duration::from_secs(5);

/// How long a create waits for an earlier container of the same sandbox
/// (being removed) to give its name up.
const NAME_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How to reach the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct DockerConfig {
    /// `unix:///path`, `tcp://host:port` or a socket path; `None` tries
    /// `DOCKER_HOST`, Docker's default socket and Podman's sockets.
    pub endpoint: Option<String>,
    /// Retries of transient daemon errors.
    pub retry: RetryPolicy,
    /// How long one pull of a missing image may take
    /// (`daemon.pull_timeout_ms`).
    pub pull_timeout: Duration,
    /// Pulls at once (`daemon.pull_limit`).
    pub pull_limit: usize,
    /// Registry credentials (`daemon.registry_auth_file`).
    pub registry_auth_file: Option<std::path::PathBuf>,
    /// The network egress gateways reach out through
    /// (`daemon.egress_network`); `None`: corral's own bridge network.
    pub egress_network: Option<String>,
    /// Share deltas with sandboxes that reset in place through a host
    /// directory (`snapshots.share`), when the daemon runs on this host.
    pub share_deltas: bool,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig::from(&Config::default())
    }
}

impl From<&Config> for DockerConfig {
    fn from(config: &Config) -> Self {
        DockerConfig {
            endpoint: config.endpoint.clone(),
            retry: config.daemon.retry.clone(),
            pull_timeout: Duration::from_millis(config.daemon.pull_timeout_ms),
            pull_limit: config.daemon.pull_limit,
            registry_auth_file: config
                .daemon
                .registry_auth_file
                .as_ref()
                .map(std::path::PathBuf::from),
            egress_network: config.daemon.egress_network.clone(),
            share_deltas: config.snapshots.share,
        }
    }
}

/// Whether the daemon at `endpoint` may run on this host: a local socket.
fn local_endpoint(endpoint: &str) -> bool {
    endpoint.starts_with("unix://") || endpoint.starts_with('/')
}

/// The `pid_max` of the host the daemon at `endpoint` runs on: this
/// host's when the daemon is local, else (or when unreadable)
/// [`corral_core::spec::DEFAULT_HOST_PID_MAX`].
fn host_pid_max(endpoint: &str) -> i64 {
    let default = corral_core::spec::DEFAULT_HOST_PID_MAX;
    if !local_endpoint(endpoint) {
        return default;
    }
    match std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
    {
        Some(n) if n > 0 => n,
        _ => {
            tracing::warn!(
                default,
                "cannot read /proc/sys/kernel/pid_max; gVisor sandboxes' pids limits are bounded by the default"
            );
            default
        }
    }
}

/// The directory deltas are shared through, made (0711: sandboxes reach
/// the files they are named, nobody lists them) when the daemon at
/// `endpoint` may see this host's files: a local socket. (Whether it does
/// shows at the first create that mounts it: see `do_create`.)
fn shared_deltas_dir(endpoint: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !local_endpoint(endpoint) {
        return None;
    }
    // Below this user's own runtime directory only: a `deltas` another
    // user planted could hand a fork someone else's delta.
    let made = crate::network::owned_runtime_dir().and_then(|d| {
        let dir = d.join("deltas");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)))
            .map(|()| dir)
    });
    match made {
        Ok(dir) => Some(dir),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make the shared deltas directory; forks stream their deltas");
            None
        }
    }
}

/// A connection to one daemon. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct DockerBackend {
    pub(crate) inner: Arc<BackendInner>,
}

pub(crate) struct BackendInner {
    pub(crate) docker: Docker,
    pub(crate) endpoint: String,
    pub(crate) config: DockerConfig,
    pub(crate) retries: AtomicU64,
    agent_volume: OnceCell<String>,
    network: OnceCell<crate::network::NetworkInfo>,
    storage_opt: OnceCell<bool>,
    /// Whether the daemon has [`corral_core::spec::GVISOR_LIVE_RUNTIME`].
    live_runtime: OnceCell<bool>,
    pulls: crate::pull::Pulls,
    pub(crate) events: Arc<EventRouter>,
    /// See [`Backend::shared_deltas`].
    shared_deltas: Option<std::path::PathBuf>,
    /// A create found the daemon cannot mount `shared_deltas`.
    share_failed: AtomicBool,
    /// The `pid_max` of the daemon's host (see `host_pid_max`).
    host_pid_max: i64,
}

impl DockerBackend {
    /// Connects, failing fast with every endpoint tried when no daemon
    /// answers.
    pub async fn connect(config: &DockerConfig) -> Result<Self, Error> {
        let (docker, endpoint) = crate::connect::connect(config.endpoint.as_deref()).await?;
        let host_pid_max = host_pid_max(&endpoint);
        let shared_deltas = if config.share_deltas {
            shared_deltas_dir(&endpoint)
        } else {
            None
        };
        Ok(DockerBackend {
            inner: Arc::new(BackendInner {
                docker,
                endpoint,
                config: config.clone(),
                retries: AtomicU64::new(0),
                agent_volume: OnceCell::new(),
                network: OnceCell::new(),
                storage_opt: OnceCell::new(),
                live_runtime: OnceCell::new(),
                pulls: crate::pull::Pulls::new(crate::pull::PullConfig {
                    timeout: config.pull_timeout,
                    limit: config.pull_limit,
                    auth_file: config.registry_auth_file.clone(),
                }),
                events: Arc::new(EventRouter::default()),
                shared_deltas,
                share_failed: AtomicBool::new(false),
                host_pid_max,
            }),
        })
    }

    /// Whether the daemon has the runtime gVisor sandboxes without network
    /// can be checkpointed under ([`live_tier`]; asked once).
    async fn has_live_runtime(&self) -> bool {
        *self
            .inner
            .live_runtime
            .get_or_init(|| async {
                match self.inner.docker.info().await {
                    Ok(info) => info
                        .runtimes
                        .is_some_and(|r| r.contains_key(corral_core::spec::GVISOR_LIVE_RUNTIME)),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list the daemon's runtimes; gVisor sandboxes run without live snapshots");
                        false
                    }
                }
            })
            .await
    }

    /// The raw client, for `doctor` and benchmarks that measure the daemon
    /// itself.
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// The configuration in force.
    pub fn config(&self) -> &DockerConfig {
        &self.inner.config
    }

    /// Runs a daemon call named `what`, retrying transient errors.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &str,
        op: F,
    ) -> Result<T, bollard::errors::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, bollard::errors::Error>>,
    {
        retry(&self.inner.config.retry, &self.inner.retries, what, op).await
    }

    /// corral's sandbox network (a bridge with inter-container
    /// communication off), created when missing and checked once per
    /// backend; every sandbox with network access joins it.
    pub async fn sandbox_network(&self) -> Result<crate::network::NetworkInfo, Error> {
        self.inner
            .network
            .get_or_try_init(|| crate::network::ensure(&self.inner.docker))
            .await
            .cloned()
    }

    /// The network egress gateways reach out through: `daemon.egress_network`
    /// when set (it must exist), else corral's own bridge.
    pub async fn egress_outside(&self) -> Result<String, Error> {
        match &self.inner.config.egress_network {
            Some(name) => {
                let docker = &self.inner.docker;
                docker
                    .inspect_network(
                        name,
                        None::<bollard::query_parameters::InspectNetworkOptions>,
                    )
                    .await
                    .map_err(|e| Error::Network {
                        network: name.clone(),
                        reason: format!(
                            "daemon.egress_network names a network this daemon cannot give: {e}"
                        ),
                    })?;
                Ok(name.clone())
            }
            None => Ok(self.sandbox_network().await?.id),
        }
    }

    /// The egress counts of `sandbox` (one with `network: {egress: ...}`):
    /// names resolved and refused, connections relayed and refused; `None`
    /// for a sandbox without a gateway.
    pub async fn egress_stats(
        &self,
        sandbox: &str,
    ) -> Result<Option<crate::egress::EgressStats>, Error> {
        crate::egress::stats(&self.inner.docker, sandbox).await
    }

    /// Makes sure `image` is present, pulling it when a registry can supply
    /// it: one pull per image at a time, whoever asks (`pull.rs`), bounded
    /// by `daemon.pull_timeout_ms`. A name or tag the registry lacks is
    /// `image_not_found`; an unreachable or failing registry, or a pull
    /// past its time, is retryable (`daemon_unavailable`).
    pub async fn ensure_image(&self, image: &str) -> Result<(), Error> {
        self.ensure_image_with(image, |_| {}).await
    }

    /// [`DockerBackend::ensure_image`], telling `on_progress` how the pull
    /// goes (whether this call started it or joined it).
    pub async fn ensure_image_with(
        &self,
        image: &str,
        on_progress: impl FnMut(PullProgress),
    ) -> Result<(), Error> {
        let docker = &self.inner.docker;
        let what = format!("inspect image {image}");
        match self.call(&what, || docker.inspect_image(image)).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(api(what, e)),
        }
        self.inner
            .pulls
            .ensure(docker, image, on_progress)
            .await
            .map_err(|f| f.into_error(image))
    }

    /// The images on the daemon a sandbox can name (tagged; snapshots,
    /// which `corral snapshots` lists, left out), newest first.
    pub async fn images(&self) -> Result<Vec<ImageInfo>, Error> {
        let docker = &self.inner.docker;
        let list = self
            .call("list images", || {
                docker.list_images(None::<bollard::query_parameters::ListImagesOptions>)
            })
            .await
            .map_err(|e| api("list images", e))?;
        let mut out: Vec<ImageInfo> = list
            .into_iter()
            .flat_map(|i| {
                let (size, created) = (i.size.max(0) as u64, i.created);
                i.repo_tags
                    .into_iter()
                    .filter(|t| {
                        t != "<none>:<none>"
                            && !t.starts_with("corral-snapshot:")
                            && !t.starts_with("corral-snapshot/")
                    })
                    .map(move |reference| ImageInfo {
                        reference,
                        size,
                        created,
                    })
            })
            .collect();
        out.sort_by(|a, b| {
            b.created
                .cmp(&a.created)
                .then(a.reference.cmp(&b.reference))
        });
        Ok(out)
    }

    /// The shared agent volume, filled once per backend (`image` is any
    /// image present on the daemon, for the helper container).
    async fn agent_volume(
        &self,
        image: &str,
        owner: &corral_core::labels::Owner,
    ) -> Result<String, Error> {
        self.inner
            .agent_volume
            .get_or_try_init(|| agent_volume::ensure(&self.inner.docker, image, owner))
            .await
            .cloned()
    }

    /// Whether the daemon honours `--storage-opt size=`: probed once by
    /// creating (never starting) a container with it, then cached.
    pub async fn storage_opt_supported(
        &self,
        image: &str,
        owner: &corral_core::labels::Owner,
    ) -> Result<bool, Error> {
        let docker = &self.inner.docker;
        let supported = self
            .inner
            .storage_opt
            .get_or_try_init(|| async {
                let probe_id = format!("probe-{}-{}", owner.pid, owner.start);
                let name = container_name(&probe_id);
                let body = ContainerCreateBody {
                    image: Some(image.to_string()),
                    entrypoint: Some(vec!["/nonexistent".into()]),
                    labels: Some(
                        [(corral_core::labels::SANDBOX.to_string(), probe_id.clone())]
                            .into_iter()
                            .chain(owner.labels())
                            .collect(),
                    ),
                    host_config: Some(bollard::models::HostConfig {
                        storage_opt: Some([("size".to_string(), "1G".to_string())].into()),
                        network_mode: Some("none".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let opts = CreateContainerOptionsBuilder::default().name(&name).build();
                match docker.create_container(Some(opts), body).await {
                    Ok(c) => {
                        self.remove_container(&c.id, &probe_id).await?;
                        Ok(true)
                    }
                    Err(e) if is_connection_error(&e) => Err(api("probe storage-opt support", e)),
                    Err(e) => {
                        tracing::debug!(error = %e, "storage-opt size= is not supported");
                        Ok(false)
                    }
                }
            })
            .await?;
        Ok(*supported)
    }

    /// Creates the container, retrying transient errors. A retried create
    /// whose first attempt did go through meets a name conflict: the
    /// container already there is ours when it carries our sandbox label
    /// and was only just created. One of ours on its way out (the earlier
    /// container of a sandbox being replaced, still being removed) is
    /// waited for, then the create is tried again.
    async fn create_container(
        &self,
        name: &str,
        id: &str,
        image: &str,
        body: ContainerCreateBody,
    ) -> Result<String, Error> {
        let docker = &self.inner.docker;
        let deadline = Instant::now() + NAME_RELEASE_WAIT;
        loop {
            let res = self
                .call(&format!("create sandbox {id}"), || {
                    let opts = CreateContainerOptionsBuilder::default().name(name).build();
                    docker.create_container(Some(opts), body.clone())
                })
                .await;
            let e = match res {
                Ok(c) => return Ok(c.id),
                Err(e) if status_code(&e) == Some(409) => e,
                Err(e) => return Err(create_error(id, image, e)),
            };
            let existing = match docker
                .inspect_container(
                    name,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
            {
                Ok(c) => c,
                // Gone meanwhile: the name is free now.
                Err(e2) if is_not_found(&e2) => continue,
                Err(e2) => return Err(api(format!("inspect {name} after a name conflict"), e2)),
            };
            let ours = existing
                .config
                .and_then(|c| c.labels)
                .and_then(|l| l.get(corral_core::labels::SANDBOX).cloned())
                .as_deref()
                == Some(id);
            let status = existing
                .state
                .and_then(|s| s.status)
                .map(|s| s.to_string())
                .unwrap_or_default();
            match (ours, existing.id) {
                (true, Some(cid)) if status == "created" => return Ok(cid),
                (true, Some(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return Err(api(format!("create sandbox {id} from {image}"), e)),
            }
        }
    }

    /// Kill first (no graceful stop: sandboxes hold nothing worth saving),
    /// then remove with anonymous volumes. A container already gone is
    /// success.
    /// `docker pause` (the cgroup freezer: processes stop, memory stays)
    /// or `docker unpause` of `container`.
    pub(crate) async fn freeze_container(
        &self,
        container: &str,
        frozen: bool,
    ) -> Result<(), Error> {
        let docker = &self.inner.docker;
        let what = format!(
            "{} container {}",
            if frozen { "pause" } else { "unpause" },
            short(container)
        );
        let done = if frozen {
            self.call(&what, || docker.pause_container(container)).await
        } else {
            self.call(&what, || docker.unpause_container(container))
                .await
        };
        done.map_err(|e| api(what, e))
    }

    pub(crate) async fn remove_container(
        &self,
        container: &str,
        sandbox: &str,
    ) -> Result<(), Error> {
        let docker = &self.inner.docker;
        let kill = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        if let Err(e) = docker.kill_container(container, Some(kill)).await {
            // Not running, or already gone: fine. Anything else: log and still remove.
            if is_connection_error(&e) {
                return Err(api(
                    format!("kill sandbox {sandbox} (container {})", short(container)),
                    e,
                ));
            }
            if !is_not_found(&e) && !crate::error::is_not_running(&e) {
                tracing::warn!(sandbox, container = short(container), error = %e, "kill before remove failed");
            }
        }
        let rm = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        let what = format!("remove sandbox {sandbox}");
        let removed = self
            .call(&what, || {
                docker.remove_container(container, Some(rm.clone()))
            })
            .await;
        if removed.is_ok() || matches!(&removed, Err(e) if is_not_found(e)) {
            // A sandbox that could write to its agent mount had its own copy.
            agent_volume::remove_private(docker, sandbox).await;
            // A sandbox with an egress policy had a gateway and a network.
            crate::egress::remove(docker, sandbox).await;
            // A pristine one had its own shared deltas directory.
            if let Some(root) = &self.inner.shared_deltas {
                let dir = corral_core::backend::sandbox_deltas_dir(root, sandbox);
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(sandbox, dir = %dir.display(), error = %e, "cannot remove a sandbox's shared deltas directory");
                    }
                }
            }
        }
        match removed {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // 409 "removal already in progress": another remover owns it.
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(api(
                format!("remove sandbox {sandbox} (container {})", short(container)),
                e,
            )),
        }
    }

    /// Whether the daemon reported an OOM kill in the container lately,
    /// waiting briefly for the event: it may trail the exit it caused.
    async fn oom_event_seen(&self, container: &str) -> bool {
        let until = Instant::now() + OOM_EVENT_WAIT;
        loop {
            if self
                .inner
                .events
                .last_oom(container)
                .is_some_and(|t| t.elapsed() < OOM_EVENT_RECENT)
            {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn do_prepare(&self, req: &StartRequest<'_>) -> Result<Prepared, Error> {
        let spec = req.spec;
        // Refused before an image is pulled.
        spec.engine_pids_limit(self.inner.host_pid_max)?;
        let mut prepared = Prepared::default();
        let t = Instant::now();
        self.ensure_image(&spec.image).await?;
        prepared.image = t.elapsed();
        if spec.limits.disk.is_some() && !self.storage_opt_supported(&spec.image, req.owner).await?
        {
            return Err(Error::Unsupported {
                what: "limits.disk: this daemon's storage driver does not support --storage-opt size= \
                       (needs overlay2 on xfs with pquota, or devicemapper/btrfs/zfs); leave the disk limit unset"
                    .to_string(),
            });
        }
        let t = Instant::now();
        self.agent_volume(&spec.image, req.owner).await?;
        prepared.agent = t.elapsed();
        prepare_nosuid_mounts(spec)?;
        match &spec.network {
            corral_core::Network::Bridge => {
                self.sandbox_network().await?;
            }
            corral_core::Network::Egress(_) => {
                self.egress_outside().await?;
                crate::egress::ensure_image(&self.inner.docker).await?;
            }
            corral_core::Network::None => {}
        }
        Ok(prepared)
    }

    async fn do_create(&self, req: &StartRequest<'_>) -> Result<Placement, Error> {
        let (spec, id) = (req.spec, req.sandbox_id);
        let docker = &self.inner.docker;
        // Refused before anything is made for the sandbox.
        spec.engine_pids_limit(self.inner.host_pid_max)?;
        // Filled by `prepare`; a create without it fills it the same way.
        let volume = self.agent_volume(&spec.image, req.owner).await?;
        let (network, dns) = match &spec.network {
            corral_core::Network::Bridge => (self.sandbox_network().await?.id, None),
            corral_core::Network::None => (String::new(), None),
            corral_core::Network::Egress(policy) => {
                let outside = self.egress_outside().await?;
                let path = crate::egress::ensure(docker, id, policy, &outside).await;
                match path {
                    Ok(p) => (p.network, Some(p.gateway_ip)),
                    Err(e) => {
                        crate::egress::remove(docker, id).await;
                        return Err(e);
                    }
                }
            }
        };
        let storage_opt_supported = spec.limits.disk.is_some()
            && self.storage_opt_supported(&spec.image, req.owner).await?;
        let live_runtime = live_tier(spec) && self.has_live_runtime().await;
        let private_agent = agent_volume::needs_private_copy(spec);
        if private_agent {
            agent_volume::make_private(docker, id, &spec.image, req.owner).await?;
        }
        let body = |shared_deltas| {
            create_body(
                spec,
                &CreateParams {
                    sandbox_id: id,
                    labels: &req.labels,
                    env: req.agent_env.clone(),
                    agent_volume: &volume,
                    storage_opt_supported,
                    network: &network,
                    dns: dns.as_deref(),
                    shared_deltas,
                    host_pid_max: self.inner.host_pid_max,
                    live_runtime,
                },
            )
        };
        let shared_root = self.shared_deltas();
        let shared_dir = shared_root.and_then(|root| {
            use std::os::unix::fs::DirBuilderExt;
            let dir = corral_core::backend::sandbox_deltas_dir(root, id);
            let made = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(&dir);
            match made {
                Ok(()) => Some(dir),
                Err(e) => {
                    tracing::warn!(sandbox = id, dir = %dir.display(), error = %e, "cannot make the sandbox's shared deltas directory; its forks stream their deltas");
                    None
                }
            }
        });
        let shared = shared_dir.as_deref();
        let mut created = match body(shared) {
            Ok(b) => {
                self.create_container(&container_name(id), id, &spec.image, b)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        if let (Err(e), Some(dir)) = (&created, shared_root) {
            // The daemon does not see this host's files after all (corral
            // runs in another container, or on another machine than the
            // socket's daemon): forks stream their deltas from now on.
            if e.to_string().contains(&dir.display().to_string()) {
                tracing::warn!(dir = %dir.display(), error = %e, "the daemon cannot mount the shared deltas directory; forks stream their deltas");
                self.inner.share_failed.store(true, Ordering::Relaxed);
                created = match body(None) {
                    Ok(b) => {
                        self.create_container(&container_name(id), id, &spec.image, b)
                            .await
                    }
                    Err(e) => Err(e.into()),
                };
            }
        }
        match created {
            Ok(cid) => Ok(Placement(cid)),
            Err(e) => {
                if private_agent {
                    agent_volume::remove_private(docker, id).await;
                }
                if dns.is_some() {
                    crate::egress::remove(docker, id).await;
                }
                Err(e)
            }
        }
    }

    async fn do_connect(&self, container: &str, sandbox: &str) -> Result<AgentStream, Error> {
        let docker = &self.inner.docker;
        let what = format!("attach to the agent in sandbox {sandbox}");
        let options = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(false)
            .build();
        let AttachContainerResults { output, input } = self
            .call(&what, || {
                docker.attach_container(container, Some(options.clone()))
            })
            .await
            .map_err(|e| api(what.clone(), e))?;
        let output = output.map(|item| match item {
            Ok(LogOutput::StdOut { message }) => Ok(AgentOutput::Control(message)),
            // PID 1's stderr: the agent's own log lines.
            Ok(other) => Ok(AgentOutput::Log(other.into_bytes())),
            Err(e) => Err(std::io::Error::other(e)),
        });
        Ok(AgentStream {
            output: Box::pin(output),
            input,
        })
    }

    async fn do_list(&self) -> Result<Vec<SandboxInfo>, Error> {
        crate::gc::list(self).await
    }
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "Docker"
    }

    fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            self.inner
                .docker
                .ping()
                .await
                .map(|_| ())
                .map_err(|e| api("ping the daemon", e))
        })
    }

    fn prepare<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>> {
        Box::pin(self.do_prepare(req))
    }

    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>> {
        Box::pin(self.do_create(req))
    }

    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let docker = &self.inner.docker;
            let cid = placement.id();
            let id = req.sandbox_id;
            self.call(&format!("start sandbox {id}"), || async {
                match docker.start_container(cid, None).await {
                    // 304: already started (a retried start whose first answer was lost).
                    Err(e) if status_code(&e) == Some(304) => Ok(()),
                    other => other,
                }
            })
            .await
            .map_err(|e| api(format!("start sandbox {id} (container {})", short(cid)), e))
        })
    }

    fn checkpoint<'a>(
        &'a self,
        placement: &'a Placement,
        dir: &'a std::path::Path,
        resume: bool,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(self.live_checkpoint(placement.id(), dir, resume))
    }

    fn restore<'a>(
        &'a self,
        placement: &'a Placement,
        dir: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.live_restore(placement.id(), dir))
    }

    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>> {
        Box::pin(self.do_connect(placement.id(), sandbox_id))
    }

    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>> {
        Box::pin(crate::state::container_state(
            &self.inner.docker,
            placement.id(),
            &self.inner.config.retry,
            &self.inner.retries,
        ))
    }

    fn exit_details<'a>(
        &'a self,
        placement: &'a Placement,
        mut state: ContainerState,
    ) -> BoxFuture<'a, ContainerState> {
        Box::pin(async move {
            let cid = placement.id();
            // The daemon sets OOMKilled only when its oom event arrives
            // before the exit; when they race the other way the container
            // reads as merely stopped, and the event is what tells the OOM.
            if !state.oom_killed && state.exit_code == Some(137) && self.oom_event_seen(cid).await {
                tracing::info!(
                    container = short(cid),
                    "container killed by SIGKILL after an oom event: reporting an OOM kill"
                );
                state.oom_killed = true;
            }
            state.log_tail = crate::state::log_tail(&self.inner.docker, cid, 10).await;
            state
        })
    }

    fn watch(&self, placement: &Placement, on_death: OnDeath) {
        self.inner
            .events
            .watch(&self.inner.docker, placement.id(), on_death);
    }

    fn unwatch(&self, placement: &Placement) {
        self.inner.events.unwatch(placement.id());
    }

    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.remove_container(placement.id(), sandbox_id))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>> {
        Box::pin(self.do_list())
    }

    fn egress_counts<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<corral_core::egress::EgressCounts>, Error>> {
        Box::pin(self.egress_stats(sandbox_id))
    }

    fn collect_garbage(&self) -> BoxFuture<'_, Result<Vec<String>, Error>> {
        Box::pin(async move {
            let mut removed = crate::gc::remove_orphan_gateways(self).await?;
            removed.extend(crate::gc::remove_dangling_volumes(self).await?);
            Ok(removed)
        })
    }

    fn images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, Error>> {
        Box::pin(DockerBackend::images(self))
    }

    fn pull<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.ensure_image(image))
    }

    fn freeze<'a>(
        &'a self,
        placement: &'a Placement,
        frozen: bool,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.freeze_container(placement.id(), frozen))
    }

    fn open_port<'a>(
        &'a self,
        placement: &'a Placement,
        port: u16,
    ) -> BoxFuture<'a, Result<corral_core::backend::PortStream, Error>> {
        Box::pin(self.connect_port(placement, port))
    }

    fn usage<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<corral_core::backend::Usage, Error>> {
        Box::pin(self.read_usage(placement))
    }

    fn pulls(&self) -> Vec<PullStatus> {
        self.inner.pulls.in_flight()
    }

    fn image_present<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>> {
        Box::pin(async move {
            let docker = &self.inner.docker;
            let what = format!("inspect image {image}");
            match self.call(&what, || docker.inspect_image(image)).await {
                Ok(_) => Ok(ImagePresence::Present),
                Err(e) if is_not_found(&e) => Ok(ImagePresence::Absent),
                Err(e) => Err(api(what, e)),
            }
        })
    }

    fn keeps_snapshot_images(&self) -> bool {
        true
    }

    fn checkpoints(&self, spec: &corral_core::SandboxSpec) -> bool {
        // Asked at the first such create, before any sandbox of it exists.
        live_tier(spec) && self.inner.live_runtime.get() == Some(&true)
    }

    fn shared_deltas(&self) -> Option<&std::path::Path> {
        self.inner
            .shared_deltas
            .as_deref()
            .filter(|_| !self.inner.share_failed.load(Ordering::Relaxed))
    }

    fn image_snapshot<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<corral_core::principal::QualifiedName>, Error>> {
        Box::pin(self.snapshot_of_image(image))
    }

    fn snapshot<'a>(
        &'a self,
        placement: &'a Placement,
        req: &'a corral_core::snapshot::SnapshotRequest<'a>,
    ) -> BoxFuture<'a, Result<corral_core::snapshot::SnapshotInfo, Error>> {
        Box::pin(self.take_snapshot(placement, req))
    }

    fn snapshots(
        &self,
    ) -> BoxFuture<'_, Result<Vec<corral_core::backend::LabelledSnapshot>, Error>> {
        Box::pin(self.list_snapshots())
    }

    fn delete_snapshot<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.remove_snapshot(name))
    }

    fn counters(&self) -> BackendCounters {
        BackendCounters {
            retries: self.inner.retries.load(Ordering::Relaxed),
        }
    }

    fn commit<'a>(
        &'a self,
        placement: &'a Placement,
        reference: &'a str,
        labels: &'a std::collections::HashMap<String, String>,
    ) -> BoxFuture<'a, Result<corral_core::backend::BuiltImage, Error>> {
        Box::pin(self.commit_built(placement, reference, labels))
    }

    fn mark_paused<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
        paused: bool,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let name = if paused {
                crate::container_config::paused_container_name(sandbox_id)
            } else {
                container_name(sandbox_id)
            };
            let opts = bollard::query_parameters::RenameContainerOptionsBuilder::default()
                .name(&name)
                .build();
            self.inner
                .docker
                .rename_container(placement.id(), opts)
                .await
                .map_err(|e| api(format!("rename container {} to {name}", placement.id()), e))
        })
    }

    fn built_image<'a>(
        &'a self,
        reference: &'a str,
    ) -> BoxFuture<'a, Result<Option<corral_core::backend::BuiltImage>, Error>> {
        Box::pin(self.built(reference))
    }

    fn built_images<'a>(
        &'a self,
        label: &'a str,
    ) -> BoxFuture<'a, Result<Vec<corral_core::backend::BuiltImage>, Error>> {
        Box::pin(self.built_labelled(label))
    }

    fn remove_image<'a>(&'a self, reference: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.remove_built(reference))
    }
}

/// Makes the host-side helper directories of `nosuid` mounts (an empty
/// lower layer, the overlay's work directory), private to the user.
fn prepare_nosuid_mounts(spec: &SandboxSpec) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    for (i, m) in spec.mounts.iter().enumerate().filter(|(_, m)| m.nosuid) {
        let bad = |reason: String| {
            Error::InvalidSpec(corral_core::SpecError {
                field: format!("mounts[{i}].host"),
                value: m.host.clone(),
                reason,
            })
        };
        match std::fs::metadata(&m.host) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(bad("a nosuid mount must be a directory".into())),
            Err(e) => return Err(bad(format!("cannot read: {e}"))),
        }
        let (lower, work) = crate::container_config::overlay_dirs(&m.host);
        for dir in [&lower, &work] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| bad(format!("cannot create {}: {e}", dir.display())))?;
        }
        // Whatever sits in the lower layer would show through the mount.
        let empty = std::fs::read_dir(&lower)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !empty {
            return Err(bad(format!(
                "{} must be an empty directory (it is the overlay's lower layer)",
                lower.display()
            )));
        }
    }
    Ok(())
}

fn create_error(id: &str, image: &str, e: bollard::errors::Error) -> Error {
    match status_code(&e) {
        Some(404) => Error::ImageNotFound {
            image: image.to_string(),
            reason: e.to_string(),
        },
        _ if crate::error::unknown_runtime(&e) == Some(corral_core::spec::GVISOR_RUNTIME) => {
            Error::Unsupported {
                what: format!(
                    "isolation 'gvisor': this Docker daemon has no runtime '{}' \
                     (scripts/ensure-gvisor.sh installs and registers it; `corral doctor` \
                     says whether it works)",
                    corral_core::spec::GVISOR_RUNTIME
                ),
            }
        }
        _ => api(format!("create sandbox {id} from {image}"), e),
    }
}

/// Whether sandboxes of `spec` run under [`corral_core::spec::GVISOR_LIVE_RUNTIME`]
/// where the daemon has it: gVisor without network (runsc checkpoints no
/// sandbox on the host's network stack).
fn live_tier(spec: &corral_core::SandboxSpec) -> bool {
    spec.isolation == corral_core::Isolation::Gvisor && spec.network == corral_core::Network::None
}
