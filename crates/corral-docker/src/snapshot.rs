//! Snapshots as images: `docker commit` of a sandbox's container, tagged
//! `corral-snapshot:<name>` and labelled (`corral_core::snapshot`). They
//! survive corral restarts and daemon restarts; a fork is a sandbox started
//! from the image, sharing its layers (nothing is copied).
//!
//! The committed image holds no value of the sandbox's environment: the
//! container's configuration never had them (the agent gets them at the
//! handshake), and that configuration is all a commit copies (this daemon
//! records it whole as the image's `ContainerConfig`, which a commit's own
//! config cannot override). So the image's `Config.Env` is the base
//! image's, with nothing to override. A fork gets its environment from the
//! recorded spec and whoever forks (`corral_core::snapshot`).

use std::collections::HashMap;

use bollard::models::ContainerConfig;
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
};
use corral_core::backend::{LabelledSnapshot, Placement};
use corral_core::principal::QualifiedName;
use corral_core::snapshot::{self, SnapshotInfo, SnapshotRequest};
use corral_core::{Error, SpecError};

use crate::error::{api, is_not_found, status_code};
use crate::DockerBackend;

/// The repository every snapshot image is tagged in.
pub const REPOSITORY: &str = corral_core::image_ref::SNAPSHOT_REPOSITORY;

/// The image reference of snapshot `name` in the operator's namespace.
pub fn image_ref(name: &str) -> String {
    format!("{REPOSITORY}:{name}")
}

/// The repository of a namespace's snapshots: the operator's is
/// [`REPOSITORY`], a principal's `corral-snapshot/<namespace>`, so names
/// never meet across namespaces.
fn repository(namespace: Option<&str>) -> String {
    match namespace {
        None => REPOSITORY.to_string(),
        Some(ns) => format!("{REPOSITORY}/{ns}"),
    }
}

/// The image reference of snapshot `q`.
pub fn qualified_ref(q: &QualifiedName) -> String {
    format!("{}:{}", repository(q.namespace.as_deref()), q.name)
}

fn no_such(name: &str) -> Error {
    Error::InvalidSpec(SpecError {
        field: "snapshot".into(),
        value: name.into(),
        reason: "no such snapshot".into(),
    })
}

impl DockerBackend {
    pub(crate) async fn take_snapshot(
        &self,
        placement: &Placement,
        req: &SnapshotRequest<'_>,
    ) -> Result<SnapshotInfo, Error> {
        snapshot::validate_name(req.name)?;
        let wanted = QualifiedName {
            namespace: req.namespace.map(str::to_string),
            name: req.name.to_string(),
        };
        let docker = self.docker();
        let container = placement.id();
        let what = format!("snapshot sandbox {} as '{}'", req.sandbox_id, req.name);
        let config = ContainerConfig {
            labels: Some(req.labels()),
            ..Default::default()
        };
        let options = CommitContainerOptionsBuilder::default()
            .container(container)
            .repo(&repository(req.namespace))
            .tag(req.name)
            .comment(&format!("corral snapshot of sandbox {}", req.sandbox_id))
            .pause(true)
            .build();
        docker
            .commit_container(options, config)
            .await
            .map_err(|e| api(what.clone(), e))?;
        self.list_snapshots()
            .await?
            .into_iter()
            .map(|(info, _)| info)
            .find(|info| info.qualified() == wanted)
            .ok_or_else(|| Error::Agent {
                sandbox: req.sandbox_id.to_string(),
                message: format!(
                    "the committed image {} is not listed as a snapshot",
                    qualified_ref(&wanted)
                ),
            })
    }

    pub(crate) async fn list_snapshots(&self) -> Result<Vec<LabelledSnapshot>, Error> {
        let filters = HashMap::from([("label".to_string(), vec![snapshot::NAME.to_string()])]);
        let images = self
            .docker()
            .list_images(Some(
                ListImagesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| api("list snapshots", e))?;
        let mut out = Vec::new();
        for image in images {
            let Some(name) = image.labels.get(snapshot::NAME) else {
                continue;
            };
            let namespace = image
                .labels
                .get(snapshot::NAMESPACE)
                .filter(|n| !n.is_empty());
            let Ok(q) = QualifiedName::parse(&match namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.clone(),
            }) else {
                continue;
            };
            let reference = qualified_ref(&q);
            // Only the image the name's tag points at now (a replaced
            // snapshot's old image may linger untagged while in use).
            if !image.repo_tags.contains(&reference) {
                continue;
            }
            let labels = image.labels.clone();
            if let Some(info) =
                SnapshotInfo::from_labels(&labels, reference, image.created, image.size)
            {
                out.push((info, labels));
            }
        }
        out.sort_by_key(|a| a.0.qualified());
        Ok(out)
    }

    /// The snapshot `image` resolves to, by its labels: the daemon resolves
    /// the reference exactly as a create would (tag, digest, image id or a
    /// prefix of one), so no spelling gets past. An untagged image of a
    /// replaced snapshot still carries them.
    pub(crate) async fn snapshot_of_image(
        &self,
        image: &str,
    ) -> Result<Option<QualifiedName>, Error> {
        let inspected = match self.docker().inspect_image(image).await {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Ok(None),
            // A reference the daemon cannot read names nothing it holds.
            Err(e) if status_code(&e) == Some(400) => return Ok(None),
            Err(e) => return Err(api(format!("inspect image {image}"), e)),
        };
        let labels = inspected.config.and_then(|c| c.labels).unwrap_or_default();
        let Some(name) = labels.get(snapshot::NAME) else {
            return Ok(None);
        };
        // Not parsed: whatever the labels say, a principal reads only its
        // own namespace, and a malformed one is nobody's but the operator's.
        Ok(Some(QualifiedName {
            namespace: labels
                .get(snapshot::NAMESPACE)
                .filter(|n| !n.is_empty())
                .cloned(),
            name: name.clone(),
        }))
    }

    pub(crate) async fn remove_snapshot(&self, name: &str) -> Result<(), Error> {
        let q = QualifiedName::parse(name)?;
        let reference = qualified_ref(&q);
        let docker = self.docker();
        match docker.inspect_image(&reference).await {
            Ok(i)
                if i.config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .is_some_and(|l| l.contains_key(snapshot::NAME)) => {}
            Ok(_) => return Err(no_such(name)),
            Err(e) if is_not_found(&e) => return Err(no_such(name)),
            Err(e) => return Err(api(format!("inspect snapshot '{name}'"), e)),
        }
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        match docker.remove_image(&reference, Some(options), None).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(no_such(name)),
            Err(e) if status_code(&e) == Some(409) => Err(Error::InvalidSpec(SpecError {
                field: "snapshot".into(),
                value: name.into(),
                reason: "sandboxes started from it still exist; destroy them first".into(),
            })),
            Err(e) => Err(api(format!("delete snapshot '{name}'"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_tagged_in_one_repository() {
        assert_eq!(image_ref("base"), "corral-snapshot:base");
        let q = QualifiedName::parse("alice.mcp-0a/base").expect("name");
        assert_eq!(qualified_ref(&q), "corral-snapshot/alice.mcp-0a:base");
    }
}
