//! A circuit breaker for container starts: adaptive back-pressure when the
//! daemon struggles.
//!
//! Closed, it lets starts through and watches a window of recent outcomes.
//! When the error rate or the median latency of the window crosses its
//! threshold it opens: starts wait out a cool-down instead of piling onto an
//! overloaded daemon. Then it goes half-open and lets one probe through; the
//! probe's success closes it, a failure opens it again. Pure state: the
//! caller passes the clock in, so it is unit-tested without sleeping.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Thresholds of the breaker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Turn the breaker off entirely.
    pub enabled: bool,
    /// Outcomes remembered.
    pub window: usize,
    /// Outcomes needed in the window before it may open.
    pub min_samples: usize,
    /// Error fraction (0..1) of the window that opens it.
    pub error_rate: f64,
    /// Median latency of the window, in ms, that opens it (0: never on latency).
    pub slow_ms: u64,
    /// How long it stays open before probing, in ms.
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            window: 20,
            min_samples: 10,
            error_rate: 0.5,
            slow_ms: 30_000,
            cooldown_ms: 5_000,
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Starts go through.
    Closed,
    /// Starts wait until the instant given.
    Open {
        /// When probing may begin.
        until: Instant,
    },
    /// One probe is in flight; others wait for its outcome.
    HalfOpen,
}

/// What a start should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead (as the probe, when `probe` is true: report its outcome).
    Go {
        /// This start is the half-open probe.
        probe: bool,
    },
    /// Ask again after this long.
    Wait(Duration),
}

/// The breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
    outcomes: VecDeque<(bool, Duration)>,
    opened: u64,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: BreakerState::Closed,
            outcomes: VecDeque::new(),
            opened: 0,
        }
    }

    /// Current state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// How often it has opened.
    pub fn times_opened(&self) -> u64 {
        self.opened
    }

    /// Asks whether a start may go now.
    pub fn admit(&mut self, now: Instant) -> Admit {
        if !self.config.enabled {
            return Admit::Go { probe: false };
        }
        match self.state {
            BreakerState::Closed => Admit::Go { probe: false },
            BreakerState::Open { until } if now < until => Admit::Wait(until - now),
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen;
                Admit::Go { probe: true }
            }
            // The probe's outcome decides; poll again soon.
            BreakerState::HalfOpen => Admit::Wait(Duration::from_millis(50)),
        }
    }

    /// Records a start's outcome (`probe` as admitted).
    pub fn record(&mut self, now: Instant, ok: bool, latency: Duration, probe: bool) {
        if !self.config.enabled {
            return;
        }
        if probe || self.state == BreakerState::HalfOpen {
            if ok {
                self.state = BreakerState::Closed;
                self.outcomes.clear();
            } else {
                self.open(now);
            }
            return;
        }
        self.outcomes.push_back((ok, latency));
        while self.outcomes.len() > self.config.window.max(1) {
            self.outcomes.pop_front();
        }
        if self.state == BreakerState::Closed && self.tripped() {
            self.open(now);
        }
    }

    fn tripped(&self) -> bool {
        let n = self.outcomes.len();
        if n < self.config.min_samples.max(1) {
            return false;
        }
        let errors = self.outcomes.iter().filter(|(ok, _)| !ok).count();
        if errors as f64 / n as f64 >= self.config.error_rate {
            return true;
        }
        if self.config.slow_ms > 0 {
            let mut lat: Vec<Duration> = self.outcomes.iter().map(|(_, l)| *l).collect();
            lat.sort();
            if lat[n / 2] >= Duration::from_millis(self.config.slow_ms) {
                return true;
            }
        }
        false
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open {
            until: now + Duration::from_millis(self.config.cooldown_ms),
        };
        self.outcomes.clear();
        self.opened += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            window: 4,
            min_samples: 4,
            error_rate: 0.5,
            slow_ms: 1000,
            cooldown_ms: 100,
            ..BreakerConfig::default()
        }
    }

    #[test]
    fn opens_on_errors_then_probes_and_closes() {
        let t0 = Instant::now();
        let mut b = Breaker::new(cfg());
        let fast = Duration::from_millis(10);
        for ok in [true, false, true] {
            assert_eq!(b.admit(t0), Admit::Go { probe: false });
            b.record(t0, ok, fast, false);
        }
        b.record(t0, false, fast, false);
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        assert_eq!(b.admit(t0), Admit::Wait(Duration::from_millis(100)));
        let later = t0 + Duration::from_millis(100);
        assert_eq!(b.admit(later), Admit::Go { probe: true });
        assert!(
            matches!(b.admit(later), Admit::Wait(_)),
            "one probe at a time"
        );
        b.record(later, false, fast, true);
        assert!(
            matches!(b.state(), BreakerState::Open { .. }),
            "a failed probe reopens"
        );
        let later = later + Duration::from_millis(100);
        assert_eq!(b.admit(later), Admit::Go { probe: true });
        b.record(later, true, fast, true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.times_opened(), 2);
    }

    #[test]
    fn opens_on_latency_and_can_be_disabled() {
        let t0 = Instant::now();
        let mut b = Breaker::new(cfg());
        for _ in 0..4 {
            b.record(t0, true, Duration::from_secs(2), false);
        }
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        let mut off = Breaker::new(BreakerConfig {
            enabled: false,
            ..cfg()
        });
        for _ in 0..10 {
            off.record(t0, false, Duration::from_secs(2), false);
        }
        assert_eq!(off.admit(t0), Admit::Go { probe: false });
    }
}
