//! Shell sessions on the real daemon: state persists, every command still
//! gets its own exit code, timeout, cap and typed failure.

mod common;

use std::time::Duration;

use common::{backend, Guard, BUSYBOX};
use corral_core::FailureKind;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

const T: Option<Duration> = Some(Duration::from_secs(30));
const CAP: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn state_persists_between_commands() {
    let g = Guard::new("shell-state");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    let sh = sb.shell("main");
    let r = sh
        .run(
            "cd /tmp && export GREETING=hi && greet() { echo \"$GREETING from $(pwd)\"; }",
            T,
            CAP,
        )
        .await;
    assert!(r.restarted, "the first command starts the shell");
    assert_eq!((r.result.exit_code, &r.result.failure), (Some(0), &None));
    let r = sh.run("greet; echo out; echo err >&2; false", T, CAP).await;
    assert!(!r.restarted && !r.ended);
    assert_eq!(text(&r.result.stdout), "hi from /tmp\nout\n");
    assert_eq!(text(&r.result.stderr), "err\n");
    assert_eq!(r.result.exit_code, Some(1));
    assert_eq!(r.result.failure, None);
    // Output without a trailing newline, binary bytes, and quotes survive.
    let r = sh
        .run("printf 'a'\"'\"'b'; printf '\\377\\000'", T, CAP)
        .await;
    assert_eq!(r.result.stdout, b"a'b\xff\x00");
    // A syntax error is an exit code, not a dead session.
    let r = sh.run("echo \"unterminated", T, CAP).await;
    assert_eq!(r.result.exit_code, Some(2));
    assert!(!r.ended);
    assert_eq!(
        text(&sh.run("echo $GREETING", T, CAP).await.result.stdout),
        "hi\n"
    );
    // Commands get no stdin: cat sees EOF instead of the session's input.
    let r = sh.run("cat; echo after-cat", T, CAP).await;
    assert_eq!(text(&r.result.stdout), "after-cat\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_interrupt_the_command_and_keep_the_session() {
    let g = Guard::new("shell-timeout");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    let sh = sb.shell("main");
    sh.run("export KEPT=yes; sleep 300 &", T, CAP).await;
    let r = sh
        .run(
            "echo before; sleep 100; echo never",
            Some(Duration::from_millis(700)),
            CAP,
        )
        .await;
    let f = r.result.failure.clone().expect("timed out");
    assert_eq!(f.kind, FailureKind::Timeout);
    assert!(f.message.contains("session is kept"), "{}", f.message);
    assert!(!r.ended);
    assert_eq!(text(&r.result.stdout), "before\n");
    let r = sh
        .run("echo $KEPT; ps -o args | grep -c '^sleep 300'", T, CAP)
        .await;
    assert_eq!(
        text(&r.result.stdout),
        "yes\n1\n",
        "state and the background job survive"
    );

    // A command that ignores SIGINT: the shell is killed and restarted.
    let r = sh
        .run(
            "(trap '' INT; sleep 100)",
            Some(Duration::from_millis(500)),
            CAP,
        )
        .await;
    assert_eq!(
        r.result.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Timeout)
    );
    assert!(r.ended, "{:?}", r.result.failure);
    let r = sh.run("echo ${KEPT:-lost}", T, CAP).await;
    assert!(r.restarted);
    assert_eq!(text(&r.result.stdout), "lost\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn named_sessions_are_independent_and_exit_ends_one() {
    let g = Guard::new("shell-named");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    let (one, two) = (sb.shell("one"), sb.shell("two"));
    one.run("cd /tmp", T, CAP).await;
    assert_eq!(text(&two.run("pwd", T, CAP).await.result.stdout), "/\n");
    assert_eq!(text(&one.run("pwd", T, CAP).await.result.stdout), "/tmp\n");
    assert_eq!(sb.shell_names(), ["one", "two"]);
    let r = one.run("exit 3", T, CAP).await;
    assert_eq!(r.result.exit_code, Some(3));
    assert!(r.ended);
    let r = one.run("pwd", T, CAP).await;
    assert!(r.restarted);
    assert_eq!(text(&r.result.stdout), "/\n");
    // Output is capped per command, head and tail kept.
    let r = two.run("seq 1 100000", T, 1000).await;
    assert!(r.result.stdout_truncated);
    assert_eq!(r.result.stdout.len(), 1000);
    assert!(text(&r.result.stdout).ends_with("99999\n100000\n"));
    assert_eq!(
        text(&two.run("echo still", T, CAP).await.result.stdout),
        "still\n"
    );
    sb.close_shell("two").await;
    assert_eq!(sb.shell_names(), ["one"]);
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_killed_by_the_oom_killer_is_oom_killed() {
    let g = Guard::new("shell-oom");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.limits.memory = Some(32 << 20);
    let sb = b.create(&spec).await.expect("create");
    let sh = sb.shell("main");
    sh.run("export KEEP=1", T, CAP).await;
    // The shell itself holds the bytes, so it is the OOM killer's victim.
    let r = sh
        .run(
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived",
            T,
            CAP,
        )
        .await;
    assert!(r.ended, "{r:?}");
    let f = r.result.failure.expect("a typed failure, not signal 9");
    assert_eq!(f.kind, FailureKind::OomKilled, "{f}");
    // The next command starts a fresh shell.
    let r = sh.run("echo ${KEEP:-fresh}", T, CAP).await;
    assert!(r.restarted);
    assert_eq!(text(&r.result.stdout), "fresh\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
