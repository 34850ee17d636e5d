//! The control stream to a sandbox's agent: a byte stream the backend opens
//! to PID 1's own stdin and stdout (Docker: the daemon's attach), carrying
//! multiplexed frames for every command.
//!
//! Nothing inside the sandbox relays this stream and PID 1 is non-dumpable,
//! so frames come from the agent or from nowhere. They are still checked as
//! hostile input: a frame for a command corral did not start, output before
//! `Started`, an `Exited` without `Started` or anything after it is a
//! protocol violation that ends the stream, and every command in flight
//! fails with a typed `protocol_violation`, never a result.
//!
//! A reader task decodes frames and routes them by command id; a writer task
//! owns the attach's stdin; a keepalive task pings the agent often enough
//! that its dead-man switch only fires when corral is gone. No lock is held
//! across an await: the routing table sits behind a std mutex touched only
//! for map operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_core::backend::{AgentOutput, AgentStream};
use corral_core::protocol::{
    Frame, FrameKind, Hello, HelloAck, Item, SyncDecoder, PROTOCOL_VERSION, SYNC,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use corral_core::Error;

use crate::host::random_hex;

/// How long the agent may take to answer the handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);

/// The handshake is sent again this often until answered: after a broken
/// stream the agent may first have to drop half a frame (it waits two
/// seconds for the rest) before it sees a new session's sync bytes.
const HELLO_RETRY: Duration = Duration::from_secs(3);

/// Agent stderr kept for diagnostics.
const STDERR_KEEP: usize = 4096;

/// Why a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Closed {
    /// The stream or the container ended; the container's state tells why.
    Ended(String),
    /// The stream broke the protocol: nothing on it can be trusted.
    Violation(String),
}

/// What a route's id was issued for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exchange {
    /// A command: `Started`, output, `Exited` (or `SpawnFailed`).
    Command,
    /// A reset: one `ResetDone` (or an `Error`).
    Reset,
    /// An export: `ExportData` frames of at most this many bytes in all,
    /// then one `ExportDone` (or an `Error`).
    Export(u64),
    /// An import: one `ImportDone` (or an `Error`).
    Import,
    /// A usage reading: one `UsageReport` (or an `Error`).
    Usage,
}

/// One command's route.
struct Route {
    /// Where its frames go; `None` once its waiter is gone (frames are then
    /// checked and dropped until its last one arrives).
    tx: Option<mpsc::UnboundedSender<Frame>>,
    started: bool,
    exchange: Exchange,
    /// Bytes of `ExportData` routed so far.
    exported: u64,
    budget: Arc<Budget>,
}

/// Output queued for one command and not yet taken by its waiter, bounded:
/// beyond `cap`, output frames are dropped and counted, so a sandbox that
/// prints while nobody reads cannot grow corral's memory.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: AtomicUsize,
    queued: AtomicUsize,
    dropped: AtomicU64,
}

#[derive(Default)]
struct Routes {
    map: HashMap<u32, Route>,
    /// Why the stream ended, once it has.
    closed: Option<Closed>,
    /// The last lines the agent wrote to stderr, for diagnostics.
    agent_stderr: String,
}

/// A live control stream.
pub(crate) struct AgentConn {
    routes: Arc<Mutex<Routes>>,
    writer: mpsc::Sender<Vec<u8>>,
    next_id: AtomicU32,
    /// Highest id handed out, to tell "after it ended" from "never started".
    issued: Arc<AtomicU32>,
    tasks: Vec<JoinHandle<()>>,
    /// What the agent said about itself.
    pub hello: HelloAck,
}

fn lock(routes: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    // A panic while holding this lock cannot leave the map inconsistent
    // (every critical section is a few map operations), so poisoning is safe
    // to ignore.
    routes.lock().unwrap_or_else(|p| p.into_inner())
}

fn is_output(kind: FrameKind) -> bool {
    matches!(
        kind,
        FrameKind::Stdout | FrameKind::Stderr | FrameKind::StdoutTail | FrameKind::StderrTail
    )
}

/// Where the reader is: looking for our session's start, or in it.
enum Phase {
    /// Waiting for [`SYNC`] and the HelloAck that echoes `session`.
    Handshake {
        session: String,
        answer: Option<tokio::sync::oneshot::Sender<HelloAck>>,
    },
    Session,
}

impl Routes {
    /// Starts routing frames for `id`, keeping at most `cap` output bytes
    /// queued for its receiver.
    fn add(&mut self, id: u32, cap: usize) -> RouteRx {
        self.add_route(id, cap, Exchange::Command)
    }

    fn add_route(&mut self, id: u32, cap: usize, exchange: Exchange) -> RouteRx {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget {
            cap: AtomicUsize::new(cap),
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        });
        self.map.insert(
            id,
            Route {
                tx: Some(tx),
                started: false,
                exchange,
                exported: 0,
                budget: budget.clone(),
            },
        );
        RouteRx { rx, budget }
    }

    /// Checks one frame against what corral asked for and routes it.
    /// Once the stream was closed from outside (its container died or
    /// went), what the agent still sends is dropped unchecked: the
    /// commands it belongs to already ended typed, and a dying agent
    /// reporting them is no violation.
    fn route(&mut self, frame: Frame, issued: u32) -> Result<(), String> {
        if self.closed.is_some() {
            return Ok(());
        }
        let id = frame.id;
        let kind = frame.kind;
        if id == 0 {
            return match kind {
                FrameKind::Pong => Ok(()),
                FrameKind::Error => Err(format!(
                    "the agent reported a broken stream: {}",
                    String::from_utf8_lossy(&frame.payload)
                )),
                other => Err(format!("unexpected {other:?} frame outside any command")),
            };
        }
        let Some(route) = self.map.get_mut(&id) else {
            return Err(if id <= issued {
                format!("{kind:?} frame for command {id} after it ended")
            } else {
                format!("{kind:?} frame for command {id}, which corral never started")
            });
        };
        let last = match (route.exchange, kind) {
            (Exchange::Command, _) => None,
            (_, FrameKind::Error)
            | (Exchange::Reset, FrameKind::ResetDone)
            | (Exchange::Export(_), FrameKind::ExportDone)
            | (Exchange::Import, FrameKind::ImportDone)
            | (Exchange::Usage, FrameKind::UsageReport) => Some(true),
            (Exchange::Export(cap), FrameKind::ExportData) => {
                route.exported = route.exported.saturating_add(frame.payload.len() as u64);
                if route.exported > cap {
                    return Err(format!(
                        "export {id} sent more than the {cap} bytes asked for"
                    ));
                }
                Some(false)
            }
            (exchange, kind) => return Err(format!("{kind:?} frame for {exchange:?} {id}")),
        };
        if let Some(last) = last {
            if let Some(tx) = &route.tx {
                if tx.send(frame).is_err() {
                    route.tx = None;
                }
            }
            if last {
                self.map.remove(&id);
            }
            return Ok(());
        }
        let last = match (kind, route.started) {
            (FrameKind::Started, false) => {
                route.started = true;
                false
            }
            (FrameKind::SpawnFailed, false) | (FrameKind::Error, false) => true,
            (FrameKind::Exited, true) => true,
            (FrameKind::Error, true) => false,
            (k, true) if is_output(k) => false,
            (k, started) => {
                return Err(format!(
                    "{k:?} frame for command {id} {}",
                    if started {
                        "after it started"
                    } else {
                        "before it started"
                    }
                ))
            }
        };
        let mut deliver = true;
        if is_output(kind) {
            let b = &route.budget;
            let len = frame.payload.len();
            if b.queued.load(Ordering::Relaxed).saturating_add(len) > b.cap.load(Ordering::Relaxed)
            {
                b.dropped.fetch_add(len as u64, Ordering::Relaxed);
                deliver = false;
            } else {
                b.queued.fetch_add(len, Ordering::Relaxed);
            }
        }
        if deliver {
            if let Some(tx) = &route.tx {
                if tx.send(frame).is_err() {
                    route.tx = None;
                }
            }
        }
        if last {
            self.map.remove(&id);
        }
        Ok(())
    }

    fn close(&mut self, why: Closed) {
        if self.closed.is_none() {
            self.closed = Some(why);
        }
        self.map.clear();
    }
}

/// The receiving end of one command's route.
pub(crate) struct RouteRx {
    rx: mpsc::UnboundedReceiver<Frame>,
    budget: Arc<Budget>,
}

impl RouteRx {
    fn taken(&self, frame: &Frame) {
        if is_output(frame.kind) {
            self.budget
                .queued
                .fetch_sub(frame.payload.len(), Ordering::Relaxed);
        }
    }

    /// The next frame; `None` once the stream ended.
    pub async fn recv(&mut self) -> Option<Frame> {
        let frame = self.rx.recv().await?;
        self.taken(&frame);
        Some(frame)
    }

    /// A frame that is already queued, if any.
    pub fn try_recv(&mut self) -> Result<Frame, mpsc::error::TryRecvError> {
        let frame = self.rx.try_recv()?;
        self.taken(&frame);
        Ok(frame)
    }

    /// Changes how much output may wait unread.
    pub fn set_budget(&self, cap: usize) {
        self.budget.cap.store(cap, Ordering::Relaxed);
    }

    /// Output bytes dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.budget.dropped.load(Ordering::Relaxed)
    }
}

impl AgentConn {
    /// Opens a control stream over `stream` (the backend connected it to
    /// the agent of sandbox `sandbox`) and performs the handshake.
    /// `keepalive` is how often the agent hears from corral when nothing
    /// else is sent; `env` is the sandbox's environment, which the agent
    /// gives every command of the session.
    pub async fn open(
        stream: AgentStream,
        sandbox: &str,
        keepalive: Duration,
        env: Vec<(String, String)>,
        restored: bool,
    ) -> Result<Self, Error> {
        let AgentStream { output, mut input } = stream;
        let session = random_hex(32);
        let routes = Arc::new(Mutex::new(Routes::default()));
        let issued = Arc::new(AtomicU32::new(0));
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(read_stream(
            output,
            routes.clone(),
            issued.clone(),
            Phase::Handshake {
                session: session.clone(),
                answer: Some(answer_tx),
            },
            sandbox.to_string(),
        ));

        let (writer, mut rx) = mpsc::channel::<Vec<u8>>(1024);
        let writer_sandbox = sandbox.to_string();
        let writer_task = tokio::spawn(async move {
            while let Some(mut buf) = rx.recv().await {
                // Batch whatever else is queued into one write.
                while let Ok(more) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
                let res = async {
                    input.write_all(&buf).await?;
                    input.flush().await
                }
                .await;
                if let Err(e) = res {
                    tracing::debug!(sandbox = %writer_sandbox, error = %e, "writing to the agent failed");
                    return;
                }
            }
            let _ = input.shutdown().await;
        });
        let pinger = writer.clone();
        let keepalive_task = tokio::spawn(async move {
            let ping = Frame::new(FrameKind::Ping, 0, Vec::new()).encode();
            loop {
                tokio::time::sleep(keepalive).await;
                if pinger.send(ping.clone()).await.is_err() {
                    return;
                }
            }
        });

        let mut conn = AgentConn {
            routes,
            writer,
            next_id: AtomicU32::new(1),
            issued,
            tasks: vec![reader, writer_task, keepalive_task],
            hello: HelloAck::default(),
        };
        let agent_err = |message: String| Error::Agent {
            sandbox: sandbox.to_string(),
            message,
        };
        let mut hello = SYNC.to_vec();
        Frame::json(
            FrameKind::Hello,
            0,
            &Hello {
                protocol: PROTOCOL_VERSION,
                session,
                env,
                restored,
            },
        )
        .encode_into(&mut hello);
        let handshake = async {
            let mut answer_rx = answer_rx;
            loop {
                conn.writer.send(hello.clone()).await.map_err(|_| {
                    agent_err(format!("handshake failed: {}", conn.closed_reason()))
                })?;
                match tokio::time::timeout(HELLO_RETRY, &mut answer_rx).await {
                    Ok(Ok(ack)) => return Ok(ack),
                    Ok(Err(_)) => {
                        return Err(agent_err(format!(
                            "handshake failed: {}",
                            conn.closed_reason()
                        )))
                    }
                    Err(_) => continue,
                }
            }
        };
        let ack = match tokio::time::timeout(HELLO_TIMEOUT, handshake).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(agent_err(format!(
                    "no handshake answer within {HELLO_TIMEOUT:?}{}",
                    conn.stderr_note()
                )))
            }
        };
        if ack.protocol != PROTOCOL_VERSION {
            return Err(agent_err(format!(
                "agent {} speaks protocol {}, corral speaks {PROTOCOL_VERSION}",
                ack.agent_version, ack.protocol
            )));
        }
        conn.hello = ack;
        Ok(conn)
    }

    /// A stream that has ended already, for `reason`: what a sandbox with
    /// no agent to talk to yet holds (one an earlier process paused to
    /// disk), so every command sees it closed.
    pub fn ended(reason: String) -> Self {
        let mut routes = Routes::default();
        routes.close(Closed::Ended(reason));
        let (writer, _) = mpsc::channel::<Vec<u8>>(1);
        AgentConn {
            routes: Arc::new(Mutex::new(routes)),
            writer,
            next_id: AtomicU32::new(1),
            issued: Arc::new(AtomicU32::new(0)),
            tasks: Vec::new(),
            hello: HelloAck::default(),
        }
    }

    /// A fresh command id.
    pub fn next_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                self.issued.fetch_max(id, Ordering::Relaxed);
                return id;
            }
        }
    }

    /// Routes frames for `id` to the returned receiver, keeping at most
    /// `cap` bytes of output queued; fails when the stream has already
    /// ended.
    pub fn register(&self, id: u32, cap: usize) -> Result<RouteRx, String> {
        let mut r = lock(&self.routes);
        if let Some(closed) = &r.closed {
            return Err(describe(closed));
        }
        Ok(r.add(id, cap))
    }

    /// Routes the answer to reset `id` to the returned receiver.
    pub fn register_reset(&self, id: u32) -> Result<RouteRx, String> {
        self.register_exchange(id, Exchange::Reset)
    }

    /// Routes the frames of exchange `id` (a reset, an export, an import, a
    /// usage reading)
    /// to the returned receiver.
    pub fn register_exchange(&self, id: u32, exchange: Exchange) -> Result<RouteRx, String> {
        let mut routes = lock(&self.routes);
        if let Some(why) = &routes.closed {
            return Err(describe(why));
        }
        Ok(routes.add_route(id, 0, exchange))
    }

    /// Stops delivering frames for `id`. The route stays until the agent's
    /// last frame for it, so late frames are still checked, not mistaken for
    /// frames of a command corral never started.
    pub fn unregister(&self, id: u32) {
        if let Some(route) = lock(&self.routes).map.get_mut(&id) {
            route.tx = None;
        }
    }

    /// Forgets `id` entirely: its Exec never reached the agent.
    pub fn forget(&self, id: u32) {
        lock(&self.routes).map.remove(&id);
    }

    /// Queues a frame for the agent.
    pub async fn send(&self, frame: Frame) -> Result<(), String> {
        self.writer
            .send(frame.encode())
            .await
            .map_err(|_| self.closed_reason())
    }

    /// Sends a frame of `kind` and `id` whose payload is `payload`, copied
    /// once, into the encoded frame.
    pub async fn send_parts(&self, kind: FrameKind, id: u32, payload: &[u8]) -> Result<(), String> {
        self.writer
            .send(Frame::encode_parts(kind, id, payload))
            .await
            .map_err(|_| self.closed_reason())
    }

    /// A cheap handle for sending frames from other tasks.
    pub fn sender(&self) -> mpsc::Sender<Vec<u8>> {
        self.writer.clone()
    }

    /// Ends the stream from outside (the container died): commands in
    /// flight see it closed and look at the container's state.
    pub fn close(&self, reason: String) {
        lock(&self.routes).close(Closed::Ended(reason));
    }

    /// True once the stream has ended.
    pub fn is_closed(&self) -> bool {
        lock(&self.routes).closed.is_some() || self.writer.is_closed()
    }

    /// The protocol violation that ended the stream, if one did.
    pub fn violation(&self) -> Option<String> {
        match &lock(&self.routes).closed {
            Some(Closed::Violation(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// Why the stream ended (or "closed" when it has not been recorded yet).
    pub fn closed_reason(&self) -> String {
        let reason = match &lock(&self.routes).closed {
            Some(c) => describe(c),
            None => "the control stream closed".into(),
        };
        format!("{reason}{}", self.stderr_note())
    }

    fn stderr_note(&self) -> String {
        let r = lock(&self.routes);
        let stderr = r.agent_stderr.trim();
        if stderr.is_empty() {
            String::new()
        } else {
            format!(" (agent said: {stderr})")
        }
    }
}

fn describe(closed: &Closed) -> String {
    match closed {
        Closed::Ended(r) => r.clone(),
        Closed::Violation(v) => format!("agent protocol violation: {v}"),
    }
}

/// The reader task: finds our session's start, then checks and routes every
/// frame until the stream ends or breaks the protocol.
async fn read_stream(
    mut output: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = std::io::Result<AgentOutput>> + Send>,
    >,
    routes: Arc<Mutex<Routes>>,
    issued: Arc<AtomicU32>,
    mut phase: Phase,
    sandbox: String,
) {
    let mut decoder = SyncDecoder::new();
    let why = 'stream: loop {
        let message = match output.next().await {
            None => break Closed::Ended("the control stream ended".into()),
            Some(Err(e)) => break Closed::Ended(format!("the control stream failed: {e}")),
            Some(Ok(AgentOutput::Control(message))) => message,
            Some(Ok(AgentOutput::Log(log))) => {
                // PID 1's stderr: the agent's own log lines.
                let text = String::from_utf8_lossy(&log).to_string();
                tracing::warn!(sandbox = %sandbox, agent = %text.trim_end(), "agent stderr");
                let mut r = lock(&routes);
                r.agent_stderr.push_str(&text);
                let len = r.agent_stderr.len();
                if len > STDERR_KEEP {
                    let cut = r.agent_stderr.ceil_char_boundary(len - STDERR_KEEP);
                    r.agent_stderr.drain(..cut);
                }
                continue;
            }
        };
        decoder.extend(&message);
        loop {
            if matches!(phase, Phase::Handshake { .. })
                && decoder.refuse_non_handshake(FrameKind::HelloAck)
            {
                continue;
            }
            let item = match decoder.next_item() {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(e) => {
                    if let Phase::Handshake { .. } = phase {
                        decoder.resync();
                        continue;
                    }
                    if decoder.at_sync() {
                        break 'stream Closed::Ended(
                            "another controller attached to the agent and took over the stream"
                                .into(),
                        );
                    }
                    break 'stream Closed::Violation(e.to_string());
                }
            };
            let frame = match item {
                Item::Synced => continue,
                Item::Frame(f) => f,
            };
            match &mut phase {
                Phase::Handshake { session, answer } => {
                    let ack = frame.parse::<HelloAck>().ok();
                    match ack {
                        Some(ack)
                            if frame.kind == FrameKind::HelloAck && ack.session == *session =>
                        {
                            if let Some(tx) = answer.take() {
                                let _ = tx.send(ack);
                            }
                            phase = Phase::Session;
                        }
                        // Not our answer (a stale session's, or sync bytes
                        // planted in output): keep looking.
                        _ => decoder.resync(),
                    }
                }
                Phase::Session => {
                    let issued = issued.load(Ordering::Relaxed);
                    let mut r = lock(&routes);
                    if let Err(v) = r.route(frame, issued) {
                        break 'stream Closed::Violation(v);
                    }
                    if r.closed.is_some() {
                        // Closed from outside: nothing more to read.
                        break 'stream Closed::Ended(String::new());
                    }
                }
            }
        }
    };
    if let Closed::Violation(v) = &why {
        tracing::error!(sandbox = %sandbox, violation = %v, "agent protocol violation: the sandbox's results can no longer be trusted");
    }
    lock(&routes).close(why);
}

impl Drop for AgentConn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes_with(id: u32) -> (Routes, RouteRx) {
        let mut r = Routes::default();
        let rx = r.add(id, 10);
        (r, rx)
    }

    fn f(kind: FrameKind, id: u32) -> Frame {
        Frame::new(kind, id, b"{}".to_vec())
    }

    #[test]
    fn frames_out_of_order_are_violations() {
        let (mut r, _rx) = routes_with(1);
        assert!(
            r.route(f(FrameKind::Exited, 1), 1).is_err(),
            "Exited before Started"
        );
        let (mut r, _rx) = routes_with(1);
        assert!(
            r.route(f(FrameKind::Stdout, 1), 1).is_err(),
            "output before Started"
        );
        let (mut r, _rx) = routes_with(1);
        assert!(
            r.route(f(FrameKind::Started, 2), 2).is_err(),
            "never registered"
        );
        assert!(
            r.route(f(FrameKind::Started, 9), 2).is_err(),
            "never started"
        );
        assert!(r.route(f(FrameKind::Started, 1), 1).is_ok());
        assert!(
            r.route(f(FrameKind::Started, 1), 1).is_err(),
            "second Started"
        );
    }

    #[test]
    fn nothing_may_follow_exited() {
        let (mut r, _rx) = routes_with(1);
        r.route(f(FrameKind::Started, 1), 1).expect("started");
        r.route(f(FrameKind::Stdout, 1), 1).expect("output");
        r.route(f(FrameKind::Exited, 1), 1).expect("exited");
        let e = r
            .route(f(FrameKind::Stdout, 1), 1)
            .expect_err("after Exited");
        assert!(e.contains("after it ended"), "{e}");
        assert!(r.route(f(FrameKind::Exited, 1), 1).is_err());
    }

    #[test]
    fn frames_after_the_container_died_are_dropped_not_violations() {
        let (mut r, mut rx) = routes_with(1);
        r.route(f(FrameKind::Started, 1), 1).expect("started");
        assert_eq!(rx.try_recv().map(|f| f.kind), Ok(FrameKind::Started));
        // The death watch closes the stream: the command ends typed...
        r.close(Closed::Ended("pod p was deleted".into()));
        // ...and the dying agent still reports it.
        r.route(f(FrameKind::Stdout, 1), 1).expect("dropped");
        r.route(f(FrameKind::Exited, 1), 1).expect("dropped");
        r.route(f(FrameKind::Started, 7), 1).expect("dropped");
        assert!(rx.try_recv().is_err(), "nothing reaches the ended command");
        assert_eq!(r.closed, Some(Closed::Ended("pod p was deleted".into())));
    }

    #[test]
    fn abandoned_commands_are_still_checked_until_their_end() {
        let (mut r, rx) = routes_with(1);
        drop(rx);
        r.route(f(FrameKind::Started, 1), 1).expect("started");
        r.route(f(FrameKind::Exited, 1), 1)
            .expect("exited, nobody listening");
        assert!(r.map.is_empty());
    }

    #[test]
    fn a_request_takes_its_answer_and_nothing_else() {
        let mut r = Routes::default();
        let mut rx = r.add_route(4, 0, Exchange::Usage);
        let e = r
            .route(f(FrameKind::Started, 4), 4)
            .expect_err("not the answer");
        assert!(e.contains("Started frame for Usage"), "{e}");
        let mut r = Routes::default();
        let mut rx2 = r.add_route(4, 0, Exchange::Usage);
        r.route(f(FrameKind::UsageReport, 4), 4)
            .expect("the answer");
        assert_eq!(rx2.try_recv().map(|f| f.kind), Ok(FrameKind::UsageReport));
        // One answer only: the route is gone after it.
        assert!(r.route(f(FrameKind::UsageReport, 4), 4).is_err());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn connection_level_frames() {
        let mut r = Routes::default();
        assert!(r.route(f(FrameKind::Pong, 0), 0).is_ok());
        assert!(r.route(f(FrameKind::Error, 0), 0).is_err());
        assert!(r.route(f(FrameKind::Exited, 0), 0).is_err());
    }

    #[test]
    fn exchanges_take_only_their_own_frames() {
        let mut r = Routes::default();
        let _rx = r.add_route(1, 0, Exchange::Export(8));
        r.route(Frame::new(FrameKind::ExportData, 1, vec![0; 8]), 1)
            .expect("data within the cap");
        let e = r
            .route(Frame::new(FrameKind::ExportData, 1, vec![0; 1]), 1)
            .expect_err("past the cap");
        assert!(e.contains("more than"), "{e}");
        let mut r = Routes::default();
        let _rx = r.add_route(2, 0, Exchange::Export(8));
        r.route(f(FrameKind::ExportDone, 2), 2).expect("done");
        assert!(
            r.route(f(FrameKind::ExportDone, 2), 2).is_err(),
            "after its end"
        );
        let _rx = r.add_route(3, 0, Exchange::Import);
        assert!(r.route(f(FrameKind::ExportData, 3), 3).is_err());
        let _rx = r.add_route(4, 0, Exchange::Reset);
        assert!(r.route(f(FrameKind::ImportDone, 4), 4).is_err());
        let _rx = r.add_route(5, 0, Exchange::Import);
        r.route(f(FrameKind::ImportDone, 5), 5)
            .expect("import done");
        assert!(!r.map.contains_key(&5), "an import ends with its answer");
    }

    #[test]
    fn output_beyond_the_budget_is_dropped_and_counted() {
        let (mut r, mut rx) = routes_with(1);
        r.route(f(FrameKind::Started, 1), 1).expect("started");
        for _ in 0..5 {
            r.route(Frame::new(FrameKind::Stdout, 1, vec![b'x'; 4]), 1)
                .expect("output");
        }
        // 10 bytes fit: two frames queued, three dropped.
        assert_eq!(rx.dropped(), 12);
        assert!(rx.try_recv().is_ok()); // Started
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err());
        // Taking output frees the budget again.
        r.route(Frame::new(FrameKind::Stdout, 1, vec![b'x'; 4]), 1)
            .expect("output");
        assert!(rx.try_recv().is_ok());
        // Exited is never dropped.
        r.route(f(FrameKind::Exited, 1), 1).expect("exited");
        assert_eq!(rx.try_recv().map(|f| f.kind), Ok(FrameKind::Exited));
    }
}
