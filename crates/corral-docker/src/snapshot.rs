//! Snapshots as images: `docker commit` of a sandbox's container, tagged
//! `corral-snapshot:<name>` and labelled (`corral_core::snapshot`). They
//! survive corral restarts and daemon restarts; a fork is a sandbox started
//! from the image, sharing its layers (nothing is copied).
//!
//! The committed image keeps the base image's environment, not the
//! sandbox's (whose values may come from the host): the daemon merges the
//! container's variables into a commit, so those the base image lacks are
//! committed empty. A fork gets its environment from the recorded spec,
//! like the sandbox it was taken from.

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
pub const REPOSITORY: &str = "corral-snapshot";

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
        let inspected = docker
            .inspect_container(
                container,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| api(what.clone(), e))?;
        // The base image's own environment, not the sandbox's.
        let mut base_env = match inspected.image.as_deref() {
            Some(image) => docker
                .inspect_image(image)
                .await
                .ok()
                .and_then(|i| i.config)
                .and_then(|c| c.env)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let key = |v: &String| v.split('=').next().unwrap_or_default().to_string();
        let base_keys: Vec<String> = base_env.iter().map(key).collect();
        let sandbox_env = inspected.config.and_then(|c| c.env).unwrap_or_default();
        for k in sandbox_env.iter().map(key) {
            if !base_keys.contains(&k) {
                base_env.push(format!("{k}="));
            }
        }
        let config = ContainerConfig {
            env: Some(base_env),
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
