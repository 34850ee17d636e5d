//! The capabilities PID 1 holds for itself alone, and which every command
//! therefore drops before it runs.
//!
//! Two kinds: the in-place reset's extra capabilities (`pristine`'s
//! `EXTRA_CAPS`), and those corral names with `init --agent-caps`:
//! CAP_SETUID and CAP_SETGID, to start commands and relays under uids
//! other than its own (`ids`), CAP_KILL, to signal and end them (at a
//! timeout, before an exclusive command, at a reset), and CAP_SETPCAP to
//! take all of these out of each command's bounding set (those the spec
//! gives commands themselves, e.g. SETUID with `setuid_caps`, are not
//! named). A command that kept CAP_KILL could signal every process in
//! the sandbox whatever its uid, the agent's included; one that kept
//! CAP_SETUID could take the agent's uid.
//!
//! The list is fixed once at start, before any command, so the spawn path
//! (between fork and exec, where nothing may allocate) only reads it.

use std::sync::OnceLock;

/// CAP_KILL: signal processes of any uid.
pub const CAP_KILL: u32 = 5;
/// CAP_SETPCAP: needed to drop from the bounding set; always dropped last.
pub const CAP_SETPCAP: u32 = 8;

/// CAP_SETGID: become another group (commands' and relays' gids).
pub const CAP_SETGID: u32 = 6;
/// CAP_SETUID: become another user (commands' and relays' uids).
pub const CAP_SETUID: u32 = 7;
/// CAP_SYS_ADMIN: mounts (the in-place reset's worlds, the door's `/proc`).
pub const CAP_SYS_ADMIN: u32 = 21;

/// The names `--agent-caps` accepts, as Docker spells them.
const NAMES: [(&str, u32); 4] = [
    ("KILL", CAP_KILL),
    ("SETGID", CAP_SETGID),
    ("SETPCAP", CAP_SETPCAP),
    ("SETUID", CAP_SETUID),
];

/// What every command drops.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AgentOnly {
    /// Capability numbers, CAP_SETPCAP (when present) last.
    pub caps: Vec<u32>,
    /// Whether they can also go from the bounding set (the agent holds
    /// CAP_SETPCAP). Without it, a command still cannot regain them under
    /// no-new-privileges (an exec never gains what the caller lacks).
    pub bounding: bool,
}

static AGENT_ONLY: OnceLock<AgentOnly> = OnceLock::new();

/// Parses `--agent-caps`' value (`KILL,SETPCAP`); the error names the
/// value.
pub fn parse_list(value: &str) -> Result<Vec<u32>, String> {
    value
        .split(',')
        .map(|name| {
            let n = name.trim().to_ascii_uppercase();
            let n = n.strip_prefix("CAP_").unwrap_or(&n);
            NAMES
                .iter()
                .find(|(known, _)| *known == n)
                .map(|&(_, cap)| cap)
                .ok_or_else(|| {
                    format!(
                        "invalid value '{value}' for '--agent-caps': '{name}' is not one of {}",
                        NAMES.map(|(n, _)| n).join(", ")
                    )
                })
        })
        .collect()
}

/// This process's effective capability set.
fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Fixes what commands drop: `named` (from `--agent-caps`) and, when
/// `pristine_extra`, the reset's extra capabilities. Only capabilities the
/// agent holds are listed: one it lacks (a non-root sandbox user gets
/// none) is no command's either. Call once, before the first command.
pub fn init(named: &[u32], pristine_extra: bool) {
    let held = effective();
    let mut caps: Vec<u32> = named.to_vec();
    if pristine_extra {
        caps.extend(crate::pristine::EXTRA_CAPS);
    }
    caps.retain(|&c| held & (1 << c) != 0);
    let missing: Vec<u32> = named
        .iter()
        .copied()
        .filter(|&c| held & (1 << c) == 0)
        .collect();
    if !missing.is_empty() {
        eprintln!("corral-agent: --agent-caps names capabilities the agent lacks: {missing:?}");
    }
    caps.sort_unstable_by_key(|&c| (c == CAP_SETPCAP, c));
    caps.dedup();
    let only = AgentOnly {
        bounding: held & (1 << CAP_SETPCAP) != 0,
        caps,
    };
    if !only.caps.is_empty() && !only.bounding {
        eprintln!("corral-agent: without CAP_SETPCAP the agent's own capabilities stay in commands' bounding set");
    }
    let _ = AGENT_ONLY.set(only);
}

/// What every command drops (nothing before [`init`]).
pub fn agent_only() -> &'static AgentOnly {
    AGENT_ONLY.get_or_init(AgentOnly::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_refuses_others() {
        assert_eq!(parse_list("KILL,SETPCAP"), Ok(vec![CAP_KILL, CAP_SETPCAP]));
        assert_eq!(
            parse_list("SETUID,SETGID"),
            Ok(vec![CAP_SETUID, CAP_SETGID])
        );
        assert_eq!(parse_list("cap_kill"), Ok(vec![CAP_KILL]));
        let e = parse_list("KILL,SYS_ADMIN").expect_err("not ours to hold");
        assert!(
            e.contains("'KILL,SYS_ADMIN'") && e.contains("'SYS_ADMIN'"),
            "{e}"
        );
        assert!(parse_list("").is_err());
    }
}
