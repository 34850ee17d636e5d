//! Gets the agent binary into sandboxes: a named volume per agent build,
//! mounted read-only at `/.corral` in every sandbox.
//!
//! A volume (rather than an archive upload into each container) works with a
//! read-only root filesystem, with remote daemons (no host path involved), and
//! costs nothing per sandbox once filled. It is filled once per agent build
//! through a created, never-started helper container, then a second, empty
//! "ready" volume is created: volume creation is atomic, so its presence means
//! the binary is complete.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use corral_core::labels::{self, Owner};
use corral_core::protocol::AGENT_DIR;

use crate::error::is_not_found;
use corral_core::Error;

/// The agent binary (`corral_agent_bin`, built statically once for every
/// part that needs it).
pub use corral_agent_bin::BINARY as AGENT_BINARY;

/// Label on agent volumes, value the agent build's hash.
pub const AGENT_LABEL: &str = "corral.agent";

/// A short hash identifying this agent build.
pub fn agent_hash() -> String {
    corral_agent_bin::hash()
}

/// The volume holding this agent build.
pub fn volume_name() -> String {
    format!("corral-agent-{}", agent_hash())
}

fn ready_name() -> String {
    format!("{}-ready", volume_name())
}

/// Capabilities with which a sandbox could write to a read-only mount
/// shared with other sandboxes: remount it (SYS_ADMIN), open its files by
/// handle (DAC_READ_SEARCH), or reach the disk or kernel beneath it.
pub const SHARED_MOUNT_BREAKERS: &[&str] = &[
    "ALL",
    "SYS_ADMIN",
    "DAC_READ_SEARCH",
    "SYS_MODULE",
    "SYS_RAWIO",
];

/// Whether `spec`'s sandboxes get their own copy of the agent rather than
/// the volume every sandbox shares: when a capability could make that
/// read-only mount writable, a sandbox could otherwise replace the agent
/// every other sandbox runs.
pub fn needs_private_copy(spec: &corral_core::SandboxSpec) -> bool {
    spec.security.drop_all_caps
        && spec
            .security
            .effective_cap_add()
            .iter()
            .any(|c| SHARED_MOUNT_BREAKERS.contains(&c.as_str()))
}

/// The private agent volume of sandbox `sandbox`.
pub fn private_volume_name(sandbox: &str) -> String {
    format!("corral-agent-{sandbox}")
}

/// Makes and fills sandbox `sandbox`'s private agent volume (labelled with
/// the sandbox id, so `gc` finds it if its container is removed without
/// it). `image` is any image present on the daemon.
pub async fn make_private(
    docker: &Docker,
    sandbox: &str,
    image: &str,
    owner: &Owner,
) -> Result<String, Error> {
    let volume = private_volume_name(sandbox);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(volume.clone()),
            labels: Some(HashMap::from([
                (labels::SANDBOX.to_string(), sandbox.to_string()),
                (labels::VOLUME.to_string(), "agent".to_string()),
                (AGENT_LABEL.to_string(), agent_hash()),
            ])),
            ..Default::default()
        })
        .await
        .map_err(|e| crate::error::api(format!("create volume {volume}"), e))?;
    if let Err(e) = fill(docker, &volume, image, owner).await {
        remove_private(docker, sandbox).await;
        return Err(e);
    }
    Ok(volume)
}

/// Removes sandbox `sandbox`'s private agent volume, if it has one (best
/// effort: `gc` removes what is left).
pub async fn remove_private(docker: &Docker, sandbox: &str) {
    let volume = private_volume_name(sandbox);
    match docker
        .remove_volume(
            &volume,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await
    {
        Ok(()) => {}
        Err(e) if is_not_found(&e) => {}
        Err(e) => {
            tracing::debug!(volume = %volume, error = %e, "removing a private agent volume failed")
        }
    }
}

/// A name for a helper container no other corral process uses: this
/// process's owner record and a counter.
fn helper_name(owner: &Owner) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("corral-agent-fill-{}-{}-{n}", owner.pid, owner.start)
}

/// Copies the agent binary into `volume` through a created, never-started
/// helper container.
async fn fill(docker: &Docker, volume: &str, image: &str, owner: &Owner) -> Result<(), Error> {
    let helper = helper_name(owner);
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec!["/.corral/corral-agent".into()]),
        cmd: Some(Vec::new()),
        // Owner labels too, so no reaper takes it for an orphan mid-fill.
        labels: Some(
            [(labels::SANDBOX.to_string(), helper.clone())]
                .into_iter()
                .chain(owner.labels())
                .collect(),
        ),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                target: Some(AGENT_DIR.into()),
                source: Some(volume.to_string()),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Default::default()
            }]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default()
        .name(&helper)
        .build();
    docker
        .create_container(Some(opts), body)
        .await
        .map_err(|e| crate::error::api(format!("create agent helper {helper} from {image}"), e))?;

    let upload = async {
        let tar = agent_tar().map_err(|e| Error::Agent {
            sandbox: helper.clone(),
            message: format!("cannot pack the agent binary: {e}"),
        })?;
        let opts = UploadToContainerOptionsBuilder::default()
            .path(AGENT_DIR)
            .build();
        docker
            .upload_to_container(&helper, Some(opts), bollard::body_full(tar.into()))
            .await
            .map_err(|e| crate::error::api(format!("upload agent into volume {volume}"), e))
    }
    .await;
    let rm = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(false)
        .build();
    if let Err(e) = docker.remove_container(&helper, Some(rm)).await {
        tracing::warn!(container = %helper, error = %e, "removing the agent helper container failed");
    }
    upload
}

/// A tar archive holding the agent binary as `corral-agent`, mode 0755.
fn agent_tar() -> Result<Vec<u8>, std::io::Error> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(AGENT_BINARY.len() as u64);
    header.set_mode(0o755);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    builder.append_data(&mut header, "corral-agent", AGENT_BINARY)?;
    builder.into_inner()
}

/// Makes sure the agent volume exists and holds a complete binary. `image` is
/// any image present on the daemon (the helper container is never started).
pub async fn ensure(docker: &Docker, image: &str, owner: &Owner) -> Result<String, Error> {
    let volume = volume_name();
    match docker.inspect_volume(&ready_name()).await {
        Ok(_) => return Ok(volume),
        Err(e) if is_not_found(&e) => {}
        Err(e) => {
            return Err(crate::error::api(
                format!("inspect volume {}", ready_name()),
                e,
            ))
        }
    }
    let vol_labels = HashMap::from([(AGENT_LABEL.to_string(), agent_hash())]);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(volume.clone()),
            labels: Some(vol_labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| crate::error::api(format!("create volume {volume}"), e))?;

    if let Err(e) = fill(docker, &volume, image, owner).await {
        // Another corral process may have filled the volume meanwhile (and a
        // running sandbox then holds the binary busy): its ready marker says so.
        if docker.inspect_volume(&ready_name()).await.is_ok() {
            return Ok(volume);
        }
        return Err(e);
    }

    docker
        .create_volume(VolumeCreateRequest {
            name: Some(ready_name()),
            labels: Some(vol_labels),
            ..Default::default()
        })
        .await
        .map_err(|e| crate::error::api(format!("create volume {}", ready_name()), e))?;
    tracing::info!(volume = %volume, bytes = AGENT_BINARY.len(), "agent volume filled");
    Ok(volume)
}
