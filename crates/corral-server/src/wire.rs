//! The JSON shapes of the HTTP API. Field names are a contract: the Python
//! client and `docs/openapi.yaml` rely on them. A command's outcome
//! ([`CommandOutcome`]) is also what `corral run --json` prints: the CLI
//! serializes this same type, so the two cannot drift apart.

use std::collections::BTreeMap;

use base64::Engine;
use corral_core::{CommandResult, ContainerState, Failure};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/sandboxes`. Every field is optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Session key: the same key returns the same sandbox until it is
    /// deleted or evicted. Letters, digits, `.`, `_`, `-` (1..=128). Default:
    /// a new random key. The key is the sandbox's `id` in every other route.
    pub session: Option<String>,
    /// A profile or pool name from the service's configuration. A pool
    /// hands over a warm sandbox.
    pub profile: Option<String>,
    /// Sandbox spec keys as under `defaults` in the config file (`image`,
    /// `env`, `limits`, `network`, `recovery`, ...), merged over the
    /// service's `defaults` key by key (objects merge, lists and values
    /// replace), so `{"limits": {"memory": 67108864}}` changes only the
    /// memory limit. Not with `profile`. What it changes must be allowed by
    /// the service's policy (`server.policy`): image, workdir, env values,
    /// startup, recovery, pristine, own labels, limits up to the maxima,
    /// network `none` or an egress policy (`{"egress": {"allow": [...],
    /// "deny": [...]}}`) that narrows the service's network and stays within
    /// `server.policy.egress_allow`, and `isolation` (`container`: runc
    /// over the host's kernel; `gvisor`: gVisor's user-space kernel in
    /// between, slower, no in-place reset) at or above the service's
    /// `defaults.isolation` (lowering it is refused, 403 naming
    /// `isolation`); host mounts, capabilities, weakened hardening,
    /// runtime, host environment, `corral.*` labels and `persistent` are
    /// refused (403 naming the field).
    #[schema(value_type = Object)]
    pub spec: Option<serde_json::Value>,
    /// Image, overriding the one of the spec, profile or defaults: one of
    /// `server.policy.images`, or (no list) one already on the daemon.
    pub image: Option<String>,
    /// Keep `/workspace` and the home directory in host directories of this
    /// session key, surviving container loss and service restarts. Refused
    /// (403) unless the service sets `server.policy.allow_persistent`.
    #[serde(default)]
    pub persistent: bool,
    /// Start the sandbox for pristine reset (`POST /v1/sandboxes/{id}/reset`
    /// in place, in milliseconds), overriding the spec's, profile's or
    /// defaults' `pristine`. Changes to the root file system then live in
    /// memory and count against the memory limit. A sandbox that cannot
    /// reset in place (read-only root, a non-root user, a runtime other
    /// than runc, persistent) is replaced by a reset instead: see
    /// `resets_in_place` in its description.
    #[serde(default)]
    pub pristine: Option<bool>,
    /// A template of the caller's (`POST /v1/templates`) to start from:
    /// its image, its environment under the spec's, its working directory
    /// and user where the spec sets none, its start and ready commands
    /// before the spec's start-up. Not with `image` or `profile`.
    #[serde(default)]
    pub template: Option<String>,
}

/// Body of `POST /v1/templates`: a template built from a Dockerfile (with
/// its context) or from steps, in sandboxes of the caller's own spec (its
/// policy, limits and network: a build runs untrusted code like any
/// command).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildTemplate {
    /// Its name: lower-case letters, digits, `.`, `_`, `-` (1..=128). A
    /// template of the name is replaced.
    pub name: String,
    /// A Dockerfile (one stage; `RUN`, `COPY`/`ADD` of the context, `ENV`,
    /// `ARG`, `WORKDIR`, `USER`, `SHELL`; `LABEL`, `EXPOSE`, `CMD`,
    /// `ENTRYPOINT` and the like are noted and ignored). Not with `from`.
    pub dockerfile: Option<String>,
    /// The build context `COPY` reads: a tar archive, base64.
    pub context: Option<String>,
    /// Build from steps: the image (one the caller may start from) or
    /// `template:NAME` (one of its templates) they start from.
    pub from: Option<String>,
    /// The steps after `from`, each one of `{"run": {"argv": [...],
    /// "user": "root"}}`, `{"copy": {"src": [...], "dest": "/x", "chown":
    /// "u", "chmod": "0644"}}`, `{"env": {"name": "A", "value": "1"}}`,
    /// `{"workdir": {"path": "/app"}}`, `{"user": {"user": "u"}}`.
    #[schema(value_type = Vec<Object>)]
    pub steps: Option<serde_json::Value>,
    /// Started in the background in every sandbox of the template.
    pub start: Option<String>,
    /// Run until it succeeds (a minute at most) once `start` ran.
    pub ready: Option<String>,
    /// `ARG` values of the Dockerfile.
    #[serde(default)]
    pub build_args: std::collections::BTreeMap<String, String>,
    /// Run every step, cached or not.
    #[serde(default)]
    pub skip_cache: bool,
}

/// A template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBody {
    /// Its name.
    pub name: String,
    /// Who owns it: `tenant:NAME`, `operator`, or `mcp:TENANT:SESSION`.
    pub owner: String,
    /// The image its sandboxes start from.
    pub image: String,
    /// What it was built from.
    pub from: String,
    /// Environment its sandboxes get, in order (`[name, value]` pairs).
    pub env: Vec<(String, String)>,
    /// Working directory of their commands.
    pub workdir: Option<String>,
    /// User their commands run as.
    pub user: Option<String>,
    /// Started in the background in each.
    pub start: Option<String>,
    /// Waited for once `start` ran.
    pub ready: Option<String>,
    /// Build time, seconds since the epoch (0: unknown).
    pub created: i64,
    /// Bytes of its image, base layers included.
    pub size: u64,
    /// Of the build just made: steps, how many came from the cache, and
    /// its wall time in ms.
    pub build: Option<BuildSummaryBody>,
    /// Of the build just made: its log (steps, output, notes), the last
    /// lines.
    pub log: Vec<String>,
}

/// How a build went.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BuildSummaryBody {
    /// Steps in all.
    pub steps: usize,
    /// Steps taken from the cache, not run.
    pub cached: usize,
    /// Wall time in ms.
    pub took_ms: u64,
}

/// Body of `GET /v1/templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    /// The caller's templates, by name.
    pub templates: Vec<TemplateBody>,
}

/// A sandbox of the service.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    /// The handle used in every route: the session key.
    pub id: String,
    /// The session key (the same as `id`).
    pub session: String,
    /// corral's id of the sandbox (label `corral.sandbox` of its container);
    /// changes when a lost container is replaced.
    pub sandbox_id: String,
    /// Who owns it: `tenant:NAME` (the single `server.token` is tenant
    /// `default`), `operator`, or `mcp:TENANT:SESSION`.
    pub owner: String,
    /// The Docker container id.
    pub container_id: String,
    /// The image.
    pub image: String,
    /// The profile or pool it came from.
    pub profile: Option<String>,
    /// Whether its workspace is persistent.
    pub persistent: bool,
    /// Whether its container was running at the last look (no daemon call).
    pub alive: bool,
    /// Open shell sessions.
    pub shells: Vec<String>,
    /// Whether `POST /v1/sandboxes/{id}/reset` resets it in place (by its
    /// agent, in milliseconds); false: a reset replaces its container.
    pub resets_in_place: bool,
    /// Why a reset cannot happen in place, naming the spec field (e.g.
    /// `pristine is false: ...`); null when it can.
    pub reset_unavailable_reason: Option<String>,
    /// Whether what the service reports of its commands (exit codes,
    /// output, an `exclusive` grader's result) is what they did: false
    /// where its tier lets a command forge another's result (e.g.
    /// `isolation: gvisor` for a sandbox that starts as a user, which only
    /// the operator's configuration may choose). Treat a result of such a
    /// sandbox as something its commands could have written.
    pub result_integrity: bool,
    /// Why results are not integrity-protected, naming the tier and field
    /// (e.g. `isolation gvisor with security.user '1000': results are not
    /// integrity-protected (...)`); null when they are.
    pub result_integrity_gap: Option<String>,
    /// Its usage: in `GET /v1/sandboxes/{id}`, the service's latest usage
    /// sample's (the one `/metrics` and `GET /v1/usage` report) while it
    /// is younger than `server.metrics.usage_refresh_ms`, else read from
    /// the sandbox's agent then (`age_ms` 0); in the listing, the latest
    /// sample's (a stale one starts a new one). Null when it cannot be
    /// read (the listing: sampling off, or the sandbox newer than the
    /// sample; a create's answer).
    pub usage: Option<SampledUsage>,
}

/// A sandbox's usage in the service's latest usage sample.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SampledUsage {
    /// How long ago the sample was taken, in ms.
    pub age_ms: u64,
    /// CPU cores it used between the sample before and this one; null
    /// when it was not in that one.
    pub cpu_cores: Option<f64>,
    /// What it used, as `GET /v1/sandboxes/{id}/usage` says.
    pub usage: UsageBody,
}

/// Body of `GET /v1/sandboxes`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    /// Every sandbox of this service.
    pub sandboxes: Vec<SandboxInfo>,
}

/// A command to run.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run by `/bin/sh -c`. Exactly one of `command`
    /// and `argv`.
    pub command: Option<String>,
    /// Program and arguments, run directly.
    pub argv: Option<Vec<String>>,
    /// Kill the command's whole process tree after this many ms; none:
    /// the service's ceiling (`server.limits.max_timeout_ms`, 24 h by
    /// default), and more is refused (400).
    pub timeout_ms: Option<u64>,
    /// Bytes kept per output stream (head and tail); default 1 MiB, at
    /// most the service's `server.limits.max_output` (64 MiB by default).
    pub max_output: Option<u64>,
    /// Working directory (`~` is the sandbox user's home).
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text fed to stdin; without stdin the command sees EOF at once. At
    /// most `server.limits.max_stdin_bytes` (64 MiB by default).
    pub stdin: Option<String>,
    /// Bytes fed to stdin, base64; not with `stdin`.
    pub stdin_base64: Option<String>,
    /// Kill every other process in the sandbox first (leftovers of earlier
    /// commands included), so nothing can tamper with this command while it
    /// runs: use it for graders.
    #[serde(default)]
    pub exclusive: bool,
    /// false (default): the command ends when its main process exits;
    /// output a background job writes later is lost (the job gets SIGPIPE
    /// when it writes). true: as `docker exec`, wait until stdout and stderr
    /// are closed by every process holding them, bounded by `timeout_ms`
    /// (then they are all killed and the failure is a timeout); jobs that
    /// closed the streams are left running. The exit code is always the
    /// main process's.
    #[serde(default)]
    pub wait_for_output: bool,
    /// Run the command on a pseudo-terminal of this size: it leads a new
    /// session with the terminal as its controlling terminal, its output
    /// (stdout and stderr merged, as a terminal shows them) arrives as
    /// `stdout`, and its input is keystrokes (`"\u0003"` is Ctrl-C).
    /// `wait_for_output` does not apply.
    pub pty: Option<TerminalSize>,
    /// Only on `exec/stream`: keep the command's stdin open (after `stdin`,
    /// if given) and take input, resizes and signals through
    /// `POST /v1/sandboxes/{id}/exec/{handle}/input`; the stream's first
    /// event is `started` with the `handle`. A `pty` command is always
    /// interactive on a stream.
    #[serde(default)]
    pub interactive: bool,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Columns (width), 1 to 4096.
    pub cols: u16,
    /// Rows (height), 1 to 4096.
    pub rows: u16,
}

/// The first event of an interactive command's stream (`started`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StreamStarted {
    /// Names the command in `POST /v1/sandboxes/{id}/exec/{handle}/input`
    /// while it runs.
    pub handle: String,
}

/// Input to an interactive command that runs on an `exec/stream`. The
/// fields act in this order: `resize`, `data`/`data_base64`, `eof`,
/// `signal`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecInput {
    /// Text for its stdin; on a terminal, keystrokes (`"\r"` or `"\n"`
    /// ends a line, `"\u0003"` interrupts, `"\u0004"` at a line's start
    /// is end of input).
    pub data: Option<String>,
    /// Bytes for its stdin, base64; not with `data`.
    pub data_base64: Option<String>,
    /// Close its stdin after the data (not on a terminal, where `"\u0004"`
    /// is end of input and closing would hang the terminal up).
    #[serde(default)]
    pub eof: bool,
    /// The terminal's new size (a `pty` command only); its foreground
    /// process group gets SIGWINCH.
    pub resize: Option<TerminalSize>,
    /// A signal number for the command's process group (2 SIGINT, 15
    /// SIGTERM, 9 SIGKILL).
    pub signal: Option<i32>,
}

/// A command in a shell session.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellExecRequest {
    /// The command line, run by the session's shell: `cd`, exported
    /// variables and functions persist to later commands.
    pub command: String,
    /// Interrupt the command after this many ms (the session is kept when it
    /// stops on the interrupt, else restarted); none: the service's ceiling
    /// (`server.limits.max_timeout_ms`).
    pub timeout_ms: Option<u64>,
    /// Bytes kept per output stream; default 1 MiB, at most
    /// `server.limits.max_output`.
    pub max_output: Option<u64>,
}

/// The container's state, attached to failures (also in `corral run --json`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ContainerStateBody {
    /// Container id.
    pub id: String,
    /// `running`, `exited`, `removed`, ...
    pub status: String,
    /// Exit code of PID 1, once stopped.
    pub exit_code: Option<i64>,
    /// The kernel OOM-killed PID 1.
    pub oom_killed: bool,
    /// The daemon's error text.
    pub error: Option<String>,
    /// Restarts by the daemon.
    pub restart_count: Option<i64>,
    /// Last lines of the container's log.
    pub log_tail: Vec<String>,
}

/// Why a command did not complete normally.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FailureBody {
    /// `timeout`, `oom_killed`, `container_lost`, `daemon_unavailable`,
    /// `capacity`, `image_not_found`, `invalid_spec`, `unsupported`,
    /// `spawn_failed`, `agent_error` or `protocol_violation`.
    pub kind: String,
    /// Whether running it again may succeed.
    pub retryable: bool,
    /// What happened, with the ids involved.
    pub message: String,
    /// The container's state, when it matters.
    pub container: Option<ContainerStateBody>,
}

/// A command's outcome; `corral run --json` prints this same type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CommandOutcome {
    /// Exit code; null when the command did not exit on its own.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Standard output, as UTF-8 (lossy when it is not UTF-8; then
    /// `stdout_base64` holds the exact bytes).
    pub stdout: String,
    /// Standard error, like `stdout`.
    pub stderr: String,
    /// The exact stdout bytes; only when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout_base64: Option<String>,
    /// The exact stderr bytes; only when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stderr_base64: Option<String>,
    /// Stdout was cut to its cap (head and tail kept).
    pub stdout_truncated: bool,
    /// Stderr was cut to its cap.
    pub stderr_truncated: bool,
    /// Bytes the command wrote to stdout in all.
    pub stdout_total_bytes: u64,
    /// Bytes the command wrote to stderr in all.
    pub stderr_total_bytes: u64,
    /// Wall time, in ms.
    pub duration_ms: f64,
    /// What the command's processes used, as the sandbox's agent measured
    /// them; null when it did not say (shell sessions, a command that
    /// never ran, an older agent).
    #[serde(default)]
    pub usage: Option<CommandUsageBody>,
    /// Null when the command ran to its exit (whatever the exit code).
    pub failure: Option<FailureBody>,
    /// corral's id of the sandbox it ran in; null when there was none: the
    /// sandbox's container was lost earlier (under the `fail` recovery
    /// policy), or (`corral run`) the sandbox could not be created.
    pub sandbox_id: Option<String>,
}

/// What a command's processes used: its main process with every
/// descendant that was waited for, plus the orphans of its process group
/// the agent reaped before the command ended. Background processes still
/// running at its end, and those that left its process group (`setsid`),
/// are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CommandUsageBody {
    /// CPU time, user and kernel together, in ms.
    pub cpu_ms: f64,
    /// CPU time in user mode, in ms.
    pub cpu_user_ms: f64,
    /// CPU time in the kernel, in ms.
    pub cpu_system_ms: f64,
    /// The largest resident set one of its processes reached, in bytes:
    /// the biggest process's peak, not the sum over processes.
    pub peak_memory_bytes: u64,
}

impl From<&corral_core::CommandUsage> for CommandUsageBody {
    fn from(u: &corral_core::CommandUsage) -> Self {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        CommandUsageBody {
            cpu_ms: ms(u.cpu()),
            cpu_user_ms: ms(u.cpu_user),
            cpu_system_ms: ms(u.cpu_system),
            peak_memory_bytes: u.peak_memory_bytes,
        }
    }
}

/// How a reset was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResetModeBody {
    /// By the sandbox's agent, in the same container.
    InPlace,
    /// By replacing the container with a new one from the same spec
    /// (start-up commands run again).
    Replaced,
}

/// Body of `POST /v1/sandboxes/{id}/pause`: how the sandbox was paused.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PauseBody {
    /// `disk`: its processes and memory written to a checkpoint and its
    /// container stopped, holding no memory (a tier that checkpoints:
    /// gVisor without network); `memory`: frozen, memory kept.
    pub paused: String,
}

/// Body of `POST /v1/sandboxes/{id}/reset`: what the reset did. Either way
/// the sandbox is back in its state right after start: every process
/// killed, every file system change gone (host mounts are the host's),
/// shell sessions closed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResetBody {
    /// `in_place` or `replaced`.
    pub mode: ResetModeBody,
    /// Why it was not done in place; null when it was.
    pub fallback_reason: Option<String>,
    /// Processes an in-place reset killed (0 for a replacement).
    pub killed: u32,
    /// Time the whole reset took, in ms.
    pub elapsed_ms: f64,
}

impl From<&corral::ResetOutcome> for ResetBody {
    fn from(o: &corral::ResetOutcome) -> Self {
        ResetBody {
            mode: match o.mode {
                corral::ResetMode::InPlace => ResetModeBody::InPlace,
                corral::ResetMode::Replaced => ResetModeBody::Replaced,
            },
            fallback_reason: o.fallback_reason.clone(),
            killed: o.killed,
            elapsed_ms: o.elapsed_ms,
        }
    }
}

/// A shell session command's outcome.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ShellOutcome {
    /// The command's outcome.
    #[serde(flatten)]
    pub result: CommandOutcome,
    /// The command ran in a fresh shell: earlier state was lost.
    pub restarted: bool,
    /// The shell is gone after it; the next command starts a fresh one.
    pub ended: bool,
    /// Output the session's background jobs printed between the previous
    /// command and this one: dropped, not part of this result.
    pub dropped_between_bytes: u64,
    /// Always false: a shell session's exit code and output boundaries are
    /// reported by the shell inside the sandbox, which a command can
    /// subvert (by redefining the functions that report them). Grade with
    /// `POST /v1/sandboxes/{id}/exec`, whose result comes from the agent.
    pub trusted: bool,
}

/// Body of `GET /v1/sandboxes/{id}/shells`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShellList {
    /// Open sessions by name.
    pub shells: Vec<String>,
}

/// One directory entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DirEntryBody {
    /// File name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// A symlink's target as stored (not resolved).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<String>,
    /// Last modification, in seconds since the epoch (with a fraction; of
    /// the link itself for a symlink).
    #[serde(default)]
    pub mtime: f64,
    /// Numeric owner.
    #[serde(default)]
    pub uid: u32,
    /// Numeric group.
    #[serde(default)]
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd`; null when the uid is
    /// not named there.
    #[serde(default)]
    pub owner: Option<String>,
    /// The group's name in the sandbox's `/etc/group`; null when the gid is
    /// not named there.
    #[serde(default)]
    pub group: Option<String>,
}

impl From<&corral::DirEntry> for DirEntryBody {
    fn from(e: &corral::DirEntry) -> Self {
        let mtime = match e.modified.duration_since(std::time::UNIX_EPOCH) {
            Ok(after) => after.as_secs_f64(),
            Err(before) => -before.duration().as_secs_f64(),
        };
        DirEntryBody {
            name: e.name.clone(),
            kind: e.kind.as_str().to_string(),
            size: e.size,
            mode: e.mode,
            target: e.target.clone(),
            mtime,
            uid: e.uid,
            gid: e.gid,
            owner: e.owner.clone(),
            group: e.group.clone(),
        }
    }
}

/// Body of `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    /// The directory listed.
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<DirEntryBody>,
}

/// An error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// `invalid_request`, `not_found`, `unauthorized`, `too_large`, or a
    /// failure kind (`daemon_unavailable`, `capacity`, `invalid_spec`, ...).
    pub kind: String,
    /// Human-readable, naming the field and value where one is at fault.
    pub message: String,
    /// The request field at fault.
    pub field: Option<String>,
    /// Whether the same request may succeed later.
    pub retryable: bool,
}

/// Body of `GET /v1/health`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` when the daemon answers, else `degraded`.
    pub status: String,
    /// corral's version.
    pub version: String,
    /// The container daemon.
    pub daemon: DaemonHealth,
}

/// The daemon as the service sees it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DaemonHealth {
    /// The endpoint in use.
    pub endpoint: String,
    /// Whether it answered a ping just now.
    pub reachable: bool,
    /// The ping's error, when it did not answer.
    pub error: Option<String>,
}

/// One streamed output chunk (SSE events `stdout` and `stderr`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutputChunk {
    /// The chunk as UTF-8 (lossy; a multi-byte character may be split
    /// between chunks, so use `base64` for exact bytes).
    pub data: String,
    /// The exact bytes.
    pub base64: String,
}

/// Body of `POST /v1/sandboxes/{id}/snapshot`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// The snapshot's name: 1 to 128 of `a-z 0-9 . _ -`, starting with a
    /// letter or digit. A snapshot of that name is replaced.
    pub name: String,
    /// Keep it until it is deleted; default false: it goes with the
    /// service (removed by `corral gc` once the service is gone).
    #[serde(default)]
    pub durable: bool,
    /// How to keep it; default: the service's choice (`live` for a
    /// sandbox the engine checkpoints, gVisor without network; `delta`
    /// for a sandbox that resets in place, unless durable on an engine
    /// that keeps images; `image` otherwise).
    #[serde(default)]
    pub kind: Option<SnapshotKind>,
}

/// How a snapshot is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// An image the engine keeps (Docker: `docker commit`); forks start
    /// from it.
    Image,
    /// The changes of a sandbox that resets in place, which the service
    /// keeps (in memory, or a file when durable); forks start from the
    /// source's image and take the changes in. No image, no registry.
    Delta,
    /// The running sandbox's checkpoint (processes, memory, open files,
    /// listening sockets, tmpfs mounts and file system), which the service
    /// keeps as files; forks are restored from it and go on from there.
    /// Only when asked for, of tiers that checkpoint (Docker: `isolation:
    /// gvisor` with `network: none`); others answer 501 `unsupported`.
    Live,
}

impl From<SnapshotKind> for corral_core::snapshot::SnapshotKind {
    fn from(k: SnapshotKind) -> Self {
        match k {
            SnapshotKind::Image => corral_core::snapshot::SnapshotKind::Image,
            SnapshotKind::Delta => corral_core::snapshot::SnapshotKind::Delta,
            SnapshotKind::Live => corral_core::snapshot::SnapshotKind::Live,
        }
    }
}

impl From<corral_core::snapshot::SnapshotKind> for SnapshotKind {
    fn from(k: corral_core::snapshot::SnapshotKind) -> Self {
        match k {
            corral_core::snapshot::SnapshotKind::Image => SnapshotKind::Image,
            corral_core::snapshot::SnapshotKind::Delta => SnapshotKind::Delta,
            corral_core::snapshot::SnapshotKind::Live => SnapshotKind::Live,
        }
    }
}

/// A snapshot: a sandbox's file system kept under a name, to fork
/// sandboxes from.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotBody {
    /// Its name as the caller names it: bare for its own (and, for the
    /// operator, the operator's), `NAMESPACE/NAME` for another's.
    pub name: String,
    /// Who owns it: `tenant:NAME`, `operator`, or `mcp:TENANT:SESSION`.
    pub owner: String,
    /// Whether the caller may only read it (fork, inspect): an operator's
    /// snapshot shared with tenants or with MCP sessions.
    pub read_only: bool,
    /// Names of the variables the sandbox it was taken from set. Their
    /// values are not kept: a fork takes them from its request's `env`
    /// and the service's defaults, else leaves them unset.
    pub env_names: Vec<String>,
    /// How it is kept.
    pub kind: SnapshotKind,
    /// The image a fork starts from: the engine's image holding it
    /// (`corral-snapshot:<name>` on Docker) for an `image` snapshot, the
    /// source's image for a `delta` one.
    pub image: String,
    /// corral's id of the sandbox it was taken from.
    pub source_sandbox: String,
    /// The image that sandbox was started from.
    pub base_image: String,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Bytes it holds beyond its base image (a delta: its archive).
    pub size: i64,
    /// Kept until deleted, whatever becomes of the service.
    pub durable: bool,
}

impl SnapshotBody {
    /// `s` as `caller` sees it (`read_only` when it may not write it).
    pub fn new(
        s: &corral_core::snapshot::SnapshotInfo,
        caller: &corral_core::principal::Principal,
        read_only: bool,
    ) -> Self {
        let q = s.qualified();
        SnapshotBody {
            name: caller.display_snapshot(&q),
            owner: q.owner().id(),
            read_only,
            env_names: s.env_names.clone(),
            kind: s.kind.into(),
            image: s.image.clone(),
            source_sandbox: s.source_sandbox.clone(),
            base_image: s.spec.image.clone(),
            created: s.created,
            size: s.size,
            durable: s.durable,
        }
    }
}

/// Body of `GET /v1/snapshots`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    /// The snapshots the caller may see, by name.
    pub snapshots: Vec<SnapshotBody>,
}

/// Body of `POST /v1/snapshots/{name}/fork`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes to start (1 to the service's `max_live`).
    pub count: u64,
    /// Session keys of the forks are `<session_prefix>-<i>`, i from 0
    /// (letters, digits, `.`, `_`, `-`); default: new random keys.
    pub session_prefix: Option<String>,
    /// Values of environment variables for the forks: a snapshot keeps the
    /// names of its source's variables, not their values, so each comes
    /// from here, else from the service's `defaults`, else is unset.
    /// Other variables given here are added.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Body of `GET /v1/whoami`: the principal the request acts as.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// `operator`, `tenant:NAME`.
    pub principal: String,
    /// The tenant whose quotas it spends; null for the operator.
    pub tenant: Option<String>,
    /// Its quotas (null: no limit).
    pub max_sandboxes: Option<u64>,
    /// Most snapshots it may keep.
    pub max_snapshots: Option<u64>,
    /// Most bytes its snapshots may hold.
    pub max_snapshot_bytes: Option<u64>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Text for reading, plus the exact bytes when they are not UTF-8.
fn text(bytes: &[u8]) -> (String, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_string(), None),
        Err(_) => (
            String::from_utf8_lossy(bytes).into_owned(),
            Some(b64(bytes)),
        ),
    }
}

impl From<&ContainerState> for ContainerStateBody {
    fn from(s: &ContainerState) -> Self {
        ContainerStateBody {
            id: s.id.clone(),
            status: s.status.to_string(),
            exit_code: s.exit_code,
            oom_killed: s.oom_killed,
            error: s.error.clone(),
            restart_count: s.restart_count,
            log_tail: s.log_tail.clone(),
        }
    }
}

impl From<&Failure> for FailureBody {
    fn from(f: &Failure) -> Self {
        FailureBody {
            kind: f.kind.as_str().to_string(),
            retryable: f.retryable(),
            message: f.message.clone(),
            container: f.container.as_ref().map(ContainerStateBody::from),
        }
    }
}

impl CommandOutcome {
    /// The wire form of `r`, run in sandbox `sandbox_id` (`None`: it ran in
    /// none). The one conversion behind the API's results and
    /// `corral run --json`.
    pub fn new(r: &CommandResult, sandbox_id: Option<&str>) -> Self {
        let (stdout, stdout_base64) = text(&r.stdout);
        let (stderr, stderr_base64) = text(&r.stderr);
        CommandOutcome {
            exit_code: r.exit_code,
            signal: r.signal,
            stdout,
            stderr,
            stdout_base64,
            stderr_base64,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            stdout_total_bytes: r.stdout_total_bytes,
            stderr_total_bytes: r.stderr_total_bytes,
            duration_ms: r.duration.as_secs_f64() * 1000.0,
            usage: r.usage.as_ref().map(CommandUsageBody::from),
            failure: r.failure.as_ref().map(FailureBody::from),
            sandbox_id: sandbox_id.map(String::from),
        }
    }
}

impl OutputChunk {
    /// A chunk of output bytes.
    pub fn new(bytes: &[u8]) -> Self {
        OutputChunk {
            data: String::from_utf8_lossy(bytes).into_owned(),
            base64: b64(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::FailureKind;
    use std::time::Duration;

    #[test]
    fn binary_output_keeps_exact_bytes_and_text_stays_plain() {
        let r = CommandResult {
            exit_code: Some(3),
            stdout: b"ok\n".to_vec(),
            stderr: vec![0xff, b'a'],
            duration: Duration::from_millis(5),
            ..CommandResult::default()
        };
        let v = serde_json::to_value(CommandOutcome::new(&r, Some("sb1"))).expect("json");
        assert_eq!(v["stdout"], "ok\n");
        assert!(v.get("stdout_base64").is_none());
        assert_eq!(v["stderr"], "\u{fffd}a");
        assert_eq!(v["stderr_base64"], b64(&[0xff, b'a']));
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["failure"], serde_json::Value::Null);
        assert_eq!(v["sandbox_id"], "sb1");
    }

    #[test]
    fn failures_carry_kind_and_retryable() {
        let r = CommandResult::failed(
            Failure::new(FailureKind::ContainerLost, "gone"),
            Duration::ZERO,
        );
        let v = serde_json::to_value(CommandOutcome::new(&r, Some("sb"))).expect("json");
        assert_eq!(v["failure"]["kind"], "container_lost");
        assert_eq!(v["failure"]["retryable"], true);
        let shell = ShellOutcome {
            result: CommandOutcome::new(&r, Some("sb")),
            restarted: true,
            ended: false,
            dropped_between_bytes: 0,
            trusted: false,
        };
        let v = serde_json::to_value(shell).expect("json");
        assert_eq!(v["restarted"], true);
        assert_eq!(v["trusted"], false);
        assert_eq!(v["failure"]["kind"], "container_lost");
    }
}

/// Body of `GET /v1/images`: the images the caller may name that the
/// engine holds, and the pulls under way.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    /// Images on the engine the caller's sandboxes may use, newest first
    /// (snapshots are under `/v1/snapshots`). Empty where the engine's
    /// machines pull for themselves (Kubernetes).
    pub images: Vec<ImageEntry>,
    /// Pulls of missing images under way, oldest first: a start of a
    /// missing image waits for its pull, and this is where it shows.
    pub pulls: Vec<PullEntry>,
}

/// An image on the engine.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImageEntry {
    /// `repository:tag`.
    pub image: String,
    /// Bytes on disk.
    pub size: u64,
    /// When it was built, in seconds since the epoch.
    pub created: i64,
}

/// A pull under way.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PullEntry {
    /// The image being pulled.
    pub image: String,
    /// `queued` (waiting for one of `daemon.pull_limit` pull slots) or
    /// `pulling`.
    pub state: String,
    /// Layers fetched or found present.
    pub layers_done: usize,
    /// Layers of the image, as far as the registry has said.
    pub layers: usize,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Bytes of the layers being downloaded, as far as known.
    pub total_bytes: u64,
    /// Since the first start (or pull request) asked for it, in ms.
    pub elapsed_ms: u64,
}

impl From<corral_core::backend::PullStatus> for PullEntry {
    fn from(p: corral_core::backend::PullStatus) -> Self {
        PullEntry {
            image: p.image,
            state: if p.progress.queued {
                "queued"
            } else {
                "pulling"
            }
            .to_string(),
            layers_done: p.progress.layers_done,
            layers: p.progress.layers,
            bytes: p.progress.bytes,
            total_bytes: p.progress.total_bytes,
            elapsed_ms: p.elapsed.as_millis().min(u128::from(u64::MAX)) as u64,
        }
    }
}

/// Body of `POST /v1/images/pull`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `[registry/]repository[:tag]` (the tag defaults to `latest`).
    pub image: String,
}

/// Answer of `POST /v1/images/pull`: the image is present.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PullResult {
    /// The image.
    pub image: String,
    /// How long the request waited for it, in ms (a present image: about 0).
    pub waited_ms: u64,
}

/// Body of `GET /v1/sandboxes/{id}/egress`: what the sandbox's egress
/// gateway allowed and refused since the sandbox started.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EgressCounts {
    /// DNS questions for allowed names.
    pub dns_allowed: u64,
    /// DNS questions refused (answered NXDOMAIN).
    pub dns_refused: u64,
    /// Connections relayed to an allowed destination.
    pub connections_allowed: u64,
    /// Connections refused (a name not allowed, no name, no usable address).
    pub connections_refused: u64,
    /// The last refusals (at most 32), oldest first, e.g. `dns evil.test`.
    pub recent_refusals: Vec<String>,
}

/// Body of `GET /v1/sandboxes/{id}/ports/{port}`: a link to a server
/// listening on `port` inside the sandbox, through this service.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PortLink {
    /// The port inside the sandbox.
    pub port: u16,
    /// `http://PORT-SANDBOXID.DOMAIN:PORTS/TOKEN/`: an origin of its own
    /// (`DOMAIN`: `server.ports_domain`, else `localhost`, which browsers
    /// and curl resolve to loopback), on the port-link listener
    /// (`server.ports_listen`): HTTP (streaming included) and WebSocket
    /// upgrades reach the server there, the token taken off the path; no
    /// bearer token needed (the link's own token opens this port of this
    /// sandbox only).
    pub url: String,
    /// `PORT-SANDBOXID.DOMAIN[:PORTS]`: the link's host name. A program
    /// that cannot resolve it connects to `connect` and sends this as
    /// `Host` (`curl -H "Host: HOST" CONNECT/TOKEN/`).
    pub host: String,
    /// `http://IP:PORTS`: the port-link listener, for programs that cannot
    /// resolve `host`.
    pub connect: String,
    /// `/TOKEN/`: the link's path on its host.
    pub path: String,
    /// The link's token.
    pub token: String,
}

/// Body of `GET /v1/sandboxes/{id}/usage`: what the sandbox uses now, from
/// the engine's accounting (its cgroup), against its limits.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageBody {
    /// Who read it: `engine` (the engine's accounting, Docker's stats) or
    /// `agent` (the sandbox's agent from inside: its cgroup and network
    /// counters, where the engine has none, as on Kubernetes).
    pub source: String,
    /// CPU time used since it started, in ns (its processes, the dead too).
    pub cpu_ns: u64,
    /// Memory in use now, in bytes (droppable page cache left out; tmpfs
    /// files count).
    pub memory_bytes: u64,
    /// The most memory used at once, where the engine keeps it.
    pub memory_peak_bytes: Option<u64>,
    /// Its memory limit; null: none.
    pub memory_limit_bytes: Option<u64>,
    /// Processes and threads alive now.
    pub pids: u64,
    /// Its process limit; null: none.
    pub pids_limit: Option<u64>,
    /// Bytes read from block devices.
    pub block_read_bytes: u64,
    /// Bytes written to block devices.
    pub block_write_bytes: u64,
    /// Bytes received over its network.
    pub net_rx_bytes: u64,
    /// Bytes sent over its network.
    pub net_tx_bytes: u64,
    /// Processes the kernel's OOM killer killed in it; null where the
    /// reader cannot tell (Docker's stats do not carry it).
    pub oom_kills: Option<u64>,
}

/// Body of `GET /v1/usage`: the caller's sandboxes' usage from the
/// service's last usage sample.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageListBody {
    /// How old the sample is, in ms (a new one is taken when it is older
    /// than `server.metrics.usage_refresh_ms`).
    pub age_ms: u64,
    /// One per sandbox, by id.
    pub sandboxes: Vec<SandboxUsageBody>,
}

/// One sandbox's usage in a sample.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxUsageBody {
    /// Its id (the session key).
    pub id: String,
    /// corral's id of its current container incarnation.
    pub sandbox_id: String,
    /// CPU cores it used between the sample before and this one; null
    /// when it was not in that one.
    pub cpu_cores: Option<f64>,
    /// What it uses, as `GET /v1/sandboxes/{id}/usage` says.
    pub usage: UsageBody,
}

impl From<corral_core::backend::Usage> for UsageBody {
    fn from(u: corral_core::backend::Usage) -> Self {
        UsageBody {
            source: u.source.as_str().to_string(),
            oom_kills: u.oom_kills,
            cpu_ns: u.cpu_ns,
            memory_bytes: u.memory_bytes,
            memory_peak_bytes: u.memory_peak_bytes,
            memory_limit_bytes: u.memory_limit_bytes,
            pids: u.pids,
            pids_limit: u.pids_limit,
            block_read_bytes: u.block_read_bytes,
            block_write_bytes: u.block_write_bytes,
            net_rx_bytes: u.net_rx_bytes,
            net_tx_bytes: u.net_tx_bytes,
        }
    }
}

/// One event of `GET /v1/events` (the SSE `data` of events named after
/// `kind`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventBody {
    /// Increasing; resume after it with `?after=ID` or `Last-Event-ID`.
    pub id: u64,
    /// When, in ms since the epoch.
    pub time_ms: u64,
    /// `created`, `start_failed`, `command`, `reset`, `snapshot`, `lost`,
    /// `recovered`, `evicted`, `removed`.
    pub kind: String,
    /// The sandbox's runtime id (`sb-...`).
    pub sandbox: String,
    /// The session key it serves, as the caller names it (the caller's
    /// own without its namespace); null: not handed out by a session.
    pub session: Option<String>,
    /// Its owner (`operator`, `tenant:NAME`, `mcp:TENANT:ID`); null: not
    /// made through this service (a warm pool's spare).
    pub owner: Option<String>,
    /// `command`, `lost`, `reset`, `snapshot`: `ok`, `exit` (a non-zero
    /// exit) or the failure kind.
    pub outcome: Option<String>,
    /// A few words more: the image, the exit code and duration, the
    /// snapshot's name, why it was evicted.
    pub detail: String,
}
