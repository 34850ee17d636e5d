//! `corral-agent init`: the agent as PID 1 of a sandbox.
//!
//! Wires the parts together in the one order that is correct: the process
//! becomes non-dumpable before anything else runs in the sandbox (so no
//! command can ptrace it or open its stdin, stdout or memory through
//! `/proc/1`) and takes a uid of its own (`ids`: commands run as the
//! sandbox's user, which cannot signal or trace another uid), signals are blocked before any thread exists (threads inherit
//! the mask, and a signal delivered to a thread that does not block it would
//! be lost to PID 1's "no default action" rule), then the reaper, the signal
//! forwarder and the dead-man switch start, and finally stdin is served (or,
//! when started to listen on a TCP port, authenticated connections are).

use std::fs::File;
use std::os::fd::AsFd;
use std::time::Duration;

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
    /// Started for in-place reset (`--pristine`), with this `size=` for
    /// the tmpfs holding the changes (`--pristine-size`).
    pub pristine: Option<Option<u64>>,
    /// Why the engine could not start the sandbox for in-place reset
    /// (`--pristine-refused`): the handshake says so, as it says why an
    /// agent started with `--pristine` cannot.
    pub pristine_refused: Option<String>,
    /// Capabilities the container holds for PID 1 alone
    /// (`--agent-caps`): every command drops them.
    pub agent_caps: Vec<u32>,
    /// `RLIMIT_NPROC` for every command (`--nproc`): the sandbox's
    /// process limit where the engine's pids cgroup cannot be it (gVisor,
    /// whose own host tasks fill that cgroup).
    pub nproc: Option<u64>,
    /// Splits PID 1 (`--pid-ns`, `door`): the agent and commands in a PID
    /// namespace and a `/proc` of their own, behind a door that holds the
    /// engine's pipes.
    pub pid_ns: bool,
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
    if opts.pid_ns {
        // Before anything else: from here on this is the agent, PID 1 of
        // the commands' namespace (the door never returns).
        if let Err(code) = crate::door::split(opts.pristine.is_some()) {
            return code;
        }
    }
    if let Err(e) = sys::set_non_dumpable() {
        // Without it, any command could write frames into our stdout.
        eprintln!("corral-agent: cannot make PID 1 non-dumpable: {e}");
        return 1;
    }
    // Before any thread: a uid of its own, which commands do not share.
    if let Err(e) = crate::ids::init() {
        eprintln!("corral-agent: cannot take the agent's own uid: {e}");
        return 1;
    }
    // Before any thread: the environment is not thread-safe, and no
    // command may inherit the secret.
    let listen = match crate::listen::take_from_env() {
        Ok(l) => l,
        Err(message) => {
            eprintln!("corral-agent: {message}");
            return 2;
        }
    };
    let filtered = match crate::confine::init(opts.pristine.is_some()) {
        Ok(true) => true,
        Ok(false) => {
            eprintln!(
                "corral-agent: no-new-privileges is off: commands run without the agent's seccomp filter"
            );
            false
        }
        Err(e) => {
            eprintln!("corral-agent: cannot build the seccomp filter for commands: {e}");
            return 1;
        }
    };
    // Before any thread: it may give PID 1 a mount namespace of its own.
    let pristine = match (opts.pristine, &opts.pristine_refused) {
        (Some(size), _) => crate::pristine::init(size, filtered),
        (None, Some(reason)) => crate::pristine::Pristine::refused(reason.clone()),
        (None, None) => crate::pristine::Pristine::off(),
    };
    crate::caps::init(&opts.agent_caps, pristine.holds_extra_caps());
    crate::command::limit_processes(opts.nproc);
    // Before any command can change them.
    crate::tunables::record();
    if let Err(e) = sys::block_signals(&sys::FORWARDED) {
        eprintln!("corral-agent: cannot block signals: {e}");
        return 1;
    }

    // Bound before the first controller can ask for a command, so nothing
    // in the sandbox can take the port first.
    let listener = match &listen {
        Some(l) => match crate::listen::bind(l.port) {
            Ok(listener) => Some(listener),
            Err(e) => {
                eprintln!("corral-agent: cannot listen on port {}: {e}", l.port);
                return 1;
            }
        },
        None => None,
    };

    let stdio = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|i| Ok((i, std::io::stdout().as_fd().try_clone_to_owned()?)));
    let (stdin, stdout) = match stdio {
        Ok((i, o)) => (File::from(i), File::from(o)),
        Err(e) => {
            eprintln!("corral-agent: cannot take over stdin/stdout: {e}");
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
    .and_then(|()| start("watchdog", || crate::watchdog::run()))
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
        pristine: std::sync::Arc::new(pristine),
    };
    if let (Some(listener), Some(l)) = (listener, listen) {
        drop((stdin, stdout));
        let e = crate::listen::serve(shared, listener, l.secret);
        // The dead-man switch stops the sandbox once the grace passes.
        eprintln!("corral-agent: the control port stopped accepting: {e}");
        loop {
            std::thread::park();
        }
    }
    server::serve_stdio(shared, stdin, stdout);
    // stdin ended: the daemon closed it (the container is being torn down).
    // The dead-man switch stops the sandbox once the grace passes.
    loop {
        std::thread::park();
    }
}

/// Starts a thread that runs for the life of the agent.
fn start(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| format!("cannot start the {name} thread: {e}"))
}
