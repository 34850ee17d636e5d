//! Contract cases for snapshots and forks of sandboxes that reset in
//! place: the changes travel through the agents' streams (a `delta`
//! snapshot), so every engine that runs the agent forks without an image
//! or a registry.

use std::time::Duration;

use corral::snapshot::SnapshotKind;
use corral::{ResetMode, Runtime, RuntimeConfig, Sandbox, SandboxSpec, SnapshotOptions};

use super::{out, Case};

/// A pristine spec whose start-up command leaves a mark the snapshot must
/// carry (its forks do not run it again).
fn pristine(c: &Case) -> SandboxSpec {
    let mut spec = c.spec();
    spec.pristine = true;
    spec.startup = vec!["echo from-startup > /etc/startup-marker".into()];
    spec
}

/// Everything the preparation leaves, printed the same way in every
/// sandbox: files with content and mode, a symlink, an owner, what was
/// deleted from the image, and the start-up command's mark.
const CHECK: &str = "cat /srv/repo/README /srv/repo/src/main.txt; \
     stat -c '%a %u' /srv/repo/src/main.txt /srv/repo/private; \
     readlink /srv/repo/link; \
     test -e /etc/motd-gone && echo motd-here || echo motd-gone; \
     ls /srv/repo | tr '\\n' ' '; echo; \
     cat /etc/startup-marker";

const PREPARE: &str = "mkdir -p /srv/repo/src /srv/repo/private && \
     echo readme > /srv/repo/README && echo code > /srv/repo/src/main.txt && \
     chmod 640 /srv/repo/src/main.txt && chmod 700 /srv/repo/private && \
     chown 1000 /srv/repo/private && ln -s ../etc/passwd /srv/repo/link && \
     echo present > /etc/motd-gone";

fn must_reset_in_place(c: &Case, sb: &Sandbox) {
    if let Err(why) = sb.resets_in_place() {
        panic!(
            "{}: a pristine sandbox must reset in place for its changes to travel as a delta: {why}",
            c.engine()
        );
    }
}

async fn destroy_all(sandboxes: &[Sandbox]) {
    for sb in sandboxes {
        sb.destroy().await.expect("destroy");
    }
}

/// A prepared pristine sandbox, snapshotted (a delta, by default), forks
/// into three that each have exactly its files; a fork's changes go with
/// its reset, back to the snapshot, and never reach its siblings.
pub async fn snapshot_forks_of_n_have_the_files_and_reset_to_the_snapshot(c: &Case) {
    let rt = c.runtime();
    let source = c.create(&pristine(c)).await;
    must_reset_in_place(c, &source);
    // The image's file deleted once kept (a whiteout in the delta).
    out(&source, &format!("{PREPARE}; (sleep 1000 &)")).await;
    out(&source, "rm /etc/motd-gone").await;
    let expected = out(&source, CHECK).await;
    assert!(expected.contains("motd-gone"), "{expected}");
    assert!(expected.ends_with("from-startup\n"), "{expected}");

    let name = format!("contract-{}", corral::host::random_hex(8));
    let snap = source
        .snapshot(&name, SnapshotOptions::default())
        .await
        .expect("snapshot");
    assert_eq!(snap.kind, SnapshotKind::Delta, "{}", c.engine());
    assert!(snap.size > 0);
    assert_eq!(
        snap.image,
        source.spec().image,
        "a delta forks from the image"
    );
    // The source goes on from its snapshot, its processes ended.
    assert_eq!(out(&source, CHECK).await, expected);
    assert_eq!(
        out(&source, "ps -o args | grep -c '[s]leep 1000' || true").await,
        "0\n"
    );

    let forks = rt.fork(&name, 3).await.expect("fork of 3");
    assert_eq!(forks.len(), 3);
    for f in &forks {
        must_reset_in_place(c, f);
        assert_eq!(out(f, CHECK).await, expected, "fork {}", f.id());
    }
    out(
        &forks[0],
        "rm -rf /srv/repo/src; echo changed > /srv/repo/README; echo new > /etc/motd-gone",
    )
    .await;
    assert_eq!(out(&forks[1], CHECK).await, expected, "a sibling changed");
    let reset = forks[0].reset().await.expect("reset");
    assert_eq!(reset.mode, ResetMode::InPlace, "{reset:?}");
    assert_eq!(
        out(&forks[0], CHECK).await,
        expected,
        "a fork's reset returns to the snapshot"
    );
    destroy_all(&forks).await;
    source.destroy().await.expect("destroy");
    rt.delete_snapshot(&name).await.expect("delete");
    assert!(rt.snapshot_info(&name).await.is_err(), "deleted");
}

/// A fork's own changes (new files, deleting and replacing the snapshot's)
/// snapshot again; a fork of that fork has both layers, and a deleted
/// source snapshot does not matter to it.
pub async fn snapshot_a_fork_of_a_fork_has_both_layers(c: &Case) {
    let rt = c.runtime();
    let source = c.create(&pristine(c)).await;
    must_reset_in_place(c, &source);
    out(&source, PREPARE).await;
    let first = format!("contract-{}", corral::host::random_hex(8));
    source
        .snapshot(&first, SnapshotOptions::default())
        .await
        .expect("first snapshot");
    let fork = rt.fork(&first, 1).await.expect("fork").remove(0);
    out(
        &fork,
        "rm /srv/repo/README && rm -rf /srv/repo/src && mkdir /srv/repo/src && \
         echo second > /srv/repo/src/other.txt && echo layer2 > /srv/layer2",
    )
    .await;
    let expected = out(
        &fork,
        "ls -R /srv | tr '\\n' ' '; cat /srv/layer2 /etc/startup-marker; readlink /srv/repo/link",
    )
    .await;
    assert!(
        expected.contains("other.txt") && !expected.contains("main.txt"),
        "{expected}"
    );
    let second = format!("contract-{}", corral::host::random_hex(8));
    fork.snapshot(&second, SnapshotOptions::default())
        .await
        .expect("snapshot of a fork");
    rt.delete_snapshot(&first).await.expect("delete the first");
    let grandchild = rt.fork(&second, 1).await.expect("fork of a fork").remove(0);
    let seen = out(
        &grandchild,
        "ls -R /srv | tr '\\n' ' '; cat /srv/layer2 /etc/startup-marker; readlink /srv/repo/link",
    )
    .await;
    assert_eq!(seen, expected);
    grandchild.reset().await.expect("reset");
    assert_eq!(
        out(
            &grandchild,
            "ls -R /srv | tr '\\n' ' '; cat /srv/layer2 /etc/startup-marker; readlink /srv/repo/link"
        )
        .await,
        expected
    );
    destroy_all(&[grandchild, fork, source]).await;
    rt.delete_snapshot(&second).await.expect("delete");
}

/// A fork of three where only one can start (a runtime with one start
/// slot and no patience for another) fails whole: the fork that started
/// is destroyed, nothing of the fork is left.
pub async fn snapshot_fork_is_all_or_nothing(c: &Case) {
    let tight = Runtime::new(
        c.backend().clone(),
        RuntimeConfig {
            start_limit: 1,
            shared_slots: false,
            slot_wait_timeout: Duration::from_millis(1),
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    let source = match tight.create(&pristine(c)).await {
        Ok(sb) => sb,
        Err(e) => panic!("{}: create: {e}", c.engine()),
    };
    must_reset_in_place(c, &source);
    out(&source, PREPARE).await;
    let name = format!("contract-{}", corral::host::random_hex(8));
    source
        .snapshot(&name, SnapshotOptions::default())
        .await
        .expect("snapshot");
    let e = match tight.fork(&name, 3).await {
        Ok(made) => {
            destroy_all(&made).await;
            panic!(
                "{}: a fork of three with one start slot started",
                c.engine()
            );
        }
        Err(e) => e,
    };
    assert!(e.to_string().contains("slot"), "{e}");
    // Only the source is left (deletion may take a moment on a cluster).
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left = c.leftovers().await;
        if left.len() == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "{}: a failed fork left sandboxes: {left:?}",
            c.engine()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    source.destroy().await.expect("destroy");
}

/// A durable delta is a file another runtime (another process, in
/// spirit) finds and forks from; a non-durable one stays with the runtime
/// that took it.
pub async fn snapshot_a_durable_delta_outlives_its_runtime(c: &Case) {
    let dir = std::env::temp_dir().join(format!(
        "corral-contract-snapshots-{}",
        corral::host::random_hex(8)
    ));
    let config = RuntimeConfig {
        reap_orphans: false,
        snapshot_dir: Some(dir.clone()),
        ..RuntimeConfig::default()
    };
    let first = Runtime::new(c.backend().clone(), config.clone());
    let source = match first.create(&pristine(c)).await {
        Ok(sb) => sb,
        Err(e) => panic!("{}: create: {e}", c.engine()),
    };
    must_reset_in_place(c, &source);
    out(&source, PREPARE).await;
    let expected = out(&source, CHECK).await;
    let durable = format!("contract-{}", corral::host::random_hex(8));
    let fleeting = format!("contract-{}", corral::host::random_hex(8));
    let snap = source
        .snapshot(
            &durable,
            SnapshotOptions {
                durable: true,
                kind: Some(SnapshotKind::Delta),
                ..Default::default()
            },
        )
        .await
        .expect("durable snapshot");
    assert!(snap.durable && snap.kind == SnapshotKind::Delta);
    source
        .snapshot(&fleeting, SnapshotOptions::default())
        .await
        .expect("snapshot");
    source.destroy().await.expect("destroy");

    let second = Runtime::new(c.backend().clone(), config);
    assert!(
        second.snapshot_info(&fleeting).await.is_err(),
        "a non-durable delta is the memory of the runtime that took it"
    );
    let fork = second.fork(&durable, 1).await.expect("fork").remove(0);
    assert_eq!(out(&fork, CHECK).await, expected);
    fork.destroy().await.expect("destroy");
    second.delete_snapshot(&durable).await.expect("delete");
    assert!(first.snapshot_info(&durable).await.is_err(), "deleted");
    let _ = std::fs::remove_dir_all(&dir);
}
