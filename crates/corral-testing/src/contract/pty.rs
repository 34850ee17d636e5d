//! Contract case for commands on a pseudo-terminal: an interactive shell
//! answers typed lines, sees its size change, is interrupted by Ctrl-C,
//! and ends by exiting, by a kill or by its timeout with its whole tree.

use std::time::Duration;

use corral::{CommandSpec, ExecEvent, Execution, FailureKind, OutputStream, PtySize};

use super::{sh, text, Case};

/// How long one expected answer may take.
const ANSWER: Duration = Duration::from_secs(20);

/// Reads the terminal until its output (since the last call) contains
/// `needle`; returns that output. Panics naming what came instead.
async fn read_until(exec: &mut Execution, needle: &str) -> String {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(ANSWER, async {
        loop {
            match exec.next_event().await {
                ExecEvent::Output(stream, bytes) => {
                    assert_eq!(stream, OutputStream::Stdout, "a terminal has one stream");
                    seen.extend_from_slice(&bytes);
                    if text(&seen).contains(needle) {
                        return Ok(());
                    }
                }
                ExecEvent::Ended(r) => return Err(r),
            }
        }
    })
    .await;
    match found {
        Ok(Ok(())) => text(&seen),
        Ok(Err(r)) => panic!(
            "ended before {needle:?} appeared: {r:?}; output {:?}",
            text(&seen)
        ),
        Err(_) => panic!(
            "{needle:?} did not appear within {ANSWER:?}; output {:?}",
            text(&seen)
        ),
    }
}

/// Waits for the command's end, discarding output.
async fn ended(exec: &mut Execution) -> corral::CommandResult {
    tokio::time::timeout(ANSWER * 3, async {
        loop {
            if let ExecEvent::Ended(r) = exec.next_event().await {
                return *r;
            }
        }
    })
    .await
    .expect("the command ends")
}

/// An interactive shell on a terminal: typed lines run and answer, the
/// terminal is its controlling one with the size asked for, a resize
/// shows, Ctrl-C interrupts the foreground command, `exit` ends it with
/// its code; a kill ends it by the signal, a timeout kills its tree, and
/// a size out of range is refused naming the field.
pub async fn pty_runs_an_interactive_shell(c: &Case) {
    let sb = c.create(&c.spec()).await;
    let size = PtySize { cols: 80, rows: 24 };
    let shell = CommandSpec::argv(["sh", "-i"]).timeout(Duration::from_secs(120));
    let mut exec = sb.spawn_pty(&shell, size).await.expect("spawned");
    exec.started().await.expect("started");

    exec.write_stdin(b"echo $((6*7))\n").await.expect("write");
    read_until(&mut exec, "42\r\n").await;
    exec.write_stdin(b"tty; stty size; echo $TERM\n")
        .await
        .expect("write");
    let out = read_until(&mut exec, "xterm-256color\r\n").await;
    assert!(out.contains("/dev/pts/"), "not on a terminal: {out:?}");
    assert!(out.contains("24 80\r\n"), "size: {out:?}");

    exec.resize(PtySize {
        cols: 132,
        rows: 43,
    })
    .await
    .expect("resize");
    exec.write_stdin(b"stty size\n").await.expect("write");
    read_until(&mut exec, "43 132\r\n").await;

    // Ctrl-C interrupts a long sleep: the next line answers long before
    // the sleep would have ended.
    exec.write_stdin(b"sleep 100; echo $((1+1))slept\n")
        .await
        .expect("write");
    read_until(&mut exec, "sleep 100").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    exec.write_stdin(b"\x03").await.expect("ctrl-c");
    exec.write_stdin(b"echo $((40+2))x\n").await.expect("write");
    let out = read_until(&mut exec, "42x\r\n").await;
    assert!(
        !out.contains("2slept"),
        "the sleep was not interrupted: {out:?}"
    );

    exec.write_stdin(b"exit 3\n").await.expect("write");
    let r = ended(&mut exec).await;
    assert_eq!((r.exit_code, r.failure), (Some(3), None));

    // A resize out of range is refused before it is sent.
    let err = exec
        .resize(PtySize { cols: 0, rows: 24 })
        .await
        .expect_err("zero columns");
    assert!(err.contains("pty.cols 0"), "{err}");

    // A kill ends it by the signal.
    let mut exec = sb.spawn_pty(&shell, size).await.expect("spawned");
    exec.started().await.expect("started");
    exec.signal(9).await.expect("kill");
    let r = ended(&mut exec).await;
    assert_eq!((r.signal, &r.failure), (Some(9), &None), "{r:?}");

    // A timeout kills the tree, a background job and a new session's
    // process included.
    let tree = CommandSpec::shell("sleep 310 & setsid sleep 311 & sleep 312")
        .timeout(Duration::from_millis(800));
    let mut exec = sb.spawn_pty(&tree, size).await.expect("spawned");
    let r = ended(&mut exec).await;
    assert_eq!(
        r.failure.map(|f| f.kind),
        Some(FailureKind::Timeout),
        "{:?}",
        r.exit_code
    );
    let r = sb
        .run(&sh("ps -o pid,args | grep 'sleep 31' | grep -v grep; true"))
        .await;
    assert_eq!(text(&r.stdout), "", "survivors: {}", text(&r.stdout));

    // Sizes out of range are typed and name the field.
    let f = match sb
        .spawn_pty(
            &shell,
            PtySize {
                cols: 80,
                rows: 5000,
            },
        )
        .await
    {
        Ok(_) => panic!("rows 5000 was accepted"),
        Err(f) => f,
    };
    assert_eq!(f.kind, FailureKind::InvalidSpec, "{f}");
    assert!(f.message.contains("pty.rows 5000"), "{f}");
    sb.destroy().await.expect("destroy");
}
