//! The runtime: starts sandboxes on a [`Backend`] under corral's limits,
//! and looks after what the backend made (listing, orphans).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_core::backend::{Backend, ImagePresence, Placement, SandboxInfo, StartRequest};
use corral_core::breaker::{Admit, Breaker, BreakerConfig, BreakerState};
use corral_core::config::Config;
use corral_core::labels::{self, ownership, Owner, Ownership};
use corral_core::{Error, FailureKind, SandboxSpec};
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::conn::AgentConn;
use crate::delta::Delta;
use crate::host::{self, RealHost};
use crate::limits::{default_slot_dir, Limiter};
use crate::metrics::{Metrics, MetricsSnapshot, StartPhase};
use crate::sandbox::Sandbox;

/// How hard the runtime leans on its backend, and what it looks after.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Sandbox starts in flight at once (0: unlimited).
    pub start_limit: usize,
    /// Agent connections being opened at once (0: unlimited).
    pub exec_limit: usize,
    /// Share the limits with every corral process of this user on the host
    /// through lock files in `slot_dir`.
    pub shared_slots: bool,
    /// Where the slot lock files live; `None` is the per-user default.
    pub slot_dir: Option<PathBuf>,
    /// Longest wait for a slot before failing with a clear error.
    pub slot_wait_timeout: Duration,
    /// Back-pressure on starts when the engine's error rate or latency spikes.
    pub breaker: BreakerConfig,
    /// Remove orphaned sandboxes (owner process gone) at start.
    pub reap_orphans: bool,
    /// Then again at this interval (zero: only at start).
    pub reap_interval: Duration,
    /// Starts slower than this are logged with their phases.
    pub slow_start: Duration,
    /// The file holding the user's secret key that seals persistent
    /// sandboxes (0600); `None`: `$XDG_DATA_HOME/corral/seal.key`, else
    /// `~/.local/share/corral/seal.key`.
    pub seal_key_file: Option<PathBuf>,
    /// Largest delta snapshot, in bytes (`snapshots.max_bytes`).
    pub snapshot_max_bytes: u64,
    /// Where durable delta snapshots go; `None`: the default of
    /// [`Config::snapshot_dir`].
    pub snapshot_dir: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
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
            snapshot_max_bytes: 1 << 30,
            snapshot_dir: None,
        }
    }
}

impl From<&Config> for RuntimeConfig {
    /// The file speaks in plain numbers (`_ms`) and strings, the runtime in
    /// `Duration`s and paths.
    fn from(config: &Config) -> Self {
        let d = &config.daemon;
        RuntimeConfig {
            start_limit: d.start_limit,
            exec_limit: d.exec_limit,
            shared_slots: d.shared_slots,
            slot_dir: d.slot_dir.as_ref().map(PathBuf::from),
            slot_wait_timeout: Duration::from_millis(d.slot_wait_timeout_ms),
            breaker: d.breaker.clone(),
            reap_orphans: d.reap_orphans,
            reap_interval: Duration::from_millis(d.reap_interval_ms),
            slow_start: Duration::from_millis(d.slow_start_ms),
            seal_key_file: d.seal_key_file.as_ref().map(PathBuf::from),
            snapshot_max_bytes: config.snapshots.max_bytes,
            snapshot_dir: Some(config.snapshot_dir(&RealHost)),
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
    /// Making the agent binary available.
    pub agent_volume: Duration,
    /// Creating the container.
    pub create: Duration,
    /// Starting it.
    pub start: Duration,
    /// Connecting to the agent (slot wait included) and the handshake.
    pub attach: Duration,
    /// Running the start-up commands.
    pub startup: Duration,
    /// All of it.
    pub total: Duration,
    /// Round trip of the first command run after the start (`None` until
    /// one has run).
    pub first_command: Option<Duration>,
}

/// What a garbage collection did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Sandboxes removed.
    pub removed: Vec<SandboxInfo>,
    /// Sandboxes that could not be removed, with the reason.
    pub failed: Vec<(SandboxInfo, String)>,
    /// Sandboxes kept because their owner is alive, on another host, or
    /// they are persistent.
    pub kept: Vec<SandboxInfo>,
    /// What the engine kept for sandboxes or owners already gone, removed:
    /// volume names (Docker's per-sandbox volumes), or `kind/name` for
    /// anything else (Kubernetes: `lease/NAME`, an expired owner's Lease).
    pub volumes_removed: Vec<String>,
    /// Snapshots whose owner is gone (with `all`, every one that is not
    /// durable), removed.
    pub snapshots_removed: Vec<String>,
}

/// How far a [`Runtime::gc_with`] has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcStep {
    /// The sandboxes to remove are known: `total` of them.
    Sandboxes {
        /// How many will be removed (or fail to be).
        total: usize,
    },
    /// One more of them was removed, or failed to be.
    SandboxDone,
    /// What the engine kept for sandboxes gone (volumes, Leases) is being
    /// removed.
    Volumes,
    /// Snapshots whose owner is gone are being removed.
    Snapshots,
}

/// corral's runtime over one backend. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) owner: Owner,
    pub(crate) config: RuntimeConfig,
    pub(crate) metrics: Metrics,
    seal_key: OnceCell<Arc<crate::seal::SealKey>>,
    start_slots: Limiter,
    pub(crate) exec_slots: Limiter,
    breaker: Mutex<Breaker>,
    pub(crate) events: crate::events::EventLog,
    /// The delta snapshots this runtime keeps.
    pub(crate) held: crate::snapshots::HeldSnapshots,
    /// Why resets could not be done in place, each logged once.
    pub(crate) reset_fallbacks_logged: Mutex<std::collections::HashSet<String>>,
    /// Template build steps in progress, by cache image: a second build
    /// of the same step waits for the first and takes its layer.
    pub(crate) build_steps: crate::templates::StepLocks,
}

/// A span for one phase of a start, a child of the `sandbox_start` span.
pub(crate) fn phase_span(phase: StartPhase) -> tracing::Span {
    tracing::debug_span!("start_phase", phase = phase.as_str())
}

/// Told each phase a start enters, as it enters it
/// ([`Runtime::create_watched`]): what a progress display shows while a
/// start waits for a slot, pulls an image or runs start-up commands.
pub type PhaseWatch<'a> = Option<&'a (dyn Fn(StartPhase) + Send + Sync)>;

/// Tells `watch` that `phase` begins; the phase's span.
fn enter(watch: PhaseWatch<'_>, phase: StartPhase) -> tracing::Span {
    if let Some(watch) = watch {
        watch(phase);
    }
    phase_span(phase)
}

/// A started sandbox with its agent connected, before it becomes a [`Sandbox`].
pub(crate) struct Started {
    pub placement: Placement,
    pub conn: AgentConn,
    pub timings: StartTimings,
}

impl Runtime {
    /// A runtime over `backend`; reaps orphans in the background when
    /// configured to. Needs a Tokio runtime.
    pub fn new(backend: Arc<dyn Backend>, config: RuntimeConfig) -> Self {
        let slot_dir = config
            .shared_slots
            .then(|| config.slot_dir.clone().unwrap_or_else(default_slot_dir));
        let runtime = Runtime {
            inner: Arc::new(RuntimeInner {
                backend,
                owner: host::this_owner(),
                metrics: Metrics::default(),
                seal_key: OnceCell::new(),
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
                events: crate::events::EventLog::default(),
                held: crate::snapshots::HeldSnapshots::new(
                    config
                        .snapshot_dir
                        .clone()
                        .unwrap_or_else(|| Config::default().snapshot_dir(&RealHost)),
                ),
                reset_fallbacks_logged: Mutex::default(),
                build_steps: Default::default(),
                config,
            }),
        };
        if runtime.inner.config.reap_orphans {
            runtime.spawn_reaper();
        }
        runtime
    }

    /// The backend sandboxes run on.
    /// The lifecycle events of this runtime's sandboxes
    /// ([`crate::events`]).
    pub fn events(&self) -> &crate::events::EventLog {
        &self.inner.events
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Where the backend is connected.
    pub fn endpoint(&self) -> &str {
        self.inner.backend.endpoint()
    }

    /// This process's owner record, as put on every sandbox it creates.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The configuration in force.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// The runtime's and the backend's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut m = self.inner.metrics.snapshot();
        m.retries = self.inner.backend.counters().retries;
        m
    }

    /// Checks that the engine answers.
    pub async fn ping(&self) -> Result<(), Error> {
        self.inner.backend.ping().await
    }

    /// Whether `image` is already present, as far as the backend can tell
    /// (nothing is pulled).
    pub async fn image_present(&self, image: &str) -> Result<ImagePresence, Error> {
        self.inner.backend.image_present(image).await
    }

    /// The snapshot whose image `image` resolves to, if any
    /// ([`Backend::image_snapshot`]).
    pub async fn image_snapshot(
        &self,
        image: &str,
    ) -> Result<Option<corral_core::principal::QualifiedName>, Error> {
        self.inner.backend.image_snapshot(image).await
    }

    /// The user's seal key (`seal.rs`), read (or made) once.
    pub async fn seal_key(&self) -> Result<Arc<crate::seal::SealKey>, Error> {
        let path = self
            .inner
            .config
            .seal_key_file
            .clone()
            .unwrap_or_else(crate::seal::default_key_path);
        self.inner
            .seal_key
            .get_or_try_init(|| async move {
                let what = format!("reading the seal key {}", path.display());
                tokio::task::spawn_blocking(move || crate::seal::SealKey::load_or_create(&path))
                    .await
                    .map_err(|e| Error::Host {
                        what,
                        reason: e.to_string(),
                    })?
                    .map(Arc::new)
                    .map_err(Error::InvalidSpec)
            })
            .await
            .cloned()
    }

    /// Whether `info`'s sandbox may be adopted for `spec`: for a persistent
    /// spec only when its seal proves this user's corral made it for the
    /// session from that very spec (`seal.rs`); other sandboxes are not
    /// sealed.
    pub(crate) async fn sealed_for(&self, info: &SandboxInfo, spec: &SandboxSpec) -> bool {
        let Some(key) = &spec.persistent else {
            return true;
        };
        let Ok(seal_key) = self.seal_key().await else {
            return false;
        };
        seal_key.verify(&info.labels, key, &crate::seal::spec_digest(spec))
            == crate::seal::Verdict::Sealed { spec_matches: true }
    }

    /// Every sandbox with corral's labels on the backend, running or not,
    /// with whether its owner is alive: judged here from the owner labels
    /// (a process on this host), or by the backend when it says it judges
    /// ownership itself (`Backend::judges_ownership`).
    pub async fn list_sandboxes(&self) -> Result<Vec<SandboxInfo>, Error> {
        let backend = &self.inner.backend;
        let mut list = backend.list().await?;
        if !backend.judges_ownership() {
            let this_host = &self.inner.owner.host;
            for info in &mut list {
                info.ownership = ownership(&info.labels, this_host, host::process_alive);
            }
        }
        Ok(list)
    }

    /// Removes orphans: sandboxes whose owning corral process is gone. With
    /// `all`, removes every corral sandbox, owned or not, except persistent
    /// ones and those of sessions paused to disk (both outlive their
    /// processes by design; deleting them through the service removes
    /// them).
    pub async fn gc(&self, all: bool) -> Result<GcReport, Error> {
        self.gc_with(all, |_| {}).await
    }

    /// [`Runtime::gc`], telling `progress` how far it has got (for a
    /// progress bar: a daemon with many orphans takes a while).
    pub async fn gc_with(
        &self,
        all: bool,
        mut progress: impl FnMut(GcStep),
    ) -> Result<GcReport, Error> {
        let mut report = GcReport::default();
        let mut doomed = Vec::new();
        // A sandbox of a session paused to disk outlives its process by
        // design, as a persistent one does: the next `corral serve`
        // resumes it, and deleting it removes it.
        let paused: Vec<String> = self
            .inner
            .held
            .paused_records()
            .await
            .into_iter()
            .map(|(r, _)| r.sandbox_id)
            .collect();
        for info in self.list_sandboxes().await? {
            let remove = match info.ownership {
                _ if paused.contains(&info.sandbox_id) => false,
                Ownership::Orphan => true,
                Ownership::LiveOwner | Ownership::ForeignHost => all,
                Ownership::Persistent => false,
            };
            if remove {
                doomed.push(info);
            } else {
                report.kept.push(info);
            }
        }
        progress(GcStep::Sandboxes {
            total: doomed.len(),
        });
        for info in doomed {
            let outcome = self
                .inner
                .backend
                .remove(&info.placement, &info.sandbox_id)
                .await;
            match outcome {
                Ok(()) => report.removed.push(info),
                Err(e) => {
                    tracing::warn!(sandbox = %info.sandbox_id, error = %e, "gc could not remove a sandbox");
                    report.failed.push((info, e.to_string()));
                }
            }
            progress(GcStep::SandboxDone);
        }
        progress(GcStep::Volumes);
        report.volumes_removed = self.inner.backend.collect_garbage().await?;
        progress(GcStep::Snapshots);
        report.snapshots_removed = self.gc_snapshots(all).await?;
        // A checkpoint of a sandbox paused to disk goes with its container.
        let kept: Vec<&str> = report.kept.iter().map(|i| i.sandbox_id.as_str()).collect();
        self.inner.held.remove_paused_except(&kept).await;
        Ok(report)
    }

    /// Removes orphans now and then every `reap_interval`, in the background,
    /// for as long as the runtime lives.
    fn spawn_reaper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.config.reap_interval;
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let runtime = Runtime { inner };
                match runtime.gc(false).await {
                    Ok(report) if !report.removed.is_empty() => {
                        let n = report.removed.len() as u64;
                        runtime
                            .inner
                            .metrics
                            .orphans_reaped
                            .fetch_add(n, Ordering::Relaxed);
                        tracing::info!(removed = n, "reaped orphaned sandboxes");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "reaping orphaned sandboxes failed"),
                }
                drop(runtime);
                if interval.is_zero() {
                    return;
                }
                tokio::time::sleep(interval).await;
            }
        });
    }

    /// Creates and starts a sandbox, connects to its agent and runs its
    /// start-up commands. On any failure nothing is left behind.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, Error> {
        self.create_for(spec, None).await
    }

    /// [`Runtime::create`], telling `watch` each phase the start enters
    /// (waiting for a slot, the image, creating, starting, attaching,
    /// start-up commands).
    pub async fn create_watched(
        &self,
        spec: &SandboxSpec,
        watch: &(dyn Fn(StartPhase) + Send + Sync),
    ) -> Result<Sandbox, Error> {
        self.create_from(spec, None, None, Some(watch), None).await
    }

    /// [`Runtime::create`] for provider session `session` (its events
    /// carry the key from the first on).
    pub(crate) async fn create_for(
        &self,
        spec: &SandboxSpec,
        session: Option<&str>,
    ) -> Result<Sandbox, Error> {
        self.create_from(spec, None, session, None, None).await
    }

    /// [`Runtime::create_for`] of a sandbox whose agent first takes `base`
    /// in (a fork of a delta snapshot), before anything runs, or which is
    /// restored from the checkpoint in `restore` (a fork of a live one).
    pub(crate) async fn create_from(
        &self,
        spec: &SandboxSpec,
        base: Option<Delta>,
        session: Option<&str>,
        watch: PhaseWatch<'_>,
        restore: Option<&std::path::Path>,
    ) -> Result<Sandbox, Error> {
        let id = format!("sb-{}", host::random_hex(12));
        let tenant = spec
            .labels
            .get(crate::events::TENANT_LABEL)
            .map(String::as_str);
        match self.create_as(spec, id.clone(), base, watch, restore).await {
            Ok(sb) => {
                if let Some(key) = session {
                    sb.set_session(key);
                }
                self.inner.events.emit(
                    crate::events::EventKind::Created,
                    sb.id(),
                    session,
                    tenant,
                    None,
                    format!("image {}", spec.image),
                );
                Ok(sb)
            }
            Err(e) => {
                self.inner.events.emit(
                    crate::events::EventKind::StartFailed,
                    &id,
                    session,
                    tenant,
                    Some(e.kind().as_str()),
                    e.to_string(),
                );
                Err(e)
            }
        }
    }

    async fn create_as(
        &self,
        spec: &SandboxSpec,
        id: String,
        base: Option<Delta>,
        watch: PhaseWatch<'_>,
        restore: Option<&std::path::Path>,
    ) -> Result<Sandbox, Error> {
        let span = tracing::info_span!("sandbox_start", sandbox = %id, image = %spec.image);
        let started = self
            .start_new(spec, &id, watch, restore)
            .instrument(span)
            .await?;
        let sandbox = Sandbox::new(
            id,
            started.placement,
            spec.clone(),
            started.conn,
            self.clone(),
            base,
        );
        let mut timings = started.timings;
        let mut guard = RemoveOnDrop::new(
            self.inner.backend.clone(),
            sandbox.placement(),
            sandbox.id(),
        );
        let startup = sandbox
            .run_startup()
            .instrument(enter(watch, StartPhase::Startup))
            .await;
        guard.disarm();
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

    /// Connects to a running sandbox corral made earlier (a persistent
    /// sandbox an earlier corral process left running) instead of creating
    /// another.
    pub async fn adopt(
        &self,
        placement: &Placement,
        sandbox_id: &str,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, Error> {
        let conn = self.connect(placement, sandbox_id, spec).await?;
        Ok(Sandbox::new(
            sandbox_id.to_string(),
            placement.clone(),
            spec.clone(),
            conn,
            self.clone(),
            None,
        ))
    }

    /// Opens the control stream to a running sandbox's agent and hands it
    /// the spec's environment, resolved on this host: at every handshake
    /// (a first start, a re-attach, an adoption by a later corral), since
    /// the container's configuration never holds it.
    pub(crate) async fn connect(
        &self,
        placement: &Placement,
        sandbox_id: &str,
        spec: &SandboxSpec,
    ) -> Result<AgentConn, Error> {
        self.connect_as(placement, sandbox_id, spec, false).await
    }

    /// [`Runtime::connect`]; `restored`: the first connection to a sandbox
    /// restored from a live snapshot, whose caught commands go on.
    pub(crate) async fn connect_as(
        &self,
        placement: &Placement,
        sandbox_id: &str,
        spec: &SandboxSpec,
        restored: bool,
    ) -> Result<AgentConn, Error> {
        let env = spec.resolve_env(&RealHost)?;
        let stream = self.inner.backend.connect(placement, sandbox_id).await?;
        AgentConn::open(stream, sandbox_id, spec.keepalive(), env, restored).await
    }

    /// Removes a sandbox's container (or pod) and what was made for it.
    pub(crate) async fn remove(
        &self,
        placement: &Placement,
        sandbox_id: &str,
    ) -> Result<(), Error> {
        self.inner.backend.remove(placement, sandbox_id).await
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

    /// The labels every object made for sandbox `id` carries.
    async fn labels_for(
        &self,
        spec: &SandboxSpec,
        id: &str,
    ) -> Result<std::collections::HashMap<String, String>, Error> {
        let mut l: std::collections::HashMap<String, String> =
            [(labels::SANDBOX.to_string(), id.to_string())]
                .into_iter()
                .chain(self.inner.owner.labels())
                .collect();
        if let Some(key) = &spec.persistent {
            let digest = crate::seal::spec_digest(spec);
            let seal = self.seal_key().await?.seal(id, key, &digest);
            l.insert(labels::SESSION.to_string(), key.clone());
            l.insert(labels::PERSISTENT.to_string(), "true".to_string());
            l.insert(labels::SEAL.to_string(), seal);
            l.insert(labels::SPEC_DIGEST.to_string(), digest);
        }
        Ok(l)
    }

    /// Validates `spec`, then has the backend create and start sandbox `id`
    /// and connects to its agent, under the start limit and the breaker.
    pub(crate) async fn start_new(
        &self,
        spec: &SandboxSpec,
        id: &str,
        watch: PhaseWatch<'_>,
        restore: Option<&std::path::Path>,
    ) -> Result<Started, Error> {
        let total = Instant::now();
        let mut timings = StartTimings::default();
        spec.validate(&RealHost)?;
        let req = StartRequest {
            sandbox_id: id,
            spec,
            agent_env: Vec::new(),
            labels: self.labels_for(spec, id).await?,
            owner: &self.inner.owner,
        };
        let backend = &self.inner.backend;
        let prepared = backend
            .prepare(&req)
            .instrument(enter(watch, StartPhase::Image))
            .await?;
        timings.image = prepared.image;
        timings.agent_volume = prepared.agent;

        timings.breaker_wait = self
            .breaker_admit()
            .instrument(enter(watch, StartPhase::BreakerWait))
            .await?;
        let slot = self
            .inner
            .start_slots
            .acquire()
            .instrument(enter(watch, StartPhase::SlotWait))
            .await?;
        timings.slot_wait = slot.waited;
        if !slot.waited.is_zero() {
            self.inner.metrics.slot_wait(slot.waited);
        }

        let probe = self.breaker_probe_flag();
        let t = Instant::now();
        let created = backend
            .create(&req)
            .instrument(enter(watch, StartPhase::Create))
            .await;
        timings.create = t.elapsed();
        let placement = match created {
            Ok(p) => p,
            Err(e) => {
                self.breaker_record(t, &e, probe);
                self.inner
                    .metrics
                    .start_failures
                    .fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };

        // A caller that gives up on this start (a dropped future) must not
        // leave the sandbox behind: its owner is alive, so no reaper would
        // take it.
        let mut guard = RemoveOnDrop::new(backend.clone(), placement.clone(), id);
        let t2 = Instant::now();
        let start = match restore {
            None => backend.start(&req, &placement),
            Some(dir) => backend.restore(&placement, dir),
        }
        .instrument(enter(watch, StartPhase::Start))
        .await;
        timings.start = t2.elapsed();
        match &start {
            Ok(()) => self.breaker_ok(t, probe),
            Err(e) => self.breaker_record(t, e, probe),
        }
        drop(slot);

        let connected = match start {
            Ok(()) => {
                let t = Instant::now();
                let r = async {
                    let exec_slot = self.inner.exec_slots.acquire().await?;
                    if !exec_slot.waited.is_zero() {
                        self.inner.metrics.slot_wait(exec_slot.waited);
                    }
                    self.connect_as(&placement, id, spec, restore.is_some())
                        .await
                }
                .instrument(enter(watch, StartPhase::Attach))
                .await;
                timings.attach = t.elapsed();
                r
            }
            Err(e) => Err(e),
        };
        match connected {
            Ok(conn) => {
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
                guard.disarm();
                Ok(Started {
                    placement,
                    conn,
                    timings,
                })
            }
            Err(e) => {
                guard.disarm();
                // A handshake that failed because the container died (killed
                // or removed while starting) is that loss, not an agent error.
                let e = match backend.state(&placement).await {
                    Ok(state)
                        if e.kind() == FailureKind::AgentError && !state.status.is_running() =>
                    {
                        Error::ContainerLost {
                            sandbox: id.to_string(),
                            state: Box::new(state),
                        }
                    }
                    _ => e,
                };
                self.inner
                    .metrics
                    .start_failures
                    .fetch_add(1, Ordering::Relaxed);
                if let Err(rm) = backend.remove(&placement, id).await {
                    tracing::warn!(sandbox = %id, error = %rm, "removing a sandbox that failed to start failed");
                }
                Err(e)
            }
        }
    }

    /// Waits while the breaker is open; returns how long.
    async fn breaker_admit(&self) -> Result<Duration, Error> {
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
                        return Err(Error::SlotTimeout {
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
        b.state() == BreakerState::HalfOpen
    }

    fn breaker_ok(&self, since: Instant, probe: bool) {
        let mut b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
        b.record(Instant::now(), true, since.elapsed(), probe);
    }

    /// Counts a failed start against the breaker only when the engine is to
    /// blame (a bad spec says nothing about the engine's health): it does
    /// not answer, or it has no room (more starts would only queue up).
    fn breaker_record(&self, since: Instant, e: &Error, probe: bool) {
        let engine_trouble = matches!(
            e.kind(),
            FailureKind::DaemonUnavailable | FailureKind::Capacity
        );
        let mut b = self.inner.breaker.lock().unwrap_or_else(|p| p.into_inner());
        let before = b.times_opened();
        if engine_trouble || probe {
            b.record(Instant::now(), !engine_trouble, since.elapsed(), probe);
        }
        if b.times_opened() > before {
            self.inner
                .metrics
                .breaker_opened
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "engine trouble: start circuit breaker opened, slowing down new starts");
        }
    }
}

/// Removes a sandbox whose start was abandoned half-way (the future was
/// dropped), in the background, unless disarmed.
struct RemoveOnDrop {
    backend: Arc<dyn Backend>,
    armed: Option<(Placement, String)>,
}

impl RemoveOnDrop {
    fn new(backend: Arc<dyn Backend>, placement: Placement, sandbox_id: &str) -> Self {
        RemoveOnDrop {
            backend,
            armed: Some((placement, sandbox_id.to_string())),
        }
    }

    /// The start finished (or failed and cleaned up itself): keep it.
    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let Some((placement, id)) = self.armed.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // No runtime left to remove it with: the agent's dead-man switch
            // stops it, and gc removes it once this process is gone.
            return;
        };
        let backend = self.backend.clone();
        tracing::warn!(sandbox = %id, "a sandbox start was abandoned half-way; removing it");
        handle.spawn(async move {
            if let Err(e) = backend.remove(&placement, &id).await {
                tracing::warn!(sandbox = %id, error = %e, "removing an abandoned sandbox failed");
            }
        });
    }
}
