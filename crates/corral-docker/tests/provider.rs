//! The provider on the real daemon: LRU and idle eviction, auto-restart
//! after `docker rm -f` and `docker kill`, reuse (never of a sandbox a
//! snapshot changed), persistent sessions.
//! Session keys and warm pools are cases of the shared contract in
//! `tests/contract.rs`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX};
use corral::Provider;
use corral_core::pool::{PoolConfig, ProviderConfig};
use corral_core::{CommandSpec, FailureKind, Recovery};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread")]
async fn max_live_evicts_the_least_recently_used_idle_sandbox() {
    let g = Guard::new("prov-lru");
    let cfg = ProviderConfig {
        max_live: 2,
        ..ProviderConfig::default()
    };
    let p = Provider::new(backend().await, cfg);
    let spec = g.spec(BUSYBOX);
    let a = p.acquire_spec("a", &spec).await.expect("a");
    let a_id = a.id().to_string();
    drop(a);
    let b = p.acquire_spec("b", &spec).await.expect("b");
    drop(b);
    // Touch b again so a is the least recently used.
    drop(p.acquire_spec("b", &spec).await.expect("b again"));
    let c = p.acquire_spec("c", &spec).await.expect("c evicts a");
    assert_eq!(p.stats().evicted_lru, 1);
    assert_eq!(p.stats().live, 2);
    // b and c are now busy: d must wait for room until one is released.
    let b = p.acquire_spec("b", &spec).await.expect("b");
    let waiting = {
        let (p, spec) = (p.clone(), spec.clone());
        tokio::spawn(async move { p.acquire_spec("d", &spec).await.map(|l| l.id().to_string()) })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "d must wait while every sandbox is in use"
    );
    drop(c);
    let d = waiting.await.expect("join").expect("d gets c's room");
    assert!(!d.is_empty());
    drop(b);
    let a2 = p.acquire_spec("a", &spec).await.expect("a again");
    assert_ne!(a2.id(), a_id, "an evicted session starts over");
    drop(a2);
    p.shutdown().await;
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sandboxes_expire() {
    let g = Guard::new("prov-idle");
    let cfg = ProviderConfig {
        idle_timeout_ms: 400,
        reap_interval_ms: 100,
        ..ProviderConfig::default()
    };
    let p = Provider::new(backend().await, cfg);
    let lease = p
        .acquire_spec("k", &g.spec(BUSYBOX))
        .await
        .expect("acquire");
    // Busy sandboxes never expire.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(p.stats().evicted_idle, 0);
    drop(lease);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !g.remaining().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "idle sandbox not evicted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(p.stats().evicted_idle, 1);
    assert_eq!(p.stats().live, 0);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_sandboxes_are_replaced_on_acquire_unless_policy_is_fail() {
    let g = Guard::new("prov-restart");
    let p = Provider::new(backend().await, ProviderConfig::default());
    let mut spec = g.spec(BUSYBOX);
    spec.recovery = Recovery::Recreate;
    let lease = p.acquire_spec("agent", &spec).await.expect("acquire");
    let (id, cid) = (lease.id().to_string(), lease.container_id());
    drop(lease);
    docker(&["rm", "-f", &cid]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lease = p.acquire_spec("agent", &spec).await.expect("replaced");
    assert_ne!(lease.id(), id);
    assert_eq!(text(&lease.run(&sh("echo fresh")).await.stdout), "fresh\n");
    assert_eq!(p.stats().restarted, 1);
    drop(lease);

    let mut rl = g.spec(BUSYBOX);
    rl.recovery = Recovery::Fail;
    let lease = p.acquire_spec("episode", &rl).await.expect("acquire");
    let cid = lease.container_id();
    drop(lease);
    docker(&["kill", &cid]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = p
        .acquire_spec("episode", &rl)
        .await
        .err()
        .expect("fail policy reports the loss");
    assert_eq!(e.failure().kind, FailureKind::ContainerLost, "{e}");
    // The dead one is gone everywhere: the next acquire starts fresh.
    let lease = p.acquire_spec("episode", &rl).await.expect("fresh episode");
    assert_eq!(text(&lease.run(&sh("echo ok")).await.stdout), "ok\n");
    drop(lease);
    p.shutdown().await;
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn reused_sandboxes_are_reset_before_going_back_to_the_pool() {
    let g = Guard::new("prov-reuse");
    let cfg = ProviderConfig {
        pools: BTreeMap::from([(
            "r".to_string(),
            PoolConfig {
                spec: g.spec(BUSYBOX),
                warm: 1,
                reuse: true,
                ..PoolConfig::default()
            },
        )]),
        reap_interval_ms: 100,
        ..ProviderConfig::default()
    };
    let p = Provider::new(backend().await, cfg);
    assert!(p.wait_warm("r", Duration::from_secs(60)).await);
    let lease = p.acquire("one", "r").await.expect("acquire");
    let id = lease.id().to_string();
    lease
        .run(&sh("echo secret > /tmp/leftover; sleep 300 &"))
        .await;
    drop(lease);
    p.release("one").await.expect("release");
    // The released one went back (the refill may have added another: take
    // until we see it again).
    let mut seen = false;
    for k in 0..3 {
        let l = p.acquire(&format!("two-{k}"), "r").await.expect("acquire");
        if l.id() == id {
            seen = true;
            let r = l
                .run(&sh("ls /tmp; ps -o comm | grep -c sleep; true"))
                .await;
            assert_eq!(
                text(&r.stdout),
                "0\n",
                "reset left state behind: {}",
                text(&r.stdout)
            );
            break;
        }
    }
    assert!(seen, "the reset sandbox was not reused");
    p.shutdown().await;
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_sessions_survive_container_loss_and_are_adopted_after_a_restart() {
    let g = Guard::new("prov-persist");
    let root = std::env::temp_dir().join(format!("corral-persist-{}", std::process::id()));
    let mut spec = g.spec(BUSYBOX);
    spec.recovery = Recovery::Recreate;
    let p =
        Provider::with_persistence_root(backend().await, ProviderConfig::default(), root.clone());
    let lease = p
        .acquire_persistent("agent/7", &spec)
        .await
        .expect("acquire");
    let r = lease
        .run(&sh(
            "pwd; echo $HOME; echo work > notes.txt; echo rc > $HOME/.profile",
        ))
        .await;
    assert_eq!(text(&r.stdout), "/workspace\n/home/corral\n");
    let first = lease.container_id();
    drop(lease);

    // Container lost: the next acquire replaces it, with the files intact.
    docker(&["rm", "-f", &first]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lease = p
        .acquire_persistent("agent/7", &spec)
        .await
        .expect("re-acquire");
    let second = lease.container_id();
    assert_ne!(second, first);
    let r = lease.run(&sh("cat notes.txt $HOME/.profile")).await;
    assert_eq!(text(&r.stdout), "work\nrc\n");
    drop(lease);

    // A "restarted corral": shutdown leaves the persistent container running;
    // a new provider adopts it instead of creating a duplicate.
    p.shutdown().await;
    assert_eq!(
        g.remaining().len(),
        1,
        "the persistent container is left for adoption"
    );
    let p2 =
        Provider::with_persistence_root(backend().await, ProviderConfig::default(), root.clone());
    let lease = p2
        .acquire_persistent("agent/7", &spec)
        .await
        .expect("adopt");
    assert_eq!(lease.container_id(), second, "adopted, not duplicated");
    assert_eq!(
        text(&lease.run(&sh("cat notes.txt")).await.stdout),
        "work\n"
    );
    assert_eq!(g.remaining().len(), 1);
    drop(lease);

    // Release removes the container and keeps the directories.
    p2.release("agent/7").await.expect("release");
    g.assert_clean();
    let dirs: Vec<_> = std::fs::read_dir(&root).expect("root").collect();
    assert_eq!(dirs.len(), 1, "one directory per session key");
    p2.shutdown().await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reuse_pool_never_takes_back_a_sandbox_a_snapshot_changed() {
    let g = Guard::new("prov-reuse-fold");
    let rt = backend().await;
    let mut spec = g.spec(BUSYBOX);
    // Resettable in place: a snapshot folds its changes into the container.
    spec.pristine = true;
    let cfg = ProviderConfig {
        // One sandbox at most: the released one is all the pool could
        // hand out next.
        max_live: 1,
        pools: BTreeMap::from([(
            "r".to_string(),
            PoolConfig {
                spec,
                warm: 1,
                reuse: true,
                reset: vec!["rm -rf /tmp/scratch".into()],
                ..PoolConfig::default()
            },
        )]),
        reap_interval_ms: 100,
        ..ProviderConfig::default()
    };
    let p = Provider::new(rt.clone(), cfg);
    assert!(p.wait_warm("r", Duration::from_secs(60)).await);
    let a = p.acquire("attacker", "r").await.expect("acquire");
    let folded = a.container_id();
    // An always-0 shell also passes every reset command.
    let r = a.run(&sh(common::POISON)).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let name = format!(
        "reuse-fold-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    );
    a.snapshot(&name, corral::SnapshotOptions::default())
        .await
        .expect("snapshot");
    a.release().await.expect("release");
    p.settled(Duration::from_secs(60)).await;

    let b = p.acquire("victim", "r").await.expect("acquire");
    let exit = b.run(&sh("exit 3")).await;
    let planted = b
        .run(&sh("test -e /etc/planted && echo present || echo absent"))
        .await;
    assert_eq!(
        (exit.exit_code, text(&planted.stdout)),
        (Some(3), "absent\n".to_string()),
        "the next session inherited the attacker's sandbox"
    );
    assert_ne!(b.container_id(), folded);
    assert_eq!(p.stats().discarded_changed, 1, "{:?}", p.stats());
    b.release().await.expect("release");
    p.shutdown().await;
    rt.delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    g.assert_clean();
}

/// What a fork must see: every path under the directories the snapshot
/// and the episodes touch, and the content of the files that matter.
const TREE: &str = "find /etc /srv /root /home /opt /usr/local 2>/dev/null | sort; \
     md5sum /srv/state/blob | cut -c1-32; cat /srv/state/README /etc/pool-marker; \
     test -e /etc/group && echo group || echo no-group";

/// Snapshots `source` under a name of its own: `prefix`, this process, a
/// random part.
async fn snapshot(
    source: &corral::Sandbox,
    prefix: &str,
) -> (String, corral_core::snapshot::SnapshotInfo) {
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    );
    let info = source
        .snapshot(&name, corral::SnapshotOptions::default())
        .await
        .expect("snapshot");
    (name, info)
}

async fn out(sb: &corral::Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.exit_code, Some(0), "{script}: {r:?}");
    text(&r.stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_land_in_warm_pristine_sandboxes_and_go_back_pristine() {
    let g = Guard::new("prov-pool-fork");
    let rt = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    spec.startup = vec!["echo pool-base > /etc/pool-marker".into()];
    let cfg = ProviderConfig {
        pools: BTreeMap::from([(
            "p".to_string(),
            PoolConfig {
                spec: spec.clone(),
                warm: 3,
                pristine: true,
                ..PoolConfig::default()
            },
        )]),
        reap_interval_ms: 100,
        ..ProviderConfig::default()
    };
    let p = Provider::new(rt.clone(), cfg);
    assert!(p.wait_warm("p", Duration::from_secs(60)).await);
    let warm: Vec<String> = p
        .held()
        .iter()
        .map(|h| h.sandbox.id().to_string())
        .collect();

    // The prepared state: a blob, a file, a deleted system file.
    let source = rt.create(&spec).await.expect("create the source");
    out(
        &source,
        "mkdir -p /srv/state && dd if=/dev/urandom of=/srv/state/blob bs=1k count=512 2>/dev/null \
         && echo prepared > /srv/state/README && rm /etc/group",
    )
    .await;
    let (name, info) = snapshot(&source, "pool-fork").await;
    let expected = out(&source, TREE).await;
    assert!(
        expected.ends_with("prepared\npool-base\nno-group\n"),
        "{expected}"
    );
    let base = rt.fork_base(&info).await.expect("its delta");
    let fork_spec = info.fork_spec();

    // A first round of forks: each lands in a warm sandbox of the pool
    // (no container start), and leaves a mess behind.
    let mut round = Vec::new();
    for i in 0..3 {
        round.push(
            p.acquire_fork(&format!("ep1-{i}"), &fork_spec, base.clone(), None)
                .await
                .expect("fork"),
        );
    }
    // The pool refills behind the forks (one start at a time while a fork
    // is taking a sandbox, all of them once none is).
    assert!(
        p.wait_warm("p", Duration::from_secs(60)).await,
        "the pool did not refill after the forks"
    );
    for f in &round {
        assert!(
            warm.contains(&f.id().to_string()),
            "fork {} started a new sandbox",
            f.id()
        );
        assert_eq!(out(f, TREE).await, expected, "fork {}", f.id());
        out(
            f,
            "echo episode1 > /etc/previous-episode; rm -rf /srv/state/README; \
             mkdir -p /opt/leftover; (sleep 1000 &)",
        )
        .await;
        // Its own reset returns to the snapshot, not to the pool.
        f.reset().await.expect("reset");
        assert_eq!(
            out(f, TREE).await,
            expected,
            "fork {} after its reset",
            f.id()
        );
        out(f, "echo episode1 > /etc/previous-episode; (sleep 1000 &)").await;
    }
    let ids: Vec<String> = round.iter().map(|l| l.id().to_string()).collect();
    for lease in round {
        lease.release().await.expect("release");
    }
    p.settled(Duration::from_secs(60)).await;

    // Back in the pool, pristine: the pool's state, not the fork's, not
    // the episode's.
    let back: Vec<corral::Sandbox> = p
        .held()
        .into_iter()
        .filter(|h| h.key.is_none() && ids.contains(&h.sandbox.id().to_string()))
        .map(|h| h.sandbox)
        .collect();
    assert!(!back.is_empty(), "no forked sandbox went back to the pool");
    let pristine = "ls /srv/state /etc/previous-episode /opt/leftover 2>&1 | grep -c 'No such'; \
                    ls /etc/group; cat /etc/pool-marker; ps -o args | grep -c '[s]leep 1000' || true";
    for sb in &back {
        assert_eq!(
            out(sb, pristine).await,
            "3\n/etc/group\npool-base\n0\n",
            "sandbox {} went back to its pool with a fork's files",
            sb.id()
        );
    }

    // A second round lands in the same sandboxes: the snapshot's files
    // exactly, nothing of the previous episode.
    // (As many as the pool holds: its refills came in before them.)
    let pooled = p.stats().pooled.get("p").copied().unwrap_or(0);
    let mut second = Vec::new();
    for i in 0..pooled {
        second.push(
            p.acquire_fork(&format!("ep2-{i}"), &fork_spec, base.clone(), None)
                .await
                .expect("fork"),
        );
    }
    let reused = second
        .iter()
        .filter(|l| ids.contains(&l.id().to_string()))
        .count();
    assert_eq!(
        reused,
        back.len(),
        "a fork did not land in a sandbox that took one before"
    );
    for f in &second {
        assert_eq!(out(f, TREE).await, expected, "fork {}", f.id());
        assert_eq!(
            out(f, "ps -o args | grep -c '[s]leep 1000' || true").await,
            "0\n"
        );
    }
    // With the pool empty, a fork starts a sandbox and still gets the
    // snapshot's files.
    let extra = p
        .acquire_fork("ep2-extra", &fork_spec, base.clone(), None)
        .await
        .expect("fork without a warm sandbox");
    assert_eq!(out(&extra, TREE).await, expected);
    drop(extra);
    drop(second);
    p.shutdown().await;
    source.destroy().await.expect("destroy the source");
    rt.delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    g.assert_clean();
}

/// The files of this test's delta in the shared deltas directory `root`:
/// those whose bytes are exactly `delta`'s (other tests of this process
/// publish theirs beside it).
fn published(root: &std::path::Path, delta: &[u8]) -> Vec<std::path::PathBuf> {
    let mine = format!("{}-", std::process::id());
    let mut found = Vec::new();
    for dir in std::fs::read_dir(root)
        .expect("the shared deltas directory")
        .flatten()
    {
        if !dir.file_name().to_string_lossy().starts_with(&mine) {
            continue;
        }
        for f in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if std::fs::read(f.path()).is_ok_and(|b| b == delta) {
                found.push(f.path());
            }
        }
    }
    found
}

/// A fork reads its delta from the shared deltas directory: written once
/// on the host for every fork, and out of reach of every command (the
/// mount is the agent's alone); with sharing off the bytes go over the
/// agent's stream and the fork is the same.
#[tokio::test(flavor = "multi_thread")]
async fn forks_read_a_shared_delta_that_no_command_reaches() {
    let g = Guard::new("prov-shared-delta");
    let rt = backend().await;
    let root = rt
        .backend()
        .shared_deltas()
        .expect("a local daemon gets a shared deltas directory")
        .to_path_buf();
    let mut spec = g.spec(BUSYBOX);
    spec.pristine = true;
    let prepare = "mkdir -p /srv && echo secret-$((6*7)) > /srv/secret \
                   && dd if=/dev/urandom of=/srv/blob bs=1k count=256 2>/dev/null && md5sum /srv/blob";
    let source = rt.create(&spec).await.expect("create the source");
    let blob = out(&source, prepare).await;
    let (name, info) = snapshot(&source, "shared").await;
    let base = rt
        .fork_base(&info)
        .await
        .expect("its delta")
        .expect("a delta snapshot");
    let forks = rt.fork(&name, 2).await.expect("fork");

    // One file on the host for both forks, the delta's bytes exactly.
    let files = published(&root, base.as_bytes());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].clone();
    let shared_name = format!(
        "{}/{}",
        file.parent()
            .and_then(|d| d.file_name())
            .expect("its process directory")
            .to_string_lossy(),
        file.file_name().expect("its name").to_string_lossy()
    );

    // Each fork's own directory (the one it mounts) held the delta only
    // for its import: nothing is left there to find.
    for f in &forks {
        let dir = corral_core::backend::sandbox_deltas_dir(&root, f.id());
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", dir.display());
    }

    // Each fork has the state; none of its commands finds the mount, the
    // file (by its exact name), or the agent's descriptor of the directory.
    let attack = format!(
        "for p in /.corral-deltas/{n} /proc/1/root/.corral-deltas/{n} /proc/1/cwd/.corral-deltas/{n}; do \
           cat $p >/dev/null 2>&1 && echo READ $p; done; \
         i=0; while [ $i -lt 64 ]; do ls /proc/1/fd/$i/ >/dev/null 2>&1 && echo LISTED $i; i=$((i+1)); done; \
         grep -c corral-deltas /proc/self/mountinfo; ls -A /.corral-deltas | wc -l; \
         cat /srv/secret; md5sum /srv/blob",
        n = shared_name
    );
    for f in &forks {
        assert_eq!(
            out(f, &attack).await,
            format!("0\n0\nsecret-42\n{blob}"),
            "fork {}",
            f.id()
        );
    }
    // A sandbox that took no fork reaches it no better.
    let other = rt.create(&spec).await.expect("create another");
    let no_fork = other.run(&sh(&format!("({attack}) 2>&1"))).await;
    assert!(
        text(&no_fork.stdout).starts_with("0\n0\ncat: can't open '/srv/secret'"),
        "{no_fork:?}"
    );

    for sb in forks.iter().chain([&source, &other]) {
        sb.destroy().await.expect("destroy");
    }
    rt.delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    let dirs: Vec<_> = forks
        .iter()
        .map(|f| corral_core::backend::sandbox_deltas_dir(&root, f.id()))
        .collect();
    drop((info, base, forks, source, other));
    assert!(!file.exists(), "{} outlived its snapshot", file.display());
    for dir in dirs {
        assert!(!dir.exists(), "{} outlived its sandbox", dir.display());
    }

    // Sharing off: the same fork, its bytes over the agent's stream.
    let streamed = common::connect(&common::BackendConfig {
        share_deltas: false,
        ..Default::default()
    })
    .await
    .expect("connect");
    assert!(streamed.backend().shared_deltas().is_none());
    let source = streamed.create(&spec).await.expect("create the source");
    let blob = out(&source, prepare).await;
    streamed
        .fork_base(
            &source
                .snapshot(&name, corral::SnapshotOptions::default())
                .await
                .expect("snapshot"),
        )
        .await
        .expect("its delta");
    let forks = streamed.fork(&name, 1).await.expect("fork");
    assert_eq!(
        out(
            &forks[0],
            "grep -c corral-deltas /proc/self/mountinfo; cat /srv/secret; md5sum /srv/blob"
        )
        .await,
        format!("0\nsecret-42\n{blob}")
    );
    for sb in forks.iter().chain([&source]) {
        sb.destroy().await.expect("destroy");
    }
    streamed
        .delete_snapshot(&name)
        .await
        .expect("delete the snapshot");
    g.assert_clean();
}
