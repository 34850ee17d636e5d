//! The provider: sandboxes by session key, warm pools, eviction.
//!
//! An agent's thread or an RL episode asks for "its" sandbox by key; the same
//! key returns the same sandbox until it is released or evicted. Warm pools
//! keep started, idle sandboxes of a profile ready, so an acquire is a
//! hand-over rather than a start. A live-sandbox limit evicts the least
//! recently used idle one when room is needed; a reaper enforces the idle
//! timeout and the maximum lifetime and refills the pools.
//!
//! A pool hands out only its own base: a released sandbox goes back after
//! a reset (pristine pools: in place, or a new container from the spec;
//! reuse pools: the reset commands), unless a snapshot folded its
//! session's changes into the container, which resets cannot undo; such a
//! sandbox is destroyed, and the refiller starts a new one.
//!
//! All bookkeeping sits behind one std mutex that is never held across an
//! await: creating, checking and destroying sandboxes happen outside it,
//! with the slot reserved first so concurrent callers cannot overshoot the
//! limit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use corral_core::backend::SessionStorage;
use corral_core::pool::{expired, lru_victim, Candidate, IdleAction, ProviderConfig};
use corral_core::{CommandSpec, FailureKind, Recovery, SandboxSpec};
use tokio::sync::Notify;

use crate::seal::{self, Verdict};
use crate::workspace::{self, SessionDirs};
use crate::{Delta, Runtime, Sandbox};
use corral_core::Error;

/// How long an acquire waits for room when every live sandbox is in use.
const ROOM_WAIT: Duration = Duration::from_secs(60);

/// Longest a reset command of a reused sandbox may run.
const RESET_TIMEOUT: Duration = Duration::from_secs(30);

/// Forks taken into warm pool sandboxes at once: each is a delta import
/// through one agent's stream (the agent writes it to its tmpfs), work
/// for the host's cores, not for the engine, so a few at a time keep
/// them busy.
const FORK_IMPORTS: usize = 8;

/// Hands out sandboxes by session key. Cheap to clone.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Runtime,
    config: ProviderConfig,
    /// Host directory holding persistent sessions' workspaces and homes.
    persistence_root: PathBuf,
    state: Mutex<State>,
    counters: Counters,
    epoch: Instant,
    /// Wakes acquires waiting for room and the refiller.
    changed: Arc<Notify>,
    closed: AtomicBool,
    /// One lock per persistent session key, held while its container is
    /// adopted or started and while it is removed and its directories
    /// stripped: two containers of a session never share its directories,
    /// and nothing writes there while corral walks them.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sandboxes being destroyed in the background (evictions, lost
    /// races): `shutdown` waits for them, so none outlives it.
    teardowns: Arc<Teardowns>,
    /// Bounds the forks being imported into pool sandboxes at once.
    fork_imports: tokio::sync::Semaphore,
    /// Forks taking a pool sandbox right now: while any does, the refiller
    /// starts one container per pool at a time, behind them.
    forking: AtomicUsize,
}

/// One fork taking a pool sandbox, counted in `Inner::forking` while it
/// lives; the last one to end wakes the refiller.
struct Forking<'a>(&'a Inner);

impl<'a> Forking<'a> {
    fn new(inner: &'a Inner) -> Forking<'a> {
        inner.forking.fetch_add(1, Ordering::AcqRel);
        Forking(inner)
    }
}

impl Drop for Forking<'_> {
    fn drop(&mut self) {
        if self.0.forking.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

/// A count of background teardowns and a wake-up when it reaches zero.
#[derive(Default)]
struct Teardowns {
    running: std::sync::atomic::AtomicUsize,
    idle: Notify,
}

impl Teardowns {
    fn started(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }

    fn finished(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until none runs, at most until `deadline`.
    async fn wait(&self, deadline: Instant) {
        loop {
            let idle = self.idle.notified();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline.into(), idle)
                .await
                .is_err()
            {
                tracing::warn!(
                    running = self.running.load(Ordering::Acquire),
                    "background sandbox teardowns did not finish before shutdown gave up on them"
                );
                return;
            }
        }
    }
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Entry>,
    pools: HashMap<String, VecDeque<Pooled>>,
    /// Sandboxes alive or being created, counted against `max_live`.
    live: usize,
    /// Pool refills in flight, by profile.
    refilling: HashMap<String, usize>,
}

impl State {
    /// The sessions as the pure eviction rules (`corral_core::pool`) see them.
    fn candidates(&self) -> Vec<Candidate<String>> {
        self.sessions
            .iter()
            .map(|(k, e)| Candidate {
                key: k.clone(),
                last_used_ms: e.last_used_ms,
                started_ms: e.started_ms,
                // One paused to disk holds no memory and keeps its session's
                // state until it is deleted: no timeout or eviction ends it.
                busy: e.leases > 0 || e.sandbox.is_paused_to_disk(),
            })
            .collect()
    }
}

struct Entry {
    sandbox: Sandbox,
    profile: Option<String>,
    last_used_ms: u64,
    started_ms: u64,
    leases: usize,
}

struct Pooled {
    sandbox: Sandbox,
    started_ms: u64,
}

#[derive(Default)]
struct Counters {
    pool_hits: AtomicU64,
    pool_misses: AtomicU64,
    evicted_lru: AtomicU64,
    evicted_idle: AtomicU64,
    evicted_lifetime: AtomicU64,
    restarted: AtomicU64,
    released: AtomicU64,
    discarded_changed: AtomicU64,
}

/// A sandbox the provider holds now ([`Provider::held`]).
#[derive(Clone)]
pub struct Held {
    /// The session key it is bound to; `None`: a warm pool's spare.
    pub key: Option<String>,
    /// The profile (pool) it was made from; `None`: a spec of its own.
    pub profile: Option<String>,
    /// The sandbox.
    pub sandbox: Sandbox,
}

/// The provider's state and counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderStats {
    /// Sandboxes alive or being created.
    pub live: usize,
    /// Sandboxes bound to a session key.
    pub sessions: usize,
    /// Ready sandboxes per pool.
    pub pooled: BTreeMap<String, usize>,
    /// Acquires served from a warm pool.
    pub pool_hits: u64,
    /// Acquires that had to start a sandbox.
    pub pool_misses: u64,
    /// Idle sandboxes evicted to make room.
    pub evicted_lru: u64,
    /// Sandboxes evicted after the idle timeout.
    pub evicted_idle: u64,
    /// Sandboxes evicted at their maximum lifetime.
    pub evicted_lifetime: u64,
    /// Dead sandboxes replaced on acquire (`auto_restart`).
    pub restarted: u64,
    /// Sessions released.
    pub released: u64,
    /// Released sandboxes destroyed instead of going back to their pool
    /// because a snapshot had folded a session's changes into their
    /// container (its resets no longer return to the pool's base).
    pub discarded_changed: u64,
}

/// A session's sandbox, in use. Dereferences to [`Sandbox`]; dropping it
/// marks the session idle (its sandbox stays bound to the key).
pub struct Lease {
    sandbox: Sandbox,
    key: String,
    provider: Weak<Inner>,
}

impl Deref for Lease {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.sandbox
    }
}

impl Lease {
    /// The session key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A handle to the sandbox that outlives the lease.
    pub fn sandbox(&self) -> Sandbox {
        self.sandbox.clone()
    }

    /// Ends the session ([`Provider::release`]) while still holding it:
    /// dropping a lease first leaves the session idle, and an acquire
    /// waiting for room could evict it (destroying a sandbox a pristine
    /// pool would have reset) before the release.
    pub async fn release(self) -> Result<(), Error> {
        let Some(inner) = self.provider.upgrade() else {
            return Ok(());
        };
        let provider = Provider { inner };
        let released = provider.release(&self.key).await;
        drop(self);
        released
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(inner) = self.provider.upgrade() {
            let now = inner.now_ms();
            let mut st = lock(&inner.state);
            if let Some(e) = st.sessions.get_mut(&self.key) {
                if e.sandbox.id() == self.sandbox.id() {
                    e.leases = e.leases.saturating_sub(1);
                    e.last_used_ms = now;
                }
            }
            drop(st);
            inner.changed.notify_waiters();
        }
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // Critical sections are plain map updates; a panic cannot leave them
    // half-done in a way later code relies on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reason an acquire could not be served.
fn no_room(max: usize) -> Error {
    Error::NoRoom {
        max_live: max,
        waited: ROOM_WAIT,
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis().min(u64::MAX as u128) as u64
    }

    /// True (counted and logged) when released sandbox `sb` must leave
    /// pool `pool` instead of going back: a snapshot folded a session's
    /// changes into its container, so neither a reset command nor an
    /// in-place reset would bring back the pool's base, and the next
    /// session would inherit what this one planted.
    fn base_changed(&self, pool: &str, sb: &Sandbox) -> bool {
        if !sb.base_folded() {
            return false;
        }
        self.counters
            .discarded_changed
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            sandbox = sb.id(),
            container = %sb.container_id(),
            pool,
            "a snapshot changed the released sandbox's base; destroying it instead of returning it to its pool"
        );
        true
    }
}

enum Plan {
    /// The session already has a sandbox.
    Existing(Sandbox),
    /// Taken from the warm pool.
    FromPool(Sandbox),
    /// Room reserved; start one (after destroying the evicted, if any).
    Create(Option<Sandbox>),
    /// No room: wait.
    Wait,
}

impl Provider {
    /// A provider over `runtime`; starts its reaper and pool refiller, which
    /// stop when the last handle is dropped or on [`Provider::shutdown`].
    pub fn new(runtime: Runtime, config: ProviderConfig) -> Provider {
        Provider::with_persistence_root(runtime, config, default_persistence_root())
    }

    /// Like [`Provider::new`], keeping persistent sessions' directories under `root`.
    pub fn with_persistence_root(
        runtime: Runtime,
        config: ProviderConfig,
        root: PathBuf,
    ) -> Provider {
        let mut config = config;
        for pool in config.pools.values_mut() {
            if pool.pristine {
                pool.spec.pristine = true;
            }
        }
        let inner = Arc::new(Inner {
            runtime,
            config,
            persistence_root: root,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            epoch: Instant::now(),
            changed: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
            session_locks: Mutex::new(HashMap::new()),
            teardowns: Arc::default(),
            fork_imports: tokio::sync::Semaphore::new(FORK_IMPORTS),
            forking: AtomicUsize::new(0),
        });
        tokio::spawn(maintain(Arc::downgrade(&inner)));
        Provider { inner }
    }

    /// The settings in force.
    pub fn config(&self) -> &ProviderConfig {
        &self.inner.config
    }

    /// The runtime it starts sandboxes with (for what is not a session's,
    /// such as snapshots).
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The session's sandbox of pool `profile`: the one bound to `key`, else a
    /// warm one from the pool, else a new one from the pool's spec.
    pub async fn acquire(&self, key: &str, profile: &str) -> Result<Lease, Error> {
        let Some(pool) = self.inner.config.pools.get(profile) else {
            return Err(Error::InvalidSpec(corral_core::SpecError {
                field: "profile".into(),
                value: profile.into(),
                reason: format!(
                    "no such pool (known: {})",
                    self.inner
                        .config
                        .pools
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }));
        };
        let spec = pool.spec.clone();
        self.acquire_inner(key, Some(profile), &spec, None, None)
            .await
    }

    /// A persistent session's sandbox: its workspace (`/workspace`, the
    /// working directory) and home (`/home/corral`, `$HOME`) live in host
    /// directories under the persistence root, keyed by session (or, when
    /// the backend keeps sessions' files itself, `SessionStorage::Backend`,
    /// in its volume for the key), so they survive container loss and
    /// corral restarts. The container itself outlives this process and is
    /// adopted, not duplicated, by the next corral asking for the same key,
    /// but only when its seal proves this user's corral made it for this
    /// key from this spec and it is the container recorded for the session
    /// (in its directory, or by the backend); any other container labelled
    /// with the key is never attached to (nothing runs in it) and, unless
    /// provably ours, never removed. Releasing or evicting the session
    /// removes the container and keeps the files (clearing setuid/setgid
    /// bits in host directories).
    pub async fn acquire_persistent(&self, key: &str, spec: &SandboxSpec) -> Result<Lease, Error> {
        let session_lock = self.session_lock(key);
        let _serial = session_lock.lock().await;
        let (spec, dirs) = self.persistent_spec(key, spec)?;
        if !lock(&self.inner.state).sessions.contains_key(key) {
            match self.adopt_persistent(key, &spec, dirs.as_ref()).await? {
                Some(sb) => {
                    let now = self.inner.now_ms();
                    let mut st = lock(&self.inner.state);
                    if !st.sessions.contains_key(key) {
                        st.live += 1;
                        sb.set_session(key);
                        st.sessions.insert(
                            key.to_string(),
                            Entry {
                                sandbox: sb,
                                profile: None,
                                last_used_ms: now,
                                started_ms: now,
                                leases: 0,
                            },
                        );
                    }
                }
                // No container of the session runs: safe to walk its trees.
                None => {
                    if let Some(dirs) = &dirs {
                        strip_in_blocking(dirs.clone(), key.to_string()).await;
                    }
                }
            }
        }
        let lease = self.acquire_inner(key, None, &spec, None, None).await?;
        // A backend keeping the session's files records its sandbox itself.
        if let Some(dirs) = &dirs {
            let cid = lease.container_id();
            if workspace::recorded_container(dirs).as_deref() != Some(cid.as_str()) {
                if let Err(e) = workspace::record_container(dirs, &cid) {
                    // Only costs the next corral an adoption: it replaces instead.
                    tracing::warn!(session = key, error = %e, "recording a persistent session's container failed");
                }
            }
        }
        Ok(lease)
    }

    /// Whether the backend keeps persistent sessions' files in host
    /// directories the provider looks after.
    fn host_directories(&self) -> bool {
        self.inner.runtime.backend().session_storage() == SessionStorage::HostDirectories
    }

    fn session_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .inner
            .session_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        locks.retain(|k, l| k == key || Arc::strong_count(l) > 1);
        locks.entry(key.to_string()).or_default().clone()
    }

    /// The session's spec (`$HOME`, working directory, key; with host
    /// directories also them, mounted `nosuid,nodev`) and its host
    /// directories, created private (or checked and fixed) and migrated
    /// from the earlier naming; `None` when the backend keeps the files.
    fn persistent_spec(
        &self,
        key: &str,
        base: &SandboxSpec,
    ) -> Result<(SandboxSpec, Option<SessionDirs>), Error> {
        let mut spec = base.clone();
        let dirs = if self.host_directories() {
            let dirs = workspace::prepare(&self.inner.persistence_root, key)?;
            for (host, target) in [
                (&dirs.workspace, workspace::WORKSPACE),
                (&dirs.home, workspace::HOME),
            ] {
                spec.mounts.retain(|m| m.container != target);
                spec.mounts.push(corral_core::Mount {
                    host: host.display().to_string(),
                    container: target.to_string(),
                    read_only: false,
                    nosuid: true,
                });
            }
            Some(dirs)
        } else {
            None
        };
        spec.env
            .retain(|v| !matches!(v, corral_core::EnvVar::Set { name, .. } if name == "HOME"));
        spec.env.push(corral_core::EnvVar::Set {
            name: "HOME".into(),
            value: workspace::HOME.into(),
        });
        if spec.workdir.is_none() {
            spec.workdir = Some(workspace::WORKSPACE.into());
        }
        spec.persistent = Some(key.to_string());
        Ok((spec, dirs))
    }

    /// The running container an earlier corral left for `key`, attached,
    /// when it is provably the one this user's corral made for the key from
    /// `spec`. Containers of ours that do not qualify (stopped, another
    /// spec, not the recorded one) are removed (the directories hold the
    /// state); containers that are not provably ours are left alone.
    async fn adopt_persistent(
        &self,
        key: &str,
        spec: &SandboxSpec,
        dirs: Option<&SessionDirs>,
    ) -> Result<Option<Sandbox>, Error> {
        let runtime = &self.inner.runtime;
        let seal_key = runtime.seal_key().await?;
        let digest = seal::spec_digest(spec);
        let recorded = match dirs {
            Some(dirs) => workspace::recorded_container(dirs),
            None => runtime.backend().session_placement(key).await?.map(|p| p.0),
        };
        let mine: Vec<_> = runtime
            .list_sandboxes()
            .await?
            .into_iter()
            .filter(|i| i.session.as_deref() == Some(key))
            .collect();
        let mut adopted = None;
        for info in mine {
            let spec_matches = match seal_key.verify(&info.labels, key, &digest) {
                Verdict::Unsealed => {
                    tracing::warn!(
                        session = key,
                        container = %info.placement,
                        sandbox = %info.sandbox_id,
                        "a container labelled for this persistent session carries no valid seal: \
                         not made by this user's corral for this session; not adopting it, not touching it"
                    );
                    continue;
                }
                Verdict::Sealed { spec_matches } => spec_matches,
            };
            let is_recorded = recorded.as_deref() == Some(info.placement.id());
            if adopted.is_none() && spec_matches && is_recorded && info.state.is_running() {
                match runtime.adopt(&info.placement, &info.sandbox_id, spec).await {
                    Ok(sb) => {
                        tracing::info!(session = key, sandbox = %info.sandbox_id, "adopted a persistent sandbox");
                        adopted = Some(sb);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(session = key, error = %e, "could not adopt a persistent sandbox; replacing it")
                    }
                }
            } else {
                tracing::info!(
                    session = key,
                    container = %info.placement,
                    spec_matches,
                    is_recorded,
                    state = %info.state,
                    "replacing a persistent container corral made earlier"
                );
            }
            if let Err(e) = runtime.remove(&info.placement, &info.sandbox_id).await {
                tracing::warn!(session = key, error = %e, "removing a stale persistent container failed");
            }
        }
        Ok(adopted)
    }

    /// The sandbox bound to `key`, leased as [`Provider::acquire`] would
    /// (a dead one replaced under `auto_restart`, reported under `fail`);
    /// `None` when no sandbox is bound to it (never acquired, released or
    /// evicted), so callers holding a key can tell an eviction from a
    /// sandbox.
    pub async fn lease(&self, key: &str) -> Option<Result<Lease, Error>> {
        let (spec, profile, base) = {
            let st = lock(&self.inner.state);
            let e = st.sessions.get(key)?;
            (
                e.sandbox.spec().clone(),
                e.profile.clone(),
                e.sandbox.base(),
            )
        };
        Some(
            self.acquire_inner(key, profile.as_deref(), &spec, base, None)
                .await,
        )
    }

    /// The sandbox bound to `key`, looked at without using it: no lease,
    /// its idle clock left as it is, a dead one neither replaced nor
    /// reported. For readers that only observe (a listing, a dashboard, a
    /// monitor): polling them must not keep an abandoned sandbox alive.
    pub fn peek(&self, key: &str) -> Option<Sandbox> {
        lock(&self.inner.state)
            .sessions
            .get(key)
            .map(|e| e.sandbox.clone())
    }

    /// Whether a sandbox is bound to `key`.
    pub fn has_session(&self, key: &str) -> bool {
        lock(&self.inner.state).sessions.contains_key(key)
    }

    /// The session's sandbox made from `spec` (no pool): the one bound to
    /// `key`, else a new one.
    pub async fn acquire_spec(&self, key: &str, spec: &SandboxSpec) -> Result<Lease, Error> {
        self.acquire_inner(key, None, spec, None, None).await
    }

    /// [`Provider::acquire_spec`] for a fork: a sandbox's agent takes
    /// `base` in (a delta snapshot's, [`Runtime::fork_base`]), and so does
    /// every sandbox that later replaces it (`auto_restart`).
    ///
    /// A warm sandbox of a pristine pool whose spec is the fork's (start-up
    /// commands aside: their effect is in the delta) takes the delta in
    /// place of its own, with no container start; at most
    /// [`FORK_IMPORTS`] such imports run at once, each delta's bytes sent
    /// from the one buffer all forks share. When the pool has none ready
    /// (or an import fails), a new sandbox is started from the spec. The
    /// pool refills behind the fork as after any acquire, and the session's
    /// release resets the sandbox back to the pool's own state.
    ///
    /// A fork of a live snapshot (`restore`: its checkpoint,
    /// [`Runtime::fork_restore`]) is always a new sandbox restored from it.
    pub async fn acquire_fork(
        &self,
        key: &str,
        spec: &SandboxSpec,
        base: Option<Delta>,
        restore: Option<&std::path::Path>,
    ) -> Result<Lease, Error> {
        if restore.is_some() {
            return self.acquire_inner(key, None, spec, None, restore).await;
        }
        if let Some(delta) = &base {
            if let Some(pool) = self.pool_for_fork(spec) {
                if let Some(lease) = self.fork_from_pool(key, &pool, delta).await {
                    return Ok(lease);
                }
            }
        }
        self.acquire_inner(key, None, spec, base, None).await
    }

    /// The pristine pool whose sandboxes can take a fork of `spec`: its
    /// spec is `spec` but for start-up commands.
    fn pool_for_fork(&self, spec: &SandboxSpec) -> Option<String> {
        self.inner
            .config
            .pools
            .iter()
            .find(|(_, pool)| {
                let mut theirs = pool.spec.clone();
                theirs.startup.clear();
                pool.pristine && theirs == *spec
            })
            .map(|(name, _)| name.clone())
    }

    /// A warm sandbox of `pool` bound to `key` with `delta` taken in;
    /// `None` when the pool has none ready, the key is bound already, or
    /// the import failed (the sandbox is destroyed then).
    async fn fork_from_pool(&self, key: &str, pool: &str, delta: &Delta) -> Option<Lease> {
        if self.inner.closed.load(Ordering::Acquire) {
            return None;
        }
        let sb = {
            let now = self.inner.now_ms();
            let mut st = lock(&self.inner.state);
            if st.sessions.contains_key(key) {
                return None;
            }
            self.take_pooled(&mut st, pool, key, now)?
        };
        // Container starts compete with the imports for the same cores: the
        // refiller starts its replacements behind the forks (one at a time
        // per pool while any fork is taking a sandbox), woken when the last
        // is done.
        let forking = Forking::new(&self.inner);
        let asked = Instant::now();
        let imported = {
            let _slot = self.inner.fork_imports.acquire().await;
            tracing::debug!(
                sandbox = sb.id(),
                waited_ms = asked.elapsed().as_secs_f64() * 1e3,
                "a warm sandbox takes a fork"
            );
            sb.take_fork(delta).await
        };
        drop(forking);
        match imported {
            Ok(()) => {
                self.inner
                    .counters
                    .pool_hits
                    .fetch_add(1, Ordering::Relaxed);
                Some(self.lease_counted(key, sb))
            }
            Err(e) => {
                tracing::warn!(sandbox = sb.id(), pool, error = %e, "a warm sandbox could not take a fork; starting one instead");
                self.evict_key(key, &sb, None);
                self.discard(sb);
                None
            }
        }
    }

    async fn acquire_inner(
        &self,
        key: &str,
        profile: Option<&str>,
        spec: &SandboxSpec,
        base: Option<Delta>,
        restore: Option<&std::path::Path>,
    ) -> Result<Lease, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::ShutDown { key: key.into() });
        }
        let deadline = Instant::now() + ROOM_WAIT;
        loop {
            let waiter = self.inner.changed.notified();
            let plan = self.plan(key, profile);
            match plan {
                Plan::Existing(sb) => {
                    if self.inner.config.auto_restart && !self.confirm_alive(&sb).await {
                        self.evict_key(key, &sb, None);
                        if sb.spec().recovery == Recovery::Fail {
                            // No blank substitute under `fail`: report the loss.
                            let failure = sb.dead().unwrap_or_else(|| {
                                corral_core::Failure::new(
                                    FailureKind::ContainerLost,
                                    format!(
                                        "sandbox {} of session {key} lost its container",
                                        sb.id()
                                    ),
                                )
                            });
                            let err = lost_error(sb.id(), &sb.container_id(), failure);
                            self.discard(sb);
                            return Err(err);
                        }
                        self.discard(sb);
                        self.inner
                            .counters
                            .restarted
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    return Ok(self.lease_counted(key, sb));
                }
                Plan::FromPool(sb) => {
                    self.inner
                        .counters
                        .pool_hits
                        .fetch_add(1, Ordering::Relaxed);
                    self.inner.changed.notify_waiters();
                    return Ok(self.lease_counted(key, sb));
                }
                Plan::Create(victim) => {
                    self.inner
                        .counters
                        .pool_misses
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(v) = victim {
                        self.discard(v);
                    }
                    let created = self
                        .inner
                        .runtime
                        .create_from(spec, base.clone(), Some(key), None, restore)
                        .await;
                    let sandbox = match created {
                        Ok(sb) => sb,
                        Err(e) => {
                            lock(&self.inner.state).live -= 1;
                            self.inner.changed.notify_waiters();
                            return Err(e);
                        }
                    };
                    let now = self.inner.now_ms();
                    let mut st = lock(&self.inner.state);
                    if let Some(existing) = st.sessions.get_mut(key) {
                        // A concurrent acquire of the same key won the race:
                        // use its sandbox, give back ours.
                        existing.leases += 1;
                        existing.last_used_ms = now;
                        let theirs = existing.sandbox.clone();
                        st.live -= 1;
                        drop(st);
                        self.discard(sandbox);
                        return Ok(self.lease_counted(key, theirs));
                    }
                    sandbox.set_session(key);
                    st.sessions.insert(
                        key.to_string(),
                        Entry {
                            sandbox: sandbox.clone(),
                            profile: profile.map(str::to_string),
                            last_used_ms: now,
                            started_ms: now,
                            leases: 1,
                        },
                    );
                    drop(st);
                    return Ok(self.lease_counted(key, sandbox));
                }
                Plan::Wait => {
                    if tokio::time::timeout_at(deadline.into(), waiter)
                        .await
                        .is_err()
                    {
                        return Err(no_room(self.inner.config.max_live));
                    }
                }
            }
        }
    }

    /// Decides under the lock, without awaiting.
    fn plan(&self, key: &str, profile: Option<&str>) -> Plan {
        let now = self.inner.now_ms();
        let cfg = &self.inner.config;
        let mut st = lock(&self.inner.state);
        if let Some(e) = st.sessions.get_mut(key) {
            e.leases += 1;
            e.last_used_ms = now;
            return Plan::Existing(e.sandbox.clone());
        }
        if let Some(p) = profile {
            if let Some(sandbox) = self.take_pooled(&mut st, p, key, now) {
                return Plan::FromPool(sandbox);
            }
        }
        if cfg.max_live == 0 || st.live < cfg.max_live {
            st.live += 1;
            return Plan::Create(None);
        }
        // At the limit with a start for this pool under way: wait for it
        // rather than evict a session and start one more (a pod start is
        // seconds on a cluster; the refill's sandbox lands in the pool and
        // wakes this acquire).
        if profile.is_some_and(|p| st.refilling.get(p).is_some_and(|n| *n > 0)) {
            return Plan::Wait;
        }
        // At the limit: evict a warm spare first (no one's state), else the
        // least recently used idle session.
        let spare = st
            .pools
            .values_mut()
            .filter(|q| !q.is_empty())
            .max_by_key(|q| q.len())
            .and_then(VecDeque::pop_back);
        if let Some(spare) = spare {
            self.inner
                .counters
                .evicted_lru
                .fetch_add(1, Ordering::Relaxed);
            return Plan::Create(Some(spare.sandbox));
        }
        let candidates = st.candidates();
        match lru_victim(&candidates).and_then(|k| st.sessions.remove(&k)) {
            Some(victim) => {
                self.inner
                    .counters
                    .evicted_lru
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    sandbox = victim.sandbox.id(),
                    "evicting the least recently used idle sandbox"
                );
                victim.sandbox.emit(
                    crate::events::EventKind::Evicted,
                    None,
                    "the least recently used idle sandbox, for room (provider.max_live)",
                );
                Plan::Create(Some(victim.sandbox))
            }
            None => Plan::Wait,
        }
    }

    /// A liveness check outside the lock: the cheap hint first, the daemon
    /// only when the hint says the control stream is gone.
    async fn confirm_alive(&self, sb: &Sandbox) -> bool {
        if sb.looks_alive() {
            return true;
        }
        if sb.dead().is_some() {
            return false;
        }
        // Paused to disk: its container is stopped on purpose.
        if sb.is_paused_to_disk() {
            return true;
        }
        // The stream may have broken with the container still running: a
        // command re-attaches then, so only a stopped container is dead.
        matches!(sb.state().await, Ok(s) if s.status.is_running())
    }

    /// A lease for a sandbox whose entry already counts this lease.
    fn lease_counted(&self, key: &str, sandbox: Sandbox) -> Lease {
        Lease {
            sandbox,
            key: key.to_string(),
            provider: Arc::downgrade(&self.inner),
        }
    }

    /// Removes `key`'s entry if it still holds `sb`; counts the sandbox gone.
    fn evict_key(&self, key: &str, sb: &Sandbox, counter: Option<&AtomicU64>) {
        let mut st = lock(&self.inner.state);
        if st
            .sessions
            .get(key)
            .is_some_and(|e| e.sandbox.id() == sb.id())
        {
            st.sessions.remove(key);
            st.live -= 1;
            if let Some(c) = counter {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(st);
        self.inner.changed.notify_waiters();
    }

    /// Ends the session: its sandbox is destroyed, or reset and returned to
    /// its pool when the pool reuses sandboxes. A sandbox of a pristine
    /// pool is reset, and any other one that is not persistent destroyed,
    /// in the background: it counts against `max_live` until that is done,
    /// and [`Provider::settled`] and [`Provider::shutdown`] wait for it.
    /// A sandbox a snapshot changed the base of never goes back to a pool
    /// (see `ProviderStats::discarded_changed`). Releasing an unknown key
    /// is not an error.
    pub async fn release(&self, key: &str) -> Result<(), Error> {
        self.release_inner(key).await.map(drop)
    }

    /// [`Provider::release`], returning once the sandbox is gone or back in
    /// its pool (what an API's delete promises).
    pub async fn release_and_wait(&self, key: &str) -> Result<(), Error> {
        if let Some(background) = self.release_inner(key).await? {
            let _ = background.await;
        }
        Ok(())
    }

    async fn release_inner(&self, key: &str) -> Result<Option<tokio::task::JoinHandle<()>>, Error> {
        let entry = lock(&self.inner.state).sessions.remove(key);
        let Some(entry) = entry else {
            return Ok(None);
        };
        self.inner.counters.released.fetch_add(1, Ordering::Relaxed);
        let pool = entry
            .profile
            .as_ref()
            .and_then(|p| self.inner.config.pools.get(p).map(|c| (p, c)));
        if let Some((name, _)) = pool.filter(|(_, c)| c.pristine) {
            let name = name.clone();
            return Ok(Some(self.reset_in_background(
                name,
                entry.sandbox,
                entry.started_ms,
            )));
        }
        if let Some((name, cfg)) = pool {
            if cfg.reuse
                && entry.sandbox.looks_alive()
                && !self.inner.base_changed(name, &entry.sandbox)
                && self.reset(&entry.sandbox, &cfg.reset).await
            {
                let mut st = lock(&self.inner.state);
                let queue = st.pools.entry(name.clone()).or_default();
                if queue.len() < cfg.warm.max(1) * 2
                    && !self.inner.closed.load(Ordering::Acquire)
                    // Checked again: a handle that outlived the lease may
                    // have taken a snapshot while the reset commands ran.
                    && !self.inner.base_changed(name, &entry.sandbox)
                {
                    queue.push_back(Pooled {
                        sandbox: entry.sandbox,
                        started_ms: entry.started_ms,
                    });
                    drop(st);
                    self.inner.changed.notify_waiters();
                    return Ok(None);
                }
            }
        }
        if entry.sandbox.spec().persistent.is_some() {
            // Inline: the next sandbox of the session must not start before
            // this one is gone and its directories are stripped.
            lock(&self.inner.state).live -= 1;
            self.inner.changed.notify_waiters();
            return self.remove(entry.sandbox).await.map(|()| None);
        }
        Ok(Some(self.teardown(entry.sandbox)))
    }

    /// Waits until every background reset and teardown has finished (at
    /// most `timeout`): after it, released sandboxes are gone or back in
    /// their pools.
    pub async fn settled(&self, timeout: Duration) {
        self.inner.teardowns.wait(Instant::now() + timeout).await;
    }

    /// Destroys a released sandbox in the background; it stays counted in
    /// `live` until it is gone.
    fn teardown(&self, sb: Sandbox) -> tokio::task::JoinHandle<()> {
        let teardowns = self.inner.teardowns.clone();
        teardowns.started();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            if let Err(e) = sb.destroy().await {
                tracing::warn!(sandbox = sb.id(), error = %e, "destroying a released sandbox failed");
            }
            lock(&inner.state).live -= 1;
            inner.changed.notify_waiters();
            teardowns.finished();
        })
    }

    /// Resets a released sandbox of a pristine pool in the background and
    /// returns it to the pool; destroys it when the reset fails, the pool
    /// is full or the provider is shutting down.
    fn reset_in_background(
        &self,
        pool: String,
        sb: Sandbox,
        started_ms: u64,
    ) -> tokio::task::JoinHandle<()> {
        let teardowns = self.inner.teardowns.clone();
        teardowns.started();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            // A lost sandbox is replaced by the reset itself (a new
            // container from the spec: the pool's base again). A folded
            // one is not reset: its in-place reset returns to the fold.
            let reset = if inner.base_changed(&pool, &sb) {
                Err(None)
            } else {
                sb.reset_for_pool().await.map_err(Some)
            };
            let back = match reset {
                Ok(outcome) => {
                    tracing::debug!(sandbox = sb.id(), ?outcome, "released sandbox reset");
                    let warm = inner.config.pools.get(&pool).map_or(1, |c| c.warm.max(1));
                    let mut st = lock(&inner.state);
                    let queue = st.pools.entry(pool.clone()).or_default();
                    if queue.len() < warm * 2
                        && !inner.closed.load(Ordering::Acquire)
                        // Checked again: a handle that outlived the lease
                        // may have taken a snapshot during the reset.
                        && !inner.base_changed(&pool, &sb)
                    {
                        queue.push_back(Pooled {
                            sandbox: sb.clone(),
                            started_ms,
                        });
                        true
                    } else {
                        false
                    }
                }
                Err(Some(e)) => {
                    tracing::info!(sandbox = sb.id(), error = %e, "reset of a released sandbox failed; destroying it");
                    false
                }
                Err(None) => false,
            };
            if !back {
                if let Err(e) = sb.destroy().await {
                    tracing::warn!(sandbox = sb.id(), error = %e, "destroying a released sandbox failed");
                }
                lock(&inner.state).live -= 1;
            }
            inner.changed.notify_waiters();
            teardowns.finished();
        })
    }

    /// Destroys `sb`; for a persistent session, under its lock, then clears
    /// setuid/setgid bits from its directories unless a newer sandbox of
    /// the session already runs.
    async fn remove(&self, sb: Sandbox) -> Result<(), Error> {
        let Some(key) = sb.spec().persistent.clone() else {
            return sb.destroy().await;
        };
        let session_lock = self.session_lock(&key);
        let _serial = session_lock.lock().await;
        let destroyed = sb.destroy().await;
        let newer = lock(&self.inner.state)
            .sessions
            .get(&key)
            .is_some_and(|e| e.sandbox.id() != sb.id());
        if destroyed.is_ok() && !newer && self.host_directories() {
            let dirs = SessionDirs::new(&self.inner.persistence_root, &key);
            strip_in_blocking(dirs, key).await;
        }
        destroyed
    }

    /// [`Provider::remove`] in the background (evictions, lost races),
    /// counted so that [`Provider::shutdown`] waits for it.
    /// Takes the first live sandbox of `pool` for session `key` (dead ones
    /// on the way are discarded), registered as the session's with one
    /// lease; `None` when the pool has none.
    fn take_pooled(&self, st: &mut State, pool: &str, key: &str, now: u64) -> Option<Sandbox> {
        while let Some(pooled) = st.pools.get_mut(pool).and_then(VecDeque::pop_front) {
            if !pooled.sandbox.looks_alive() {
                st.live -= 1;
                self.discard(pooled.sandbox);
                continue;
            }
            pooled.sandbox.set_session(key);
            st.sessions.insert(
                key.to_string(),
                Entry {
                    sandbox: pooled.sandbox.clone(),
                    profile: Some(pool.to_string()),
                    last_used_ms: now,
                    started_ms: pooled.started_ms,
                    leases: 1,
                },
            );
            return Some(pooled.sandbox);
        }
        None
    }

    fn discard(&self, sb: Sandbox) {
        let teardowns = self.inner.teardowns.clone();
        teardowns.started();
        // Only a persistent session's teardown needs the provider (its lock
        // and directories); others hold nothing that keeps it alive.
        let provider = sb.spec().persistent.is_some().then(|| self.clone());
        tokio::spawn(async move {
            let removed = match provider {
                None => sb.destroy().await,
                Some(provider) => provider.remove(sb.clone()).await,
            };
            if let Err(e) = removed {
                tracing::warn!(sandbox = sb.id(), error = %e, "destroying an evicted sandbox failed");
            }
            teardowns.finished();
        });
    }

    async fn reset(&self, sb: &Sandbox, scripts: &[String]) -> bool {
        for script in scripts {
            let r = sb
                .run(&CommandSpec::shell(script.clone()).timeout(RESET_TIMEOUT))
                .await;
            if r.failure.is_some() || r.exit_code != Some(0) {
                tracing::info!(
                    sandbox = sb.id(),
                    script,
                    "reset failed; destroying instead of reusing"
                );
                return false;
            }
        }
        true
    }

    /// Waits until pool `profile` holds its `warm` target of ready sandboxes;
    /// false on timeout or an unknown pool.
    pub async fn wait_warm(&self, profile: &str, timeout: Duration) -> bool {
        let Some(target) = self.inner.config.pools.get(profile).map(|p| p.warm) else {
            return false;
        };
        let deadline = Instant::now() + timeout;
        // Wake the refiller once, before this waits: a wake-up after the
        // waiter exists would wake this waiter too, and it would spin.
        self.inner.changed.notify_waiters();
        loop {
            let waiter = self.inner.changed.notified();
            if lock(&self.inner.state)
                .pools
                .get(profile)
                .map_or(0, VecDeque::len)
                >= target
            {
                return true;
            }
            if tokio::time::timeout_at(deadline.into(), waiter)
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Every sandbox bound to a session or waiting in a pool, looked at
    /// without leasing it (an observer's view: no idle timer is reset).
    pub fn held(&self) -> Vec<Held> {
        let st = lock(&self.inner.state);
        let sessions = st.sessions.iter().map(|(k, e)| Held {
            key: Some(k.clone()),
            profile: e.profile.clone(),
            sandbox: e.sandbox.clone(),
        });
        let pooled = st.pools.iter().flat_map(|(profile, q)| {
            q.iter().map(|p| Held {
                key: None,
                profile: Some(profile.clone()),
                sandbox: p.sandbox.clone(),
            })
        });
        sessions.chain(pooled).collect()
    }

    /// State and counters now.
    pub fn stats(&self) -> ProviderStats {
        let st = lock(&self.inner.state);
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProviderStats {
            live: st.live,
            sessions: st.sessions.len(),
            pooled: st.pools.iter().map(|(k, q)| (k.clone(), q.len())).collect(),
            pool_hits: l(&c.pool_hits),
            pool_misses: l(&c.pool_misses),
            evicted_lru: l(&c.evicted_lru),
            evicted_idle: l(&c.evicted_idle),
            evicted_lifetime: l(&c.evicted_lifetime),
            restarted: l(&c.restarted),
            released: l(&c.released),
            discarded_changed: l(&c.discarded_changed),
        }
    }

    /// Serves again the sessions whose sandboxes an earlier process paused
    /// to disk (their containers stopped, their checkpoints and records in
    /// the snapshot directory): each becomes this provider's session,
    /// paused, until a resume restores it. Returns each session's key and
    /// the notes its front end left ([`Sandbox::set_note`]), so the front
    /// end can serve it as before. A record whose container is gone is
    /// removed with its checkpoint; a key this provider already serves is
    /// left alone.
    pub async fn recover_paused(&self) -> Result<Vec<(String, BTreeMap<String, String>)>, Error> {
        let runtime = &self.inner.runtime;
        let records = runtime.inner.held.paused_records().await;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let containers = runtime.list_sandboxes().await?;
        let mut recovered = Vec::new();
        for (record, checkpoint) in records {
            let stopped = containers.iter().any(|c| {
                c.sandbox_id == record.sandbox_id
                    && c.placement.id() == record.placement
                    && !c.state.is_running()
            });
            if !stopped {
                tracing::warn!(sandbox = %record.sandbox_id, session = %record.session, "the container of a sandbox paused to disk is gone or running: forgetting its checkpoint");
                if let Err(e) = runtime.inner.held.remove_paused(&record.sandbox_id).await {
                    tracing::warn!(sandbox = %record.sandbox_id, error = %e, "cannot remove a stale checkpoint");
                }
                continue;
            }
            let key = record.session.clone();
            let notes = record.notes.clone();
            let id = record.sandbox_id.clone();
            let sandbox = Sandbox::dormant(record, checkpoint, runtime.clone());
            let now = self.inner.now_ms();
            let mut st = lock(&self.inner.state);
            if st.sessions.contains_key(&key) {
                continue;
            }
            st.live += 1;
            st.sessions.insert(
                key.clone(),
                Entry {
                    sandbox,
                    profile: None,
                    last_used_ms: now,
                    started_ms: now,
                    leases: 0,
                },
            );
            drop(st);
            tracing::info!(sandbox = %id, session = %key, "serving a sandbox an earlier process paused to disk");
            recovered.push((key, notes));
        }
        Ok(recovered)
    }

    /// Destroys every sandbox the provider holds, except persistent ones
    /// (left running for the next corral to adopt) and those paused to disk
    /// (left stopped, with their checkpoints, for the next corral to
    /// resume), and stops its background work; later acquires fail.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        // Let refills in flight finish (they destroy what they start once
        // closed), so nothing is created behind our back.
        let deadline = Instant::now() + Duration::from_secs(120);
        while lock(&self.inner.state).refilling.values().any(|n| *n > 0)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all: Vec<Sandbox> = {
            let mut st = lock(&self.inner.state);
            // A sandbox paused to disk stays, stopped, with its record: the
            // next process serves its session again (`recover_paused`).
            let mut all: Vec<Sandbox> = st
                .sessions
                .drain()
                .map(|(_, e)| e.sandbox)
                .filter(|sb| sb.spec().persistent.is_none() && !sb.is_paused_to_disk())
                .collect();
            for (_, q) in st.pools.drain() {
                all.extend(q.into_iter().map(|p| p.sandbox));
            }
            st.live = st.live.saturating_sub(all.len());
            all
        };
        self.inner.changed.notify_waiters();
        let destroys = all.iter().map(|sb| async move {
            if let Err(e) = sb.destroy().await {
                tracing::warn!(sandbox = sb.id(), error = %e, "destroying at shutdown failed");
            }
        });
        futures_util::future::join_all(destroys).await;
        // Evictions and discards still running in the background.
        self.inner
            .teardowns
            .wait(Instant::now() + Duration::from_secs(120))
            .await;
        // Its live snapshots that are not durable go with it, as its
        // in-memory deltas do.
        self.inner.runtime.drop_own_live_snapshots().await;
    }
}

fn lost_error(sandbox: &str, container: &str, failure: corral_core::Failure) -> Error {
    let mut state = failure
        .container
        .unwrap_or_else(|| corral_core::ContainerState {
            status: corral_core::ContainerStatus::Removed,
            ..Default::default()
        });
    if state.id.is_empty() {
        state.id = container.to_string();
    }
    Error::ContainerLost {
        sandbox: sandbox.to_string(),
        state: Box::new(state),
    }
}

/// `$XDG_DATA_HOME/corral/workspaces`, else `~/.local/share/corral/workspaces`,
/// else `<tmp>/corral-<uid>/workspaces`.
pub fn default_persistence_root() -> PathBuf {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/share"))
        });
    match data {
        Some(d) => d.join("corral").join("workspaces"),
        None => std::env::temp_dir()
            .join(format!("corral-{}", workspace::euid()))
            .join("workspaces"),
    }
}

/// Clears setuid/setgid bits from a session's trees off the async threads.
async fn strip_in_blocking(dirs: SessionDirs, key: String) {
    let walk = tokio::task::spawn_blocking(move || workspace::strip_and_log(&dirs, &key));
    if let Err(e) = walk.await {
        tracing::warn!(error = %e, "clearing setuid bits in a persistent session failed");
    }
}

/// The reaper and refiller: expires idle and old sandboxes, drops dead
/// spares, and keeps every pool at its warm target.
async fn maintain(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        let provider = Provider { inner };
        provider.expire();
        provider.refill();
        let interval = Duration::from_millis(provider.inner.config.reap_interval_ms.max(10));
        let changed = provider.inner.changed.clone();
        // Hold no strong reference while waiting, so dropping the last
        // handle ends this task.
        drop(provider);
        // Wake on the interval, or early when a pool was drawn from.
        let _ = tokio::time::timeout(interval, changed.notified()).await;
    }
}

impl Provider {
    fn expire(&self) {
        let cfg = &self.inner.config;
        let now = self.inner.now_ms();
        let backend = self.inner.runtime.backend();
        let mut to_pause = Vec::new();
        let doomed: Vec<(Sandbox, bool)> = {
            let mut st = lock(&self.inner.state);
            let candidates = st.candidates();
            let mut doomed = Vec::new();
            for key in expired(&candidates, now, cfg) {
                let Some(e) = st.sessions.get_mut(&key) else {
                    continue;
                };
                let by_lifetime = cfg.max_lifetime_ms > 0
                    && now.saturating_sub(e.started_ms) >= cfg.max_lifetime_ms;
                if !by_lifetime
                    && cfg.on_idle_of(e.profile.as_deref()) == IdleAction::Pause
                    && backend.checkpoints(e.sandbox.spec())
                    && !e.sandbox.is_paused()
                {
                    // Held as leased while it pauses: no second expiry, no
                    // eviction meanwhile.
                    e.leases += 1;
                    to_pause.push((key, e.sandbox.clone()));
                    continue;
                }
                if let Some(e) = st.sessions.remove(&key) {
                    doomed.push((e.sandbox, by_lifetime));
                }
            }
            for q in st.pools.values_mut() {
                let mut keep = VecDeque::new();
                while let Some(p) = q.pop_front() {
                    let old = cfg.max_lifetime_ms > 0
                        && now.saturating_sub(p.started_ms) >= cfg.max_lifetime_ms;
                    if old || !p.sandbox.looks_alive() {
                        doomed.push((p.sandbox, old));
                    } else {
                        keep.push_back(p);
                    }
                }
                *q = keep;
            }
            st.live = st.live.saturating_sub(doomed.len());
            doomed
        };
        for (key, sb) in to_pause {
            self.pause_idle(key, sb);
        }
        if doomed.is_empty() {
            return;
        }
        for (sb, by_lifetime) in doomed {
            let counter = if by_lifetime {
                &self.inner.counters.evicted_lifetime
            } else {
                &self.inner.counters.evicted_idle
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                sandbox = sb.id(),
                by_lifetime,
                "evicting an expired sandbox"
            );
            sb.emit(
                crate::events::EventKind::Evicted,
                None,
                if by_lifetime {
                    "its maximum lifetime passed (provider.max_lifetime_ms)"
                } else {
                    "idle past provider.idle_timeout_ms"
                },
            );
            self.discard(sb);
        }
        self.inner.changed.notify_waiters();
    }

    /// Pauses session `key`'s idle sandbox to disk (`on_idle: pause`), in
    /// the background; one that cannot be paused is evicted as `release`
    /// would.
    fn pause_idle(&self, key: String, sb: Sandbox) {
        let provider = self.clone();
        tokio::spawn(async move {
            let paused = sb.pause().await;
            let give_back = |st: &mut State| {
                if let Some(e) = st.sessions.get_mut(&key) {
                    if e.sandbox.id() == sb.id() {
                        e.leases = e.leases.saturating_sub(1);
                    }
                }
            };
            match paused {
                Ok(()) => {
                    give_back(&mut lock(&provider.inner.state));
                    tracing::info!(sandbox = sb.id(), session = %key, "paused an idle sandbox to disk (on_idle: pause)");
                }
                Err(e) => {
                    tracing::warn!(sandbox = sb.id(), session = %key, error = %e, "cannot pause an idle sandbox to disk; releasing it");
                    give_back(&mut lock(&provider.inner.state));
                    let evicted = &provider.inner.counters.evicted_idle;
                    provider.evict_key(&key, &sb, Some(evicted));
                    provider.discard(sb);
                }
            }
        });
    }

    fn refill(&self) {
        let cfg = &self.inner.config;
        let mut starts: Vec<(String, SandboxSpec)> = Vec::new();
        {
            let mut st = lock(&self.inner.state);
            // Checked under the lock that counts refills: shutdown sets
            // `closed`, then waits for the count to drop to zero, so a refill
            // either shows in that count or never starts (one starting after
            // shutdown drained the pools would outlive it).
            if self.inner.closed.load(Ordering::Acquire) {
                return;
            }
            let behind_forks = self.inner.forking.load(Ordering::Acquire) > 0;
            for (name, pool) in &cfg.pools {
                let refilling = st.refilling.get(name).copied().unwrap_or(0);
                let have = st.pools.get(name).map_or(0, VecDeque::len) + refilling;
                for started in 0..pool.warm.saturating_sub(have) {
                    if cfg.max_live > 0 && st.live >= cfg.max_live {
                        break;
                    }
                    if behind_forks && refilling + started >= 1 {
                        break;
                    }
                    st.live += 1;
                    *st.refilling.entry(name.clone()).or_default() += 1;
                    starts.push((name.clone(), pool.spec.clone()));
                }
            }
        }
        for (name, spec) in starts {
            let provider = self.clone();
            tokio::spawn(async move {
                let created = provider.inner.runtime.create(&spec).await;
                let now = provider.inner.now_ms();
                let closed = provider.inner.closed.load(Ordering::Acquire);
                // Book-keeping under the lock; destroying and sleeping after.
                let leftover = {
                    let mut st = lock(&provider.inner.state);
                    match created {
                        Ok(sb) if !closed => {
                            st.pools.entry(name.clone()).or_default().push_back(Pooled {
                                sandbox: sb,
                                started_ms: now,
                            });
                            Ok(None)
                        }
                        Ok(sb) => {
                            st.live -= 1;
                            Ok(Some(sb))
                        }
                        Err(e) => {
                            st.live -= 1;
                            Err(e)
                        }
                    }
                };
                match leftover {
                    // Shut down meanwhile: destroy before counting the refill
                    // done, so shutdown's wait covers it.
                    Ok(Some(sb)) => {
                        if let Err(e) = sb.destroy().await {
                            tracing::warn!(sandbox = sb.id(), error = %e, "destroying a late refill failed");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(pool = %name, error = %e, "refilling a warm pool failed");
                        // Back off before the next refill attempt.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                if let Some(n) = lock(&provider.inner.state).refilling.get_mut(&name) {
                    *n = n.saturating_sub(1);
                }
                provider.inner.changed.notify_waiters();
            });
        }
    }
}
