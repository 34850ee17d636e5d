//! A sandbox's usage from the daemon's one-shot stats (`GET
//! /containers/{id}/stats?stream=false&one-shot=true`: the container's
//! cgroup, read once).

use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::StatsOptionsBuilder;
use corral_core::backend::{Placement, Usage};
use corral_core::Error;
use futures_util::StreamExt;

use crate::error::api;
use crate::DockerBackend;

impl DockerBackend {
    pub(crate) async fn read_usage(&self, placement: &Placement) -> Result<Usage, Error> {
        let what = format!("read the usage of container {}", placement.id());
        let opts = StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stream = self.docker().stats(placement.id(), Some(opts));
        match stream.next().await {
            Some(Ok(stats)) => Ok(usage_of(&stats)),
            Some(Err(e)) => Err(api(what, e)),
            None => Err(Error::Agent {
                sandbox: placement.id().to_string(),
                message: format!("{what}: the daemon sent no stats"),
            }),
        }
    }
}

/// The daemon's stats as corral's usage (limits left to the runtime).
pub(crate) fn usage_of(stats: &ContainerStatsResponse) -> Usage {
    let cpu_ns = stats
        .cpu_stats
        .as_ref()
        .and_then(|c| c.cpu_usage.as_ref())
        .and_then(|u| u.total_usage)
        .unwrap_or(0);
    let memory = stats.memory_stats.as_ref();
    let raw = memory.and_then(|m| m.usage).unwrap_or(0);
    // The page cache the kernel may drop: v1's total_inactive_file, v2's
    // inactive_file (what `docker stats` subtracts).
    let inactive = memory
        .and_then(|m| m.stats.as_ref())
        .and_then(|s| {
            s.get("total_inactive_file")
                .or_else(|| s.get("inactive_file"))
        })
        .copied()
        .unwrap_or(0);
    let (mut block_read_bytes, mut block_write_bytes) = (0, 0);
    for entry in stats
        .blkio_stats
        .as_ref()
        .and_then(|b| b.io_service_bytes_recursive.as_ref())
        .into_iter()
        .flatten()
    {
        match entry.op.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("read") => block_read_bytes += entry.value.unwrap_or(0),
            Some("write") => block_write_bytes += entry.value.unwrap_or(0),
            _ => {}
        }
    }
    let (mut net_rx_bytes, mut net_tx_bytes) = (0, 0);
    for n in stats.networks.as_ref().into_iter().flat_map(|n| n.values()) {
        net_rx_bytes += n.rx_bytes.unwrap_or(0);
        net_tx_bytes += n.tx_bytes.unwrap_or(0);
    }
    Usage {
        cpu_ns,
        memory_bytes: raw.saturating_sub(inactive),
        memory_peak_bytes: memory.and_then(|m| m.max_usage).filter(|m| *m > 0),
        // The cgroup's limits as the daemon reads them (the host's memory
        // where none is set); `Sandbox::usage` puts the spec's in their place.
        memory_limit_bytes: memory.and_then(|m| m.limit).filter(|l| *l > 0),
        pids: stats
            .pids_stats
            .as_ref()
            .and_then(|p| p.current)
            .unwrap_or(0),
        pids_limit: stats
            .pids_stats
            .as_ref()
            .and_then(|p| p.limit)
            .filter(|l| *l > 0 && *l < u64::MAX / 2),
        block_read_bytes,
        block_write_bytes,
        net_rx_bytes,
        net_tx_bytes,
        ..Usage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_as_the_daemon_sends_them_become_usage() {
        // Docker 28 on cgroup v1, trimmed.
        let stats: ContainerStatsResponse = serde_json::from_str(
            r#"{"cpu_stats": {"cpu_usage": {"total_usage": 123456789}},
                "memory_stats": {"usage": 50000000, "max_usage": 60000000,
                                  "stats": {"total_inactive_file": 8000000}, "limit": 134217728},
                "pids_stats": {"current": 7, "limit": 64},
                "blkio_stats": {"io_service_bytes_recursive": [
                    {"major": 8, "minor": 0, "op": "Read", "value": 4096},
                    {"major": 8, "minor": 0, "op": "Write", "value": 8192},
                    {"major": 8, "minor": 0, "op": "Total", "value": 12288}]},
                "networks": {"eth0": {"rx_bytes": 100, "tx_bytes": 200}}}"#,
        )
        .expect("stats parse");
        let u = usage_of(&stats);
        assert_eq!(u.cpu_ns, 123_456_789);
        assert_eq!(u.memory_bytes, 42_000_000);
        assert_eq!(u.memory_peak_bytes, Some(60_000_000));
        assert_eq!(u.pids, 7);
        assert_eq!(
            (u.memory_limit_bytes, u.pids_limit),
            (Some(134_217_728), Some(64))
        );
        assert_eq!((u.block_read_bytes, u.block_write_bytes), (4096, 8192));
        assert_eq!((u.net_rx_bytes, u.net_tx_bytes), (100, 200));
        assert_eq!(
            usage_of(&ContainerStatsResponse::default()),
            Usage::default()
        );
    }
}
