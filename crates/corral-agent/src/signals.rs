//! Signals sent to the container reach the processes inside.
//!
//! The kernel gives PID 1 no default signal actions, so `docker stop`'s
//! SIGTERM would do nothing but wait for the daemon's SIGKILL. The agent
//! blocks the usual signals in every thread, collects them here with
//! `sigwaitinfo`, and forwards each to every process in the sandbox. SIGTERM
//! and SIGINT also stop the sandbox: after a short grace for processes to
//! exit on their own, the rest are killed and the agent exits 0.
//!
//! Only signals from outside the sandbox count (the daemon's `docker stop`
//! and `docker kill`: their sender is invisible in the sandbox's pid
//! namespace, so its pid reads 0). A command that signals PID 1 is ignored:
//! otherwise a failing command could stop its own sandbox and be reported as
//! a lost container, an infrastructure error that trainers retry. (SIGKILL
//! and SIGSTOP from inside never reach a namespace's init at all.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::sys;
use crate::tree;

/// How long processes get to exit after a forwarded SIGTERM/SIGINT.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How often the stop grace checks whether processes remain.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Lets supervisors write the Exited frames of commands the signal ended
/// before the process (and with it every connection) goes away.
const FLUSH_PAUSE: Duration = Duration::from_millis(50);

static STOPPING: AtomicBool = AtomicBool::new(false);

/// Signals from inside the sandbox ignored so far (only the first few are
/// logged).
static IGNORED: AtomicUsize = AtomicUsize::new(0);

/// True once a SIGTERM/SIGINT started stopping the sandbox: new commands
/// would only be killed moments later, so they are refused.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Forwards signals forever; exits the process on SIGTERM/SIGINT.
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
        let stop_now = sig == libc::SIGTERM || sig == libc::SIGINT;
        if stop_now {
            STOPPING.store(true, Ordering::Relaxed);
        }
        // kill(-1) from PID 1 reaches every process but PID 1 itself. ESRCH
        // (nobody else exists) is fine.
        let _ = sys::kill(-1, sig);
        if stop_now {
            stop(sig);
        }
    }
}

fn stop(sig: libc::c_int) -> ! {
    let until = Instant::now() + STOP_GRACE;
    while tree::others_running() && Instant::now() < until {
        std::thread::sleep(STOP_POLL);
    }
    let left = tree::others_running();
    eprintln!(
        "corral-agent: stopping on signal {sig}{}",
        if left {
            "; killing processes still running"
        } else {
            ""
        }
    );
    std::thread::sleep(FLUSH_PAUSE);
    let _ = sys::kill(-1, libc::SIGKILL);
    std::process::exit(0);
}
