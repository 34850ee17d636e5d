//! Recovery and injected faults over the real agent as a local process:
//! what a user sees when the sandbox dies mid-command, when the control
//! stream is cut mid-frame, when a connect fails or a start hangs.

mod common;

use std::time::{Duration, Instant};

use common::{harness, spec, within};
use corral::{Backend, CommandSpec, FailureKind, Recovery};

const T: Duration = Duration::from_secs(15);

#[tokio::test]
async fn removed_mid_command_under_fail_is_container_lost_for_good() {
    let h = harness();
    let mut s = spec();
    s.recovery = Recovery::Fail;
    within(T, async {
        let sb = h.runtime.create(&s).await.expect("create");
        let placement = sb.placement();
        let run = {
            let sb = sb.clone();
            tokio::spawn(async move { sb.run(&CommandSpec::shell("sleep 30")).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        // `docker rm -f` from outside: kills the whole tree.
        h.backend.remove(&placement, sb.id()).await.expect("remove");
        let r = run.await.expect("join");
        let f = r.failure.expect("typed failure");
        assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
        assert!(f.retryable());
        let again = sb.run(&CommandSpec::shell("echo hi")).await;
        let f2 = again.failure.expect("still lost");
        assert_eq!(f2.kind, FailureKind::ContainerLost, "{f2}");
        assert!(again.stdout.is_empty());
        assert_eq!(h.backend.count(), 0);
    })
    .await;
}

#[tokio::test]
async fn killed_mid_command_under_recreate_retries_and_succeeds() {
    let h = harness();
    let mut s = spec();
    s.recovery = Recovery::Recreate;
    within(T, async {
        let sb = h.runtime.create(&s).await.expect("create");
        let old = sb.placement();
        let run = {
            let sb = sb.clone();
            tokio::spawn(async move { sb.run(&CommandSpec::shell("sleep 0.4; echo done")).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        // `docker kill`: SIGKILL to the agent's namespace.
        h.backend.kill(&old);
        let r = run.await.expect("join");
        assert!(r.failure.is_none(), "{:?}", r.failure);
        assert_eq!(r.stdout, b"done\n");
        assert_ne!(sb.placement(), old, "a new local sandbox");
        assert_eq!(h.runtime.metrics().recreated, 1);
        assert_eq!(h.backend.count(), 1, "the dead one was removed");
        sb.destroy().await.expect("destroy");
        assert_eq!(h.backend.count(), 0);
    })
    .await;
}

/// A spec whose dead-man grace outlasts the runtime's 3 s settle wait: a
/// command whose stream was cut waits that long for the container to
/// report a stop, sending no keepalive meanwhile, so a grace of 3 s or
/// less lets the agent kill the sandbox during the wait.
fn patient() -> corral::SandboxSpec {
    let mut s = spec();
    s.agent_grace_ms = 30_000;
    s
}

#[tokio::test]
async fn a_stream_cut_mid_frame_fails_typed_then_reattaches() {
    let h = harness();
    within(T, async {
        // The sandbox's environment comes with every session's Hello, so
        // the re-attached session has it too.
        let mut spec = patient();
        spec.env.push(corral::EnvVar::Set {
            name: "API_KEY".into(),
            value: "k-1".into(),
        });
        let sb = h.runtime.create(&spec).await.expect("create");
        // Frames are 9+ bytes: 5 cuts inside the first one.
        h.backend.faults().cut_control_after(5);
        let r = sb.run(&CommandSpec::shell("echo first")).await;
        if let Some(f) = &r.failure {
            assert_eq!(f.kind, FailureKind::AgentError, "{f}");
            assert!(f.message.contains("control stream"), "{f}");
        } else {
            // The cut fell on a keepalive before the command: it re-attached.
            assert_eq!(r.stdout, b"first\n");
        }
        let r = sb.run(&CommandSpec::shell("echo second $API_KEY")).await;
        assert!(r.failure.is_none(), "{:?}", r.failure);
        assert_eq!(r.stdout, b"second k-1\n");
        sb.destroy().await.expect("destroy");
    })
    .await;
}

#[tokio::test]
async fn a_cut_then_a_failed_reattach_is_typed_and_the_next_command_works() {
    let h = harness();
    within(T, async {
        let sb = h.runtime.create(&patient()).await.expect("create");
        let r = sb.run(&CommandSpec::shell("echo warm")).await;
        assert_eq!(r.stdout, b"warm\n");
        h.backend.faults().cut_control_after(3);
        h.backend.faults().fail_next_connect();
        let mut kinds = Vec::new();
        let mut ok = false;
        for _ in 0..3 {
            let r = sb.run(&CommandSpec::shell("echo again")).await;
            match r.failure {
                Some(f) => kinds.push(f.kind),
                None => {
                    assert_eq!(r.stdout, b"again\n");
                    ok = true;
                    break;
                }
            }
        }
        assert!(ok, "never recovered: {kinds:?}");
        assert!(
            kinds.iter().all(|k| *k == FailureKind::AgentError),
            "{kinds:?}"
        );
        sb.destroy().await.expect("destroy");
    })
    .await;
}

#[tokio::test]
async fn a_failed_connect_at_start_fails_retryable_and_leaves_nothing() {
    let h = harness();
    within(T, async {
        h.backend.faults().fail_next_connect();
        let e = match h.runtime.create(&spec()).await {
            Ok(_) => panic!("the injected connect failure was not reported"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), FailureKind::DaemonUnavailable, "{e}");
        assert!(e.retryable());
        assert_eq!(h.backend.count(), 0, "the failed start was removed");
        let sb = h.runtime.create(&spec()).await.expect("second create");
        assert_eq!(sb.run(&CommandSpec::shell("echo ok")).await.stdout, b"ok\n");
        sb.destroy().await.expect("destroy");
    })
    .await;
}

/// The runtime puts no bound on a backend's `start`: a hang delays the
/// create by as long, and only the caller's own timeout ends it. A caller
/// that gives up mid-start leaves nothing behind: the runtime removes the
/// half-started sandbox in the background.
#[tokio::test]
async fn a_start_abandoned_by_its_caller_leaves_nothing_behind() {
    let h = harness();
    within(T, async {
        h.backend
            .faults()
            .hang_next_start(Duration::from_millis(300));
        let t = Instant::now();
        let sb = h.runtime.create(&spec()).await.expect("create");
        assert!(t.elapsed() >= Duration::from_millis(300));
        sb.destroy().await.expect("destroy");

        h.backend.faults().hang_next_start(Duration::from_secs(30));
        let t = Instant::now();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(200), h.runtime.create(&spec())).await;
        assert!(gave_up.is_err(), "the hang was not observed");
        assert!(t.elapsed() < Duration::from_secs(2));
        // Removed in the background; `within` bounds the wait.
        while h.backend.count() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = h.runtime.list_sandboxes().await.expect("list");
        assert!(
            left.is_empty(),
            "the abandoned start was left behind: {left:?}"
        );
    })
    .await;
}

/// A shell session whose sandbox dies mid-command: the recovery policy
/// applies at once, as for any command. Under `recreate` the sandbox is
/// back before the result returns and the next shell command runs in a
/// fresh shell; under `fail` the sandbox is finished.
#[tokio::test]
async fn a_shell_session_losing_its_sandbox_follows_the_recovery_policy() {
    for recovery in [Recovery::Recreate, Recovery::Fail] {
        let h = harness();
        let mut s = spec();
        s.recovery = recovery;
        within(T, async {
            let sb = h.runtime.create(&s).await.expect("create");
            let old = sb.placement();
            let shell = sb.shell("main");
            let r = shell.run("export KEPT=1", Some(T), 1 << 20).await;
            assert!(r.result.failure.is_none(), "{:?}", r.result.failure);
            let run = {
                let shell = shell.clone();
                tokio::spawn(async move { shell.run("sleep 5", Some(T), 1 << 20).await })
            };
            tokio::time::sleep(Duration::from_millis(150)).await;
            h.backend.kill(&old);
            let r = run.await.expect("join");
            let f = r.result.failure.expect("typed failure");
            assert_eq!(f.kind, FailureKind::ContainerLost, "{recovery:?}: {f}");
            match recovery {
                Recovery::Recreate => {
                    // Recreated by the time the failure came back.
                    assert_ne!(sb.placement(), old, "recreated at once");
                    assert_eq!(h.runtime.metrics().recreated, 1);
                    let next = shell.run("echo ${KEPT:-fresh}", Some(T), 1 << 20).await;
                    assert!(next.restarted, "a fresh shell");
                    assert_eq!(next.result.stdout, b"fresh\n");
                }
                Recovery::Fail => {
                    assert!(sb.dead().is_some(), "marked dead at once");
                    let next = sb.run(&CommandSpec::shell("echo hi")).await;
                    let f2 = next.failure.expect("still lost");
                    assert_eq!(f2.kind, FailureKind::ContainerLost, "{f2}");
                }
            }
            sb.destroy().await.expect("destroy");
            assert_eq!(h.backend.count(), 0);
        })
        .await;
    }
}
