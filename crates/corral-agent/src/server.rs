//! The agent's side of a client connection: handshake, then frames.
//!
//! One thread per connection reads and dispatches frames; commands run on
//! supervisor threads of their own and answer through the shared
//! [`FrameWriter`]. A connection owns the commands it started: when it ends,
//! their process trees are killed, since nobody can observe them any more.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use corral_core::protocol::{
    Decoder, ExecRequest, Frame, FrameKind, Hello, HelloAck, SignalRequest, SpawnError, Started,
    PROTOCOL_VERSION,
};

use crate::control::{lock, Control, StdinRefused};
use crate::deadman::DeadMan;
use crate::oom::OomCounter;
use crate::reaper::Reaper;
use crate::supervise::Job;
use crate::writer::FrameWriter;
use crate::{command, tree};

/// A client that connects but never says Hello is dropped after this, so it
/// cannot hold the dead-man switch open by doing nothing.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Read buffer per connection.
const READ_CHUNK: usize = 64 * 1024;

/// Small stacks: these threads hold no big locals (buffers are on the heap),
/// and a sandbox's pids limit counts threads too, so keep them cheap.
const THREAD_STACK: usize = 256 * 1024;

/// What every connection shares.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The zombie reaper commands spawn through.
    pub reaper: Arc<Reaper>,
    /// The dead-man switch counting clients.
    pub deadman: Arc<DeadMan>,
    /// The sandbox's OOM counter.
    pub oom: OomCounter,
}

/// A command the connection started and that has not reported Exited.
#[derive(Debug, Clone)]
struct Running {
    pid: i32,
    ctl: Arc<Control>,
}

type Table = Arc<Mutex<HashMap<u32, Running>>>;

struct Conn {
    shared: Shared,
    writer: Arc<FrameWriter>,
    commands: Table,
}

/// Serves one client on a thread of its own.
pub fn serve(stream: UnixStream, shared: Shared) {
    let deadman = shared.deadman.clone();
    let guard = deadman.client_connected();
    let spawned = std::thread::Builder::new()
        .name("conn".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            let _guard = guard;
            handle(stream, shared);
        });
    if let Err(e) = spawned {
        // The closure (with the stream and the guard) is dropped: the
        // client sees the connection close and may retry.
        eprintln!("corral-agent: cannot start a connection thread: {e}");
    }
}

fn handle(stream: UnixStream, shared: Shared) {
    let (Ok(write_half), Ok(control_half)) = (stream.try_clone(), stream.try_clone()) else {
        eprintln!("corral-agent: cannot duplicate a client socket");
        return;
    };
    let conn = Conn {
        shared,
        writer: Arc::new(FrameWriter::new(write_half)),
        commands: Arc::new(Mutex::new(HashMap::new())),
    };
    conn.read_loop(stream);

    // The client is gone (or broke the protocol). Unblock supervisors stuck
    // writing to it, then kill what it left running.
    let _ = control_half.shutdown(Shutdown::Both);
    let orphaned: Vec<Running> = lock(&conn.commands).values().cloned().collect();
    for r in orphaned {
        if !r.ctl.exited() {
            tree::kill_tree(r.pid);
        }
    }
}

impl Conn {
    /// Reads frames until the client goes away or breaks framing.
    fn read_loop(&self, mut stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
        let mut decoder = Decoder::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let mut greeted = false;
        loop {
            let n = match stream.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.writer.error(0, "no hello received in time");
                    return;
                }
                Err(_) => return,
            };
            decoder.extend(&buf[..n]);
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(violation) => {
                        // Framing is lost: nothing after this can be trusted.
                        let id = match &violation {
                            corral_core::protocol::ProtocolViolation::UnknownKind {
                                id, ..
                            }
                            | corral_core::protocol::ProtocolViolation::TooLarge { id, .. }
                            | corral_core::protocol::ProtocolViolation::BadPayload { id, .. } => {
                                *id
                            }
                        };
                        self.writer
                            .error(id, format!("{violation}; closing the connection"));
                        return;
                    }
                };
                if greeted {
                    self.dispatch(frame);
                } else if self.greet(&frame) {
                    greeted = true;
                    let _ = stream.set_read_timeout(None);
                } else {
                    return;
                }
            }
        }
    }

    /// Checks the handshake; false means the connection must close.
    fn greet(&self, frame: &Frame) -> bool {
        if frame.kind != FrameKind::Hello {
            self.writer.error(
                frame.id,
                format!("expected a Hello frame first, got {:?}", frame.kind),
            );
            return false;
        }
        let hello: Hello = match frame.parse() {
            Ok(h) => h,
            Err(e) => {
                self.writer.error(frame.id, e.to_string());
                return false;
            }
        };
        if hello.protocol != PROTOCOL_VERSION {
            self.writer.error(
                frame.id,
                format!(
                    "protocol version mismatch: client speaks {}, agent {} speaks {PROTOCOL_VERSION}",
                    hello.protocol,
                    env!("CARGO_PKG_VERSION")
                ),
            );
            return false;
        }
        let ack = HelloAck {
            protocol: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            oom_counter: self.shared.oom.name().to_string(),
        };
        self.writer
            .send(&Frame::json(FrameKind::HelloAck, frame.id, &ack))
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
            FrameKind::Signal => match frame.parse::<SignalRequest>() {
                Ok(req) => self.signal(id, req.signal),
                Err(e) => {
                    self.writer.error(id, e.to_string());
                }
            },
            FrameKind::Ping => {
                self.writer
                    .send(&Frame::new(FrameKind::Pong, id, frame.payload));
            }
            FrameKind::Hello => {
                self.writer.error(id, "duplicate Hello frame");
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

    fn with_command(&self, id: u32, f: impl FnOnce(&Control) -> Result<(), StdinRefused>) {
        let Some(r) = self.running(id) else {
            self.writer
                .error(id, format!("no running command with id {id}"));
            return;
        };
        match f(&r.ctl) {
            Ok(()) => {}
            Err(StdinRefused::NoPipe) => {
                self.writer
                    .error(id, format!("command {id} was started without stdin"));
            }
            Err(StdinRefused::AlreadyClosed) => {
                self.writer
                    .error(id, format!("stdin of command {id} is already closed"));
            }
        }
    }

    fn signal(&self, id: u32, signal: i32) {
        if !(1..=64).contains(&signal) {
            self.writer
                .error(id, format!("invalid signal number {signal}"));
            return;
        }
        let Some(r) = self.running(id) else {
            self.writer
                .error(id, format!("no running command with id {id}"));
            return;
        };
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
        if crate::signals::stopping() {
            return self.spawn_failed(id, "the sandbox is stopping".to_string());
        }
        let ctl = match Control::new(req.stdin) {
            Ok(c) => Arc::new(c),
            Err(e) => return self.spawn_failed(id, format!("cannot set up the command: {e}")),
        };
        let oom_before = self.shared.oom.read();
        let proc = match command::spawn(&self.shared.reaper, &req, ctl.clone()) {
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
            oom: (self.shared.oom, oom_before),
            writer: self.writer.clone(),
            on_done: Box::new(move || {
                let mut t = lock(&table);
                if t.get(&id).is_some_and(|r| Arc::ptr_eq(&r.ctl, &mine)) {
                    t.remove(&id);
                }
            }),
            go: wait_go,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("cmd-{id}"))
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

    fn spawn_failed(&self, id: u32, message: String) {
        self.writer.send(&Frame::json(
            FrameKind::SpawnFailed,
            id,
            &SpawnError { message },
        ));
    }
}
