//! The dead-man switch: no controller, no sandbox.
//!
//! corral holds one connection to the agent for as long as it uses the
//! sandbox. If corral dies without cleaning up (SIGKILL, OOM, a crashed
//! host-side process), the connection drops and nobody would ever stop what
//! runs in the container. So when no client has been connected for the grace
//! period (counted from the agent's start until the first client arrives),
//! the agent kills everything and exits, which stops the container.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::lock;
use crate::sys;

#[derive(Debug)]
struct State {
    clients: usize,
    /// When the client count last dropped to zero (or the agent started).
    idle_since: Instant,
}

/// Counts connected clients and fires after `grace` without any.
#[derive(Debug)]
pub struct DeadMan {
    state: Mutex<State>,
    changed: Condvar,
    grace: Duration,
}

/// Held while a client is connected; dropping it disconnects the client.
#[derive(Debug)]
pub struct ClientGuard(Arc<DeadMan>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.clients = s.clients.saturating_sub(1);
        if s.clients == 0 {
            s.idle_since = Instant::now();
        }
        self.0.changed.notify_all();
    }
}

impl DeadMan {
    /// A switch with the given grace; the idle clock starts now.
    pub fn new(grace: Duration) -> Arc<Self> {
        Arc::new(DeadMan {
            state: Mutex::new(State {
                clients: 0,
                idle_since: Instant::now(),
            }),
            changed: Condvar::new(),
            grace,
        })
    }

    /// Records a connected client until the guard is dropped.
    pub fn client_connected(self: &Arc<Self>) -> ClientGuard {
        lock(&self.state).clients += 1;
        self.changed.notify_all();
        ClientGuard(self.clone())
    }

    /// Blocks until the grace period passes with no client; returns how long
    /// the sandbox was unattended.
    pub fn wait_expired(&self) -> Duration {
        let mut s = lock(&self.state);
        loop {
            if s.clients > 0 {
                s = self
                    .changed
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            let idle = s.idle_since.elapsed();
            if idle >= self.grace {
                return idle;
            }
            s = self
                .changed
                .wait_timeout(s, self.grace - idle)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Runs the switch: waits, then kills every process and exits. Never
    /// returns.
    pub fn run(&self) -> ! {
        let idle = self.wait_expired();
        eprintln!(
            "corral-agent: no client connected for {} ms (grace {} ms): killing all processes and exiting",
            idle.as_millis(),
            self.grace.as_millis()
        );
        // As PID 1, kill(-1) reaches every other process in the namespace.
        let _ = sys::kill(-1, libc::SIGKILL);
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_only_after_grace_without_clients() {
        let d = DeadMan::new(Duration::from_millis(100));
        let t0 = Instant::now();
        let guard = d.client_connected();
        let d2 = d.clone();
        let waiter = std::thread::spawn(move || d2.wait_expired());
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "fired while a client was connected");
        drop(guard);
        let idle = waiter.join().expect("waiter");
        assert!(idle >= Duration::from_millis(100));
        assert!(t0.elapsed() >= Duration::from_millis(300));
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
