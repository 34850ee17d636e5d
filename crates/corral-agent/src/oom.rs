//! Telling an OOM kill from any other SIGKILL.
//!
//! A process killed by the kernel's OOM killer just dies of SIGKILL; nothing
//! in its exit status says why. The container's memory cgroup counts OOM
//! kills, so the agent reads that counter before a command starts and after it
//! ends: if it rose and the command's main process died of SIGKILL, the OOM
//! killer did it. A main process that exited (whatever its code) was not.

use std::path::Path;

const V2_EVENTS: &str = "/sys/fs/cgroup/memory.events";
const V1_CONTROL: &str = "/sys/fs/cgroup/memory/memory.oom_control";

/// Which OOM-kill counter this sandbox exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomCounter {
    /// cgroup v2 `memory.events`.
    V2,
    /// cgroup v1 `memory.oom_control`.
    V1,
    /// Neither is readable; OOM kills cannot be told apart.
    None,
}

impl OomCounter {
    /// Finds the counter this sandbox has.
    pub fn detect() -> Self {
        if read_counter(V2_EVENTS).is_some() {
            OomCounter::V2
        } else if read_counter(V1_CONTROL).is_some() {
            OomCounter::V1
        } else {
            OomCounter::None
        }
    }

    /// The name sent in HelloAck.
    pub fn name(self) -> &'static str {
        match self {
            OomCounter::V2 => "v2",
            OomCounter::V1 => "v1",
            OomCounter::None => "none",
        }
    }

    /// The current count of OOM kills in the sandbox, if known.
    pub fn read(self) -> Option<u64> {
        match self {
            OomCounter::V2 => read_counter(V2_EVENTS),
            OomCounter::V1 => read_counter(V1_CONTROL),
            OomCounter::None => None,
        }
    }
}

fn read_counter(path: impl AsRef<Path>) -> Option<u64> {
    parse_oom_kill(&std::fs::read_to_string(path).ok()?)
}

/// The value of the `oom_kill N` line (both cgroup versions use that key).
pub fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next()) {
            (Some("oom_kill"), Some(n)) => n.parse().ok(),
            _ => None,
        }
    })
}

/// The OOM verdict: the counter rose while the command ran, its main
/// process itself died the way OOM victims die (SIGKILL), and it was not us
/// killing it for a timeout.
///
/// An exit code of 137 is never taken for one: a shell that reports a
/// helper's SIGKILL as 137, or a command that simply runs `exit 137` after
/// a helper was OOM-killed, exited, and its exit code is its result.
pub fn oom_killed(
    before: Option<u64>,
    after: Option<u64>,
    signal: Option<i32>,
    timed_out: bool,
) -> bool {
    let rose = matches!((before, after), (Some(b), Some(a)) if a > b);
    rose && signal == Some(libc::SIGKILL) && !timed_out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_cgroup_formats() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_oom_kill(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v2), Some(2));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\n"), None);
        assert_eq!(parse_oom_kill("oom_kill x\n"), None);
        assert_eq!(parse_oom_kill(""), None);
    }

    #[test]
    fn verdict_needs_rise_and_sigkill_and_no_timeout() {
        assert!(oom_killed(Some(0), Some(1), Some(9), false));
        assert!(!oom_killed(Some(1), Some(1), Some(9), false));
        assert!(!oom_killed(Some(0), Some(1), Some(15), false));
        assert!(!oom_killed(Some(0), Some(1), Some(9), true));
        assert!(!oom_killed(None, None, Some(9), false));
        // An exit, even with 137, is the command's own result.
        assert!(!oom_killed(Some(0), Some(1), None, false));
    }
}
