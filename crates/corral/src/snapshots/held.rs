//! The snapshots corral keeps itself: deltas (`SnapshotKind::Delta`), the
//! changes of sandboxes that reset in place as their agents exported them,
//! and live snapshots (`SnapshotKind::Live`), engine checkpoints.
//!
//! A live snapshot is always files, durable or not: `NAME.live/`, the
//! directory the engine wrote the checkpoint into (0700, in the same
//! private tree), and `NAME.json`. A non-durable one belongs to its owner
//! like a sandbox (`gc` removes it once the owner is gone). Nothing of the
//! tree is mounted into any sandbox.
//!
//! A non-durable one lives in this process's memory: it goes with its
//! owner (the process) by construction, so nothing is left for `gc`, on
//! any engine. A durable one is two files in the snapshot directory
//! (`Config::snapshot_dir`; a volume when `corral serve` runs in a
//! cluster): `NAME.tar`, the archive, and `NAME.json`, the labels a backend
//! would put on an image snapshot (`SnapshotRequest::labels`) with the
//! base image, time and size. The directory is 0700 and the files 0600,
//! written to a temporary name and renamed, so a reader never sees half a
//! snapshot. The operator's live in `operator/`, a principal's in
//! `ns/NAMESPACE/` (names are checked, so they never climb out).
//!
//! A file that does not read back as a snapshot of its own name is
//! skipped with a warning, never trusted; the archive itself is checked
//! entry by entry by the agent of every fork that takes it in.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use corral_core::principal::QualifiedName;
use corral_core::snapshot::{SnapshotInfo, SnapshotKind};
use corral_core::Error;
use serde::{Deserialize, Serialize};

use crate::delta::Delta;

/// One kept delta.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub info: SnapshotInfo,
    pub delta: Delta,
}

/// What `paused/ID.json` holds: a sandbox of a provider session, paused
/// to disk, as a later process needs it to serve the session again (its
/// container stopped, its checkpoint in `paused/ID.live`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PausedRecord {
    pub sandbox_id: String,
    /// The engine's id of its (stopped) container.
    pub placement: String,
    /// The provider session key it serves.
    pub session: String,
    pub spec: corral_core::SandboxSpec,
    /// What the front end that made it noted ([`crate::Sandbox::set_note`]).
    #[serde(default)]
    pub notes: std::collections::BTreeMap<String, String>,
    /// When it was paused (Unix seconds).
    pub paused_at: i64,
}

/// What `NAME.json` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    labels: HashMap<String, String>,
    image: String,
    created: i64,
    size: i64,
    /// `delta` (absent from records written before live snapshots) or
    /// `live`.
    #[serde(default = "delta_kind")]
    kind: SnapshotKind,
}

fn delta_kind() -> SnapshotKind {
    SnapshotKind::Delta
}

/// The deltas this process keeps.
#[derive(Debug)]
pub(crate) struct HeldSnapshots {
    memory: Mutex<HashMap<QualifiedName, Held>>,
    dir: PathBuf,
}

fn host_err(what: String, e: impl std::fmt::Display) -> Error {
    Error::Host {
        what,
        reason: e.to_string(),
    }
}

impl HeldSnapshots {
    /// A store whose durable snapshots live in `dir`.
    pub fn new(dir: PathBuf) -> HeldSnapshots {
        HeldSnapshots {
            memory: Mutex::new(HashMap::new()),
            dir,
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<QualifiedName, Held>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory of `namespace`'s durable snapshots.
    fn ns_dir(&self, namespace: Option<&str>) -> PathBuf {
        match namespace {
            None => self.dir.join("operator"),
            Some(ns) => self.dir.join("ns").join(ns),
        }
    }

    /// Where live snapshot `q`'s checkpoint goes: a directory that does not
    /// exist yet (an earlier one of the name is removed), below a private
    /// one that does.
    pub async fn live_dir(&self, q: &QualifiedName) -> Result<PathBuf, Error> {
        self.fresh(self.ns_dir(q.namespace.as_deref()), self.live_path(q))
            .await
    }

    /// Where the checkpoint of sandbox `id`, paused to disk, goes: like
    /// [`HeldSnapshots::live_dir`], under `paused/`.
    pub async fn paused_dir(&self, id: &str) -> Result<PathBuf, Error> {
        let dir = self.dir.join("paused");
        let path = dir.join(format!("{id}.live"));
        self.fresh(dir, path).await
    }

    /// `path` below the private directory `dir` (made), with nothing left
    /// of an earlier one.
    async fn fresh(&self, dir: PathBuf, path: PathBuf) -> Result<PathBuf, Error> {
        let root = self.dir.clone();
        let (d, l) = (dir.clone(), path.clone());
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            private_dirs(&root, &d)?;
            remove_live(&l)
        })
        .await
        .map_err(|e| host_err(format!("making {}", dir.display()), e))??;
        Ok(path)
    }

    /// Removes the checkpoints (and records) of paused sandboxes other
    /// than `kept` (those whose containers still exist).
    pub async fn remove_paused_except(&self, kept: &[&str]) {
        let dir = self.dir.join("paused");
        let kept: Vec<String> = kept.iter().map(|k| k.to_string()).collect();
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name
                    .strip_suffix(".live")
                    .or_else(|| name.strip_suffix(".json"));
                let Some(id) = id.filter(|id| !kept.iter().any(|k| k == id)) else {
                    continue;
                };
                let gone = if name.ends_with(".live") {
                    remove_live(&e.path())
                } else {
                    remove_file(&e.path())
                };
                if let Err(err) = gone {
                    tracing::warn!(sandbox = id, file = %e.path().display(), error = %err, "cannot remove what a paused sandbox that is gone left");
                }
            }
        })
        .await;
    }

    /// Records sandbox `record.sandbox_id`, paused to disk into
    /// [`HeldSnapshots::paused_dir`], as `paused/ID.json` (0600), so a
    /// later process can resume it ([`HeldSnapshots::paused_records`]).
    pub async fn put_paused(&self, record: &PausedRecord) -> Result<(), Error> {
        let path = self.paused_record_path(&record.sandbox_id);
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| host_err(format!("recording paused sandbox {}", record.sandbox_id), e))?;
        tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
            .await
            .map_err(|e| host_err("recording a paused sandbox".into(), e))?
    }

    /// Forgets paused sandbox `id`: its record and its checkpoint.
    pub async fn remove_paused(&self, id: &str) -> Result<(), Error> {
        let json = self.paused_record_path(id);
        let live = self.dir.join("paused").join(format!("{id}.live"));
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            remove_file(&json)?;
            remove_live(&live)
        })
        .await
        .map_err(|e| host_err(format!("forgetting paused sandbox {id}"), e))?
    }

    /// Every recorded paused sandbox whose checkpoint is there; a record
    /// that does not parse, names another sandbox or has no checkpoint is
    /// skipped with a warning.
    pub async fn paused_records(&self) -> Vec<(PausedRecord, PathBuf)> {
        let dir = self.dir.join("paused");
        tokio::task::spawn_blocking(move || {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(".json") else {
                    continue;
                };
                let record: PausedRecord = match std::fs::read(e.path())
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                {
                    Ok(r) => r,
                    Err(why) => {
                        tracing::warn!(file = %e.path().display(), error = %why, "skipping a paused sandbox's record that cannot be read");
                        continue;
                    }
                };
                let live = dir.join(format!("{id}.live"));
                if record.sandbox_id != id || !live.is_dir() {
                    tracing::warn!(file = %e.path().display(), "skipping a paused sandbox's record of another sandbox or without its checkpoint");
                    continue;
                }
                out.push((record, live));
            }
            out
        })
        .await
        .unwrap_or_default()
    }

    fn paused_record_path(&self, id: &str) -> PathBuf {
        self.dir.join("paused").join(format!("{id}.json"))
    }

    /// Live snapshot `q`'s checkpoint directory.
    pub fn live_path(&self, q: &QualifiedName) -> PathBuf {
        self.ns_dir(q.namespace.as_deref())
            .join(format!("{}.live", q.name))
    }

    /// Records live snapshot `info`, whose checkpoint is in
    /// [`HeldSnapshots::live_dir`] already (replacing a delta of its name).
    pub async fn put_live(
        &self,
        info: &SnapshotInfo,
        labels: HashMap<String, String>,
    ) -> Result<(), Error> {
        let q = info.qualified();
        let (tar, json) = self.paths(&q);
        let record = Record {
            labels,
            image: info.image.clone(),
            created: info.created,
            size: info.size,
            kind: SnapshotKind::Live,
        };
        let record = serde_json::to_vec_pretty(&record)
            .map_err(|e| host_err(format!("recording snapshot {q}"), e))?;
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            match std::fs::remove_file(&tar) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(host_err(format!("removing {}", tar.display()), e))
                }
                _ => {}
            }
            write_atomic(&json, &record)
        })
        .await
        .map_err(|e| host_err(format!("keeping snapshot {q}"), e))??;
        self.memory().remove(&q);
        Ok(())
    }

    fn paths(&self, q: &QualifiedName) -> (PathBuf, PathBuf) {
        let dir = self.ns_dir(q.namespace.as_deref());
        (
            dir.join(format!("{}.tar", q.name)),
            dir.join(format!("{}.json", q.name)),
        )
    }

    /// Keeps `held` (replacing one of its name): in memory, or as files
    /// when durable.
    pub async fn put(&self, held: Held, labels: HashMap<String, String>) -> Result<(), Error> {
        let q = held.info.qualified();
        if !held.info.durable {
            self.memory().insert(q.clone(), held);
            // A durable one of the same name is replaced.
            return self.remove_files(&q).await.map(drop);
        }
        let (tar, json) = self.paths(&q);
        let dir = self.ns_dir(q.namespace.as_deref());
        let record = Record {
            labels,
            image: held.info.image.clone(),
            created: held.info.created,
            size: held.info.size,
            kind: SnapshotKind::Delta,
        };
        let record = serde_json::to_vec_pretty(&record)
            .map_err(|e| host_err(format!("recording snapshot {q}"), e))?;
        let bytes = held.delta.clone();
        let root = self.dir.clone();
        let live = self.live_path(&q);
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            private_dirs(&root, &dir)?;
            write_atomic(&tar, bytes.as_bytes())?;
            write_atomic(&json, &record)?;
            remove_live(&live)
        })
        .await
        .map_err(|e| host_err(format!("keeping snapshot {q}"), e))??;
        self.memory().remove(&q);
        Ok(())
    }

    /// Every kept snapshot's description; a non-durable live one's owner is
    /// judged as a sandbox's (`this_host`: the host this process runs on).
    pub async fn list(&self, this_host: &str) -> Vec<SnapshotInfo> {
        let mut out: Vec<SnapshotInfo> = self.memory().values().map(|h| h.info.clone()).collect();
        let dir = self.dir.clone();
        let files = tokio::task::spawn_blocking(move || read_records(&dir))
            .await
            .unwrap_or_default();
        for (mut info, labels) in files {
            if info.kind == SnapshotKind::Live && !info.durable {
                info.ownership = info.ownership(&labels, this_host, crate::host::process_alive);
            }
            if !out.iter().any(|o| o.qualified() == info.qualified()) {
                out.push(info);
            }
        }
        out
    }

    /// Delta `q` with its description; `None` when this store has none of
    /// that name.
    pub async fn get(&self, q: &QualifiedName) -> Result<Option<Held>, Error> {
        if let Some(h) = self.memory().get(q) {
            return Ok(Some(h.clone()));
        }
        let (tar, json) = self.paths(q);
        let wanted = q.clone();
        tokio::task::spawn_blocking(move || -> Result<Option<Held>, Error> {
            let Some((info, _)) = read_record(&json, &wanted) else {
                return Ok(None);
            };
            if info.kind == SnapshotKind::Live {
                return Ok(Some(Held {
                    info,
                    delta: Delta::from_bytes(Vec::new()),
                }));
            }
            let bytes = std::fs::read(&tar)
                .map_err(|e| host_err(format!("reading snapshot {}", tar.display()), e))?;
            Ok(Some(Held {
                info,
                delta: Delta::from_bytes(bytes),
            }))
        })
        .await
        .map_err(|e| host_err(format!("reading snapshot {q}"), e))?
    }

    /// Forgets delta `q`; false when this store had none of that name.
    pub async fn remove(&self, q: &QualifiedName) -> Result<bool, Error> {
        let in_memory = self.memory().remove(q).is_some();
        let on_disk = self.remove_files(q).await?;
        Ok(in_memory || on_disk)
    }

    async fn remove_files(&self, q: &QualifiedName) -> Result<bool, Error> {
        let (tar, json) = self.paths(q);
        let live = self.live_path(q);
        let what = format!("deleting snapshot {q}");
        tokio::task::spawn_blocking(move || -> Result<bool, Error> {
            let mut found = live.exists();
            remove_live(&live)?;
            for p in [json, tar] {
                match std::fs::remove_file(&p) {
                    Ok(()) => found = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(host_err(format!("removing {}", p.display()), e)),
                }
            }
            Ok(found)
        })
        .await
        .map_err(|e| host_err(what, e))?
    }
}

/// Makes `root` and `dir` below it, 0700: below the root (corral's own)
/// a looser mode is tightened; the root, which the operator may name, is
/// never changed, only refused unless private
/// ([`crate::host::private_dir`]).
fn private_dirs(root: &Path, dir: &Path) -> Result<(), Error> {
    crate::host::private_dir(root, true)
        .map_err(|why| host_err(format!("keeping snapshots in {}", root.display()), why))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| host_err(format!("making {}", dir.display()), e))?;
    let mut at = dir.to_path_buf();
    while at != root && at.starts_with(root) {
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| host_err(format!("securing {}", at.display()), e))?;
        if !at.pop() {
            break;
        }
    }
    Ok(())
}

/// Copies the checkpoint in `from` (a sandbox paused to disk) into `to`
/// (which must not exist), by hard links where it can; the bytes.
pub(crate) async fn copy_checkpoint(from: &Path, to: &Path) -> Result<u64, Error> {
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    tokio::task::spawn_blocking(move || -> Result<u64, Error> {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&to)
            .map_err(|e| host_err(format!("making {}", to.display()), e))?;
        corral_core::snapshot::link_checkpoint(&from, &to).map_err(|e| {
            host_err(
                format!("copying {} into {}", from.display(), to.display()),
                e,
            )
        })
    })
    .await
    .map_err(|e| host_err("copying a checkpoint".into(), e))?
}

/// Removes a file, if there is one.
fn remove_file(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(host_err(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// Removes a live snapshot's checkpoint directory, if there is one.
fn remove_live(live: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(live) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(host_err(format!("removing {}", live.display()), e))
        }
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` through a temporary file (0600) and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension(format!("tmp-{}", crate::host::random_hex(8)));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        host_err(format!("writing {}", path.display()), e)
    })
}

/// Snapshot `wanted` from its record file, with its labels, when it reads
/// back as one of that very name.
fn read_record(
    json: &Path,
    wanted: &QualifiedName,
) -> Option<(SnapshotInfo, HashMap<String, String>)> {
    let text = match std::fs::read(json) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %json.display(), error = %e, "cannot read a snapshot record");
            return None;
        }
    };
    let record: Record = match serde_json::from_slice(&text) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(file = %json.display(), error = %e, "skipping a snapshot record that does not parse");
            return None;
        }
    };
    let mut info =
        SnapshotInfo::from_labels(&record.labels, record.image, record.created, record.size)?;
    let live = record.kind == SnapshotKind::Live;
    if info.qualified() != *wanted || !(info.durable || live) {
        tracing::warn!(file = %json.display(), "skipping a snapshot record of another name");
        return None;
    }
    info.kind = if live {
        SnapshotKind::Live
    } else {
        SnapshotKind::Delta
    };
    if info.durable {
        info.ownership = corral_core::labels::Ownership::Persistent;
    }
    Some((info, record.labels))
}

/// Every durable delta and every live snapshot under `dir`, with labels.
fn read_records(dir: &Path) -> Vec<(SnapshotInfo, HashMap<String, String>)> {
    let mut dirs: Vec<(PathBuf, Option<String>)> = vec![(dir.join("operator"), None)];
    if let Ok(entries) = std::fs::read_dir(dir.join("ns")) {
        for e in entries.flatten() {
            if let Some(ns) = e.file_name().to_str() {
                dirs.push((e.path(), Some(ns.to_string())));
            }
        }
    }
    let mut out = Vec::new();
    for (d, namespace) in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let text = match &namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            };
            let Ok(q) = QualifiedName::parse(&text) else {
                continue;
            };
            if let Some(found) = read_record(&path, &q) {
                out.push(found);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::labels::Owner;
    use corral_core::snapshot::SnapshotRequest;
    use corral_core::SandboxSpec;

    fn held(name: &str, ns: Option<&str>, durable: bool) -> (Held, HashMap<String, String>) {
        let spec = SandboxSpec::new("busybox");
        let owner = Owner {
            host: "h".into(),
            pid: 1,
            start: 1,
        };
        let req = SnapshotRequest {
            name,
            namespace: ns,
            sandbox_id: "sb-1",
            spec: &spec,
            owner: &owner,
            durable,
        };
        let labels = req.labels();
        let mut info =
            SnapshotInfo::from_labels(&labels, "busybox".into(), 7, 3).expect("a snapshot");
        info.kind = SnapshotKind::Delta;
        (
            Held {
                info,
                delta: Delta::from_bytes(b"tar".to_vec()),
            },
            labels,
        )
    }

    #[tokio::test]
    async fn durable_deltas_are_private_files_that_read_back_by_name() {
        let root = std::env::temp_dir().join(format!("corral-held-{}", crate::host::random_hex(8)));
        let store = HeldSnapshots::new(root.clone());
        let (h, labels) = held("ready", Some("alice"), true);
        store.put(h, labels).await.expect("put");
        let (h, labels) = held("mem", None, false);
        store.put(h, labels).await.expect("put");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("ns/alice/ready.tar")), 0o600);
        let mut names: Vec<String> = store
            .list("h")
            .await
            .iter()
            .map(|i| i.qualified().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["alice/ready", "mem"]);
        // A store of a later process finds the durable one only.
        let later = HeldSnapshots::new(root.clone());
        let q = QualifiedName::parse("alice/ready").expect("name");
        let got = later.get(&q).await.expect("read").expect("found");
        assert_eq!(got.delta.as_bytes(), b"tar");
        assert_eq!(got.info.kind, SnapshotKind::Delta);
        assert!(later
            .get(&QualifiedName::parse("mem").expect("name"))
            .await
            .expect("read")
            .is_none());
        // A record copied under another name is not trusted.
        std::fs::copy(
            root.join("ns/alice/ready.json"),
            root.join("ns/alice/other.json"),
        )
        .expect("copy");
        let other = QualifiedName::parse("alice/other").expect("name");
        assert!(later.get(&other).await.expect("read").is_none());
        assert!(later.remove(&q).await.expect("remove"));
        assert!(!later.remove(&q).await.expect("remove again"));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A snapshot directory that exists and others may use (a 1777 one,
    /// as /tmp) is refused by name and left as it is.
    #[tokio::test]
    async fn a_shared_snapshot_directory_is_refused_and_left_alone() {
        let root = std::env::temp_dir().join(format!("corral-held-{}", crate::host::random_hex(8)));
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let store = HeldSnapshots::new(root.clone());
        let (h, labels) = held("ready", Some("alice"), true);
        let e = store.put(h, labels).await.expect_err("a shared directory");
        let text = e.to_string();
        assert!(
            text.contains(&root.display().to_string()) && text.contains("mode 1777"),
            "{text}"
        );
        let mode = std::fs::metadata(&root).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o1777);
        assert!(!root.join("ns").exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_paused_sandboxs_checkpoint_goes_with_its_container() {
        let root = std::env::temp_dir().join(format!("corral-held-{}", crate::host::random_hex(8)));
        let store = HeldSnapshots::new(root.clone());
        let kept = store.paused_dir("sb-kept").await.expect("dir");
        let gone = store.paused_dir("sb-gone").await.expect("dir");
        for d in [&kept, &gone] {
            std::fs::create_dir(d).expect("make");
            std::fs::write(d.join("checkpoint.img"), b"x").expect("write");
        }
        store.remove_paused_except(&["sb-kept"]).await;
        assert!(kept.join("checkpoint.img").exists());
        assert!(!gone.exists());
        std::fs::remove_dir_all(&root).expect("clean");
    }
}
