//! Retrying transient daemon errors with exponential backoff and jitter.
//!
//! Which errors are transient is decided in one place, [`crate::error::classify`];
//! this module only applies the [`RetryPolicy`]. Every retry is logged with
//! the error and the attempt, and counted.

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use corral_core::{FailureKind, RetryPolicy};

use crate::error::classify;

/// True when the error is worth retrying.
pub fn transient(e: &bollard::errors::Error) -> bool {
    classify(e) == FailureKind::DaemonUnavailable
}

/// Runs `op` (a daemon call named `what`), retrying transient failures.
pub async fn retry<T, F, Fut>(
    policy: &RetryPolicy,
    retries: &AtomicU64,
    what: &str,
    op: F,
) -> Result<T, bollard::errors::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, bollard::errors::Error>>,
{
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(policy.initial_delay_ms))
        .with_max_delay(Duration::from_millis(policy.max_delay_ms))
        .with_factor(2.0)
        .with_max_times(policy.attempts.saturating_sub(1));
    if policy.jitter {
        backoff = backoff.with_jitter();
    }
    let attempt = AtomicU32::new(1);
    op.retry(backoff)
        .sleep(tokio::time::sleep)
        .when(transient)
        .notify(|e, delay| {
            let n = attempt.fetch_add(1, Ordering::Relaxed);
            retries.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                op = what,
                attempt = n,
                of = policy.attempts,
                error = %e,
                retry_in_ms = delay.as_millis() as u64,
                "transient daemon error, retrying"
            );
        })
        .await
}
