//! Who runs as what in a sandbox: the agent under a uid of its own,
//! commands as the sandbox's user, and each code context's relay under a
//! relay uid, so that the kernel's own permission checks keep commands
//! away from the agent and the relays. A signal to a process of another
//! uid needs CAP_KILL, tracing it or opening its `/proc/PID/fd`, `mem`
//! or `environ` needs CAP_SYS_PTRACE; commands hold neither.
//!
//! The engine starts PID 1 as root with CAP_SETUID, CAP_SETGID, CAP_KILL
//! and CAP_SETPCAP for the agent alone (`--agent-caps`). Before any
//! thread exists, [`init`] records the user the engine started it as (the
//! commands' user: uid, gid, supplementary groups) and makes its real and
//! saved uid and gid [`AGENT_UID`], keeping the effective ones: what
//! another process may do to it is decided by its real and saved ids (a
//! signal needs the sender's real or effective uid to be one of them,
//! tracing and `/proc/PID/fd` all three ids to be the caller's), what it
//! may do itself by its effective ids and capabilities, which stay as
//! they were (files it writes are owned as before; gVisor has no
//! `setfsuid` to do this otherwise). Raw system calls: the C library's
//! `setresuid` would broadcast to threads; it happens once, before any.
//!
//! Every command is then forked from the agent and becomes the commands'
//! user, all three ids, between fork and exec ([`Plan::apply_in_child`])
//! before it drops the agent's own capabilities (`caps`). A relay
//! (`corral-agent kernel`, asked for by an Exec with `relay`) gets a uid
//! of [`RELAY_UIDS`] instead (one per context, in turn), keeping
//! CAP_SETUID, CAP_SETGID and CAP_KILL with the commands' capabilities
//! through its exec (as ambient capabilities; where the kernel has none,
//! gVisor, it execs as root with real and saved ids its own, which
//! gVisor's exec keeps, where Linux's would make the saved uid root's),
//! then takes the commands' effective ids (its files are theirs), starts
//! its kernel as the commands' user ([`KernelAs`]) and keeps CAP_KILL
//! alone to interrupt it. Its stdin and stdout are sockets, which
//! `/proc/PID/fd` cannot reopen.
//!
//! When the agent cannot take a uid of its own (started as another user,
//! or without those capabilities), commands share its uid as before and
//! it says so on stderr; PID 1 stays non-dumpable either way.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::sys::{self, CapSets};

/// The agent's uid and gid (its real and saved ones). Reserved, with
/// [`RELAY_UIDS`]: an image user with one of these ids would share it
/// with the agent or a relay.
pub const AGENT_UID: u32 = 65500;
/// The relays' uids (and gids), handed out in turn: 31 contexts started
/// one after another never share one.
pub const RELAY_UIDS: std::ops::RangeInclusive<u32> = 65501..=65531;

/// The variable through which the agent tells a relay whom to start its
/// kernel as: `UID:GID:GROUPS:CAPS` (groups comma-separated, CAPS the
/// kernel's capabilities as a hex mask).
pub const KERNEL_AS_ENV: &str = "CORRAL_KERNEL_AS";

const CAP_KILL: u32 = 5;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

const fn bit(cap: u32) -> u64 {
    1 << cap
}

/// What the agent needs to hold a uid of its own.
const NEEDED: u64 = bit(CAP_SETUID) | bit(CAP_SETGID) | bit(CAP_KILL);

/// A user: uid, primary gid, supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary group ids.
    pub groups: Vec<u32>,
}

/// How the agent and commands are split.
#[derive(Debug)]
enum Split {
    /// The agent is [`AGENT_UID`]; commands run as this user.
    Separate(User),
    /// Commands share the agent's uid, for this reason.
    Shared(String),
}

static SPLIT: OnceLock<Split> = OnceLock::new();
static NEXT_RELAY: AtomicU32 = AtomicU32::new(0);

/// Takes the agent's own uid (see the module's comment). Call first in
/// PID 1, before any thread. `Err` only when the change went half-way
/// and could not be undone: the agent must not go on.
pub fn init() -> Result<(), String> {
    let split = match split() {
        Ok(s) => s,
        Err(Undo::Kept(why)) => Split::Shared(why),
        Err(Undo::Broken(why)) => return Err(why),
    };
    if let Split::Shared(why) = &split {
        eprintln!("corral-agent: commands share the agent's uid: {why}");
    }
    let _ = SPLIT.set(split);
    Ok(())
}

/// Why the agent kept the engine's uid: unchanged, or half-changed.
enum Undo {
    Kept(String),
    Broken(String),
}

fn split() -> Result<Split, Undo> {
    let (_, euid, _) = sys::getresuid();
    if euid != 0 {
        return Err(Undo::Kept(format!(
            "the engine started it as uid {euid}, not root"
        )));
    }
    let caps = sys::capget().map_err(|e| Undo::Kept(format!("capget: {e}")))?;
    if caps.permitted & NEEDED != NEEDED {
        return Err(Undo::Kept(
            "the engine gave it no CAP_SETUID, CAP_SETGID and CAP_KILL".into(),
        ));
    }
    let groups = sys::getgroups().map_err(|e| Undo::Kept(format!("getgroups: {e}")))?;
    let user = User {
        uid: euid,
        gid: sys::getgid(),
        groups,
    };
    // Real and saved ids of its own; the effective ones stay the
    // commands' user's, so its files and capabilities are as before.
    if let Err(e) = sys::set_real_ids(AGENT_UID, AGENT_UID) {
        // The gid may have changed before the uid failed.
        return match sys::set_real_ids(user.uid, user.gid) {
            Ok(()) => Err(Undo::Kept(format!("cannot become uid {AGENT_UID}: {e}"))),
            Err(e2) => Err(Undo::Broken(format!(
                "cannot become uid {AGENT_UID} ({e}) nor go back ({e2})"
            ))),
        };
    }
    // Whatever changed, it stays out of reach.
    sys::set_non_dumpable().map_err(|e| Undo::Broken(format!("PR_SET_DUMPABLE: {e}")))?;
    if sys::getresuid() != (AGENT_UID, user.uid, AGENT_UID) {
        return Err(Undo::Broken(format!(
            "ids {:?} after becoming uid {AGENT_UID}",
            sys::getresuid()
        )));
    }
    Ok(Split::Separate(user))
}

/// Whom a forked child becomes before it execs; made before the fork
/// (nothing is allocated between fork and exec).
#[derive(Debug, Clone)]
pub enum Plan {
    /// Nothing changes: commands share the agent's uid.
    Unchanged,
    /// The commands' user.
    Command(User),
    /// A relay: this uid and gid, keeping `keep` (permitted, effective,
    /// and inheritable) through its exec.
    Relay {
        /// Its uid and gid.
        uid: u32,
        /// Capabilities it keeps.
        keep: u64,
        /// Whether they can pass its exec as ambient capabilities.
        ambient: bool,
    },
}

/// How a command starts.
pub fn command_plan() -> Plan {
    match SPLIT.get() {
        Some(Split::Separate(user)) => Plan::Command(user.clone()),
        _ => Plan::Unchanged,
    }
}

/// How a relay starts, and the [`KERNEL_AS_ENV`] value that tells it
/// whom to start its kernel as (`None`: as itself). `agent_only`: the
/// capabilities commands drop.
pub fn relay_plan(agent_only: &[u32]) -> (Plan, Option<String>) {
    let Some(Split::Separate(user)) = SPLIT.get() else {
        return (Plan::Unchanged, None);
    };
    // The relay keeps the commands' effective uid (see `Plan::Relay`).
    debug_assert_eq!(user.uid, 0, "a split agent's commands are root");
    let n = RELAY_UIDS.end() - RELAY_UIDS.start() + 1;
    let uid = RELAY_UIDS.start() + NEXT_RELAY.fetch_add(1, Ordering::Relaxed) % n;
    let held = sys::capget().map(|c| c.permitted).unwrap_or(0);
    let dropped = agent_only.iter().fold(0u64, |m, &c| m | bit(c));
    // What a command of this user keeps through its exec.
    let kernel = if user.uid == 0 { held & !dropped } else { 0 };
    let keep = kernel | (held & NEEDED);
    let groups: Vec<String> = user.groups.iter().map(u32::to_string).collect();
    let env = format!("{}:{}:{}:{kernel:x}", user.uid, user.gid, groups.join(","));
    let ambient = sys::ambient_supported();
    (Plan::Relay { uid, keep, ambient }, Some(env))
}

impl Plan {
    /// Whether the child ends up as root (exec then gives it its
    /// bounding set, as far as it holds them).
    pub fn root(&self) -> bool {
        match self {
            Plan::Unchanged => sys::getresuid().1 == 0,
            Plan::Command(u) => u.uid == 0,
            Plan::Relay { .. } => false,
        }
    }

    /// Becomes whom the plan says, in a forked child before exec; only
    /// raw system calls (async-signal-safe). A command then drops the
    /// agent's capabilities (`caps`); a relay's are settled here:
    /// `agent_only` leave its bounding set (CAP_SETPCAP last, as the
    /// list is ordered).
    pub fn apply_in_child(&self, agent_only: &[u32], bounding: bool) -> std::io::Result<()> {
        match self {
            Plan::Unchanged => Ok(()),
            Plan::Command(u) => sys::set_ids(u.uid, u.gid, &u.groups),
            Plan::Relay { uid, keep, ambient } => {
                sys::set_groups(&[])?;
                if *ambient {
                    // All three ids its own, so even the exec (which makes
                    // the saved uid the effective one) leaves it none of
                    // a command's; `keep` passes it as ambient.
                    sys::keep_caps(true)?;
                    sys::set_ids(*uid, *uid, &[])?;
                } else {
                    // No ambient set (gVisor, whose exec keeps the saved
                    // uid): real and saved ids of its own, the effective
                    // ones root's, so its exec as root gives it `keep`.
                    sys::set_real_ids(*uid, *uid)?;
                }
                let now = sys::capget()?;
                // Inheritable first: it may only grow within the bounding set.
                sys::capset(CapSets {
                    effective: now.permitted,
                    permitted: now.permitted,
                    inheritable: *keep,
                })?;
                if *ambient {
                    for cap in 0..64 {
                        if keep & bit(cap) != 0 {
                            sys::raise_ambient(cap)?;
                        }
                    }
                }
                for &cap in agent_only.iter().filter(|_| bounding) {
                    sys::drop_bounding(cap)?;
                }
                sys::capset(CapSets {
                    effective: *keep,
                    permitted: *keep,
                    inheritable: *keep,
                })
            }
        }
    }
}

/// Clears every capability of a forked child that is not root (what an
/// exec would leave it anyway, but a file with capabilities could then
/// draw on the agent's permitted set); async-signal-safe.
pub fn clear_caps_in_child() -> std::io::Result<()> {
    sys::capset(CapSets {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    })
}

/// Whom a relay starts its kernel as ([`KERNEL_AS_ENV`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelAs {
    /// The commands' user.
    pub user: User,
    /// The capabilities the kernel keeps (a command's).
    pub caps: u64,
}

impl KernelAs {
    /// Parses [`KERNEL_AS_ENV`]'s value; the error names it.
    pub fn parse(value: &str) -> Result<KernelAs, String> {
        let bad = || format!("invalid {KERNEL_AS_ENV} '{value}': expected UID:GID:GROUPS:CAPS");
        let parts: Vec<&str> = value.split(':').collect();
        let [uid, gid, groups, caps] = parts[..] else {
            return Err(bad());
        };
        let groups = if groups.is_empty() {
            Vec::new()
        } else {
            groups
                .split(',')
                .map(|g| g.parse().map_err(|_| bad()))
                .collect::<Result<_, _>>()?
        };
        Ok(KernelAs {
            user: User {
                uid: uid.parse().map_err(|_| bad())?,
                gid: gid.parse().map_err(|_| bad())?,
                groups,
            },
            caps: u64::from_str_radix(caps, 16).map_err(|_| bad())?,
        })
    }

    /// Makes `cmd`'s process the commands' user with a command's
    /// capabilities before it execs. Register before anything that a
    /// change of uid undoes (a parent-death signal).
    pub fn apply(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let me = self.clone();
        // SAFETY: the closure only makes raw system calls (setgroups,
        // setresgid, setresuid, prctl, capget, capset) on data made
        // before the fork; it does not allocate or take locks.
        unsafe {
            cmd.pre_exec(move || {
                sys::set_ids(me.user.uid, me.user.gid, &me.user.groups)?;
                sys::clear_ambient()?;
                let now = sys::capget()?;
                sys::capset(CapSets {
                    effective: now.permitted & me.caps,
                    permitted: now.permitted & me.caps,
                    inheritable: 0,
                })
            });
        }
    }
}

/// The start of a relay (`corral-agent kernel`): non-dumpable, and, when
/// the agent started it under a relay uid, whom to start the kernel as.
/// Call before any thread.
pub fn relay_start() -> Result<Option<KernelAs>, String> {
    sys::set_non_dumpable().map_err(|e| format!("cannot make the relay non-dumpable: {e}"))?;
    let Some(value) = std::env::var_os(KERNEL_AS_ENV) else {
        return Ok(None);
    };
    // No other thread exists yet to read the environment meanwhile, and
    // the kernel must not inherit the variable.
    std::env::remove_var(KERNEL_AS_ENV);
    let value = value.to_string_lossy().into_owned();
    let kernel = KernelAs::parse(&value)?;
    if sys::getresuid().0 == kernel.user.uid {
        // Started by hand, or by an agent that could not split.
        return Ok(None);
    }
    // Files it writes (the kernel's connection file) are the kernel's
    // user's; its real and saved ids stay its own.
    sys::set_effective_ids(kernel.user.uid, kernel.user.gid)
        .map_err(|e| format!("cannot write files as uid {}: {e}", kernel.user.uid))?;
    Ok(Some(kernel))
}

/// Once the kernel runs: the relay keeps only CAP_KILL (to interrupt the
/// kernel, a process of another uid). Best effort: a relay that kept more
/// is still out of every command's reach.
pub fn relay_settle() {
    let _ = sys::clear_ambient();
    if let Ok(now) = sys::capget() {
        let keep = now.permitted & bit(CAP_KILL);
        let _ = sys::capset(CapSets {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_as_round_trips_and_refuses_junk() {
        let k = KernelAs::parse("0:0:0,10:20c1").expect("parses");
        assert_eq!(
            k,
            KernelAs {
                user: User {
                    uid: 0,
                    gid: 0,
                    groups: vec![0, 10]
                },
                caps: 0x20c1
            }
        );
        let k = KernelAs::parse("1000:1000::0").expect("no groups");
        assert!(k.user.groups.is_empty());
        for bad in ["", "1:2:3", "a:0::0", "0:0:x:0", "0:0::zz", "0:0::0:1"] {
            let e = KernelAs::parse(bad).expect_err(bad);
            assert!(
                e.contains(KERNEL_AS_ENV) && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_reserved_ids_are_distinct() {
        assert!(!RELAY_UIDS.contains(&AGENT_UID));
        assert_eq!(RELAY_UIDS.count(), 31);
        // Below 65534 (nobody) and 65532 (distroless' nonroot), inside the
        // 65,536 ids a user namespace usually maps.
        assert!(*RELAY_UIDS.end() < 65532);
        assert_eq!(NEEDED.count_ones(), 3);
    }
}
