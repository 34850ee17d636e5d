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

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::{lock, Control};
use crate::sys::{self, ExitStatus};

/// How long the reaper sleeps when there are no children at all. A new child
/// of ours wakes it at once (spawn notifies); this only bounds how late an
/// orphan adopted from a `docker exec` process tree gets reaped.
const IDLE_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Registry {
    waiting: HashMap<i32, Arc<Control>>,
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
        reg.waiting.insert(pid, ctl);
        reg.spawns += 1;
        drop(reg);
        self.spawned.notify_one();
        Ok(child)
    }

    /// Forgets `pid`: its status, when reaped, is discarded.
    /// A child was forked outside [`Reaper::spawn`] (a reset's world
    /// builder): wake the reaper if it sleeps for want of children, so the
    /// child is reaped as soon as it exits.
    pub fn adopted(&self) {
        lock(&self.registry).spawns += 1;
        self.spawned.notify_one();
    }

    pub fn forget(&self, pid: i32) {
        lock(&self.registry).waiting.remove(&pid);
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
        while let Some((pid, raw)) = sys::reap_one() {
            let at = Instant::now();
            if let Some(ctl) = reg.waiting.remove(&pid) {
                ctl.set_exit(ExitStatus::from_raw(raw), at);
            }
        }
    }
}
