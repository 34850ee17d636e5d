//! PID 1's own tunables that commands can change, and putting them back.
//!
//! Commands run as the agent's uid (root, with DAC_OVERRIDE), so the
//! permission checks on `/proc/1/oom_score_adj`, `/proc/1/coredump_filter`
//! and `/proc/1/autogroup` let them write there: raising PID 1's OOM score
//! or its autogroup's niceness needs no capability. The seccomp filter
//! cannot tell paths apart, and closing `/proc/1` would also close what
//! commands may rightly write of their own (`/proc/self/...`), so instead
//! the agent records its values at start and writes them back before
//! every in-place reset and every exclusive command: nothing a command
//! wrote there survives into the next episode (where it would be both a
//! channel between episodes and a lasting handicap: an agent at OOM score
//! 1000 is the OOM killer's first victim, an agent at nice 19 starves).

use std::sync::OnceLock;
use std::time::Duration;

const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";
const COREDUMP_FILTER: &str = "/proc/self/coredump_filter";
const AUTOGROUP: &str = "/proc/self/autogroup";

/// The values at start, as written back (`None`: not readable here, e.g.
/// a kernel without autogroups).
#[derive(Debug, Default)]
struct Saved {
    oom_score_adj: Option<String>,
    coredump_filter: Option<String>,
    autogroup_nice: Option<i32>,
}

static SAVED: OnceLock<Saved> = OnceLock::new();

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The niceness in `/proc/PID/autogroup` (`/autogroup-57 nice 0`).
fn parse_autogroup(text: &str) -> Option<i32> {
    text.split_whitespace()
        .skip_while(|w| *w != "nice")
        .nth(1)?
        .parse()
        .ok()
}

/// Records the agent's values. Call once at start, before any command.
pub fn record() {
    let _ = SAVED.set(Saved {
        oom_score_adj: read(OOM_SCORE_ADJ),
        // Printed in hex without a prefix; written back with one.
        coredump_filter: read(COREDUMP_FILTER).map(|v| format!("0x{v}")),
        autogroup_nice: read(AUTOGROUP).as_deref().and_then(parse_autogroup),
    });
}

/// Writes every recorded value back where it changed; the error names
/// what could not be restored.
pub fn restore() -> Result<(), String> {
    let Some(saved) = SAVED.get() else {
        return Ok(());
    };
    let write = |path: &str, value: &str| {
        std::fs::write(path, value).map_err(|e| format!("cannot restore {path} to {value}: {e}"))
    };
    if let Some(v) = &saved.oom_score_adj {
        if read(OOM_SCORE_ADJ).as_ref() != Some(v) {
            write(OOM_SCORE_ADJ, v)?;
        }
    }
    if let Some(v) = &saved.coredump_filter {
        if read(COREDUMP_FILTER).map(|now| format!("0x{now}")).as_ref() != Some(v) {
            write(COREDUMP_FILTER, v)?;
        }
    }
    if let Some(nice) = saved.autogroup_nice {
        if read(AUTOGROUP).as_deref().and_then(parse_autogroup) != Some(nice) {
            // The kernel takes one autogroup change per 100 ms host-wide
            // from a process without CAP_SYS_ADMIN (EAGAIN otherwise).
            let mut tries = 0;
            loop {
                match std::fs::write(AUTOGROUP, nice.to_string()) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 20 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(25));
                    }
                    Err(e) => {
                        return Err(format!("cannot restore {AUTOGROUP} to nice {nice}: {e}"))
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_autogroup_niceness() {
        assert_eq!(parse_autogroup("/autogroup-57 nice 0\n"), Some(0));
        assert_eq!(parse_autogroup("/autogroup-1 nice 19"), Some(19));
        assert_eq!(parse_autogroup("/autogroup-1 nice -5"), Some(-5));
        assert_eq!(parse_autogroup("garbage"), None);
    }
}
