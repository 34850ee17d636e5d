//! The door: under gVisor, commands get a PID namespace and a `/proc` of
//! their own, and no process they can see holds the engine's pipes.
//!
//! gVisor's procfs reopens `/proc/PID/fd/N` checking only the open file's
//! own mode, with no ptrace-style check of the process holding it (the
//! runsc here, 2022-12). PID 1's stdin and stdout are the engine's pipes,
//! owned by root, so a command running as root (`DAC_OVERRIDE`) could
//! open the agent's stream and write frames into it, whatever the agent's
//! uid or dumpable flag. A socket cannot be reopened that way (`ENXIO`,
//! under gVisor as under Linux), and a process in an ancestor PID
//! namespace has no pid a command can name.
//!
//! So, asked to (`init --pid-ns`), PID 1 splits in two before anything
//! else runs: it forks the agent into a PID namespace of its own, where
//! it is PID 1, mounts a fresh `/proc` over the old one (gVisor has one mount namespace per sandbox; the old
//! `/proc` is covered for everyone), drops `CAP_SYS_ADMIN` from every set
//! so no command can uncover it, and runs as before with sockets as its
//! stdin, stdout and stderr. The parent, the door, stays PID 1 of the
//! container: it copies bytes between the engine's pipes and those
//! sockets, forwards the engine's signals to the agent and ends with the
//! agent's status. Nothing a command can name holds a pipe: the agent's
//! are sockets, the door has no pid in the commands' namespace.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::caps::CAP_SYS_ADMIN;
use crate::sys;

/// How long the door waits for the agent's last output once it ended.
const DRAIN: Duration = Duration::from_secs(2);

/// Why PID 1 did not split when asked to; see [`integrity_gap`].
static GAP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Why the agent could not keep its stream out of commands' reach when
/// asked to split (the handshake reports it): it started as a user, not
/// root (an image's `USER`), so it has no right to the namespace and
/// commands share its uid anyway.
pub fn integrity_gap() -> Option<String> {
    GAP.get().cloned()
}

/// Splits PID 1 (see the module's comment). Returns in the agent, PID 1
/// of the commands' namespace, with its stdin, stdout and stderr on
/// sockets; in the door it never returns. `keep_admin`: the agent keeps
/// `CAP_SYS_ADMIN` (its in-place reset drops it from commands itself).
/// A PID 1 that did not start as root cannot split: it goes on as before
/// and says why ([`integrity_gap`]). `Err` with an exit code when a root
/// PID 1 cannot split: the sandbox must not start without it.
pub fn split(keep_admin: bool) -> Result<(), i32> {
    let (_, euid, _) = sys::getresuid();
    if euid != 0 {
        let why = format!(
            "isolation gvisor: the sandbox started as uid {euid}, not root (the image's USER), so \
             the agent shares commands' PID namespace: results are not integrity-protected (a \
             command of its uid can open its stream through /proc/1/fd)"
        );
        eprintln!("corral-agent: {why}");
        let _ = GAP.set(why);
        return Ok(());
    }
    let (ctl_door, ctl_agent) = pair("the control stream")?;
    let (err_door, err_agent) = pair("standard error")?;
    // The door's signals are blocked before the agent exists, so neither
    // its end nor the engine's signals can come before the door waits for
    // them; the agent gets the mask it had back.
    let mut waited = sys::FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let before = match sys::block_signals(&waited) {
        Ok(before) => before,
        Err(e) => {
            eprintln!("corral-agent: the door cannot block signals: {e}");
            return Err(1);
        }
    };
    // clone(CLONE_NEWPID) as a fork: the child alone enters the new
    // namespace (after unshare(CLONE_NEWPID) the door could start no
    // thread: a thread must share its process's namespace for children).
    // SAFETY: a fork-like clone with no new stack; the process has one
    // thread (init runs this before any), so the child may run ordinary
    // code.
    let child = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWPID | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if child < 0 {
        let e = io::Error::last_os_error();
        eprintln!("corral-agent: cannot start the agent in a PID namespace of its own: {e}");
        return Err(1);
    }
    let child = child as i32;
    if child == 0 {
        drop((ctl_door, err_door));
        if let Err(e) = sys::set_signal_mask(&before) {
            eprintln!("corral-agent: cannot give the agent its signal mask back: {e}");
            return Err(1);
        }
        return become_agent(ctl_agent, err_agent, keep_admin);
    }
    drop((ctl_agent, err_agent));
    let code = door(child, &waited, ctl_door, err_door);
    std::process::exit(code);
}

/// A connected pair of stream sockets, closed on exec.
fn pair(what: &str) -> Result<(UnixStream, UnixStream), i32> {
    UnixStream::pair().map_err(|e| {
        eprintln!("corral-agent: cannot make a socket pair for {what}: {e}");
        1
    })
}

/// The child's half: `/proc` of the new namespace, no `CAP_SYS_ADMIN`,
/// sockets as stdio.
fn become_agent(ctl: UnixStream, err: UnixStream, keep_admin: bool) -> Result<(), i32> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if let Err(e) = sys::mount(Some(c"proc"), c"/proc", Some(c"proc"), flags, None) {
        eprintln!("corral-agent: cannot mount /proc for the commands' PID namespace: {e}");
        return Err(1);
    }
    if !keep_admin {
        if let Err(e) = drop_admin() {
            eprintln!("corral-agent: cannot drop CAP_SYS_ADMIN after mounting /proc: {e}");
            return Err(1);
        }
    }
    for (from, to) in [
        (ctl.as_raw_fd(), 0),
        (ctl.as_raw_fd(), 1),
        (err.as_raw_fd(), 2),
    ] {
        // SAFETY: dup2 on descriptors this process owns; the new ones do
        // not close on exec, as stdio must not.
        if unsafe { libc::dup2(from, to) } == -1 {
            let e = io::Error::last_os_error();
            eprintln!("corral-agent: cannot make a socket descriptor {to}: {e}");
            return Err(1);
        }
    }
    Ok(())
}

/// Removes `CAP_SYS_ADMIN` from the bounding set (no command can get it
/// back) and from the agent's own sets (the ambient set is emptied, as
/// for every command), and checks it is gone.
fn drop_admin() -> io::Result<()> {
    let bit = 1u64 << CAP_SYS_ADMIN;
    sys::drop_caps_in_child(&[CAP_SYS_ADMIN], true)?;
    let now = sys::capget()?;
    if (now.effective | now.permitted) & bit != 0 {
        return Err(io::Error::other("still held"));
    }
    Ok(())
}

/// The door's life: pumps and signals until the agent ends; its exit
/// status.
fn door(agent: i32, waited: &[libc::c_int], ctl: UnixStream, err: UnixStream) -> i32 {
    let started = (|| -> io::Result<_> {
        let named = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let ctl_in = ctl
            .try_clone()
            .map_err(|e| named("the control socket", e))?;
        let engine_in = dup_file(io::stdin().as_fd()).map_err(|e| named("stdin", e))?;
        let engine_out = dup_file(io::stdout().as_fd()).map_err(|e| named("stdout", e))?;
        let engine_err = dup_file(io::stderr().as_fd()).map_err(|e| named("stderr", e))?;
        // Engine → agent. At the engine's end of stdin, the agent reads its
        // end too, as it would have on the pipe.
        spawn("door-in", move || {
            let _ = io::copy(&mut &engine_in, &mut &ctl_in);
            let _ = ctl_in.shutdown(std::net::Shutdown::Write);
        })?;
        // Agent → engine. When the engine's end goes, the agent's writes
        // fail as they would have on the pipe, rather than block.
        let out = spawn("door-out", move || {
            let _ = io::copy(&mut &ctl, &mut &engine_out);
            let _ = ctl.shutdown(std::net::Shutdown::Both);
        })?;
        let err = spawn("door-err", move || {
            let _ = io::copy(&mut &err, &mut &engine_err);
        })?;
        Ok((out, err))
    })();
    let (out, err) = match started {
        Ok(joins) => joins,
        Err(e) => {
            eprintln!("corral-agent: the door cannot start: {e}");
            let _ = sys::kill(agent, libc::SIGKILL);
            return 1;
        }
    };
    let status = loop {
        // An agent that ended before the door first waited is reaped too.
        if let Some(status) = reap_all(agent) {
            break status;
        }
        match sys::sigwaitinfo(waited) {
            Ok((libc::SIGCHLD, _)) => {}
            Ok((sig, _)) => {
                let _ = sys::kill(agent, sig);
            }
            Err(e) => {
                eprintln!("corral-agent: the door cannot wait for signals: {e}");
                let _ = sys::kill(agent, libc::SIGKILL);
            }
        }
    };
    // The agent's last words (its sockets closed with its namespace).
    let until = std::time::Instant::now() + DRAIN;
    for join in [out, err] {
        while !join.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let _ = io::stdout().flush();
    match sys::ExitStatus::from_raw(status) {
        sys::ExitStatus::Code(code) => code,
        sys::ExitStatus::Signal(sig) => 128 + sig,
    }
}

/// Reaps every child that ended; the agent's raw status once it did.
fn reap_all(agent: i32) -> Option<libc::c_int> {
    let mut agent_status = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status through a valid pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return agent_status;
        }
        if pid == agent {
            agent_status = Some(status);
        }
    }
}

/// A descriptor of the engine's (stdio), duplicated into a file the
/// door owns.
fn dup_file(fd: BorrowedFd<'_>) -> io::Result<File> {
    fd.try_clone_to_owned().map(File::from)
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| io::Error::new(e.kind(), format!("thread {name}: {e}")))
}
