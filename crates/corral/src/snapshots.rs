//! Snapshots and forks: [`Sandbox::snapshot`], [`Runtime::fork`],
//! [`Runtime::snapshots`], [`Runtime::delete_snapshot`]; `gc` removes the
//! snapshots of owners that are gone.
//!
//! A snapshot keeps a sandbox's root file system (not its tmpfs mounts,
//! not its processes) and its spec, in one of two kinds
//! ([`SnapshotKind`]):
//!
//! - `delta`: of a sandbox that resets in place, whose changes to its image
//!   live apart in its agent. The snapshot first keeps the changes its
//!   commands made (a `keep` reset, which ends its processes and makes the
//!   snapshot its new pristine state), then its agent streams the whole
//!   delta (`crate::delta`) and corral keeps it (`held`: in memory, or a
//!   file when durable). A fork is a sandbox of the source's image whose
//!   agent takes the delta in before its first command. No image is made
//!   and no registry is needed, on any engine.
//! - `image`: the backend keeps an image of the container (Docker: `docker
//!   commit`, so it survives restarts and every corral on the host sees
//!   it). A sandbox that resets in place first has its delta applied to
//!   its container's root file system; any other is paused while the
//!   backend copies it and goes on as it was.
//!
//! Unless asked for one kind, a sandbox that keeps a delta is snapshotted
//! as one (on Docker too: it is the faster of the two, see `corral
//! bench`), except a durable snapshot on an engine that keeps images,
//! which becomes an image; any other sandbox needs an engine that keeps
//! images.

pub(crate) mod held;

use std::time::{SystemTime, UNIX_EPOCH};

use corral_core::labels::Ownership;
use corral_core::principal::QualifiedName;
use corral_core::snapshot::{self, SnapshotInfo, SnapshotKind, SnapshotRequest};
use corral_core::{Error, SpecError};

pub(crate) use held::HeldSnapshots;

use crate::delta::Delta;
use crate::host;
use crate::runtime::Runtime;
use crate::sandbox::Sandbox;

/// How a snapshot is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Keep it until it is deleted, whatever becomes of the process that
    /// took it; otherwise it goes with its owner (a delta with the
    /// process's memory; `gc` and the orphan reaper remove an image once
    /// its owner is gone, as they do its sandboxes).
    pub durable: bool,
    /// The namespace of the principal it belongs to
    /// ([`corral_core::principal::Principal::snapshot_namespace`]); `None`
    /// for the operator's.
    pub namespace: Option<String>,
    /// The kind to take; `None`: the runtime's choice (see the module).
    pub kind: Option<SnapshotKind>,
}

fn no_such(name: &str) -> Error {
    Error::InvalidSpec(SpecError {
        field: "snapshot".into(),
        value: name.into(),
        reason: "no such snapshot".into(),
    })
}

pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Sandbox {
    /// Keeps this sandbox's file system as snapshot `name` (replacing an
    /// earlier one of that name).
    pub async fn snapshot(&self, name: &str, opts: SnapshotOptions) -> Result<SnapshotInfo, Error> {
        let taken = self.snapshot_inner(name, opts).await;
        match &taken {
            Ok(info) => self.emit(
                crate::events::EventKind::Snapshot,
                Some("ok"),
                format!("snapshot {} ({} bytes)", info.name, info.size),
            ),
            Err(e) => self.emit(
                crate::events::EventKind::Snapshot,
                Some(e.kind().as_str()),
                format!("snapshot {name}: {e}"),
            ),
        }
        taken
    }

    async fn snapshot_inner(
        &self,
        name: &str,
        opts: SnapshotOptions,
    ) -> Result<SnapshotInfo, Error> {
        snapshot::validate_name(name)?;
        if let Some(ns) = &opts.namespace {
            QualifiedName::parse(&format!("{ns}/{name}"))?;
        }
        if self.spec().persistent.is_some() {
            return Err(Error::InvalidSpec(SpecError {
                field: "persistent".into(),
                value: self.spec().persistent.clone().unwrap_or_default(),
                reason: "a persistent session keeps its state in place; snapshots are taken of \
                         other sandboxes"
                    .into(),
            }));
        }
        let kind = self.snapshot_kind(&opts)?;
        // A live snapshot takes the processes as they are: no reset first.
        let in_place = kind != SnapshotKind::Live && self.resets_in_place().is_ok();
        if in_place {
            // The changes live in the agent's overlay, not in the container:
            // keep them first (this ends the sandbox's processes), and for
            // an image put the whole delta into the container.
            self.drop_shells();
            // From here on the container is no longer its spec's: a pool
            // destroys it rather than hand it to another session.
            self.mark_base_folded();
            self.agent_reset_with(true, kind == SnapshotKind::Image)
                .await
                .map_err(|message| Error::Agent {
                    sandbox: self.id().to_string(),
                    message: format!("keeping the changes for a snapshot failed: {message}"),
                })?;
        }
        let runtime = self.runtime();
        let req = SnapshotRequest {
            name,
            namespace: opts.namespace.as_deref(),
            sandbox_id: self.id(),
            spec: self.spec(),
            owner: runtime.owner(),
            durable: opts.durable,
        };
        let ownership = if opts.durable {
            Ownership::Persistent
        } else {
            Ownership::LiveOwner
        };
        let q = QualifiedName {
            namespace: opts.namespace.clone(),
            name: name.to_string(),
        };
        match kind {
            SnapshotKind::Live => {
                let labels = req.labels();
                let held = &runtime.inner.held;
                let dir = held.live_dir(&q).await?;
                // A sandbox paused to disk is its checkpoint already.
                let taken = match self.paused_checkpoint() {
                    Some(paused) => held::copy_checkpoint(&paused, &dir).await,
                    None => self.checkpoint_into(&dir).await,
                };
                let size = match taken {
                    Ok(size) => size,
                    Err(e) => {
                        let _ = tokio::fs::remove_dir_all(&dir).await;
                        return Err(e);
                    }
                };
                let info = self.held_info(&labels, size, SnapshotKind::Live, ownership)?;
                held.put_live(&info, labels).await?;
                runtime.drop_image_snapshot(&q).await;
                Ok(info)
            }
            SnapshotKind::Image => {
                let mut info = runtime.backend().snapshot(&self.placement(), &req).await?;
                info.ownership = ownership;
                // It replaces a delta of the same name.
                runtime.inner.held.remove(&q).await?;
                Ok(info)
            }
            SnapshotKind::Delta => {
                let max = runtime.config().snapshot_max_bytes;
                let delta = self.export_delta(max).await?;
                let labels = req.labels();
                let info =
                    self.held_info(&labels, delta.len() as u64, SnapshotKind::Delta, ownership)?;
                runtime
                    .inner
                    .held
                    .put(
                        held::Held {
                            info: info.clone(),
                            delta,
                        },
                        labels,
                    )
                    .await?;
                runtime.drop_image_snapshot(&q).await;
                Ok(info)
            }
        }
    }

    /// The description of a snapshot corral keeps itself (a delta or a
    /// live one) of `size` bytes, from its own labels.
    fn held_info(
        &self,
        labels: &std::collections::HashMap<String, String>,
        size: u64,
        kind: SnapshotKind,
        ownership: Ownership,
    ) -> Result<SnapshotInfo, Error> {
        let mut info =
            SnapshotInfo::from_labels(labels, self.spec().image.clone(), now(), size as i64)
                .ok_or_else(|| Error::Agent {
                    sandbox: self.id().to_string(),
                    message: "the snapshot's own labels do not read back".into(),
                })?;
        info.kind = kind;
        info.ownership = ownership;
        Ok(info)
    }

    /// The kind a snapshot with `opts` is taken as, or why none can be.
    fn snapshot_kind(&self, opts: &SnapshotOptions) -> Result<SnapshotKind, Error> {
        let backend = self.runtime().backend();
        // Its root file system's changes are in the runtime's memory: only
        // a live snapshot keeps them.
        let live_root = backend.checkpoints(self.spec());
        let images = backend.keeps_snapshot_images() && !live_root;
        let deltas = self.conn_hello().deltas && self.resets_in_place().is_ok();
        let why_no_delta = || {
            self.resets_in_place()
                .err()
                .unwrap_or_else(|| "its agent keeps no delta".into())
        };
        match opts.kind {
            Some(SnapshotKind::Delta) if !deltas => Err(Error::Unsupported {
                what: format!(
                    "a delta snapshot of sandbox {}: it does not reset in place ({})",
                    self.id(),
                    why_no_delta()
                ),
            }),
            Some(SnapshotKind::Image) if live_root => Err(Error::Unsupported {
                what: format!(
                    "an image snapshot of sandbox {}: gVisor without network keeps its file \
                     system's changes in memory, not in the container; a live snapshot (the \
                     default here) keeps them",
                    self.id()
                ),
            }),
            Some(SnapshotKind::Image) if !images => Err(Error::Unsupported {
                what: format!("image snapshots with the {} backend", backend.name()),
            }),
            Some(kind) => Ok(kind),
            None if live_root => Ok(SnapshotKind::Live),
            None if deltas && !(opts.durable && images) => Ok(SnapshotKind::Delta),
            None if images => Ok(SnapshotKind::Image),
            None => Err(Error::InvalidSpec(SpecError {
                field: "pristine".into(),
                value: self.spec().pristine.to_string(),
                reason: format!(
                    "the {} backend snapshots sandboxes that reset in place, and sandbox {} \
                     does not ({})",
                    backend.name(),
                    self.id(),
                    why_no_delta()
                ),
            })),
        }
    }
}

impl Runtime {
    /// Every snapshot: the deltas this runtime keeps, then the images the
    /// backend keeps (one of a name a delta has is left out), with
    /// whether its owner is alive.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, Error> {
        let host_name = &self.owner().host;
        let mut all = self.inner.held.list(host_name).await;
        for (mut info, labels) in self.backend().snapshots().await? {
            if all.iter().any(|h| h.qualified() == info.qualified()) {
                continue;
            }
            info.ownership = info.ownership(&labels, host_name, host::process_alive);
            all.push(info);
        }
        Ok(all)
    }

    /// The delta a fork of `info` takes in (`None` for an image snapshot).
    pub async fn fork_base(&self, info: &SnapshotInfo) -> Result<Option<Delta>, Error> {
        if info.kind != SnapshotKind::Delta {
            return Ok(None);
        }
        let q = info.qualified();
        match self.inner.held.get(&q).await? {
            Some(held) => Ok(Some(held.delta)),
            None => Err(no_such(&q.to_string())),
        }
    }

    /// The checkpoint a fork of `info` is restored from (`None` unless a
    /// live snapshot's).
    pub fn fork_restore(&self, info: &SnapshotInfo) -> Option<std::path::PathBuf> {
        (info.kind == SnapshotKind::Live).then(|| self.inner.held.live_path(&info.qualified()))
    }

    /// Removes the image snapshot named `q` after a delta took its name;
    /// one still in use stays (and a listing shows the delta).
    async fn drop_image_snapshot(&self, q: &QualifiedName) {
        let Ok(images) = self.backend().snapshots().await else {
            return;
        };
        if images.iter().any(|(i, _)| i.qualified() == *q) {
            if let Err(e) = self.backend().delete_snapshot(&q.to_string()).await {
                tracing::info!(snapshot = %q, error = %e, "an image snapshot a delta replaced stays (in use)");
            }
        }
    }

    /// Snapshot `name` (`namespace/name` for one of a principal's, see
    /// [`QualifiedName`]), or an error naming it.
    pub async fn snapshot_info(&self, name: &str) -> Result<SnapshotInfo, Error> {
        let wanted = QualifiedName::parse(name)?;
        self.snapshots()
            .await?
            .into_iter()
            .find(|s| s.qualified() == wanted)
            .ok_or_else(|| no_such(name))
    }

    /// Deletes snapshot `name` (`namespace/name` for one of a
    /// principal's). An image snapshot is refused while sandboxes started
    /// from it exist, or while a delta snapshot starts from it.
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), Error> {
        let q = QualifiedName::parse(name)?;
        if self.inner.held.remove(&q).await? {
            return Ok(());
        }
        let images = self.backend().snapshots().await?;
        if let Some((image, _)) = images.iter().find(|(i, _)| i.qualified() == q) {
            let deltas = self.inner.held.list(&self.owner().host).await;
            if let Some(d) = deltas.iter().find(|d| d.image == image.image) {
                return Err(Error::InvalidSpec(SpecError {
                    field: "snapshot".into(),
                    value: name.into(),
                    reason: format!(
                        "snapshot '{}' keeps changes over its image: delete it first",
                        d.qualified()
                    ),
                }));
            }
        }
        self.backend().delete_snapshot(name).await
    }

    /// Starts `n` sandboxes from snapshot `name`, all at once (within the
    /// start limit): each has the snapshot's file system and its source's
    /// spec (start-up commands are not run again; a delta's fork takes the
    /// delta in first). All or nothing: if one fails, the others are
    /// destroyed and the first error returned.
    pub async fn fork(&self, name: &str, n: usize) -> Result<Vec<Sandbox>, Error> {
        self.fork_with(name, n, &[]).await
    }

    /// [`Runtime::fork`] with the forker's variables: the snapshot keeps
    /// only the names of those its source set, and `env` gives their
    /// values ([`SnapshotInfo::fork_spec_with`]).
    pub async fn fork_with(
        &self,
        name: &str,
        n: usize,
        env: &[corral_core::EnvVar],
    ) -> Result<Vec<Sandbox>, Error> {
        let info = self.snapshot_info(name).await?;
        let base = self.fork_base(&info).await?;
        let spec = info.fork_spec_with(env);
        let live = self.fork_restore(&info);
        let starts =
            (0..n).map(|_| self.create_from(&spec, base.clone(), None, None, live.as_deref()));
        let results = futures_util::future::join_all(starts).await;
        let mut made = Vec::with_capacity(n);
        let mut failed = None;
        for r in results {
            match r {
                Ok(sb) => made.push(sb),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            let destroys = made.iter().map(Sandbox::destroy);
            for r in futures_util::future::join_all(destroys).await {
                if let Err(d) = r {
                    tracing::warn!(error = %d, "destroying a fork after a failed fork failed");
                }
            }
            return Err(e);
        }
        Ok(made)
    }

    /// Deletes the live snapshots this runtime took that are not durable
    /// (files, unlike its deltas, which go with its memory).
    pub(crate) async fn drop_own_live_snapshots(&self) {
        for info in self.inner.held.list(&self.owner().host).await {
            let own = info.owner.as_ref() == Some(self.owner());
            if info.kind == SnapshotKind::Live && !info.durable && own {
                let q = info.qualified();
                if let Err(e) = self.inner.held.remove(&q).await {
                    tracing::warn!(snapshot = %q, error = %e, "removing a live snapshot at shutdown failed");
                }
            }
        }
    }

    /// Removes the snapshots `gc` should: those whose owner is gone (with
    /// `all`, every snapshot that is not durable). Returns their names.
    pub(crate) async fn gc_snapshots(&self, all: bool) -> Result<Vec<String>, Error> {
        let mut removed = Vec::new();
        for info in self.snapshots().await? {
            let remove = match info.ownership {
                Ownership::Orphan => true,
                Ownership::LiveOwner | Ownership::ForeignHost => all,
                Ownership::Persistent => false,
            };
            if !remove {
                continue;
            }
            let name = info.qualified().to_string();
            match self.delete_snapshot(&name).await {
                Ok(()) => removed.push(name),
                // In use by sandboxes (its forks): removed by a later gc.
                Err(e) => tracing::info!(snapshot = %info.name, error = %e, "gc kept a snapshot"),
            }
        }
        Ok(removed)
    }
}
