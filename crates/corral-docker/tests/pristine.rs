//! In-place reset with Docker's snapshots: a pristine pool never hands a
//! sandbox a snapshot changed to the next session. (What every engine's
//! in-place reset must do, the attacks inside the sandbox included, is in
//! the engine contract: `corral_testing::contract::reset`.)

mod common;

use std::time::Duration;

use common::{backend, Guard, BUSYBOX};
use corral::{ResetMode, Sandbox};
use corral_core::{CommandSpec, SandboxSpec};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn out(sb: &Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.failure, None, "{script}: {r:?}");
    assert_eq!(r.exit_code, Some(0), "{script}: {}", text(&r.stderr));
    text(&r.stdout)
}

fn pristine_pool(spec: SandboxSpec, warm: usize) -> corral_core::pool::ProviderConfig {
    use corral_core::pool::{PoolConfig, ProviderConfig};
    ProviderConfig {
        max_live: warm + 1,
        pools: std::collections::BTreeMap::from([(
            "episodes".to_string(),
            PoolConfig {
                spec,
                warm,
                pristine: true,
                ..PoolConfig::default()
            },
        )]),
        ..ProviderConfig::default()
    }
}

/// What session B sees of a planted file and of `/bin/sh`, as the exit
/// codes of `sh -c 'exit 3'` (plain and exclusive) and one line.
async fn poison_seen(sb: &Sandbox) -> (Option<i32>, Option<i32>, String) {
    let plain = sb.run(&sh("exit 3")).await;
    let exclusive = sb.run(&sh("exit 3").exclusive()).await;
    let planted = sb
        .run(&sh("test -e /etc/planted && echo present || echo absent"))
        .await;
    (plain.exit_code, exclusive.exit_code, text(&planted.stdout))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_never_poisons_a_pristine_pool() {
    let g = Guard::new("pristine-poison");
    let runtime = backend().await;
    let mut config = pristine_pool(g.spec(BUSYBOX), 1);
    // One sandbox at most: once released, the attacker's is the only one
    // the pool could hand out next.
    config.max_live = 1;
    let p = corral::Provider::new(runtime.clone(), config);
    assert!(p.wait_warm("episodes", Duration::from_secs(120)).await);
    let a = p.acquire("attacker", "episodes").await.expect("acquire");
    let poisoned = a.container_id();
    out(&a, common::POISON).await;
    let r = a.run(&sh("exit 3")).await;
    assert_eq!(r.exit_code, Some(0), "the attack took: {r:?}");
    // The snapshot folds the planted files into the container's root.
    let name = format!(
        "poison-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    );
    a.snapshot(&name, corral::SnapshotOptions::default())
        .await
        .expect("snapshot");
    a.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;

    let b = p.acquire("victim", "episodes").await.expect("acquire");
    assert_eq!(
        poison_seen(&b).await,
        (Some(3), Some(3), "absent\n".to_string()),
        "the next session inherited the attacker's sandbox"
    );
    assert_ne!(
        b.container_id(),
        poisoned,
        "handed out the folded container"
    );
    let reset = b.reset().await.expect("reset");
    assert_eq!(reset.mode, ResetMode::InPlace, "{reset:?}");
    assert_eq!(
        poison_seen(&b).await,
        (Some(3), Some(3), "absent\n".to_string()),
        "after an explicit reset"
    );
    let stats = p.stats();
    assert_eq!(stats.discarded_changed, 1, "{stats:?}");
    assert!(
        !g.remaining()
            .iter()
            .any(|c| poisoned.starts_with(c.as_str())),
        "the folded container is gone: {:?}",
        g.remaining()
    );
    b.release().await.expect("release");
    p.shutdown().await;
    runtime
        .delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    g.assert_clean();
}
