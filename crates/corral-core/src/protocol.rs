//! The wire protocol between corral and the in-container agent.
//!
//! corral talks to the agent over one long-lived attached exec stream (the
//! agent's `attach` relay on the container side). Everything on that stream is
//! a sequence of frames:
//!
//! ```text
//! +--------+-----------------+-----------------+------------------+
//! | kind u8| id u32 (BE)     | len u32 (BE)    | payload (len)    |
//! +--------+-----------------+-----------------+------------------+
//! ```
//!
//! `id` names the command a frame belongs to (0 for connection-level frames),
//! so many commands can be in flight on one stream. Control payloads are JSON;
//! output payloads are raw bytes, so binary output passes through untouched.
//! This module only encodes and decodes; it does no IO.

use serde::{Deserialize, Serialize};

/// Version of this protocol; both ends refuse a peer with another version.
pub const PROTOCOL_VERSION: u32 = 1;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 9;

/// Largest payload a peer may send; larger frames are a protocol error.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Output bytes the agent puts into one frame at most.
pub const OUTPUT_CHUNK: usize = 64 * 1024;

/// Abstract Unix socket name (without the leading NUL) the agent listens on.
/// Abstract sockets live in the container's network namespace, so they need no
/// writable filesystem (read-only root filesystems work) and cannot collide
/// across sandboxes as long as each sandbox has its own network namespace
/// (`bridge` and `none` do; a host-network sandbox would share the host's).
pub const AGENT_SOCKET: &str = "corral-agent";

/// Where the agent binary sits inside every sandbox.
pub const AGENT_DIR: &str = "/.corral";
/// Full path of the agent binary inside every sandbox.
pub const AGENT_PATH: &str = "/.corral/corral-agent";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    // corral -> agent
    /// Connection handshake; payload is [`Hello`].
    Hello = 1,
    /// Start a command; payload is [`ExecRequest`].
    Exec = 2,
    /// Bytes for a command's stdin (raw).
    Stdin = 3,
    /// Close a command's stdin.
    StdinEof = 4,
    /// Send a signal to a command's process group; payload is [`SignalRequest`].
    Signal = 5,
    /// Liveness probe; the agent answers [`FrameKind::Pong`] with the same payload.
    Ping = 6,

    // agent -> corral
    /// Handshake answer; payload is [`HelloAck`].
    HelloAck = 64,
    /// The command was spawned; payload is [`Started`]. Always the first
    /// frame for its id.
    Started = 65,
    /// Command stdout bytes from the head of the stream (raw).
    Stdout = 66,
    /// Command stderr bytes from the head of the stream (raw).
    Stderr = 67,
    /// The kept tail of stdout (raw), in one or more frames (concatenate
    /// them) just before [`FrameKind::Exited`]; absent when empty.
    StdoutTail = 68,
    /// The kept tail of stderr (raw), like [`FrameKind::StdoutTail`].
    StderrTail = 69,
    /// The command is over; payload is [`ExitReport`]. Last frame for its id.
    Exited = 70,
    /// The command could not be started; payload is [`SpawnError`]. Last frame for its id.
    SpawnFailed = 71,
    /// Answer to [`FrameKind::Ping`].
    Pong = 72,
    /// The agent rejected a frame; payload is [`ProtocolError`]. An error
    /// carrying the id of a command that has not reported [`FrameKind::Exited`]
    /// (e.g. an `Exec` whose payload did not parse) is final for that id.
    Error = 73,
}

impl FrameKind {
    /// Decodes a kind byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        use FrameKind::*;
        Some(match b {
            1 => Hello,
            2 => Exec,
            3 => Stdin,
            4 => StdinEof,
            5 => Signal,
            6 => Ping,
            64 => HelloAck,
            65 => Started,
            66 => Stdout,
            67 => Stderr,
            68 => StdoutTail,
            69 => StderrTail,
            70 => Exited,
            71 => SpawnFailed,
            72 => Pong,
            73 => Error,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Command id (0 for connection-level frames).
    pub id: u32,
    /// Raw payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame with a raw payload.
    pub fn new(kind: FrameKind, id: u32, payload: impl Into<Vec<u8>>) -> Self {
        Frame {
            kind,
            id,
            payload: payload.into(),
        }
    }

    /// A frame whose payload is `msg` as JSON.
    pub fn json<T: Serialize>(kind: FrameKind, id: u32, msg: &T) -> Self {
        // Serializing these plain structs cannot fail (no maps with non-string
        // keys, no custom serializers); fall back to an empty object anyway.
        let payload = serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec());
        Frame::new(kind, id, payload)
    }

    /// Parses the payload as JSON message `T`.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ProtocolViolation> {
        serde_json::from_slice(&self.payload).map_err(|e| ProtocolViolation::BadPayload {
            kind: self.kind as u8,
            id: self.id,
            reason: e.to_string(),
        })
    }

    /// Appends the encoded frame to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(HEADER_LEN + self.payload.len());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
    }

    /// The encoded frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }
}

/// A peer broke the protocol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolViolation {
    /// The kind byte is not one this version knows.
    #[error("unknown frame kind {kind} (id {id})")]
    UnknownKind {
        /// The kind byte.
        kind: u8,
        /// The frame's id.
        id: u32,
    },
    /// The header announces a payload above [`MAX_PAYLOAD`].
    #[error(
        "frame payload of {len} bytes exceeds the limit of {MAX_PAYLOAD} (kind {kind}, id {id})"
    )]
    TooLarge {
        /// The kind byte.
        kind: u8,
        /// The frame's id.
        id: u32,
        /// The announced length.
        len: usize,
    },
    /// A JSON payload did not parse.
    #[error("bad payload for frame kind {kind} (id {id}): {reason}")]
    BadPayload {
        /// The kind byte.
        kind: u8,
        /// The frame's id.
        id: u32,
        /// The parser's message.
        reason: String,
    },
}

/// Incremental frame decoder: feed it bytes as they arrive, take frames out.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds received bytes.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet consumed as frames.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolViolation> {
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_LEN {
            self.compact();
            return Ok(None);
        }
        let kind_byte = avail[0];
        let id = u32::from_be_bytes([avail[1], avail[2], avail[3], avail[4]]);
        let len = u32::from_be_bytes([avail[5], avail[6], avail[7], avail[8]]) as usize;
        let kind = FrameKind::from_u8(kind_byte).ok_or(ProtocolViolation::UnknownKind {
            kind: kind_byte,
            id,
        })?;
        if len > MAX_PAYLOAD {
            return Err(ProtocolViolation::TooLarge {
                kind: kind_byte,
                id,
                len,
            });
        }
        if avail.len() < HEADER_LEN + len {
            self.compact();
            return Ok(None);
        }
        let payload = avail[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.start += HEADER_LEN + len;
        Ok(Some(Frame { kind, id, payload }))
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

/// Handshake from corral.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// corral's [`PROTOCOL_VERSION`].
    pub protocol: u32,
}

/// Handshake answer from the agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HelloAck {
    /// The agent's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The agent's crate version.
    pub agent_version: String,
    /// Which OOM counter the agent reads: "v1", "v2" or "none".
    pub oom_counter: String,
}

/// Start a command.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program and arguments; `argv[0]` is looked up in `PATH` when it has no `/`.
    pub argv: Vec<String>,
    /// Working directory; `~` and `~/...` expand to `$HOME` (falling back to `/`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables set on top of the agent's own environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// When false the command's stdin is `/dev/null` (immediate EOF); when true
    /// it is a pipe fed by [`FrameKind::Stdin`] frames until [`FrameKind::StdinEof`].
    #[serde(default)]
    pub stdin: bool,
    /// Kill the whole process tree after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes kept per output stream: the first half streamed as it comes, the
    /// last half kept as a tail and sent at exit.
    pub max_output: u64,
}

/// Sent once the process exists.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Started {
    /// Its pid inside the sandbox.
    pub pid: u32,
}

/// Signal a running command's process group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalRequest {
    /// Signal number (e.g. 2 for SIGINT, 9 for SIGKILL).
    pub signal: i32,
}

/// Totals for one output stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamTotals {
    /// Bytes the command wrote in all.
    pub total_bytes: u64,
    /// True when bytes were dropped between the head and the tail.
    pub truncated: bool,
}

/// How a command ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitReport {
    /// Exit status when the process exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the process was killed by a signal.
    pub signal: Option<i32>,
    /// The agent killed the process tree because the timeout passed.
    pub timed_out: bool,
    /// The kernel's OOM killer killed the command (cgroup counter rose while it
    /// ran and it died of SIGKILL).
    pub oom_killed: bool,
    /// Wall time from spawn to exit, in microseconds.
    pub duration_us: u64,
    /// Stdout totals.
    pub stdout: StreamTotals,
    /// Stderr totals.
    pub stderr: StreamTotals,
}

/// The command could not be started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpawnError {
    /// What went wrong, e.g. "no such file or directory: /bin/sh".
    pub message: String,
}

/// The agent rejected a frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProtocolError {
    /// What was wrong.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_frames_split_at_every_byte() {
        let frames = vec![
            Frame::json(FrameKind::Hello, 0, &Hello { protocol: 1 }),
            Frame::new(FrameKind::Stdout, 7, vec![0u8, 255, 10, 13, 0xc3]),
            Frame::new(FrameKind::StdinEof, 7, Vec::new()),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            f.encode_into(&mut wire);
        }
        for split in 0..wire.len() {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            d.extend(&wire[..split]);
            while let Some(f) = d.next_frame().expect("valid") {
                got.push(f);
            }
            d.extend(&wire[split..]);
            while let Some(f) = d.next_frame().expect("valid") {
                got.push(f);
            }
            assert_eq!(got, frames, "split at {split}");
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn rejects_unknown_kind_and_oversized_frames() {
        let mut d = Decoder::new();
        d.extend(&[200, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(
            d.next_frame(),
            Err(ProtocolViolation::UnknownKind { kind: 200, id: 1 })
        );
        let mut d = Decoder::new();
        d.extend(&[66, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            d.next_frame(),
            Err(ProtocolViolation::TooLarge { id: 2, .. })
        ));
    }

    #[test]
    fn exec_request_defaults_optional_fields() {
        let f = Frame::new(
            FrameKind::Exec,
            3,
            br#"{"argv":["true"],"max_output":10}"#.to_vec(),
        );
        let req: ExecRequest = f.parse().expect("parses");
        assert_eq!(req.argv, vec!["true"]);
        assert!(!req.stdin);
        assert_eq!(req.timeout_ms, None);
        let bad = Frame::new(FrameKind::Exec, 3, b"{".to_vec());
        assert!(matches!(
            bad.parse::<ExecRequest>(),
            Err(ProtocolViolation::BadPayload { id: 3, .. })
        ));
    }
}
