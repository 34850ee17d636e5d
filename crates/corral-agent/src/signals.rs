//! Signals sent to the container reach the processes inside.
//!
//! The kernel gives PID 1 no default signal actions, so `docker stop`'s
//! SIGTERM would do nothing at all. The agent blocks the usual signals in
//! every thread, collects them here with `sigwaitinfo`, and forwards each to
//! every process in the sandbox, so `docker stop` ends the commands and the
//! daemon's SIGKILL after the stop timeout ends the sandbox.
//!
//! The agent itself never stops on a signal. A signal sent from inside the
//! sandbox shows its sender's pid and is ignored; one from outside (the
//! daemon) shows pid 0, but so can a forged one: a command that exhausts the
//! pending-signal quota of PID 1's user makes `sigqueue` deliver without
//! sender details. Forwarding such a signal gives a command nothing it
//! could not do with `kill -1` itself; stopping on it would let a failing
//! command stop its own sandbox and be reported as a lost container, an
//! infrastructure error that trainers retry. (SIGKILL and SIGSTOP from
//! inside never reach a namespace's init at all.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::sys;

/// Signals from inside the sandbox ignored so far (only the first few are
/// logged).
static IGNORED: AtomicUsize = AtomicUsize::new(0);

/// Forwards signals from outside the sandbox forever.
pub fn run() -> ! {
    loop {
        let sig = match sys::sigwaitinfo(&sys::FORWARDED) {
            Ok((s, 0)) => s,
            Ok((s, sender)) => {
                if IGNORED.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("corral-agent: ignoring signal {s} sent to PID 1 by process {sender} inside the sandbox");
                }
                continue;
            }
            Err(e) => {
                // Cannot happen with a valid set; avoid spinning if it does.
                eprintln!("corral-agent: sigwait failed: {e}");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        // kill(-1) from PID 1 reaches every process but PID 1 itself. ESRCH
        // (nobody else exists) is fine.
        let _ = sys::kill(-1, sig);
    }
}
