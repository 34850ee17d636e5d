//! envd's `process.Process` service over [`corral::Sandbox::exec`]: `Start`
//! and `Connect` stream a command's `start`, `data`, `end` and `keepalive`
//! events; `SendInput`, `StreamInput`, `CloseStdin` and `SendSignal` reach
//! it by pid or tag; `List` shows those still running. A `Start` with a
//! `pty` runs the command on a pseudo-terminal of that size
//! ([`CommandSpec::pty`]): its output arrives as `pty` data, `SendInput`
//! takes `pty` bytes (keystrokes: `\x03` interrupts), `Update` with a
//! `pty.size` resizes it.
//!
//! A started command belongs to its sandbox, not to the stream that
//! started it: closing the stream leaves it running (E2B's background
//! handles reconnect with `Connect`), and it ends by exiting, by a signal,
//! by its `timeout` (the call's `Connect-Timeout-Ms`, capped by
//! `server.limits.max_timeout_ms`; the command's tree is killed, and the
//! stream ends with `deadline_exceeded`) or with its sandbox. While it
//! runs it holds a slot and its output budget of `server.limits`, as an
//! `exec/stream` does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use base64::Engine;
use corral::{ExecEvent, OutputStream, StdinWriter};
use corral_core::protocol::MAX_PTY_CELLS;
use corral_core::{CommandResult, CommandSpec, Failure, FailureKind, PtySize};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, Code, Item, RpcError};
use super::{lock, requested_user, E2b, Entry, Envd};
use crate::ceilings::TimeUnit;

/// How often a silent stream gets a `keepalive` event when the client did
/// not say (`Keepalive-Ping-Interval`, seconds).
const KEEPALIVE: Duration = Duration::from_secs(50);

/// A sandbox's processes started through envd, by pid.
pub(super) type Table = Mutex<BTreeMap<u32, Arc<Proc>>>;

/// A process started through envd and still running.
pub(super) struct Proc {
    pid: u32,
    tag: Option<String>,
    /// Its `ProcessConfig` as `List` shows it.
    config: Value,
    stdin: StdinWriter,
    /// It runs on a terminal: its output is `pty` data, its input `pty`
    /// bytes.
    on_terminal: bool,
    /// Streams following it (its `Start` and any `Connect`s).
    followers: Mutex<Vec<mpsc::Sender<Item>>>,
}

impl Proc {
    /// Sends `item` to every follower; a follower that went away is dropped.
    async fn broadcast(&self, item: impl Fn() -> Item) {
        let followers: Vec<_> = lock(&self.followers).clone();
        for f in &followers {
            let _ = f.send(item()).await;
        }
        lock(&self.followers).retain(|f| !f.is_closed());
    }
}

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect_to))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/Update", post(update))
}

/// A `uint32` as proto3 JSON allows it: a number or a decimal string.
fn lenient_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{n} is not a uint32"))),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("'{s}' is not a uint32"))),
        Some(other) => Err(D::Error::custom(format!("{other} is not a uint32"))),
    }
}

/// Proto3 JSON `bytes`: base64, standard or URL-safe, padded or not.
fn lenient_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose};
    use serde::de::Error;
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let cfg = general_purpose::GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let std = GeneralPurpose::new(&base64::alphabet::STANDARD, cfg);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg);
    std.decode(&s)
        .or_else(|_| url.decode(&s))
        .map(Some)
        .map_err(|e| D::Error::custom(format!("not base64: {e}")))
}

#[derive(Deserialize)]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// `process.PTY`: a terminal's size.
#[derive(Deserialize, Default)]
struct Pty {
    size: Option<TermSize>,
}

#[derive(Deserialize, Default)]
struct TermSize {
    #[serde(default, deserialize_with = "lenient_u32")]
    cols: Option<u32>,
    #[serde(default, deserialize_with = "lenient_u32")]
    rows: Option<u32>,
}

impl Pty {
    /// The size asked for, checked; `field` names the message's field.
    fn size(&self, field: &str) -> Result<PtySize, RpcError> {
        let Some(size) = &self.size else {
            return Err(RpcError::invalid(&format!("{field}.size"), "is required"));
        };
        let cell = |name: &str, v: Option<u32>| {
            let v = v.unwrap_or(0);
            u16::try_from(v)
                .ok()
                .filter(|c| (1..=MAX_PTY_CELLS).contains(c))
                .ok_or_else(|| {
                    RpcError::invalid(
                        &format!("{field}.size.{name}"),
                        format!("{v} is not 1 to {MAX_PTY_CELLS}"),
                    )
                })
        };
        Ok(PtySize {
            cols: cell("cols", size.cols)?,
            rows: cell("rows", size.rows)?,
        })
    }
}

#[derive(Deserialize)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Deserialize, Default)]
struct Selector {
    #[serde(default, deserialize_with = "lenient_u32")]
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize)]
struct Selected {
    process: Option<Selector>,
}

#[derive(Deserialize, Default)]
struct Input {
    #[serde(default, deserialize_with = "lenient_bytes")]
    stdin: Option<Vec<u8>>,
    #[serde(default, deserialize_with = "lenient_bytes")]
    pty: Option<Vec<u8>>,
}

#[derive(Deserialize)]
struct SendInputRequest {
    process: Option<Selector>,
    input: Option<Input>,
}

#[derive(Deserialize)]
struct SendSignalRequest {
    process: Option<Selector>,
    signal: Option<Value>,
}

/// A failed streaming call: its end-of-stream message carries the error.
fn stream_error(e: RpcError) -> Response {
    let (tx, response) = connect::server_stream();
    // The channel has room: this never waits.
    let _ = tx.try_send(Item::End(Some(e)));
    response
}

/// The RPC error of a typed failure.
fn failure_error(f: &Failure) -> RpcError {
    let code = match f.kind {
        FailureKind::Timeout => Code::DeadlineExceeded,
        FailureKind::ContainerLost | FailureKind::DaemonUnavailable => Code::Unavailable,
        FailureKind::Capacity => Code::ResourceExhausted,
        FailureKind::InvalidSpec | FailureKind::SpawnFailed => Code::InvalidArgument,
        FailureKind::Unsupported => Code::Unimplemented,
        _ => Code::Internal,
    };
    RpcError::new(code, format!("{} ({})", f.message, f.kind.as_str()))
}

/// The `end` event of an outcome, or the error that ends the stream
/// instead (a timeout is `deadline_exceeded`, as E2B's own).
fn end_of(r: &CommandResult) -> Result<Value, RpcError> {
    if let Some(f) = &r.failure {
        if matches!(
            f.kind,
            FailureKind::Timeout
                | FailureKind::ContainerLost
                | FailureKind::DaemonUnavailable
                | FailureKind::AgentError
        ) {
            return Err(failure_error(f));
        }
    }
    let (code, exited, status) = match (r.exit_code, r.signal) {
        (Some(c), _) => (c, true, format!("exit status {c}")),
        (None, Some(s)) => (-1, false, format!("signal: {}", signal_name(s))),
        (None, None) => (-1, false, "unknown".to_string()),
    };
    let mut end = json!({"exitCode": code, "exited": exited, "status": status});
    if let Some(f) = &r.failure {
        end["error"] = json!(f.message);
    } else if code != 0 {
        end["error"] = json!(status);
    }
    Ok(json!({"event": {"end": end}}))
}

/// How Go (and so envd) names a signal in a process's status.
fn signal_name(s: i32) -> String {
    match s {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

fn data_event(stream: OutputStream, bytes: &[u8], on_terminal: bool) -> Value {
    let name = match stream {
        _ if on_terminal => "pty",
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
    };
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    json!({"event": {"data": {name: b64}}})
}

fn start_event(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(KEEPALIVE, Duration::from_secs)
}

async fn start(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    match start_inner(&e2b, &headers, &body).await {
        Ok(r) => r,
        Err(e) => stream_error(e),
    }
}

async fn start_inner(e2b: &E2b, headers: &HeaderMap, body: &[u8]) -> Result<Response, RpcError> {
    let req: StartRequest = connect::stream_request(headers, body)?;
    let Envd { entry, lease } = e2b.envd(headers).await?;
    requested_user(headers, &lease)?;
    let pty = req.pty.as_ref().map(|p| p.size("pty")).transpose()?;
    let Some(config) = req.process else {
        return Err(RpcError::invalid("process", "is required"));
    };
    if config.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd", "is empty"));
    }
    let ceilings = e2b.app.ceilings();
    let asked = connect::timeout(headers)?;
    let timeout = ceilings
        .timeout("header Connect-Timeout-Ms", asked, None, TimeUnit::Millis)
        .map_err(|e| RpcError::from(crate::error::ApiError::from(e)))?;
    // E2B's protocol has no field for it: the operator's default for this
    // listener, never the ceiling (a background command holds its
    // reservation for its whole life).
    let max_output = ceilings
        .limits()
        .e2b_max_output
        .min(ceilings.limits().max_output);
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let mut env: Vec<(String, String)> = entry
        .envs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(config.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let stdin = req.stdin.unwrap_or(false);
    let mut cmd = CommandSpec::argv(argv);
    cmd.cwd = config.cwd.clone().filter(|c| !c.is_empty());
    cmd.env = env;
    // An empty stdin still gives the command a pipe that SendInput feeds;
    // none gives it an immediate EOF.
    cmd.stdin = stdin.then(Vec::new);
    cmd.timeout = Some(timeout);
    cmd.max_output = max_output;
    cmd.pty = pty;
    let held = ceilings
        .exec(&crate::ceilings::Holder::of(&entry.owner), &cmd, true)
        .map_err(|e| RpcError::from(crate::error::ApiError::from(e)))?;
    let mut execution = lease.exec(&cmd).await.map_err(|f| failure_error(&f))?;
    let pid = match execution.started().await {
        Ok(pid) => pid,
        Err(r) => {
            return Err(r.failure.as_ref().map(failure_error).unwrap_or_else(|| {
                RpcError::new(Code::Internal, "the command ended before it started")
            }))
        }
    };
    let (tx, response) = connect::server_stream();
    let _ = tx.send(Item::Message(start_event(pid))).await;
    let proc = Arc::new(Proc {
        pid,
        tag: req.tag.clone(),
        config: json!({
            "cmd": config.cmd,
            "args": config.args,
            "envs": config.envs,
            "cwd": config.cwd,
        }),
        stdin: execution.stdin(),
        on_terminal: pty.is_some(),
        followers: Mutex::new(vec![tx]),
    });
    lock(&entry.procs).insert(pid, proc.clone());
    let every = keepalive_interval(headers);
    let sandbox = lease.id().to_string();
    tokio::spawn(async move {
        // The lease keeps the sandbox from being handed back while the
        // command runs; the reservation holds its slot and output budget.
        let _held = held;
        let _lease = lease;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let result = loop {
            tokio::select! {
                ev = execution.next_event() => match ev {
                    ExecEvent::Output(stream, bytes) => {
                        let t = proc.on_terminal;
                        proc.broadcast(|| Item::Message(data_event(stream, &bytes, t))).await;
                    }
                    ExecEvent::Ended(r) => break r,
                },
                _ = ticker.tick() => {
                    proc.broadcast(|| Item::Message(json!({"event": {"keepalive": {}}}))).await;
                }
            }
        };
        lock(&entry.procs).remove(&pid);
        tracing::debug!(sandbox = %sandbox, pid, "e2b process ended");
        match end_of(&result) {
            Ok(end) => {
                proc.broadcast(|| Item::Message(end.clone())).await;
                proc.broadcast(|| Item::End(None)).await;
            }
            Err(e) => proc.broadcast(|| Item::End(Some(e.clone()))).await,
        }
    });
    Ok(response)
}

/// The process a selector names in `entry`.
fn find(entry: &Entry, selector: Option<&Selector>) -> Result<Arc<Proc>, RpcError> {
    let Some(sel) = selector else {
        return Err(RpcError::invalid("process", "is required (a pid or a tag)"));
    };
    let procs = lock(&entry.procs);
    let found = match (&sel.pid, &sel.tag) {
        (Some(pid), _) => procs.get(pid).cloned(),
        (None, Some(tag)) => procs
            .values()
            .find(|p| p.tag.as_deref() == Some(tag.as_str()))
            .cloned(),
        (None, None) => {
            return Err(RpcError::invalid(
                "process",
                "names neither a pid nor a tag",
            ))
        }
    };
    found.ok_or_else(|| {
        let what = match (&sel.pid, &sel.tag) {
            (Some(pid), _) => format!("pid {pid}"),
            (None, Some(tag)) => format!("tag '{tag}'"),
            _ => String::new(),
        };
        RpcError::new(
            Code::NotFound,
            format!("process with {what} not found (it ended, or was not started through envd)"),
        )
    })
}

async fn connect_to(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let req: Selected = connect::stream_request(&headers, &body)?;
        let Envd { entry, .. } = e2b.envd(&headers).await?;
        let proc = find(&entry, req.process.as_ref())?;
        let (tx, response) = connect::server_stream();
        let _ = tx.send(Item::Message(start_event(proc.pid))).await;
        lock(&proc.followers).push(tx);
        Ok::<_, RpcError>(response)
    }
    .await;
    r.unwrap_or_else(stream_error)
}

async fn list(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let _: Value = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let processes: Vec<Value> = lock(&entry.procs)
                .values()
                .map(|p| {
                    let mut v = json!({"config": p.config, "pid": p.pid});
                    if let Some(tag) = &p.tag {
                        v["tag"] = json!(tag);
                    }
                    v
                })
                .collect();
            Ok(json!({ "processes": processes }))
        }
        .await,
    )
}

async fn write_input(proc: &Proc, input: Option<&Input>) -> Result<(), RpcError> {
    let Some(input) = input else {
        return Err(RpcError::invalid("input", "is required"));
    };
    let bytes = match (&input.pty, &input.stdin) {
        (Some(_), _) if !proc.on_terminal => {
            return Err(RpcError::invalid(
                "input.pty",
                format!("process {} was not started with a pty", proc.pid),
            ))
        }
        (Some(keys), _) => keys.as_slice(),
        (None, bytes) => bytes.as_deref().unwrap_or_default(),
    };
    proc.stdin
        .write(bytes)
        .await
        .map_err(|e| RpcError::new(Code::Unavailable, format!("process {}: {e}", proc.pid)))
}

async fn send_input(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: SendInputRequest = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let proc = find(&entry, req.process.as_ref())?;
            write_input(&proc, req.input.as_ref()).await?;
            Ok(json!({}))
        }
        .await,
    )
}

/// One message of a `StreamInput` client stream.
#[derive(Deserialize)]
struct StreamInputRequest {
    start: Option<Selected>,
    data: Option<StreamData>,
    keepalive: Option<Value>,
}

#[derive(Deserialize)]
struct StreamData {
    input: Option<Input>,
}

async fn stream_input(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let messages = connect::envelopes(&headers, &body)?;
        let Envd { entry, .. } = e2b.envd(&headers).await?;
        let mut proc = None;
        for (i, m) in messages.iter().enumerate() {
            let msg: StreamInputRequest = connect::decode(m)?;
            if let Some(start) = msg.start {
                proc = Some(find(&entry, start.process.as_ref())?);
            } else if let Some(data) = msg.data {
                let Some(p) = &proc else {
                    return Err(RpcError::invalid(
                        &format!("message {i}"),
                        "data before the start message naming the process",
                    ));
                };
                write_input(p, data.input.as_ref()).await?;
            } else if msg.keepalive.is_none() {
                return Err(RpcError::invalid(
                    &format!("message {i}"),
                    "is none of start, data, keepalive",
                ));
            }
        }
        Ok::<_, RpcError>(())
    }
    .await;
    // A client stream's answer is enveloped like a server stream's.
    let end = r.err();
    let ok = end.is_none();
    let (tx, response) = connect::server_stream();
    if ok {
        let _ = tx.try_send(Item::Message(json!({})));
    }
    let _ = tx.try_send(Item::End(end));
    response
}

async fn close_stdin(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: Selected = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let proc = find(&entry, req.process.as_ref())?;
            proc.stdin.close().await.map_err(|e| {
                RpcError::new(Code::Unavailable, format!("process {}: {e}", proc.pid))
            })?;
            Ok(json!({}))
        }
        .await,
    )
}

fn signal_number(v: Option<&Value>) -> Result<i32, RpcError> {
    match v {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => Ok(9),
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => Ok(15),
        Some(Value::Number(n)) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => {
            Ok(n.as_i64().unwrap_or(9) as i32)
        }
        other => Err(RpcError::invalid(
            "signal",
            format!(
                "{} is not SIGNAL_SIGKILL or SIGNAL_SIGTERM",
                other.map_or("nothing".to_string(), |v| v.to_string())
            ),
        )),
    }
}

async fn send_signal(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: SendSignalRequest = connect::unary_request(&headers, &body)?;
            let signal = signal_number(req.signal.as_ref())?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let proc = find(&entry, req.process.as_ref())?;
            proc.stdin.signal(signal).await.map_err(|e| {
                RpcError::new(Code::Unavailable, format!("process {}: {e}", proc.pid))
            })?;
            Ok(json!({}))
        }
        .await,
    )
}

#[derive(Deserialize)]
struct UpdateRequest {
    process: Option<Selector>,
    pty: Option<Pty>,
}

async fn update(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    connect::unary(
        async {
            let req: UpdateRequest = connect::unary_request(&headers, &body)?;
            let Envd { entry, .. } = e2b.envd(&headers).await?;
            let proc = find(&entry, req.process.as_ref())?;
            let Some(pty) = &req.pty else {
                return Err(RpcError::invalid("pty", "is required (the new size)"));
            };
            let size = pty.size("pty")?;
            if !proc.on_terminal {
                return Err(RpcError::invalid(
                    "pty",
                    format!("process {} was not started with a pty", proc.pid),
                ));
            }
            proc.stdin.resize(size).await.map_err(|e| {
                RpcError::new(Code::Unavailable, format!("process {}: {e}", proc.pid))
            })?;
            Ok(json!({}))
        }
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_become_end_events_like_envd() {
        let ok = CommandResult {
            exit_code: Some(0),
            ..CommandResult::default()
        };
        let v = end_of(&ok).expect("should work");
        assert_eq!(v["event"]["end"]["exitCode"], 0);
        assert_eq!(v["event"]["end"]["status"], "exit status 0");
        assert!(v["event"]["end"].get("error").is_none());
        let killed = CommandResult {
            signal: Some(9),
            ..CommandResult::default()
        };
        let v = end_of(&killed).expect("should work");
        assert_eq!(v["event"]["end"]["exitCode"], -1);
        assert_eq!(v["event"]["end"]["status"], "signal: killed");
        let timed_out = CommandResult::failed(
            Failure::new(FailureKind::Timeout, "timed out"),
            Duration::ZERO,
        );
        assert_eq!(
            end_of(&timed_out).expect_err("should fail").code,
            Code::DeadlineExceeded
        );
    }

    #[test]
    fn signals_are_envds_two_or_named_as_wrong() {
        assert_eq!(
            signal_number(Some(&json!("SIGNAL_SIGKILL"))).expect("should work"),
            9
        );
        assert_eq!(signal_number(Some(&json!(15))).expect("should work"), 15);
        let e = signal_number(Some(&json!("SIGNAL_SIGHUP"))).expect_err("should fail");
        assert!(e.message.starts_with("signal:"), "{}", e.message);
    }

    #[test]
    fn pty_sizes_are_checked_naming_the_field() {
        let p: Pty = serde_json::from_value(json!({"size": {"cols": "120", "rows": 40}}))
            .expect("should work");
        assert_eq!(
            p.size("pty").expect("should work"),
            PtySize {
                cols: 120,
                rows: 40
            }
        );
        for (size, field) in [
            (json!({"cols": 0, "rows": 24}), "pty.size.cols"),
            (json!({"cols": 80}), "pty.size.rows"),
            (json!({"cols": 80, "rows": 70000}), "pty.size.rows"),
        ] {
            let p: Pty = serde_json::from_value(json!({ "size": size })).expect("should work");
            let e = p.size("pty").expect_err("should fail");
            assert!(e.message.starts_with(field), "{}", e.message);
        }
        let e = Pty::default().size("pty").expect_err("should fail");
        assert!(e.message.starts_with("pty.size"), "{}", e.message);
    }

    #[test]
    fn selectors_take_pids_as_numbers_or_strings() {
        let s: Selector = serde_json::from_value(json!({"pid": "42"})).expect("should work");
        assert_eq!(s.pid, Some(42));
        let s: Selector = serde_json::from_value(json!({"pid": 42})).expect("should work");
        assert_eq!(s.pid, Some(42));
        assert!(serde_json::from_value::<Selector>(json!({"pid": -1})).is_err());
        let i: Input = serde_json::from_value(json!({"stdin": "aGk"})).expect("should work");
        assert_eq!(i.stdin.as_deref(), Some(&b"hi"[..]));
    }
}
