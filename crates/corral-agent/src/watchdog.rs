//! Unsticks a spawn that a command holds up.
//!
//! Spawning a command waits until the forked child has exec'd. Until then
//! the child is a copy of the agent, and a process of the same user can
//! SIGSTOP it (signalling needs no ptrace rights): the spawn, and with it
//! the thread that reads corral's frames and the reaper, would wait
//! forever, and the unread keepalives would keep the dead-man switch from
//! ever firing. So while a spawn is under way for more than [`STUCK`], a
//! stopped direct child of PID 1 that has not exec'd yet (its name is still
//! the agent's) is SIGKILLed; the spawn then completes and the command is
//! reported killed by signal 9, as it was.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::control::lock;
use crate::{sys, tree};

/// How long a spawn may wait for its child's exec.
pub const STUCK: Duration = Duration::from_secs(1);

const POLL: Duration = Duration::from_millis(250);

static SPAWNING: Mutex<Option<Instant>> = Mutex::new(None);

/// Runs `spawn` as a watched spawn.
pub fn watched<T>(spawn: impl FnOnce() -> T) -> T {
    *lock(&SPAWNING) = Some(Instant::now());
    let r = spawn();
    *lock(&SPAWNING) = None;
    r
}

/// Watches spawns forever.
pub fn run() -> ! {
    let me = sys::getpid();
    loop {
        std::thread::sleep(POLL);
        let stuck = lock(&SPAWNING).is_some_and(|t| t.elapsed() >= STUCK);
        if !stuck {
            continue;
        }
        for p in tree::scan() {
            if p.ppid == me && matches!(p.state, b'T' | b't') && not_yet_exec(p.pid) {
                eprintln!(
                    "corral-agent: a spawn was held up by a stopped child ({}); killing it",
                    p.pid
                );
                let _ = sys::kill(p.pid, libc::SIGKILL);
            }
        }
    }
}

/// True while `pid` still carries the agent's own name (a forked child
/// that has not exec'd).
fn not_yet_exec(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.trim_end() == "corral-agent")
}
