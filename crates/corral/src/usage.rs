//! What a sandbox uses now: [`Sandbox::usage`] asks the engine
//! (`Backend::usage`: Docker's stats of the container's cgroup) and, where
//! the engine keeps no accounting it can be asked for (`unsupported`:
//! Kubernetes), the sandbox's agent, which reads the same cgroup and
//! network counters from inside ([`Sandbox::usage_from_agent`]). Either
//! way the spec's limits are set beside, so a reading compares against
//! what the sandbox was asked to have.

use std::time::Duration;

use corral_core::backend::{Usage, UsageSource};
use corral_core::protocol::{Frame, FrameKind, SandboxUsage};
use corral_core::Error;

use crate::Sandbox;

/// How long the agent may take to answer a usage request (a few file
/// reads; more means it is stuck or the stream is).
const USAGE_TIMEOUT: Duration = Duration::from_secs(10);

impl Sandbox {
    /// What the sandbox uses now (CPU time, memory now and at peak, pids,
    /// block and network I/O) with its spec's limits beside: the engine's
    /// accounting, or the agent's reading from inside when the engine has
    /// none (`source` says which).
    pub async fn usage(&self) -> Result<Usage, Error> {
        if self.is_paused_to_disk() {
            // Nothing runs and no memory is held: its container is stopped.
            return Ok(self.with_limits(Usage::default()));
        }
        let usage = match self.runtime().inner.backend.usage(&self.placement()).await {
            Err(Error::Unsupported { .. }) => self.usage_from_agent().await?,
            other => other?,
        };
        Ok(self.with_limits(usage))
    }

    /// What the sandbox uses now as its agent reads it from inside: the
    /// sandbox's cgroup (v2, or v1's controllers) and its network
    /// interfaces, with its spec's limits beside. [`Sandbox::usage`] takes
    /// this path when the engine cannot say; it is public so the two can
    /// be compared. An agent too old to answer is `Error::Unsupported`.
    pub async fn usage_from_agent(&self) -> Result<Usage, Error> {
        let report = self.agent_usage().await?;
        Ok(self.with_limits(from_report(&report)))
    }

    /// What the agent's reading says, before it becomes a [`Usage`] (the
    /// cgroup's own limits and which interface was read).
    pub async fn agent_usage(&self) -> Result<SandboxUsage, Error> {
        let conn = self.current_conn();
        let agent_err = |message: String| Error::Agent {
            sandbox: self.id().to_string(),
            message,
        };
        if !conn.hello.usage {
            return Err(Error::Unsupported {
                what: format!(
                    "usage read from inside by agent {} (it predates usage requests)",
                    conn.hello.agent_version
                ),
            });
        }
        let id = conn.next_id();
        let mut rx = conn
            .register_exchange(id, crate::conn::Exchange::Usage)
            .map_err(|e| agent_err(format!("usage request: {e}")))?;
        conn.send(Frame::new(FrameKind::Usage, id, Vec::new()))
            .await
            .map_err(|e| agent_err(format!("usage request: {e}")))?;
        let frame = match tokio::time::timeout(USAGE_TIMEOUT, rx.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                return Err(agent_err(format!(
                    "usage request: the control stream ended: {}",
                    conn.closed_reason()
                )))
            }
            Err(_) => {
                conn.unregister(id);
                return Err(agent_err(format!(
                    "usage request: no answer within {USAGE_TIMEOUT:?}"
                )));
            }
        };
        if frame.kind != FrameKind::UsageReport {
            return Err(agent_err(format!(
                "usage request refused: {}",
                String::from_utf8_lossy(&frame.payload)
            )));
        }
        frame
            .parse::<SandboxUsage>()
            .map_err(|e| agent_err(format!("unreadable usage report: {e}")))
    }

    fn with_limits(&self, mut usage: Usage) -> Usage {
        let limits = &self.spec().limits;
        usage.memory_limit_bytes = limits.memory;
        usage.pids_limit = limits.pids.and_then(|p| u64::try_from(p).ok());
        usage
    }
}

/// The agent's report as a [`Usage`] (a counter it could not read is 0,
/// as the engine's stats leave it).
fn from_report(r: &SandboxUsage) -> Usage {
    Usage {
        source: UsageSource::Agent,
        cpu_ns: r.cpu_ns.unwrap_or(0),
        memory_bytes: r.memory_bytes.unwrap_or(0),
        memory_peak_bytes: r.memory_peak_bytes,
        memory_limit_bytes: r.memory_limit_bytes,
        pids: r.pids.unwrap_or(0),
        pids_limit: r.pids_limit,
        block_read_bytes: r.block_read_bytes.unwrap_or(0),
        block_write_bytes: r.block_write_bytes.unwrap_or(0),
        net_rx_bytes: r.net_rx_bytes.unwrap_or(0),
        net_tx_bytes: r.net_tx_bytes.unwrap_or(0),
        oom_kills: r.oom_kills,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_becomes_usage_with_what_it_lacks_as_zero() {
        let r = SandboxUsage {
            cgroup: "v1".into(),
            cpu_ns: Some(5),
            memory_bytes: Some(7),
            oom_kills: Some(1),
            ..SandboxUsage::default()
        };
        let u = from_report(&r);
        assert_eq!(u.source, UsageSource::Agent);
        assert_eq!((u.cpu_ns, u.memory_bytes, u.pids), (5, 7, 0));
        assert_eq!((u.memory_peak_bytes, u.oom_kills), (None, Some(1)));
    }
}
