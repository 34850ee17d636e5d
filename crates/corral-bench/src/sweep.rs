//! The sweep: every container of this run, or of this process, killed and
//! removed until the daemon shows none, so no code path leaves one behind.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::bail;
use bollard::query_parameters::{
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use corral_docker::error::{is_not_found, status_code};

use crate::{Bench, BENCH_LABEL, SANDBOX_BENCH_LABEL};

impl Bench {
    /// Kills and removes every container of this run, repeating until the
    /// daemon shows none (`settle`: three empty looks, for requests a
    /// dropped measurement may still have had in flight); returns how many
    /// it removed.
    pub(crate) async fn sweep(&self, settle: bool) -> anyhow::Result<usize> {
        let quiet_needed = if settle { 3 } else { 1 };
        let (mut quiet, mut removed) = (0, 0);
        let mut left = BTreeSet::new();
        for _ in 0..100 {
            left = match self.ours().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "listing the bench's containers failed");
                    quiet = 0;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if left.is_empty() {
                quiet += 1;
                if quiet >= quiet_needed {
                    return Ok(removed);
                }
            } else {
                quiet = 0;
                let results =
                    futures_util::future::join_all(left.iter().map(|id| self.kill_remove(id)))
                        .await;
                removed += results.iter().filter(|ok| **ok).count();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!(
            "run {}: containers left behind: {}",
            self.run_id,
            left.into_iter().collect::<Vec<_>>().join(" ")
        )
    }

    /// Ids of containers with this run's labels or this process's owner labels.
    async fn ours(&self) -> anyhow::Result<BTreeSet<String>> {
        let owner: Vec<String> = self
            .runtime
            .owner()
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let filters = [
            vec![format!("{BENCH_LABEL}={}", self.run_id)],
            vec![format!("{SANDBOX_BENCH_LABEL}={}", self.run_id)],
            // Several label filters must all match: this process's containers.
            owner,
        ];
        let mut ids = BTreeSet::new();
        for labels in filters {
            let filters = HashMap::from([("label", labels)]);
            let opts = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let list = self.backend.docker().list_containers(Some(opts)).await?;
            ids.extend(list.into_iter().filter_map(|c| c.id));
        }
        Ok(ids)
    }

    /// Kill, then force-remove; a container already gone counts as removed.
    async fn kill_remove(&self, id: &str) -> bool {
        let docker = self.backend.docker();
        let kill = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        // 404 gone, 409 not running: removal below settles it either way.
        let _ = docker.kill_container(id, Some(kill)).await;
        let rm = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match docker.remove_container(id, Some(rm)).await {
            Ok(()) => true,
            Err(e) if is_not_found(&e) || status_code(&e) == Some(409) => true,
            Err(e) => {
                tracing::warn!(container = id, error = %e, "removing a bench container failed");
                false
            }
        }
    }
}
