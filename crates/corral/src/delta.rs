//! A sandbox's delta through its agent's own stream: [`Sandbox::export_delta`]
//! and [`Sandbox::import_delta`].
//!
//! A sandbox that resets in place keeps every change to its image that its
//! resets return to (the start-up commands', kept resets', an imported
//! delta's) apart from the image, in its agent's memory. The agent sends it
//! as a tar archive with OCI whiteouts, and takes one in as the base of a
//! fresh sandbox before its first command: a snapshot and its forks need
//! no image and no registry, on any engine that runs the agent.
//!
//! Both directions are bounded: an export asks for at most the limit and a
//! frame past it is a protocol violation; an import announces its size,
//! which the agent checks against the same limit. The agent checks every
//! entry it takes in as hostile input (the archive may come from a
//! compromised sandbox); corral only carries the bytes.

use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use corral_core::protocol::{
    DeltaErrorKind, DeltaReport, ExportRequest, Frame, FrameKind, ImportRequest, MAX_PAYLOAD,
};
use corral_core::Error;
use tokio::sync::OnceCell;

use crate::conn::Exchange;
use crate::sandbox::Sandbox;

/// Bytes of a delta per frame sent to an agent.
const CHUNK: usize = 1 << 20;

/// Longest an export or an import may take, for each 64 MiB of its limit
/// or size (at least once): the bytes go through memory on both ends.
const TIME_PER_64_MIB: Duration = Duration::from_secs(60);

/// A sandbox's changes to its image, as the tar archive (OCI whiteouts)
/// its agent exported: cheap to clone, shared by every fork.
#[derive(Clone)]
pub struct Delta {
    bytes: Bytes,
    /// Its file in the backend's shared deltas directory, written by the
    /// first import that wants it; removed with the last clone.
    shared: Arc<OnceCell<Option<SharedFile>>>,
}

impl PartialEq for Delta {
    fn eq(&self, other: &Delta) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Delta {}

/// A delta written to the shared deltas directory, as
/// `<pid>-<start>/<random>.tar` (the directory names the corral process
/// that wrote it, so one that died is cleaned up by the next). No sandbox
/// mounts that directory: each import links the file into the importing
/// sandbox's own directory for its duration.
struct SharedFile {
    path: PathBuf,
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a shared delta");
        }
    }
}

/// This process's directory under the shared deltas directory `root`,
/// made on first use (0711, as `root`), after removing those of corral
/// processes that are gone.
fn process_dir(root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    static SWEPT: AtomicBool = AtomicBool::new(false);
    let owner = crate::host::this_owner();
    let dir = root.join(format!("{}-{}", owner.pid, owner.start));
    if !SWEPT.load(Ordering::Relaxed) {
        for entry in std::fs::read_dir(root)?.flatten() {
            let name = entry.file_name();
            let Some((pid, start)) = name.to_str().and_then(|n| n.split_once('-')) else {
                continue;
            };
            let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
                continue;
            };
            if !crate::host::process_alive(pid, start) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        SWEPT.store(true, Ordering::Relaxed);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
    Ok(dir)
}

/// Writes `bytes` to a new file of `root` (0644 under an unguessable
/// name: the directories above it cannot be listed).
fn write_shared(root: &Path, bytes: &[u8]) -> std::io::Result<SharedFile> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = process_dir(root)?;
    let path = dir.join(format!("{}.tar", crate::host::random_hex(32)));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)?;
    let shared = SharedFile { path };
    // 0644 whatever the umask: the agents read it as another user.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    f.write_all(bytes)?;
    Ok(shared)
}

impl std::fmt::Debug for Delta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delta")
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl Delta {
    /// A delta from the bytes of its archive (an exported one, or one read
    /// back from a file). Nothing is checked here: the agent that imports
    /// it checks every entry.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Delta {
        Delta {
            bytes: bytes.into(),
            shared: Arc::default(),
        }
    }

    /// Its file in the shared deltas directory `root`, written there once
    /// (every fork of this delta links the same file); `None` when it
    /// cannot be written (logged: forks get the bytes over their stream).
    async fn shared_file(&self, root: &Path) -> Option<PathBuf> {
        let file = self
            .shared
            .get_or_init(|| async {
                let (dir, bytes) = (root.to_path_buf(), self.bytes.clone());
                let written = tokio::task::spawn_blocking(move || write_shared(&dir, &bytes)).await;
                match written {
                    Ok(Ok(f)) => Some(f),
                    Ok(Err(e)) => {
                        tracing::warn!(dir = %root.display(), error = %e, "cannot write a shared delta; forks get it over their stream");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "writing a shared delta failed");
                        None
                    }
                }
            })
            .await;
        file.as_ref().map(|f| f.path.clone())
    }

    /// The archive.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for an empty archive.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A shared delta linked into one sandbox's directory for its import;
/// unlinked when dropped (the agent has it open, or is done with it).
struct SharedLink {
    name: String,
    path: PathBuf,
}

impl SharedLink {
    /// Links `file` into sandbox `sandbox`'s directory of `root`; `None`
    /// (logged) when that fails: the bytes then go over the stream.
    fn make(file: &Path, root: &Path, sandbox: &str) -> Option<SharedLink> {
        let name = format!("{}.tar", crate::host::random_hex(32));
        let path = corral_core::backend::sandbox_deltas_dir(root, sandbox).join(&name);
        match std::fs::hard_link(file, &path) {
            Ok(()) => Some(SharedLink { name, path }),
            Err(e) => {
                tracing::warn!(sandbox, path = %path.display(), error = %e, "cannot link the shared delta for the sandbox; sending it");
                None
            }
        }
    }
}

impl Drop for SharedLink {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot unlink a shared delta");
        }
    }
}

fn deadline(bytes: u64) -> Duration {
    TIME_PER_64_MIB * u32::try_from(bytes / (64 << 20) + 1).unwrap_or(u32::MAX)
}

impl Sandbox {
    fn delta_error(&self, report: &DeltaReport, what: &str, cap: u64) -> Option<Error> {
        let e = report.error.as_ref()?;
        Some(match e.kind {
            DeltaErrorKind::TooLarge => Error::SnapshotTooLarge {
                sandbox: self.id().to_string(),
                cap,
            },
            _ => Error::Agent {
                sandbox: self.id().to_string(),
                message: format!(
                    "{what} failed ({}): {}",
                    serde_json::to_value(e.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    e.message
                ),
            },
        })
    }

    fn no_deltas(&self) -> Option<Error> {
        if self.conn_hello().deltas {
            return None;
        }
        let why = self
            .resets_in_place()
            .err()
            .unwrap_or_else(|| "its agent keeps no delta".into());
        Some(Error::Unsupported {
            what: format!(
                "a delta of sandbox {} through its agent: it does not reset in place ({why})",
                self.id()
            ),
        })
    }

    /// The sandbox's delta as its agent keeps it (changes of the current
    /// world are not in it: keep them with a `keep` reset first), at most
    /// `max_bytes` (past it: [`Error::SnapshotTooLarge`]).
    pub async fn export_delta(&self, max_bytes: u64) -> Result<Delta, Error> {
        if let Some(e) = self.no_deltas() {
            return Err(e);
        }
        let agent = |message: String| Error::Agent {
            sandbox: self.id().to_string(),
            message,
        };
        let conn = self.current_conn();
        let id = conn.next_id();
        let mut rx = conn
            .register_exchange(id, Exchange::Export(max_bytes))
            .map_err(agent)?;
        conn.send(Frame::json(
            FrameKind::Export,
            id,
            &ExportRequest { max_bytes },
        ))
        .await
        .map_err(agent)?;
        let mut bytes = Vec::new();
        let limit = deadline(max_bytes);
        let receive = async {
            while let Some(frame) = rx.recv().await {
                match frame.kind {
                    FrameKind::ExportData => bytes.extend_from_slice(&frame.payload),
                    FrameKind::ExportDone => return Ok(frame),
                    _ => {
                        return Err(format!(
                            "the agent refused the export: {}",
                            String::from_utf8_lossy(&frame.payload)
                        ))
                    }
                }
            }
            Err(format!(
                "the control stream ended: {}",
                conn.closed_reason()
            ))
        };
        let done = tokio::time::timeout(limit, receive)
            .await
            .map_err(|_| agent(format!("the export took longer than {limit:?}")))?
            .map_err(agent)?;
        let report: DeltaReport = done
            .parse()
            .map_err(|e| agent(format!("unreadable export report: {e}")))?;
        if let Some(e) = self.delta_error(&report, "exporting the delta", max_bytes) {
            return Err(e);
        }
        if report.bytes != bytes.len() as u64 {
            return Err(agent(format!(
                "the export reported {} bytes and sent {}",
                report.bytes,
                bytes.len()
            )));
        }
        Ok(Delta::from_bytes(bytes))
    }

    /// Takes `delta` in as this sandbox's base, before its first command
    /// and first reset (the agent refuses it later), or, with `replace`,
    /// in place of the delta of a sandbox that already reset in place (a
    /// warm pool's: its processes are killed and its own delta set aside
    /// until a reset for its pool); `max_bytes` is the limit the agent
    /// checks its size against.
    pub(crate) async fn import_delta(
        &self,
        delta: &Delta,
        max_bytes: u64,
        replace: bool,
    ) -> Result<(), Error> {
        if let Some(e) = self.no_deltas() {
            return Err(e);
        }
        let started = Instant::now();
        // Through the shared deltas directory when the agent holds it: the
        // delta is written once for every fork, not sent to each.
        let shared = match self.runtime().backend().shared_deltas() {
            Some(root) if self.conn_hello().shared_deltas => match delta.shared_file(root).await {
                Some(file) => SharedLink::make(&file, root, self.id()),
                None => None,
            },
            _ => None,
        };
        let mut answered = None;
        if let Some(link) = &shared {
            let report = self
                .import_exchange(delta, max_bytes, replace, Some(&link.name))
                .await?;
            match &report.error {
                // Refused before anything changed (the file is not where
                // the agent looks): the bytes go over the stream instead.
                Some(e) if e.kind == DeltaErrorKind::Unsupported && report.bytes == 0 => {
                    tracing::warn!(sandbox = self.id(), error = %e.message, "the agent could not read the shared delta; sending it");
                }
                _ => answered = Some(report),
            }
        }
        let report = match answered {
            Some(r) => r,
            None => {
                self.import_exchange(delta, max_bytes, replace, None)
                    .await?
            }
        };
        if let Some(e) = self.delta_error(&report, "importing the delta", max_bytes) {
            return Err(e);
        }
        let size = delta.len();
        tracing::debug!(
            sandbox = self.id(),
            bytes = size,
            entries = report.entries,
            ms = started.elapsed().as_secs_f64() * 1e3,
            agent_ms = report.elapsed_us as f64 / 1e3,
            shared = shared.is_some(),
            "imported a delta"
        );
        Ok(())
    }

    /// One import exchange: the request, then the bytes unless `shared`
    /// names the file the agent reads them from, then the agent's report.
    async fn import_exchange(
        &self,
        delta: &Delta,
        max_bytes: u64,
        replace: bool,
        shared: Option<&str>,
    ) -> Result<DeltaReport, Error> {
        let agent = |message: String| Error::Agent {
            sandbox: self.id().to_string(),
            message,
        };
        let conn = self.current_conn();
        let id = conn.next_id();
        let mut rx = conn
            .register_exchange(id, Exchange::Import)
            .map_err(agent)?;
        let size = delta.len() as u64;
        let limit = deadline(size);
        let exchange = async {
            conn.send(Frame::json(
                FrameKind::Import,
                id,
                &ImportRequest {
                    size,
                    max_bytes,
                    replace,
                    shared: shared.map(str::to_string),
                },
            ))
            .await?;
            if shared.is_none() {
                const { assert!(CHUNK <= MAX_PAYLOAD) };
                for chunk in delta.as_bytes().chunks(CHUNK) {
                    conn.send_parts(FrameKind::ImportData, id, chunk).await?;
                }
            }
            match rx.recv().await {
                Some(frame) => Ok(frame),
                None => Err(format!(
                    "the control stream ended: {}",
                    conn.closed_reason()
                )),
            }
        };
        let answer = tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| agent(format!("the import took longer than {limit:?}")))?
            .map_err(agent)?;
        if answer.kind != FrameKind::ImportDone {
            return Err(agent(format!(
                "the agent refused the import: {}",
                String::from_utf8_lossy(&answer.payload)
            )));
        }
        answer
            .parse()
            .map_err(|e| agent(format!("unreadable import report: {e}")))
    }
}
