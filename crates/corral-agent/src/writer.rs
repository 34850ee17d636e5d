//! The single way frames reach corral: PID 1's stdout.
//!
//! Many threads answer corral (the stdin reader, one supervisor per
//! command); a frame must go out whole or frames interleave and the stream is
//! garbage. Each frame is encoded first and then written with one
//! `write_all` under a mutex.
//!
//! The mutex also holds the session epoch. A new Hello bumps it under the
//! same lock that writes the HelloAck, and a supervisor's frames carry the
//! epoch its command was started in, so once corral has read a HelloAck it
//! never sees a frame of an earlier session.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corral_core::protocol::{Frame, FrameKind, ProtocolError, SYNC};

use crate::control::lock;

struct Out {
    file: File,
    epoch: u64,
}

/// Serialised writes to corral.
pub struct FrameWriter {
    out: Mutex<Out>,
    broken: AtomicBool,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameWriter").finish_non_exhaustive()
    }
}

impl FrameWriter {
    /// Writes frames to `file` (PID 1's stdout).
    pub fn new(file: File) -> Self {
        FrameWriter {
            out: Mutex::new(Out { file, epoch: 0 }),
            broken: AtomicBool::new(false),
        }
    }

    /// Writes `bytes` unless the session moved on or `gate` says the
    /// command already reported its end; `close` then marks it reported.
    fn write_gated(
        &self,
        epoch: Option<u64>,
        gate: Option<(&AtomicBool, bool)>,
        bytes: &[u8],
    ) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut out = lock(&self.out);
        if epoch.is_some_and(|e| e != out.epoch) {
            return false; // a frame of an earlier session: nobody asked for it
        }
        if let Some((reported, close)) = gate {
            if reported.load(Ordering::Relaxed) {
                return false; // nothing follows a command's Exited
            }
            if close {
                reported.store(true, Ordering::Relaxed);
            }
        }
        if out.file.write_all(bytes).is_err() {
            self.broken.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn write(&self, epoch: Option<u64>, bytes: &[u8]) -> bool {
        self.write_gated(epoch, None, bytes)
    }

    /// Sends one connection-level frame. Returns false once stdout is broken.
    pub fn send(&self, frame: &Frame) -> bool {
        self.write(None, &frame.encode())
    }

    /// Sends an Error frame about running command `id`, unless it has
    /// already reported Exited (the refused frame crossed its end).
    pub fn error_while_running(&self, id: u32, reported: &AtomicBool, message: String) -> bool {
        let frame = Frame::json(FrameKind::Error, id, &ProtocolError { message });
        self.write_gated(None, Some((reported, false)), &frame.encode())
    }

    /// Sends an Error frame about frame `id`.
    pub fn error(&self, id: u32, message: impl Into<String>) -> bool {
        let msg = ProtocolError {
            message: message.into(),
        };
        self.send(&Frame::json(FrameKind::Error, id, &msg))
    }

    /// Starts a new session: bumps the epoch and writes [`SYNC`] and the
    /// HelloAck in one go. Returns the new epoch.
    pub fn new_session(&self, ack: &Frame) -> u64 {
        let mut bytes = SYNC.to_vec();
        ack.encode_into(&mut bytes);
        let mut out = lock(&self.out);
        out.epoch += 1;
        if out.file.write_all(&bytes).is_err() {
            self.broken.store(true, Ordering::Relaxed);
        }
        out.epoch
    }

    /// Sends everything from now on to `file` (a new controller
    /// connection) and ends the current session: frames of commands it
    /// started are dropped from here on, never sent to the new controller.
    pub fn replace_output(&self, file: File) {
        let mut out = lock(&self.out);
        out.file = file;
        out.epoch += 1;
        self.broken.store(false, Ordering::Relaxed);
    }

    /// The current session's epoch.
    pub fn epoch(&self) -> u64 {
        lock(&self.out).epoch
    }
}

/// A writer bound to the session a command was started in: its frames are
/// dropped once another session began.
#[derive(Debug, Clone)]
pub struct SessionWriter {
    writer: Arc<FrameWriter>,
    epoch: u64,
}

impl SessionWriter {
    /// Binds `writer` to session `epoch`.
    pub fn new(writer: Arc<FrameWriter>, epoch: u64) -> Self {
        SessionWriter { writer, epoch }
    }

    /// Sends one frame if its session is still current.
    pub fn send(&self, frame: &Frame) -> bool {
        self.writer.write(Some(self.epoch), &frame.encode())
    }

    /// Sends a command's last frame and marks it reported, atomically with
    /// respect to [`FrameWriter::error_while_running`].
    pub fn send_last(&self, frame: &Frame, reported: &AtomicBool) -> bool {
        self.writer
            .write_gated(Some(self.epoch), Some((reported, true)), &frame.encode())
    }
}
