//! Counters a backend keeps about itself, read as a [`MetricsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters; every field only grows.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sandboxes started successfully.
    pub sandboxes_started: AtomicU64,
    /// Sandbox starts that failed.
    pub start_failures: AtomicU64,
    /// Containers recreated by the `recreate` recovery policy.
    pub recreated: AtomicU64,
    /// Daemon calls retried after a transient error.
    pub retries: AtomicU64,
    /// Times a start waited for a slot.
    pub slot_waits: AtomicU64,
    /// Total time spent waiting for start and exec slots, in µs.
    pub slot_wait_us: AtomicU64,
    /// Longest single slot wait, in µs.
    pub slot_wait_max_us: AtomicU64,
    /// Times the start circuit breaker opened.
    pub breaker_opened: AtomicU64,
    /// Time starts spent held back by the open breaker, in µs.
    pub breaker_wait_us: AtomicU64,
    /// Orphaned containers removed by the reaper.
    pub orphans_reaped: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// See [`Metrics::sandboxes_started`].
    pub sandboxes_started: u64,
    /// See [`Metrics::start_failures`].
    pub start_failures: u64,
    /// See [`Metrics::recreated`].
    pub recreated: u64,
    /// See [`Metrics::retries`].
    pub retries: u64,
    /// See [`Metrics::slot_waits`].
    pub slot_waits: u64,
    /// See [`Metrics::slot_wait_us`].
    pub slot_wait_us: u64,
    /// See [`Metrics::slot_wait_max_us`].
    pub slot_wait_max_us: u64,
    /// See [`Metrics::breaker_opened`].
    pub breaker_opened: u64,
    /// See [`Metrics::breaker_wait_us`].
    pub breaker_wait_us: u64,
    /// See [`Metrics::orphans_reaped`].
    pub orphans_reaped: u64,
}

impl Metrics {
    /// Records one slot wait.
    pub fn slot_wait(&self, waited: std::time::Duration) {
        let us = waited.as_micros().min(u64::MAX as u128) as u64;
        self.slot_waits.fetch_add(1, Ordering::Relaxed);
        self.slot_wait_us.fetch_add(us, Ordering::Relaxed);
        self.slot_wait_max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            sandboxes_started: l(&self.sandboxes_started),
            start_failures: l(&self.start_failures),
            recreated: l(&self.recreated),
            retries: l(&self.retries),
            slot_waits: l(&self.slot_waits),
            slot_wait_us: l(&self.slot_wait_us),
            slot_wait_max_us: l(&self.slot_wait_max_us),
            breaker_opened: l(&self.breaker_opened),
            breaker_wait_us: l(&self.breaker_wait_us),
            orphans_reaped: l(&self.orphans_reaped),
        }
    }
}
