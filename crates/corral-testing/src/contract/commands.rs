//! Contract cases for commands: exit codes and separate streams, stdin,
//! the output cap, a timeout killing the whole tree, many commands on one
//! sandbox, and a missing image.

use std::time::Duration;

use corral::{CommandSpec, FailureKind};

use super::{sh, text, Case};

/// An image no engine under test has.
pub const MISSING_IMAGE: &str = "corral-test/does-not-exist:1";

/// Echo, exit codes, separate stdout and stderr, argv, cwd and env, a
/// spawn failure typed; the agent is PID 1 and its directory read-only.
pub async fn runs_commands_with_exit_codes_and_separate_streams(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let t = sb.timings();
    assert!(t.total > t.start && t.first_command.is_none(), "{t:?}");
    let r = sb.run(&sh("echo out; echo err >&2; exit 3")).await;
    let first = sb
        .timings()
        .first_command
        .expect("the first command is timed");
    assert!(first >= r.duration, "{first:?} vs {:?}", r.duration);
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(text(&r.stdout), "out\n");
    assert_eq!(text(&r.stderr), "err\n");
    assert_eq!((r.stdout_total_bytes, r.stderr_total_bytes), (4, 4));
    assert!(!r.stdout_truncated && !r.stderr_truncated);

    // A genuine non-zero exit is not a failure; the sandbox stays usable.
    let r = sb.run(&sh("false")).await;
    assert_eq!((r.exit_code, r.failure), (Some(1), None));
    let r = sb.run(&CommandSpec::argv(["echo", "direct", "argv"])).await;
    assert_eq!(text(&r.stdout), "direct argv\n");

    // cwd with ~ and per-command env.
    let r = sb
        .run(&sh("pwd; echo $GREETING").cwd("~").env("GREETING", "hi"))
        .await;
    assert_eq!(text(&r.stdout), "/root\nhi\n", "{r:?}");
    let r = sb.run(&sh("pwd").cwd("/nonexistent")).await;
    assert_eq!(
        r.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::SpawnFailed),
        "{r:?}"
    );
    assert!(r
        .failure
        .as_ref()
        .is_some_and(|f| f.message.contains("/nonexistent")));

    // The agent is PID 1 and its directory is read-only.
    let r = sb
        .run(&sh(
            "tr '\\0' ' ' < /proc/1/cmdline; touch /.corral/x 2>/dev/null || echo ro",
        ))
        .await;
    assert!(
        text(&r.stdout).starts_with("/.corral/corral-agent init"),
        "{r:?}"
    );
    assert!(text(&r.stdout).ends_with("ro\n"), "{r:?}");
    sb.destroy().await.expect("destroy");
}

/// Stdin reaches the command byte for byte; without stdin a command
/// reads EOF at once instead of hanging until its timeout.
pub async fn stdin_is_forwarded_and_absent_stdin_is_eof(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let r = sb.run(&sh("cat").stdin(data.clone())).await;
    assert_eq!(r.failure, None, "{:?}", r.failure);
    assert!(
        r.stdout == data,
        "stdin came back changed ({} bytes)",
        r.stdout.len()
    );
    let r = sb
        .run(&sh("cat; echo done").timeout(Duration::from_secs(20)))
        .await;
    assert_eq!(r.failure, None);
    assert_eq!(text(&r.stdout), "done\n");
    sb.destroy().await.expect("destroy");
}

/// Output beyond the budget keeps its head and tail and counts the rest;
/// bytes pass through exactly.
pub async fn output_is_capped_head_and_tail_and_binary_safe(c: &Case) {
    let sb = c.create(&c.spec()).await;
    // 50 MB of output against a 1 MiB budget.
    let r = sb
        .run(&sh("head -c 50000000 /dev/zero | tr '\\000' a; printf END").max_output(1 << 20))
        .await;
    assert_eq!(r.failure, None, "{:?}", r.failure);
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_total_bytes, 50_000_003);
    assert_eq!(r.stdout.len(), 1 << 20);
    assert!(r.stdout.starts_with(b"aaa"));
    assert!(r.stdout.ends_with(b"aaaEND"));

    // Binary, invalid UTF-8, NULs: passed through exactly.
    let r = sb.run(&sh("printf '\\377\\000\\001\\303('")).await;
    assert_eq!(r.stdout, [0xff, 0x00, 0x01, 0xc3, 0x28]);

    // Budget 0 keeps nothing but still counts.
    let r = sb.run(&sh("echo hello").max_output(0)).await;
    assert!(r.stdout.is_empty() && r.stdout_truncated);
    assert_eq!(r.stdout_total_bytes, 6);
    sb.destroy().await.expect("destroy");
}

/// A timeout kills the command's whole tree, background, double-forked
/// and `setsid` children included; a background child that holds the
/// output open does not keep a command alive.
pub async fn timeout_kills_the_whole_process_tree(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let cmd = CommandSpec::shell("sleep 300 & (sleep 301 &) ; setsid sleep 302 & sleep 303")
        .timeout(Duration::from_millis(800));
    let r = sb.run(&cmd).await;
    let f = r.failure.expect("timed out");
    assert_eq!(f.kind, FailureKind::Timeout, "{f}");
    assert!(!f.retryable());
    assert!(f.message.contains(sb.id()), "{}", f.message);
    let r = sb
        .run(&sh(
            "ps -o pid,comm,args | grep 'sleep 30' | grep -v grep; true",
        ))
        .await;
    assert_eq!(text(&r.stdout), "", "survivors: {}", text(&r.stdout));

    let r = sb
        .run(&sh("sleep 100 & echo hi").timeout(Duration::from_secs(30)))
        .await;
    assert_eq!(r.failure, None, "{:?}", r.failure);
    assert_eq!(text(&r.stdout), "hi\n");
    sb.destroy().await.expect("destroy");
}

/// Many commands at once on one sandbox each get their own output; the
/// short-lived children they leave are reaped.
pub async fn commands_multiplex_on_one_sandbox(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let runs = (0..24).map(|i| {
        let sb = sb.clone();
        async move {
            (
                i,
                sb.run(&sh(&format!("sleep 0.$((RANDOM % 3)); echo {i}")))
                    .await,
            )
        }
    });
    for (i, r) in futures_util::future::join_all(runs).await {
        assert_eq!(r.failure, None, "command {i}: {r:?}");
        assert_eq!(text(&r.stdout), format!("{i}\n"));
    }
    sb.run(&sh(
        "for i in 1 2 3 4 5; do (sleep 0.05 &) ; done; sleep 0.01",
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = sb.run(&sh("ps -o stat,comm | grep '^Z' ; true")).await;
    assert_eq!(text(&r.stdout), "", "zombies: {}", text(&r.stdout));
    sb.destroy().await.expect("destroy");
}

/// A fork bomb meets the sandbox's process limit: its forks fail inside
/// the sandbox ("can't fork"), nothing else does, and once its processes
/// end the sandbox runs commands as before (under gVisor, whose own host
/// tasks share the engine's pids cgroup, the limit is kept inside it).
pub async fn a_fork_bomb_meets_the_pids_limit_and_the_sandbox_lives(c: &Case) {
    let mut spec = c.spec();
    if spec.limits.pids.is_none() {
        // An engine whose sandboxes cannot have a pids limit (a pod).
        return;
    }
    spec.limits.pids = Some(64);
    let sb = c.create(&spec).await;
    let r = sb
        .run(&sh(
            "i=0; while [ $i -lt 200 ]; do sleep 2 & i=$((i+1)); done; echo all forked",
        ))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert!(
        text(&r.stderr).contains("can't fork"),
        "no fork failed: {r:?}"
    );
    assert!(!text(&r.stdout).contains("all forked"), "{r:?}");
    // Its sleepers end on their own; then commands run as before.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = sb.run(&sh("echo alive")).await;
        if r.failure.is_none() && text(&r.stdout) == "alive\n" {
            break;
        }
        assert!(
            r.failure
                .as_ref()
                .is_none_or(|f| f.kind != FailureKind::ContainerLost),
            "the sandbox died: {r:?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "never alive again: {r:?}"
        );
    }
    sb.destroy().await.expect("destroy");
}

/// An image the engine cannot get is a typed `image_not_found` naming it,
/// and the failed start leaves nothing behind.
pub async fn a_missing_image_is_image_not_found_and_leaves_nothing(c: &Case) {
    let mut spec = c.spec();
    spec.image = MISSING_IMAGE.into();
    let e = match c.runtime().create(&spec).await {
        Err(e) => e,
        Ok(sb) => {
            sb.destroy().await.expect("destroy");
            panic!("{}: a sandbox started from {MISSING_IMAGE}", c.engine());
        }
    };
    assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");
    assert!(e.to_string().contains(MISSING_IMAGE), "{e}");
}
