//! Turning an Exec request into a running process.
//!
//! Every command gets its own process group (so a signal or a kill reaches
//! what it started), a clean signal state (the agent blocks signals that its
//! children must not inherit), and pipes the agent reads with `poll`. Failures
//! are reported as one message naming what could not be used, because the
//! bare OS error ("No such file or directory") does not say whether the
//! program or the working directory is missing.
//!
//! A command's environment is the agent's own (the image's, as the engine
//! started PID 1), then the sandbox's (from the session's Hello), then the
//! command's own: each overrides the one before.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use corral_core::protocol::ExecRequest;

use crate::control::Control;
use crate::pristine::Pristine;
use crate::reaper::Reaper;
use crate::sys;

/// A started command: its pid (also its process group id) and our ends of
/// its pipes, all non-blocking.
#[derive(Debug)]
pub struct Spawned {
    /// Pid of the main process, and id of its process group.
    pub pid: i32,
    /// Write end of its stdin, when it has one.
    pub stdin: Option<File>,
    /// Read end of its stdout.
    pub stdout: File,
    /// Read end of its stderr; `None` on a terminal, where stdout carries
    /// both.
    pub stderr: Option<File>,
    /// The terminal's master when it runs on one (its stdin and stdout
    /// are the same), for resizing.
    pub pty: Option<File>,
    /// Just before the spawn; durations are measured from here.
    pub started: Instant,
}

/// `RLIMIT_NPROC` of every command (`init --nproc`), fixed before the
/// first command so the spawn path only reads it.
static NPROC: OnceLock<u64> = OnceLock::new();

/// Sets the `RLIMIT_NPROC` every command runs with: soft and hard, so no
/// command can raise it again without CAP_SYS_RESOURCE, which commands do
/// not hold. The agent keeps its own (unlimited), so it can always start
/// the threads that serve, time out and kill commands.
pub fn limit_processes(n: Option<u64>) {
    if let Some(n) = n {
        let _ = NPROC.set(n);
    }
}

/// Expands `~` and `~/...` with `home` (`/` when unset or empty).
pub fn expand_cwd(cwd: &str, home: Option<&OsStr>) -> PathBuf {
    let home = || match home {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => PathBuf::from("/"),
    };
    if cwd == "~" {
        home()
    } else if let Some(rest) = cwd.strip_prefix("~/") {
        home().join(rest)
    } else {
        PathBuf::from(cwd)
    }
}

/// The `HOME` a command sees: its own, else the sandbox's, else the
/// agent's (`~` in a working directory expands to it).
fn home<'a>(sandbox_env: &'a [(String, String)], req: &'a ExecRequest) -> Option<&'a OsStr> {
    let find = |env: &'a [(String, String)]| {
        env.iter()
            .rev()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| OsStr::new(v.as_str()))
    };
    find(&req.env).or_else(|| find(sandbox_env))
}

/// Starts `req` with the sandbox's environment `sandbox_env` under its own
/// and registers it with `reaper`, whose status then goes to `ctl`. In a
/// sandbox started for in-place reset the command enters the current world
/// of `pristine`; it always loses the capabilities the agent holds for
/// itself (`caps`).
/// `Err` is the SpawnFailed message.
pub fn spawn(
    reaper: &Reaper,
    pristine: &Pristine,
    sandbox_env: &[(String, String)],
    req: &ExecRequest,
    ctl: Arc<Control>,
) -> Result<Spawned, String> {
    let Some(program) = req.argv.first() else {
        return Err("argv is empty: nothing to run".to_string());
    };
    let agent_home = std::env::var_os("HOME");
    let home = home(sandbox_env, req).or(agent_home.as_deref());
    // The agent's own capabilities (the reset's, and those it holds to
    // run commands under another uid).
    let own = crate::caps::agent_only();
    let (plan, kernel_as) = if req.relay {
        relay_checks(req)?;
        crate::ids::relay_plan(&own.caps)
    } else {
        (crate::ids::command_plan(), None)
    };
    // A relay is the agent's own binary, whatever the sandbox's files say.
    let mut cmd = if req.relay {
        let mut c = Command::new("/proc/self/exe");
        c.arg0(program);
        c
    } else {
        Command::new(program)
    };
    cmd.args(&req.argv[1..])
        .envs(sandbox_env.iter().map(|(k, v)| (k, v)))
        .envs(req.env.iter().map(|(k, v)| (k, v)));
    cmd.env_remove(crate::ids::KERNEL_AS_ENV);
    if let Some(value) = &kernel_as {
        cmd.env(crate::ids::KERNEL_AS_ENV, value);
    }
    let mut sockets = None;
    let master = match req.pty {
        Some(size) => {
            size.validate()?;
            let (master, slave) = sys::open_pty(size.cols, size.rows)
                .map_err(|e| format!("cannot open a pseudo-terminal: {e}"))?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| format!("cannot open a pseudo-terminal: {e}"))
            };
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            // A terminal program expects TERM; the sandbox's or the
            // command's own wins.
            if !sandbox_env.iter().chain(&req.env).any(|(k, _)| k == "TERM") {
                cmd.env("TERM", "xterm-256color");
            }
            // The child leads a session of its own (and so a process group
            // with its pid as id, as for every command): setsid in
            // pre_exec, which a group set here would make fail.
            Some(File::from(master))
        }
        None if req.relay => {
            // Sockets, not pipes: `/proc/PID/fd` cannot reopen a socket,
            // so no process of the sandbox can write into a relay's
            // stream or read from it, under any runtime (gVisor checks
            // only the file's own mode there, and a pipe is root's).
            let RelaySockets { child, ours } =
                relay_sockets().map_err(|e| format!("cannot run {program:?}: {e}"))?;
            let [i, o, e] = child;
            cmd.stdin(Stdio::from(i))
                .stdout(Stdio::from(o))
                .stderr(Stdio::from(e))
                .process_group(0);
            sockets = Some(ours);
            None
        }
        None => {
            cmd.stdin(if req.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
            None
        }
    };
    let on_terminal = master.is_some();

    // Held until the child exists, so no reset closes the world meanwhile.
    let world = pristine.enter(reaper)?;
    let mut enter: Option<(RawFd, CString)> = None;
    if let Some(w) = world.as_ref() {
        let dir = match &req.cwd {
            Some(cwd) => w.check_dir(&expand_cwd(cwd, home))?,
            None => w.cwd.clone(),
        };
        let dir = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| format!("working directory {} contains a NUL byte", dir.display()))?;
        enter = Some((w.ns(), dir));
    } else if let Some(cwd) = &req.cwd {
        let dir = expand_cwd(cwd, home);
        // Checked here (as the same user the child runs as) so the message
        // can say it is the directory that is wrong, not the program.
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "working directory {} is not a directory",
                    dir.display()
                ))
            }
            Err(e) => return Err(format!("working directory {}: {e}", dir.display())),
        }
        cmd.current_dir(dir);
    }

    let filters = crate::confine::filters();
    let nproc = NPROC.get().copied();
    let becomes_root = plan.root();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (open/write/close, sigemptyset, pthread_sigmask,
    // signal, setrlimit, prctl, setns, chdir, capget/capset, seccomp); it does not
    // allocate or touch locks (the filter was built before any command and
    // is only read; the world's path was made above).
    unsafe {
        cmd.pre_exec(move || {
            sys::prefer_oom_kill_in_child();
            sys::reset_signals_in_child()?;
            if on_terminal {
                sys::take_terminal_in_child()?;
            }
            if let Some(n) = nproc {
                sys::limit_processes_in_child(n)?;
            }
            if let Some((ns, dir)) = &enter {
                sys::setns_mount(*ns)?;
                sys::chdir(dir)?;
            }
            plan.apply_in_child(&own.caps, own.bounding)?;
            if let crate::ids::Plan::Relay { .. } = plan {
                // Settled by the plan: it keeps what its kernel needs.
            } else {
                if !own.caps.is_empty() {
                    sys::drop_caps_in_child(&own.caps, own.bounding)?;
                }
                if !becomes_root {
                    crate::ids::clear_caps_in_child()?;
                }
            }
            for f in filters.into_iter().flatten() {
                seccompiler::apply_filter(f).map_err(|_| std::io::Error::last_os_error())?;
            }
            Ok(())
        });
    }

    let started = Instant::now();
    let spawned = reaper.spawn(&mut cmd, ctl);
    drop(world);
    let mut child = spawned.map_err(|e| format!("cannot run {program:?}: {e}"))?;
    // Pids fit in i32 on Linux (pid_max <= 2^22).
    let pid = child.id() as i32;
    // The slave's copies in `cmd` close here: the terminal reports EOF
    // (EIO) once the command's processes have all closed it.
    drop(cmd);
    let ends = match (&master, sockets) {
        (Some(m), _) => terminal_ends(m).map_err(|e| format!("cannot run {program:?}: {e}")),
        (None, Some([i, o, e])) => {
            // Without stdin, ours closes here: the relay reads its end.
            let stdin = req.stdin.then(|| File::from(i));
            Ok((stdin, File::from(o), Some(File::from(e))))
        }
        (None, None) => pipe_ends(&mut child).ok_or_else(|| {
            // Cannot happen: both were asked for as pipes.
            format!("cannot run {program:?}: output pipes missing")
        }),
    };
    // `child` is dropped without waiting: the reaper owns reaping.
    drop(child);
    let (stdin, stdout, stderr) = match ends {
        Ok(ends) => ends,
        Err(message) => {
            // Do not leave a process nobody watches.
            reaper.forget(pid);
            crate::tree::kill_tree(pid);
            return Err(message);
        }
    };

    // Non-blocking so a stalled reader never holds the supervisor: only the
    // agent's ends change (pipe ends are separate open file descriptions).
    for fd in [
        Some(stdout.as_fd()),
        stderr.as_ref().map(|f| f.as_fd()),
        stdin.as_ref().map(|f| f.as_fd()),
    ]
    .into_iter()
    .flatten()
    {
        // Cannot fail on a pipe we own; if it did, reads after poll are still
        // correct, just potentially blocking.
        let _ = sys::set_nonblocking(fd);
    }
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr,
        pty: master,
        started,
    })
}

/// A relay's stdin, stdout and stderr: socket pairs, the child's ends
/// (given to the `Command`, closed here once it is spawned) and ours.
struct RelaySockets {
    child: [OwnedFd; 3],
    ours: [OwnedFd; 3],
}

fn relay_sockets() -> std::io::Result<RelaySockets> {
    let pair = || {
        std::os::unix::net::UnixStream::pair().map(|(a, b)| (OwnedFd::from(a), OwnedFd::from(b)))
    };
    let (a0, b0) = pair()?;
    let (a1, b1) = pair()?;
    let (a2, b2) = pair()?;
    Ok(RelaySockets {
        child: [a0, a1, a2],
        ours: [b0, b1, b2],
    })
}

/// A relay is `corral-agent kernel LANGUAGE` on pipes: what the host asks
/// for under a relay uid, which keeps CAP_SETUID, CAP_SETGID and CAP_KILL.
fn relay_checks(req: &ExecRequest) -> Result<(), String> {
    let is_kernel = matches!(&req.argv[..], [agent, sub, _] if agent == corral_core::protocol::AGENT_PATH && sub == "kernel");
    if !is_kernel {
        return Err(format!(
            "relay: only `{} kernel LANGUAGE` runs as a relay, not {:?}",
            corral_core::protocol::AGENT_PATH,
            req.argv
        ));
    }
    if req.pty.is_some() {
        return Err("relay: a relay does not run on a terminal".into());
    }
    Ok(())
}

/// Stdin, stdout and stderr of a command on pipes.
type Ends = (Option<File>, File, Option<File>);

/// Our ends of a piped child's stdin (if any), stdout and stderr.
fn pipe_ends(child: &mut std::process::Child) -> Option<Ends> {
    let stdin = child.stdin.take().map(|s| File::from(OwnedFd::from(s)));
    let stdout = File::from(OwnedFd::from(child.stdout.take()?));
    let stderr = File::from(OwnedFd::from(child.stderr.take()?));
    Some((stdin, stdout, Some(stderr)))
}

/// A terminal's master as the command's input and output (one stream: the
/// terminal merges stdout and stderr).
fn terminal_ends(master: &File) -> std::io::Result<Ends> {
    Ok((Some(master.try_clone()?), master.try_clone()?, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_home() {
        let home = Some(OsStr::new("/home/u"));
        assert_eq!(expand_cwd("~", home), PathBuf::from("/home/u"));
        assert_eq!(expand_cwd("~/src/x", home), PathBuf::from("/home/u/src/x"));
        assert_eq!(expand_cwd("/tmp", home), PathBuf::from("/tmp"));
        // `~user` is not ours to resolve: left alone.
        assert_eq!(expand_cwd("~bob", home), PathBuf::from("~bob"));
        assert_eq!(expand_cwd("~", None), PathBuf::from("/"));
        assert_eq!(expand_cwd("~/a", Some(OsStr::new(""))), PathBuf::from("/a"));
    }

    #[test]
    fn home_is_the_commands_then_the_sandboxs() {
        let mut req = ExecRequest {
            argv: vec!["true".into()],
            cwd: None,
            env: Vec::new(),
            stdin: false,
            timeout_ms: None,
            max_output: 0,
            exclusive: false,
            wait_for_output: false,
            pty: None,
            relay: false,
        };
        let sandbox = [("HOME".to_string(), "/home/sb".to_string())];
        assert_eq!(home(&[], &req), None);
        assert_eq!(home(&sandbox, &req), Some(OsStr::new("/home/sb")));
        req.env = vec![("HOME".into(), "/home/cmd".into())];
        assert_eq!(home(&sandbox, &req), Some(OsStr::new("/home/cmd")));
    }
}
