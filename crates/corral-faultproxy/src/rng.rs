//! The deterministic random generator behind rule probabilities.
//!
//! xorshift64* seeded through splitmix64: tiny, no dependency, and the same
//! seed always gives the same sequence, so a flaky-looking fault pattern can
//! be replayed exactly.

/// A seeded xorshift64* generator.
#[derive(Clone, Debug)]
pub(crate) struct XorShift {
    state: u64,
}

impl XorShift {
    pub(crate) fn new(seed: u64) -> XorShift {
        // splitmix64 spreads nearby seeds apart and never yields the one
        // state (zero) that xorshift cannot leave.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        XorShift {
            state: if z == 0 { 0x2545_f491_4f6c_dd1d } else { z },
        }
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniform draw in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = XorShift::new(42);
        let mut b = XorShift::new(42);
        let mut c = XorShift::new(43);
        let xs: Vec<f64> = (0..100).map(|_| a.next_f64()).collect();
        let ys: Vec<f64> = (0..100).map(|_| b.next_f64()).collect();
        let zs: Vec<f64> = (0..100).map(|_| c.next_f64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn draws_are_in_range_and_spread() {
        for seed in [0, 1, u64::MAX] {
            let mut rng = XorShift::new(seed);
            let draws: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
            assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
            let below_half = draws.iter().filter(|d| **d < 0.5).count();
            assert!((4_500..5_500).contains(&below_half), "{below_half}");
        }
    }
}
