//! Self-healing policies: how transient daemon errors are retried and what a
//! sandbox does when its container is lost.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Exponential backoff with jitter for transient daemon errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 disables retrying.
    pub attempts: usize,
    /// Delay before the first retry, in ms.
    pub initial_delay_ms: u64,
    /// Ceiling for any one delay, in ms.
    pub max_delay_ms: u64,
    /// Randomize each delay (between the delay and twice it) so many
    /// clients that failed together do not retry together.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_delay_ms: 500,
            max_delay_ms: 8_000,
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The delay before retry number `retry` (0-based), without jitter:
    /// initial, doubling, capped.
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = 1u64.checked_shl(retry.min(63)).unwrap_or(u64::MAX);
        Duration::from_millis(
            self.initial_delay_ms
                .saturating_mul(factor)
                .min(self.max_delay_ms),
        )
    }
}

/// What a sandbox does when its container disappears (removed, killed,
/// crashed, OOM of PID 1, daemon restart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recovery {
    /// Report `container_lost` (or `oom_killed`) and mark the sandbox dead;
    /// never substitute a blank container. What RL training wants: the
    /// episode ends cleanly and can be masked.
    #[default]
    Fail,
    /// Adopt a live container another corral recreated for the same sandbox,
    /// else recreate from the identical spec (same mounts, so persistent
    /// workspaces survive), re-run the start-up commands, and retry the
    /// command once. What long-running agents want.
    Recreate,
}

impl Recovery {
    /// The policy's name, as configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Recovery::Fail => "fail",
            Recovery::Recreate => "recreate",
        }
    }

    /// Parses `fail` or `recreate`.
    pub fn parse(text: &str) -> Option<Recovery> {
        match text {
            "fail" => Some(Recovery::Fail),
            "recreate" => Some(Recovery::Recreate),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy::default();
        let delays: Vec<u64> = (0..6).map(|i| p.delay(i).as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(p.delay(200), Duration::from_millis(8000));
        assert_eq!(Recovery::parse("recreate"), Some(Recovery::Recreate));
        assert_eq!(Recovery::parse("retry"), None);
    }
}
