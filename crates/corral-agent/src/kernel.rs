//! `corral-agent kernel LANGUAGE`: a Jupyter kernel of the sandbox, spoken
//! to over the Jupyter messaging protocol (ZeroMQ through the `zeromq`
//! crate, HMAC-SHA256 signed) and relayed to corral as JSON lines over the
//! tool's stdin and stdout.
//!
//! corral starts it as a relay (an Exec with `relay`; see `ids`): bounded
//! like a command (the sandbox's limits, seccomp, its process tree ended
//! by a reset, an exclusive command or a new session) but under a relay
//! uid, non-dumpable, on sockets, and the kernel runs as the commands'
//! user. The tool picks five free ports on `127.0.0.1` and a fresh random
//! key, starts the kernel as its child with a parent-death signal, and
//! connects the shell, control and iopub channels. Only something inside
//! this sandbox can reach the ports, and only a holder of the key can
//! drive them.
//!
//! The key is in no file: the connection info goes to the kernel on an
//! inherited pipe, written whole and closed before the kernel starts,
//! which the kernel reads once and closes ([`BOOTSTRAP`]). A command can
//! open any file whatever its mode (commands run as root with
//! `CAP_DAC_OVERRIDE`), so a connection file, even a private one, would
//! hand the key of every later context to a process a rollout left
//! behind. The same bootstrap starts the kernel without the files a
//! command could have planted to run code in it: no IPython configuration
//! file (profile, `/etc/ipython`, ...) is loaded and no startup file
//! (`profile_default/startup`, `PYTHONSTARTUP`) is run, and the working
//! directory is off `sys.path` while the kernel itself is imported.
//!
//! Input lines: `{"op":"send","channel":"shell"|"control","msg_id":..,
//! "msg_type":..,"content":{..},"max_output":N}`, `{"op":"interrupt"}`
//! (SIGINT to the kernel) and `{"op":"sync","id":..}` (answered with
//! `{"event":"sync","id":..}` after every line before it, for corral to find
//! the start of a whole line after its queue dropped some). Output lines: `{"event":"ready","pid":N}`,
//! `{"event":"message","channel":..,"msg_type":..,"parent":..,
//! "content":{..}}` for every signed message the kernel sends,
//! `{"event":"dropped","parent":..,"what":"stdout"|"stderr"|"results"}`
//! once per stream when an execution's output passes its budget,
//! `{"event":"exited","code":..,"signal":..,"oom_killed":..}` when the
//! kernel ends (the tool then exits), and `{"event":"failed","message":..}`
//! when it cannot start. stdin's EOF ends the kernel.
//!
//! Output is bounded here, where it is produced, not downstream: an
//! `execute_request` sent with `max_output` keeps at most that many bytes
//! of its stdout, of its stderr and of its rich results (the head; a
//! print larger than what is left is cut to fit), and output no execution
//! of corral's asked for (a background thread printing after its run,
//! once the kernel reported that run idle) is not relayed at all. Past the budget a message is dropped on its
//! headers alone, unverified and unparsed, so a kernel printing forever
//! costs the relay little more than reading the socket, and no backlog
//! builds up for the next execution to wade through.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::oom::OomCounter;
use crate::sys;

/// How long the kernel may take to answer its first `kernel_info_request`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The delimiter between routing identities and a Jupyter message.
const DELIM: &[u8] = b"<IDS|MSG>";
/// Executions whose output budgets are kept (the newest ones): output of an
/// older one is for nobody.
const KEPT_BUDGETS: usize = 16;

/// Parses LANGUAGE; the languages this tool can start a kernel for.
pub fn parse(rest: &[String]) -> Result<String, String> {
    match rest {
        [lang] => Ok(lang.clone()),
        _ => Err("kernel takes one LANGUAGE".to_string()),
    }
}

/// The Python that starts the kernel: reads the connection info from the
/// pipe whose descriptor is its first argument (and closes it), then runs
/// ipykernel's application with no configuration file, no connection file
/// and no startup file. The kernel does not echo the code it runs on iopub
/// (`execute_input`): corral does not read the echo, and any process of the
/// sandbox may subscribe to iopub, which needs no key. A print waits for
/// the kernel's I/O thread to send what is buffered once 64 KiB are: the
/// stream buffer grows without bound otherwise (a printing loop filled a
/// 1 GiB sandbox in seconds, between two of its 0.2 s flushes and the
/// copies each send makes). `-c` puts the working directory first on
/// `sys.path`; it is taken off before anything is imported (ipykernel puts
/// it back, after the standard library, for the user's code, as
/// `ipykernel_launcher` does).
const BOOTSTRAP: &str = "\
import sys
del sys.path[0]
import json, os
with os.fdopen(int(sys.argv[1]), 'rb') as f:
    info = json.loads(f.read())
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel
from ipykernel.iostream import OutStream
Kernel._publish_execute_input = lambda *args, **kwargs: None
def bounded(write):
    def bounded_write(self, text):
        n = write(self, text)
        if self._buffer.tell() >= 65536 and self._is_master_process():
            self.flush()
        return n
    return bounded_write
OutStream.write = bounded(OutStream.write)
del bounded
class App(IPKernelApp):
    def load_config_file(self, *args, **kwargs):
        pass
    def init_connection_file(self):
        self.connection_file = ''
        self.load_connection_info(App.info)
        del App.info
    def write_connection_file(self):
        pass
    def cleanup_connection_file(self):
        pass
    def _run_startup_files(self):
        pass
App.info = info
del info, f
App.launch_instance(sys.argv[2:])
";

/// The kernel's argv for `language`, its connection info on descriptor
/// `fd`, or why there is none.
fn kernel_argv(language: &str, fd: i32) -> Result<Vec<String>, String> {
    match language {
        // No history database: IPython would write every execution to
        // SQLite in the sandbox, most of a small execution's time, for a
        // history nobody reads (`In`/`Out` still work, in memory).
        "python" | "python3" => Ok(vec![
            "python3".into(),
            "-c".into(),
            BOOTSTRAP.into(),
            fd.to_string(),
            "--HistoryManager.enabled=False".into(),
        ]),
        other => Err(format!(
            "no kernel for language '{other}': corral starts Python kernels (ipykernel)"
        )),
    }
}

/// Writes one JSON line to stdout.
fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Writes `lines` in one write: messages the kernel sent together (a
/// result, the idle status, the reply) reach corral as one read, not one
/// wake-up of every process on the way each.
fn emit_all(lines: &[Value]) {
    if lines.is_empty() {
        return;
    }
    let mut text = String::new();
    for v in lines {
        text.push_str(&v.to_string());
        text.push('\n');
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The output of `f` if it is ready now, without waiting (a receive that
/// is not ready is dropped, as `select!` drops the receives that lose).
fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Most messages gathered into one write.
const BATCH: usize = 64;

fn failed(message: impl Into<String>) -> i32 {
    emit(&json!({"event": "failed", "message": message.into()}));
    1
}

/// Runs the tool; the exit code.
pub fn run(language: &str) -> i32 {
    // Under a relay uid (see `ids`): the kernel runs as the commands' user.
    let kernel_as = match crate::ids::relay_start() {
        Ok(k) => k,
        Err(e) => return failed(e),
    };
    let key = match random_hex(32) {
        Ok(k) => k,
        Err(e) => {
            return failed(format!(
                "cannot read random bytes for the kernel's key: {e}"
            ))
        }
    };
    let ports = match free_ports(5) {
        Ok(p) => p,
        Err(e) => return failed(format!("cannot find free loopback ports: {e}")),
    };
    let conn = json!({
        "transport": "tcp", "ip": "127.0.0.1",
        "shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
        "control_port": ports[3], "hb_port": ports[4],
        "key": key, "signature_scheme": "hmac-sha256",
    });
    let info = match connection_pipe(conn.to_string().as_bytes()) {
        Ok(fd) => fd,
        Err(e) => return failed(format!("cannot hand the kernel its connection info: {e}")),
    };
    let argv = match kernel_argv(language, info.as_raw_fd()) {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // debugpy's note about frozen modules, on every start, is noise.
        .env("PYDEVD_DISABLE_FILE_VALIDATION", "1");
    if let Some(k) = &kernel_as {
        // Before the parent-death signal, which a change of uid clears.
        k.apply(&mut cmd);
    }
    sys::die_with_parent(&mut cmd);
    let oom = OomCounter::detect();
    let oom_before = oom.read();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {}: {e}", argv.join(" "))),
    };
    // The kernel has its copy of the pipe (and reads it once).
    drop(info);
    crate::ids::relay_settle();
    let pid = child.id() as i32;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = child.kill();
            return failed(format!("cannot start the kernel's event loop: {e}"));
        }
    };
    let session = random_hex(16).unwrap_or_default();
    let mut relay = Relay {
        key: key.into_bytes(),
        session,
        budgets: VecDeque::new(),
    };
    let code = rt.block_on(relay.serve(&ports, pid, &mut child));
    let _ = child.kill();
    let status = child.wait().ok();
    if let Some(status) = status {
        use std::os::unix::process::ExitStatusExt;
        let signal = status.signal();
        emit(&json!({
            "event": "exited",
            "code": status.code(),
            "signal": signal,
            "oom_killed": crate::oom::oom_killed(oom_before, oom.read(), signal, false),
        }));
    }
    code
}

struct Relay {
    key: Vec<u8>,
    session: String,
    /// The output budgets of the latest executions, by their msg_id.
    budgets: VecDeque<(String, Budget)>,
}

/// What one execution may still relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Budget {
    /// Bytes left of stdout, stderr and rich results.
    left: [u64; 3],
    /// Which of them dropped something (and said so).
    dropped: [bool; 3],
}

impl Budget {
    fn new(max: u64) -> Budget {
        Budget {
            left: [max; 3],
            dropped: [false; 3],
        }
    }
}

/// Which budget an output message counts against; `None` for messages that
/// are not output (status, replies, errors: always relayed).
fn output_kind(msg_type: &str, content_name: Option<&str>) -> Option<usize> {
    match msg_type {
        "stream" => Some(if content_name == Some("stderr") { 1 } else { 0 }),
        "display_data" | "execute_result" | "update_display_data" => Some(2),
        _ => None,
    }
}

const OUTPUT_NAMES: [&str; 3] = ["stdout", "stderr", "results"];

/// The longest prefix of `text` of at most `max` bytes, on a character
/// boundary.
fn head(text: &str, max: u64) -> &str {
    let mut end = text.len().min(usize::try_from(max).unwrap_or(usize::MAX));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A line corral sent, or the end of its stdin.
enum Input {
    Line(String),
    Eof,
}

impl Relay {
    async fn serve(&mut self, ports: &[u16], pid: i32, child: &mut Child) -> i32 {
        let endpoint = |p: u16| format!("tcp://127.0.0.1:{p}");
        let mut shell = DealerSocket::new();
        let mut control = DealerSocket::new();
        let mut iopub = SubSocket::new();
        let started = Instant::now();
        // The kernel binds its ports a moment after it starts.
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return failed(format!(
                    "the kernel exited before it listened ({status}); is ipykernel installed \
                     in the image (python3 -m ipykernel_launcher)?"
                ));
            }
            if started.elapsed() > START_TIMEOUT {
                return failed("the kernel did not listen within 60 s");
            }
            let ok = shell.connect(&endpoint(ports[0])).await.is_ok()
                && control.connect(&endpoint(ports[3])).await.is_ok()
                && iopub.connect(&endpoint(ports[1])).await.is_ok();
            if ok {
                break;
            }
            shell = DealerSocket::new();
            control = DealerSocket::new();
            iopub = SubSocket::new();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Err(e) = iopub.subscribe("").await {
            return failed(format!("cannot subscribe to the kernel's iopub: {e}"));
        }
        // Ready once the kernel answers kernel_info on shell; iopub's
        // subscription is in place by then too (a kernel_info's status
        // message arrives on it).
        let info_id = random_hex(16).unwrap_or_default();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return failed(format!("the kernel exited while starting ({status})"));
            }
            if started.elapsed() > START_TIMEOUT {
                return failed("the kernel did not answer within 60 s");
            }
            let msg = self.message(&info_id, "kernel_info_request", json!({}));
            if shell.send(msg).await.is_err() {
                return failed("cannot send to the kernel's shell channel");
            }
            let deadline = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(deadline);
            let mut answered = false;
            let mut saw_iopub = false;
            while !(answered && saw_iopub) {
                tokio::select! {
                    m = shell.recv() => {
                        if let Ok(m) = m {
                            if self.verify(m).is_some() {
                                answered = true;
                            }
                        }
                    }
                    m = iopub.recv() => {
                        if m.is_ok() {
                            saw_iopub = true;
                        }
                    }
                    _ = &mut deadline => break,
                }
            }
            if answered && saw_iopub {
                break;
            }
        }
        emit(&json!({"event": "ready", "pid": pid}));

        let (tx, mut rx) = tokio::sync::mpsc::channel::<Input>(64);
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                if tx.blocking_send(Input::Line(line)).is_err() {
                    return;
                }
            }
            let _ = tx.blocking_send(Input::Eof);
        });
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                input = rx.recv() => match input {
                    None | Some(Input::Eof) => return 0,
                    Some(Input::Line(line)) => {
                        if let Err(e) = self.input(&line, pid, &mut shell, &mut control).await {
                            emit(&json!({"event": "refused", "message": e}));
                        }
                    }
                },
                m = shell.recv() => if let Ok(m) = m {
                    let mut lines = self.relay("shell", m);
                    self.gather(&mut shell, &mut control, &mut iopub, &mut lines);
                    emit_all(&lines);
                },
                m = control.recv() => if let Ok(m) = m {
                    let mut lines = self.relay("control", m);
                    self.gather(&mut shell, &mut control, &mut iopub, &mut lines);
                    emit_all(&lines);
                },
                m = iopub.recv() => if let Ok(m) = m {
                    let mut lines = self.relay("iopub", m);
                    self.gather(&mut shell, &mut control, &mut iopub, &mut lines);
                    emit_all(&lines);
                },
                _ = tick.tick() => {
                    if let Ok(Some(_)) = child.try_wait() {
                        return 0;
                    }
                }
            }
        }
    }

    /// Adds the lines of the messages that already arrived on any channel
    /// (at most [`BATCH`]), so they go out in one write.
    fn gather(
        &mut self,
        shell: &mut DealerSocket,
        control: &mut DealerSocket,
        iopub: &mut SubSocket,
        lines: &mut Vec<Value>,
    ) {
        for _ in 0..BATCH {
            let mut got = false;
            if let Some(Ok(m)) = ready_now(iopub.recv()) {
                lines.extend(self.relay("iopub", m));
                got = true;
            }
            if let Some(Ok(m)) = ready_now(shell.recv()) {
                lines.extend(self.relay("shell", m));
                got = true;
            }
            if let Some(Ok(m)) = ready_now(control.recv()) {
                lines.extend(self.relay("control", m));
                got = true;
            }
            if !got {
                return;
            }
        }
    }

    /// Acts on one input line.
    async fn input(
        &mut self,
        line: &str,
        pid: i32,
        shell: &mut DealerSocket,
        control: &mut DealerSocket,
    ) -> Result<(), String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("input line: {e}"))?;
        match v.get("op").and_then(Value::as_str) {
            Some("interrupt") => {
                sys::kill(pid, libc::SIGINT).map_err(|e| format!("interrupt: {e}"))
            }
            Some("send") => {
                let field = |name: &str| {
                    v.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("send: field '{name}' is missing"))
                };
                let msg_id = field("msg_id")?;
                let msg_type = field("msg_type")?;
                let max_output = match v.get("max_output") {
                    None | Some(Value::Null) => None,
                    Some(m) => Some(m.as_u64().ok_or_else(|| {
                        format!("send: field 'max_output' is {m}, not a byte count")
                    })?),
                };
                let content = v.get("content").cloned().unwrap_or_else(|| json!({}));
                let msg = self.message(msg_id, msg_type, content);
                if let Some(max) = max_output {
                    self.track(msg_id, max);
                }
                let socket = match field("channel")? {
                    "shell" => shell,
                    "control" => control,
                    other => {
                        return Err(format!("send: channel '{other}' is not shell or control"))
                    }
                };
                socket.send(msg).await.map_err(|e| format!("send: {e}"))
            }
            // A marker after everything sent so far: corral drops what it
            // reads up to it when output it did not read was dropped.
            Some("sync") => {
                let id = v.get("id").and_then(Value::as_str).unwrap_or("");
                emit(&json!({"event": "sync", "id": id}));
                Ok(())
            }
            other => Err(format!(
                "input line: op {other:?} is not send, interrupt or sync"
            )),
        }
    }

    /// Keeps the output of the execution `msg_id` within `max` bytes per
    /// stream (and of results); the oldest tracked one is forgotten.
    fn track(&mut self, msg_id: &str, max: u64) {
        if self.budgets.len() >= KEPT_BUDGETS {
            self.budgets.pop_front();
        }
        self.budgets
            .push_back((msg_id.to_string(), Budget::new(max)));
    }

    /// A signed Jupyter message with no parent.
    fn message(&self, msg_id: &str, msg_type: &str, content: Value) -> ZmqMessage {
        let header = json!({
            "msg_id": msg_id, "msg_type": msg_type, "session": self.session,
            "username": "corral", "version": "5.3", "date": "1970-01-01T00:00:00.000000Z",
        })
        .to_string();
        let parts = [
            header,
            "{}".to_string(),
            "{}".to_string(),
            content.to_string(),
        ];
        let sig = self.sign(&parts);
        let mut frames: Vec<Bytes> = vec![Bytes::from_static(DELIM), Bytes::from(sig)];
        frames.extend(parts.into_iter().map(Bytes::from));
        ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Vec::<u8>::new()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        Hmac::<Sha256>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!())
    }

    fn sign<T: AsRef<[u8]>>(&self, parts: &[T]) -> String {
        let mut mac = self.mac();
        for p in parts {
            mac.update(p.as_ref());
        }
        hex(&mac.finalize().into_bytes())
    }

    /// The message's header, parent header and content, when its signature
    /// is the key's.
    fn verify(&self, msg: ZmqMessage) -> Option<(Value, Value, Value)> {
        let frames = msg.into_vec();
        let at = frames.iter().position(|f| f.as_ref() == DELIM)?;
        let rest = &frames[at + 1..];
        if rest.len() < 5 {
            return None;
        }
        let mut mac = self.mac();
        for p in &rest[1..5] {
            mac.update(p);
        }
        let given = std::str::from_utf8(&rest[0]).ok()?;
        let want = unhex(given)?;
        mac.verify_slice(&want).ok()?;
        let header = serde_json::from_slice(&rest[1]).ok()?;
        let parent = serde_json::from_slice(&rest[2]).ok()?;
        let content = serde_json::from_slice(&rest[4]).ok()?;
        Some((header, parent, content))
    }

    /// The lines that pass a verified message on to corral, within its
    /// execution's output budget (none for a message dropped).
    fn relay(&mut self, channel: &str, msg: ZmqMessage) -> Vec<Value> {
        let mut out = Vec::new();
        let frames = msg.into_vec();
        let Some(at) = frames.iter().position(|f| f.as_ref() == DELIM) else {
            return out;
        };
        let rest = &frames[at + 1..];
        if rest.len() < 5 {
            return out;
        }
        // The headers are small; the content may be megabytes. Output past
        // its budget is dropped on the headers alone: unverified, which is
        // harmless, since nothing of it is relayed or counted.
        let Ok(header) = serde_json::from_slice::<Value>(&rest[1]) else {
            return out;
        };
        let Ok(parent) = serde_json::from_slice::<Value>(&rest[2]) else {
            return out;
        };
        let msg_type = header
            .get("msg_type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let parent_id = parent
            .get("msg_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // Nothing corral reads: the busy status and the echo of the code
        // (as large as the code). Not relaying them saves a wake-up of
        // every process on the way per message.
        if channel == "iopub" && matches!(msg_type.as_str(), "execute_input" | "status") {
            let busy = msg_type == "execute_input"
                || serde_json::from_slice::<Value>(&rest[4])
                    .ok()
                    .and_then(|c| c.get("execution_state").cloned())
                    .is_some_and(|s| s != "idle");
            if busy {
                return out;
            }
        }
        let is_output = channel == "iopub" && output_kind(&msg_type, None).is_some();
        let slot = if is_output {
            match self.budgets.iter().position(|(id, _)| *id == parent_id) {
                // Output for no execution corral asked for: nobody reads it.
                None => return out,
                Some(i) => {
                    let b = &self.budgets[i].1;
                    // A stream's name is in the content: drop on the headers
                    // only when both streams are spent.
                    let spent = match msg_type.as_str() {
                        "stream" => b.left[0] == 0 && b.left[1] == 0,
                        _ => b.left[2] == 0,
                    };
                    if spent {
                        return out;
                    }
                    Some(i)
                }
            }
        } else {
            None
        };
        if !self.verified(rest) {
            return out;
        }
        let Ok(mut content) = serde_json::from_slice::<Value>(&rest[4]) else {
            return out;
        };
        if let Some(i) = slot {
            let name = content.get("name").and_then(Value::as_str);
            let Some(kind) = output_kind(&msg_type, name) else {
                return out;
            };
            let budget = &mut self.budgets[i].1;
            let first = !budget.dropped[kind];
            if kind == 2 {
                // As corral counts a result: its MIME values serialised.
                let size: u64 = content
                    .get("data")
                    .and_then(Value::as_object)
                    .map(|d| d.values().map(|v| v.to_string().len() as u64).sum())
                    .unwrap_or(0);
                if size > budget.left[2] {
                    // Dropped whole; a smaller one later may still fit.
                    budget.dropped[2] = true;
                    if first {
                        out.push(dropped(&parent_id, 2));
                    }
                    return out;
                }
                budget.left[2] -= size;
            } else {
                let text = content.get("text").and_then(Value::as_str).unwrap_or("");
                if text.len() as u64 > budget.left[kind] {
                    // The head that fits, and nothing more of this stream.
                    let kept = head(text, budget.left[kind]).to_string();
                    budget.left[kind] = 0;
                    budget.dropped[kind] = true;
                    if !kept.is_empty() {
                        content["text"] = Value::String(kept);
                        out.push(message(channel, &msg_type, &parent_id, content));
                    }
                    if first {
                        out.push(dropped(&parent_id, kind));
                    }
                    return out;
                }
                budget.left[kind] -= text.len() as u64;
            }
        }
        if channel == "iopub" && msg_type == "status" {
            // Idle (busy is not relayed): the execution is over, and its
            // output before this came first on this socket. What a thread
            // it started prints later under its id is for nobody, so it
            // is not relayed either.
            self.budgets.retain(|(id, _)| *id != parent_id);
        }
        out.push(message(channel, &msg_type, &parent_id, content));
        out
    }

    /// Whether the frames after the delimiter carry the key's signature.
    fn verified(&self, rest: &[Bytes]) -> bool {
        let mut mac = self.mac();
        for p in &rest[1..5] {
            mac.update(p);
        }
        let Some(want) = std::str::from_utf8(&rest[0]).ok().and_then(unhex) else {
            return false;
        };
        mac.verify_slice(&want).is_ok()
    }
}

/// The line that tells corral that an execution's `kind` output passed
/// its budget.
fn dropped(parent: &str, kind: usize) -> Value {
    json!({"event": "dropped", "parent": parent, "what": OUTPUT_NAMES[kind]})
}

/// The line that relays one kernel message.
fn message(channel: &str, msg_type: &str, parent: &str, content: Value) -> Value {
    json!({
        "event": "message",
        "channel": channel,
        "msg_type": msg_type,
        "parent": parent,
        "content": content,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex(&buf))
}

/// The read end of a pipe holding `info` whole, its write end closed, to
/// be inherited by the next child spawned (the only descriptor here that
/// does not close on exec). `info` is far below the pipe's capacity, so
/// the write does not wait for a reader.
fn connection_pipe(info: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    let (read, write) = sys::pipe()?;
    let mut w = std::fs::File::from(write);
    w.write_all(info)?;
    drop(w);
    // SAFETY: F_SETFD on a descriptor we own; clearing FD_CLOEXEC lets
    // the kernel inherit it.
    if unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETFD, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(read)
}

/// `n` distinct ports free on loopback now (bound, then released).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_and_verifies_with_the_key_only() {
        let relay = test_relay();
        let msg = relay.message("id1", "execute_request", json!({"code": "1"}));
        let (header, _, content) = relay.verify(msg.clone()).expect("own signature verifies");
        assert_eq!(header["msg_id"], "id1");
        assert_eq!(content["code"], "1");
        let other = Relay {
            key: b"other".to_vec(),
            session: "s".into(),
            budgets: VecDeque::new(),
        };
        assert!(
            other.verify(msg).is_none(),
            "another key's signature is refused"
        );
    }

    /// A message as the kernel sends it: signed with `key`, answering
    /// `parent`.
    fn from_kernel(key: &[u8], msg_type: &str, parent: &str, content: Value) -> ZmqMessage {
        let signer = Relay {
            key: key.to_vec(),
            session: "k".into(),
            budgets: VecDeque::new(),
        };
        let parts = [
            json!({"msg_id": "m", "msg_type": msg_type}).to_string(),
            json!({"msg_id": parent}).to_string(),
            "{}".to_string(),
            content.to_string(),
        ];
        let sig = signer.sign(&parts);
        let mut frames: Vec<Bytes> = vec![Bytes::from_static(DELIM), Bytes::from(sig)];
        frames.extend(parts.into_iter().map(Bytes::from));
        ZmqMessage::try_from(frames).expect("frames")
    }

    fn stream(name: &str, text: &str) -> Value {
        json!({"name": name, "text": text})
    }

    /// A relay keyed `k` in session `s`, tracking no execution yet.
    fn test_relay() -> Relay {
        Relay {
            key: b"k".to_vec(),
            session: "s".into(),
            budgets: VecDeque::new(),
        }
    }

    #[test]
    fn output_is_kept_within_each_executions_budget() {
        let mut relay = test_relay();
        relay.track("e1", 10);
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "0123456")),
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["content"]["text"], "0123456");
        // Cut to the 3 bytes left, then the notice; later output goes.
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "abcdef")),
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0]["content"]["text"], "abc");
        assert_eq!(
            out[1],
            json!({"event": "dropped", "parent": "e1", "what": "stdout"})
        );
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "more")),
        );
        assert!(out.is_empty(), "{out:?}");
        // stderr has a budget of its own; a cut keeps whole characters.
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stderr", "ééééééé")),
        );
        assert_eq!(out[0]["content"]["text"], "ééééé");
        assert_eq!(out[1]["what"], "stderr");
        // A result too large is dropped whole; a small one still fits.
        let big = json!({"data": {"text/plain": "x".repeat(20)}});
        let out = relay.relay("iopub", from_kernel(b"k", "display_data", "e1", big));
        assert_eq!(
            out,
            vec![json!({"event": "dropped", "parent": "e1", "what": "results"})]
        );
        let small = json!({"data": {"text/plain": "1"}});
        let out = relay.relay("iopub", from_kernel(b"k", "execute_result", "e1", small));
        assert_eq!(out[0]["msg_type"], "execute_result");
        // Status and replies are not output: always relayed.
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "status", "e1", json!({"execution_state": "idle"})),
        );
        assert_eq!(out.len(), 1);
        let out = relay.relay(
            "shell",
            from_kernel(b"k", "execute_reply", "e1", json!({"status": "ok"})),
        );
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn output_for_no_execution_or_with_a_wrong_signature_is_not_relayed() {
        let mut relay = test_relay();
        relay.track("e1", 100);
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "other", stream("stdout", "x")),
        );
        assert!(out.is_empty(), "{out:?}");
        let out = relay.relay(
            "iopub",
            from_kernel(b"forged", "stream", "e1", stream("stdout", "x")),
        );
        assert!(out.is_empty(), "{out:?}");
        let out = relay.relay("iopub", from_kernel(b"forged", "status", "e1", json!({})));
        assert!(out.is_empty(), "{out:?}");
        // Only the newest executions are tracked.
        for i in 0..KEPT_BUDGETS {
            relay.track(&format!("n{i}"), 100);
        }
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "x")),
        );
        assert!(out.is_empty(), "{out:?}");
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "n0", stream("stdout", "x")),
        );
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn output_after_its_execution_went_idle_is_not_relayed() {
        let mut relay = test_relay();
        relay.track("e1", 100);
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "during")),
        );
        assert_eq!(out.len(), 1);
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "status", "e1", json!({"execution_state": "idle"})),
        );
        assert_eq!(out.len(), 1, "the idle status itself is relayed");
        let out = relay.relay(
            "iopub",
            from_kernel(b"k", "stream", "e1", stream("stdout", "after")),
        );
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn only_python_has_a_kernel() {
        assert!(kernel_argv("python", 3).is_ok());
        let e = kernel_argv("r", 3).expect_err("no R kernel");
        assert!(e.contains("'r'"), "{e}");
        assert_eq!(unhex(&hex(&[0, 255, 16])), Some(vec![0, 255, 16]));
        assert_eq!(unhex("zz"), None);
    }
}
