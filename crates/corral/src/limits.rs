//! Concurrency limits on daemon-heavy operations (container starts, execs)
//! that hold across every corral process of a user on the host.
//!
//! Two layers. In front, a fair (FIFO) in-process semaphore with a bounded
//! wait, so one process's callers queue in order and never hang forever.
//! Behind it, one lock file per slot in a per-user directory, taken with a
//! non-blocking `flock` (std's `File::try_lock`): eight trainer processes
//! with their own corral share N slots in all. A slot file that cannot be
//! opened (permission denied, owned by another user) is skipped, not fatal;
//! if none can be opened the limit is enforced in-process only, with a
//! warning. Locks die with their process, so a killed corral frees its slots.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use corral_core::Error;

/// One limited operation kind, e.g. "start".
pub struct Limiter {
    name: &'static str,
    limit: usize,
    sem: Option<Arc<Semaphore>>,
    dir: Option<PathBuf>,
    wait_timeout: Duration,
    next: AtomicUsize,
    warned: AtomicBool,
}

/// A held slot; released on drop.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    _lock: Option<File>,
    /// How long acquiring it took.
    pub waited: Duration,
}

/// The per-user directory for slot files: `$XDG_RUNTIME_DIR/corral/slots`,
/// else `<tmp>/corral-<uid>/slots`.
pub fn default_slot_dir() -> PathBuf {
    crate::host::user_runtime_dir().join("slots")
}

/// Makes `dir` (and its missing parents) 0700. A directory that exists is
/// left as it is: `daemon.slot_dir` may name one in a shared place, and
/// its parent (a 1777 `/tmp`) is never corral's to change.
fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

impl Limiter {
    /// A limiter allowing `limit` holders at once (0: unlimited). With
    /// `dir`, the limit is shared with every process using the same directory.
    pub fn new(
        name: &'static str,
        limit: usize,
        dir: Option<PathBuf>,
        wait_timeout: Duration,
    ) -> Self {
        let dir = dir.filter(|_| limit > 0).and_then(|d| match prepare_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                tracing::warn!(dir = %d.display(), error = %e, "cannot use the slot directory; {name} limit is per process only");
                None
            }
        });
        Limiter {
            name,
            limit,
            sem: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            dir,
            wait_timeout,
            next: AtomicUsize::new(std::process::id() as usize),
            warned: AtomicBool::new(false),
        }
    }

    /// The configured limit (0: unlimited).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits for a slot, at most the configured wait timeout.
    pub async fn acquire(&self) -> Result<Slot, Error> {
        let started = Instant::now();
        let Some(sem) = &self.sem else {
            return Ok(Slot {
                _permit: None,
                _lock: None,
                waited: Duration::ZERO,
            });
        };
        let timeout_err = || Error::SlotTimeout {
            what: self.name,
            limit: self.limit,
            waited: started.elapsed(),
        };
        let permit = tokio::time::timeout(self.wait_timeout, sem.clone().acquire_owned())
            .await
            .map_err(|_| timeout_err())?
            .map_err(|_| timeout_err())?;
        let lock = match &self.dir {
            None => None,
            Some(dir) => {
                let deadline = started + self.wait_timeout;
                let mut pause = Duration::from_millis(2);
                loop {
                    match self.try_lock_one(dir) {
                        Ok(Some(file)) => break Some(file),
                        Ok(None) => {}
                        Err(()) => break None,
                    }
                    if Instant::now() >= deadline {
                        return Err(timeout_err());
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        };
        Ok(Slot {
            _permit: Some(permit),
            _lock: lock,
            waited: started.elapsed(),
        })
    }

    /// Tries every slot file once, starting at a rotating offset. `Ok(None)`:
    /// all busy; `Err(())`: none could be opened at all.
    fn try_lock_one(&self, dir: &Path) -> Result<Option<File>, ()> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut opened = 0;
        for k in 0..self.limit {
            let i = (start + k) % self.limit;
            let path = dir.join(format!("{}-{i}.lock", self.name));
            let file = match OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "skipping a slot file that cannot be opened");
                    continue;
                }
            };
            opened += 1;
            match file.try_lock() {
                Ok(()) => return Ok(Some(file)),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    tracing::debug!(path = %path.display(), error = %e, "skipping a slot file that cannot be locked");
                    opened -= 1;
                }
            }
        }
        if opened == 0 {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(dir = %dir.display(), what = self.name, "no slot file could be opened; the limit holds per process only");
            }
            return Err(());
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_are_shared_through_the_directory() {
        let dir =
            std::env::temp_dir().join(format!("corral-slots-test-{}", crate::host::random_hex(8)));
        let a = Limiter::new("start", 2, Some(dir.clone()), Duration::from_millis(200));
        let b = Limiter::new("start", 2, Some(dir.clone()), Duration::from_millis(200));
        let s1 = a.acquire().await.expect("slot 1");
        let s2 = b.acquire().await.expect("slot 2");
        // Both slot files are locked (by two "processes"): a third waits, then times out.
        let err = a.acquire().await.err().expect("timed out");
        assert!(err.to_string().contains("start slot"), "{err}");
        drop(s1);
        let s3 = b.acquire().await.expect("freed slot");
        drop((s2, s3));
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn unopenable_slot_files_are_skipped() {
        let dir =
            std::env::temp_dir().join(format!("corral-slots-test-{}", crate::host::random_hex(8)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        // Slot 0 is a directory: it cannot be opened as a file.
        std::fs::create_dir_all(dir.join("exec-0.lock")).expect("mkdir");
        let l = Limiter::new("exec", 2, Some(dir.clone()), Duration::from_millis(100));
        let s = l.acquire().await.expect("slot 1 still works");
        drop(s);
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn unlimited_never_waits() {
        let l = Limiter::new("start", 0, None, Duration::from_millis(1));
        let slots: Vec<_> = futures_util::future::join_all((0..100).map(|_| l.acquire())).await;
        assert!(slots.iter().all(|s| s.is_ok()));
    }
}
