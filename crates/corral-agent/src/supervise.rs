//! Watching one command from start to Exited.
//!
//! One thread per command sleeps in `poll` on the command's stdout, stderr,
//! stdin (when there is something to write) and its mailbox eventfd, until
//! the reaper reports the exit. It streams the head of each output stream
//! live, keeps the tail, enforces the timeout and finally reports.
//!
//! By default completion is decided by the main process's exit, not by EOF
//! on the pipes: a background child (`sleep 100 &`) inherits the pipes and
//! would otherwise hold the command open for its whole life. After the exit,
//! only what is already buffered in the pipes is read (for at most
//! [`DRAIN_LIMIT`]); then our read ends close, so a background process that
//! writes later gets SIGPIPE. Nothing is killed.
//!
//! With `wait_for_output` (what `docker exec` does) the command ends once the
//! main process exited *and* both output pipes reached EOF, however long the
//! background processes holding them take, but never past the command's
//! deadline: there the tree and every process still holding the pipes are
//! killed and the command is reported timed out. Processes that closed or
//! redirected the streams are left running. A session that ends while a
//! command waits this way kills them the same way, so an old session's
//! command never keeps its thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use corral_core::output::HeadTail;
use corral_core::protocol::{
    ExitReport, Frame, FrameKind, StreamTotals, MAX_PAYLOAD, OUTPUT_CHUNK,
};

use crate::command::Spawned;
use crate::control::Control;
use crate::oom::{self, OomCounter};
use crate::reaper::Reaper;
use crate::sys::{self, ExitStatus};
use crate::tree;
use crate::writer::SessionWriter;

/// Upper bound on reading leftovers after the main process exited: a
/// background child that keeps writing must not keep the command open.
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// Everything a supervisor needs.
pub struct Job {
    /// The command's id on the connection.
    pub id: u32,
    /// The started process.
    pub proc: Spawned,
    /// Its mailbox.
    pub ctl: Arc<Control>,
    /// Kill the tree this long after the spawn.
    pub timeout: Option<Duration>,
    /// Output budget per stream.
    pub max_output: u64,
    /// After the main process exits, read until both pipes are closed
    /// (bounded by the timeout) rather than for at most [`DRAIN_LIMIT`].
    pub wait_for_output: bool,
    /// The sandbox's OOM counter and its value before the spawn.
    pub oom: (OomCounter, Option<u64>),
    /// The reaper, which charges orphans of the command's group to it
    /// until it reports.
    pub reaper: Arc<Reaper>,
    /// Where frames go.
    pub writer: SessionWriter,
    /// Called once the process is gone, before Exited is sent, so the id is
    /// free again by the time the client learns the command ended.
    pub on_done: Box<dyn FnOnce() + Send>,
    /// Fires once the connection has sent Started: no frame for this id may
    /// precede it.
    pub go: mpsc::Receiver<()>,
}

/// One output stream: our end of the pipe (until EOF) and its capper.
struct Output {
    file: Option<File>,
    cap: HeadTail,
    live: FrameKind,
    tail: FrameKind,
}

impl Output {
    fn new(file: Option<File>, max_output: u64, live: FrameKind, tail: FrameKind) -> Self {
        Output {
            file,
            cap: HeadTail::new(max_output),
            live,
            tail,
        }
    }

    /// Reads one chunk (≤ OUTPUT_CHUNK, so a live frame never exceeds it)
    /// and streams its head part.
    fn read_once(&mut self, buf: &mut [u8], id: u32, writer: &SessionWriter) {
        let Some(file) = &mut self.file else { return };
        match file.read(buf) {
            Ok(0) => self.file = None,
            Ok(n) => {
                let head = self.cap.push(&buf[..n]).head;
                if !head.is_empty() {
                    writer.send(&Frame::new(self.live, id, head));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => self.file = None,
        }
    }

    fn totals(&self) -> StreamTotals {
        StreamTotals {
            total_bytes: self.cap.total(),
            truncated: self.cap.truncated(),
        }
    }

    /// Sends the kept tail. A tail above MAX_PAYLOAD (budgets over 32 MiB)
    /// would be refused by the peer's decoder, so it is split; the pieces
    /// arrive in order and concatenate to the tail.
    fn send_tail(&mut self, id: u32, writer: &SessionWriter) {
        let tail = self.cap.take_tail();
        for piece in tail.chunks(MAX_PAYLOAD) {
            writer.send(&Frame::new(self.tail, id, piece));
        }
    }
}

/// Where the command's stdin stands.
struct Stdin {
    file: Option<File>,
    pending: Vec<u8>,
    eof: bool,
}

impl Stdin {
    /// Writes what the pipe takes now. A dead reader (EPIPE) closes our end
    /// and discards the rest, as a shell pipeline would.
    fn write_some(&mut self) {
        let Some(file) = &mut self.file else { return };
        match file.write(&self.pending) {
            Ok(n) => {
                self.pending.drain(..n);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => self.close(),
        }
    }

    fn close(&mut self) {
        self.file = None;
        self.pending = Vec::new();
    }

    fn wants_write(&self) -> bool {
        self.file.is_some() && !self.pending.is_empty()
    }
}

impl Job {
    /// Runs the command to its end, sending everything after Started up to
    /// Exited.
    pub fn run(self) {
        let Job {
            id,
            proc,
            ctl,
            timeout,
            max_output,
            wait_for_output,
            oom: (oom_counter, oom_before),
            reaper,
            writer,
            on_done,
            go,
        } = self;
        let pid = proc.pid;
        // An error here means the connection thread is gone; carry on, the
        // process still needs watching until it ends.
        let _ = go.recv();

        let mut out = [
            Output::new(
                Some(proc.stdout),
                max_output,
                FrameKind::Stdout,
                FrameKind::StdoutTail,
            ),
            Output::new(
                proc.stderr,
                max_output,
                FrameKind::Stderr,
                FrameKind::StderrTail,
            ),
        ];
        let terminal = proc.pty;
        let mut stdin = Stdin {
            file: proc.stdin,
            pending: Vec::new(),
            eof: false,
        };
        // A timeout too large to represent is no timeout at all.
        let deadline = timeout.and_then(|t| proc.started.checked_add(t));
        let mut timed_out = false;
        let mut buf = vec![0u8; OUTPUT_CHUNK];

        let (status, exited_at) = loop {
            let inbox = ctl.take();
            if stdin.file.is_some() {
                stdin.pending.extend_from_slice(&inbox.stdin);
            }
            stdin.eof |= inbox.stdin_eof;
            if let (Some(size), Some(t)) = (inbox.resize, &terminal) {
                // Fails only once the terminal is gone (the command is
                // ending): nothing left to resize.
                let _ = sys::set_window_size(t.as_raw_fd(), size.cols, size.rows);
            }
            if let Some(exit) = inbox.exit {
                break exit;
            }
            if stdin.eof && stdin.pending.is_empty() {
                stdin.close();
            }

            let mut wait = None;
            if let (Some(d), false) = (deadline, timed_out) {
                let now = Instant::now();
                if now >= d {
                    tree::kill_tree(pid);
                    timed_out = true;
                } else {
                    wait = Some(d - now);
                }
            }

            let mut fds = vec![sys::pollfd(ctl.wake_fd(), libc::POLLIN)];
            let mut slots: Vec<Option<usize>> = Vec::with_capacity(3);
            for o in &out {
                slots.push(o.file.as_ref().map(|f| {
                    fds.push(sys::pollfd(f.as_raw_fd(), libc::POLLIN));
                    fds.len() - 1
                }));
            }
            let stdin_slot = stdin
                .file
                .as_ref()
                .filter(|_| stdin.wants_write())
                .map(|f| {
                    fds.push(sys::pollfd(f.as_raw_fd(), libc::POLLOUT));
                    fds.len() - 1
                });
            if sys::poll(&mut fds, wait).is_err() {
                // Only EINVAL/ENOMEM are possible; wait a little rather
                // than spin, the exit will still arrive through the mailbox.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            for (o, slot) in out.iter_mut().zip(&slots) {
                if slot.is_some_and(|i| fds[i].revents != 0) {
                    o.read_once(&mut buf, id, &writer);
                }
            }
            if let Some(i) = stdin_slot {
                let r = fds[i].revents;
                if r & (libc::POLLERR | libc::POLLHUP) != 0 {
                    stdin.close();
                } else if r & libc::POLLOUT != 0 {
                    stdin.write_some();
                }
            }
        };

        // The main process is gone. Its stdin is of no use any more.
        stdin.close();
        let ended_at = if !wait_for_output {
            // The command is over: take what output is already buffered.
            drain(&mut out, &mut buf, id, &writer);
            exited_at
        } else {
            let end = if timed_out {
                // The tree was killed at the deadline; what it left holding
                // the pipes (a process that escaped it) goes too.
                End::Killed
            } else {
                wait_for_eof(&mut out, &mut buf, id, &writer, &ctl, deadline)
            };
            if end != End::Closed {
                kill_holders(pid, &out);
                drain(&mut out, &mut buf, id, &writer);
                timed_out |= end == End::Deadline;
            }
            Instant::now()
        };

        let (exit_code, signal) = match status {
            ExitStatus::Code(c) => (Some(c), None),
            ExitStatus::Signal(s) => (None, Some(s)),
        };
        let oom_killed = oom::oom_killed(oom_before, oom_counter.read(), signal, timed_out);
        // Orphans of the group that died by now count; later ones do not.
        reaper.finish(pid);
        let report = ExitReport {
            exit_code,
            signal,
            timed_out,
            oom_killed,
            duration_us: u64::try_from(
                ended_at.saturating_duration_since(proc.started).as_micros(),
            )
            .unwrap_or(u64::MAX),
            stdout: out[0].totals(),
            stderr: out[1].totals(),
            usage: ctl.usage(),
        };
        on_done();
        for o in &mut out {
            o.send_tail(id, &writer);
        }
        writer.send_last(&Frame::json(FrameKind::Exited, id, &report), &ctl.reported);
    }
}

/// How waiting for the output streams ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both pipes reached EOF.
    Closed,
    /// The command's deadline passed first.
    Deadline,
    /// The tree was already killed (deadline in the main loop), or the
    /// session ended: nobody waits for the result.
    Killed,
}

/// Reads both pipes until EOF on each, the deadline, or the session's end.
fn wait_for_eof(
    out: &mut [Output; 2],
    buf: &mut [u8],
    id: u32,
    writer: &SessionWriter,
    ctl: &Control,
    deadline: Option<Instant>,
) -> End {
    loop {
        // Stdin frames may still arrive (the id is live until Exited); the
        // pipe is closed, so they are dropped.
        let _ = ctl.take();
        if ctl.abandoned() {
            return End::Killed;
        }
        let mut fds = vec![sys::pollfd(ctl.wake_fd(), libc::POLLIN)];
        let mut which = Vec::with_capacity(2);
        for (i, o) in out.iter().enumerate() {
            if let Some(f) = &o.file {
                fds.push(sys::pollfd(f.as_raw_fd(), libc::POLLIN));
                which.push(i);
            }
        }
        if which.is_empty() {
            return End::Closed;
        }
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return End::Deadline,
            },
            None => None,
        };
        if sys::poll(&mut fds, wait).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        for (fd, &i) in fds[1..].iter().zip(&which) {
            if fd.revents != 0 {
                out[i].read_once(buf, id, writer);
            }
        }
    }
}

/// Kills the command's tree (its process group, and sessions and children
/// still linked to it) and every other process still holding its output
/// pipes, which may have left the group and been re-parented to us.
///
/// The main process is reaped by now, but its pid names the group as long as
/// any member lives (the kernel does not reuse it until then), which is the
/// same guarantee a Signal frame after the exit relies on.
fn kill_holders(pid: i32, out: &[Output; 2]) {
    use std::os::unix::fs::MetadataExt;
    tree::kill_tree(pid);
    let inodes: Vec<u64> = out
        .iter()
        .filter_map(|o| o.file.as_ref()?.metadata().ok())
        .map(|m| m.ino())
        .collect();
    if inodes.is_empty() {
        return;
    }
    // Two rounds, as in kill_tree: a holder may fork while being killed.
    for _ in 0..2 {
        for p in tree::pipe_holders(&inodes) {
            let _ = sys::kill(p, libc::SIGKILL);
        }
    }
}

/// Reads whatever the pipes hold right now, without waiting for EOF.
fn drain(out: &mut [Output; 2], buf: &mut [u8], id: u32, writer: &SessionWriter) {
    let until = Instant::now() + DRAIN_LIMIT;
    while Instant::now() < until {
        let mut fds = Vec::with_capacity(2);
        let mut which = Vec::with_capacity(2);
        for (i, o) in out.iter().enumerate() {
            if let Some(f) = &o.file {
                fds.push(sys::pollfd(f.as_raw_fd(), libc::POLLIN));
                which.push(i);
            }
        }
        if fds.is_empty() {
            return;
        }
        match sys::poll(&mut fds, Some(Duration::ZERO)) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        for (fd, &i) in fds.iter().zip(&which) {
            if fd.revents != 0 {
                out[i].read_once(buf, id, writer);
            }
        }
    }
}
