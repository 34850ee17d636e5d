//! The wire protocol between corral and the in-container agent.
//!
//! corral talks to the agent over PID 1's own stdin and stdout, reached
//! through the daemon's attach endpoint: nothing inside the sandbox relays
//! the stream, and PID 1 is non-dumpable, so no command can open, read or
//! write either end. Both directions start with [`SYNC`] (the attach may
//! join the byte stream anywhere, and a controller that re-attaches must not
//! inherit half a frame); after it, everything is a sequence of frames:
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
pub const PROTOCOL_VERSION: u32 = 2;

/// Marks where a session starts: corral writes it before every
/// [`FrameKind::Hello`], the agent before every [`FrameKind::HelloAck`]. Its
/// first byte is no valid frame kind, so a decoder in the middle of a stream
/// fails on it rather than reading it as a header.
pub const SYNC: &[u8; 16] = b"\0corral-sync\xa5\x5a\xc3\x3c";

/// Largest payload a [`FrameKind::HelloAck`] may announce; a larger one
/// after [`SYNC`] is not a handshake (the sync bytes were inside some
/// payload).
pub const MAX_HANDSHAKE: usize = 4096;

/// Largest payload a [`FrameKind::Hello`] may announce: it carries the
/// sandbox's environment (at most [`crate::spec::MAX_ENV_BYTES`], which
/// JSON escaping can make up to six times longer).
pub const MAX_HELLO: usize = 8 * 1024 * 1024;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 9;

/// Largest payload a peer may send; larger frames are a protocol error.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Output bytes the agent puts into one frame at most.
pub const OUTPUT_CHUNK: usize = 64 * 1024;

/// Where the agent binary sits inside every sandbox.
pub const AGENT_DIR: &str = "/.corral";

/// Where a sandbox that resets in place finds its own host directory of
/// shared deltas (read-only), into which corral links a delta only for
/// that sandbox's import. Its agent takes the mount for
/// itself at start (an open directory, the mount detached), so no command
/// ever sees what is in it; the directory left behind is empty.
pub const SHARED_DELTAS_DIR: &str = "/.corral-deltas";

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
    /// Return the sandbox to its pristine state; payload is [`ResetRequest`].
    /// The id is a fresh one, like a command's; the answer is one
    /// [`FrameKind::ResetDone`] with it.
    Reset = 7,
    /// Stream the sandbox's delta (see [`ExportRequest`]); payload is
    /// [`ExportRequest`]. A fresh id; the answer is [`FrameKind::ExportData`]
    /// frames, then one [`FrameKind::ExportDone`].
    Export = 8,
    /// Take a delta in as the base of a sandbox that has run nothing yet;
    /// payload is [`ImportRequest`]. A fresh id; the delta's bytes follow
    /// in [`FrameKind::ImportData`] frames of the same id, and the answer
    /// is one [`FrameKind::ImportDone`].
    Import = 9,
    /// Bytes of the delta an [`FrameKind::Import`] announced (raw, in
    /// order).
    ImportData = 10,
    /// Read what the sandbox uses now from inside (its cgroup's counters
    /// and its network's); empty payload. The id is a fresh one, like a
    /// reset's; the answer is one [`FrameKind::UsageReport`] with it. Sent
    /// only to an agent whose [`HelloAck::usage`] says it answers.
    Usage = 11,
    /// Change the terminal size of a command started with
    /// [`ExecRequest::pty`]; payload is [`PtySize`]. The kernel sends the
    /// terminal's foreground process group SIGWINCH.
    Resize = 12,

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
    /// Answer to [`FrameKind::Reset`]; payload is [`ResetReport`]. The only
    /// frame for its id.
    ResetDone = 74,
    /// Bytes of an exported delta (raw, in order), for an
    /// [`FrameKind::Export`].
    ExportData = 75,
    /// The export is over; payload is [`DeltaReport`]. Last frame for its
    /// id.
    ExportDone = 76,
    /// Answer to an [`FrameKind::Import`] once its bytes are in; payload is
    /// [`DeltaReport`]. The only frame for its id.
    ImportDone = 77,
    /// Answer to [`FrameKind::Usage`]; payload is [`SandboxUsage`]. The
    /// only frame for its id.
    UsageReport = 78,
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
            7 => Reset,
            8 => Export,
            9 => Import,
            10 => ImportData,
            11 => Usage,
            12 => Resize,
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
            74 => ResetDone,
            75 => ExportData,
            76 => ExportDone,
            77 => ImportDone,
            78 => UsageReport,
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

    /// The encoded frame of `kind`, `id` and `payload`, without a
    /// [`Frame`] holding a copy of the payload first (a delta's chunks,
    /// sent to many agents from one buffer).
    pub fn encode_parts(kind: FrameKind, id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.push(kind as u8);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
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

    /// The undecoded bytes.
    pub fn rest(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Takes the undecoded bytes out, leaving the decoder empty.
    pub fn take_rest(&mut self) -> Vec<u8> {
        let rest = self.buf[self.start..].to_vec();
        self.buf.clear();
        self.start = 0;
        rest
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

/// What a [`SyncDecoder`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// [`SYNC`] was found: a session starts here.
    Synced,
    /// A frame after the sync point.
    Frame(Frame),
}

/// A [`Decoder`] that first hunts for [`SYNC`] and can go back to hunting:
/// the start of a stream, or of a session, is wherever the sync bytes are.
/// Memory is bounded while hunting (only a possible prefix of [`SYNC`] is
/// kept) and while decoding (by [`MAX_PAYLOAD`]).
#[derive(Debug, Default)]
pub struct SyncDecoder {
    hunting: bool,
    hunt: Vec<u8>,
    frames: Decoder,
}

impl SyncDecoder {
    /// A decoder hunting for the first [`SYNC`].
    pub fn new() -> Self {
        SyncDecoder {
            hunting: true,
            hunt: Vec::new(),
            frames: Decoder::new(),
        }
    }

    /// Adds received bytes.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.hunting {
            self.hunt.extend_from_slice(bytes);
        } else {
            self.frames.extend(bytes);
        }
    }

    /// True while looking for [`SYNC`].
    pub fn is_hunting(&self) -> bool {
        self.hunting
    }

    /// True when an incomplete frame is buffered.
    pub fn has_partial(&self) -> bool {
        !self.hunting && self.frames.pending() > 0
    }

    /// True when the undecoded bytes start with [`SYNC`]: after a decode
    /// error, this tells another session starting from a broken stream.
    pub fn at_sync(&self) -> bool {
        !self.hunting && self.frames.rest().starts_with(SYNC)
    }

    /// Goes back to hunting, keeping the undecoded bytes (a sync may be among
    /// them).
    pub fn resync(&mut self) {
        if !self.hunting {
            let rest = self.frames.take_rest();
            self.hunt.extend_from_slice(&rest);
            self.hunting = true;
        }
    }

    /// Right after a sync point only a small handshake frame of `kind` may
    /// follow. Once its header is here and it is anything else, the sync
    /// bytes were not a session start (command output can contain them):
    /// hunting resumes and this returns true.
    pub fn refuse_non_handshake(&mut self, kind: FrameKind) -> bool {
        let rest = self.frames.rest();
        if self.hunting || rest.len() < HEADER_LEN {
            return false;
        }
        let len = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) as usize;
        let max = match kind {
            FrameKind::Hello => MAX_HELLO,
            _ => MAX_HANDSHAKE,
        };
        if rest[0] == kind as u8 && len <= max {
            return false;
        }
        self.resync();
        true
    }

    /// The next item, `Ok(None)` when more bytes are needed. An error leaves
    /// the bytes in place: call [`SyncDecoder::resync`] to hunt again.
    pub fn next_item(&mut self) -> Result<Option<Item>, ProtocolViolation> {
        if self.hunting {
            match find(&self.hunt, SYNC) {
                Some(at) => {
                    let rest = self.hunt.split_off(at + SYNC.len());
                    self.hunt.clear();
                    self.hunting = false;
                    self.frames = Decoder::new();
                    self.frames.extend(&rest);
                    return Ok(Some(Item::Synced));
                }
                None => {
                    let keep = self.hunt.len().min(SYNC.len() - 1);
                    self.hunt.drain(..self.hunt.len() - keep);
                    return Ok(None);
                }
            }
        }
        Ok(self.frames.next_frame()?.map(Item::Frame))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Handshake from corral. A Hello starts a new session: the agent kills
/// every command of the previous one and sends nothing more for them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// corral's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// A fresh random nonce; the agent echoes it in [`HelloAck`], so corral
    /// can tell its own answer from sync bytes planted in command output.
    pub session: String,
    /// The sandbox's environment (its spec's, resolved on the host): every
    /// command of the session gets it on top of the agent's own (the
    /// image's), under the command's [`ExecRequest::env`]. It is sent at
    /// every handshake and never put into the engine's configuration of the
    /// container, so its values show neither in `docker inspect` nor in a
    /// snapshot image. Absent from an older corral, whose containers carry
    /// it in their configuration instead; left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// The first session after the sandbox was restored from a live
    /// snapshot: the commands the snapshot caught running go on (under
    /// their own timeouts), unobserved, instead of being killed as an
    /// earlier session's are. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restored: bool,
}

/// Handshake answer from the agent (its `Default`: none heard yet).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HelloAck {
    /// The agent's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The agent's crate version.
    pub agent_version: String,
    /// Which OOM counter the agent reads: "v1", "v2" or "none".
    pub oom_counter: String,
    /// The [`Hello::session`] this answers.
    pub session: String,
    /// Whether the agent can reset the sandbox in place; absent when the
    /// sandbox was not started for it.
    #[serde(default)]
    pub reset: Option<ResetSupport>,
    /// Whether the agent exports and imports deltas
    /// ([`FrameKind::Export`], [`FrameKind::Import`]): only a sandbox
    /// that resets in place keeps its changes apart from its image.
    #[serde(default)]
    pub deltas: bool,
    /// The agent answers [`FrameKind::Usage`] (absent from an older agent:
    /// false, and corral does not ask it).
    #[serde(default)]
    pub usage: bool,
    /// The agent runs commands on terminals ([`ExecRequest::pty`],
    /// [`FrameKind::Resize`]); absent from an older agent: false, and
    /// corral refuses a terminal rather than run the command on pipes.
    #[serde(default)]
    pub pty: bool,
    /// The directory commands without a `cwd` run in: the agent's own
    /// (the image's `WorkingDir`, or the spec's `workdir`); absent from an
    /// older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The agent holds [`SHARED_DELTAS_DIR`] and takes a delta from a file
    /// there ([`ImportRequest::shared`]); absent from an older agent, or
    /// with no such mount: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_deltas: bool,
    /// Why the agent could not keep its stream out of commands' reach
    /// where the engine asked it to (gVisor's `init --pid-ns` in a sandbox
    /// that started as a user, not root): results are then not
    /// integrity-protected. Absent when it could, or was not asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_gap: Option<String>,
}

/// What the agent said about in-place reset at the handshake.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResetSupport {
    /// True when [`FrameKind::Reset`] works.
    pub ready: bool,
    /// Why it does not, for people (empty when ready).
    #[serde(default)]
    pub reason: String,
}

/// Return the sandbox to its pristine state: every process but the agent
/// killed, and commands from then on run in a fresh view of the file
/// system (the root file system as it was at the first reset, tmpfs mounts
/// as they were then, mounts from the host as they are).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResetRequest {
    /// Keep the changes made to the root file system since the last reset:
    /// they are merged into the sandbox's delta (its changes to its image:
    /// the start-up commands', an imported delta's, earlier kept ones), so
    /// they become part of the state later resets return to and of an
    /// exported delta. Changes to tmpfs mounts are not kept.
    #[serde(default)]
    pub keep: bool,
    /// Also apply the whole delta to the container's own root file system,
    /// for an engine's copy of the container (`docker commit`); absent
    /// means false.
    #[serde(default)]
    pub to_root: bool,
    /// Return to the delta a replacing import set aside (a warm pool's
    /// sandbox going back to its pool after a fork): the imported delta
    /// and everything kept on it are dropped. Nothing more without such
    /// an import; absent means false.
    #[serde(default)]
    pub restore: bool,
}

/// Stream the sandbox's delta: every change to its image's root file
/// system that resets return to (the start-up commands', an imported
/// delta's, kept resets'), as a tar archive with OCI whiteouts (`.wh.NAME`
/// deletes NAME, `.wh..wh..opq` hides everything below its directory).
/// Changes of the current world are not in it: keep them first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportRequest {
    /// The archive may not be longer than this; past it the export ends
    /// with a `too_large` error.
    pub max_bytes: u64,
}

/// Take in a delta (the archive [`ExportRequest`] describes) as the base
/// every world of this sandbox starts from. Only before the sandbox's
/// first command and first reset, unless `replace`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportRequest {
    /// Bytes of the archive, sent in [`FrameKind::ImportData`] frames.
    pub size: u64,
    /// The agent refuses archives longer than this (corral's limit).
    pub max_bytes: u64,
    /// Into a sandbox that already reset in place (a warm pool's): once
    /// the archive is in, every process is killed, the sandbox's own delta
    /// is set aside (a reset with `restore` brings it back) and a fresh
    /// world starts over the imported one. Absent means false.
    #[serde(default)]
    pub replace: bool,
    /// The archive is the file of this name in the shared deltas
    /// directory ([`HelloAck::shared_deltas`]), `size` bytes long, and no
    /// ImportData frames follow. A name is one component of letters,
    /// digits, `.`, `_` and `-` (neither `.` nor `..`). If the agent cannot
    /// open it, it answers `unsupported` before touching anything, and
    /// corral sends the bytes instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<String>,
}

/// How an export or an import went.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeltaReport {
    /// Why it failed; `None` on success.
    #[serde(default)]
    pub error: Option<DeltaError>,
    /// Bytes of the archive sent or taken in.
    pub bytes: u64,
    /// Entries of the archive.
    pub entries: u64,
    /// Time the agent spent, in microseconds.
    pub elapsed_us: u64,
}

/// Why an export or an import failed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeltaError {
    /// What kind of failure.
    pub kind: DeltaErrorKind,
    /// For people.
    pub message: String,
    /// The path inside the sandbox (or the archive's entry) it concerns.
    #[serde(default)]
    pub path: Option<String>,
}

/// The kinds of [`DeltaError`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DeltaErrorKind {
    /// The archive would exceed the limit.
    TooLarge,
    /// An entry of an imported archive is refused: it climbs out of the
    /// root, goes through a link, covers a mount, or is of a refused type.
    UnsafeEntry,
    /// The sandbox holds what an archive cannot carry (a file named
    /// `.wh.*`), or the agent cannot do it now (not started for in-place
    /// reset, a command already ran, an import in progress).
    Unsupported,
    /// Reading or writing failed.
    Io,
}

/// How a reset went.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResetReport {
    /// Why the reset failed; `None` on success. After a failure the
    /// sandbox is not pristine and must be replaced.
    #[serde(default)]
    pub error: Option<String>,
    /// Processes that were killed.
    pub killed: u32,
    /// Bytes of file content kept (with [`ResetRequest::keep`]).
    #[serde(default)]
    pub kept_bytes: u64,
    /// Time the agent spent, in microseconds.
    pub elapsed_us: u64,
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
    /// Kill every other process in the sandbox before spawning (other
    /// commands in flight report their death as usual).
    #[serde(default)]
    pub exclusive: bool,
    /// After the main process exits, keep reading until both output streams
    /// are closed (bounded by `timeout_ms`) instead of for at most 200 ms;
    /// absent (an older peer) means false.
    #[serde(default)]
    pub wait_for_output: bool,
    /// Run the command on a pseudo-terminal of this size instead of pipes:
    /// the terminal is its stdin, stdout and stderr and the controlling
    /// terminal of a new session it leads; what it writes arrives as
    /// [`FrameKind::Stdout`] (the terminal merges the streams), input goes
    /// in by [`FrameKind::Stdin`] whatever `stdin` says, and
    /// [`FrameKind::Resize`] changes the size. `wait_for_output` does not
    /// apply: the command ends with its main process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Start a code context's relay (`corral-agent kernel LANGUAGE`, the
    /// only argv allowed): under a relay uid of its own instead of the
    /// commands' user, on sockets instead of pipes, so no command can
    /// signal it or reach its stream; it starts its kernel as the
    /// commands' user. Absent (an older peer) means false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relay: bool,
}

/// Largest terminal width or height accepted, in cells.
pub const MAX_PTY_CELLS: u16 = 4096;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySize {
    /// Columns (width), 1 to [`MAX_PTY_CELLS`].
    pub cols: u16,
    /// Rows (height), 1 to [`MAX_PTY_CELLS`].
    pub rows: u16,
}

impl PtySize {
    /// `Err` names the field and value out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("cols", self.cols), ("rows", self.rows)] {
            if v == 0 || v > MAX_PTY_CELLS {
                return Err(format!(
                    "invalid pty.{name} {v}: must be 1 to {MAX_PTY_CELLS}"
                ));
            }
        }
        Ok(())
    }
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
    /// The kernel's OOM killer killed the command's main process (the cgroup
    /// counter rose while it ran and the main process itself died of SIGKILL;
    /// an exit, even with code 137, never counts).
    pub oom_killed: bool,
    /// Wall time from spawn to the end of the command (the main process's
    /// exit, or with `wait_for_output` the streams' close), in microseconds.
    pub duration_us: u64,
    /// Stdout totals.
    pub stdout: StreamTotals,
    /// Stderr totals.
    pub stderr: StreamTotals,
    /// What the command's processes used; absent from an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<CommandUsage>,
}

/// What a command's processes used, as the agent saw them end: the main
/// process with every descendant it waited for (`wait4`'s usage), plus the
/// processes of its process group that were orphaned and reaped by the
/// agent before the report went out. Processes still running at the
/// report, and those that left the group (`setsid`), are not counted.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommandUsage {
    /// CPU time in user mode, in microseconds.
    pub user_us: u64,
    /// CPU time in the kernel, in microseconds.
    pub system_us: u64,
    /// The largest resident set size any one of those processes reached,
    /// in bytes (a peak per process, not the sum over processes).
    pub max_rss_bytes: u64,
    /// Orphans counted (processes of the command's group the agent
    /// reaped), beside the main process.
    #[serde(default)]
    pub orphans: u32,
}

/// What the sandbox uses now, as its agent reads it from inside: the
/// sandbox's own cgroup (v2, or v1's controllers) and its network
/// namespace's interface counters (`/proc/net/dev`, loopback left out). A
/// value the sandbox does not expose is absent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxUsage {
    /// The cgroup interface read: `v2`, `v1` or `none`.
    pub cgroup: String,
    /// CPU time of all its processes, the dead included, in nanoseconds.
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Memory in use, without the page cache the kernel can drop (the
    /// inactive file pages), as `docker stats` counts it.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// The most memory used at once (v1's `max_usage_in_bytes`, v2's
    /// `memory.peak` where the kernel has it).
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    /// The cgroup's memory limit; absent: none.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Processes the kernel's OOM killer killed in it.
    #[serde(default)]
    pub oom_kills: Option<u64>,
    /// Processes (and threads) alive.
    #[serde(default)]
    pub pids: Option<u64>,
    /// The cgroup's process limit; absent: none.
    #[serde(default)]
    pub pids_limit: Option<u64>,
    /// Bytes read from block devices.
    #[serde(default)]
    pub block_read_bytes: Option<u64>,
    /// Bytes written to block devices.
    #[serde(default)]
    pub block_write_bytes: Option<u64>,
    /// Bytes received over its network interfaces.
    #[serde(default)]
    pub net_rx_bytes: Option<u64>,
    /// Bytes sent over its network interfaces.
    #[serde(default)]
    pub net_tx_bytes: Option<u64>,
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
    fn pty_sizes_are_checked_and_an_exec_without_one_still_parses() {
        assert_eq!(FrameKind::from_u8(12), Some(FrameKind::Resize));
        assert_eq!(
            PtySize {
                cols: 1,
                rows: 4096
            }
            .validate(),
            Ok(())
        );
        let e = PtySize { cols: 0, rows: 24 }
            .validate()
            .expect_err("out of range");
        assert!(e.contains("pty.cols 0"), "{e}");
        let e = PtySize {
            cols: 80,
            rows: 4097,
        }
        .validate()
        .expect_err("out of range");
        assert!(e.contains("pty.rows 4097"), "{e}");
        // An older peer's Exec has no pty; one without a pty sends none.
        let old: ExecRequest =
            serde_json::from_str(r#"{"argv":["true"],"max_output":0}"#).expect("parses");
        assert_eq!(old.pty, None);
        assert!(!serde_json::to_string(&old).expect("json").contains("pty"));
        let ack: HelloAck = serde_json::from_str(
            r#"{"protocol":2,"agent_version":"0","oom_counter":"none","session":""}"#,
        )
        .expect("parses");
        assert!(!ack.pty);
    }

    #[test]
    fn round_trips_frames_split_at_every_byte() {
        let frames = vec![
            Frame::json(
                FrameKind::Hello,
                0,
                &Hello {
                    protocol: 1,
                    session: "s".into(),
                    env: vec![("API_KEY".into(), "v".into())],
                    restored: false,
                },
            ),
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
        // An older corral sends no wait_for_output: today's behaviour.
        assert!(!req.wait_for_output);
        let bad = Frame::new(FrameKind::Exec, 3, b"{".to_vec());
        assert!(matches!(
            bad.parse::<ExecRequest>(),
            Err(ProtocolViolation::BadPayload { id: 3, .. })
        ));
    }

    #[test]
    fn sync_decoder_finds_the_session_start_anywhere() {
        let hello = Frame::new(FrameKind::Ping, 0, b"x".to_vec());
        let mut wire = b"half a frame from before \0corral".to_vec();
        wire.extend_from_slice(SYNC);
        hello.encode_into(&mut wire);
        for split in 0..wire.len() {
            let mut d = SyncDecoder::new();
            let mut got = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                d.extend(part);
                while let Some(item) = d.next_item().expect("valid") {
                    got.push(item);
                }
            }
            assert_eq!(
                got,
                vec![Item::Synced, Item::Frame(hello.clone())],
                "split {split}"
            );
        }
    }

    #[test]
    fn sync_decoder_hunts_in_bounded_memory_and_resyncs() {
        let mut d = SyncDecoder::new();
        for _ in 0..1000 {
            d.extend(&[7u8; 4096]);
            assert_eq!(d.next_item(), Ok(None));
        }
        assert!(d.hunt.len() < SYNC.len());
        d.extend(SYNC);
        assert_eq!(d.next_item(), Ok(Some(Item::Synced)));
        // A stream that breaks off mid-frame, then a new session begins.
        d.extend(&[66, 0, 0, 0, 1, 0, 0, 0, 100, 1, 2]);
        assert_eq!(d.next_item(), Ok(None));
        assert!(d.has_partial());
        d.resync();
        d.extend(SYNC);
        assert_eq!(d.next_item(), Ok(Some(Item::Synced)));
        // Sync bytes in the middle of framed data are an error the caller
        // can recognise.
        d.extend(SYNC);
        assert!(d.next_item().is_err());
        assert!(d.at_sync());
    }

    #[test]
    fn only_a_small_handshake_may_follow_sync_bytes() {
        let mut d = SyncDecoder::new();
        d.extend(SYNC);
        assert_eq!(d.next_item(), Ok(Some(Item::Synced)));
        let mut wire = Vec::new();
        Frame::new(FrameKind::HelloAck, 0, b"{}".to_vec()).encode_into(&mut wire);
        d.extend(&wire);
        assert!(!d.refuse_non_handshake(FrameKind::HelloAck));
        assert!(d.refuse_non_handshake(FrameKind::Hello));
        assert!(d.is_hunting());
        // A handshake kind announcing a huge payload is no handshake either.
        let mut d = SyncDecoder::new();
        d.extend(SYNC);
        assert_eq!(d.next_item(), Ok(Some(Item::Synced)));
        d.extend(&[FrameKind::HelloAck as u8, 0, 0, 0, 0, 0, 0x10, 0, 0]);
        assert!(d.refuse_non_handshake(FrameKind::HelloAck));
        // A Hello carries the environment: larger, but still bounded.
        let hello = |len: u32| {
            let mut d = SyncDecoder::new();
            d.extend(SYNC);
            assert_eq!(d.next_item(), Ok(Some(Item::Synced)));
            let mut header = vec![FrameKind::Hello as u8, 0, 0, 0, 0];
            header.extend_from_slice(&len.to_be_bytes());
            d.extend(&header);
            d.refuse_non_handshake(FrameKind::Hello)
        };
        assert!(!hello(MAX_HELLO as u32));
        assert!(hello(MAX_HELLO as u32 + 1));
    }

    #[test]
    fn a_hello_without_env_parses_with_none() {
        let f = Frame::new(
            FrameKind::Hello,
            0,
            br#"{"protocol":2,"session":"s"}"#.to_vec(),
        );
        let h: Hello = f.parse().expect("parses");
        assert!(h.env.is_empty());
    }
}
