//! A client-side token bucket in front of the API server's expensive
//! calls (pod creation, port-forwards to agents), so a burst of rollouts cannot
//! flood it. kube-rs has no client-side limiter (client-go's QPS and burst
//! have no counterpart there).
//!
//! Each call takes a token, going into debt when none is left, and waits
//! until the debt is paid at `qps`: first come, first served, and waiting
//! callers hold no lock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bucket's arithmetic, clock passed in.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token at `now`; returns how long the caller must wait.
    fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// A rate limiter shared by every call of a backend.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: Mutex<Bucket>,
}

impl RateLimiter {
    /// `qps` calls per second on average, `burst` at once after a quiet
    /// spell. Values the config validation refuses are clamped to work.
    pub fn new(qps: f64, burst: u32) -> Self {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            1.0
        };
        let burst = f64::from(burst.max(1));
        RateLimiter {
            bucket: Mutex::new(Bucket {
                qps,
                burst,
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Waits for this call's turn.
    pub async fn acquire(&self) {
        let wait = match self.bucket.lock() {
            Ok(mut b) => b.take(Instant::now()),
            Err(poisoned) => poisoned.into_inner().take(Instant::now()),
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_qps() {
        let t0 = Instant::now();
        let mut b = Bucket {
            qps: 10.0,
            burst: 3.0,
            tokens: 3.0,
            last: t0,
        };
        for _ in 0..3 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        // Then one every 100 ms, queued in order.
        let w1 = b.take(t0);
        let w2 = b.take(t0);
        assert!((w1.as_secs_f64() - 0.1).abs() < 1e-9, "{w1:?}");
        assert!((w2.as_secs_f64() - 0.2).abs() < 1e-9, "{w2:?}");
        // After a quiet second the bucket is full again, not fuller.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(b.take(later), Duration::ZERO);
        }
        assert!(b.take(later) > Duration::ZERO);
    }

    #[tokio::test]
    async fn acquire_paces_callers() {
        let limiter = RateLimiter::new(50.0, 1);
        let start = Instant::now();
        for _ in 0..4 {
            limiter.acquire().await;
        }
        // One at once, then three at 20 ms each.
        assert!(
            start.elapsed() >= Duration::from_millis(55),
            "{:?}",
            start.elapsed()
        );
        let odd = RateLimiter::new(f64::NAN, 0);
        odd.acquire().await;
    }
}
