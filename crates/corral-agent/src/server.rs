//! The agent's side of the control stream: PID 1's stdin and stdout.
//!
//! One thread reads stdin and dispatches frames; commands run on supervisor
//! threads of their own and answer through the shared [`FrameWriter`].
//! There is no socket: the only controller is whoever the daemon lets attach
//! to PID 1, which nothing inside the sandbox can reach.
//!
//! A `Hello` (after [`SYNC`](corral_core::protocol::SYNC)) starts a session.
//! corral re-attaches with a new Hello when its stream broke; the commands
//! of the old session are then killed, since nobody can observe them any
//! more, and their frames are never sent. Any byte on stdin feeds the
//! dead-man switch.
//!
//! The Hello also carries the sandbox's environment, which every command
//! of the session gets: corral never puts it into the container's
//! configuration, where the engine would show it and a snapshot would keep
//! it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use corral_core::protocol::{
    DeltaError, DeltaErrorKind, DeltaReport, ExecRequest, ExportRequest, Frame, FrameKind, Hello,
    HelloAck, ImportRequest, Item, PtySize, ResetRequest, SignalRequest, SpawnError, Started,
    SyncDecoder, PROTOCOL_VERSION,
};

use crate::control::{lock, Control, StdinRefused};
use crate::deadman::DeadMan;
use crate::oom::OomCounter;
use crate::pristine::Pristine;
use crate::reaper::Reaper;
use crate::supervise::Job;
use crate::writer::{FrameWriter, SessionWriter};
use crate::{command, sys, tree};

/// Read buffer for stdin.
const READ_CHUNK: usize = 64 * 1024;

/// An incomplete frame that gets no further byte for this long is the
/// remains of a controller whose stream broke mid-write: it is dropped and
/// the agent hunts for the next session's sync bytes.
const STALL: Duration = Duration::from_secs(2);

/// How long an exclusive command waits for everything else to be gone.
const EXCLUSIVE_WAIT: Duration = Duration::from_secs(5);

/// Small stacks: these threads hold no big locals (buffers are on the heap),
/// and a sandbox's pids limit counts threads too, so keep them cheap.
const THREAD_STACK: usize = 256 * 1024;

/// What the controller loop shares with supervisors.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The zombie reaper commands spawn through.
    pub reaper: Arc<Reaper>,
    /// The dead-man switch, fed by every byte from corral.
    pub deadman: Arc<DeadMan>,
    /// The sandbox's OOM counter.
    pub oom: OomCounter,
    /// In-place reset, when the sandbox was started for it.
    pub pristine: Arc<Pristine>,
}

/// A command of the current session that has not reported Exited.
#[derive(Debug, Clone)]
struct Running {
    pid: i32,
    ctl: Arc<Control>,
}

type Table = Arc<Mutex<HashMap<u32, Running>>>;

/// Bytes of an exported delta per frame.
const DELTA_CHUNK: usize = 1 << 20;

/// Chunks of an import queued for its thread: beyond them the reader
/// waits, so corral's writes slow down rather than the agent's memory
/// growing.
const IMPORT_QUEUE: usize = 16;

/// An import whose bytes are arriving.
struct Importing {
    id: u32,
    /// To the import's thread; `None` once it stopped taking bytes.
    tx: Option<mpsc::SyncSender<Vec<u8>>>,
    /// Bytes still announced.
    left: u64,
}

/// The sandbox's environment as the current session's Hello gave it.
type Env = Arc<Vec<(String, String)>>;

/// What serves corral's frames: the commands of the current session, the
/// environment they get, and the one writer all answers go through.
pub struct Conn {
    shared: Shared,
    writer: Arc<FrameWriter>,
    commands: Table,
    env: Mutex<Env>,
    import: Mutex<Option<Importing>>,
}

/// Serves corral on stdin/stdout until stdin ends; returns then (the
/// dead-man switch decides what happens next).
pub fn serve_stdio(shared: Shared, stdin: File, stdout: File) {
    let conn = Conn::new(shared, Arc::new(FrameWriter::new(stdout)));
    conn.serve(stdin);
}

impl Conn {
    /// A controller connection whose frames go out through `writer`.
    pub fn new(shared: Shared, writer: Arc<FrameWriter>) -> Self {
        Conn {
            shared,
            writer,
            commands: Arc::new(Mutex::new(HashMap::new())),
            env: Mutex::new(Arc::new(Vec::new())),
            import: Mutex::new(None),
        }
    }

    /// Serves frames read from `input` until it ends, then kills what the
    /// session left running.
    pub fn serve(&self, input: impl Read + AsRawFd) {
        self.read_loop(input);
        self.end_session(false);
    }

    /// Reads frames until `stdin` ends.
    fn read_loop(&self, mut stdin: impl Read + AsRawFd) {
        let mut decoder = SyncDecoder::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let mut greeted = false;
        let mut last_byte = Instant::now();
        loop {
            if decoder.has_partial() {
                let mut fds = [sys::pollfd(stdin.as_raw_fd(), libc::POLLIN)];
                let left = STALL.saturating_sub(last_byte.elapsed());
                match sys::poll(&mut fds, Some(left)) {
                    Ok(0) => {
                        eprintln!("corral-agent: dropping an incomplete frame (no byte for {STALL:?}); waiting for a new session");
                        decoder.resync();
                        greeted = false;
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {}
                }
            }
            let n = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("corral-agent: reading stdin failed: {e}");
                    return;
                }
            };
            last_byte = Instant::now();
            self.shared.deadman.feed();
            decoder.extend(&buf[..n]);
            loop {
                if greeted && decoder.is_hunting() {
                    greeted = false;
                }
                if !greeted && decoder.refuse_non_handshake(FrameKind::Hello) {
                    continue;
                }
                let item = match decoder.next_item() {
                    Ok(Some(item)) => item,
                    Ok(None) => break,
                    Err(violation) => {
                        // Framing is lost (or a new session's sync bytes
                        // follow a broken frame): hunt for the next sync.
                        if !decoder.at_sync() {
                            self.writer
                                .error(0, format!("{violation}; waiting for a new session"));
                        }
                        decoder.resync();
                        continue;
                    }
                };
                match item {
                    Item::Synced => {}
                    Item::Frame(frame) if greeted => self.dispatch(frame),
                    Item::Frame(frame) => {
                        greeted = self.greet(&frame);
                        if !greeted {
                            decoder.resync();
                        }
                    }
                }
            }
        }
    }

    /// Kills what the current session left running and forgets it.
    /// Ends the current session; with `keep`, its commands go on running
    /// (a restored sandbox's), else they are killed.
    fn end_session(&self, keep: bool) {
        // An import cut short ends with what arrived: the archive is
        // short, so it fails and leaves the delta empty.
        lock(&self.import).take();
        let orphaned: Vec<Running> = lock(&self.commands).drain().map(|(_, r)| r).collect();
        for r in orphaned {
            if !keep && !r.ctl.exited() {
                tree::kill_tree(r.pid);
            }
            // A supervisor waiting for output streams to close after the
            // main process exited kills what holds them and finishes.
            r.ctl.abandon();
        }
    }

    /// Starts a session on a Hello. The answer goes out even to a Hello of
    /// another protocol version (it carries the agent's), so corral can say
    /// what is wrong instead of waiting; false means no session started.
    fn greet(&self, frame: &Frame) -> bool {
        let (hello, ok) = match frame.parse::<Hello>() {
            Ok(h) => {
                let ok = h.protocol == PROTOCOL_VERSION;
                (h, ok)
            }
            Err(e) => {
                eprintln!("corral-agent: bad Hello: {e}");
                let h = Hello {
                    protocol: 0,
                    session: String::new(),
                    env: Vec::new(),
                    restored: false,
                };
                (h, false)
            }
        };
        if ok {
            // The old session's commands die before the new session's
            // first answer (unless a live snapshot caught them, and they go
            // on), and none of their frames follow it.
            self.end_session(hello.restored);
            *lock(&self.env) = Arc::new(hello.env);
        }
        let ack = HelloAck {
            protocol: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            oom_counter: self.shared.oom.name().to_string(),
            session: hello.session,
            reset: self.shared.pristine.support().cloned(),
            deltas: self.shared.pristine.deltas(),
            shared_deltas: self.shared.pristine.shared_deltas(),
            integrity_gap: crate::door::integrity_gap(),
            usage: true,
            pty: true,
            workdir: std::env::current_dir()
                .ok()
                .and_then(|d| d.to_str().map(str::to_string)),
        };
        self.writer
            .new_session(&Frame::json(FrameKind::HelloAck, frame.id, &ack));
        ok
    }

    fn dispatch(&self, frame: Frame) {
        let id = frame.id;
        match frame.kind {
            FrameKind::Exec => match frame.parse::<ExecRequest>() {
                Ok(req) => self.exec(id, req),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::Stdin => self.with_command(id, |ctl| ctl.push_stdin(&frame.payload)),
            FrameKind::StdinEof => self.with_command(id, |ctl| ctl.close_stdin()),
            FrameKind::Resize => match frame.parse::<PtySize>() {
                Ok(size) => match size.validate() {
                    Ok(()) => self.with_command(id, |ctl| ctl.resize(size)),
                    Err(message) => self.refuse_for(id, message),
                },
                Err(e) => self.refuse_for(
                    id,
                    format!(
                        "invalid pty size (expected {{\"cols\": 1..4096, \"rows\": 1..4096}}): {e}"
                    ),
                ),
            },
            FrameKind::Signal => match frame.parse::<SignalRequest>() {
                Ok(req) => self.signal(id, req.signal),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::Reset => match frame.parse::<ResetRequest>() {
                Ok(req) => self.reset(id, req),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::Export => match frame.parse::<ExportRequest>() {
                Ok(req) => self.export(id, req),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::Import => match frame.parse::<ImportRequest>() {
                Ok(req) => self.import(id, req),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::ImportData => self.import_data(id, frame.payload),
            FrameKind::Usage => self.usage(id),
            FrameKind::Ping => {
                self.writer
                    .send(&Frame::new(FrameKind::Pong, id, frame.payload));
            }
            FrameKind::Hello => {
                self.writer
                    .error(id, "a Hello must follow the sync bytes; frame ignored");
            }
            other => {
                self.writer.error(
                    id,
                    format!("frame kind {other:?} is not accepted by the agent"),
                );
            }
        }
    }

    fn running(&self, id: u32) -> Option<Running> {
        lock(&self.commands).get(&id).cloned()
    }

    /// Applies a stdin frame to running command `id`. A frame for a command
    /// that is no longer running is dropped silently: it crossed the
    /// command's Exited on the wire, and nothing may follow an Exited.
    fn with_command(&self, id: u32, f: impl FnOnce(&Control) -> Result<(), StdinRefused>) {
        let Some(r) = self.running(id) else {
            return;
        };
        let message = match f(&r.ctl) {
            Ok(()) => return,
            Err(StdinRefused::NoPipe) => format!("command {id} was started without stdin"),
            Err(StdinRefused::AlreadyClosed) => format!("stdin of command {id} is already closed"),
            Err(StdinRefused::NoTerminal) => {
                format!("command {id} does not run on a terminal: nothing to resize")
            }
        };
        self.writer
            .error_while_running(id, &r.ctl.reported, message);
    }

    /// Refuses a frame for command `id` (an Error that does not end it);
    /// dropped when the command is no longer running.
    fn refuse_for(&self, id: u32, message: String) {
        if let Some(r) = self.running(id) {
            self.writer
                .error_while_running(id, &r.ctl.reported, message);
        }
    }

    fn signal(&self, id: u32, signal: i32) {
        // As for stdin: a signal for a command that ended is dropped.
        let Some(r) = self.running(id) else {
            return;
        };
        if !(1..=64).contains(&signal) {
            self.writer.error_while_running(
                id,
                &r.ctl.reported,
                format!("invalid signal number {signal}"),
            );
            return;
        }
        // The group outlives its leader while background members remain, so
        // this is meaningful even just after the main process exited.
        // ESRCH (group already empty) is not an error worth reporting.
        let _ = crate::sys::kill(-r.pid, signal);
    }

    fn exec(&self, id: u32, req: ExecRequest) {
        if self.running(id).is_some() {
            self.writer
                .error(id, format!("command id {id} is already running"));
            return;
        }
        if req.exclusive {
            if !tree::kill_all_others(EXCLUSIVE_WAIT) {
                return self.spawn_failed(
                    id,
                    format!("exclusive: other processes survived {EXCLUSIVE_WAIT:?} of SIGKILL"),
                );
            }
            // Nor does what they did to PID 1 (an OOM score that makes it
            // the victim of the command's allocations, say) outlive them.
            if let Err(e) = crate::tunables::restore() {
                eprintln!("corral-agent: exclusive: {e}");
            }
        }
        let ctl = match Control::with_terminal(req.stdin, req.pty.is_some()) {
            Ok(c) => Arc::new(c),
            Err(e) => return self.spawn_failed(id, format!("cannot set up the command: {e}")),
        };
        let oom_before = self.shared.oom.read();
        let env = lock(&self.env).clone();
        let proc = match command::spawn(
            &self.shared.reaper,
            &self.shared.pristine,
            &env,
            &req,
            ctl.clone(),
        ) {
            Ok(p) => p,
            Err(message) => return self.spawn_failed(id, message),
        };
        let pid = proc.pid;
        lock(&self.commands).insert(
            id,
            Running {
                pid,
                ctl: ctl.clone(),
            },
        );
        let table = self.commands.clone();
        let mine = ctl.clone();
        let (go, wait_go) = mpsc::channel();
        let job = Job {
            id,
            proc,
            ctl,
            timeout: req.timeout_ms.map(Duration::from_millis),
            max_output: req.max_output,
            // On a terminal the output is not a pipe whose holders could be
            // found and waited for: the main process's exit ends it.
            wait_for_output: req.wait_for_output && req.pty.is_none(),
            oom: (self.shared.oom, oom_before),
            reaper: self.shared.reaper.clone(),
            writer: SessionWriter::new(self.writer.clone(), self.writer.epoch()),
            on_done: Box::new(move || {
                let mut t = lock(&table);
                if t.get(&id).is_some_and(|r| Arc::ptr_eq(&r.ctl, &mine)) {
                    t.remove(&id);
                }
            }),
            go: wait_go,
        };
        let spawned = std::thread::Builder::new()
            // No command id in the name: thread names are readable by every
            // process in the sandbox through /proc/1/task/*/comm.
            .name("cmd".into())
            .stack_size(THREAD_STACK)
            .spawn(move || job.run());
        if let Err(e) = spawned {
            // Nobody would watch the process: take it back down and report
            // it as not started (the client has not seen Started).
            self.shared.reaper.forget(pid);
            tree::kill_tree(pid);
            lock(&self.commands).remove(&id);
            return self.spawn_failed(id, format!("cannot start a thread to supervise it: {e}"));
        }
        // Started goes out from this thread, before it can answer any later
        // frame for the id (an Error about a Signal, say); the supervisor
        // sends nothing until `go`.
        self.writer.send(&Frame::json(
            FrameKind::Started,
            id,
            &Started { pid: pid as u32 },
        ));
        let _ = go.send(());
    }

    /// Resets the sandbox in place (inline: nothing else is dispatched
    /// until the new world stands) and answers with the report.
    fn reset(&self, id: u32, req: ResetRequest) {
        if id == 0 || self.running(id).is_some() {
            self.writer
                .error(id, format!("reset id {id} is 0 or names a running command"));
            return;
        }
        let report =
            self.shared
                .pristine
                .reset(req.keep, req.to_root, req.restore, &self.shared.reaper);
        // The killed commands' supervisors report their ends as usual.
        self.writer
            .send(&Frame::json(FrameKind::ResetDone, id, &report));
    }

    /// Streams the delta as ExportData frames and ends with ExportDone, on
    /// a thread of its own (the reader goes on reading, so pings keep the
    /// dead-man switch fed).
    fn export(&self, id: u32, req: ExportRequest) {
        if id == 0 || self.running(id).is_some() {
            self.writer.error(
                id,
                format!("export id {id} is 0 or names a running command"),
            );
            return;
        }
        let writer = SessionWriter::new(self.writer.clone(), self.writer.epoch());
        let pristine = self.shared.pristine.clone();
        let done = writer.clone();
        let spawned = std::thread::Builder::new()
            .name("export".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let started = Instant::now();
                let mut sink = Chunks {
                    writer: writer.clone(),
                    id,
                    buf: Vec::with_capacity(DELTA_CHUNK),
                };
                let result = pristine.export(&mut sink, req.max_bytes).and_then(|w| {
                    std::io::Write::flush(&mut sink)
                        .map(|()| w)
                        .map_err(|e| DeltaError {
                            kind: DeltaErrorKind::Io,
                            message: format!("cannot send the archive: {e}"),
                            path: None,
                        })
                });
                let report = match result {
                    Ok(w) => DeltaReport {
                        error: None,
                        bytes: w.bytes,
                        entries: w.entries,
                        elapsed_us: started.elapsed().as_micros() as u64,
                    },
                    Err(e) => DeltaReport {
                        error: Some(e),
                        elapsed_us: started.elapsed().as_micros() as u64,
                        ..Default::default()
                    },
                };
                writer.send(&Frame::json(FrameKind::ExportDone, id, &report));
            });
        if let Err(e) = spawned {
            let report = DeltaReport {
                error: Some(DeltaError {
                    kind: DeltaErrorKind::Io,
                    message: format!("cannot start a thread for the export: {e}"),
                    path: None,
                }),
                ..Default::default()
            };
            done.send(&Frame::json(FrameKind::ExportDone, id, &report));
        }
    }

    /// Starts taking a delta in, on a thread of its own that answers
    /// ImportDone: from the shared deltas directory when the request names
    /// a file there, else from the ImportData frames that follow.
    fn import(&self, id: u32, req: ImportRequest) {
        let refuse = |kind: DeltaErrorKind, message: String| {
            let report = DeltaReport {
                error: Some(DeltaError {
                    kind,
                    message,
                    path: None,
                }),
                ..Default::default()
            };
            self.writer
                .send(&Frame::json(FrameKind::ImportDone, id, &report));
        };
        if id == 0 || self.running(id).is_some() || lock(&self.import).is_some() {
            self.writer.error(
                id,
                format!("import id {id} is 0, names a running command, or another import is open"),
            );
            return;
        }
        if req.size > req.max_bytes {
            return refuse(
                DeltaErrorKind::TooLarge,
                format!(
                    "the delta's {} bytes exceed the limit of {} bytes",
                    req.size, req.max_bytes
                ),
            );
        }
        // A shared delta is opened before anything changes: if it cannot
        // be, corral sends the bytes instead.
        let shared = match &req.shared {
            Some(name) => match self.shared.pristine.open_shared(name, req.size) {
                Ok(file) => Some(file),
                Err(message) => return refuse(DeltaErrorKind::Unsupported, message),
            },
            None => None,
        };
        if let Err(e) = self.shared.pristine.begin_import(req.replace) {
            let report = DeltaReport {
                error: Some(e),
                ..Default::default()
            };
            self.writer
                .send(&Frame::json(FrameKind::ImportDone, id, &report));
            return;
        }
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(IMPORT_QUEUE);
        let writer = SessionWriter::new(self.writer.clone(), self.writer.epoch());
        let pristine = self.shared.pristine.clone();
        let size = req.size;
        let replace = req.replace;
        let reaper = self.shared.reaper.clone();
        let from_file = shared.is_some();
        let spawned = std::thread::Builder::new()
            .name("import".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let started = Instant::now();
                let (result, got) = match shared {
                    Some(file) => {
                        let mut input = Counted {
                            inner: io::BufReader::with_capacity(1 << 20, file).take(size),
                            got: 0,
                        };
                        let result = pristine.import(&mut input, replace, &reaper);
                        (result, input.got)
                    }
                    None => {
                        let mut input = Incoming {
                            rx,
                            size,
                            got: 0,
                            chunk: Vec::new(),
                            at: 0,
                        };
                        let result = pristine.import(&mut input, replace, &reaper);
                        // Stop taking bytes before answering.
                        let got = input.got;
                        drop(input);
                        (result, got)
                    }
                };
                let report = match result {
                    Ok(done) => DeltaReport {
                        error: None,
                        bytes: got,
                        entries: done.entries,
                        elapsed_us: started.elapsed().as_micros() as u64,
                    },
                    Err(e) => DeltaReport {
                        error: Some(e),
                        bytes: got,
                        elapsed_us: started.elapsed().as_micros() as u64,
                        ..Default::default()
                    },
                };
                writer.send(&Frame::json(FrameKind::ImportDone, id, &report));
            });
        match spawned {
            Ok(_) if from_file => {}
            Ok(_) => {
                *lock(&self.import) = Some(Importing {
                    id,
                    tx: (size > 0).then_some(tx),
                    left: size,
                });
                if size == 0 {
                    lock(&self.import).take();
                }
            }
            Err(e) => {
                // The import never started: undo its mark.
                self.shared.pristine.abort_import();
                refuse(
                    DeltaErrorKind::Io,
                    format!("cannot start a thread for the import: {e}"),
                );
            }
        }
    }

    /// Bytes for the open import `id`.
    fn import_data(&self, id: u32, payload: Vec<u8>) {
        let mut open = lock(&self.import);
        let Some(imp) = open.as_mut().filter(|i| i.id == id) else {
            drop(open);
            self.writer
                .error(id, format!("import data for {id}, which is no open import"));
            return;
        };
        let len = payload.len() as u64;
        if len > imp.left {
            // More than announced: the import ends short of it and fails.
            open.take();
            drop(open);
            self.writer
                .error(id, format!("import {id} got more bytes than it announced"));
            return;
        }
        imp.left -= len;
        let finished = imp.left == 0;
        if let Some(tx) = &imp.tx {
            // Blocks while the import's queue is full; fails once the
            // import stopped (it failed): the rest is dropped.
            if tx.send(payload).is_err() {
                imp.tx = None;
            }
        }
        if finished {
            open.take();
        }
    }

    /// Answers a usage request with what the sandbox's cgroup and network
    /// counters say now (a few small file reads, done inline).
    fn usage(&self, id: u32) {
        if id == 0 || self.running(id).is_some() {
            self.writer
                .error(id, format!("usage id {id} is 0 or names a running command"));
            return;
        }
        self.writer.send(&Frame::json(
            FrameKind::UsageReport,
            id,
            &crate::usage::read(),
        ));
    }

    fn spawn_failed(&self, id: u32, message: String) {
        self.writer.send(&Frame::json(
            FrameKind::SpawnFailed,
            id,
            &SpawnError { message },
        ));
    }
}

/// Export bytes, sent as ExportData frames of up to [`DELTA_CHUNK`].
struct Chunks {
    writer: SessionWriter,
    id: u32,
    buf: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let frame = Frame::new(
            FrameKind::ExportData,
            self.id,
            std::mem::take(&mut self.buf),
        );
        self.buf = Vec::with_capacity(DELTA_CHUNK);
        if self.writer.send(&frame) {
            Ok(())
        } else {
            Err(std::io::Error::other(
                "the control stream ended (or a new session began)",
            ))
        }
    }
}

impl std::io::Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(DELTA_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&buf[..n]);
        if self.buf.len() >= DELTA_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A reader that counts what went through it.
struct Counted<R> {
    inner: R,
    got: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.got += n as u64;
        Ok(n)
    }
}

/// An import's bytes as the reader thread hands them over: exactly
/// `size`, or an error when the stream stops short.
struct Incoming {
    rx: mpsc::Receiver<Vec<u8>>,
    size: u64,
    got: u64,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            if self.got == self.size {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(chunk) => {
                    self.got += chunk.len() as u64;
                    self.chunk = chunk;
                    self.at = 0;
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the delta stopped after {} of {} bytes",
                            self.got, self.size
                        ),
                    ))
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
