//! Contract cases for the memory limit: an OOM kill of a command, and of
//! PID 1, is typed `oom_killed`, never a bare signal 9.

use corral::{ContainerStatus, FailureKind};

use super::{sh, text, Case};

/// A command the OOM killer ends fails `oom_killed`, naming the limit;
/// the sandbox lives on, and a plain exit 137 afterwards is not taken for
/// another OOM.
pub async fn oom_kill_is_attributed_to_the_command(c: &Case) {
    let mut spec = c.spec();
    spec.limits.memory = Some(64 << 20);
    let sb = c.create(&spec).await;
    let r = sb
        .run(&sh("dd if=/dev/zero of=/dev/null bs=200M count=1"))
        .await;
    let f = r.failure.expect("oom");
    assert_eq!(f.kind, FailureKind::OomKilled, "{f}");
    assert!(f.message.contains("64m"), "{}", f.message);
    let r = sb.run(&sh("echo alive")).await;
    assert_eq!(text(&r.stdout), "alive\n", "{r:?}");
    let r = sb.run(&sh("exit 137")).await;
    assert_eq!((r.exit_code, r.failure), (Some(137), None));
    sb.destroy().await.expect("destroy");
}

/// When the OOM killer picks PID 1, the whole sandbox dies: the command
/// in flight fails `oom_killed` (not retryable) with the sandbox's state
/// attached.
pub async fn pid1_oom_is_reported_as_oom_killed(c: &Case) {
    let mut spec = c.spec();
    spec.limits.memory = Some(48 << 20);
    let sb = c.create(&spec).await;
    // Commands run at oom_score_adj 500; PID 1 is raised to 1000 and several
    // allocators, each well under half the limit, exhaust memory together:
    // the kernel picks PID 1.
    let r = sb
        .run(&sh("echo 1000 > /proc/1/oom_score_adj; \
                  for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/dev/null bs=10M count=2000 & done; wait"))
        .await;
    let f = r.failure.expect("failure");
    assert_eq!(f.kind, FailureKind::OomKilled, "{f}");
    assert!(!f.retryable());
    let state = f.container.expect("the sandbox's state attached");
    assert!(
        state.oom_killed && state.status == ContainerStatus::Exited,
        "{state}"
    );
    sb.destroy().await.expect("destroy");
}
