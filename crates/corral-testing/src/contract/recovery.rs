//! Contract cases for a sandbox removed out of band: `container_lost`
//! under the `fail` policy, replaced transparently under `recreate`.

use std::time::Duration;

use corral::{ContainerStatus, FailureKind, Recovery};

use super::{sh, text, Case};

/// Under `fail`, a sandbox removed while a command runs, or between
/// commands, fails that command and every later one `container_lost`
/// (retryable, naming the sandbox, its state attached); the sandbox is
/// dead and nothing is substituted for it.
pub async fn removed_out_of_band_is_container_lost_under_fail(c: &Case) {
    let mut spec = c.spec();
    spec.recovery = Recovery::Fail;
    let (mid, between) = tokio::join!(c.create(&spec), c.create(&spec));

    // Removed while a command runs.
    let running = {
        let sb = mid.clone();
        tokio::spawn(async move { sb.run(&sh("sleep 60")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.remove_out_of_band(&mid).await;
    let r = running.await.expect("join");
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    assert!(f.retryable());
    assert!(f.message.contains(mid.id()), "{}", f.message);
    let state = f.container.expect("the sandbox's state attached");
    assert!(
        matches!(
            state.status,
            ContainerStatus::Removed | ContainerStatus::Exited
        ) && !state.oom_killed,
        "{state}"
    );

    // Removed between commands.
    let r = between.run(&sh("echo state > /tmp/marker")).await;
    assert_eq!(r.failure, None, "{r:?}");
    c.remove_out_of_band(&between).await;
    let r = between.run(&sh("cat /tmp/marker")).await;
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    assert!(f.message.contains(between.id()), "{}", f.message);

    // Both are dead: later commands fail the same way at once, and
    // nothing was recreated.
    for sb in [&mid, &between] {
        let old = sb.container_id();
        assert!(sb.dead().is_some(), "{} is not marked dead", sb.id());
        let r = sb.run(&sh("true")).await;
        assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::ContainerLost));
        assert_eq!(sb.container_id(), old);
    }
    assert_eq!(c.runtime().metrics().recreated, 0);
    let left = c.leftovers().await;
    assert!(left.is_empty(), "a sandbox was substituted: {left:?}");
    mid.destroy()
        .await
        .expect("destroying a removed sandbox is fine");
    between
        .destroy()
        .await
        .expect("destroying a removed sandbox is fine");
}

/// Under `recreate`, a sandbox removed while a command runs is started
/// anew from the same spec (start-up commands again) and the command is
/// retried once; one removed between commands is replaced by the next
/// command; a genuine non-zero exit never counts as a loss.
pub async fn removed_out_of_band_is_replaced_under_recreate(c: &Case) {
    let mut spec = c.spec();
    spec.recovery = Recovery::Recreate;
    spec.startup = vec!["echo started >> /tmp/startups".into()];
    let sb = c.create(&spec).await;
    let r = sb.run(&sh("echo old > /tmp/marker")).await;
    assert_eq!(r.failure, None, "{r:?}");
    let first = sb.container_id();

    // Removed while a command runs: retried in a new sandbox, which ran
    // its start-up commands and has none of the old one's files.
    let running = {
        let sb = sb.clone();
        tokio::spawn(async move {
            sb.run(&sh(
                "sleep 2; cat /tmp/startups; cat /tmp/marker 2>/dev/null || echo fresh",
            ))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.remove_out_of_band(&sb).await;
    let r = running.await.expect("join");
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "started\nfresh\n");
    let second = sb.container_id();
    assert_ne!(second, first, "a new container or pod");

    // Removed between commands: the next command recreates transparently.
    c.remove_out_of_band(&sb).await;
    let r = sb.run(&sh("echo again; cat /tmp/startups")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "again\nstarted\n");
    assert_ne!(sb.container_id(), second);

    // A genuine non-zero exit is never mistaken for a lost sandbox.
    let before = sb.container_id();
    let r = sb.run(&sh("exit 1")).await;
    assert_eq!((r.exit_code, r.failure), (Some(1), None));
    assert_eq!(sb.container_id(), before);
    assert_eq!(c.runtime().metrics().recreated, 2);
    assert_eq!(
        c.leftovers().await.len(),
        1,
        "the replaced sandboxes are gone"
    );
    sb.destroy().await.expect("destroy");
}
