//! A command to run in a sandbox.

use std::time::Duration;

use crate::protocol::PtySize;

/// Default per-stream output budget: 1 MiB (half head, half tail).
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory (`~` expands to the sandbox user's home); `None` is
    /// the sandbox's working directory.
    pub cwd: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Bytes fed to stdin; `None` gives the command an immediate EOF.
    pub stdin: Option<Vec<u8>>,
    /// Kill the whole process tree after this long.
    pub timeout: Option<Duration>,
    /// Bytes kept per output stream.
    pub max_output: u64,
    /// Kill every other process in the sandbox (leftovers of earlier
    /// commands, other commands in flight) before this one starts, so
    /// nothing can tamper with it while it runs: for graders.
    pub exclusive: bool,
    /// What ends the command. `false` (the default): the main process's
    /// exit; output already buffered is read for at most 200 ms, then the
    /// agent closes its ends of the output pipes, so a background process
    /// that writes to them later gets SIGPIPE (and dies, unless it ignores
    /// it) and its output is lost; background processes that do not write
    /// are left running. `true` (what `docker exec` does): the main
    /// process's exit *and* both output streams closed (every process
    /// holding them exited or closed them), so a background job's output is
    /// part of the result; processes still running with the streams closed
    /// are left running. Either way the exit code is the main process's,
    /// and when the timeout passes first the command's tree is killed and
    /// the command fails with a timeout.
    pub wait_for_output: bool,
    /// Run on a pseudo-terminal of this size instead of pipes: the
    /// terminal is the command's stdin, stdout and stderr (so its output
    /// arrives as stdout, the streams merged, with the terminal's line
    /// endings) and the controlling terminal of a new session it leads;
    /// input always goes in through the execution's handle, whatever
    /// `stdin` says, and the handle resizes it. `TERM` is
    /// `xterm-256color` unless the sandbox or the command sets it.
    /// `wait_for_output` does not apply.
    pub pty: Option<PtySize>,
    /// Start this as a code context's relay (`corral-agent kernel
    /// LANGUAGE`, nothing else): under a uid of its own, out of every
    /// command's reach. Set by the runtime's code contexts.
    pub relay: bool,
}

impl CommandSpec {
    /// Runs `script` with `/bin/sh -c`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::argv(["/bin/sh".to_string(), "-c".to_string(), script.into()])
    }

    /// Runs a program directly.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        CommandSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
            stdin: None,
            timeout: None,
            max_output: DEFAULT_MAX_OUTPUT,
            exclusive: false,
            wait_for_output: false,
            pty: None,
            relay: false,
        }
    }

    /// Runs the command on a terminal of `cols` x `rows` (see
    /// [`CommandSpec::pty`]).
    pub fn pty(mut self, cols: u16, rows: u16) -> Self {
        self.pty = Some(PtySize { cols, rows });
        self
    }

    /// Makes the command exclusive: everything else in the sandbox is killed
    /// before it starts (see [`CommandSpec::exclusive`]).
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Makes the command wait for its output streams to close, not just for
    /// its main process (see [`CommandSpec::wait_for_output`]).
    pub fn wait_for_output(mut self) -> Self {
        self.wait_for_output = true;
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets stdin.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// Sets the output budget per stream.
    pub fn max_output(mut self, bytes: u64) -> Self {
        self.max_output = bytes;
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }
}
