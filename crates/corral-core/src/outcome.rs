//! What running a command produced: output, exit status and a typed failure.
//!
//! A caller (an RL trainer, an agent loop) must be able to act on an outcome
//! without parsing text: an OOM, a timeout or a lost container is a distinct
//! [`FailureKind`] with a [`FailureKind::retryable`] answer.

use std::fmt;
use std::time::Duration;

/// Why a command did not produce a normal exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The command ran past its timeout; its whole process tree was killed.
    Timeout,
    /// The kernel's OOM killer killed the command (or the sandbox's PID 1).
    OomKilled,
    /// The container disappeared or stopped while the command ran
    /// (removed, killed, crashed, daemon restarted).
    ContainerLost,
    /// The daemon could not be reached or failed to answer.
    DaemonUnavailable,
    /// There is no room for the sandbox now: a pod no node can take (too
    /// little memory or CPU, a quota), or every one of the provider's
    /// `max_live` sandboxes in use: retryable later, when sandboxes end or
    /// the cluster grows.
    Capacity,
    /// The image is not present and no registry could supply it.
    ImageNotFound,
    /// The spec or request was rejected before anything ran.
    InvalidSpec,
    /// The sandbox asked for something this daemon does not support
    /// (e.g. a disk limit on a storage driver without quotas).
    Unsupported,
    /// The program could not be started (not found, not executable, bad cwd).
    SpawnFailed,
    /// The agent inside the sandbox did not answer, or corral lost its
    /// control stream while the container kept running.
    AgentError,
    /// The control stream carried something the agent never sends (a frame
    /// for a command corral did not start, output after `Exited`, ...): the
    /// sandbox's results cannot be trusted, so the sandbox is finished. Not
    /// retryable: it is evidence of tampering or a bug, not a passing fault.
    ProtocolViolation,
}

impl FailureKind {
    /// The stable snake_case name used in JSON and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::OomKilled => "oom_killed",
            FailureKind::ContainerLost => "container_lost",
            FailureKind::DaemonUnavailable => "daemon_unavailable",
            FailureKind::Capacity => "capacity",
            FailureKind::ImageNotFound => "image_not_found",
            FailureKind::InvalidSpec => "invalid_spec",
            FailureKind::Unsupported => "unsupported",
            FailureKind::SpawnFailed => "spawn_failed",
            FailureKind::AgentError => "agent_error",
            FailureKind::ProtocolViolation => "protocol_violation",
        }
    }

    /// Whether running the same thing again may succeed. A lost container,
    /// an unavailable daemon or a full cluster are conditions of the
    /// moment; a timeout, an OOM or a bad spec will happen again with the
    /// same input.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            FailureKind::ContainerLost
                | FailureKind::DaemonUnavailable
                | FailureKind::Capacity
                | FailureKind::AgentError
        )
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a sandbox's container (or pod) is in its life, as its engine
/// reports it. On the wire it is the lowercase name (`running`, `exited`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ContainerStatus {
    /// Made, not started yet.
    Created,
    /// Its init process runs.
    Running,
    /// Frozen by the engine.
    Paused,
    /// Being restarted by the engine.
    Restarting,
    /// Being removed.
    Removing,
    /// Its init process has exited.
    Exited,
    /// The engine failed to stop or remove it.
    Dead,
    /// It no longer exists.
    Removed,
    /// The engine reported something else.
    #[default]
    Unknown,
}

impl ContainerStatus {
    /// Every status, for parsing and tests.
    pub const ALL: [ContainerStatus; 9] = [
        ContainerStatus::Created,
        ContainerStatus::Running,
        ContainerStatus::Paused,
        ContainerStatus::Restarting,
        ContainerStatus::Removing,
        ContainerStatus::Exited,
        ContainerStatus::Dead,
        ContainerStatus::Removed,
        ContainerStatus::Unknown,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerStatus::Created => "created",
            ContainerStatus::Running => "running",
            ContainerStatus::Paused => "paused",
            ContainerStatus::Restarting => "restarting",
            ContainerStatus::Removing => "removing",
            ContainerStatus::Exited => "exited",
            ContainerStatus::Dead => "dead",
            ContainerStatus::Removed => "removed",
            ContainerStatus::Unknown => "unknown",
        }
    }

    /// The status an engine's name stands for; anything unknown is `Unknown`.
    pub fn parse(name: &str) -> ContainerStatus {
        let name = name.trim().to_ascii_lowercase();
        ContainerStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .unwrap_or(ContainerStatus::Unknown)
    }

    /// True when its init process runs.
    pub fn is_running(self) -> bool {
        self == ContainerStatus::Running
    }
}

impl fmt::Display for ContainerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ContainerStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A container's state as the daemon reported it, attached to failures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerState {
    /// Container id.
    pub id: String,
    /// Where it is in its life (`removed` when it no longer exists).
    pub status: ContainerStatus,
    /// Exit code of PID 1 when it has exited.
    pub exit_code: Option<i64>,
    /// The daemon's OOMKilled flag (true only when PID 1 was OOM-killed).
    pub oom_killed: bool,
    /// The daemon's error text, if any.
    pub error: Option<String>,
    /// How often the daemon restarted it.
    pub restart_count: Option<i64>,
    /// The last lines the container's init process (corral's agent) logged,
    /// when it has stopped: why the agent exited, if it said.
    pub log_tail: Vec<String>,
}

impl fmt::Display for ContainerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "container {} status={}", short(&self.id), self.status)?;
        if let Some(code) = self.exit_code {
            write!(f, " exit_code={code}")?;
        }
        write!(f, " oom_killed={}", self.oom_killed)?;
        if let Some(e) = self.error.as_deref().filter(|e| !e.is_empty()) {
            write!(f, " error={e:?}")?;
        }
        if let Some(n) = self.restart_count.filter(|n| *n > 0) {
            write!(f, " restarts={n}")?;
        }
        if !self.log_tail.is_empty() {
            write!(f, " last_log={:?}", self.log_tail.join(" | "))?;
        }
        Ok(())
    }
}

/// The first 12 characters of a container id, as Docker prints it.
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// A typed failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// Human-readable detail carrying the ids involved.
    pub message: String,
    /// The container's state when the failure was seen, when known.
    pub container: Option<ContainerState>,
}

impl Failure {
    /// A failure with no container state.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
            container: None,
        }
    }

    /// Whether retrying may help.
    pub fn retryable(&self) -> bool {
        self.kind.retryable()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)?;
        if let Some(state) = &self.container {
            write!(f, " ({state})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// What a command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandResult {
    /// Exit status, when the process exited by itself.
    pub exit_code: Option<i32>,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    /// Captured stdout: the head, then the tail when truncated.
    pub stdout: Vec<u8>,
    /// Captured stderr: the head, then the tail when truncated.
    pub stderr: Vec<u8>,
    /// Bytes were dropped from the middle of stdout.
    pub stdout_truncated: bool,
    /// Bytes were dropped from the middle of stderr.
    pub stderr_truncated: bool,
    /// Bytes the command wrote to stdout in all.
    pub stdout_total_bytes: u64,
    /// Bytes the command wrote to stderr in all.
    pub stderr_total_bytes: u64,
    /// Wall time of the command.
    pub duration: Duration,
    /// What its processes used, as the agent measured them; `None` when
    /// the agent did not say (an older agent, a shell session's command,
    /// a command that never ran).
    pub usage: Option<CommandUsage>,
    /// `None` when the command ran to its own exit (whatever the code).
    pub failure: Option<Failure>,
}

/// What a command's processes used: its main process with every
/// descendant that was waited for, and the orphans of its process group
/// that the agent reaped before the command's end (see
/// [`crate::protocol::CommandUsage`]). Background processes still running
/// at its end, and those that left its process group, are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandUsage {
    /// CPU time in user mode.
    pub cpu_user: Duration,
    /// CPU time in the kernel.
    pub cpu_system: Duration,
    /// The largest resident set size one of its processes reached, in
    /// bytes: the peak of the biggest process, not of the tree's sum.
    pub peak_memory_bytes: u64,
}

impl CommandUsage {
    /// User and kernel CPU time together.
    pub fn cpu(&self) -> Duration {
        self.cpu_user + self.cpu_system
    }
}

impl From<crate::protocol::CommandUsage> for CommandUsage {
    fn from(u: crate::protocol::CommandUsage) -> Self {
        CommandUsage {
            cpu_user: Duration::from_micros(u.user_us),
            cpu_system: Duration::from_micros(u.system_us),
            peak_memory_bytes: u.max_rss_bytes,
        }
    }
}

impl CommandResult {
    /// A result that is nothing but a failure.
    pub fn failed(failure: Failure, duration: Duration) -> Self {
        CommandResult {
            duration,
            failure: Some(failure),
            ..CommandResult::default()
        }
    }

    /// True when the command exited by itself with code 0.
    pub fn success(&self) -> bool {
        self.failure.is_none() && self.exit_code == Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_table() {
        use FailureKind::*;
        let retryable: Vec<_> = [
            Timeout,
            OomKilled,
            ContainerLost,
            DaemonUnavailable,
            Capacity,
            ImageNotFound,
            InvalidSpec,
            Unsupported,
            SpawnFailed,
            AgentError,
            ProtocolViolation,
        ]
        .into_iter()
        .filter(|k| k.retryable())
        .collect();
        assert_eq!(
            retryable,
            [ContainerLost, DaemonUnavailable, Capacity, AgentError]
        );
        assert_eq!(Capacity.as_str(), "capacity");
    }

    #[test]
    fn failure_message_carries_state() {
        let mut f = Failure::new(FailureKind::ContainerLost, "sandbox sb-1 lost");
        f.container = Some(ContainerState {
            id: "0123456789abcdef".into(),
            status: ContainerStatus::Exited,
            exit_code: Some(137),
            oom_killed: true,
            ..ContainerState::default()
        });
        assert_eq!(
            f.to_string(),
            "container_lost: sandbox sb-1 lost (container 0123456789ab status=exited exit_code=137 oom_killed=true)"
        );
    }
}
