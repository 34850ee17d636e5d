//! Contract cases for shell sessions: state persists, every command
//! still gets its own exit code, timeout, cap and typed failure.

use std::time::Duration;

use corral::FailureKind;

use super::{text, Case};

const T: Option<Duration> = Some(Duration::from_secs(30));
const CAP: u64 = 1 << 20;

/// A shell keeps cwd, variables and functions between commands, and
/// every command still gets its own exit code and streams.
pub async fn shell_state_persists_between_commands(c: &Case) {
    let sb = c.create(&c.spec()).await;
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
}

/// A timeout interrupts the command and keeps the session; a command
/// that ignores SIGINT gets its shell killed and restarted.
pub async fn shell_timeouts_interrupt_the_command_and_keep_the_session(c: &Case) {
    let sb = c.create(&c.spec()).await;
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
}

/// Named sessions are independent, `exit` ends one, output is capped
/// per command.
pub async fn shell_named_sessions_are_independent_and_exit_ends_one(c: &Case) {
    let sb = c.create(&c.spec()).await;
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
}

/// A shell the OOM killer ends is typed `oom_killed`, and the next
/// command starts a fresh one.
pub async fn shell_killed_by_the_oom_killer_is_oom_killed(c: &Case) {
    let mut spec = c.spec();
    spec.limits.memory = Some(32 << 20);
    let sb = c.create(&spec).await;
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
}
