//! A running sandbox: run commands through its agent, inspect it, tear it down.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_core::backend::Placement;
use corral_core::outcome::short;
use corral_core::protocol::{
    ExecRequest, ExitReport, Frame, FrameKind, ProtocolError, PtySize, SignalRequest, SpawnError,
    Started, OUTPUT_CHUNK,
};
use corral_core::units::Bytes;
use corral_core::{
    CommandResult, CommandSpec, ContainerState, ContainerStatus, Error, Failure, FailureKind,
    Recovery, SandboxSpec,
};
use tokio::sync::mpsc;

use crate::conn::{AgentConn, RouteRx};
use crate::metrics::StartPhase;
use crate::runtime::{Runtime, StartTimings};

/// State another module keeps with a sandbox by name (shell sessions):
/// opaque here, so this module does not depend on that one.
pub(crate) type Attached = Arc<dyn std::any::Any + Send + Sync>;

/// The slot holding a sandbox's current control stream.
pub(crate) type ConnSlot = Mutex<Arc<AgentConn>>;

/// How long past a command's own timeout corral waits for the agent's report
/// before it looks at the container itself.
const TIMEOUT_SLACK: Duration = Duration::from_secs(10);

/// A sandbox: one container with corral's agent as PID 1. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    id: String,
    spec: SandboxSpec,
    runtime: Runtime,
    /// Where the backend put it; replaced by a recreate.
    placement: Mutex<Placement>,
    /// The current control stream; replaced by a re-attach or a recreate.
    conn: Arc<ConnSlot>,
    /// Serializes re-attaching and recreating, so concurrent callers do it once.
    reattach: tokio::sync::Mutex<()>,
    destroyed: AtomicBool,
    /// Set while [`Sandbox::pause`] holds it frozen: its agent cannot
    /// answer until [`Sandbox::resume`], so readers that need not wait
    /// (a description's usage) ask the engine instead.
    frozen: AtomicBool,
    /// Where the checkpoint of a sandbox paused to disk is (its container
    /// stopped, no memory held) until [`Sandbox::resume`] restores it.
    on_disk: Mutex<Option<std::path::PathBuf>>,
    /// Set once a snapshot starts folding the changes of the sandbox's
    /// commands into its container's root file system (which then is its
    /// pristine state): the container no longer matches its spec, so a
    /// pool must not hand it to another session. Cleared when the container
    /// is replaced by a new one from the spec.
    base_folded: AtomicBool,
    /// Set under the `fail` policy once the container is lost: every later
    /// command returns this failure at once.
    dead: Mutex<Option<Failure>>,
    timings: Mutex<StartTimings>,
    /// Shell sessions by name (`shell.rs` owns their type; here they are
    /// only kept, and dropped with the sandbox).
    shells: Mutex<HashMap<String, Attached>>,
    /// Code contexts (`code.rs`): kernels, dropped with the sandbox.
    kernels: crate::code::Kernels,
    /// The provider session key it serves, once a provider handed it out.
    session: Mutex<Option<String>>,
    /// The delta its agent takes in before anything runs (a fork of a
    /// delta snapshot): at its start, and again in every new container
    /// that replaces its own. A warm pool's sandbox has one while a fork
    /// holds it ([`Sandbox::take_fork`]).
    base: Mutex<Option<crate::delta::Delta>>,
    /// What the front end that made it noted ([`Sandbox::set_note`]):
    /// kept with its record when it is paused to disk.
    notes: Mutex<std::collections::BTreeMap<String, String>>,
    /// Made by an earlier process ([`Sandbox::dormant`]): its container's
    /// owner labels name that process, so once resumed it stays marked
    /// paused (`Backend::mark_paused`), or every other corral's orphan
    /// reaper would take it for an orphan. Deleting it removes it.
    adopted: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a plain read or write of one value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a container whose control stream ended may still be reported
/// running before corral believes it: the daemon updates its state a moment
/// after the processes die.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest a start-up command may run.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

/// Which output stream bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// What [`Sandbox::recover_from`] made of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// Not the loss of the container: nothing to recover.
    NotLost,
    /// The container is back; run the command once more.
    Retry,
    /// The container is back, but the command that took it down would do
    /// so again: do not run it again.
    NoRetry,
    /// The sandbox is finished (`fail`) or could not be brought back: this
    /// is the command's failure.
    Failed(Failure),
}

/// True when a failure means the container itself is gone or stopped (as
/// opposed to a command failing inside a live one).
fn container_gone(f: &Failure) -> bool {
    match f.kind {
        FailureKind::ContainerLost => true,
        FailureKind::OomKilled => f.container.as_ref().is_some_and(|c| !c.status.is_running()),
        _ => false,
    }
}

impl Sandbox {
    pub(crate) fn new(
        id: String,
        placement: Placement,
        spec: SandboxSpec,
        conn: AgentConn,
        runtime: Runtime,
        base: Option<crate::delta::Delta>,
    ) -> Self {
        let conn: Arc<ConnSlot> = Arc::new(Mutex::new(Arc::new(conn)));
        watch(&runtime, &placement, &conn);
        Sandbox {
            inner: Arc::new(Inner {
                id,
                spec,
                runtime,
                placement: Mutex::new(placement),
                conn,
                reattach: tokio::sync::Mutex::new(()),
                destroyed: AtomicBool::new(false),
                frozen: AtomicBool::new(false),
                on_disk: Mutex::new(None),
                base_folded: AtomicBool::new(false),
                dead: Mutex::new(None),
                timings: Mutex::new(StartTimings::default()),
                shells: Mutex::new(HashMap::new()),
                kernels: Default::default(),
                session: Mutex::new(None),
                base: Mutex::new(base),
                notes: Mutex::new(Default::default()),
                adopted: false,
            }),
        }
    }

    /// A sandbox of session `record.session` that an earlier process paused
    /// to disk (its container stopped, its checkpoint in `checkpoint`):
    /// paused, with no control stream until [`Sandbox::resume`] restores
    /// it.
    pub(crate) fn dormant(
        record: crate::snapshots::held::PausedRecord,
        checkpoint: std::path::PathBuf,
        runtime: Runtime,
    ) -> Self {
        let conn = AgentConn::ended(format!(
            "sandbox {} is paused to disk: resume it",
            record.sandbox_id
        ));
        Sandbox {
            inner: Arc::new(Inner {
                id: record.sandbox_id,
                spec: record.spec,
                runtime,
                placement: Mutex::new(Placement(record.placement)),
                conn: Arc::new(Mutex::new(Arc::new(conn))),
                reattach: tokio::sync::Mutex::new(()),
                destroyed: AtomicBool::new(false),
                frozen: AtomicBool::new(true),
                on_disk: Mutex::new(Some(checkpoint)),
                base_folded: AtomicBool::new(false),
                dead: Mutex::new(None),
                timings: Mutex::new(StartTimings::default()),
                shells: Mutex::new(HashMap::new()),
                kernels: Default::default(),
                session: Mutex::new(Some(record.session)),
                base: Mutex::new(None),
                notes: Mutex::new(record.notes),
                adopted: true,
            }),
        }
    }

    /// Notes `value` under `name` for the front end that made the sandbox
    /// (its owner, its E2B identity): a sandbox paused to disk keeps its
    /// notes in its record, and a later process that serves it again reads
    /// them back ([`crate::Provider::recover_paused`]).
    pub fn set_note(&self, name: &str, value: impl Into<String>) {
        lock(&self.inner.notes).insert(name.to_string(), value.into());
    }

    /// Its notes ([`Sandbox::set_note`]).
    pub fn notes(&self) -> std::collections::BTreeMap<String, String> {
        lock(&self.inner.notes).clone()
    }

    /// The sandbox id (also the value of its `corral.sandbox` label).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The current container id (pod name, ...: the backend's placement;
    /// a recreate changes it).
    pub fn container_id(&self) -> String {
        self.placement().0
    }

    /// Where the backend put the sandbox now.
    pub fn placement(&self) -> Placement {
        lock(&self.inner.placement).clone()
    }

    /// A connection to `port` of a server listening inside the sandbox
    /// (see [`corral_core::Backend::open_port`]): the sandbox's own
    /// address, or its network namespace when it has none.
    pub async fn open_port(&self, port: u16) -> Result<corral_core::backend::PortStream, Error> {
        let backend = &self.inner.runtime.inner.backend;
        backend.open_port(&self.placement(), port).await
    }

    /// Notes the provider session key this sandbox now serves (its events
    /// carry it).
    pub(crate) fn set_session(&self, key: &str) {
        *lock(&self.inner.session) = Some(key.to_string());
    }

    /// Records a lifecycle event of this sandbox ([`crate::events`]).
    pub(crate) fn emit(
        &self,
        kind: crate::events::EventKind,
        outcome: Option<&str>,
        detail: impl Into<String>,
    ) {
        let tenant = self.inner.spec.labels.get(crate::events::TENANT_LABEL);
        let session = lock(&self.inner.session).clone();
        self.inner.runtime.inner.events.emit(
            kind,
            &self.inner.id,
            session.as_deref(),
            tenant.map(String::as_str),
            outcome,
            detail,
        );
    }

    /// What the sandbox's egress gateway allowed and refused (see
    /// [`corral_core::Backend::egress_counts`]); `None` without an egress
    /// policy.
    pub async fn egress_counts(&self) -> Result<Option<corral_core::egress::EgressCounts>, Error> {
        let backend = &self.inner.runtime.inner.backend;
        backend.egress_counts(self.id()).await
    }

    /// The spec the sandbox was created from.
    pub fn spec(&self) -> &SandboxSpec {
        &self.inner.spec
    }

    /// Where the (last) start of this sandbox spent its time.
    pub fn timings(&self) -> StartTimings {
        lock(&self.inner.timings).clone()
    }

    pub(crate) fn set_timings(&self, t: StartTimings) {
        *lock(&self.inner.timings) = t;
    }

    /// What is attached to the sandbox under `name` (a shell session's
    /// state), made by `make` on first use.
    pub(crate) fn attached(&self, name: &str, make: impl FnOnce() -> Attached) -> Attached {
        lock(&self.inner.shells)
            .entry(name.to_string())
            .or_insert_with(make)
            .clone()
    }

    /// Names of what is attached, sorted.
    pub(crate) fn attached_names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.shells).keys().cloned().collect();
        names.sort();
        names
    }

    /// Detaches and returns what is attached under `name`.
    pub(crate) fn detach(&self, name: &str) -> Option<Attached> {
        lock(&self.inner.shells).remove(name)
    }

    /// Whether the sandbox looks usable without asking the daemon: not
    /// destroyed, not dead, and its control stream open (the events watcher
    /// closes it when the container dies).
    pub fn looks_alive(&self) -> bool {
        !self.inner.destroyed.load(Ordering::Acquire)
            && self.dead().is_none()
            && !self.conn().is_closed()
    }

    /// The failure that ended this sandbox under the `fail` policy, if any.
    pub fn dead(&self) -> Option<Failure> {
        lock(&self.inner.dead).clone()
    }

    /// Which OOM counter the agent reads ("v1", "v2" or "none").
    pub fn oom_counter(&self) -> &'static str {
        match self.conn().hello.oom_counter.as_str() {
            "v1" => "v1",
            "v2" => "v2",
            _ => "none",
        }
    }

    /// Runs a command to completion and returns its outcome. Never returns an
    /// error: every failure is typed in [`CommandResult::failure`].
    ///
    /// When the container is lost, the sandbox's [`Recovery`] policy decides:
    /// `fail` marks the sandbox dead and returns the failure; `recreate`
    /// brings the container back and runs the command once more (output the
    /// first attempt already streamed to a sink is streamed again).
    pub async fn run(&self, cmd: &CommandSpec) -> CommandResult {
        self.run_with(cmd, |_, _| {}).await
    }

    /// Like [`Sandbox::run`], calling `sink` with output as it arrives (the
    /// head of each stream live, the kept tail at the end).
    pub async fn run_with(
        &self,
        cmd: &CommandSpec,
        mut sink: impl FnMut(OutputStream, &[u8]),
    ) -> CommandResult {
        let started = Instant::now();
        let first = self.run_once(cmd, &mut sink).await;
        {
            let mut t = lock(&self.inner.timings);
            if t.first_command.is_none() {
                let took = started.elapsed();
                t.first_command = Some(took);
                let m = &self.inner.runtime.inner.metrics;
                m.phase(StartPhase::FirstCommand, took);
                m.first_commands.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    sandbox = %self.inner.id,
                    first_command_ms = took.as_secs_f64() * 1e3,
                    start_ms = t.total.as_secs_f64() * 1e3,
                    "first command"
                );
            }
        }
        let Some(failure) = first.failure.clone() else {
            return first;
        };
        match self.recover_from(&failure).await {
            Recovered::Retry => self.run_once(cmd, &mut sink).await,
            Recovered::NotLost | Recovered::NoRetry => first,
            Recovered::Failed(f) => CommandResult {
                failure: Some(f),
                ..first
            },
        }
    }

    /// Applies the sandbox's [`Recovery`] policy to a command's failure:
    /// the one place it is decided, for `run`, `exec`, shells and the
    /// front ends (`corral run`'s stdin replay). A failure that is not the loss of the
    /// container changes nothing. Under `fail` the sandbox is marked dead
    /// and every later command returns this failure; under `recreate` the
    /// container is brought back (adopted or started anew under the same
    /// id, start-up commands run again) and the answer says whether the
    /// command should run once more (not when it took PID 1 down with it:
    /// an OOM kill of the init process would happen again).
    pub async fn recover_from(&self, failure: &Failure) -> Recovered {
        if !container_gone(failure) || self.inner.destroyed.load(Ordering::Acquire) {
            return Recovered::NotLost;
        }
        self.emit(
            crate::events::EventKind::Lost,
            Some(failure.kind.as_str()),
            failure.message.clone(),
        );
        let recovered = self.recover_lost(failure).await;
        if matches!(recovered, Recovered::Retry | Recovered::NoRetry) {
            self.emit(
                crate::events::EventKind::Recovered,
                None,
                "container recreated",
            );
        }
        recovered
    }

    async fn recover_lost(&self, failure: &Failure) -> Recovered {
        match self.inner.spec.recovery {
            Recovery::Fail => {
                self.mark_dead(failure);
                Recovered::Failed(failure.clone())
            }
            // Boxed: recovering runs start-up commands, which exec.
            Recovery::Recreate => match Box::pin(self.recover()).await {
                Ok(()) if failure.kind == FailureKind::OomKilled => Recovered::NoRetry,
                Ok(()) => Recovered::Retry,
                Err(e) => {
                    let mut f = failure.clone();
                    f.message = format!("{}; recreating the container failed: {e}", f.message);
                    Recovered::Failed(f)
                }
            },
        }
    }

    async fn run_once(
        &self,
        cmd: &CommandSpec,
        sink: &mut impl FnMut(OutputStream, &[u8]),
    ) -> CommandResult {
        let started = Instant::now();
        match self.exec(cmd).await {
            Ok(exec) => {
                if let Some(bytes) = &cmd.stdin {
                    if exec.write_stdin(bytes).await.is_ok() {
                        let _ = exec.close_stdin().await;
                    }
                }
                exec.wait_with(sink).await
            }
            Err(failure) => CommandResult::failed(failure, started.elapsed()),
        }
    }

    fn mark_dead(&self, failure: &Failure) {
        let mut dead = lock(&self.inner.dead);
        if dead.is_none() {
            tracing::warn!(sandbox = %self.inner.id, %failure, "sandbox lost its container; recovery policy is fail");
            *dead = Some(failure.clone());
        }
    }

    /// The delta a fork takes in before anything runs, if it is one.
    pub fn base(&self) -> Option<crate::delta::Delta> {
        lock(&self.inner.base).clone()
    }

    /// Makes this sandbox, a warm pool's that reset in place, a fork of
    /// `delta`: its agent takes the delta in place of its own (processes
    /// killed, a fresh world over the delta), and a container that later
    /// replaces its own takes it in too. [`Sandbox::reset_for_pool`]
    /// undoes it.
    pub(crate) async fn take_fork(&self, delta: &crate::delta::Delta) -> Result<(), Error> {
        self.drop_shells();
        let max = self.inner.runtime.config().snapshot_max_bytes;
        self.import_delta(delta, max, true).await?;
        *lock(&self.inner.base) = Some(delta.clone());
        Ok(())
    }

    /// Forgets the fork's delta (the sandbox goes back to its pool).
    pub(crate) fn clear_base(&self) {
        lock(&self.inner.base).take();
    }

    /// Takes the fork's delta in (if any; its start-up commands' effect
    /// is in it, so they are not run), else runs the spec's start-up
    /// commands in order; the first that fails fails the start. Returns
    /// (and records in the metrics) the time taken.
    pub(crate) async fn run_startup(&self) -> Result<Duration, Error> {
        let t = Instant::now();
        let base = self.base();
        if let Some(base) = &base {
            let max = self.inner.runtime.config().snapshot_max_bytes;
            Box::pin(self.import_delta(base, max, false)).await?;
        }
        let startup: &[String] = if base.is_some() {
            &[]
        } else {
            &self.inner.spec.startup
        };
        for (i, script) in startup.iter().enumerate() {
            let r = self
                .run_once(
                    &CommandSpec::shell(script.clone()).timeout(STARTUP_TIMEOUT),
                    &mut |_, _| {},
                )
                .await;
            if let Some(f) = r.failure {
                return Err(Error::Startup {
                    sandbox: self.inner.id.clone(),
                    index: i,
                    detail: f.to_string(),
                });
            }
            if r.exit_code != Some(0) {
                return Err(Error::Startup {
                    sandbox: self.inner.id.clone(),
                    index: i,
                    detail: format!(
                        "exit code {:?}: {}",
                        r.exit_code,
                        String::from_utf8_lossy(&r.stderr).trim()
                    ),
                });
            }
        }
        // Boxed: the first reset is an exchange on the stream like a command.
        Box::pin(self.enter_pristine()).await?;
        let took = t.elapsed();
        self.inner
            .runtime
            .inner
            .metrics
            .phase(StartPhase::Startup, took);
        Ok(took)
    }

    /// Pauses the sandbox until [`Sandbox::resume`]. Where its tier
    /// checkpoints (a live snapshot's), to disk: the checkpoint is written
    /// under the snapshot directory and the container stops, holding no
    /// memory; resuming restores it, processes and all (commands in flight
    /// go on under their timeouts, unobserved; shells and code contexts
    /// start afresh). Elsewhere it freezes every process, memory kept;
    /// commands sent meanwhile wait. `Unsupported` where the engine can do
    /// neither (Kubernetes).
    pub async fn pause(&self) -> Result<(), Error> {
        match self.pause_to_disk().await {
            Err(Error::Unsupported { what }) => {
                tracing::debug!(sandbox = %self.inner.id, %what, "pausing in memory (frozen), not to disk");
            }
            done => return done,
        }
        let placement = self.placement();
        self.inner
            .runtime
            .inner
            .backend
            .freeze(&placement, true)
            .await?;
        self.inner.frozen.store(true, Ordering::Release);
        Ok(())
    }

    /// Checkpoints the sandbox to disk and leaves it stopped; see
    /// [`Sandbox::pause`].
    async fn pause_to_disk(&self) -> Result<(), Error> {
        // Only sandboxes the backend can checkpoint (Docker: gVisor
        // without network): others freeze, with no file made.
        if !self
            .inner
            .runtime
            .inner
            .backend
            .checkpoints(&self.inner.spec)
        {
            return Err(Error::Unsupported {
                what: format!(
                    "pausing sandbox {} to disk: its tier cannot be checkpointed (gVisor \
                     sandboxes without network can)",
                    self.inner.id
                ),
            });
        }
        let _serial = self.inner.reattach.lock().await;
        let runtime = &self.inner.runtime;
        let backend = &runtime.inner.backend;
        let placement = self.placement();
        let dir = runtime.inner.held.paused_dir(&self.inner.id).await?;
        backend.unwatch(&placement);
        match backend.checkpoint(&placement, &dir, false).await {
            Ok(_) => {
                self.drop_shells();
                *lock(&self.inner.on_disk) = Some(dir);
                self.inner.frozen.store(true, Ordering::Release);
                self.record_paused().await;
                Ok(())
            }
            Err(e) => {
                watch(runtime, &placement, &self.inner.conn);
                let _ = tokio::fs::remove_dir_all(&dir).await;
                Err(e)
            }
        }
    }

    /// Records a sandbox of a provider session, just paused to disk, so a
    /// later process can serve its session again (a sandbox of no session
    /// belongs to this process alone, and goes with it).
    async fn record_paused(&self) {
        let Some(session) = lock(&self.inner.session).clone() else {
            return;
        };
        let record = crate::snapshots::held::PausedRecord {
            sandbox_id: self.inner.id.clone(),
            placement: self.placement().0,
            session,
            spec: self.inner.spec.clone(),
            notes: self.notes(),
            paused_at: crate::snapshots::now(),
        };
        if let Err(e) = self.inner.runtime.inner.held.put_paused(&record).await {
            tracing::warn!(sandbox = %self.inner.id, error = %e, "cannot record a sandbox paused to disk: it will not outlive this process");
            return;
        }
        // Every corral on the host (their orphan reapers) keeps it now.
        let backend = &self.inner.runtime.inner.backend;
        if let Err(e) = backend
            .mark_paused(&self.placement(), &self.inner.id, true)
            .await
        {
            tracing::warn!(sandbox = %self.inner.id, error = %e, "cannot mark a sandbox paused to disk: another corral's reaper may remove it once this process ends");
        }
    }

    /// Resumes a sandbox [`Sandbox::pause`] paused: restores one paused to
    /// disk from its checkpoint, thaws a frozen one.
    pub async fn resume(&self) -> Result<(), Error> {
        let on_disk = lock(&self.inner.on_disk).clone();
        if on_disk.is_some() {
            let _serial = self.inner.reattach.lock().await;
            // A concurrent resume may have restored it meanwhile.
            let Some(dir) = lock(&self.inner.on_disk).clone() else {
                return Ok(());
            };
            let runtime = &self.inner.runtime;
            let placement = self.placement();
            runtime.inner.backend.restore(&placement, &dir).await?;
            if lock(&self.inner.session).is_some() && !self.inner.adopted {
                if let Err(e) = runtime
                    .inner
                    .backend
                    .mark_paused(&placement, &self.inner.id, false)
                    .await
                {
                    tracing::warn!(sandbox = %self.inner.id, error = %e, "cannot unmark a resumed sandbox");
                }
            }
            let conn = runtime
                .connect_as(&placement, &self.inner.id, &self.inner.spec, true)
                .await?;
            *lock(&self.inner.conn) = Arc::new(conn);
            watch(runtime, &placement, &self.inner.conn);
            *lock(&self.inner.on_disk) = None;
            self.inner.frozen.store(false, Ordering::Release);
            if let Err(e) = runtime.inner.held.remove_paused(&self.inner.id).await {
                tracing::warn!(sandbox = %self.inner.id, dir = %dir.display(), error = %e, "cannot remove a resumed sandbox's checkpoint");
            }
            return Ok(());
        }
        let placement = self.placement();
        self.inner
            .runtime
            .inner
            .backend
            .freeze(&placement, false)
            .await?;
        self.inner.frozen.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether [`Sandbox::pause`] paused it (and no [`Sandbox::resume`]
    /// resumed it since): its agent answers nothing meanwhile.
    pub fn is_paused(&self) -> bool {
        self.inner.frozen.load(Ordering::Acquire)
    }

    /// Whether it is paused to disk: its container stopped, its processes
    /// and memory in a checkpoint.
    pub fn is_paused_to_disk(&self) -> bool {
        lock(&self.inner.on_disk).is_some()
    }

    /// The checkpoint of a sandbox paused to disk.
    pub(crate) fn paused_checkpoint(&self) -> Option<std::path::PathBuf> {
        lock(&self.inner.on_disk).clone()
    }

    /// Starts a command and returns a handle to feed it and wait for it. With
    /// `cmd.stdin` set, the command gets a stdin pipe the caller feeds through
    /// the handle (the bytes in `cmd.stdin` are not sent by this call).
    pub async fn exec(&self, cmd: &CommandSpec) -> Result<Execution, Failure> {
        // The agent sends at most max_output per stream (head and tail);
        // anything beyond that queued for the caller is not the agent's.
        let budget = cmd
            .max_output
            .saturating_mul(2)
            .saturating_add(4 * OUTPUT_CHUNK as u64)
            .min(usize::MAX as u64) as usize;
        self.exec_with_budget(cmd, budget).await
    }

    /// Starts `cmd` on a pseudo-terminal of `size` (see
    /// [`CommandSpec::pty`]): the handle's stdin writes are keystrokes
    /// (`\x03` is Ctrl-C), [`Execution::resize`] resizes, its output is the
    /// terminal's. Bounded like any command (timeout, output budget, its
    /// tree killed at the end) and counted in the same usage.
    pub async fn spawn_pty(&self, cmd: &CommandSpec, size: PtySize) -> Result<Execution, Failure> {
        let mut cmd = cmd.clone();
        cmd.pty = Some(size);
        self.exec(&cmd).await
    }

    /// [`Sandbox::exec`], keeping at most `budget` bytes of output queued
    /// while the caller does not read (more is dropped and counted).
    pub(crate) async fn exec_with_budget(
        &self,
        cmd: &CommandSpec,
        budget: usize,
    ) -> Result<Execution, Failure> {
        if cmd.argv.is_empty() {
            return Err(Failure::new(
                FailureKind::InvalidSpec,
                "invalid argv '[]': a command is required",
            ));
        }
        if self.is_paused_to_disk() {
            return Err(Failure::new(
                FailureKind::InvalidSpec,
                format!(
                    "sandbox {} is paused to disk: resume it before running commands",
                    self.inner.id
                ),
            ));
        }
        if let Some(size) = &cmd.pty {
            size.validate()
                .map_err(|m| Failure::new(FailureKind::InvalidSpec, m))?;
        }
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(Failure::new(
                FailureKind::ContainerLost,
                format!("sandbox {} was destroyed", self.inner.id),
            ));
        }
        if let Some(f) = self.dead() {
            return Err(f);
        }
        let mut conn = self.conn();
        if conn.is_closed() {
            if let Some(v) = conn.violation() {
                return Err(self.violated(&v));
            }
            conn = match self.reattach(conn).await {
                Ok(c) => c,
                Err(f) => match self.recover_from(&f).await {
                    // The container is back: this command runs on it.
                    Recovered::Retry | Recovered::NoRetry => self.conn(),
                    Recovered::NotLost => return Err(f),
                    Recovered::Failed(f) => return Err(f),
                },
            };
        }
        if cmd.pty.is_some() && !conn.hello.pty {
            return Err(Failure::new(
                FailureKind::Unsupported,
                format!(
                    "sandbox {}: its agent (version {}) does not run commands on terminals",
                    self.inner.id, conn.hello.agent_version
                ),
            ));
        }
        let id = conn.next_id();
        let rx = match conn.register(id, budget) {
            Ok(rx) => rx,
            Err(_) => return Err(self.stream_failure(&conn).await),
        };
        let req = ExecRequest {
            argv: cmd.argv.clone(),
            cwd: cmd.cwd.clone(),
            env: cmd.env.clone(),
            stdin: cmd.stdin.is_some(),
            timeout_ms: cmd
                .timeout
                .map(|t| t.as_millis().min(u64::MAX as u128) as u64),
            max_output: cmd.max_output,
            exclusive: cmd.exclusive,
            wait_for_output: cmd.wait_for_output,
            pty: cmd.pty,
            relay: cmd.relay,
        };
        if conn
            .send(Frame::json(FrameKind::Exec, id, &req))
            .await
            .is_err()
        {
            conn.forget(id);
            return Err(self.stream_failure(&conn).await);
        }
        Ok(Execution {
            sandbox: self.clone(),
            id,
            rx,
            writer: conn.sender(),
            conn: conn.clone(),
            started: Instant::now(),
            timeout: cmd.timeout,
            max_output: cmd.max_output,
            pid: None,
            done: false,
            early: VecDeque::new(),
        })
    }

    /// The failure for a control stream that ended: a protocol violation
    /// finishes the sandbox; otherwise the container's state explains it.
    async fn stream_failure(&self, conn: &AgentConn) -> Failure {
        match conn.violation() {
            Some(v) => self.violated(&v),
            None => self.diagnose(&conn.closed_reason()).await,
        }
    }

    /// Marks the sandbox dead for a protocol violation, whatever its
    /// recovery policy: nothing it reports can be trusted any more, and
    /// recreating it would hide the evidence.
    fn violated(&self, violation: &str) -> Failure {
        let f = Failure::new(
            FailureKind::ProtocolViolation,
            format!(
                "sandbox {}: the agent's control stream broke the protocol ({violation}); the sandbox is finished and its results are not trusted",
                self.inner.id
            ),
        );
        self.mark_dead(&f);
        f
    }

    fn conn(&self) -> Arc<AgentConn> {
        lock(&self.inner.conn).clone()
    }

    /// The current control stream.
    pub(crate) fn current_conn(&self) -> Arc<AgentConn> {
        self.conn()
    }

    /// What the agent said at the handshake of the current stream.
    pub(crate) fn conn_hello(&self) -> corral_core::protocol::HelloAck {
        self.conn().hello.clone()
    }

    /// The directory its commands run in when they name none: the spec's
    /// `workdir`, else the one the agent reported (the image's
    /// `WorkingDir`), else `/`.
    pub fn workdir(&self) -> String {
        self.inner
            .spec
            .workdir
            .clone()
            .or_else(|| self.conn().hello.workdir.clone())
            .unwrap_or_else(|| "/".into())
    }

    /// The runtime that made it.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// Marks the container's base as changed by a fold (a snapshot), before
    /// the fold starts: one that fails half-way changed it too.
    pub(crate) fn mark_base_folded(&self) {
        self.inner.base_folded.store(true, Ordering::Release);
    }

    /// The sandbox's code contexts (`code.rs`).
    pub(crate) fn kernels_slot(&self) -> &crate::code::Kernels {
        &self.inner.kernels
    }

    /// True when a snapshot folded changes into the current container's
    /// root file system: its resets return there, not to the spec's state.
    pub(crate) fn base_folded(&self) -> bool {
        self.inner.base_folded.load(Ordering::Acquire)
    }

    /// Forgets every shell session (their processes die with a reset).
    pub(crate) fn drop_shells(&self) {
        lock(&self.inner.shells).clear();
        self.inner.kernels.clear();
    }

    /// Checkpoints the running sandbox into `dir` ([`Backend::checkpoint`])
    /// and connects to it again as it goes on; the bytes written. Its
    /// container stops for the checkpoint, which is no death, so it is not
    /// watched meanwhile. Commands in flight go on in the sandbox under
    /// their timeouts, unobserved: their callers get the stream's end.
    /// Shells and code contexts are forgotten (their relays go on, nobody
    /// speaks to them).
    pub(crate) async fn checkpoint_into(&self, dir: &std::path::Path) -> Result<u64, Error> {
        let _serial = self.inner.reattach.lock().await;
        let runtime = &self.inner.runtime;
        let backend = &runtime.inner.backend;
        let placement = self.placement();
        backend.unwatch(&placement);
        let taken = backend.checkpoint(&placement, dir, true).await;
        if taken.is_err() && !self.conn().is_closed() {
            // Refused before the container stopped.
            watch(runtime, &placement, &self.inner.conn);
            return taken;
        }
        self.drop_shells();
        let size = match taken {
            Ok(size) => size,
            Err(e) => {
                // It stopped and did not come back: watching it again tells
                // its commands so; the checkpoint's error is the cause.
                watch(runtime, &placement, &self.inner.conn);
                return Err(e);
            }
        };
        let conn = runtime
            .connect_as(&placement, &self.inner.id, &self.inner.spec, true)
            .await;
        watch(runtime, &placement, &self.inner.conn);
        *lock(&self.inner.conn) = Arc::new(conn?);
        Ok(size)
    }

    /// Replaces the container with a new one from the same spec (start-up
    /// commands run again), whatever state the old one is in (removed
    /// first: the new one takes its name). A sandbox marked dead is alive
    /// again.
    pub(crate) async fn replace(&self) -> Result<(), Error> {
        let _serial = self.inner.reattach.lock().await;
        let runtime = &self.inner.runtime;
        let id = &self.inner.id;
        let old = self.placement();
        runtime.inner.backend.unwatch(&old);
        let new = self.start_over(&old).await?;
        tracing::info!(sandbox = %id, old = %old, new = %new, "replaced the sandbox's container");
        *lock(&self.inner.dead) = None;
        self.run_startup().await.map(|_| ())
    }

    /// Removes the container at `old` (first: the new one takes its name)
    /// and starts a new one for this sandbox from its spec, under the same
    /// id; returns where it is. Start-up commands are the caller's to run.
    async fn start_over(&self, old: &Placement) -> Result<Placement, Error> {
        let runtime = &self.inner.runtime;
        let id = &self.inner.id;
        if let Err(e) = runtime.remove(old, id).await {
            tracing::warn!(sandbox = %id, container = %old, error = %e, "removing the sandbox's earlier container failed");
        }
        let started = runtime.start_new(&self.inner.spec, id, None, None).await?;
        let placement = started.placement.clone();
        self.swap(started.placement, started.conn);
        self.set_timings(started.timings);
        Ok(placement)
    }

    /// Points the sandbox at a new placement and control stream.
    fn swap(&self, placement: Placement, conn: AgentConn) {
        let backend = &self.inner.runtime.inner.backend;
        // A new container from the spec: nothing of a fold carries over.
        self.inner.base_folded.store(false, Ordering::Release);
        let old = std::mem::replace(&mut *lock(&self.inner.placement), placement.clone());
        backend.unwatch(&old);
        *lock(&self.inner.conn) = Arc::new(conn);
        watch(&self.inner.runtime, &placement, &self.inner.conn);
    }

    /// Brings a lost container back (the `recreate` policy): adopts a
    /// running container another corral already recreated for this sandbox,
    /// else removes the dead one and starts a new one from the identical
    /// spec, then re-runs the start-up commands.
    async fn recover(&self) -> Result<(), Error> {
        let _serial = self.inner.reattach.lock().await;
        if !self.conn().is_closed() {
            return Ok(()); // a concurrent caller recovered it
        }
        let runtime = &self.inner.runtime;
        let id = &self.inner.id;
        let old = self.placement();
        for info in runtime.list_sandboxes().await? {
            if info.sandbox_id == *id
                && info.placement != old
                && info.state == ContainerStatus::Running
                && runtime.sealed_for(&info, &self.inner.spec).await
            {
                if let Ok(conn) = runtime.connect(&info.placement, id, &self.inner.spec).await {
                    tracing::warn!(sandbox = %id, container = %info.placement, "adopted a container another corral recreated");
                    self.swap(info.placement, conn);
                    return Ok(());
                }
            }
        }
        let new = self.start_over(&old).await?;
        tracing::warn!(sandbox = %id, old = %old, new = %new, "recreated the sandbox's container");
        runtime
            .inner
            .metrics
            .recreated
            .fetch_add(1, Ordering::Relaxed);
        self.run_startup().await.map(|_| ())
    }

    /// Connects again when the control stream broke but the container still
    /// runs (e.g. the daemon dropped the attach connection); otherwise
    /// explains the loss.
    async fn reattach(&self, stale: Arc<AgentConn>) -> Result<Arc<AgentConn>, Failure> {
        let _serial = self.inner.reattach.lock().await;
        let current = self.conn();
        if !Arc::ptr_eq(&current, &stale) && !current.is_closed() {
            return Ok(current);
        }
        let reason = stale.closed_reason();
        let state = self.settled_state().await;
        if !matches!(&state, Ok(s) if s.status.is_running()) {
            return Err(self.explain(&reason, state));
        }
        match self
            .inner
            .runtime
            .connect(&self.placement(), &self.inner.id, &self.inner.spec)
            .await
        {
            Ok(conn) => {
                let conn = Arc::new(conn);
                *self.inner.conn.lock().unwrap_or_else(|p| p.into_inner()) = conn.clone();
                tracing::warn!(sandbox = %self.inner.id, %reason, "re-attached to the agent");
                Ok(conn)
            }
            Err(e) => {
                let state = self.settled_state().await;
                let mut f = self.explain(&reason, state);
                if f.kind == FailureKind::AgentError {
                    f.message = format!("{}; re-attaching failed: {e}", f.message);
                }
                Err(f)
            }
        }
    }

    /// The container's state once it has settled: a container still listed
    /// as running (or being removed) is re-inspected for a moment, because its
    /// control stream ending usually means it is about to be reported stopped
    /// or gone. A stopped one carries the backend's exit details (an OOM
    /// kill told by other means, the agent's last log lines).
    async fn settled_state(&self) -> Result<ContainerState, Error> {
        let until = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let state = self.state().await;
            match &state {
                Ok(s)
                    if matches!(
                        s.status,
                        ContainerStatus::Running | ContainerStatus::Removing
                    ) && Instant::now() < until =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(s)
                    if !matches!(
                        s.status,
                        ContainerStatus::Removed | ContainerStatus::Running
                    ) =>
                {
                    let backend = &self.inner.runtime.inner.backend;
                    return Ok(backend.exit_details(&self.placement(), s.clone()).await);
                }
                _ => return state,
            }
        }
    }

    /// The container's current state, from the backend.
    pub async fn state(&self) -> Result<ContainerState, Error> {
        self.inner
            .runtime
            .inner
            .backend
            .state(&self.placement())
            .await
    }

    /// Explains why the control stream ended, from the container's state.
    async fn diagnose(&self, reason: &str) -> Failure {
        let state = self.settled_state().await;
        self.explain(reason, state)
    }

    fn explain(&self, reason: &str, state: Result<ContainerState, Error>) -> Failure {
        let sb = &self.inner.id;
        let cid = short(&self.container_id()).to_string();
        match state {
            Ok(state) if state.status == ContainerStatus::Removed => Failure {
                kind: FailureKind::ContainerLost,
                message: format!("sandbox {sb}: container {cid} was removed while in use ({reason})"),
                container: Some(state),
            },
            Ok(state) if state.status.is_running() => Failure {
                kind: FailureKind::AgentError,
                message: format!("sandbox {sb}: lost the agent's control stream while container {cid} still runs ({reason})"),
                container: Some(state),
            },
            Ok(state) => Failure {
                kind: if state.oom_killed { FailureKind::OomKilled } else { FailureKind::ContainerLost },
                message: format!(
                    "sandbox {sb}: container {cid} stopped while in use{} ({reason})",
                    if state.oom_killed { ", its init process was OOM-killed" } else { "" }
                ),
                container: Some(state),
            },
            Err(e) => {
                let mut f = e.failure();
                f.message = format!("sandbox {sb}: {} ({reason})", f.message);
                f
            }
        }
    }

    /// Kills and removes the container. Idempotent; a container that is
    /// already gone counts as removed.
    pub async fn destroy(&self) -> Result<(), Error> {
        if self.inner.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.emit(crate::events::EventKind::Removed, None, "");
        // Shells and kernels hold handles to this sandbox: let them go.
        lock(&self.inner.shells).clear();
        self.inner.kernels.clear();
        let placement = self.placement();
        let runtime = &self.inner.runtime;
        runtime.inner.backend.unwatch(&placement);
        let removed = runtime.remove(&placement, &self.inner.id).await;
        let on_disk = lock(&self.inner.on_disk).take();
        if let Some(dir) = on_disk {
            if let Err(e) = runtime.inner.held.remove_paused(&self.inner.id).await {
                tracing::warn!(sandbox = %self.inner.id, dir = %dir.display(), error = %e, "cannot remove a paused sandbox's checkpoint");
            }
        }
        removed
    }
}

/// The `command` event of a command that ended with `r`.
fn command_event(sandbox: &Sandbox, r: &CommandResult) {
    let outcome = match (&r.failure, r.exit_code) {
        (Some(f), _) => f.kind.as_str(),
        (None, Some(0)) => "ok",
        (None, _) => "exit",
    };
    let code = r
        .exit_code
        .map(|c| format!("exit {c}"))
        .or_else(|| r.signal.map(|s| format!("signal {s}")))
        .unwrap_or_else(|| "no exit".to_string());
    sandbox.emit(
        crate::events::EventKind::Command,
        Some(outcome),
        format!("{code}, {:.1} ms", r.duration.as_secs_f64() * 1e3),
    );
}

/// Has the backend close the sandbox's current control stream when its
/// container dies, so commands in flight end typed instead of waiting.
fn watch(runtime: &Runtime, placement: &Placement, slot: &Arc<ConnSlot>) {
    let slot = Arc::downgrade(slot);
    runtime.inner.backend.watch(
        placement,
        Arc::new(move |reason: String| {
            if let Some(slot) = slot.upgrade() {
                let conn = lock(&slot).clone();
                conn.close(reason);
            }
        }),
    );
}

/// What a command in flight did next; see [`Execution::next_event`].
#[derive(Debug)]
pub enum ExecEvent {
    /// Output bytes.
    Output(OutputStream, Vec<u8>),
    /// The command ended (or could not start, or its sandbox was lost).
    Ended(Box<CommandResult>),
}

/// A command in flight.
pub struct Execution {
    sandbox: Sandbox,
    conn: Arc<AgentConn>,
    id: u32,
    rx: RouteRx,
    writer: mpsc::Sender<Vec<u8>>,
    started: Instant,
    timeout: Option<Duration>,
    max_output: u64,
    pid: Option<u32>,
    done: bool,
    /// Output read while waiting for the start ([`Execution::started`]),
    /// handed out first by [`Execution::next_event`].
    early: VecDeque<ExecEvent>,
}

/// A cloneable handle that feeds a running command's stdin and signals it,
/// usable from another task while the [`Execution`] is awaited.
#[derive(Clone)]
pub struct StdinWriter {
    id: u32,
    writer: mpsc::Sender<Vec<u8>>,
}

impl StdinWriter {
    /// Sends bytes to the command's stdin.
    pub async fn write(&self, bytes: &[u8]) -> Result<(), String> {
        for chunk in bytes.chunks(OUTPUT_CHUNK) {
            self.writer
                .send(Frame::new(FrameKind::Stdin, self.id, chunk.to_vec()).encode())
                .await
                .map_err(|_| "the control stream closed".to_string())?;
        }
        Ok(())
    }

    /// Closes the command's stdin (it reads EOF).
    pub async fn close(&self) -> Result<(), String> {
        self.writer
            .send(Frame::new(FrameKind::StdinEof, self.id, Vec::new()).encode())
            .await
            .map_err(|_| "the control stream closed".to_string())
    }

    /// Sends a signal to the command's process group.
    pub async fn signal(&self, signal: i32) -> Result<(), String> {
        self.writer
            .send(Frame::json(FrameKind::Signal, self.id, &SignalRequest { signal }).encode())
            .await
            .map_err(|_| "the control stream closed".to_string())
    }

    /// Resizes the terminal of a command started with
    /// [`CommandSpec::pty`] (its foreground process group gets SIGWINCH).
    /// `Err` names a size out of range; the agent refuses a resize of a
    /// command that does not run on a terminal (logged, the command goes
    /// on).
    pub async fn resize(&self, size: PtySize) -> Result<(), String> {
        size.validate()?;
        self.writer
            .send(Frame::json(FrameKind::Resize, self.id, &size).encode())
            .await
            .map_err(|_| "the control stream closed".to_string())
    }
}

impl Execution {
    /// A handle for feeding stdin from another task.
    pub fn stdin(&self) -> StdinWriter {
        StdinWriter {
            id: self.id,
            writer: self.writer.clone(),
        }
    }

    /// Sends bytes to the command's stdin.
    pub async fn write_stdin(&self, bytes: &[u8]) -> Result<(), String> {
        self.stdin().write(bytes).await
    }

    /// Closes the command's stdin.
    pub async fn close_stdin(&self) -> Result<(), String> {
        self.stdin().close().await
    }

    /// Sends a signal to the command's process group.
    pub async fn signal(&self, signal: i32) -> Result<(), String> {
        self.stdin().signal(signal).await
    }

    /// Resizes the command's terminal (see [`StdinWriter::resize`]).
    pub async fn resize(&self, size: PtySize) -> Result<(), String> {
        self.stdin().resize(size).await
    }

    /// The command's pid inside the sandbox, once known.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Decodes one frame of this command: the one place frames become
    /// output or an outcome. `Ended` carries the exit status, totals and
    /// typed failure, without output.
    fn step(&mut self, frame: Frame) -> Option<ExecEvent> {
        let sb = self.sandbox.inner.id.clone();
        match frame.kind {
            FrameKind::Started => {
                if let Ok(s) = frame.parse::<Started>() {
                    self.pid = Some(s.pid);
                }
                None
            }
            FrameKind::Stdout | FrameKind::StdoutTail => {
                Some(ExecEvent::Output(OutputStream::Stdout, frame.payload))
            }
            FrameKind::Stderr | FrameKind::StderrTail => {
                Some(ExecEvent::Output(OutputStream::Stderr, frame.payload))
            }
            FrameKind::Exited => {
                self.done = true;
                let mut r = CommandResult::default();
                match frame.parse::<ExitReport>() {
                    Ok(report) => {
                        r.exit_code = report.exit_code;
                        r.signal = report.signal;
                        r.stdout_total_bytes = report.stdout.total_bytes;
                        r.stderr_total_bytes = report.stderr.total_bytes;
                        r.stdout_truncated = report.stdout.truncated;
                        r.stderr_truncated = report.stderr.truncated;
                        r.duration = Duration::from_micros(report.duration_us);
                        r.usage = report.usage.map(Into::into);
                        if report.timed_out {
                            let t = self.timeout.unwrap_or_default();
                            r.failure = Some(Failure::new(
                                FailureKind::Timeout,
                                format!("sandbox {sb}: command timed out after {t:?}; its process tree was killed"),
                            ));
                        } else if report.oom_killed {
                            let limit = match self.sandbox.inner.spec.limits.memory {
                                Some(m) => format!("memory limit {}", Bytes(m)),
                                None => "no memory limit".to_string(),
                            };
                            r.failure = Some(Failure::new(
                                FailureKind::OomKilled,
                                format!(
                                    "sandbox {sb}: command was killed by the OOM killer ({limit})"
                                ),
                            ));
                        }
                    }
                    Err(e) => {
                        r.failure = Some(Failure::new(
                            FailureKind::AgentError,
                            format!("sandbox {sb}: {e}"),
                        ))
                    }
                }
                Some(ExecEvent::Ended(Box::new(r)))
            }
            FrameKind::SpawnFailed => {
                self.done = true;
                let message = frame
                    .parse::<SpawnError>()
                    .map(|e| e.message)
                    .unwrap_or_else(|e| e.to_string());
                Some(ExecEvent::Ended(Box::new(CommandResult::failed(
                    Failure::new(FailureKind::SpawnFailed, format!("sandbox {sb}: {message}")),
                    Duration::ZERO,
                ))))
            }
            FrameKind::Error => {
                let message = frame
                    .parse::<ProtocolError>()
                    .map(|e| e.message)
                    .unwrap_or_else(|e| e.to_string());
                if self.pid.is_some() {
                    // A refused frame for a running command (its stdin was
                    // already closed, say) does not end it.
                    tracing::debug!(sandbox = %sb, error = %message, "agent refused a frame");
                    return None;
                }
                self.done = true;
                Some(ExecEvent::Ended(Box::new(CommandResult::failed(
                    Failure::new(FailureKind::AgentError, format!("sandbox {sb}: {message}")),
                    Duration::ZERO,
                ))))
            }
            _ => None,
        }
    }

    /// The next thing the command did, for callers that consume output as a
    /// stream and keep the command running (shell sessions). `Ended` carries
    /// the exit status and typed failure, without output (it was streamed).
    pub async fn next_event(&mut self) -> ExecEvent {
        if let Some(event) = self.early.pop_front() {
            return event;
        }
        loop {
            let Some(frame) = self.rx.recv().await else {
                self.done = true;
                let failure = self.sandbox.stream_failure(&self.conn).await;
                return ExecEvent::Ended(Box::new(CommandResult::failed(
                    failure,
                    self.started.elapsed(),
                )));
            };
            if let Some(event) = self.step(frame) {
                return match event {
                    ExecEvent::Ended(mut r) => {
                        if r.duration.is_zero() {
                            r.duration = self.started.elapsed();
                        }
                        command_event(&self.sandbox, &r);
                        ExecEvent::Ended(r)
                    }
                    output => output,
                };
            }
        }
    }

    /// Waits until the agent reports the command running and returns its
    /// pid; the outcome instead when it ended first (it could not start, or
    /// its sandbox was lost). Output read meanwhile is kept for
    /// [`Execution::next_event`].
    pub async fn started(&mut self) -> Result<u32, Box<CommandResult>> {
        loop {
            if let Some(pid) = self.pid {
                return Ok(pid);
            }
            let Some(frame) = self.rx.recv().await else {
                self.done = true;
                let failure = self.sandbox.stream_failure(&self.conn).await;
                return Err(Box::new(CommandResult::failed(
                    failure,
                    self.started.elapsed(),
                )));
            };
            match self.step(frame) {
                None => {}
                Some(ExecEvent::Ended(r)) => return Err(r),
                Some(output) => self.early.push_back(output),
            }
        }
    }

    /// Waits for the outcome, calling `sink` with output as it arrives.
    pub async fn wait_with(mut self, mut sink: impl FnMut(OutputStream, &[u8])) -> CommandResult {
        let sb = self.sandbox.inner.id.clone();
        let deadline = self.timeout.map(|t| self.started + t + TIMEOUT_SLACK);
        // The agent caps output; this guards against a misbehaving one.
        let guard = self.max_output.saturating_add(OUTPUT_CHUNK as u64) as usize;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut result = loop {
            let frame = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), self.rx.recv()).await {
                    Ok(f) => f,
                    Err(_) => {
                        let state = self.sandbox.state().await.ok();
                        let mut failure = Failure::new(
                            FailureKind::AgentError,
                            format!(
                                "sandbox {sb}: the agent did not report command {} within its timeout plus {TIMEOUT_SLACK:?}",
                                self.id
                            ),
                        );
                        if let Some(s) = state.filter(|s| !s.status.is_running()) {
                            failure.kind = if s.oom_killed {
                                FailureKind::OomKilled
                            } else {
                                FailureKind::ContainerLost
                            };
                            failure.container = Some(s);
                        }
                        let _ = self.signal(9).await;
                        break CommandResult::failed(failure, Duration::ZERO);
                    }
                },
                None => self.rx.recv().await,
            };
            let Some(frame) = frame else {
                let failure = self.sandbox.stream_failure(&self.conn).await;
                break CommandResult::failed(failure, Duration::ZERO);
            };
            match self.step(frame) {
                Some(ExecEvent::Output(stream, bytes)) => {
                    sink(stream, &bytes);
                    let kept = match stream {
                        OutputStream::Stdout => &mut stdout,
                        OutputStream::Stderr => &mut stderr,
                    };
                    if kept.len() < guard {
                        kept.extend_from_slice(&bytes);
                    }
                }
                Some(ExecEvent::Ended(r)) => break *r,
                None => {}
            }
        };
        result.stdout = stdout;
        result.stderr = stderr;
        if result.duration.is_zero() {
            result.duration = self.started.elapsed();
        }
        if self.rx.dropped() > 0 {
            // Only an agent that ignored max_output gets here.
            result.stdout_truncated = true;
            result.stderr_truncated = true;
        }
        command_event(&self.sandbox, &result);
        result
    }

    /// Changes how many output bytes may wait unread before more are dropped.
    pub(crate) fn set_output_budget(&self, cap: usize) {
        self.rx.set_budget(cap);
    }

    /// Output bytes dropped so far because nobody was reading them.
    pub fn dropped_output(&self) -> u64 {
        self.rx.dropped()
    }

    /// An event that is already queued, without waiting.
    pub(crate) fn try_next_output(&mut self) -> Option<ExecEvent> {
        loop {
            let frame = self.rx.try_recv().ok()?;
            if let Some(event) = self.step(frame) {
                return Some(event);
            }
        }
    }

    /// Waits for the outcome.
    pub async fn wait(self) -> CommandResult {
        self.wait_with(|_, _| {}).await
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        self.conn.unregister(self.id);
        if !self.done {
            // Abandoned mid-run: kill its process tree rather than let it run
            // unobserved.
            let frame =
                Frame::json(FrameKind::Signal, self.id, &SignalRequest { signal: 9 }).encode();
            let _ = self.writer.try_send(frame);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let placement = lock(&self.placement).clone();
        self.runtime.inner.backend.unwatch(&placement);
    }
}
