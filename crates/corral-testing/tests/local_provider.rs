//! The provider over the real agent as a local process: sessions, the warm
//! pool and `max_live` eviction.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{harness, spec, within};
use corral::pool::{PoolConfig, ProviderConfig};
use corral::{CommandSpec, Provider};

const T: Duration = Duration::from_secs(15);

/// Waits until pool `p` holds `n` sandboxes, through `Provider::wait_warm`
/// on this current-thread runtime: it used to wake its own waiter and spin
/// without yielding, so the refiller never ran and this hung.
async fn pooled(provider: &Provider, n: usize) {
    assert!(
        provider.wait_warm("p", T).await,
        "the pool did not fill: {:?}",
        provider.stats()
    );
    assert!(provider.stats().pooled.get("p").copied().unwrap_or(0) >= n);
}

fn config(max_live: usize, warm: usize) -> ProviderConfig {
    let mut pools = BTreeMap::new();
    pools.insert(
        "p".to_string(),
        PoolConfig {
            spec: spec(),
            warm,
            // Never reuse: the default reset script would `rm -rf /tmp/*`,
            // and here /tmp is the host's.
            reuse: false,
            reset: vec!["true".into()],
            pristine: false,
            on_idle: None,
        },
    );
    ProviderConfig {
        max_live,
        pools,
        ..ProviderConfig::default()
    }
}

#[tokio::test]
async fn acquire_release_and_the_warm_pool() {
    let h = harness();
    within(T, async {
        let provider = Provider::new(h.runtime.clone(), config(8, 1));
        pooled(&provider, 1).await;
        let lease = provider.acquire("k1", "p").await.expect("acquire");
        let r = lease.run(&CommandSpec::shell("echo leased")).await;
        assert_eq!(r.stdout, b"leased\n");
        let id = lease.id().to_string();
        drop(lease);
        // The same key gets the same sandbox back.
        let again = provider.acquire("k1", "p").await.expect("acquire again");
        assert_eq!(again.id(), id);
        drop(again);
        let stats = provider.stats();
        assert_eq!(stats.pool_hits, 1, "{stats:?}");
        provider.release("k1").await.expect("release");
        assert!(!provider.has_session("k1"));
        // The pool refills; shutting down removes everything.
        pooled(&provider, 1).await;
        provider.shutdown().await;
        assert_eq!(h.backend.count(), 0, "shutdown leaves nothing");
    })
    .await;
}

#[tokio::test]
async fn max_live_evicts_the_least_recently_used_idle_session() {
    let h = harness();
    within(T, async {
        let provider = Provider::new(h.runtime.clone(), config(2, 0));
        let a = provider.acquire("a", "p").await.expect("a");
        drop(a);
        let b = provider.acquire("b", "p").await.expect("b");
        drop(b);
        let c = provider.acquire("c", "p").await.expect("c");
        assert_eq!(c.run(&CommandSpec::shell("echo c")).await.stdout, b"c\n");
        let stats = provider.stats();
        assert_eq!(stats.evicted_lru, 1, "{stats:?}");
        assert!(stats.live <= 2, "{stats:?}");
        assert!(!provider.has_session("a"), "the oldest idle session went");
        assert!(provider.has_session("b"));
        drop(c);
        provider.shutdown().await;
        assert_eq!(h.backend.count(), 0);
    })
    .await;
}

/// An evicted sandbox is destroyed in the background; `shutdown` waits for
/// that teardown, so nothing outlives it even when the removal is slow.
#[tokio::test]
async fn shutdown_waits_for_background_teardowns() {
    let h = harness();
    within(T, async {
        let provider = Provider::new(h.runtime.clone(), config(1, 0));
        let a = provider.acquire("a", "p").await.expect("a");
        drop(a);
        // Evicting "a" to make room for "b" is slow to remove.
        h.backend
            .faults()
            .delay_next_remove(Duration::from_millis(800));
        let b = provider.acquire("b", "p").await.expect("b");
        drop(b);
        assert_eq!(provider.stats().evicted_lru, 1);
        provider.shutdown().await;
        assert_eq!(h.backend.count(), 0, "an evicted sandbox outlived shutdown");
    })
    .await;
}
