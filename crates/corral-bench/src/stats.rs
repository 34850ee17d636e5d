//! Latency statistics: nearest-rank percentiles of a row's samples, and the
//! arithmetic the report shows them with.

use std::time::Duration;

/// p50/p90/p99 of a row's samples (nearest rank).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Latency {
    pub(crate) n: usize,
    pub(crate) p50: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
}

impl Latency {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort();
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples
                .get(rank.clamp(1, samples.len().max(1)) - 1)
                .copied()
                .unwrap_or_default()
        };
        Latency {
            n: samples.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// Milliseconds, rounded to the microsecond.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// `a / b`, with a zero denominator read as one nanosecond.
pub(crate) fn times(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latency::of((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(l.n, 100);
        assert_eq!(l.p50, Duration::from_millis(50));
        assert_eq!(l.p90, Duration::from_millis(90));
        assert_eq!(l.p99, Duration::from_millis(99));
        let few = Latency::of(vec![Duration::from_millis(3), Duration::from_millis(1)]);
        assert_eq!(
            (few.p50, few.p99),
            (Duration::from_millis(1), Duration::from_millis(3))
        );
        assert_eq!(Latency::of(Vec::new()).p50, Duration::ZERO);
    }

    #[test]
    fn one_sample_is_every_percentile() {
        let l = Latency::of(vec![Duration::from_millis(7)]);
        let seven = Duration::from_millis(7);
        assert_eq!((l.n, l.p50, l.p90, l.p99), (1, seven, seven, seven));
    }

    #[test]
    fn ms_rounds_to_the_microsecond() {
        assert_eq!(ms(Duration::from_nanos(1_234_567)), 1.235);
        assert_eq!(ms(Duration::from_nanos(1_234_400)), 1.234);
        assert_eq!(ms(Duration::ZERO), 0.0);
    }

    #[test]
    fn times_reads_a_zero_denominator_as_a_nanosecond() {
        assert_eq!(
            times(Duration::from_millis(30), Duration::from_millis(10)),
            3.0
        );
        assert!((times(Duration::from_micros(1), Duration::ZERO) - 1e3).abs() < 1e-6);
        assert_eq!(times(Duration::ZERO, Duration::ZERO), 0.0);
    }
}
