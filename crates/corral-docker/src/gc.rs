//! Listing corral's containers and the per-sandbox volumes left behind.

use std::collections::HashMap;

use bollard::query_parameters::ListContainersOptionsBuilder;
use corral_core::backend::{Placement, SandboxInfo};
use corral_core::labels::{self, Owner, Ownership};
use corral_core::{ContainerStatus, Error};

use crate::DockerBackend;

/// Every container with a `corral.sandbox` label, running or not.
pub(crate) async fn list(backend: &DockerBackend) -> Result<Vec<SandboxInfo>, Error> {
    let filters = HashMap::from([("label".to_string(), vec![labels::SANDBOX.to_string()])]);
    let opts = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let docker = backend.docker();
    let list = crate::retry::retry(
        &backend.inner.config.retry,
        &backend.inner.retries,
        "list sandboxes",
        || docker.list_containers(Some(opts.clone())),
    )
    .await
    .map_err(|e| crate::error::api("list sandboxes", e))?;
    Ok(list
        .into_iter()
        .map(|c| {
            let mut l = c.labels.unwrap_or_default();
            let paused = c.names.iter().flatten().any(|n| {
                n.trim_start_matches('/')
                    .starts_with(crate::container_config::PAUSED_NAME_PREFIX)
            });
            if paused {
                l.insert(labels::PAUSED.to_string(), "true".to_string());
            }
            SandboxInfo {
                sandbox_id: l.get(labels::SANDBOX).cloned().unwrap_or_default(),
                placement: Placement(c.id.unwrap_or_default()),
                image: c.image.unwrap_or_default(),
                status: c.status.unwrap_or_default(),
                state: c
                    .state
                    .map(|s| ContainerStatus::parse(s.as_ref()))
                    .unwrap_or_default(),
                created: c.created.unwrap_or_default(),
                owner: Owner::from_labels(&l),
                // The runtime knows the host and judges ownership.
                ownership: Ownership::LiveOwner,
                session: l.get(labels::SESSION).cloned(),
                labels: l,
            }
        })
        .collect())
}

/// Removes volumes labelled `corral.sandbox` that no container uses and
/// that are older than [`YOUNG_VOLUME_SECS`]: such a volume is made with
/// its container, or a moment before it, so one no container references
/// after that is left over. Removing one never touches a host directory: a
/// nosuid mount's volume only describes an overlay of it.
pub(crate) async fn remove_dangling_volumes(backend: &DockerBackend) -> Result<Vec<String>, Error> {
    let docker = backend.docker();
    let filters = HashMap::from([
        ("label".to_string(), vec![labels::SANDBOX.to_string()]),
        ("dangling".to_string(), vec!["true".to_string()]),
    ]);
    let opts = bollard::query_parameters::ListVolumesOptionsBuilder::default()
        .filters(&filters)
        .build();
    let list = docker
        .list_volumes(Some(opts))
        .await
        .map_err(|e| crate::error::api("list sandbox volumes", e))?;
    let mut removed = Vec::new();
    // A private agent volume exists a moment (filling it) before its
    // container: leave young ones be.
    let young = |created: &Option<String>| {
        created
            .as_deref()
            .and_then(chrono_secs)
            .is_none_or(|t| unix_now().saturating_sub(t) < YOUNG_VOLUME_SECS)
    };
    for v in list.volumes.unwrap_or_default() {
        let labelled = v.labels.contains_key(labels::SANDBOX);
        if !labelled || young(&v.created_at) {
            continue;
        }
        match docker
            .remove_volume(
                &v.name,
                None::<bollard::query_parameters::RemoveVolumeOptions>,
            )
            .await
        {
            Ok(()) => removed.push(v.name),
            // In use again, or removed by someone else meanwhile.
            Err(e) => {
                tracing::debug!(volume = %v.name, error = %e, "gc left a sandbox volume")
            }
        }
    }
    Ok(removed)
}

/// Removes the egress gateways (and their networks) whose sandbox
/// container is gone, e.g. removed out of band while no corral watched it.
/// A gateway is made a moment before its sandbox: young ones are left be.
pub(crate) async fn remove_orphan_gateways(backend: &DockerBackend) -> Result<Vec<String>, Error> {
    let docker = backend.docker();
    let filters = HashMap::from([(
        "label".to_string(),
        vec![crate::egress::EGRESS_LABEL.to_string()],
    )]);
    let opts = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let gateways = docker
        .list_containers(Some(opts))
        .await
        .map_err(|e| crate::error::api("list egress gateways", e))?;
    let mut removed = Vec::new();
    for g in gateways {
        let Some(sandbox) = g
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::egress::EGRESS_LABEL))
            .cloned()
        else {
            continue;
        };
        let created = g.created.and_then(|c| u64::try_from(c).ok()).unwrap_or(0);
        if unix_now().saturating_sub(created) < YOUNG_VOLUME_SECS {
            continue;
        }
        let name = crate::container_config::container_name(&sandbox);
        match docker
            .inspect_container(
                &name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Err(e) if crate::error::is_not_found(&e) => {
                crate::egress::remove(docker, &sandbox).await;
                removed.push(crate::egress::gateway_name(&sandbox));
            }
            _ => {}
        }
    }
    Ok(removed)
}

/// Volumes younger than this are never garbage (see `remove_dangling_volumes`).
pub const YOUNG_VOLUME_SECS: u64 = 10;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the epoch of an RFC 3339 time such as
/// `2026-11-23T14:23:37Z` or `2026-11-23T14:23:37.21+01:00`; `None` when
/// it is not one.
fn chrono_secs(t: &str) -> Option<u64> {
    let (date, rest) = t.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time_end = rest.find(['Z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(time_end);
    let mut hms = time.split(':');
    let h: i64 = hms.next()?.parse().ok()?;
    let min: i64 = hms.next()?.parse().ok()?;
    let sec: f64 = hms.next()?.parse().ok()?;
    let offset = match zone {
        "" | "Z" => 0,
        z => {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let (zh, zm) = z[1..].split_once(':')?;
            sign * (zh.parse::<i64>().ok()? * 3600 + zm.parse::<i64>().ok()? * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + min * 60 + sec as i64 - offset;
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::chrono_secs;

    #[test]
    fn reads_the_daemons_times() {
        assert_eq!(chrono_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(chrono_secs("2026-11-23T14:23:37Z"), Some(1_795_443_817));
        assert_eq!(
            chrono_secs("2026-11-23T15:23:37.5+01:00"),
            Some(1_795_443_817)
        );
        assert_eq!(chrono_secs("yesterday"), None);
    }
}
