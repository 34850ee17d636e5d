//! Snapshots and forks: [`Sandbox::snapshot`], [`Runtime::fork`],
//! [`Runtime::snapshots`], [`Runtime::delete_snapshot`]; `gc` removes the
//! snapshots of owners that are gone.
//!
//! A snapshot keeps a sandbox's root file system (not its tmpfs mounts,
//! not its processes) and its spec. The backend keeps it (Docker: an image,
//! so it survives restarts). A snapshot of a sandbox that resets in place
//! first folds the changes its commands made into the container's root file
//! system, which ends its processes and makes the snapshot its new pristine
//! state; any other sandbox is paused while the backend copies it and goes
//! on as it was.

use corral_core::labels::Ownership;
use corral_core::principal::QualifiedName;
use corral_core::snapshot::{self, SnapshotInfo, SnapshotRequest};
use corral_core::{Error, SpecError};

use crate::host;
use crate::runtime::Runtime;
use crate::sandbox::Sandbox;

/// How a snapshot is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Keep it until it is deleted, whatever becomes of the process that
    /// took it; otherwise `gc` and the orphan reaper remove it once its
    /// owner is gone, as they do its sandboxes.
    pub durable: bool,
    /// The namespace of the principal it belongs to
    /// ([`corral_core::principal::Principal::snapshot_namespace`]); `None`
    /// for the operator's.
    pub namespace: Option<String>,
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
        if self.resets_in_place().is_ok() {
            // The changes live in the agent's overlay, not in the container:
            // fold them in first (this ends the sandbox's processes).
            self.drop_shells();
            // From here on the container is no longer its spec's: a pool
            // destroys it rather than hand it to another session.
            self.mark_base_folded();
            self.agent_reset(true)
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
        let mut info = runtime.backend().snapshot(&self.placement(), &req).await?;
        info.ownership = if opts.durable {
            Ownership::Persistent
        } else {
            Ownership::LiveOwner
        };
        Ok(info)
    }
}

impl Runtime {
    /// Every snapshot the backend keeps, with whether its owner is alive.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, Error> {
        let host_name = &self.owner().host;
        Ok(self
            .backend()
            .snapshots()
            .await?
            .into_iter()
            .map(|(mut info, labels)| {
                info.ownership = info.ownership(&labels, host_name, host::process_alive);
                info
            })
            .collect())
    }

    /// Snapshot `name` (`namespace/name` for one of a principal's, see
    /// [`QualifiedName`]), or an error naming it.
    pub async fn snapshot_info(&self, name: &str) -> Result<SnapshotInfo, Error> {
        let wanted = QualifiedName::parse(name)?;
        self.snapshots()
            .await?
            .into_iter()
            .find(|s| s.qualified() == wanted)
            .ok_or_else(|| {
                Error::InvalidSpec(SpecError {
                    field: "snapshot".into(),
                    value: name.into(),
                    reason: "no such snapshot".into(),
                })
            })
    }

    /// Deletes snapshot `name` (`namespace/name` for one of a
    /// principal's).
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), Error> {
        QualifiedName::parse(name)?;
        self.backend().delete_snapshot(name).await
    }

    /// Starts `n` sandboxes from snapshot `name`, all at once (within the
    /// start limit): each has the snapshot's file system and its source's
    /// spec (start-up commands are not run again). All or nothing: if one
    /// fails, the others are destroyed and the first error returned.
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
        let spec = info.fork_spec_with(env);
        let starts = (0..n).map(|_| self.create(&spec));
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
