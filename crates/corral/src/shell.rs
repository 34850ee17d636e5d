//! Stateful shell sessions inside a sandbox: `cd`, exported variables and
//! shell functions persist between commands, as an agent expects of a
//! terminal, while each command still gets its own exit code, timeout,
//! output cap and typed failure.
//!
//! A session is one long-lived shell process fed through its stdin. Each
//! command runs as `command eval '<cmd>' </dev/null` inside a wrapper
//! function (so a syntax error does not kill the shell and the command
//! cannot read the session's protocol), followed by markers carrying a fresh
//! random nonce and the exit code on stdout and on stderr; output up to the
//! markers is the command's. On timeout the session's process group gets
//! SIGINT: the shell's trap returns from the wrapper (aborting the rest of
//! the command line, exit 130, as Ctrl-C would) and the shell survives;
//! background jobs ignore it, as in any non-interactive shell. If the
//! command still runs after a grace period the shell is killed and the next
//! command starts a fresh one, and results say so.
//!
//! Shell results are not trustworthy: the exit code and the markers come
//! from inside the sandbox, and a command can redefine the functions that
//! report them. Every [`SessionResult`] says so (`trusted` is false);
//! graders use [`Sandbox::run`], whose exit report comes from the agent.
//!
//! Output produced between commands (by background jobs) is nobody's: at
//! most [`IDLE_OUTPUT_CAP`] of it waits in memory, the rest is dropped as it
//! arrives, and all of it is discarded and counted when the next command
//! starts.

use std::sync::Arc;
use std::time::Duration;

use corral_core::output::HeadTail;
use corral_core::{CommandResult, CommandSpec, Failure, FailureKind};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::host::random_hex;
use crate::sandbox::{ExecEvent, Execution, OutputStream, Recovered, StdinWriter};
use crate::Sandbox;

/// How long an interrupted command may take to stop before the session's
/// shell is killed and restarted.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

const SIGINT: i32 = 2;

/// Output of a session's shell that may wait unread in corral's memory
/// (between commands, or ahead of a slow reader); more is dropped and
/// counted.
pub const IDLE_OUTPUT_CAP: usize = 1 << 20;

/// Output that may wait unread while a command runs (the session reads as
/// it arrives; this only fills behind a reader slower than the shell).
const RUN_OUTPUT_CAP: usize = 16 << 20;

/// Sent once to a new shell: the SIGINT trap and the wrapper every command
/// runs in.
const SHELL_PRELUDE: &[u8] = br#"trap 'return 130' INT
__corral_run() { command eval "$__corral_cmd" </dev/null; }
"#;

/// How a session's shell is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellOptions {
    /// The shell and its arguments; it must read commands from stdin.
    pub shell: Vec<String>,
    /// Extra environment variables for the shell.
    pub env: Vec<(String, String)>,
    /// Starting directory (`~` expands to the sandbox user's home).
    pub cwd: Option<String>,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            shell: vec!["/bin/sh".into()],
            env: Vec::new(),
            cwd: None,
        }
    }
}

/// One command's outcome in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionResult {
    /// Exit code, output, truncation, duration and typed failure, as for
    /// any command.
    pub result: CommandResult,
    /// The command ran in a freshly started shell: state from earlier
    /// commands (cwd, variables, functions) was lost.
    pub restarted: bool,
    /// The shell is gone after this command (it ran `exit`, or it was
    /// killed after a timeout); the next command starts a fresh one.
    pub ended: bool,
    /// Output bytes the session's shell produced between the previous
    /// command and this one (background jobs): dropped, not attributed to
    /// this command.
    pub dropped_between_bytes: u64,
    /// Always false: the exit code and the end of this command's output are
    /// reported by the shell inside the sandbox, which a command can
    /// subvert. Use `exec`/`run` where the result must be trusted.
    pub trusted: bool,
}

/// A named, stateful shell in a sandbox. Cheap to clone; commands of one
/// session run one at a time.
#[derive(Clone)]
pub struct ShellSession {
    sandbox: Sandbox,
    name: String,
    options: ShellOptions,
    state: Arc<Mutex<Option<Shell>>>,
}

/// The running shell.
pub(crate) struct Shell {
    exec: Execution,
    stdin: StdinWriter,
    /// Output dropped before the previous command ended (already counted).
    dropped_seen: u64,
}

/// The slot a sandbox keeps per session name.
pub(crate) type ShellSlot = Arc<Mutex<Option<Shell>>>;

impl Sandbox {
    /// The shell session `name` (started on its first command), with the
    /// default shell `/bin/sh`.
    pub fn shell(&self, name: &str) -> ShellSession {
        self.shell_with(name, ShellOptions::default())
    }

    /// The shell session `name`; `options` apply when its shell (re)starts.
    pub fn shell_with(&self, name: &str, options: ShellOptions) -> ShellSession {
        let slot = self.shell_slot(name);
        ShellSession::new(self.clone(), name.to_string(), options, slot)
    }

    /// Names of the shell sessions opened so far.
    pub fn shell_names(&self) -> Vec<String> {
        self.attached_names()
    }

    /// Ends shell session `name` and forgets it.
    pub async fn close_shell(&self, name: &str) {
        let Some(slot) = self
            .detach(name)
            .and_then(|a| a.downcast::<Mutex<Option<Shell>>>().ok())
        else {
            return;
        };
        let shell = slot.lock().await.take();
        drop(shell);
    }

    /// The slot of session `name`, made on first use.
    fn shell_slot(&self, name: &str) -> ShellSlot {
        let fresh = || -> crate::sandbox::Attached { Arc::new(Mutex::new(None::<Shell>)) };
        match self
            .attached(name, fresh)
            .downcast::<Mutex<Option<Shell>>>()
        {
            Ok(slot) => slot,
            // Only shells are attached; anything else cannot be there.
            Err(_) => Arc::new(Mutex::new(None)),
        }
    }
}

/// Quotes `text` for a POSIX shell as one single-quoted word.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Finds `\n<marker> <digits>\n` (with `with_code`) or `\n<marker>\n` in
/// `buf`; returns (start of the leading newline, end, exit code).
fn find_marker(buf: &[u8], marker: &[u8], with_code: bool) -> Option<(usize, usize, Option<i32>)> {
    let mut from = 0;
    while let Some(pos) = find(&buf[from..], marker).map(|p| p + from) {
        let start = pos.checked_sub(1).filter(|s| buf[*s] == b'\n');
        let after = pos + marker.len();
        if let Some(start) = start {
            if !with_code {
                if buf.get(after) == Some(&b'\n') {
                    return Some((start, after + 1, None));
                }
            } else if buf.get(after) == Some(&b' ') {
                let digits_end = buf[after + 1..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map(|p| after + 1 + p);
                if let Some(end) = digits_end {
                    let code = std::str::from_utf8(&buf[after + 1..end])
                        .ok()
                        .and_then(|t| t.parse().ok());
                    return Some((start, end + 1, code));
                }
                return None; // the code line is not complete yet
            }
        }
        from = pos + 1;
    }
    None
}

/// Where `needle` first occurs right after a newline in `hay` (markers only
/// count at a line start, so only newlines need a closer look: this keeps a
/// flood of output cheap to scan).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(nl) = hay[from..].iter().position(|b| *b == b'\n') {
        let at = from + nl + 1;
        if hay[at..].starts_with(needle) {
            return Some(at);
        }
        from = at;
    }
    None
}

/// Collects one stream of one command up to its marker.
struct Collector {
    marker: Vec<u8>,
    with_code: bool,
    pending: Vec<u8>,
    cap: HeadTail,
    kept: Vec<u8>,
    done: Option<Option<i32>>,
}

impl Collector {
    fn new(marker: &str, with_code: bool, max_output: u64) -> Self {
        Collector {
            marker: marker.as_bytes().to_vec(),
            with_code,
            pending: Vec::new(),
            cap: HeadTail::new(max_output),
            kept: Vec::new(),
            done: None,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.done.is_some() {
            return; // output of background jobs after the marker: not this command's
        }
        self.pending.extend_from_slice(bytes);
        if let Some((start, _end, code)) = find_marker(&self.pending, &self.marker, self.with_code)
        {
            let out = self.pending[..start].to_vec();
            self.take(&out);
            self.pending.clear();
            self.done = Some(code);
            return;
        }
        // Keep back what could be the start of a marker line.
        let keep = self.marker.len() + 16;
        if self.pending.len() > keep {
            let cut = self.pending.len() - keep;
            let out: Vec<u8> = self.pending.drain(..cut).collect();
            self.take(&out);
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        let head = self.cap.push(bytes).head.to_vec();
        self.kept.extend_from_slice(&head);
    }

    /// Output so far (on a timeout or a dead shell, what arrived).
    fn finish(mut self) -> (Vec<u8>, bool, u64) {
        let rest = std::mem::take(&mut self.pending);
        self.take(&rest);
        let mut out = self.kept;
        out.extend(self.cap.take_tail());
        (out, self.cap.truncated(), self.cap.total())
    }
}

impl ShellSession {
    pub(crate) fn new(
        sandbox: Sandbox,
        name: String,
        options: ShellOptions,
        state: ShellSlot,
    ) -> Self {
        ShellSession {
            sandbox,
            name,
            options,
            state,
        }
    }

    /// The session's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn start(&self) -> Result<Shell, Failure> {
        let mut cmd = CommandSpec::argv(self.options.shell.clone()).max_output(u64::MAX / 4);
        cmd.stdin = Some(Vec::new());
        cmd.env = self.options.env.clone();
        cmd.cwd = self.options.cwd.clone();
        let exec = self.sandbox.exec_with_budget(&cmd, IDLE_OUTPUT_CAP).await?;
        let stdin = exec.stdin();
        // SIGINT aborts the running command line (the trap returns from the
        // wrapper function, as Ctrl-C would) but not the shell.
        stdin.write(SHELL_PRELUDE).await.map_err(|e| {
            Failure::new(
                FailureKind::AgentError,
                format!("session {}: {e}", self.name),
            )
        })?;
        Ok(Shell {
            exec,
            stdin,
            dropped_seen: 0,
        })
    }

    /// Runs `command` in the session's shell. `timeout` interrupts it (and,
    /// past a grace period, restarts the shell); `max_output` caps each
    /// stream (head and tail kept).
    pub async fn run(
        &self,
        command: &str,
        timeout: Option<Duration>,
        max_output: u64,
    ) -> SessionResult {
        let started = Instant::now();
        let mut slot = self.state.lock().await;
        let mut restarted = false;
        let mut between = 0u64;
        if let Some(shell) = slot.as_mut() {
            // What background jobs printed since the last command is not
            // this command's: count it and let it go.
            let mut gone = false;
            while let Some(ev) = shell.exec.try_next_output() {
                match ev {
                    ExecEvent::Output(_, bytes) => between += bytes.len() as u64,
                    ExecEvent::Ended(_) => gone = true,
                }
            }
            let dropped = shell.exec.dropped_output();
            between += dropped - shell.dropped_seen;
            shell.dropped_seen = dropped;
            if gone {
                *slot = None; // the shell exited between commands
            }
        }
        if slot.is_none() {
            match self.start().await {
                Ok(shell) => *slot = Some(shell),
                Err(f) => {
                    return SessionResult {
                        result: CommandResult::failed(f, started.elapsed()),
                        restarted: false,
                        ended: true,
                        dropped_between_bytes: between,
                        trusted: false,
                    }
                }
            }
            restarted = true;
        }
        let Some(shell) = slot.as_mut() else {
            // Cannot happen: the slot was filled above under the same lock.
            return SessionResult {
                result: CommandResult::failed(
                    Failure::new(
                        FailureKind::AgentError,
                        format!("session {} has no shell", self.name),
                    ),
                    started.elapsed(),
                ),
                restarted,
                ended: true,
                dropped_between_bytes: between,
                trusted: false,
            };
        };
        let marker = format!("__CORRAL_{}", random_hex(24));
        let script = format!(
            "__corral_cmd={}\n__corral_run\n__corral_rc=$?\nprintf '\\n%s %d\\n' '{marker}' \"$__corral_rc\"\nprintf '\\n%s\\n' '{marker}' >&2\n",
            quote(command)
        );
        shell.exec.set_output_budget(RUN_OUTPUT_CAP);
        let mut out = Collector::new(&marker, true, max_output);
        let mut err = Collector::new(&marker, false, max_output);
        let mut result = CommandResult::default();
        let mut ended = false;
        if let Err(e) = shell.stdin.write(script.as_bytes()).await {
            result.failure = Some(Failure::new(
                FailureKind::AgentError,
                format!(
                    "session {} in sandbox {}: {e}",
                    self.name,
                    self.sandbox.id()
                ),
            ));
            ended = true;
        }
        let mut deadline = timeout.map(|t| started + t);
        let mut interrupted = false;
        while !(ended || out.done.is_some() && err.done.is_some()) {
            let event = match deadline {
                Some(d) => match tokio::time::timeout_at(d, shell.exec.next_event()).await {
                    Ok(ev) => ev,
                    Err(_) if !interrupted => {
                        interrupted = true;
                        let _ = shell.exec.signal(SIGINT).await;
                        deadline = Some(Instant::now() + INTERRUPT_GRACE);
                        continue;
                    }
                    Err(_) => {
                        // Still running after SIGINT: kill the shell.
                        let _ = shell.exec.signal(9).await;
                        ended = true;
                        break;
                    }
                },
                None => shell.exec.next_event().await,
            };
            match event {
                ExecEvent::Output(OutputStream::Stdout, bytes) => out.push(&bytes),
                ExecEvent::Output(OutputStream::Stderr, bytes) => err.push(&bytes),
                ExecEvent::Ended(r) => {
                    // The shell itself ended: `exit`, or its sandbox was lost.
                    ended = true;
                    if r.failure.is_some() {
                        result.failure = r.failure;
                    } else {
                        result.exit_code = r.exit_code;
                        result.signal = r.signal;
                    }
                }
            }
        }
        if let Some(Some(code)) = out.done {
            result.exit_code = Some(code);
        }
        if interrupted && result.failure.is_none() {
            let t = timeout.unwrap_or_default();
            result.failure = Some(Failure::new(
                FailureKind::Timeout,
                if ended {
                    format!(
                        "session {} in sandbox {}: command timed out after {t:?} and did not stop on SIGINT; the shell was killed and will restart",
                        self.name,
                        self.sandbox.id()
                    )
                } else {
                    format!(
                        "session {} in sandbox {}: command timed out after {t:?} and was interrupted; the session is kept",
                        self.name,
                        self.sandbox.id()
                    )
                },
            ));
        }
        let (stdout, stdout_truncated, stdout_total) = out.finish();
        let (stderr, stderr_truncated, stderr_total) = err.finish();
        result.stdout = stdout;
        result.stderr = stderr;
        result.stdout_truncated = stdout_truncated;
        result.stderr_truncated = stderr_truncated;
        result.stdout_total_bytes = stdout_total;
        result.stderr_total_bytes = stderr_total;
        result.duration = started.elapsed();
        if ended {
            *slot = None;
            // A lost container: the sandbox's recovery policy applies now,
            // as for any command. The command is not run again: the shell's
            // state (cwd, variables) went with the container.
            if let Some(f) = &result.failure {
                if let Recovered::Failed(f) = self.sandbox.recover_from(f).await {
                    result.failure = Some(f);
                }
            }
        } else if let Some(shell) = slot.as_mut() {
            shell.exec.set_output_budget(IDLE_OUTPUT_CAP);
            // Dropped while this command ran (a reader slower than the
            // shell): its output is marked truncated, not counted as between.
            let dropped = shell.exec.dropped_output();
            if dropped > shell.dropped_seen {
                result.stdout_truncated = true;
                result.stderr_truncated = true;
                shell.dropped_seen = dropped;
            }
        }
        SessionResult {
            result,
            restarted,
            ended,
            dropped_between_bytes: between,
            trusted: false,
        }
    }

    /// Ends the session's shell (and its background jobs); the next command
    /// starts a fresh one.
    pub async fn close(&self) {
        let shell = self.state.lock().await.take();
        if let Some(shell) = shell {
            let _ = shell.exec.signal(9).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn markers_are_found_across_chunks_and_not_spoofed_by_prefixes() {
        let mut c = Collector::new("__M", true, 1 << 20);
        c.push(b"hello\nworld");
        c.push(b"\n__M");
        assert!(c.done.is_none());
        c.push(b" 3\n");
        assert_eq!(c.done, Some(Some(3)));
        let (out, truncated, total) = c.finish();
        assert_eq!(out, b"hello\nworld");
        assert!(!truncated);
        assert_eq!(total, 11);

        // Output without a trailing newline is kept exact.
        let mut c = Collector::new("__M", false, 1 << 20);
        c.push(b"no newline\n__M\n");
        assert_eq!(c.done, Some(None));
        assert_eq!(c.finish().0, b"no newline");

        // A marker-looking string not at a line start is output.
        let mut c = Collector::new("__M", true, 1 << 20);
        c.push(b"x__M 1\nmore\n__M 0\n");
        assert_eq!(c.done, Some(Some(0)));
        assert_eq!(c.finish().0, b"x__M 1\nmore");
    }

    #[test]
    fn output_is_capped_head_and_tail() {
        let mut c = Collector::new("__M", true, 10);
        let data: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        c.push(&data);
        c.push(b"\n__M 0\n");
        let (out, truncated, total) = c.finish();
        assert!(truncated);
        assert_eq!(total, 100);
        assert_eq!(out.len(), 10);
        assert_eq!(&out[..5], &data[..5]);
        assert_eq!(&out[5..], &data[95..]);
    }
}
