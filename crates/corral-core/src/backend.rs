//! The seam between corral's runtime and a container engine.
//!
//! The runtime (`corral`) does everything that is the same whatever runs
//! the sandboxes: the agent's control stream, commands, recovery, the
//! provider, shells, files, limits. A [`Backend`] does only what differs
//! between engines: make a sandbox from a spec, open a byte stream to its
//! agent, tell its state, watch for its death, remove it, list what it
//! made. A backend never calls into the runtime; the runtime holds it as
//! `Arc<dyn Backend>`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use tokio::io::AsyncWrite;

use crate::error::Error;
use crate::labels::{Owner, Ownership};
use crate::snapshot::{SnapshotInfo, SnapshotRequest};
use crate::{ContainerState, SandboxSpec};

/// A snapshot and the labels it carries (its ownership is judged from
/// them).
pub type LabelledSnapshot = (SnapshotInfo, HashMap<String, String>);

/// A boxed future, so that [`Backend`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a backend put a sandbox: an opaque, engine-specific handle (a
/// container id for Docker, a pod name for Kubernetes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement(pub String);

impl Placement {
    /// The engine's id for it.
    pub fn id(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(crate::outcome::short(&self.0))
    }
}

/// Everything a backend needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct StartRequest<'a> {
    /// The sandbox id (the `corral.sandbox` label).
    pub sandbox_id: &'a str,
    /// The validated spec.
    pub spec: &'a SandboxSpec,
    /// Variables PID 1 itself is started with, besides the image's. Never
    /// the spec's environment: the runtime hands that to the agent at each
    /// handshake, so no engine holds its values in a container's
    /// configuration (where `docker inspect` shows them and `docker commit`
    /// copies them into a snapshot image). The runtime leaves this empty; a
    /// backend wrapping another may add its agent's own (`CORRAL_AGENT_*`).
    pub agent_env: Vec<(String, String)>,
    /// Labels every object made for this sandbox carries: the sandbox id,
    /// the owner, and for persistent sandboxes the session and its seal.
    pub labels: HashMap<String, String>,
    /// The owner record, for helper objects the backend makes.
    pub owner: &'a Owner,
}

/// What preparing a start cost, by phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// Looking up (or pulling) the image.
    pub image: Duration,
    /// Making the agent binary available to the sandbox.
    pub agent: Duration,
}

/// What comes out of a sandbox's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentOutput {
    /// Bytes of the control stream (the agent's stdout).
    Control(Bytes),
    /// The agent's own log lines (its stderr), kept for diagnostics.
    Log(Bytes),
}

/// A byte stream to a sandbox's agent: what it writes, and its input.
pub struct AgentStream {
    /// The agent's output, in order; ends when the stream does.
    pub output: Pin<Box<dyn Stream<Item = io::Result<AgentOutput>> + Send>>,
    /// The agent's input; shutting it down is the agent's EOF.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// A byte stream to a port of a server inside a sandbox.
pub trait PortIo: tokio::io::AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + AsyncWrite + Send + Unpin> PortIo for T {}

/// One connection to a port inside a sandbox ([`Backend::open_port`]).
pub type PortStream = Box<dyn PortIo>;

/// How long a direct connection to a port inside a sandbox may take.
pub const PORT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A TCP connection to a server at `ip:port` inside sandbox `sandbox`
/// (`place` names it for a person: "the sandbox", "pod NAME"), for the
/// backends that reach it at its own address; nothing accepting there is
/// an [`Error::Agent`] saying so.
pub async fn connect_port(
    sandbox: &str,
    place: &str,
    ip: std::net::IpAddr,
    port: u16,
) -> Result<PortStream, Error> {
    let refused = |why: String| Error::Agent {
        sandbox: sandbox.to_string(),
        message: format!(
            "nothing accepts connections on port {port} of {place} ({ip}:{port}: {why})"
        ),
    };
    let connect = tokio::net::TcpStream::connect((ip, port));
    match tokio::time::timeout(PORT_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream))
        }
        Ok(Err(e)) => Err(refused(e.to_string())),
        Err(_) => Err(refused(format!(
            "no answer within {} s",
            PORT_CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Called once when the engine reports that a watched sandbox died, with
/// a sentence saying how.
pub type OnDeath = Arc<dyn Fn(String) + Send + Sync>;

/// One sandbox a backend made, as its engine lists it.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    /// Sandbox id (the `corral.sandbox` label).
    pub sandbox_id: String,
    /// Where it is.
    pub placement: Placement,
    /// Image.
    pub image: String,
    /// The engine's status text, e.g. "Up 3 seconds".
    pub status: String,
    /// Where it is in its life.
    pub state: crate::outcome::ContainerStatus,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// The owning corral process, when labelled.
    pub owner: Option<Owner>,
    /// Whether its owner is alive, gone, elsewhere, or it is persistent:
    /// filled in by the runtime from the owner labels (it knows the host),
    /// unless the backend judges it itself ([`Backend::judges_ownership`]).
    pub ownership: Ownership,
    /// The session key of a persistent sandbox.
    pub session: Option<String>,
    /// Every label.
    pub labels: HashMap<String, String>,
}

/// One check of `doctor`: a protection or a piece of the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// Whether an engine holds an image, as far as it can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePresence {
    /// Present: a start uses it without pulling.
    Present,
    /// Not present: a start would pull it.
    Absent,
    /// The engine cannot tell: the machines that run sandboxes pull images
    /// themselves and nobody it can ask knows which holds what (Kubernetes:
    /// the API server does not track the nodes' image stores). The caller
    /// must decide as if the image might be pulled.
    Unknown,
}

/// An image an engine holds that a sandbox can name (tagged; snapshots
/// left out), as `corral images` and `GET /v1/images` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// `repository:tag`.
    pub reference: String,
    /// Bytes on disk.
    pub size: u64,
    /// When it was built, in seconds since the epoch.
    pub created: i64,
}

/// An image a template build made ([`Backend::commit`]): a step's cached
/// layer or a template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuiltImage {
    /// The reference it was asked for by (`repository:tag`).
    pub reference: String,
    /// The engine's id of it (`sha256:...`).
    pub id: String,
    /// Its labels.
    pub labels: std::collections::HashMap<String, String>,
    /// When it was made, in seconds since the epoch.
    pub created: i64,
    /// Bytes on disk.
    pub size: u64,
    /// Its configuration's environment (`NAME=value`), where the engine
    /// says (a lookup by reference does; a listing need not).
    pub env: Vec<String>,
}

/// Where a pull of a missing image is, as the engine reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullProgress {
    /// Waiting for one of the engine's pull slots (`daemon.pull_limit`).
    pub queued: bool,
    /// Layers fetched (or found already present).
    pub layers_done: usize,
    /// Layers the image has, as far as the registry has said.
    pub layers: usize,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Bytes of the layers being downloaded, as far as known.
    pub total_bytes: u64,
}

/// Who measured a [`Usage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UsageSource {
    /// The engine, from outside the sandbox ([`Backend::usage`]: Docker's
    /// stats).
    #[default]
    Engine,
    /// The sandbox's agent, from its cgroup and network counters inside
    /// (engines with no accounting of their own: Kubernetes).
    Agent,
}

impl UsageSource {
    /// The name on the wire: `engine` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageSource::Engine => "engine",
            UsageSource::Agent => "agent",
        }
    }
}

/// What a sandbox uses now, from its cgroup (read by the engine, or by the
/// sandbox's agent from inside), against its limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Who read it.
    pub source: UsageSource,
    /// CPU time used since it started, in nanoseconds (all its processes,
    /// the dead included).
    pub cpu_ns: u64,
    /// Memory in use now, in bytes (the page cache the kernel can drop
    /// left out, as `docker stats` does; tmpfs files count).
    pub memory_bytes: u64,
    /// The most memory it used at once, where the cgroup keeps it (v1's
    /// `max_usage_in_bytes`; v2's `memory.peak`, newer kernels only).
    pub memory_peak_bytes: Option<u64>,
    /// Its memory limit (`limits.memory`); `None`: none.
    pub memory_limit_bytes: Option<u64>,
    /// Processes (and threads) alive now.
    pub pids: u64,
    /// Its process limit (`limits.pids`); `None`: none.
    pub pids_limit: Option<u64>,
    /// Bytes read from block devices.
    pub block_read_bytes: u64,
    /// Bytes written to block devices.
    pub block_write_bytes: u64,
    /// Bytes received over its network interfaces.
    pub net_rx_bytes: u64,
    /// Bytes sent over its network interfaces.
    pub net_tx_bytes: u64,
    /// Processes the kernel's OOM killer killed in it, where the reader
    /// can tell (the agent reads its cgroup's counter; Docker's stats do
    /// not carry it).
    pub oom_kills: Option<u64>,
}

/// A pull under way on the engine: which image, how far, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullStatus {
    /// The image reference being pulled.
    pub image: String,
    /// How far it is.
    pub progress: PullProgress,
    /// Since the first start (or `corral pull`) asked for it.
    pub elapsed: Duration,
}

/// Where persistent sessions keep their workspace and home, which a
/// backend says once for all its sandboxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SessionStorage {
    /// Directories on corral's own host, under the persistence root: the
    /// runtime makes and guards them (private, setuid bits cleared while
    /// no sandbox of the session runs), records the session's container
    /// there, and passes them in the spec as `nosuid` mounts at
    /// [`SESSION_WORKSPACE`] and [`SESSION_HOME`]. For an engine on
    /// corral's host (Docker).
    #[default]
    HostDirectories,
    /// A volume of the engine's per session key: for a spec whose
    /// `persistent` is set the backend makes it (or finds it), mounts it
    /// at [`SESSION_WORKSPACE`] and [`SESSION_HOME`], keeps it when the
    /// sandbox is removed, and records which sandbox it made for the
    /// session ([`Backend::session_placement`]). For an engine whose
    /// sandboxes run on other machines (Kubernetes).
    Backend,
}

/// Where a persistent session's workspace is mounted (its working
/// directory).
pub const SESSION_WORKSPACE: &str = "/workspace";
/// Where a persistent session's home is mounted (`$HOME`).
pub const SESSION_HOME: &str = "/home/corral";

/// Retry and failure counters a backend keeps about its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Engine calls retried after a transient error.
    pub retries: u64,
}

/// A container engine that runs corral sandboxes. See the module docs.
///
/// Every method that talks to the engine retries its transient errors
/// itself and reports what is left as an [`Error`] whose kind says whether
/// the caller may retry.
pub trait Backend: Send + Sync + 'static {
    /// The engine's name, for messages ("Docker").
    fn name(&self) -> &'static str;

    /// Where the backend is connected, for messages and `doctor`.
    fn endpoint(&self) -> &str;

    /// Checks that the engine answers.
    fn ping(&self) -> BoxFuture<'_, Result<(), Error>>;

    /// Work a start needs that is not counted against the start limit:
    /// the image, the agent binary, networks.
    fn prepare<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>>;

    /// Makes the sandbox, not yet started. On failure nothing is left.
    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>>;

    /// Starts a created sandbox: its agent runs as PID 1.
    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Opens a byte stream to the agent of a running sandbox. Opening a
    /// new one supersedes the old (the agent's handshake tells them apart).
    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>>;

    /// The sandbox's state now; one that no longer exists is `removed`,
    /// not an error.
    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>>;

    /// Completes the state of a sandbox that stopped: an OOM kill the
    /// engine told in another way than the state, the agent's last log
    /// lines. Best effort and bounded in time.
    fn exit_details<'a>(
        &'a self,
        placement: &'a Placement,
        state: ContainerState,
    ) -> BoxFuture<'a, ContainerState> {
        let _ = placement;
        Box::pin(async move { state })
    }

    /// Calls `on_death` when the engine reports that the sandbox died or
    /// was removed, until [`Backend::unwatch`].
    fn watch(&self, placement: &Placement, on_death: OnDeath);

    /// Stops watching.
    fn unwatch(&self, placement: &Placement);

    /// Kills and removes the sandbox and whatever was made for it. One
    /// already gone counts as removed.
    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Every sandbox with corral's labels, running or not.
    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>>;

    /// Whether [`Backend::list`] judges each sandbox's
    /// [`SandboxInfo::ownership`] itself. By default it does not: the
    /// runtime judges it from the owner labels, which works where every
    /// owner runs on one host with the engine (a live process on this
    /// host, or gone; an owner on another host cannot be judged). A
    /// backend whose owners may run anywhere (Kubernetes: a Lease each
    /// owner renews) judges it and says so here; it must never call a
    /// sandbox of a live owner an orphan.
    fn judges_ownership(&self) -> bool {
        false
    }

    /// Where persistent sessions keep their files.
    fn session_storage(&self) -> SessionStorage {
        SessionStorage::HostDirectories
    }

    /// With [`SessionStorage::Backend`]: the sandbox the backend last made
    /// for persistent session `session`, while it exists as made (never
    /// one that merely carries the session's labels). `None` when there
    /// is none, and always with host directories (the runtime keeps that
    /// record itself).
    fn session_placement<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Option<Placement>, Error>> {
        let _ = session;
        Box::pin(async { Ok(None) })
    }

    /// Removes what the engine keeps for sandboxes or owners that are gone
    /// (volumes of containers removed out-of-band, expired Leases);
    /// returns a volume's name, or `kind/name` for anything else.
    fn collect_garbage(&self) -> BoxFuture<'_, Result<Vec<String>, Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Whether `image` is present, as far as the engine can tell (nothing
    /// is pulled).
    fn image_present<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>>;

    /// The snapshot whose image `image` resolves to on the engine, by any
    /// spelling it accepts (tag, digest, image id or a prefix of one), as
    /// its labels record it; `None` for an image that is no snapshot's or
    /// is absent. Engines that keep no snapshot images have none.
    fn image_snapshot<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::principal::QualifiedName>, Error>> {
        let _ = image;
        Box::pin(async { Ok(None) })
    }

    /// What the egress gateway of `sandbox_id` (a sandbox with `network:
    /// {egress: ...}`) allowed and refused; `None` for a sandbox without
    /// one or a backend without egress policies.
    fn egress_counts<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::egress::EgressCounts>, Error>> {
        let _ = sandbox_id;
        Box::pin(async { Ok(None) })
    }

    /// Opens a connection to `port` of a server listening inside the
    /// sandbox at `placement` (reached at the sandbox's own address, or
    /// through its network namespace when it has none: a sandbox with
    /// `network: none` gains no way out by it). Nothing listening is
    /// `Error::Network` naming the port.
    fn open_port<'a>(
        &'a self,
        placement: &'a Placement,
        port: u16,
    ) -> BoxFuture<'a, Result<PortStream, Error>> {
        let _ = (placement, port);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!(
                    "reaching ports of sandboxes with the {} backend",
                    self.name()
                ),
            })
        })
    }

    /// What the sandbox at `placement` uses now ([`Usage`]; the limits
    /// are filled in by the runtime from the spec).
    fn usage<'a>(&'a self, placement: &'a Placement) -> BoxFuture<'a, Result<Usage, Error>> {
        let _ = placement;
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!("usage of sandboxes with the {} backend", self.name()),
            })
        })
    }

    /// Freezes (`frozen`) or thaws every process of the sandbox at
    /// `placement`, its memory kept (Docker: the cgroup freezer, `docker
    /// pause`). An engine that cannot is `Error::Unsupported`.
    fn freeze<'a>(
        &'a self,
        placement: &'a Placement,
        frozen: bool,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (placement, frozen);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!(
                    "pausing sandboxes with the {} backend (it cannot freeze a sandbox and keep \
                     its memory)",
                    self.name()
                ),
            })
        })
    }

    /// The images the engine holds that sandboxes can name, newest first
    /// (an engine whose machines pull for themselves cannot list them).
    fn images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, Error>> {
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!(
                    "listing images with the {} backend (its machines pull images themselves)",
                    self.name()
                ),
            })
        })
    }

    /// Makes sure `image` is present, pulling it when missing, as a start
    /// of it would (one pull per image at a time, bounded, typed).
    fn pull<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        let _ = image;
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!(
                    "pulling ahead of a start with the {} backend (its machines pull images \
                     when a sandbox starts)",
                    self.name()
                ),
            })
        })
    }

    /// The pulls under way on this engine (none where the machines that
    /// run sandboxes pull by themselves).
    fn pulls(&self) -> Vec<PullStatus> {
        Vec::new()
    }

    /// Whether [`Backend::snapshot`] keeps snapshots as images (Docker's
    /// `docker commit`). Without it the runtime keeps snapshots itself,
    /// as deltas through the agent's stream, of sandboxes that reset in
    /// place.
    fn keeps_snapshot_images(&self) -> bool {
        false
    }

    /// Where the runtime writes a delta once for every fork to read: each
    /// sandbox that resets in place gets its own directory of it
    /// ([`sandbox_deltas_dir`]) mounted read-only at
    /// [`crate::protocol::SHARED_DELTAS_DIR`], and the runtime links the
    /// delta there only for the import of that sandbox (so a sandbox only
    /// ever finds there the delta it is taking in, even where its agent
    /// could not hide the mount). `None`: forks get their delta over their
    /// agent's stream.
    fn shared_deltas(&self) -> Option<&std::path::Path> {
        None
    }

    /// Keeps the file system of the sandbox at `placement` as snapshot
    /// `req.name` (replacing one of that name), from which sandboxes can
    /// start ([`SnapshotInfo::image`]).
    fn snapshot<'a>(
        &'a self,
        placement: &'a Placement,
        req: &'a SnapshotRequest<'a>,
    ) -> BoxFuture<'a, Result<SnapshotInfo, Error>> {
        let _ = (placement, req);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!("snapshots with the {} backend", self.name()),
            })
        })
    }

    /// Whether sandboxes of `spec` run where [`Backend::checkpoint`] can
    /// take them (Docker: gVisor without network, under
    /// [`crate::spec::GVISOR_LIVE_RUNTIME`]). Such a runtime keeps the
    /// root file system's changes in its own memory, not in the
    /// container: a snapshot of the file system alone would miss them, so
    /// the runtime takes a live one. False by default.
    fn checkpoints(&self, spec: &crate::SandboxSpec) -> bool {
        let _ = spec;
        false
    }

    /// Checkpoints the running sandbox at `placement` into directory `dir`
    /// (which must not exist; its parent must); the sandbox stops, holding
    /// no memory. With `resume` it is restored in place at once and goes on
    /// from the checkpoint. Its control stream breaks either way, so the
    /// caller connects again. Returns the bytes written. A tier that
    /// cannot checkpoint refuses by name, before anything stops.
    fn checkpoint<'a>(
        &'a self,
        placement: &'a Placement,
        dir: &'a std::path::Path,
        resume: bool,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        let _ = (placement, dir, resume);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!("live snapshots with the {} backend", self.name()),
            })
        })
    }

    /// Starts the created (or checkpointed and stopped) sandbox at
    /// `placement` from the checkpoint in `dir` ([`Backend::checkpoint`])
    /// instead of from its image's entrypoint.
    fn restore<'a>(
        &'a self,
        placement: &'a Placement,
        dir: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (placement, dir);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!("live snapshots with the {} backend", self.name()),
            })
        })
    }

    /// Every snapshot this backend keeps, with its labels.
    fn snapshots(&self) -> BoxFuture<'_, Result<Vec<LabelledSnapshot>, Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Deletes snapshot `name`; one that does not exist is an error naming
    /// it.
    fn delete_snapshot<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!("snapshot '{name}' with the {} backend", self.name()),
            })
        })
    }

    /// Commits the file system of the sandbox at `placement` as image
    /// `reference` with `labels` (a template build's step or template);
    /// returns what was made. Engines that keep no images refuse by name.
    fn commit<'a>(
        &'a self,
        placement: &'a Placement,
        reference: &'a str,
        labels: &'a std::collections::HashMap<String, String>,
    ) -> BoxFuture<'a, Result<BuiltImage, Error>> {
        let _ = (placement, reference, labels);
        Box::pin(async move {
            Err(Error::Unsupported {
                what: format!(
                    "building templates with the {} backend (it keeps no images; build them on                      Docker and push them to the cluster's registry)",
                    self.name()
                ),
            })
        })
    }

    /// Marks the (stopped) sandbox at `placement` as one of a session
    /// paused to disk (`paused`), or no more: every corral on the host then
    /// lists it with [`crate::labels::PAUSED`] and keeps it, whoever's
    /// process made it. A no-op where nothing is paused to disk.
    fn mark_paused<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
        paused: bool,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (placement, sandbox_id, paused);
        Box::pin(async { Ok(()) })
    }

    /// Image `reference`, when the engine has it.
    fn built_image<'a>(
        &'a self,
        reference: &'a str,
    ) -> BoxFuture<'a, Result<Option<BuiltImage>, Error>> {
        let _ = reference;
        Box::pin(async { Ok(None) })
    }

    /// Every tagged image carrying label `label`, one per tag.
    fn built_images<'a>(&'a self, label: &'a str) -> BoxFuture<'a, Result<Vec<BuiltImage>, Error>> {
        let _ = label;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Removes the tag `reference` (the image's layers go once no tag or
    /// container uses them); one that does not exist is not an error.
    fn remove_image<'a>(&'a self, reference: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        let _ = reference;
        Box::pin(async { Ok(()) })
    }

    /// The backend's counters now.
    fn counters(&self) -> BackendCounters {
        BackendCounters::default()
    }

    /// Gives up what the backend holds for this process (Kubernetes: its
    /// Lease, so other corrals see at once that its sandboxes are
    /// orphans) before the process ends; the sandboxes themselves are
    /// left as they are. Best effort: a backend that is not closed lets
    /// what it holds expire. Call it once, when nothing else will use the
    /// backend.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The directory of [`Backend::shared_deltas`] `root` that sandbox
/// `sandbox_id` mounts.
pub fn sandbox_deltas_dir(root: &std::path::Path, sandbox_id: &str) -> std::path::PathBuf {
    root.join("sandboxes").join(sandbox_id)
}
