//! The single way frames reach a client.
//!
//! Many threads answer one client (the connection reader, one supervisor per
//! command); a frame must go out whole or frames interleave and the stream is
//! garbage. Each frame is encoded first and then written with one
//! `write_all` under a mutex.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use corral_core::protocol::{Frame, FrameKind, ProtocolError};

use crate::control::lock;

/// Serialised writes to one client.
#[derive(Debug)]
pub struct FrameWriter {
    stream: Mutex<UnixStream>,
    broken: AtomicBool,
}

impl FrameWriter {
    /// Writes frames to `stream`.
    pub fn new(stream: UnixStream) -> Self {
        FrameWriter {
            stream: Mutex::new(stream),
            broken: AtomicBool::new(false),
        }
    }

    /// Sends one frame. Returns false once the client is gone; later frames
    /// are dropped (nobody can read them any more).
    pub fn send(&self, frame: &Frame) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let bytes = frame.encode();
        let mut stream = lock(&self.stream);
        if stream.write_all(&bytes).is_err() {
            self.broken.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Sends an Error frame about frame `id`.
    pub fn error(&self, id: u32, message: impl Into<String>) -> bool {
        let msg = ProtocolError {
            message: message.into(),
        };
        self.send(&Frame::json(FrameKind::Error, id, &msg))
    }
}
