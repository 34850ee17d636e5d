//! The Docker backend: connects to a daemon and creates sandboxes on it.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, CreateImageOptionsBuilder};
use bollard::Docker;
use corral_core::breaker::{Admit, Breaker, BreakerConfig};
use corral_core::labels::Owner;
use corral_core::outcome::short;
use corral_core::{RetryPolicy, SandboxSpec};
use futures_util::StreamExt;
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::agent_volume;
use crate::conn::AgentConn;
use crate::container_config::{container_name, create_body, keepalive, CreateParams};
use crate::error::{is_connection_error, is_not_found, status_code, DockerError};
use crate::events::EventRouter;
use crate::host::{self, RealHost};
use crate::limits::{default_slot_dir, Limiter};
use crate::metrics::{Metrics, MetricsSnapshot, StartPhase};
use crate::retry::retry;
use crate::sandbox::{remove_container, Sandbox};

/// How long a pull of a missing image may take before corral gives up.
const PULL_TIMEOUT: Duration = Duration::from_secs(300);

/// A connection to one daemon. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct DockerBackend {
    pub(crate) inner: Arc<BackendInner>,
}

pub(crate) struct BackendInner {
    pub(crate) docker: Docker,
    pub(crate) endpoint: String,
    pub(crate) owner: Owner,
    pub(crate) config: BackendConfig,
    pub(crate) metrics: Metrics,
    agent_volume: OnceCell<String>,
    network: OnceCell<crate::network::NetworkInfo>,
    seal_key: OnceCell<Arc<crate::seal::SealKey>>,
    storage_opt: OnceCell<bool>,
    pub(crate) events: Arc<EventRouter>,
    start_slots: Limiter,
    pub(crate) exec_slots: Limiter,
    breaker: Mutex<Breaker>,
}

/// How to reach the daemon and how hard to lean on it.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// `unix:///path`, `tcp://host:port` or a socket path; `None` tries
    /// `DOCKER_HOST`, Docker's default socket and Podman's sockets.
    pub endpoint: Option<String>,
    /// Retries of transient daemon errors.
    pub retry: RetryPolicy,
    /// Container starts in flight at once (0: unlimited).
    pub start_limit: usize,
    /// Daemon execs (agent attaches) in flight at once (0: unlimited).
    pub exec_limit: usize,
    /// Share the limits with every corral process of this user on the host
    /// through lock files in `slot_dir`.
    pub shared_slots: bool,
    /// Where the slot lock files live; `None` is the per-user default.
    pub slot_dir: Option<PathBuf>,
    /// Longest wait for a slot before failing with a clear error.
    pub slot_wait_timeout: Duration,
    /// Back-pressure on starts when the daemon's error rate or latency spikes.
    pub breaker: BreakerConfig,
    /// Remove orphaned containers (owner process gone) at connect.
    pub reap_orphans: bool,
    /// Then again at this interval (zero: only at connect).
    pub reap_interval: Duration,
    /// Starts slower than this are logged with their phases.
    pub slow_start: Duration,
    /// The file holding the user's secret key that seals persistent
    /// containers (0600); `None`: `$XDG_DATA_HOME/corral/seal.key`, else
    /// `~/.local/share/corral/seal.key`.
    pub seal_key_file: Option<PathBuf>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            endpoint: None,
            retry: RetryPolicy::default(),
            start_limit: 8,
            exec_limit: 16,
            shared_slots: true,
            slot_dir: None,
            slot_wait_timeout: Duration::from_secs(600),
            breaker: BreakerConfig::default(),
            reap_orphans: true,
            reap_interval: Duration::from_secs(300),
            slow_start: Duration::from_secs(5),
            seal_key_file: None,
        }
    }
}

/// Where a sandbox start spent its time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartTimings {
    /// Held back by the open circuit breaker.
    pub breaker_wait: Duration,
    /// Waiting for a start slot.
    pub slot_wait: Duration,
    /// Looking up (or pulling) the image.
    pub image: Duration,
    /// Making sure the agent volume is filled.
    pub agent_volume: Duration,
    /// Creating the container.
    pub create: Duration,
    /// Starting it.
    pub start: Duration,
    /// Attaching to the agent (exec slot wait included) and the handshake.
    pub attach: Duration,
    /// Running the start-up commands.
    pub startup: Duration,
    /// All of it.
    pub total: Duration,
    /// Round trip of the first command run after the start (`None` until
    /// one has run).
    pub first_command: Option<Duration>,
}

/// A span for one phase of a start, a child of the `sandbox_start` span.
fn phase_span(phase: StartPhase) -> tracing::Span {
    tracing::debug_span!("start_phase", phase = phase.as_str())
}

/// A started container with its agent attached, before it becomes a [`Sandbox`].
pub(crate) struct Started {
    pub container_id: String,
    pub conn: AgentConn,
    pub timings: StartTimings,
}

impl DockerBackend {
    /// Connects, failing fast with every endpoint tried when no daemon
    /// answers; then reaps orphans when configured to.
    pub async fn connect(config: &BackendConfig) -> Result<Self, DockerError> {
        let (docker, endpoint) = crate::connect::connect(config.endpoint.as_deref()).await?;
        let slot_dir = config
            .shared_slots
            .then(|| config.slot_dir.clone().unwrap_or_else(default_slot_dir));
        let backend = DockerBackend {
            inner: Arc::new(BackendInner {
                docker,
                endpoint,
                owner: host::this_owner(),
                metrics: Metrics::default(),
                agent_volume: OnceCell::new(),
                network: OnceCell::new(),
                seal_key: OnceCell::new(),
                storage_opt: OnceCell::new(),
                events: Arc::new(EventRouter::default()),
                start_slots: Limiter::new(
                    "start",
                    config.start_limit,
                    slot_dir.clone(),
                    config.slot_wait_timeout,
                ),
                exec_slots: Limiter::new(
                    "exec",
                    config.exec_limit,
                    slot_dir,
                    config.slot_wait_timeout,
                ),
                breaker: Mutex::new(Breaker::new(config.breaker.clone())),
                config: config.clone(),
            }),
        };
        if config.reap_orphans {
            backend.spawn_reaper();
        }
        Ok(backend)
    }

    /// The endpoint in use.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The raw client, for tests and benchmarks that measure the daemon itself.
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// This process's owner record, as put on every container it creates.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The configuration in force.
    pub fn config(&self) -> &BackendConfig {
        &self.inner.config
    }

    /// The backend's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// corral's sandbox network (a bridge with inter-container
    /// communication off), created when missing and checked once per
    /// backend; every sandbox with network access joins it.
    pub async fn sandbox_network(&self) -> Result<crate::network::NetworkInfo, DockerError> {
        self.inner
            .network
            .get_or_try_init(|| crate::network::ensure(&self.inner.docker))
            .await
            .cloned()
    }

    /// The user's seal key (`seal.rs`), read (or made) once.
    pub async fn seal_key(&self) -> Result<Arc<crate::seal::SealKey>, DockerError> {
        let path = self
            .inner
            .config
            .seal_key_file
            .clone()
            .unwrap_or_else(crate::seal::default_key_path);
        self.inner
            .seal_key
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || crate::seal::SealKey::load_or_create(&path))
                    .await
                    .map_err(|e| DockerError::Agent {
                        sandbox: String::new(),
                        message: format!("reading the seal key failed: {e}"),
                    })?
                    .map(Arc::new)
                    .map_err(DockerError::InvalidSpec)
            })
            .await
            .cloned()
    }

    /// Whether `info`'s container may be adopted for `spec`: for a
    /// persistent spec only when its seal proves this user's corral made it
    /// for the session from that very spec (`seal.rs`); other sandboxes are
    /// not sealed.
    pub(crate) async fn sealed_for(
        &self,
        info: &crate::gc::SandboxInfo,
        spec: &SandboxSpec,
    ) -> bool {
        let Some(key) = &spec.persistent else {
            return true;
        };
        let Ok(seal_key) = self.seal_key().await else {
            return false;
        };
        seal_key.verify(&info.labels, key, &crate::seal::spec_digest(spec))
            == crate::seal::Verdict::Sealed { spec_matches: true }
    }

    /// Removes orphans now and then every `reap_interval`, in the background,
    /// for as long as the backend lives.
    fn spawn_reaper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.config.reap_interval;
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let backend = DockerBackend { inner };
                match backend.gc(false).await {
                    Ok(report) if !report.removed.is_empty() => {
                        let n = report.removed.len() as u64;
                        backend
                            .inner
                            .metrics
                            .orphans_reaped
                            .fetch_add(n, Ordering::Relaxed);
                        tracing::info!(removed = n, "reaped orphaned sandboxes");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "reaping orphaned sandboxes failed"),
                }
                drop(backend);
                if interval.is_zero() {
                    return;
                }
                tokio::time::sleep(interval).await;
            }
        });
    }

    /// Creates and starts a sandbox, connects to its agent and runs its
    /// start-up commands. On any failure nothing is left behind.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, DockerError> {
        let id = format!("sb-{}", host::random_hex(12));
        let span = tracing::info_span!("sandbox_start", sandbox = %id, image = %spec.image);
        let started = self.start_new(spec, &id).instrument(span).await?;
        let sandbox = Sandbox::new(
            id,
            started.container_id,
            spec.clone(),
            started.conn,
            self.clone(),
        );
        let mut timings = started.timings;
        let startup = sandbox
            .run_startup()
            .instrument(phase_span(StartPhase::Startup))
            .await;
        timings.startup = match startup {
            Ok(took) => took,
            Err(e) => {
                if let Err(rm) = sandbox.destroy().await {
                    tracing::warn!(sandbox = sandbox.id(), error = %rm, "removing a sandbox whose start-up failed failed");
                }
                return Err(e);
            }
        };
        timings.total += timings.startup;
        self.report_start(sandbox.id(), &timings);
        sandbox.set_timings(timings);
        Ok(sandbox)
    }

    /// Attaches to an existing corral container, e.g. a persistent sandbox
    /// an earlier corral process left running, instead of creating another.
    pub async fn adopt(
        &self,
        container_id: &str,
        sandbox_id: &str,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, DockerError> {
        let conn = AgentConn::attach(
            &self.inner.docker,
            container_id,
            sandbox_id,
            crate::container_config::keepalive(spec),
            &self.inner.config.retry,
            &self.inner.metrics,
        )
        .await?;
        Ok(Sandbox::new(
            sandbox_id.to_string(),
            container_id.to_string(),
            spec.clone(),
            conn,
            self.clone(),
        ))
    }

    fn report_start(&self, id: &str, t: &StartTimings) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if t.total >= self.inner.config.slow_start {
            tracing::warn!(
                sandbox = id,
                total_ms = ms(t.total),
                breaker_wait_ms = ms(t.breaker_wait),
                slot_wait_ms = ms(t.slot_wait),
                image_ms = ms(t.image),
                agent_volume_ms = ms(t.agent_volume),
                create_ms = ms(t.create),
                start_ms = ms(t.start),
                attach_ms = ms(t.attach),
                startup_ms = ms(t.startup),
                "slow sandbox start"
            );
        } else {
            tracing::debug!(sandbox = id, total_ms = ms(t.total), "sandbox started");
        }
    }

    /// Validates `spec`, then creates and starts container `corral-<id>` and
    /// attaches to its agent, under the start limit and the breaker.
    pub(crate) async fn start_new(
        &self,
        spec: &SandboxSpec,
        id: &str,
    ) -> Result<Started, DockerError> {
        let total = Instant::now();
        let mut timings = StartTimings::default();
        spec.validate(&RealHost)?;
        let env = spec.resolve_env(&RealHost)?;
        let docker = &self.inner.docker;

        let t = Instant::now();
        self.ensure_image(&spec.image)
            .instrument(phase_span(StartPhase::Image))
            .await?;
        timings.image = t.elapsed();
        let storage_opt_supported = match spec.limits.disk {
            Some(_) => {
                if !self.storage_opt_supported(&spec.image).await? {
                    return Err(DockerError::Unsupported {
                        what: "limits.disk: this daemon's storage driver does not support --storage-opt size= \
                               (needs overlay2 on xfs with pquota, or devicemapper/btrfs/zfs); leave the disk limit unset"
                            .to_string(),
                    });
                }
                true
            }
            None => false,
        };
        let t = Instant::now();
        let volume = self
            .inner
            .agent_volume
            .get_or_try_init(|| agent_volume::ensure(docker, &spec.image, &self.inner.owner))
            .instrument(phase_span(StartPhase::AgentVolume))
            .await?
            .clone();
        timings.agent_volume = t.elapsed();
        prepare_nosuid_mounts(spec)?;
        let seal = match &spec.persistent {
            Some(key) => {
                let digest = crate::seal::spec_digest(spec);
                let seal = self.seal_key().await?.seal(id, key, &digest);
                Some((digest, seal))
            }
            None => None,
        };
        let network = match spec.network {
            corral_core::Network::Bridge => self.sandbox_network().await?.id,
            corral_core::Network::None => String::new(),
        };

        timings.breaker_wait = self
            .breaker_admit()
            .instrument(phase_span(StartPhase::BreakerWait))
            .await?;
        let slot = self
            .inner
            .start_slots
            .acquire()
            .instrument(phase_span(StartPhase::SlotWait))
            .await?;
        timings.slot_wait = slot.waited;
        if !slot.waited.is_zero() {
            self.inner.metrics.slot_wait(slot.waited);
        }

        let private_agent = agent_volume::needs_private_copy(spec);
        if private_agent {
            let t = Instant::now();
            agent_volume::make_private(docker, id, &spec.image, &self.inner.owner)
                .instrument(phase_span(StartPhase::AgentVolume))
                .await?;
            timings.agent_volume += t.elapsed();
        }
        let name = container_name(id);
        let body = create_body(
            spec,
            &CreateParams {
                sandbox_id: id,
                owner: &self.inner.owner,
                env,
                agent_volume: &volume,
                storage_opt_supported,
                network: &network,
                seal,
            },
        );
        let probe = self.breaker_probe_flag();
        let t = Instant::now();
        let created = self
            .create_container(&name, id, &spec.image, body)
            .instrument(phase_span(StartPhase::Create))
            .await;
        timings.create = t.elapsed();
        let cid = match created {
            Ok(cid) => cid,
            Err(e) => {
                self.breaker_record(t, &e, probe);
                self.inner
                    .metrics
                    .start_failures
                    .fetch_add(1, Ordering::Relaxed);
                if private_agent {
                    agent_volume::remove_private(docker, id).await;
                }
                return Err(e);
            }
        };

        let t2 = Instant::now();
        let policy = &self.inner.config.retry;
        let start = retry(
            policy,
            &self.inner.metrics,
            &format!("start sandbox {id}"),
            || async {
                match docker.start_container(&cid, None).await {
                    // 304: already started (a retried start whose first answer was lost).
                    Err(e) if status_code(&e) == Some(304) => Ok(()),
                    other => other,
                }
            },
        )
        .instrument(phase_span(StartPhase::Start))
        .await
        .map_err(|e| {
            DockerError::api(format!("start sandbox {id} (container {})", short(&cid)), e)
        });
        timings.start = t2.elapsed();
        let ok = start.is_ok();
        match &start {
            Ok(()) => self.breaker_ok(t, probe),
            Err(e) => self.breaker_record(t, e, probe),
        }
        drop(slot);

        let attached = match start {
            Ok(()) => {
                let t = Instant::now();
                let r = async {
                    let exec_slot = self.inner.exec_slots.acquire().await?;
                    if !exec_slot.waited.is_zero() {
                        self.inner.metrics.slot_wait(exec_slot.waited);
                    }
                    AgentConn::attach(
                        docker,
                        &cid,
                        id,
                        keepalive(spec),
                        policy,
                        &self.inner.metrics,
                    )
                    .await
                }
                .instrument(phase_span(StartPhase::Attach))
                .await;
                timings.attach = t.elapsed();
                r
            }
            Err(e) => Err(e),
        };
        match attached {
            Ok(conn) => {
                debug_assert!(ok);
                let m = &self.inner.metrics;
                m.sandboxes_started.fetch_add(1, Ordering::Relaxed);
                for (phase, took) in [
                    (StartPhase::BreakerWait, timings.breaker_wait),
                    (StartPhase::SlotWait, timings.slot_wait),
                    (StartPhase::Image, timings.image),
                    (StartPhase::AgentVolume, timings.agent_volume),
                    (StartPhase::Create, timings.create),
                    (StartPhase::Start, timings.start),
                    (StartPhase::Attach, timings.attach),
                ] {
                    m.phase(phase, took);
                }
                timings.total = total.elapsed();
                Ok(Started {
                    container_id: cid,
                    conn,
                    timings,
                })
            }
            Err(e) => {
                self.inner
                    .metrics
                    .start_failures
                    .fetch_add(1, Ordering::Relaxed);
                if let Err(rm) = remove_container(&self.inner, &cid, id).await {
                    tracing::warn!(sandbox = %id, error = %rm, "removing a sandbox that failed to start failed");
                }
                Err(e)
            }
        }
    }

    /// Creates the container, retrying transient errors. A retried create
    /// whose first attempt did go through meets a name conflict: the
    /// container already there is ours when it carries our sandbox label.
    async fn create_container(
        &self,
        name: &str,
        id: &str,
        image: &str,
        body: ContainerCreateBody,
    ) -> Result<String, DockerError> {
        let docker = &self.inner.docker;
        let res = retry(
            &self.inner.config.retry,
            &self.inner.metrics,
            &format!("create sandbox {id}"),
            || {
                let opts = CreateContainerOptionsBuilder::default().name(name).build();
                docker.create_container(Some(opts), body.clone())
            },
        )
        .await;
        match res {
            Ok(c) => Ok(c.id),
            Err(e) if status_code(&e) == Some(409) => {
                let existing = docker
                    .inspect_container(
                        name,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await
                    .map_err(|e2| {
                        DockerError::api(format!("inspect {name} after a name conflict"), e2)
                    })?;
                let ours = existing
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|l| l.get(corral_core::labels::SANDBOX).cloned())
                    .as_deref()
                    == Some(id);
                match (ours, existing.id) {
                    (true, Some(cid)) => Ok(cid),
                    _ => Err(DockerError::api(
                        format!("create sandbox {id} from {image}"),
                        e,
                    )),
                }
            }
            Err(e) => Err(create_error(id, image, e)),
        }
    }

    /// Waits while the breaker is open; returns how long.
    async fn breaker_admit(&self) -> Result<Duration, DockerError> {
        let started = Instant::now();
        loop {
            let admit = {
                let mut b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
                b.admit(Instant::now())
            };
            match admit {
                Admit::Go { .. } => {
                    let waited = started.elapsed();
                    if !waited.is_zero() {
                        let us = waited.as_micros().min(u64::MAX as u128) as u64;
                        self.inner
                            .metrics
                            .breaker_wait_us
                            .fetch_add(us, Ordering::Relaxed);
                    }
                    return Ok(waited);
                }
                Admit::Wait(d) => {
                    if started.elapsed() + d > self.inner.config.slot_wait_timeout {
                        return Err(DockerError::SlotTimeout {
                            what: "start (circuit breaker open)",
                            limit: self.inner.config.start_limit,
                            waited: started.elapsed(),
                        });
                    }
                    tokio::time::sleep(d).await;
                }
            }
        }
    }

    fn breaker_probe_flag(&self) -> bool {
        let b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
        b.state() == corral_core::breaker::BreakerState::HalfOpen
    }

    fn breaker_ok(&self, since: Instant, probe: bool) {
        let mut b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
        b.record(Instant::now(), true, since.elapsed(), probe);
    }

    /// Counts a failed start against the breaker only when the daemon is to
    /// blame (a bad spec says nothing about the daemon's health).
    fn breaker_record(&self, since: Instant, e: &DockerError, probe: bool) {
        let daemon_trouble = e.failure().kind == corral_core::FailureKind::DaemonUnavailable;
        let mut b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
        let before = b.times_opened();
        if daemon_trouble || probe {
            b.record(Instant::now(), !daemon_trouble, since.elapsed(), probe);
        }
        if b.times_opened() > before {
            self.inner
                .metrics
                .breaker_opened
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "daemon trouble: start circuit breaker opened, slowing down new starts");
        }
    }

    /// Whether `image` is already on the daemon (nothing is pulled).
    pub async fn image_present(&self, image: &str) -> Result<bool, DockerError> {
        let docker = &self.inner.docker;
        let what = format!("inspect image {image}");
        let inspect = retry(&self.inner.config.retry, &self.inner.metrics, &what, || {
            docker.inspect_image(image)
        });
        match inspect.await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(DockerError::api(what, e)),
        }
    }

    /// Makes sure `image` is present, pulling it when a registry can supply it.
    pub async fn ensure_image(&self, image: &str) -> Result<(), DockerError> {
        let docker = &self.inner.docker;
        let what = format!("inspect image {image}");
        let inspect = retry(&self.inner.config.retry, &self.inner.metrics, &what, || {
            docker.inspect_image(image)
        });
        match inspect.await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(DockerError::api(format!("inspect image {image}"), e)),
        }
        let (from, tag) = split_tag(image);
        let opts = CreateImageOptionsBuilder::default()
            .from_image(from)
            .tag(tag)
            .build();
        let pull = async {
            let mut stream = docker.create_image(Some(opts), None, None);
            while let Some(item) = stream.next().await {
                if let Err(e) = item {
                    if is_connection_error(&e) {
                        return Err(DockerError::api(format!("pull image {image}"), e));
                    }
                    return Err(DockerError::ImageNotFound {
                        image: image.to_string(),
                        reason: e.to_string(),
                    });
                }
            }
            Ok(())
        };
        match tokio::time::timeout(PULL_TIMEOUT, pull).await {
            Ok(res) => res?,
            Err(_) => {
                return Err(DockerError::ImageNotFound {
                    image: image.to_string(),
                    reason: format!("pull did not finish within {PULL_TIMEOUT:?}"),
                })
            }
        }
        // Some daemons end a failed pull's stream without an error item.
        match docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::ImageNotFound {
                image: image.to_string(),
                reason: "the pull finished but the image is still missing".into(),
            }),
            Err(e) => Err(DockerError::api(format!("inspect image {image}"), e)),
        }
    }

    /// Whether the daemon honours `--storage-opt size=`: probed once by
    /// creating (never starting) a container with it, then cached.
    pub async fn storage_opt_supported(&self, image: &str) -> Result<bool, DockerError> {
        let docker = &self.inner.docker;
        let supported = self
            .inner
            .storage_opt
            .get_or_try_init(|| async {
                let probe_id = format!("probe-{}", host::random_hex(8));
                let name = container_name(&probe_id);
                let body = ContainerCreateBody {
                    image: Some(image.to_string()),
                    entrypoint: Some(vec!["/nonexistent".into()]),
                    labels: Some(
                        [(corral_core::labels::SANDBOX.to_string(), probe_id.clone())]
                            .into_iter()
                            .chain(self.inner.owner.labels())
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
                        remove_container(&self.inner, &c.id, &probe_id).await?;
                        Ok(true)
                    }
                    Err(e) if is_connection_error(&e) => {
                        Err(DockerError::api("probe storage-opt support", e))
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "storage-opt size= is not supported");
                        Ok(false)
                    }
                }
            })
            .await?;
        Ok(*supported)
    }
}

/// Makes the host-side helper directories of `nosuid` mounts (an empty
/// lower layer, the overlay's work directory), private to the user.
fn prepare_nosuid_mounts(spec: &SandboxSpec) -> Result<(), DockerError> {
    use std::os::unix::fs::DirBuilderExt;
    for (i, m) in spec.mounts.iter().enumerate().filter(|(_, m)| m.nosuid) {
        let bad = |reason: String| {
            DockerError::InvalidSpec(corral_core::SpecError {
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

fn create_error(id: &str, image: &str, e: bollard::errors::Error) -> DockerError {
    match status_code(&e) {
        Some(404) => DockerError::ImageNotFound {
            image: image.to_string(),
            reason: e.to_string(),
        },
        _ => DockerError::api(format!("create sandbox {id} from {image}"), e),
    }
}

/// Splits `repo[:tag]` (digests stay whole); the tag defaults to `latest`, so
/// a pull never fetches every tag of a repository.
fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::split_tag;

    #[test]
    fn splits_tags_not_registry_ports() {
        assert_eq!(split_tag("debian"), ("debian", "latest"));
        assert_eq!(split_tag("debian:12"), ("debian", "12"));
        assert_eq!(split_tag("reg:5000/x/y"), ("reg:5000/x/y", "latest"));
        assert_eq!(split_tag("reg:5000/x/y:1"), ("reg:5000/x/y", "1"));
        assert_eq!(split_tag("x@sha256:ab"), ("x@sha256:ab", ""));
    }
}
