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
    /// Time successful starts spent in each phase, in µs, indexed by
    /// [`StartPhase`]; the phase `first_command` counts only sandboxes that
    /// ran one (see [`Metrics::first_commands`]).
    pub start_phase_us: [AtomicU64; StartPhase::ALL.len()],
    /// Sandboxes whose first command has run.
    pub first_commands: AtomicU64,
    /// Resets done in place by the agent.
    pub resets_in_place: AtomicU64,
    /// Resets that replaced the container instead (the spec or backend
    /// cannot reset in place, or the in-place reset failed).
    pub resets_replaced: AtomicU64,
    /// Total time of in-place resets, in µs.
    pub reset_us: AtomicU64,
}

/// A phase of a sandbox start, as recorded in [`crate::StartTimings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPhase {
    /// Held back by the open circuit breaker.
    BreakerWait,
    /// Waiting for a start slot.
    SlotWait,
    /// Looking up (or pulling) the image.
    Image,
    /// Making sure the agent volume is filled.
    AgentVolume,
    /// Creating the container.
    Create,
    /// Starting it.
    Start,
    /// Attaching to the agent.
    Attach,
    /// Running the start-up commands.
    Startup,
    /// The first command's round trip after the start.
    FirstCommand,
}

impl StartPhase {
    /// Every phase, in the order a start goes through them.
    pub const ALL: [StartPhase; 9] = [
        StartPhase::BreakerWait,
        StartPhase::SlotWait,
        StartPhase::Image,
        StartPhase::AgentVolume,
        StartPhase::Create,
        StartPhase::Start,
        StartPhase::Attach,
        StartPhase::Startup,
        StartPhase::FirstCommand,
    ];

    /// The phase's name in metrics and logs, e.g. `slot_wait`.
    pub fn as_str(self) -> &'static str {
        match self {
            StartPhase::BreakerWait => "breaker_wait",
            StartPhase::SlotWait => "slot_wait",
            StartPhase::Image => "image",
            StartPhase::AgentVolume => "agent_volume",
            StartPhase::Create => "create",
            StartPhase::Start => "start",
            StartPhase::Attach => "attach",
            StartPhase::Startup => "startup",
            StartPhase::FirstCommand => "first_command",
        }
    }
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
    /// See [`Metrics::start_phase_us`].
    pub start_phase_us: [u64; StartPhase::ALL.len()],
    /// See [`Metrics::first_commands`].
    pub first_commands: u64,
    /// See [`Metrics::resets_in_place`].
    pub resets_in_place: u64,
    /// See [`Metrics::resets_replaced`].
    pub resets_replaced: u64,
    /// See [`Metrics::reset_us`].
    pub reset_us: u64,
}

impl MetricsSnapshot {
    /// Total time successful starts spent in `phase`.
    pub fn start_phase(&self, phase: StartPhase) -> std::time::Duration {
        std::time::Duration::from_micros(self.start_phase_us[phase as usize])
    }

    /// Mean time a successful start spent in `phase` (for `FirstCommand`:
    /// over the sandboxes that ran one); zero before any.
    pub fn start_phase_mean(&self, phase: StartPhase) -> std::time::Duration {
        let n = match phase {
            StartPhase::FirstCommand => self.first_commands,
            _ => self.sandboxes_started,
        };
        if n == 0 {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_micros(self.start_phase_us[phase as usize] / n)
    }

    /// [`start_phase_mean`](Self::start_phase_mean) of every phase in ms,
    /// rounded to the µs, keyed by phase name: what `corral workload` and
    /// `corral bench --json` print as `start_phase_mean_ms`.
    pub fn start_phase_means_ms(&self) -> std::collections::BTreeMap<&'static str, f64> {
        StartPhase::ALL
            .into_iter()
            .map(|phase| {
                let mean = self.start_phase_mean(phase).as_secs_f64() * 1e3;
                (phase.as_str(), (mean * 1e3).round() / 1e3)
            })
            .collect()
    }
}

fn micros(d: std::time::Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

impl Metrics {
    /// Records one slot wait.
    pub fn slot_wait(&self, waited: std::time::Duration) {
        let us = micros(waited);
        self.slot_waits.fetch_add(1, Ordering::Relaxed);
        self.slot_wait_us.fetch_add(us, Ordering::Relaxed);
        self.slot_wait_max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Adds `took` to the time spent in `phase`.
    pub fn phase(&self, phase: StartPhase, took: std::time::Duration) {
        self.start_phase_us[phase as usize].fetch_add(micros(took), Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            sandboxes_started: l(&self.sandboxes_started),
            start_failures: l(&self.start_failures),
            recreated: l(&self.recreated),
            // The backend counts its own retries (`Runtime::metrics`).
            retries: 0,
            slot_waits: l(&self.slot_waits),
            slot_wait_us: l(&self.slot_wait_us),
            slot_wait_max_us: l(&self.slot_wait_max_us),
            breaker_opened: l(&self.breaker_opened),
            breaker_wait_us: l(&self.breaker_wait_us),
            orphans_reaped: l(&self.orphans_reaped),
            start_phase_us: std::array::from_fn(|i| l(&self.start_phase_us[i])),
            first_commands: l(&self.first_commands),
            resets_in_place: l(&self.resets_in_place),
            resets_replaced: l(&self.resets_replaced),
            reset_us: l(&self.reset_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phase_means_divide_by_the_right_count() {
        let m = Metrics::default();
        assert_eq!(
            m.snapshot().start_phase_mean(StartPhase::Start),
            Duration::ZERO
        );
        m.sandboxes_started.store(4, Ordering::Relaxed);
        m.phase(StartPhase::Start, Duration::from_millis(300));
        m.phase(StartPhase::Start, Duration::from_millis(500));
        m.first_commands.store(1, Ordering::Relaxed);
        m.phase(StartPhase::FirstCommand, Duration::from_millis(6));
        let s = m.snapshot();
        assert_eq!(s.start_phase(StartPhase::Start), Duration::from_millis(800));
        assert_eq!(
            s.start_phase_mean(StartPhase::Start),
            Duration::from_millis(200)
        );
        assert_eq!(
            s.start_phase_mean(StartPhase::FirstCommand),
            Duration::from_millis(6)
        );
        assert_eq!(s.start_phase_mean(StartPhase::Image), Duration::ZERO);
    }
}
