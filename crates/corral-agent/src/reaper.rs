//! PID 1's duty: reap every child, and hand the statuses of the commands we
//! started to their supervisors.
//!
//! Orphans of the whole sandbox are re-parented to PID 1, so someone must
//! `waitpid` them or they stay zombies forever. One thread does all reaping;
//! nothing else may call `waitpid` (that is why the agent never uses
//! `std::process::Child::wait`).
//!
//! The race "child exits and is reaped before its pid is registered" is made
//! impossible rather than patched: the registry lock is held across
//! `Command::spawn` and the registration, and the reaper only reaps while
//! holding that lock. It first *waits* without reaping (`waitid(WNOWAIT)`),
//! then takes the lock and reaps with `WNOHANG`. So every pid the reaper
//! reaps is either registered already or not ours, and no status ever needs
//! parking in an "unclaimed" map.
//!
//! Holding the lock across spawn matters for a second reason: when `exec`
//! fails, std reaps the failed child itself with `waitpid(pid)` and panics if
//! that pid was already reaped. The lock keeps the reaper away until std is
//! done with it.
//!
//! Reaping also measures: `wait4` gives what the reaped process used with
//! every descendant it waited for. A command's main process hands that to
//! its supervisor with the exit status. An orphan (a process the command
//! left behind, re-parented to PID 1 when its parent died) is charged to
//! the command whose process group it is in (read from `/proc` while it is
//! still a zombie), until that command's supervisor calls
//! [`Reaper::finish`] to report.

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::{lock, Control};
use crate::sys::{self, ExitStatus};
use crate::tree;

/// How long the reaper sleeps when there are no children at all. A new child
/// of ours wakes it at once (spawn notifies); this only bounds how late an
/// orphan adopted from a `docker exec` process tree gets reaped.
const IDLE_WAIT: Duration = Duration::from_millis(500);

/// How long [`Reaper::finish`] waits for members of a command's group that
/// are already dying (a process closes its pipes early in `exit()`, before
/// it becomes a zombie, so a command waiting for its output can end a
/// moment before its last orphan can be reaped).
const FINISH_WAIT: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
struct Registry {
    waiting: HashMap<i32, Arc<Control>>,
    /// Commands not yet reported, by process group (their main pid):
    /// orphans reaped from the group are charged to them.
    groups: HashMap<i32, Arc<Control>>,
    /// Spawns so far; lets the idle wait tell whether it missed a wake-up.
    spawns: u64,
}

/// The reaper's shared half: the pid registry commands spawn through.
#[derive(Debug, Default)]
pub struct Reaper {
    registry: Mutex<Registry>,
    /// Signalled after each spawn, to end an idle wait.
    spawned: Condvar,
}

impl Reaper {
    /// A reaper; call [`Reaper::run`] on a thread of its own.
    pub fn new() -> Arc<Self> {
        Arc::new(Reaper::default())
    }

    /// Spawns `cmd` and registers its pid so its exit status goes to `ctl`.
    pub fn spawn(&self, cmd: &mut Command, ctl: Arc<Control>) -> io::Result<Child> {
        let mut reg = lock(&self.registry);
        let child = crate::watchdog::watched(|| cmd.spawn())?;
        // Pids fit in i32 on Linux (pid_max <= 2^22).
        let pid = child.id() as i32;
        reg.groups.insert(pid, ctl.clone());
        reg.waiting.insert(pid, ctl);
        reg.spawns += 1;
        drop(reg);
        self.spawned.notify_one();
        Ok(child)
    }

    /// A child was forked outside [`Reaper::spawn`] (a reset's world
    /// builder): wake the reaper if it sleeps for want of children, so the
    /// child is reaped as soon as it exits.
    pub fn adopted(&self) {
        lock(&self.registry).spawns += 1;
        self.spawned.notify_one();
    }

    /// Forgets `pid`: its status, when reaped, is discarded.
    pub fn forget(&self, pid: i32) {
        let mut reg = lock(&self.registry);
        reg.waiting.remove(&pid);
        reg.groups.remove(&pid);
    }

    /// Ends the charging of orphans to the command whose main process was
    /// `pid` (its process group's id), once it is about to report. Members
    /// of its group that have died are reaped first, waiting at most
    /// [`FINISH_WAIT`] for those already on their way out; members still
    /// running are not waited for (they are not counted).
    pub fn finish(&self, pid: i32) {
        let until = Instant::now() + FINISH_WAIT;
        loop {
            self.reap_all();
            // ESRCH: nothing of the group is left, not even a zombie.
            if matches!(sys::kill(-pid, 0), Err(e) if e.raw_os_error() == Some(libc::ESRCH)) {
                break;
            }
            let dying = tree::scan()
                .iter()
                .filter(|p| p.pgrp == pid)
                .all(tree::ProcStat::dying);
            if !dying || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        lock(&self.registry).groups.remove(&pid);
    }

    /// Reaps forever. Never returns.
    pub fn run(&self) -> ! {
        loop {
            let spawns = lock(&self.registry).spawns;
            match sys::wait_any_child_exit() {
                Ok(()) => self.reap_all(),
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                    let reg = lock(&self.registry);
                    // A spawn between waitid and here notified nobody: only
                    // sleep if there was none.
                    if reg.spawns == spawns {
                        let _unused = self.spawned.wait_timeout(reg, IDLE_WAIT);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Not expected from waitid; back off rather than spin.
                    eprintln!("corral-agent: waitid failed: {e}");
                    std::thread::sleep(IDLE_WAIT);
                }
            }
        }
    }

    fn reap_all(&self) {
        let mut reg = lock(&self.registry);
        while let Some(pid) = sys::exited_child() {
            // A command's main process is known by its pid; anyone else
            // may be an orphan of a command's group, which its zombie's
            // stat still tells.
            let group = if reg.waiting.contains_key(&pid) || reg.groups.is_empty() {
                None
            } else {
                std::fs::read(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|b| tree::parse_stat(&String::from_utf8_lossy(&b)))
                    .map(|st| st.pgrp)
            };
            let Some((raw, used)) = sys::reap(pid) else {
                // Not reapable after all (cannot happen for a child that
                // waitid reported); leave it to the next round.
                break;
            };
            let at = Instant::now();
            if let Some(ctl) = reg.waiting.remove(&pid) {
                ctl.set_exit(ExitStatus::from_raw(raw), used, at);
            } else if let Some(ctl) = group.and_then(|g| reg.groups.get(&g)) {
                ctl.add_orphan(used);
            }
        }
    }
}
