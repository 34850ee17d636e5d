//! Live snapshots on Docker: the daemon's checkpoint API over gVisor's
//! checkpoint and restore.
//!
//! What works on this stack (Docker 20.10, runsc 2022-12) and what does
//! not, as measured:
//!
//! - runsc refuses to checkpoint a sandbox on the host network stack
//!   ("checkpoint not supported when using hostinet"), which the gVisor
//!   tier uses for network; a sandbox without network runs under
//!   [`GVISOR_LIVE_RUNTIME`] (`--network=none --overlay`), which
//!   checkpoints, root file system changes included (`--overlay` holds
//!   them in the sandbox's memory; without it a fork restored on a fresh
//!   root fails on the first file the source had open that its image
//!   lacks).
//! - The daemon's checkpoint API needs its `experimental` setting.
//!   `--leave-running` fails under runsc ("invalid state transition:
//!   paused => stopped"), so a checkpoint stops the container and this
//!   module restores it in place at once.
//! - `docker start --checkpoint-dir` is refused ("custom checkpointdir is
//!   not supported"): a checkpoint is written to corral's own directory
//!   and linked into the starting container's own checkpoint directory
//!   under the daemon's data root, which needs the daemon on this host.
//! - Two restores at once of the same checkpoint fail ("failed to upload
//!   checkpoint to containerd: commit failed: content sha256:...: already
//!   exists"): each restore's copy carries a mark of its own
//!   ([`RESTORE_MARK`]), so no two have the same digest and forks restore
//!   in parallel (4 at once: 0.74 s, against about 0.4 s each one by one).
//! - The daemon's shim copies each restored checkpoint into the host's
//!   temporary directory (`ctrd-checkpoint*`) and leaves it there: corral
//!   removes the one that carries its restore's mark.
//! - A checkpoint of a sandbox that was itself restored stops it but
//!   leaves runsc's state behind, saying paused (`runsc kill` and `resume`
//!   then fail: "connecting to control server ... connection refused"), so
//!   containerd keeps the task and the daemon refuses to start the
//!   container again ("id already in use"). corral then removes the state
//!   with `runsc delete -force` (the runtime's binary, under the daemon's
//!   default exec root), after which a restore works; a restore in place
//!   also tries again for up to 5 s while the daemon finds the id in use.
//! - bollard has no checkpoint parameter on start: that one request goes
//!   over the daemon's socket here.
//! - runc: Debian's CRIU 3.17 cannot read this kernel's vDSO layout
//!   ("vdso: Unexpected rt vDSO area bounds"), so the container tier has no
//!   live snapshots; it is refused by name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::container::CreateCheckpointOptions;
use corral_core::spec::{GVISOR_LIVE_RUNTIME, GVISOR_RUNTIME};
use corral_core::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::DockerBackend;
use crate::error::api;

/// The checkpoint's name inside a container's own checkpoint directory.
const NAME: &str = "corral-live";

/// The file in each restore's copy of a checkpoint that tells it apart
/// (its content: the container and the time), and finds the copy the
/// daemon's shim leaves behind.
const RESTORE_MARK: &str = "corral-restore";

/// The prefix of the directories the shim copies a checkpoint into.
const SHIM_COPY_PREFIX: &str = "ctrd-checkpoint";

/// How often a restore in place is tried again while the checkpointed
/// task is still being cleaned up ("id already in use"), and how long
/// apart.
const RESTORE_RETRIES: u32 = 50;
const RESTORE_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Where the daemon's runc shim has runsc keep its state (the daemon's
/// default exec root).
const RUNSC_STATE_ROOT: &str = "/var/run/docker/runtime-runc/moby";

/// How long runsc's state of a checkpointed sandbox may take to go by
/// itself.
const STALE_STATE_WAIT: Duration = Duration::from_secs(1);

/// Bound on the start request that restores a checkpoint.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);

fn unsupported(what: String) -> Error {
    Error::Unsupported { what }
}

fn host(what: String, e: impl std::fmt::Display) -> Error {
    Error::Host {
        what,
        reason: e.to_string(),
    }
}

impl DockerBackend {
    /// Why this daemon cannot take or restore live snapshots, if it cannot.
    pub(crate) async fn live_refusal(&self) -> Option<String> {
        if self.socket_path().is_none() {
            return Some(format!(
                "live snapshots need the Docker daemon on this host (its socket), not {}",
                self.inner.endpoint
            ));
        }
        match self.inner.docker.version().await {
            Ok(v) if v.experimental != Some(true) => Some(
                "live snapshots need the Docker daemon's checkpoint API, which its \
                 `experimental` setting turns on (scripts/ensure-gvisor.sh sets it)"
                    .into(),
            ),
            Ok(_) => None,
            Err(e) => Some(format!("the Docker daemon's version is unknown: {e}")),
        }
    }

    /// The daemon's socket, when it is a local one.
    fn socket_path(&self) -> Option<PathBuf> {
        self.inner
            .endpoint
            .strip_prefix("unix://")
            .map(PathBuf::from)
    }

    /// Checkpoints the container `cid` into `dir` (which must not exist;
    /// its parent must), which stops it; with `resume`, restores it in
    /// place. The bytes written.
    pub(crate) async fn live_checkpoint(
        &self,
        cid: &str,
        dir: &Path,
        resume: bool,
    ) -> Result<u64, Error> {
        let docker = &self.inner.docker;
        let info = docker
            .inspect_container(cid, None)
            .await
            .map_err(|e| api(format!("inspect container {cid}"), e))?;
        let runtime = info
            .host_config
            .as_ref()
            .and_then(|h| h.runtime.clone())
            .unwrap_or_default();
        if runtime != GVISOR_LIVE_RUNTIME {
            let why = if runtime == GVISOR_RUNTIME {
                "gVisor checkpoints no sandbox on the host network stack, which gVisor sandboxes \
                 with network use (runsc --network=host); one with `network: none` can be"
                    .to_string()
            } else {
                format!(
                    "its tier (runtime {}) has no checkpoint here: corral checkpoints gVisor \
                     sandboxes with `network: none` (runc's checkpoint needs CRIU, and Debian's \
                     CRIU 3.17 cannot dump on this kernel)",
                    if runtime.is_empty() { "runc" } else { &runtime }
                )
            };
            return Err(unsupported(format!(
                "a live snapshot of container {cid}: {why}"
            )));
        }
        if let Some(why) = self.live_refusal().await {
            return Err(unsupported(why));
        }
        let (parent, name) = split(dir)?;
        docker
            .create_checkpoint(
                cid,
                CreateCheckpointOptions {
                    checkpoint_id: name,
                    checkpoint_dir: Some(parent.display().to_string()),
                    exit: true,
                },
            )
            .await
            .map_err(|e| api(format!("checkpoint container {cid}"), e))?;
        let full = info.id.clone().unwrap_or_else(|| cid.to_string());
        self.clear_stale_sandbox(&full).await;
        let size = dir_size(dir).await?;
        if resume {
            self.restore_checked(cid, dir).await?;
        }
        Ok(size)
    }

    /// Clears what runsc leaves of container `id` after a checkpoint of a
    /// sandbox that was itself restored: its state (which still says
    /// paused) outlives the sandbox, so containerd keeps the task and the
    /// daemon refuses to start the container again ("id already in use")
    /// until runsc forgets it. The normal teardown removes the state within
    /// moments; what is left after [`STALE_STATE_WAIT`] is removed with
    /// `runsc delete -force`.
    async fn clear_stale_sandbox(&self, id: &str) {
        let state = Path::new(RUNSC_STATE_ROOT).join(format!("{id}_sandbox:{id}.state"));
        let until = tokio::time::Instant::now() + STALE_STATE_WAIT;
        while tokio::fs::try_exists(&state).await.unwrap_or(false) {
            if tokio::time::Instant::now() >= until {
                let runsc = self.live_runtime_path().await;
                let out = tokio::time::timeout(
                    Duration::from_secs(30),
                    tokio::process::Command::new(&runsc)
                        .args(["--root", RUNSC_STATE_ROOT, "delete", "-force", id])
                        .stdin(std::process::Stdio::null())
                        .output(),
                )
                .await;
                let still = tokio::fs::try_exists(&state).await.unwrap_or(false);
                match out {
                    Ok(Ok(_)) if !still => {
                        tracing::info!(container = %id, "cleared runsc's state of a checkpointed sandbox");
                    }
                    other => {
                        tracing::warn!(container = %id, outcome = ?other.map(|r| r.map(|o| o.status)), "cannot clear runsc's state of a checkpointed sandbox; it cannot start again");
                    }
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The runsc binary the daemon runs for [`GVISOR_LIVE_RUNTIME`].
    async fn live_runtime_path(&self) -> String {
        self.inner
            .docker
            .info()
            .await
            .ok()
            .and_then(|i| i.runtimes)
            .and_then(|r| r.get(GVISOR_LIVE_RUNTIME).and_then(|r| r.path.clone()))
            .unwrap_or_else(|| "runsc".into())
    }

    /// Starts the created (or stopped) container `cid` from the checkpoint
    /// in `dir`.
    pub(crate) async fn live_restore(&self, cid: &str, dir: &Path) -> Result<(), Error> {
        if let Some(why) = self.live_refusal().await {
            return Err(unsupported(why));
        }
        self.restore_checked(cid, dir).await
    }

    /// [`DockerBackend::live_restore`] where the daemon was found able to.
    async fn restore_checked(&self, cid: &str, dir: &Path) -> Result<(), Error> {
        let docker = &self.inner.docker;
        let info = docker
            .inspect_container(cid, None)
            .await
            .map_err(|e| api(format!("inspect container {cid}"), e))?;
        let full = info.id.unwrap_or_else(|| cid.to_string());
        let root = docker
            .info()
            .await
            .map_err(|e| api("read the daemon's data root", e))?
            .docker_root_dir
            .unwrap_or_else(|| "/var/lib/docker".into());
        let target = Path::new(&root)
            .join("containers")
            .join(&full)
            .join("checkpoints")
            .join(NAME);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mark = format!("{full}-{nanos}");
        let (from, to, m) = (dir.to_path_buf(), target.clone(), mark.clone());
        tokio::task::spawn_blocking(move || link_tree(&from, &to, &m))
            .await
            .map_err(|e| host(format!("linking checkpoint {}", dir.display()), e))??;
        let socket = self.socket_path().unwrap_or_default();
        let started = tokio::time::timeout(RESTORE_TIMEOUT, async {
            let mut tries = 0;
            loop {
                match start_from(&socket, &full).await {
                    // The checkpointed task may still be on its way out of
                    // containerd: the daemon then finds its id in use.
                    Err(e) if e.contains("id already in use") && tries < RESTORE_RETRIES => {
                        tries += 1;
                        tokio::time::sleep(RESTORE_RETRY_PAUSE).await;
                    }
                    other => return other,
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {}s", RESTORE_TIMEOUT.as_secs())));
        let _ = tokio::fs::remove_dir_all(&target).await;
        let _ = tokio::task::spawn_blocking(move || remove_shim_copy(&mark)).await;
        started.map_err(|reason| Error::Engine {
            op: format!("restore container {cid} from checkpoint {}", dir.display()),
            kind: corral_core::FailureKind::AgentError,
            source: reason.into(),
        })
    }
}

/// `dir`'s parent and last component.
fn split(dir: &Path) -> Result<(PathBuf, String), Error> {
    match (dir.parent(), dir.file_name().and_then(|n| n.to_str())) {
        (Some(p), Some(n)) => Ok((p.to_path_buf(), n.to_string())),
        _ => Err(host(
            format!("checkpoint directory {}", dir.display()),
            "has no parent",
        )),
    }
}

/// The bytes of the files in `dir`.
async fn dir_size(dir: &Path) -> Result<u64, Error> {
    let mut total = 0;
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| host(format!("reading checkpoint {}", dir.display()), e))?;
    while let Ok(Some(e)) = entries.next_entry().await {
        if let Ok(m) = e.metadata().await {
            total += m.len();
        }
    }
    Ok(total)
}

/// Removes the copy of a checkpoint the daemon's shim left in the host's
/// temporary directory for the restore marked `mark`.
fn remove_shim_copy(mark: &str) {
    let mut tmps = vec![std::env::temp_dir(), PathBuf::from("/tmp")];
    tmps.dedup();
    for tmp in tmps {
        let Ok(entries) = std::fs::read_dir(&tmp) else {
            continue;
        };
        for e in entries.flatten() {
            let is_copy = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(SHIM_COPY_PREFIX));
            if is_copy
                && std::fs::read_to_string(e.path().join(RESTORE_MARK)).is_ok_and(|m| m == mark)
            {
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    tracing::warn!(dir = %e.path().display(), error = %err, "cannot remove the copy of a checkpoint the daemon left");
                }
            }
        }
    }
}

/// Hard-links (or, across file systems, copies) the files of `from` into a
/// fresh `to`, with `mark` in [`RESTORE_MARK`].
fn link_tree(from: &Path, to: &Path, mark: &str) -> Result<(), Error> {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).map_err(|e| host(format!("making {}", to.display()), e))?;
    corral_core::snapshot::link_checkpoint(from, to).map_err(|e| {
        host(
            format!("linking {} into {}", from.display(), to.display()),
            e,
        )
    })?;
    std::fs::write(to.join(RESTORE_MARK), mark)
        .map_err(|e| host(format!("marking {}", to.display()), e))
}

/// `POST /containers/ID/start?checkpoint=NAME` on the daemon's socket.
async fn start_from(socket: &Path, id: &str) -> Result<(), String> {
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
    let req = format!(
        "POST /containers/{id}/start?checkpoint={NAME} HTTP/1.1\r\nHost: docker\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    if (200..300).contains(&status) {
        return Ok(());
    }
    // The daemon's error is JSON `{"message": ...}` in the body.
    let message = text
        .find('{')
        .and_then(|at| {
            let body = &text[at..];
            let end = body.rfind('}')?;
            serde_json::from_str::<serde_json::Value>(&body[..=end]).ok()
        })
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or_else(|| text.lines().next().unwrap_or("no answer").to_string());
    Err(format!("{status}: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_directory_splits_into_parent_and_name() {
        let (p, n) = split(Path::new("/state/live/operator/a")).expect("test setup");
        assert_eq!(
            (p.as_path(), n.as_str()),
            (Path::new("/state/live/operator"), "a")
        );
        assert!(split(Path::new("/")).is_err());
    }

    #[test]
    fn linking_a_checkpoint_copies_every_file_into_a_fresh_directory() {
        let t = std::env::temp_dir().join(format!("corral-link-{}", std::process::id()));
        let (from, to) = (t.join("from"), t.join("to"));
        std::fs::create_dir_all(&from).expect("test setup");
        std::fs::create_dir_all(&to).expect("test setup");
        std::fs::write(to.join("stale"), b"x").expect("test setup");
        std::fs::write(from.join("checkpoint.img"), b"image").expect("test setup");
        link_tree(&from, &to, "m-1").expect("test setup");
        assert_eq!(
            std::fs::read(to.join("checkpoint.img")).expect("test setup"),
            b"image"
        );
        assert_eq!(
            std::fs::read(to.join(RESTORE_MARK)).expect("test setup"),
            b"m-1"
        );
        assert!(!to.join("stale").exists());
        std::fs::remove_dir_all(&t).expect("test setup");
    }
}
