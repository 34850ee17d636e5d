//! Contract cases for the provider: sandboxes by session key, and a warm
//! pool that hands out started sandboxes and refills.

use std::collections::BTreeMap;
use std::time::Duration;

use corral::pool::{PoolConfig, ProviderConfig};
use corral::Provider;

use super::{sh, text, Case};

/// One key, one sandbox (its state kept) until released; other keys and
/// a released key get fresh ones; shutdown removes them all.
pub async fn pool_same_key_same_sandbox_until_released(c: &Case) {
    let p = Provider::new(c.runtime().clone(), ProviderConfig::default());
    let spec = c.spec();
    let a1 = p.acquire_spec("episode-1", &spec).await.expect("acquire");
    let r = a1.run(&sh("echo state > /tmp/s")).await;
    assert_eq!(r.failure, None, "{r:?}");
    let id = a1.id().to_string();
    drop(a1);
    let a2 = p
        .acquire_spec("episode-1", &spec)
        .await
        .expect("acquire again");
    assert_eq!(a2.id(), id);
    assert_eq!(text(&a2.run(&sh("cat /tmp/s")).await.stdout), "state\n");
    let b = p.acquire_spec("episode-2", &spec).await.expect("other key");
    assert_ne!(b.id(), id);
    drop((a2, b));
    p.release("episode-1").await.expect("release");
    let a3 = p
        .acquire_spec("episode-1", &spec)
        .await
        .expect("after release");
    assert_ne!(a3.id(), id, "a released key gets a fresh sandbox");
    drop(a3);
    p.release("never-acquired")
        .await
        .expect("unknown keys are fine");
    p.shutdown().await;
}

/// A warm pool starts its sandboxes ahead of time, hands one over on
/// acquire (a hit, not a start) and refills behind it; an unknown pool is
/// refused naming the known ones.
pub async fn pool_warm_hands_over_started_sandboxes_and_refills(c: &Case) {
    let cfg = ProviderConfig {
        pools: BTreeMap::from([(
            "py".to_string(),
            PoolConfig {
                spec: c.spec(),
                warm: 2,
                ..PoolConfig::default()
            },
        )]),
        reap_interval_ms: 100,
        ..ProviderConfig::default()
    };
    let p = Provider::new(c.runtime().clone(), cfg);
    assert!(
        p.wait_warm("py", Duration::from_secs(120)).await,
        "pool never filled"
    );
    let before = c.leftovers().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let lease = p.acquire("rollout-1", "py").await.expect("acquire");
    assert!(
        before.contains(&lease.container_id()),
        "the sandbox was started before the acquire: {} not in {before:?}",
        lease.container_id()
    );
    assert_eq!(text(&lease.run(&sh("echo warm")).await.stdout), "warm\n");
    let s = p.stats();
    assert_eq!((s.pool_hits, s.pool_misses), (1, 0));
    assert!(
        p.wait_warm("py", Duration::from_secs(120)).await,
        "pool never refilled"
    );
    assert_eq!(c.leftovers().await.len(), 3, "two warm and the one in use");
    drop(lease);
    let e = p.acquire("x", "nope").await.err().expect("unknown pool");
    assert!(
        e.to_string().contains("nope") && e.to_string().contains("py"),
        "{e}"
    );
    p.shutdown().await;
}
