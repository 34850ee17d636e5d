//! The floors: raw create+start, raw `docker exec` and raw removal through
//! the Engine API ([`DockerBackend::docker`](corral_docker::DockerBackend::docker)),
//! bypassing corral, for corral's rows to be compared against.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use anyhow::{bail, Context};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use corral_core::labels;
use corral_docker::error::is_not_found;
use futures_util::StreamExt;

use crate::{Bench, BENCH_LABEL, COMMAND_TIMEOUT};

impl Bench {
    /// Raw create+start of the bench image running `sleep`, with corral's
    /// labels; returns the container id.
    pub(crate) async fn raw_start(&self) -> anyhow::Result<String> {
        // As the sandboxes: the network is part of a start's cost.
        self.raw_start_on(&self.options.image, "none").await
    }

    /// Raw create+start of `image` running `sleep` on `network`, with
    /// corral's labels; returns the container id.
    pub(crate) async fn raw_start_on(&self, image: &str, network: &str) -> anyhow::Result<String> {
        let seq = self.raw_seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-raw-{seq}", self.run_id);
        let labels: HashMap<String, String> = [
            (labels::SANDBOX.to_string(), id.clone()),
            (BENCH_LABEL.to_string(), self.run_id.clone()),
        ]
        .into_iter()
        .chain(self.runtime.owner().labels())
        .collect();
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(vec!["sleep".into(), "600".into()]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(network.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let docker = self.backend.docker();
        let name = format!("corral-{id}");
        let created = docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .with_context(|| format!("raw create of {name}"))?;
        if let Err(e) = docker.start_container(&created.id, None).await {
            let _ = self.raw_remove(&created.id).await;
            return Err(e).with_context(|| format!("raw start of {name}"));
        }
        Ok(created.id)
    }

    pub(crate) async fn raw_remove(&self, container: &str) -> anyhow::Result<()> {
        let rm = RemoveContainerOptionsBuilder::default().force(true).build();
        match self
            .backend
            .docker()
            .remove_container(container, Some(rm))
            .await
        {
            Err(e) if !is_not_found(&e) => {
                Err(e).with_context(|| format!("raw remove of {container}"))
            }
            _ => Ok(()),
        }
    }

    /// A raw `docker exec` of `sh -c script` (a measurement, so up to 15
    /// minutes); its stdout, or an error with its exit code and output.
    pub(crate) async fn raw_output(&self, container: &str, script: &str) -> anyhow::Result<String> {
        let docker = self.backend.docker();
        let exec = async {
            let exec = docker
                .create_exec(
                    container,
                    CreateExecOptions::<String> {
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        cmd: Some(vec!["sh".into(), "-c".into(), script.into()]),
                        ..Default::default()
                    },
                )
                .await?;
            let mut out = String::new();
            if let StartExecResults::Attached { mut output, .. } =
                docker.start_exec(&exec.id, None).await?
            {
                while let Some(item) = output.next().await {
                    if let bollard::container::LogOutput::StdOut { message } = item? {
                        out.push_str(&String::from_utf8_lossy(&message));
                    }
                }
            }
            docker.inspect_exec(&exec.id).await.map(|i| (i, out))
        };
        let (info, out) = tokio::time::timeout(std::time::Duration::from_secs(900), exec)
            .await
            .with_context(|| format!("raw exec in {container} timed out"))?
            .with_context(|| format!("raw exec in {container}"))?;
        if info.exit_code != Some(0) {
            bail!(
                "raw exec of `{script}` in {container} exited {:?}: {out}",
                info.exit_code
            );
        }
        Ok(out)
    }

    /// One raw `docker exec` of `true`: create, start attached and drained,
    /// inspect for the exit code.
    pub(crate) async fn raw_exec(&self, container: &str) -> anyhow::Result<()> {
        let docker = self.backend.docker();
        let exec = async {
            let exec = docker
                .create_exec(
                    container,
                    CreateExecOptions::<String> {
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        cmd: Some(vec!["true".into()]),
                        ..Default::default()
                    },
                )
                .await?;
            if let StartExecResults::Attached { mut output, .. } =
                docker.start_exec(&exec.id, None).await?
            {
                while let Some(item) = output.next().await {
                    item?;
                }
            }
            docker.inspect_exec(&exec.id).await
        };
        let info = tokio::time::timeout(COMMAND_TIMEOUT, exec)
            .await
            .with_context(|| format!("raw exec in {container} timed out"))?
            .with_context(|| format!("raw exec in {container}"))?;
        if info.exit_code != Some(0) {
            bail!(
                "raw exec of `true` in {container} exited {:?}",
                info.exit_code
            );
        }
        Ok(())
    }
}
