//! [`LocalProcessBackend`]: the real agent as a local child process, for
//! tests and development only. **It isolates nothing**: see the crate docs.
//!
//! Each sandbox is one `unshare --pid --fork --mount-proc --kill-child --
//! corral-agent init --grace-ms N` child. `unshare` forks the agent as PID
//! 1 of a new PID namespace, which is what the agent insists on (its
//! `kill(-1)` then reaches only the namespace, never the host), with its
//! own `/proc` so the agent's process-tree walks see only the sandbox.
//! Killing the namespace's init kills everything in it, and `--kill-child`
//! kills the agent when `unshare` dies, so removing a sandbox never leaves
//! a process behind. The agent's other assumptions hold as in a container:
//! it makes itself non-dumpable; no-new-privileges is set before exec (as
//! Docker's default profile does), so the agent installs its seccomp filter
//! for commands; its dead-man switch works on the piped stdin. Its OOM
//! counter reads `/sys/fs/cgroup/memory.events` of whatever cgroup the test
//! runs in, so OOM verdicts mean nothing here (no memory limit applies).
//!
//! The runtime runs file operations as `/.corral/corral-agent`: the
//! agent's directory is bind-mounted (read-only) there in the child's
//! private mount namespace, so an empty `/.corral` directory is made on
//! the host as the mount point, once.
//!
//! The backend owns the child's stdin and stdout for the child's whole
//! life and hands the runtime a forwarding [`AgentStream`] per `connect`,
//! like Docker's attach: a new `connect` supersedes the old stream (its
//! output ends, its input stops reaching the agent) and the agent sees a new
//! session's sync bytes and Hello on the same pipes.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use corral_core::backend::{
    AgentOutput, AgentStream, Backend, BoxFuture, ImagePresence, OnDeath, Placement, Prepared,
    SandboxInfo, StartRequest,
};
use corral_core::labels::{self, Owner, Ownership};
use corral_core::protocol::AGENT_DIR;
use corral_core::{ContainerState, ContainerStatus, Error, FailureKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A marker for code review: every use of this backend is a use of
/// something that runs "sandboxed" commands directly on the host.
pub const UNSAFE_NOT_A_SANDBOX: &str =
    "LocalProcessBackend runs commands on the host with no isolation: tests only";

/// Agent log lines kept per sandbox for [`Backend::exit_details`].
const LOG_TAIL_LINES: usize = 20;

/// How long `remove` waits for a killed child to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// Where the agent and `unshare` are.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The static agent binary; defaults to the one this crate's build
    /// script built (`target/agent/...`) or `CORRAL_AGENT_BIN`.
    pub agent: PathBuf,
    /// util-linux `unshare`, which makes the agent PID 1 of a new PID
    /// namespace (needs root or user namespaces).
    pub unshare: PathBuf,
    /// Where per-sandbox working directories are made when the spec has no
    /// `workdir`.
    pub temp_root: PathBuf,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            agent: PathBuf::from(env!("CORRAL_TESTING_AGENT_BIN")),
            unshare: PathBuf::from("unshare"),
            temp_root: std::env::temp_dir(),
        }
    }
}

/// Test doubles for faults the Docker daemon cannot easily give. Each is
/// one-shot: armed by a test, consumed by the first operation it hits.
#[derive(Debug, Default)]
pub struct Faults {
    /// Control bytes the live (or next) stream still delivers before it is
    /// cut, possibly mid-frame.
    cut_after: Mutex<Option<usize>>,
    /// How long the next `start` hangs before it does anything.
    start_hang: Mutex<Option<Duration>>,
    /// `connect` calls still to fail.
    fail_connects: AtomicUsize,
    /// How long the next `remove` waits before it does anything.
    remove_delay: Mutex<Option<Duration>>,
}

impl Faults {
    /// Cuts the control stream after `n` more bytes of the agent's output
    /// (counted from now, on the live stream or the next one): the runtime
    /// sees the stream end, possibly in the middle of a frame, while the
    /// agent keeps running, as when the daemon drops an attach.
    pub fn cut_control_after(&self, n: usize) {
        *lock(&self.cut_after) = Some(n);
    }

    /// Makes the next `start` hang for `d` before it spawns anything, as a
    /// daemon stuck in container start does.
    pub fn hang_next_start(&self, d: Duration) {
        *lock(&self.start_hang) = Some(d);
    }

    /// Makes the next `connect` fail with a retryable engine error.
    pub fn fail_next_connect(&self) {
        self.fail_connects.fetch_add(1, Ordering::SeqCst);
    }

    /// Makes the next `remove` wait `d` before it kills anything, as a
    /// daemon slow to kill and remove a container does.
    pub fn delay_next_remove(&self, d: Duration) {
        *lock(&self.remove_delay) = Some(d);
    }
}

/// Runs corral's real agent as a local child process: **for tests and
/// development only, never for untrusted code** (see the crate docs).
/// Cheap to clone. Dropping the last clone kills every child it started.
#[derive(Clone)]
pub struct LocalProcessBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: LocalConfig,
    faults: Arc<Faults>,
    endpoint: String,
    sandboxes: Mutex<HashMap<String, Arc<Local>>>,
    next: AtomicU64,
}

/// Where a local sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Created,
    Running,
    Exited(i64),
}

/// The live output stream a `connect` handed out.
struct Session {
    tx: mpsc::UnboundedSender<io::Result<AgentOutput>>,
    pump: JoinHandle<()>,
}

/// One local sandbox.
struct Local {
    sandbox_id: String,
    placement: Placement,
    image: String,
    labels: HashMap<String, String>,
    created: i64,
    cwd: PathBuf,
    /// The directory made for it, removed with it.
    temp_dir: Option<PathBuf>,
    state: Mutex<LocalState>,
    /// The agent's stdin, kept open for the child's whole life so that a
    /// later `connect` reaches the same agent.
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    session: Mutex<Option<Session>>,
    generation: AtomicU64,
    log_tail: Mutex<VecDeque<String>>,
    faults: Arc<Faults>,
}

struct LocalState {
    life: Life,
    /// `unshare`'s pid.
    pid: Option<i32>,
    on_death: Option<OnDeath>,
    /// Tells the waiter task to kill the child.
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    /// Fires when the child has been reaped.
    reaped: Option<tokio::sync::watch::Receiver<bool>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few field updates; a panic in one leaves
    // nothing half-done worth refusing to read.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn host_error(what: String, e: impl std::fmt::Display) -> Error {
    Error::Host {
        what,
        reason: e.to_string(),
    }
}

impl LocalProcessBackend {
    /// A backend running the agent from `config`. See [`UNSAFE_NOT_A_SANDBOX`].
    pub fn new(config: LocalConfig) -> Self {
        tracing::warn!("{UNSAFE_NOT_A_SANDBOX}");
        let endpoint = format!("local-process:{}", config.agent.display());
        LocalProcessBackend {
            inner: Arc::new(Inner {
                config,
                faults: Arc::new(Faults::default()),
                endpoint,
                sandboxes: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
            }),
        }
    }

    /// The fault injectors of this backend.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// The host pid of the `unshare` process of `placement`, while it runs.
    pub fn pid(&self, placement: &Placement) -> Option<i32> {
        let local = self.get(placement)?;
        let st = lock(&local.state);
        (st.life == Life::Running).then_some(st.pid).flatten()
    }

    /// Kills a sandbox's whole process tree out of band (like `docker
    /// kill`): it reads as exited with 137, and stays listed until removed.
    pub fn kill(&self, placement: &Placement) {
        if let Some(local) = self.get(placement) {
            local.kill();
        }
    }

    /// How many sandboxes the backend holds, running or not.
    pub fn count(&self) -> usize {
        lock(&self.inner.sandboxes).len()
    }

    /// Kills every child and removes every directory this backend made, at
    /// once and without awaiting: the guard a test runs even when it fails.
    pub fn kill_all(&self) {
        self.inner.kill_all();
    }

    fn get(&self, placement: &Placement) -> Option<Arc<Local>> {
        lock(&self.inner.sandboxes).get(placement.id()).cloned()
    }

    fn spawn(
        &self,
        local: &Arc<Local>,
        grace_ms: u64,
        env: &[(String, String)],
    ) -> Result<(), Error> {
        let config = &self.inner.config;
        let mut cmd = Command::new(&config.unshare);
        let agent_dir = config.agent.parent().ok_or_else(|| {
            host_error(
                format!("start sandbox {}", local.sandbox_id),
                "the agent path has no directory",
            )
        })?;
        ensure_mount_point()?;
        // The runtime runs file commands as AGENT_PATH: the agent's own
        // directory is bind-mounted there, in the sandbox's private mount
        // namespace only; `exec` keeps the agent PID 1.
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .args(["/bin/sh", "-c", MOUNT_AND_EXEC, "sh"])
            .arg(agent_dir)
            .arg(AGENT_DIR)
            .arg(&config.agent)
            .arg(grace_ms.to_string())
            .current_dir(&local.cwd)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        // An image would supply PATH; the host's stands in for it.
        if !env.iter().any(|(k, _)| k == "PATH") {
            if let Some(path) = std::env::var_os("PATH") {
                cmd.env("PATH", path);
            }
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // SAFETY: only async-signal-safe prctl calls between fork and exec.
        // No-new-privileges mirrors Docker's default, so the agent installs
        // its seccomp filter for commands exactly as in a container; the
        // parent-death signal kills the child if the test process dies.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let id = &local.sandbox_id;
        let mut child = cmd
            .spawn()
            .map_err(|e| host_error(format!("spawn the agent of sandbox {id}"), e))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(host_error(
                format!("spawn the agent of sandbox {id}"),
                "a pipe is missing",
            ));
        };
        *local
            .stdin
            .try_lock()
            .map_err(|e| host_error(format!("start sandbox {id}"), e))? = Some(stdin);
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel();
        let (reaped_tx, reaped_rx) = tokio::sync::watch::channel(false);
        {
            let mut st = lock(&local.state);
            st.life = Life::Running;
            st.pid = child.id().and_then(|p| i32::try_from(p).ok());
            st.kill = Some(kill_tx);
            st.reaped = Some(reaped_rx);
        }
        tokio::spawn(read_output(local.clone(), stdout, false));
        tokio::spawn(read_output(local.clone(), stderr, true));
        tokio::spawn(wait_child(local.clone(), child, kill_rx, reaped_tx));
        Ok(())
    }
}

impl Inner {
    fn kill_all(&self) {
        let all: Vec<Arc<Local>> = lock(&self.sandboxes).drain().map(|(_, l)| l).collect();
        for local in all {
            local.kill_now();
            local.remove_dir();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Local {
    /// Asks the waiter to kill the child, and kills the namespace's init
    /// directly too, so that nothing depends on the waiter being polled.
    fn kill(&self) {
        let mut st = lock(&self.state);
        if let Some(tx) = st.kill.take() {
            let _ = tx.send(());
        }
        drop(st);
        self.kill_now();
    }

    /// SIGKILLs the agent (PID 1 of its namespace: the kernel then kills
    /// every process in it) and `unshare`, synchronously.
    fn kill_now(&self) {
        let st = lock(&self.state);
        let Some(pid) = st.pid.filter(|_| st.life == Life::Running) else {
            return;
        };
        for agent in children_of(pid) {
            // SAFETY: kill takes plain integers. The pid is a child of our
            // own, still unreaped child, so it names the agent.
            unsafe { libc::kill(agent, libc::SIGKILL) };
        }
        // SAFETY: as above; `pid` is our unreaped child (life is Running
        // until the waiter has reaped it, under this same lock).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    fn remove_dir(&self) {
        if let Some(dir) = &self.temp_dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "removing a local sandbox's directory failed");
                }
            }
        }
    }

    /// Delivers agent output to the live stream, applying an armed cut.
    fn deliver(&self, faults: Option<&Faults>, item: AgentOutput) {
        let mut session = lock(&self.session);
        let Some(s) = session.as_ref() else {
            return; // nobody attached: output is lost, as with Docker
        };
        let mut item = item;
        let mut cut = false;
        if let (Some(faults), AgentOutput::Control(bytes)) = (faults, &item) {
            let mut armed = lock(&faults.cut_after);
            if let Some(left) = *armed {
                if bytes.len() >= left {
                    item = AgentOutput::Control(bytes.slice(..left));
                    *armed = None;
                    cut = true;
                } else {
                    *armed = Some(left - bytes.len());
                }
            }
        }
        let _ = s.tx.send(Ok(item));
        if cut {
            tracing::warn!(sandbox = %self.sandbox_id, "fault injected: control stream cut");
            self.generation.fetch_add(1, Ordering::SeqCst);
            if let Some(s) = session.take() {
                s.pump.abort();
            }
        }
    }

    fn log(&self, bytes: &[u8]) {
        let mut tail = lock(&self.log_tail);
        for line in String::from_utf8_lossy(bytes).lines() {
            if !line.trim().is_empty() {
                tail.push_back(line.trim_end().to_string());
            }
        }
        while tail.len() > LOG_TAIL_LINES {
            tail.pop_front();
        }
    }

    fn container_state(&self) -> ContainerState {
        let st = lock(&self.state);
        let (status, exit_code) = match st.life {
            Life::Created => (ContainerStatus::Created, None),
            Life::Running => (ContainerStatus::Running, None),
            Life::Exited(code) => (ContainerStatus::Exited, Some(code)),
        };
        ContainerState {
            id: self.placement.id().to_string(),
            status,
            exit_code,
            ..ContainerState::default()
        }
    }
}

/// Run by `/bin/sh` as PID 1 of the new namespaces: binds the agent's
/// directory ($1) on the sandbox's agent directory ($2), then becomes the
/// agent ($3) with grace $4.
const MOUNT_AND_EXEC: &str =
    r#"mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && exec "$3" init --grace-ms "$4""#;

/// The agent directory must exist on the host to be a mount point: made
/// once, empty (what is mounted on it lives in each sandbox's private mount
/// namespace and never shows on the host).
fn ensure_mount_point() -> Result<(), Error> {
    match std::fs::create_dir(AGENT_DIR) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(host_error(format!("create the mount point {AGENT_DIR}"), e)),
    }
}

/// The pids listed as children of `pid` (its main thread's).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads the child's stdout (control) or stderr (log) until it ends.
async fn read_output(local: Arc<Local>, mut pipe: impl AsyncRead + Unpin, is_log: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let bytes = Bytes::copy_from_slice(&buf[..n]);
        if is_log {
            local.log(&bytes);
            local.deliver(None, AgentOutput::Log(bytes));
        } else {
            let faults = local.faults.clone();
            local.deliver(Some(&faults), AgentOutput::Control(bytes));
        }
    }
    if !is_log {
        // The agent's stdout is gone: the stream ends.
        if let Some(s) = lock(&local.session).take() {
            s.pump.abort();
        }
    }
}

/// Owns the child: reaps it (killing it first when asked), records how it
/// ended and reports the death to the watcher.
async fn wait_child(
    local: Arc<Local>,
    mut child: Child,
    kill: tokio::sync::oneshot::Receiver<()>,
    reaped: tokio::sync::watch::Sender<bool>,
) {
    let status = tokio::select! {
        s = child.wait() => s,
        _ = kill => {
            let _ = child.start_kill();
            child.wait().await
        }
    };
    let code = match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.code(), s.signal()) {
                (Some(c), _) => i64::from(c),
                (None, Some(sig)) => 128 + i64::from(sig),
                (None, None) => -1,
            }
        }
        Err(_) => -1,
    };
    let on_death = {
        let mut st = lock(&local.state);
        st.life = Life::Exited(code);
        st.kill = None;
        st.on_death.clone()
    };
    *local.stdin.lock().await = None;
    let _ = reaped.send(true);
    if let Some(f) = on_death {
        f(format!("the agent process exited with code {code}"));
    }
}

/// Forwards one stream's input to the agent's stdin while the stream is the
/// live one. Never closes the agent's stdin: a later `connect` needs it.
async fn pump_input(local: Arc<Local>, generation: u64, mut from: tokio::io::DuplexStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if local.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let mut stdin = local.stdin.lock().await;
        let Some(w) = stdin.as_mut() else { return };
        if w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}

impl Backend for LocalProcessBackend {
    fn name(&self) -> &'static str {
        "local process (TESTS ONLY, no isolation)"
    }

    fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }

    fn prepare<'a>(&'a self, _req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>> {
        Box::pin(async { Ok(Prepared::default()) })
    }

    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>> {
        Box::pin(async move {
            if req.spec.network.egress().is_some() {
                // It has no network isolation to enforce one with.
                return Err(Error::Unsupported {
                    what: "network.egress: the local process backend isolates nothing".into(),
                });
            }
            let id = req.sandbox_id;
            let n = self.inner.next.fetch_add(1, Ordering::SeqCst);
            let placement = Placement(format!("local-{id}-{n}"));
            let (cwd, temp_dir) = match &req.spec.workdir {
                Some(dir) => (PathBuf::from(dir), None),
                None => {
                    let dir = self
                        .inner
                        .config
                        .temp_root
                        .join(format!("corral-local-{}", placement.id()));
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| host_error(format!("create {}", dir.display()), e))?;
                    (dir.clone(), Some(dir))
                }
            };
            if !Path::new(&cwd).is_dir() {
                return Err(Error::Engine {
                    op: format!("create sandbox {id}"),
                    kind: FailureKind::InvalidSpec,
                    source: format!("workdir {} is not a directory on this host", cwd.display())
                        .into(),
                });
            }
            let local = Arc::new(Local {
                sandbox_id: id.to_string(),
                placement: placement.clone(),
                image: req.spec.image.clone(),
                labels: req.labels.clone(),
                created: now_secs(),
                cwd,
                temp_dir,
                state: Mutex::new(LocalState {
                    life: Life::Created,
                    pid: None,
                    on_death: None,
                    kill: None,
                    reaped: None,
                }),
                stdin: Arc::new(tokio::sync::Mutex::new(None)),
                session: Mutex::new(None),
                generation: AtomicU64::new(0),
                log_tail: Mutex::new(VecDeque::new()),
                faults: self.inner.faults.clone(),
            });
            lock(&self.inner.sandboxes).insert(placement.id().to_string(), local);
            Ok(placement)
        })
    }

    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let hang = lock(&self.inner.faults.start_hang).take();
            if let Some(d) = hang {
                tracing::warn!(sandbox = req.sandbox_id, ?d, "fault injected: start hangs");
                tokio::time::sleep(d).await;
            }
            let local = self.get(placement).ok_or_else(|| Error::Engine {
                op: format!("start sandbox {}", req.sandbox_id),
                kind: FailureKind::ContainerLost,
                source: "no such local sandbox".into(),
            })?;
            if lock(&local.state).life != Life::Created {
                return Ok(()); // already started, as Docker's 304
            }
            self.spawn(&local, req.spec.effective_grace_ms(), &req.agent_env)
        })
    }

    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>> {
        Box::pin(async move {
            let op = format!("attach to sandbox {sandbox_id}");
            let armed = self.inner.faults.fail_connects.load(Ordering::SeqCst);
            if armed > 0
                && self
                    .inner
                    .faults
                    .fail_connects
                    .compare_exchange(armed, armed - 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                tracing::warn!(sandbox = sandbox_id, "fault injected: connect fails");
                return Err(Error::EngineLost {
                    op,
                    source: "fault injected: connect fails once".into(),
                });
            }
            let lost = |state| Error::ContainerLost {
                sandbox: sandbox_id.to_string(),
                state: Box::new(state),
            };
            let Some(local) = self.get(placement) else {
                return Err(lost(ContainerState {
                    id: placement.id().to_string(),
                    status: ContainerStatus::Removed,
                    ..ContainerState::default()
                }));
            };
            let state = local.container_state();
            if state.status != ContainerStatus::Running {
                return Err(lost(state));
            }
            let (tx, mut rx) = mpsc::unbounded_channel();
            let (input, from) = tokio::io::duplex(64 * 1024);
            let generation = local.generation.fetch_add(1, Ordering::SeqCst) + 1;
            let pump = tokio::spawn(pump_input(local.clone(), generation, from));
            if let Some(old) = lock(&local.session).replace(Session { tx, pump }) {
                // Superseded: its output ends, its input goes nowhere.
                old.pump.abort();
            }
            let output = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            Ok(AgentStream {
                output: Box::pin(output),
                input: Box::pin(input),
            })
        })
    }

    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>> {
        Box::pin(async move {
            Ok(match self.get(placement) {
                Some(local) => local.container_state(),
                None => ContainerState {
                    id: placement.id().to_string(),
                    status: ContainerStatus::Removed,
                    ..ContainerState::default()
                },
            })
        })
    }

    fn exit_details<'a>(
        &'a self,
        placement: &'a Placement,
        mut state: ContainerState,
    ) -> BoxFuture<'a, ContainerState> {
        Box::pin(async move {
            if let Some(local) = self.get(placement) {
                state.log_tail = lock(&local.log_tail).iter().cloned().collect();
            }
            state
        })
    }

    fn watch(&self, placement: &Placement, on_death: OnDeath) {
        let Some(local) = self.get(placement) else {
            on_death("the sandbox was removed".into());
            return;
        };
        let mut st = lock(&local.state);
        if let Life::Exited(code) = st.life {
            drop(st);
            on_death(format!("the agent process exited with code {code}"));
            return;
        }
        st.on_death = Some(on_death);
    }

    fn unwatch(&self, placement: &Placement) {
        if let Some(local) = self.get(placement) {
            lock(&local.state).on_death = None;
        }
    }

    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        _sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let delay = lock(&self.inner.faults.remove_delay).take();
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            // Out of the map first: from here on it reads as removed.
            let Some(local) = lock(&self.inner.sandboxes).remove(placement.id()) else {
                return Ok(());
            };
            let reaped = lock(&local.state).reaped.clone();
            local.kill();
            if let Some(mut reaped) = reaped {
                let _ = tokio::time::timeout(REAP_WAIT, reaped.wait_for(|r| *r)).await;
            }
            if let Some(s) = lock(&local.session).take() {
                s.pump.abort();
            }
            local.remove_dir();
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>> {
        Box::pin(async move {
            let all: Vec<Arc<Local>> = lock(&self.inner.sandboxes).values().cloned().collect();
            Ok(all
                .into_iter()
                .map(|l| {
                    let state = l.container_state();
                    SandboxInfo {
                        sandbox_id: l.sandbox_id.clone(),
                        placement: l.placement.clone(),
                        image: l.image.clone(),
                        status: format!("{} (local process)", state.status),
                        state: state.status,
                        created: l.created,
                        owner: Owner::from_labels(&l.labels),
                        // The runtime fills this in; it knows the host.
                        ownership: Ownership::LiveOwner,
                        session: l.labels.get(labels::SESSION).cloned(),
                        labels: l.labels.clone(),
                    }
                })
                .collect())
        })
    }

    fn image_present<'a>(&'a self, _image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>> {
        // There is no image: every command runs on the host.
        Box::pin(async { Ok(ImagePresence::Present) })
    }
}
