//! Template builds' images (`corral_core::template`): `docker commit` of a
//! build sandbox's container after each step (a cached layer) and at the
//! end (the template), tagged in corral's own repositories and labelled.
//!
//! A commit merges the container's labels into the image's; the labels
//! that make a container corral's sandbox are blanked in the image, so
//! nothing started from it looks like the build sandbox (corral labels
//! every sandbox it starts afresh anyway).

use std::collections::HashMap;

use bollard::models::ContainerConfig;
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
};
use corral_core::backend::{BuiltImage, Placement};
use corral_core::Error;

use crate::error::{api, is_not_found, status_code};
use crate::DockerBackend;

/// Labels of the build sandbox's container that its image must not carry.
const SANDBOX_LABELS: &[&str] = &[
    corral_core::labels::SANDBOX,
    corral_core::labels::PERSISTENT,
    corral_core::labels::SESSION,
];

impl DockerBackend {
    pub(crate) async fn commit_built(
        &self,
        placement: &Placement,
        reference: &str,
        labels: &HashMap<String, String>,
    ) -> Result<BuiltImage, Error> {
        let (repo, tag) = reference
            .rsplit_once(':')
            .ok_or_else(|| api_msg(format!("commit as {reference}: no tag")))?;
        let mut all = labels.clone();
        for l in SANDBOX_LABELS {
            all.entry(l.to_string()).or_default();
        }
        let options = CommitContainerOptionsBuilder::default()
            .container(placement.id())
            .repo(repo)
            .tag(tag)
            .comment("corral template build")
            .pause(true)
            .build();
        let config = ContainerConfig {
            labels: Some(all),
            ..Default::default()
        };
        self.docker()
            .commit_container(options, config)
            .await
            .map_err(|e| api(format!("commit a build step as {reference}"), e))?;
        self.built(reference)
            .await?
            .ok_or_else(|| api_msg(format!("the committed image {reference} is not there")))
    }

    pub(crate) async fn built(&self, reference: &str) -> Result<Option<BuiltImage>, Error> {
        let inspected = match self.docker().inspect_image(reference).await {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if status_code(&e) == Some(400) => return Ok(None),
            Err(e) => return Err(api(format!("inspect image {reference}"), e)),
        };
        let config = inspected.config.unwrap_or_default();
        Ok(Some(BuiltImage {
            reference: reference.to_string(),
            id: inspected.id.unwrap_or_default(),
            labels: config.labels.unwrap_or_default(),
            env: config.env.unwrap_or_default(),
            // Listings carry it (`built_labelled`); one image looked up by
            // reference needs only its id and labels.
            created: 0,
            size: inspected.size.unwrap_or(0).max(0) as u64,
        }))
    }

    pub(crate) async fn built_labelled(&self, label: &str) -> Result<Vec<BuiltImage>, Error> {
        let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
        let images = self
            .docker()
            .list_images(Some(
                ListImagesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| api(format!("list images labelled {label}"), e))?;
        let mut out = Vec::new();
        for image in images {
            for tag in &image.repo_tags {
                out.push(BuiltImage {
                    reference: tag.clone(),
                    id: image.id.clone(),
                    labels: image.labels.clone(),
                    created: image.created,
                    size: image.size.max(0) as u64,
                    env: Vec::new(),
                });
            }
        }
        Ok(out)
    }

    pub(crate) async fn remove_built(&self, reference: &str) -> Result<(), Error> {
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        match self
            .docker()
            .remove_image(reference, Some(options), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api(format!("remove image {reference}"), e)),
        }
    }
}

fn api_msg(reason: String) -> Error {
    Error::Host {
        what: "template build".into(),
        reason,
    }
}
