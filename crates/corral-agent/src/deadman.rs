//! The dead-man switch: no controller, no sandbox.
//!
//! corral writes to PID 1's stdin for as long as it uses the sandbox, a
//! keepalive ping at least every third of the grace period. If corral dies
//! without cleaning up (SIGKILL, OOM, a crashed host-side process), the bytes
//! stop and nobody would ever stop what runs in the container. So when
//! nothing has arrived on stdin for the grace period (counted from the
//! agent's start until the first byte), the agent kills everything and
//! exits, which stops the container. Only corral can write to PID 1's stdin
//! (PID 1 is non-dumpable), so nothing inside the sandbox can keep the switch
//! from firing.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::lock;
use crate::sys;

/// Fires after `grace` without a sign of life from the controller.
#[derive(Debug)]
pub struct DeadMan {
    last_seen: Mutex<Instant>,
    changed: Condvar,
    grace: Duration,
}

impl DeadMan {
    /// A switch with the given grace; the idle clock starts now.
    pub fn new(grace: Duration) -> Arc<Self> {
        Arc::new(DeadMan {
            last_seen: Mutex::new(Instant::now()),
            changed: Condvar::new(),
            grace,
        })
    }

    /// Records a sign of life from the controller.
    pub fn feed(&self) {
        *lock(&self.last_seen) = Instant::now();
        self.changed.notify_all();
    }

    /// Blocks until the grace period passes with no sign of life; returns
    /// how long the sandbox was unattended.
    pub fn wait_expired(&self) -> Duration {
        let mut seen = lock(&self.last_seen);
        loop {
            let idle = seen.elapsed();
            if idle >= self.grace {
                return idle;
            }
            seen = self
                .changed
                .wait_timeout(seen, self.grace - idle)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Runs the switch: waits, then kills every process and exits. Never
    /// returns. Before firing it looks at stdin once more: bytes waiting
    /// there mean corral is alive and only the reader fell behind (a busy
    /// sandbox can starve it), so the clock restarts, once: if the reader
    /// has still read nothing a grace period later, the switch fires anyway
    /// (a reader that cannot read is no controller).
    pub fn run(&self) -> ! {
        let mut excused_at: Option<Instant> = None;
        loop {
            let idle = self.wait_expired();
            let seen = *lock(&self.last_seen);
            let excuse_spent = excused_at.is_some_and(|at| seen <= at);
            if !excuse_spent && stdin_has_bytes() {
                let now = Instant::now();
                excused_at = Some(now);
                *lock(&self.last_seen) = now;
                continue;
            }
            eprintln!(
                "corral-agent: nothing from corral for {} ms (grace {} ms): killing all processes and exiting",
                idle.as_millis(),
                self.grace.as_millis()
            );
            // As PID 1, kill(-1) reaches every other process in the namespace.
            let _ = sys::kill(-1, libc::SIGKILL);
            std::process::exit(0);
        }
    }
}

/// True when PID 1's stdin has unread bytes (not merely an end of file).
fn stdin_has_bytes() -> bool {
    sys::bytes_readable(0).is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_only_after_grace_without_feeding() {
        let d = DeadMan::new(Duration::from_millis(150));
        let t0 = Instant::now();
        let d2 = d.clone();
        let waiter = std::thread::spawn(move || d2.wait_expired());
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(50));
            d.feed();
        }
        assert!(!waiter.is_finished(), "fired while fed");
        let idle = waiter.join().expect("waiter");
        assert!(idle >= Duration::from_millis(150));
        assert!(t0.elapsed() >= Duration::from_millis(450));
    }

    #[test]
    fn counts_from_start_before_first_client() {
        let d = DeadMan::new(Duration::from_millis(50));
        let t0 = Instant::now();
        d.wait_expired();
        let e = t0.elapsed();
        assert!(
            e >= Duration::from_millis(50) && e < Duration::from_secs(2),
            "{e:?}"
        );
    }
}
