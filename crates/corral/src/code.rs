//! Code contexts: stateful Jupyter kernels in a sandbox.
//!
//! A context is a kernel process inside the sandbox, started and spoken to
//! by `corral-agent kernel LANGUAGE` (the agent's binary, started as a
//! relay: under a uid no command has, non-dumpable, on sockets, so no
//! command can stop it or speak for it; ZeroMQ on the sandbox's loopback
//! with a random key, relayed to here as JSON lines over its stdin and
//! stdout). The kernel runs as the commands' user: bounded like a
//! command, and ended like one: a reset, an
//! exclusive command or a new control session kills it; its next run then
//! starts a fresh kernel (its state is gone).
//!
//! A sandbox holds at most a given number of contexts
//! ([`DEFAULT_MAX_CODE_CONTEXTS`] unless the caller says otherwise; the
//! service's `server.limits.max_code_contexts`): one more is refused by
//! name. A run may be `exclusive` ([`RunCode::exclusive`]): its context
//! gets a fresh kernel started as an exclusive command, so every other
//! process of the sandbox (other contexts' kernels included) is gone
//! before it starts, as a grader needs after a rollout.
//!
//! The service's memory for a context is bounded whether or not anyone
//! reads it: between runs at most [`IDLE_QUEUE`] bytes of the relay's
//! output wait (what arrives then is for nobody and is dropped), and
//! during a run at most what that run's `max_output` allows, which the
//! caller charges to its budget.
//!
//! An execution streams [`CodeEvent`]s (stdout, stderr, rich results with
//! their MIME bundle, the error) and ends with a [`CodeOutcome`]: output
//! and results are capped by the command's output budget per stream, a
//! timeout interrupts the kernel (and restarts it when the interrupt does
//! not land) and is a typed `timeout`, a kernel killed by the OOM killer a
//! typed `oom_killed`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_core::protocol::AGENT_PATH;
use corral_core::{CommandSpec, Failure, FailureKind};
use std::future::Future;

use serde::Serialize;
use serde_json::{json, Value};

use crate::sandbox::{ExecEvent, Execution, OutputStream, Sandbox, StdinWriter};

/// The id of the context a run without one uses (Python).
pub const DEFAULT_CONTEXT: &str = "default";

/// How long a kernel may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an interrupted execution may take to stop before the kernel is
/// restarted.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// Output of the relay queued between runs, while nothing reads it: more
/// is dropped. What the relay sends then is for nobody (output of a
/// thread still printing after its run, the notice that the kernel
/// ended), and the next run drops it unread; only the notice matters, and
/// its end is also reported by the agent, never dropped. Kept small so
/// that contexts nobody runs cost the service little whatever their
/// kernels do.
pub const IDLE_QUEUE: usize = 64 << 10;
/// Queue room a run has beyond its output budget (the relay's framing,
/// status lines and replies).
const RUN_QUEUE_SLACK: usize = 1 << 20;
/// How long the relay may take to answer a resynchronisation (it may
/// first send a backlog of output for an execution nobody reads any more).
const RESYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Contexts a sandbox may hold when the caller gives no limit.
pub const DEFAULT_MAX_CODE_CONTEXTS: usize = 16;
/// The longest relay line taken (a result's MIME bundle included).
const MAX_LINE: usize = 64 << 20;

/// A code context as its owner sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CodeContext {
    /// Its id (`default` for the one runs without a context use).
    pub id: String,
    /// Its language (`python`).
    pub language: String,
    /// Its working directory (`None`: the sandbox's).
    pub cwd: Option<String>,
}

/// One execution's request.
#[derive(Debug, Clone)]
pub struct RunCode {
    /// The code.
    pub code: String,
    /// Environment variables set for this execution only.
    pub env: Vec<(String, String)>,
    /// Interrupt the execution after this long.
    pub timeout: Option<Duration>,
    /// Bytes kept of stdout, of stderr, and of rich results.
    pub max_output: u64,
    /// Run it in a fresh kernel with nothing else alive in the sandbox:
    /// the context's kernel is restarted (its state is lost) as an
    /// exclusive command, which ends every other process first, other
    /// contexts' kernels included (they start afresh at their next run).
    pub exclusive: bool,
    /// Most contexts the sandbox may hold, counted when this run makes
    /// the default context.
    pub max_contexts: usize,
}

impl RunCode {
    /// `code` with the default budget and no timeout.
    pub fn new(code: impl Into<String>) -> RunCode {
        RunCode {
            code: code.into(),
            env: Vec::new(),
            timeout: None,
            max_output: corral_core::command::DEFAULT_MAX_OUTPUT,
            exclusive: false,
            max_contexts: DEFAULT_MAX_CODE_CONTEXTS,
        }
    }
}

/// What an execution produced, in order.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    /// Text the code printed to stdout.
    Stdout {
        /// The text.
        text: String,
    },
    /// Text the code printed to stderr.
    Stderr {
        /// The text.
        text: String,
    },
    /// A rich result: the value of the last expression (`is_main_result`)
    /// or something displayed (a plot). `data` maps MIME types to values
    /// (`text/plain`, `text/html`, `image/png` as base64, ...).
    Result {
        /// The MIME bundle.
        data: serde_json::Map<String, Value>,
        /// True for the value of the code's last expression.
        is_main_result: bool,
    },
    /// The code raised.
    Error {
        /// The exception's name.
        name: String,
        /// Its value.
        value: String,
        /// The traceback's lines.
        traceback: Vec<String>,
    },
}

/// How an execution ended.
#[derive(Debug, Clone, Default)]
pub struct CodeOutcome {
    /// The kernel's execution counter after it.
    pub execution_count: Option<u64>,
    /// Set when it did not run to its end: `timeout`, `oom_killed`, a
    /// kernel that could not start or died.
    pub failure: Option<Failure>,
    /// Output or results beyond the budget were dropped.
    pub truncated: bool,
    /// How long it took.
    pub duration: Duration,
}

/// The contexts of one sandbox (kept by the sandbox, dropped with it).
#[derive(Default)]
pub(crate) struct Kernels(Mutex<HashMap<String, Arc<Context>>>);

impl Kernels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Context>>> {
        // Plain map updates: a panic cannot leave one half-done.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

struct Context {
    info: CodeContext,
    /// The running relay; `None` before the first run and after the kernel
    /// ended. Held for a whole execution: one at a time per context.
    io: tokio::sync::Mutex<Option<Relay>>,
}

/// One `corral-agent kernel` command.
struct Relay {
    exec: Execution,
    stdin: StdinWriter,
    partial: Vec<u8>,
    lines: VecDeque<Value>,
    /// The relay's (and kernel's) last stderr bytes, for error messages.
    stderr: Vec<u8>,
    /// It ended while no run read it (seen by [`Relay::idle`]).
    ended: bool,
    /// Output bytes the queue had dropped when the lines were last known
    /// whole ([`Relay::resync`]).
    dropped_seen: u64,
}

/// What reading the relay gave.
enum Read {
    Line(Value),
    Ended(String),
}

impl Relay {
    async fn start(sb: &Sandbox, info: &CodeContext, exclusive: bool) -> Result<Relay, Failure> {
        let mut cmd = CommandSpec::argv([AGENT_PATH, "kernel", info.language.as_str()]);
        cmd.stdin = Some(Vec::new());
        cmd.cwd = info.cwd.clone();
        // Under a uid of its own: no command can stop it or speak for it.
        cmd.relay = true;
        cmd.exclusive = exclusive;
        // The relay lives as long as its context: its output is capped per
        // execution here, not per command.
        cmd.max_output = u64::MAX / 4;
        let exec = sb.exec_with_budget(&cmd, IDLE_QUEUE).await?;
        let stdin = exec.stdin();
        let mut relay = Relay {
            exec,
            stdin,
            partial: Vec::new(),
            lines: VecDeque::new(),
            stderr: Vec::new(),
            ended: false,
            dropped_seen: 0,
        };
        let started = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match relay.read().await {
                    Read::Line(v) => match v["event"].as_str() {
                        Some("ready") => return Ok(()),
                        Some("failed") => {
                            let msg = v["message"].as_str().unwrap_or("").to_string();
                            let kind = if msg.starts_with("no kernel for language") {
                                FailureKind::Unsupported
                            } else {
                                FailureKind::SpawnFailed
                            };
                            return Err(Failure::new(kind, relay.explain(&msg)));
                        }
                        _ => {}
                    },
                    Read::Ended(why) => {
                        return Err(Failure::new(FailureKind::SpawnFailed, relay.explain(&why)))
                    }
                }
            }
        })
        .await;
        let sbid = sb.id();
        match started {
            Ok(Ok(())) => Ok(relay),
            Ok(Err(mut f)) => {
                f.message = format!("sandbox {sbid}: code context '{}': {}", info.id, f.message);
                Err(f)
            }
            Err(_) => {
                let _ = relay.stdin.close().await;
                Err(Failure::new(
                    FailureKind::Timeout,
                    format!(
                        "sandbox {sbid}: code context '{}': the kernel did not start within {START_TIMEOUT:?}",
                        info.id
                    ),
                ))
            }
        }
    }

    /// `what`, with the kernel's last stderr lines.
    fn explain(&self, what: &str) -> String {
        let tail = String::from_utf8_lossy(&self.stderr);
        let tail = tail.trim();
        if tail.is_empty() {
            what.to_string()
        } else {
            format!("{what}; the kernel's stderr ends: {tail}")
        }
    }

    /// The relay's next line.
    async fn read(&mut self) -> Read {
        loop {
            if let Some(v) = self.lines.pop_front() {
                return Read::Line(v);
            }
            match self.exec.next_event().await {
                ExecEvent::Output(OutputStream::Stdout, bytes) => self.take(&bytes),
                ExecEvent::Output(OutputStream::Stderr, bytes) => {
                    self.stderr.extend_from_slice(&bytes);
                    let over = self.stderr.len().saturating_sub(2048);
                    self.stderr.drain(..over);
                }
                ExecEvent::Ended(r) => {
                    let why = match &r.failure {
                        Some(f) => f.message.clone(),
                        None => match (r.exit_code, r.signal) {
                            (_, Some(s)) => format!("the kernel's relay was killed by signal {s}"),
                            (c, None) => format!("the kernel's relay exited ({c:?})"),
                        },
                    };
                    // Lines it sent before ending (its `exited` report) first.
                    if let Some(v) = self.lines.pop_front() {
                        self.lines
                            .push_back(json!({"event": "relay_ended", "why": why}));
                        return Read::Line(v);
                    }
                    return Read::Ended(why);
                }
            }
        }
    }

    /// Reads what the relay sent while no execution ran (stale messages,
    /// its end); false when it ended.
    fn drain_idle(&mut self) -> bool {
        loop {
            // Polled once: only what already arrived.
            let next = self.read();
            tokio::pin!(next);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match next.as_mut().poll(&mut cx) {
                std::task::Poll::Pending => return true,
                std::task::Poll::Ready(Read::Ended(_)) => return false,
                std::task::Poll::Ready(Read::Line(v)) => {
                    if matches!(v["event"].as_str(), Some("exited" | "relay_ended")) {
                        return false;
                    }
                }
            }
        }
    }

    /// Room for one run's output in the queue (`max_output` per stream
    /// and of results), then back to the idle queue with [`Relay::idle`].
    fn running(&self, max_output: u64) {
        let room = usize::try_from(max_output.saturating_mul(3))
            .unwrap_or(usize::MAX)
            .saturating_add(RUN_QUEUE_SLACK);
        self.exec.set_output_budget(room);
    }

    /// Makes the lines whole again when the queue dropped output since
    /// they last were (a line cut in the middle would swallow the next
    /// one, a run's result say): asks the relay for a marker line and
    /// drops everything up to it. Err when the relay ended or did not
    /// answer.
    async fn resync(&mut self) -> Result<(), String> {
        let dropped = self.exec.dropped_output();
        if dropped == self.dropped_seen && self.partial.is_empty() {
            return Ok(());
        }
        self.partial.clear();
        self.lines.clear();
        let id = new_id();
        let marker = format!("{{\"event\":\"sync\",\"id\":\"{id}\"}}");
        self.send(json!({"op": "sync", "id": id})).await?;
        let found = tokio::time::timeout(RESYNC_TIMEOUT, async {
            let mut pending: Vec<u8> = Vec::new();
            loop {
                match self.exec.next_event().await {
                    ExecEvent::Output(OutputStream::Stdout, bytes) => {
                        pending.extend_from_slice(&bytes);
                        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = pending.drain(..=at).collect();
                            if line[..line.len() - 1].ends_with(marker.as_bytes()) {
                                // What follows is whole lines.
                                self.take(&pending);
                                return Ok(());
                            }
                        }
                        if pending.len() > MAX_LINE {
                            pending.clear();
                        }
                    }
                    ExecEvent::Output(OutputStream::Stderr, _) => {}
                    ExecEvent::Ended(_) => return Err("the kernel's relay ended".to_string()),
                }
            }
        })
        .await;
        match found {
            Ok(Ok(())) => {
                self.dropped_seen = self.exec.dropped_output();
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "the kernel's relay did not answer within {RESYNC_TIMEOUT:?}"
            )),
        }
    }

    /// Between runs: a small queue, what the run left queued dropped (its
    /// reservation ends with it), and the buffers it grew handed back.
    fn idle(&mut self) {
        self.exec.set_output_budget(IDLE_QUEUE);
        if !self.drain_idle() {
            self.ended = true;
        }
        self.partial = Vec::new();
        self.lines = VecDeque::new();
    }

    fn take(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=at).collect();
            // A line cut by a full idle queue does not parse: skipped.
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                self.lines.push_back(v);
            }
        }
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
        }
    }

    async fn send(&self, line: Value) -> Result<(), String> {
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        self.stdin.write(&bytes).await
    }

    /// Sends one execute request, whose output the relay keeps within
    /// `max_output` bytes per stream (and of results). `stop_on_error` is
    /// off: executions are sent one at a time, and with it on the kernel
    /// aborts (runs nothing of) a request arriving just after an error or
    /// an interrupt.
    async fn execute(
        &self,
        msg_id: &str,
        code: &str,
        silent: bool,
        max_output: u64,
    ) -> Result<(), String> {
        self.send(json!({
            "op": "send", "channel": "shell", "msg_id": msg_id, "msg_type": "execute_request",
            "content": {
                "code": code, "silent": silent, "store_history": !silent,
                "user_expressions": {}, "allow_stdin": false, "stop_on_error": false,
            },
            "max_output": max_output,
        }))
        .await
    }
}

/// The kind `follow` hands on for the relay's notice that it dropped output.
const DROPPED: &str = "corral:dropped";

/// How one execution went on the kernel's side.
enum Ran {
    /// Reply and idle seen.
    Done,
    /// The relay or the kernel ended; why, and whether the OOM killer did it.
    Died(String, bool),
}

/// Per-execution budget bookkeeping.
struct Budget {
    max: u64,
    stdout: u64,
    stderr: u64,
    results: u64,
    truncated: bool,
}

impl Budget {
    /// Whether `n` more bytes of `which` fit; records a refusal.
    fn fits(&mut self, which: u8, n: usize) -> bool {
        let used = match which {
            0 => &mut self.stdout,
            1 => &mut self.stderr,
            _ => &mut self.results,
        };
        if used.saturating_add(n as u64) > self.max {
            self.truncated = true;
            false
        } else {
            *used += n as u64;
            true
        }
    }

    /// The head of `text` that fits in stream `which` (0 stdout, 1
    /// stderr), taken from its budget; records a cut.
    fn take(&mut self, which: u8, text: &str) -> String {
        let used = if which == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        let left = self.max.saturating_sub(*used);
        if text.len() as u64 <= left {
            *used += text.len() as u64;
            return text.to_string();
        }
        self.truncated = true;
        let mut end = usize::try_from(left).unwrap_or(usize::MAX).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        *used += end as u64;
        text[..end].to_string()
    }
}

fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{:x}{:08x}", t & 0xffff_ffff_ffff, n)
}

/// Reads relay lines until the execution `msg_id` is done (its reply and
/// the kernel's idle status), handing its messages to `on`.
async fn follow(relay: &mut Relay, msg_id: &str, mut on: impl FnMut(&str, &str, &Value)) -> Ran {
    let (mut replied, mut idle) = (false, false);
    while !(replied && idle) {
        match relay.read().await {
            Read::Line(v) => match v["event"].as_str() {
                Some("message") if v["parent"].as_str() == Some(msg_id) => {
                    let channel = v["channel"].as_str().unwrap_or("");
                    let kind = v["msg_type"].as_str().unwrap_or("");
                    let content = &v["content"];
                    if kind == "execute_reply" {
                        replied = true;
                    }
                    if kind == "status" && content["execution_state"] == "idle" {
                        idle = true;
                    }
                    on(channel, kind, content);
                }
                // The relay dropped output past the execution's budget.
                Some("dropped") if v["parent"].as_str() == Some(msg_id) => {
                    on("", DROPPED, &v);
                }
                Some("exited") => {
                    let oom = v["oom_killed"].as_bool() == Some(true);
                    let why = match (v["code"].as_i64(), v["signal"].as_i64()) {
                        (_, Some(s)) => format!("the kernel was killed by signal {s}"),
                        (c, None) => format!("the kernel exited ({})", c.unwrap_or(-1)),
                    };
                    return Ran::Died(relay.explain(&why), oom);
                }
                Some("relay_ended") => {
                    return Ran::Died(v["why"].as_str().unwrap_or("").to_string(), false)
                }
                _ => {}
            },
            Read::Ended(why) => return Ran::Died(why, false),
        }
    }
    Ran::Done
}

/// Interrupts the kernel when an execution is dropped before it finished
/// (its caller went away): the kernel does not keep running its code.
struct InterruptOnDrop(Option<StdinWriter>);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(stdin) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = stdin.write(b"{\"op\":\"interrupt\"}\n").await;
                });
            }
        }
    }
}

impl Sandbox {
    /// Creates a code context: a kernel for `language` (`python`; `None`
    /// is Python) started in `cwd`. A language without a kernel is a typed
    /// `unsupported`; a kernel that cannot start, `spawn_failed`.
    pub async fn create_code_context(
        &self,
        language: Option<&str>,
        cwd: Option<&str>,
    ) -> Result<CodeContext, Failure> {
        self.create_code_context_within(language, cwd, DEFAULT_MAX_CODE_CONTEXTS)
            .await
    }

    /// [`Sandbox::create_code_context`] in a sandbox that may hold at most
    /// `max` contexts (the default one included): one more is a typed
    /// `invalid_spec` naming the limit.
    pub async fn create_code_context_within(
        &self,
        language: Option<&str>,
        cwd: Option<&str>,
        max: usize,
    ) -> Result<CodeContext, Failure> {
        let language = normalize_language(language).map_err(|f| *f)?;
        let info = CodeContext {
            id: new_id(),
            language,
            cwd: cwd.map(str::to_string),
        };
        let ctx = Arc::new(Context {
            info: info.clone(),
            io: tokio::sync::Mutex::new(None),
        });
        // Held (locked) before it is counted, so that no run takes it
        // half-started; counted before it starts, so that concurrent
        // creates cannot pass the limit together.
        let mut io = ctx.io.lock().await;
        {
            let mut map = self.kernels().lock();
            if map.len() >= max {
                return Err(self.too_many_contexts(map.len(), max));
            }
            map.insert(info.id.clone(), ctx.clone());
        }
        match Relay::start(self, &info, false).await {
            Ok(mut relay) => {
                relay.idle();
                *io = Some(relay);
                Ok(info)
            }
            Err(f) => {
                self.kernels().lock().remove(&info.id);
                Err(f)
            }
        }
    }

    fn too_many_contexts(&self, has: usize, max: usize) -> Failure {
        Failure::new(
            FailureKind::InvalidSpec,
            format!(
                "code contexts: sandbox {} already holds {has}, its limit of {max} \
                 (server.limits.max_code_contexts); delete one first",
                self.id()
            ),
        )
    }

    /// The sandbox's code contexts.
    pub fn code_contexts(&self) -> Vec<CodeContext> {
        let mut all: Vec<CodeContext> = self
            .kernels()
            .lock()
            .values()
            .map(|c| c.info.clone())
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Ends a context's kernel and forgets it; false when there is none.
    pub async fn remove_code_context(&self, id: &str) -> bool {
        let Some(ctx) = self.kernels().lock().remove(id) else {
            return false;
        };
        if let Some(relay) = ctx.io.lock().await.take() {
            let _ = relay.stdin.close().await;
        }
        true
    }

    /// Restarts a context's kernel (its state is lost); false when there
    /// is no such context.
    pub async fn restart_code_context(&self, id: &str) -> Result<bool, Failure> {
        let Some(ctx) = self.kernels().lock().get(id).cloned() else {
            return Ok(false);
        };
        let mut io = ctx.io.lock().await;
        if let Some(relay) = io.take() {
            let _ = relay.stdin.close().await;
        }
        let mut relay = Relay::start(self, &ctx.info, false).await?;
        relay.idle();
        *io = Some(relay);
        Ok(true)
    }

    /// Runs `req` in the context `context` (`None`: the default Python
    /// context, made on first use), calling `on_event` with what it
    /// produces as it arrives. An unknown context is `invalid_spec` naming
    /// it. A context whose kernel ended (a reset, an OOM kill, an exclusive
    /// command) gets a fresh kernel first.
    pub async fn run_code(
        &self,
        context: Option<&str>,
        req: &RunCode,
        mut on_event: impl FnMut(CodeEvent),
    ) -> Result<CodeOutcome, Failure> {
        let started = Instant::now();
        let id = context.unwrap_or(DEFAULT_CONTEXT);
        let ctx = {
            let mut map = self.kernels().lock();
            match map.get(id) {
                Some(c) => c.clone(),
                None if id == DEFAULT_CONTEXT => {
                    if map.len() >= req.max_contexts {
                        return Err(self.too_many_contexts(map.len(), req.max_contexts));
                    }
                    let c = Arc::new(Context {
                        info: CodeContext {
                            id: DEFAULT_CONTEXT.to_string(),
                            language: "python".to_string(),
                            cwd: None,
                        },
                        io: tokio::sync::Mutex::new(None),
                    });
                    map.insert(id.to_string(), c.clone());
                    c
                }
                None => {
                    return Err(Failure::new(
                        FailureKind::InvalidSpec,
                        format!(
                            "context_id '{id}': sandbox {} has no such code context",
                            self.id()
                        ),
                    ))
                }
            }
        };
        let mut io = ctx.io.lock().await;
        if req.exclusive {
            // A fresh kernel, whatever this one holds: its state could be
            // anyone's.
            if let Some(old) = io.take() {
                let _ = old.stdin.close().await;
            }
        }
        if io.as_mut().is_some_and(|r| r.ended || !r.drain_idle()) {
            // Ended since its last run (an exclusive command, a new
            // session): this run gets a fresh kernel.
            *io = None;
        }
        if io.is_none() {
            *io = Some(Relay::start(self, &ctx.info, req.exclusive).await?);
        }
        if let Some(relay) = io.as_ref() {
            relay.running(req.max_output);
        }
        let mut idle_after = IdleAfter(io);
        let io: &mut Option<Relay> = &mut idle_after.0;
        let Some(relay) = io.as_mut() else {
            unreachable!("started above")
        };
        if let Err(why) = relay.resync().await {
            return Err(self.kernel_lost(io, &ctx.info, &why));
        }
        let sbid = self.id().to_string();
        let mut outcome = CodeOutcome::default();
        let mut budget = Budget {
            max: req.max_output,
            stdout: 0,
            stderr: 0,
            results: 0,
            truncated: false,
        };
        let env: serde_json::Map<String, Value> = req
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let env_id = format!("{}-env", new_id());
        if !env.is_empty() {
            let set = format!(
                "import os as _corral_os\n_corral_env_saved = {{k: _corral_os.environ.get(k) for k in {keys}}}\n_corral_os.environ.update({env})",
                keys = Value::Array(env.keys().cloned().map(Value::String).collect()),
                env = Value::Object(env.clone()),
            );
            if relay.execute(&env_id, &set, true, 0).await.is_err() {
                return Err(self.kernel_lost(io, &ctx.info, "the relay's stdin closed"));
            }
        }
        let msg_id = new_id();
        if relay
            .execute(&msg_id, &req.code, false, req.max_output)
            .await
            .is_err()
        {
            return Err(self.kernel_lost(io, &ctx.info, "the relay's stdin closed"));
        }
        let mut guard = InterruptOnDrop(Some(relay.stdin.clone()));
        if !env.is_empty() {
            if let Ran::Died(why, oom) = follow(relay, &env_id, |_, _, _| {}).await {
                guard.0 = None;
                return Err(self.died(io, &ctx.info, &why, oom));
            }
        }
        let mut notified = false;
        let mut handle =
            |_channel: &str, kind: &str, content: &Value, outcome: &mut CodeOutcome| {
                let event = match kind {
                    "stream" => {
                        let text = content["text"].as_str().unwrap_or("");
                        let which = u8::from(content["name"] == "stderr");
                        let kept = budget.take(which, text);
                        match (kept.is_empty(), which) {
                            (true, _) => None,
                            (false, 0) => Some(CodeEvent::Stdout { text: kept }),
                            (false, _) => Some(CodeEvent::Stderr { text: kept }),
                        }
                    }
                    DROPPED => {
                        budget.truncated = true;
                        None
                    }
                    "execute_result" | "display_data" => {
                        let data = content["data"].as_object().cloned().unwrap_or_default();
                        let size: usize = data.values().map(|v| v.to_string().len()).sum();
                        budget.fits(2, size).then_some(CodeEvent::Result {
                            data,
                            is_main_result: kind == "execute_result",
                        })
                    }
                    "error" => Some(error_event(content)),
                    "execute_input" | "execute_reply" => {
                        if let Some(n) = content["execution_count"].as_u64() {
                            outcome.execution_count = Some(n);
                        }
                        None
                    }
                    _ => None,
                };
                if let Some(e) = event {
                    on_event(e);
                }
                if budget.truncated && !notified {
                    notified = true;
                    on_event(CodeEvent::Stderr {
                        text: format!(
                            "[corral: output beyond {} bytes per stream dropped]\n",
                            budget.max
                        ),
                    });
                }
            };
        let ran = match req.timeout {
            None => follow(relay, &msg_id, |c, k, v| handle(c, k, v, &mut outcome)).await,
            Some(t) => {
                match tokio::time::timeout(
                    t,
                    follow(relay, &msg_id, |c, k, v| handle(c, k, v, &mut outcome)),
                )
                .await
                {
                    Ok(ran) => ran,
                    Err(_) => {
                        // Interrupt; a kernel that does not stop is restarted.
                        let _ = relay.send(json!({"op": "interrupt"})).await;
                        let landed = tokio::time::timeout(
                            INTERRUPT_GRACE,
                            follow(relay, &msg_id, |_, _, _| {}),
                        )
                        .await;
                        guard.0 = None;
                        let how = match landed {
                            Ok(Ran::Done) => "the kernel was interrupted".to_string(),
                            _ => {
                                if let Some(old) = io.take() {
                                    let _ = old.stdin.close().await;
                                }
                                "the interrupt did not stop it, so the kernel was restarted (its state is lost)"
                                    .to_string()
                            }
                        };
                        if let Some(relay) = io.as_mut() {
                            restore_env(relay, &env).await;
                        }
                        outcome.failure = Some(Failure::new(
                            FailureKind::Timeout,
                            format!(
                                "sandbox {sbid}: code context '{}': execution timed out after {t:?}; {how}",
                                ctx.info.id
                            ),
                        ));
                        outcome.truncated = budget.truncated;
                        outcome.duration = started.elapsed();
                        return Ok(outcome);
                    }
                }
            }
        };
        guard.0 = None;
        if let Ran::Died(why, oom) = ran {
            return Err(self.died(io, &ctx.info, &why, oom));
        }
        restore_env(relay, &env).await;
        outcome.truncated = budget.truncated;
        outcome.duration = started.elapsed();
        Ok(outcome)
    }

    fn kernels(&self) -> &Kernels {
        self.kernels_slot()
    }

    /// The failure for a kernel that ended mid-execution; the context gets
    /// a fresh kernel at its next run.
    fn died(&self, io: &mut Option<Relay>, info: &CodeContext, why: &str, oom: bool) -> Failure {
        *io = None;
        let sb = self.id();
        if oom {
            let limit = match self.spec().limits.memory {
                Some(m) => format!("memory limit {}", corral_core::units::Bytes(m)),
                None => "no memory limit".to_string(),
            };
            Failure::new(
                FailureKind::OomKilled,
                format!(
                    "sandbox {sb}: code context '{}': the kernel was killed by the OOM killer ({limit}); its next run starts a fresh kernel",
                    info.id
                ),
            )
        } else {
            Failure::new(
                FailureKind::SpawnFailed,
                format!(
                    "sandbox {sb}: code context '{}': {why}; its next run starts a fresh kernel",
                    info.id
                ),
            )
        }
    }

    fn kernel_lost(&self, io: &mut Option<Relay>, info: &CodeContext, why: &str) -> Failure {
        self.died(io, info, why, false)
    }
}

/// A context's relay, put back to its idle queue when the run that holds
/// it ends, however it ends (an early return, a dropped request).
struct IdleAfter<'a>(tokio::sync::MutexGuard<'a, Option<Relay>>);

impl Drop for IdleAfter<'_> {
    fn drop(&mut self) {
        if let Some(relay) = self.0.as_mut() {
            relay.idle();
        }
    }
}

/// Puts back the variables an execution's `env` changed.
async fn restore_env(relay: &mut Relay, env: &serde_json::Map<String, Value>) {
    if env.is_empty() {
        return;
    }
    let id = format!("{}-restore", new_id());
    let code = "for _k, _v in _corral_env_saved.items():\n    if _v is None:\n        _corral_os.environ.pop(_k, None)\n    else:\n        _corral_os.environ[_k] = _v\ndel _k, _v, _corral_env_saved";
    if relay.execute(&id, code, true, 0).await.is_ok() {
        let _ = tokio::time::timeout(INTERRUPT_GRACE, follow(relay, &id, |_, _, _| {})).await;
    }
}

fn error_event(content: &Value) -> CodeEvent {
    CodeEvent::Error {
        name: content["ename"].as_str().unwrap_or("").to_string(),
        value: content["evalue"].as_str().unwrap_or("").to_string(),
        traceback: content["traceback"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The language a context is for; only Python has a kernel.
fn normalize_language(language: Option<&str>) -> Result<String, Box<Failure>> {
    match language.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("python") | Some("python3") => Ok("python".to_string()),
        Some(other) => Err(Box::new(Failure::new(
            FailureKind::Unsupported,
            format!("language '{other}': no kernel for it; corral runs Python code contexts (ipykernel in the image)"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_python_is_a_language() {
        assert_eq!(normalize_language(None).ok().as_deref(), Some("python"));
        assert_eq!(
            normalize_language(Some("Python3")).ok().as_deref(),
            Some("python")
        );
        let f = normalize_language(Some("r")).expect_err("no R kernel");
        assert_eq!(f.kind, FailureKind::Unsupported);
        assert!(f.message.contains("'r'"), "{}", f.message);
    }

    #[test]
    fn budget_counts_each_stream_apart() {
        let mut b = Budget {
            max: 10,
            stdout: 0,
            stderr: 0,
            results: 0,
            truncated: false,
        };
        assert!(b.fits(0, 10));
        assert!(b.fits(1, 10));
        assert!(!b.fits(0, 1));
        assert!(b.truncated);
    }

    #[test]
    fn a_stream_keeps_the_head_that_fits() {
        let mut b = Budget {
            max: 5,
            stdout: 0,
            stderr: 0,
            results: 0,
            truncated: false,
        };
        assert_eq!(b.take(0, "abc"), "abc");
        assert!(!b.truncated);
        // Two bytes left: 'é' is two, 'ü' would not fit.
        assert_eq!(b.take(0, "éü"), "é");
        assert!(b.truncated);
        assert_eq!(b.take(0, "more"), "");
        assert_eq!(b.take(1, "stderr!"), "stder");
    }
}
