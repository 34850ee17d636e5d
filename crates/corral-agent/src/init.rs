//! `corral-agent init`: the agent as PID 1 of a sandbox.
//!
//! Wires the parts together in the one order that is correct: signals are
//! blocked before any thread exists (threads inherit the mask, and a signal
//! delivered to a thread that does not block it would be lost to PID 1's
//! "no default action" rule), then the reaper, the signal forwarder and the
//! dead-man switch start, and finally the socket accepts clients.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::time::Duration;

use corral_core::protocol::AGENT_SOCKET;

use crate::deadman::DeadMan;
use crate::oom::OomCounter;
use crate::reaper::Reaper;
use crate::server::{self, Shared};
use crate::{signals, sys};

/// Options of `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitOptions {
    /// Time without any client after which everything is killed.
    pub grace: Duration,
}

/// Default grace of the dead-man switch.
pub const DEFAULT_GRACE_MS: u64 = 30_000;

/// Runs PID 1 mode; returns only on a setup failure, with the exit code.
pub fn run(opts: &InitOptions) -> i32 {
    let pid = sys::getpid();
    if pid != 1 {
        // kill(-1, ...) from anywhere but a container's PID 1 would signal
        // every process of the user on the host.
        eprintln!(
            "corral-agent: init must run as PID 1 of a container (it signals every process it can see); this is pid {pid}"
        );
        return 2;
    }
    if let Err(e) = sys::block_signals(&sys::FORWARDED) {
        eprintln!("corral-agent: cannot block signals: {e}");
        return 1;
    }

    let listener = match bind() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("corral-agent: cannot listen on abstract socket @{AGENT_SOCKET}: {e}");
            return 1;
        }
    };

    let reaper = Reaper::new();
    let deadman = DeadMan::new(opts.grace);
    let started = start("reaper", {
        let r = reaper.clone();
        move || r.run()
    })
    .and_then(|()| start("signals", || signals::run()))
    .and_then(|()| {
        let d = deadman.clone();
        start("deadman", move || d.run())
    });
    if let Err(message) = started {
        eprintln!("corral-agent: {message}");
        return 1;
    }

    let shared = Shared {
        reaper,
        deadman,
        oom: OomCounter::detect(),
    };
    accept_loop(&listener, &shared)
}

/// Starts a thread that runs for the life of the agent.
fn start(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| format!("cannot start the {name} thread: {e}"))
}

fn bind() -> std::io::Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(AGENT_SOCKET.as_bytes())?;
    UnixListener::bind_addr(&addr)
}

fn accept_loop(listener: &UnixListener, shared: &Shared) -> ! {
    loop {
        match listener.accept() {
            Ok((stream, _)) => server::serve(stream, shared.clone()),
            Err(e) => {
                // EMFILE and friends: back off so the loop does not spin,
                // the condition usually clears as commands finish.
                eprintln!("corral-agent: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
