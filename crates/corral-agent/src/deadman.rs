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
//!
//! Time the sandbox spent stopped does not count: a sandbox restored from
//! a checkpoint (a live snapshot's fork, a pause to disk) wakes with its
//! monotonic clock moved on by however long it was stopped, before corral
//! could attach. The switch waits in slices of [`SLICE`]; a slice that
//! took more than [`STOPPED`] longer than asked was time the sandbox was
//! not running, and moves the last sign of life forward by as much.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::lock;
use crate::sys;

/// The longest one wait of the switch lasts.
const SLICE: Duration = Duration::from_secs(1);

/// How much longer than asked a wait must take to count as time the
/// sandbox was stopped. A loaded machine's late wake-up taken for a stop
/// only delays the switch by as much.
const STOPPED: Duration = Duration::from_secs(1);

/// The last sign of life `seen`, moved forward by the time the sandbox was
/// stopped during a wait from `asleep` until `now` that asked for `asked`.
fn discount_stopped(seen: Instant, asleep: Instant, now: Instant, asked: Duration) -> Instant {
    let slept = now.saturating_duration_since(asleep);
    if slept > asked + STOPPED {
        seen + (slept - asked)
    } else {
        seen
    }
}

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
            let asked = (self.grace - idle).min(SLICE);
            let asleep = Instant::now();
            seen = self
                .changed
                .wait_timeout(seen, asked)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            *seen = discount_stopped(*seen, asleep, Instant::now(), asked);
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
    fn time_stopped_is_not_idle_time() {
        let t0 = Instant::now();
        let asked = Duration::from_secs(1);
        // A wait that took its second, or a little more on a loaded machine.
        let late = t0 + Duration::from_millis(1900);
        assert_eq!(discount_stopped(t0, t0, late, asked), t0);
        // One that took a minute: the sandbox was stopped for 59 s.
        let restored = t0 + Duration::from_secs(60);
        assert_eq!(
            discount_stopped(t0, t0, restored, asked),
            t0 + Duration::from_secs(59)
        );
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
