//! The agent, tested the way it runs: static binary, PID 1 of a hardened
//! container, driven over `docker exec -i ... attach`.
//!
//! Each test makes its own container (removed by a guard even on failure)
//! and skips only when no Docker daemon answers.

mod support;

use std::time::{Duration, Instant};

use corral_core::protocol::{
    Frame, FrameKind, Hello, PtySize, SignalRequest, OUTPUT_CHUNK, PROTOCOL_VERSION,
};
use support::{docker_available, processes, req, Opts, Sandbox};

macro_rules! need_docker {
    () => {
        if !docker_available() {
            return;
        }
    };
}

#[test]
fn runs_commands_and_reports_exit() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let o = c.run(&["echo", "hello", "world"]);
    assert_eq!(o.out(), "hello world\n");
    let r = o.report();
    assert_eq!(
        (r.exit_code, r.signal, r.timed_out, r.oom_killed),
        (Some(0), None, false, false)
    );
    assert_eq!(r.stdout.total_bytes, 12);
    assert!(!r.stdout.truncated);
    assert!(o.pid.is_some_and(|p| p > 1));
    assert!(
        !o.frames
            .iter()
            .any(|f| matches!(f.kind, FrameKind::StdoutTail | FrameKind::StderrTail)),
        "empty tails must not be sent: {:?}",
        o.frames
    );
    assert_eq!(o.frames.first().map(|f| f.kind), Some(FrameKind::Started));

    assert_eq!(c.sh("exit 3").report().exit_code, Some(3));
    let killed = c.sh("kill -TERM $$");
    assert_eq!(
        (killed.report().exit_code, killed.report().signal),
        (None, Some(15))
    );

    let o = c.sh("echo out; echo err >&2");
    assert_eq!(o.out(), "out\n");
    assert_eq!(o.stderr, b"err\n");
    assert_eq!(o.report().stderr.total_bytes, 4);

    // Environment on top of the agent's, PATH lookup, cwd with ~ expansion.
    let mut r = req(&["sh", "-c", "echo $FOO:$HOME; pwd"]);
    r.env = vec![("FOO".into(), "bar".into())];
    r.cwd = Some("~".into());
    assert_eq!(c.run_req(&r).out(), "bar:/root\n/root\n");
    let mut r = req(&["pwd"]);
    r.cwd = Some("/tmp".into());
    assert_eq!(c.run_req(&r).out(), "/tmp\n");
    // No cwd: the container's working directory.
    assert_eq!(c.run(&["pwd"]).out(), "/\n");
    // Commands start with no blocked signals although the agent blocks some.
    let mask = c
        .run(&["grep", "-E", "Sig(Blk|Ign)", "/proc/self/status"])
        .out();
    assert_eq!(
        mask,
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"
    );
}

#[test]
fn reports_spawn_failures_precisely() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let o = c.run(&["no-such-program", "x"]);
    let msg = o.spawn_error.expect("SpawnFailed for a missing program");
    assert!(
        msg.contains("no-such-program") && msg.contains("No such file"),
        "{msg}"
    );
    assert!(
        o.pid.is_none(),
        "no Started before SpawnFailed: {:?}",
        o.frames
    );

    let mut r = req(&["true"]);
    r.cwd = Some("/does/not/exist".into());
    let msg = c
        .run_req(&r)
        .spawn_error
        .expect("SpawnFailed for a missing cwd");
    assert!(msg.contains("/does/not/exist"), "{msg}");

    let mut r = req(&["true"]);
    r.cwd = Some("/etc/passwd".into());
    let msg = c
        .run_req(&r)
        .spawn_error
        .expect("SpawnFailed for a file cwd");
    assert!(msg.contains("not a directory"), "{msg}");

    let msg = c.run(&["/etc/passwd"]).spawn_error.expect("not executable");
    assert!(
        msg.contains("/etc/passwd") && msg.contains("ermission denied"),
        "{msg}"
    );

    let msg = c.run(&[]).spawn_error.expect("empty argv");
    assert!(msg.contains("argv"), "{msg}");

    // The agent is fine afterwards.
    assert_eq!(c.run(&["echo", "ok"]).out(), "ok\n");
}

#[test]
fn feeds_stdin_and_gives_eof_without_it() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    // No stdin: immediate EOF, `cat` returns at once.
    let t0 = Instant::now();
    let o = c.run(&["cat"]);
    assert_eq!(o.report().exit_code, Some(0));
    assert!(o.out().is_empty());
    assert!(t0.elapsed() < Duration::from_secs(5));

    // Stdin frames, then EOF.
    let mut r = req(&["cat"]);
    r.stdin = true;
    let id = c.fresh_id();
    c.exec(id, &r);
    c.send(&Frame::new(FrameKind::Stdin, id, b"hello ".to_vec()));
    c.send(&Frame::new(FrameKind::Stdin, id, b"world".to_vec()));
    c.send(&Frame::new(FrameKind::StdinEof, id, Vec::new()));
    let o = c.wait(id);
    assert_eq!(o.out(), "hello world");

    // Binary, larger than any pipe buffer, echoed back exactly while it is
    // being written (needs non-blocking stdin and concurrent reading).
    let data: Vec<u8> = (0..=255u8).cycle().take(3 << 20).collect();
    let mut r = req(&["cat"]);
    r.stdin = true;
    r.max_output = 8 << 20;
    let id = c.fresh_id();
    c.exec(id, &r);
    for chunk in data.chunks(100_000) {
        c.send(&Frame::new(FrameKind::Stdin, id, chunk.to_vec()));
    }
    c.send(&Frame::new(FrameKind::StdinEof, id, Vec::new()));
    let o = c.wait(id);
    assert_eq!(o.report().stdout.total_bytes, data.len() as u64);
    assert!(
        o.stdout == data,
        "stdin/stdout round trip corrupted the bytes"
    );

    // Refused stdin frames: no pipe, after EOF; an unknown id is ignored.
    let mut r = req(&["sleep", "5"]);
    r.stdin = false;
    let id = c.fresh_id();
    c.exec(id, &r);
    assert_eq!(c.next_frame(id).kind, FrameKind::Started);
    c.send(&Frame::new(FrameKind::Stdin, id, b"x".to_vec()));
    assert!(c.expect_error(id).contains("without stdin"));
    // A frame for a command that is not running crossed its Exited: dropped
    // without an answer, since nothing may follow a command's Exited.
    c.send(&Frame::new(FrameKind::Stdin, 999_999, b"x".to_vec()));
    assert!(c.stash_of(999_999).is_empty());
    c.send(&Frame::json(
        FrameKind::Signal,
        id,
        &SignalRequest { signal: 9 },
    ));
    assert_eq!(c.wait(id).report().signal, Some(9));
}

/// Output of command `id` until an Error frame for it; returns both.
fn output_until_error(c: &mut support::Client, id: u32) -> (String, String) {
    let mut out = Vec::new();
    loop {
        let f = c.next_frame(id);
        match f.kind {
            FrameKind::Stdout => out.extend_from_slice(&f.payload),
            FrameKind::Error => {
                let e = f
                    .parse::<corral_core::protocol::ProtocolError>()
                    .expect("Error payload");
                return (String::from_utf8_lossy(&out).into(), e.message);
            }
            other => panic!("unexpected {other:?} for command {id}: {f:?}"),
        }
    }
}

#[test]
fn runs_commands_on_a_terminal_and_refuses_bad_frames() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    assert!(c.hello().pty, "the agent announces terminals");

    // A size out of range is a spawn failure naming the field.
    let mut r = req(&["true"]);
    r.pty = Some(PtySize { cols: 0, rows: 24 });
    let o = c.run_req(&r);
    assert!(
        o.spawn_error
            .as_deref()
            .is_some_and(|e| e.contains("pty.cols 0")),
        "{o:?}"
    );

    // On a terminal of 80x24: input without `stdin`, a resize, one stream.
    let mut r = req(&["sh", "-c", "stty size; read x; stty size; echo got $x >&2"]);
    r.pty = Some(PtySize { cols: 80, rows: 24 });
    let id = c.fresh_id();
    c.exec(id, &r);
    assert_eq!(c.next_frame(id).kind, FrameKind::Started);
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).contains("24 80\r\n") {
        let f = c.next_frame(id);
        assert_eq!(f.kind, FrameKind::Stdout, "{f:?}");
        first.extend_from_slice(&f.payload);
    }
    // Refused resizes: out of range, not JSON. The command goes on.
    c.send(&Frame::json(
        FrameKind::Resize,
        id,
        &PtySize { cols: 100, rows: 0 },
    ));
    let (out, e) = output_until_error(&mut c, id);
    assert!(e.contains("pty.rows 0"), "{e}");
    c.send(&Frame::new(
        FrameKind::Resize,
        id,
        b"{\"cols\":-1}".to_vec(),
    ));
    let (more, e) = output_until_error(&mut c, id);
    assert!(e.contains("invalid pty size") && e.contains("-1"), "{e}");
    c.send(&Frame::json(
        FrameKind::Resize,
        id,
        &PtySize {
            cols: 120,
            rows: 50,
        },
    ));
    // Frames apply in order: the size is set before the line is read.
    c.send(&Frame::new(FrameKind::Stdin, id, b"hi\n".to_vec()));
    let o = c.wait(id);
    assert_eq!(o.report().exit_code, Some(0), "{o:?}");
    let all = format!("{out}{more}{}", o.out());
    assert!(all.contains("50 120\r\n"), "{all:?}");
    assert!(
        all.contains("got hi\r\n"),
        "stderr is on the terminal too: {all:?}"
    );
    assert!(o.stderr.is_empty());

    // A resize of a command on pipes is refused by name.
    let id = c.fresh_id();
    c.exec(id, &req(&["sleep", "5"]));
    assert_eq!(c.next_frame(id).kind, FrameKind::Started);
    c.send(&Frame::json(
        FrameKind::Resize,
        id,
        &PtySize { cols: 80, rows: 24 },
    ));
    assert!(c.expect_error(id).contains("does not run on a terminal"));
    c.send(&Frame::json(
        FrameKind::Signal,
        id,
        &SignalRequest { signal: 9 },
    ));
    assert_eq!(c.wait(id).report().signal, Some(9));
}

#[test]
fn output_is_binary_safe_and_capped() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    // Every byte value, produced by the command itself.
    let o = c.sh(r#"i=0; while [ $i -lt 256 ]; do printf "\\$(printf %o $i)"; i=$((i+1)); done"#);
    let all: Vec<u8> = (0..=255u8).collect();
    assert_eq!(o.stdout, all);

    // Big output with a small budget: head and tail exact, totals counted.
    let expected: Vec<u8> = (1..=100_000)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    let mut r = req(&["seq", "1", "100000"]);
    r.max_output = 1000;
    let o = c.run_req(&r);
    assert_eq!(o.stdout, &expected[..500]);
    assert_eq!(o.stdout_tail, &expected[expected.len() - 500..]);
    assert_eq!(o.report().stdout.total_bytes, expected.len() as u64);
    assert!(o.report().stdout.truncated);

    // The same on stderr, with an odd budget.
    let mut r = req(&["sh", "-c", "seq 1 100000 >&2"]);
    r.max_output = 1001;
    let o = c.run_req(&r);
    assert_eq!(o.stderr, &expected[..501]);
    assert_eq!(o.stderr_tail, &expected[expected.len() - 500..]);
    assert_eq!(o.report().stderr.total_bytes, expected.len() as u64);
    assert!(o.report().stderr.truncated);
    assert_eq!(o.report().stdout.total_bytes, 0);

    // Large output within budget: all live, in frames of at most OUTPUT_CHUNK.
    let o = c.run(&["head", "-c", "300000", "/dev/zero"]);
    assert_eq!(o.stdout, vec![0u8; 300_000]);
    assert!(o.stdout_tail.is_empty());
    assert!(!o.report().stdout.truncated);
    assert!(o
        .frames
        .iter()
        .all(|f| f.kind != FrameKind::Stdout || f.payload.len() <= OUTPUT_CHUNK));
}

#[test]
fn timeout_kills_the_whole_tree() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    // A background child, and one that escaped into its own session.
    let mut r = req(&["sh", "-c", "sleep 100 & setsid sleep 101 & sleep 102"]);
    r.timeout_ms = Some(500);
    let t0 = Instant::now();
    let o = c.run_req(&r);
    let rep = o.report();
    assert!(rep.timed_out, "{rep:?}");
    assert_eq!(rep.signal, Some(9));
    assert!(!rep.oom_killed);
    assert!(
        rep.duration_us >= 500_000 && rep.duration_us < 3_000_000,
        "{rep:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));

    // Killed, and reaped: no sleep in any state (zombies included).
    std::thread::sleep(Duration::from_millis(300));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
}

#[test]
fn a_process_with_a_name_that_is_not_utf8_cannot_escape_a_timeout() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    let mut r = req(&[
        "sh",
        "-c",
        "setsid sh -c 'printf \"\\377\\376\" > /proc/self/comm; while :; do sleep 1; done' & sleep 100",
    ]);
    r.timeout_ms = Some(500);
    assert!(c.run_req(&r).report().timed_out);
    std::thread::sleep(Duration::from_millis(500));
    let o = c.sh("for d in /proc/[0-9]*; do cat $d/comm; done | od -c | grep -c '377' || true");
    assert_eq!(o.out(), "0\n", "a renamed process survived the timeout");
}

#[test]
fn background_children_do_not_hold_completion() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let t0 = Instant::now();
    let o = c.sh("sleep 100 & echo hi");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(o.out(), "hi\n");
    assert_eq!(o.report().exit_code, Some(0));
    assert!(!o.report().timed_out);

    // Output written just before exit is not lost to the early finish.
    let o = c.sh("sleep 100 & seq 1 20000");
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(o.out(), expected);
}

#[test]
fn reaps_zombies() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    // The sleep is orphaned to PID 1 and dies later: only PID 1 can reap it.
    assert_eq!(c.sh("sleep 0.1 & exit 0").report().exit_code, Some(0));
    assert_eq!(
        c.sh("(sleep 0.1 &) ; (sh -c 'exit 0' &)")
            .report()
            .exit_code,
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(800));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(stat, _)| stat.starts_with('Z')), "{ps:?}");
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
}

#[test]
fn oom_kill_is_attributed_and_the_sandbox_survives() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        memory_mib: 32,
        ..Opts::default()
    });
    let mut c = sb.raw_client();
    let ack = c.hello();
    assert!(
        ack.oom_counter == "v1" || ack.oom_counter == "v2",
        "Docker gives containers a memory cgroup: {ack:?}"
    );
    let o = c.run(&["dd", "if=/dev/zero", "of=/dev/null", "bs=100M", "count=1"]);
    let r = o.report();
    assert!(r.oom_killed, "{r:?}");
    assert_eq!(r.signal, Some(9));
    assert!(!r.timed_out);

    // A shell that outlives its OOM-killed child and exits with its
    // status (137) exited: that is its result, not an OOM kill of the
    // command.
    let o = c.sh("dd if=/dev/zero of=/dev/null bs=100M count=1; exit $?");
    assert_eq!(o.report().exit_code, Some(137));
    assert!(!o.report().oom_killed, "{:?}", o.report());

    // A plain SIGKILL is not an OOM kill.
    assert!(!c.sh("kill -9 $$").report().oom_killed);

    assert!(sb.running());
    assert_eq!(c.run(&["echo", "alive"]).out(), "alive\n");
}

#[test]
fn multiplexes_concurrent_commands() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    let t0 = Instant::now();
    let ids: Vec<u32> = (1..=6).collect();
    for &id in &ids {
        c.exec(
            id,
            &req(&[
                "sh",
                "-c",
                &format!("sleep 1; seq 1 {}; echo done{id}", id * 1000),
            ]),
        );
    }
    // Collect in reverse order: frames of the others must be kept meanwhile.
    for &id in ids.iter().rev() {
        let o = c.wait(id);
        let expected: String = (1..=id * 1000)
            .map(|i| format!("{i}\n"))
            .chain([format!("done{id}\n")])
            .collect();
        assert_eq!(o.out(), expected, "command {id}");
    }
    // Six one-second commands in well under six seconds.
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t0.elapsed()
    );

    // A duplicate id while the first runs is refused; the first is intact.
    c.exec(7, &req(&["sleep", "30"]));
    assert_eq!(c.next_frame(7).kind, FrameKind::Started);
    c.exec(7, &req(&["echo", "dup"]));
    assert!(c.expect_error(7).contains("already running"));
    c.send(&Frame::json(
        FrameKind::Signal,
        7,
        &SignalRequest { signal: 15 },
    ));
    assert_eq!(c.wait(7).report().signal, Some(15));
    // Once Exited arrived the id is free again.
    assert_eq!(c.run_with_id(7, &req(&["echo", "again"])).out(), "again\n");
}

#[test]
fn signals_reach_the_process_group() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    c.exec(1, &req(&["sh", "-c", "sleep 100; echo never"]));
    assert_eq!(c.next_frame(1).kind, FrameKind::Started);
    std::thread::sleep(Duration::from_millis(200));
    c.send(&Frame::json(
        FrameKind::Signal,
        1,
        &SignalRequest { signal: 2 },
    ));
    let o = c.wait(1);
    assert_eq!(o.report().signal, Some(2));
    assert!(o.out().is_empty());

    c.send(&Frame::json(
        FrameKind::Signal,
        1,
        &SignalRequest { signal: 2 },
    ));
    assert!(c.stash_of(1).is_empty(), "an answer after Exited");
    c.exec(2, &req(&["sleep", "10"]));
    c.send(&Frame::json(
        FrameKind::Signal,
        2,
        &SignalRequest { signal: 999 },
    ));
    assert_eq!(c.next_frame(2).kind, FrameKind::Started);
    assert!(c.expect_error(2).contains("invalid signal"));
    c.send(&Frame::json(
        FrameKind::Signal,
        2,
        &SignalRequest { signal: 9 },
    ));
    assert_eq!(c.wait(2).report().signal, Some(9));
}

#[test]
fn protocol_errors_are_answered() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.raw_client();

    // Wrong version: the answer carries the agent's version, no session.
    let ack = c.hello_with(PROTOCOL_VERSION + 1);
    assert_eq!(ack.protocol, PROTOCOL_VERSION);
    c.send(&Frame::new(FrameKind::Exec, 3, b"{}".to_vec()));

    // Sync bytes followed by anything but a Hello: ignored, hunting goes on.
    let mut junk = corral_core::protocol::SYNC.to_vec();
    Frame::new(FrameKind::Ping, 0, b"x".to_vec()).encode_into(&mut junk);
    c.send_raw(&junk);

    // After the handshake: bad frames are answered and the session goes on.
    c.hello();
    assert!(
        c.stash_of(3).is_empty(),
        "an Exec after a refused Hello was served"
    );
    c.send(&Frame::new(FrameKind::Ping, 42, vec![0, 255, 1]));
    let pong = c.next_frame(42);
    assert_eq!(
        (pong.kind, pong.payload),
        (FrameKind::Pong, vec![0, 255, 1])
    );
    c.send(&Frame::new(FrameKind::Exec, 5, b"{not json".to_vec()));
    assert!(c.expect_error(5).contains("bad payload"));
    c.send(&Frame::new(FrameKind::Started, 6, b"{}".to_vec()));
    assert!(c.expect_error(6).contains("not accepted"));
    c.send(&Frame::json(
        FrameKind::Hello,
        0,
        &Hello {
            protocol: PROTOCOL_VERSION,
            session: "no-sync".into(),
            env: Vec::new(),
            restored: false,
        },
    ));
    assert!(c.expect_error(0).contains("sync"));
    assert_eq!(c.run(&["echo", "still"]).out(), "still\n");

    // A broken header loses framing: an Error, then nothing is served until
    // a new session starts.
    c.send_raw(&[200, 0, 0, 0, 9, 0, 0, 0, 0]);
    assert!(c.expect_error(0).contains("unknown frame kind"));
    c.send(&Frame::new(FrameKind::Ping, 77, b"lost".to_vec()));
    c.hello();
    assert_eq!(c.run(&["echo", "fine"]).out(), "fine\n");
    assert!(
        c.stash_of(77).is_empty(),
        "a frame sent while framing was lost was served"
    );

    // Half a frame left by a controller whose stream broke: dropped after
    // the agent's stall limit, and the next session works.
    c.send_raw(&[FrameKind::Exec as u8, 0, 0, 0, 8, 0, 0, 0, 200, b'{']);
    std::thread::sleep(Duration::from_millis(2500));
    c.hello();
    assert_eq!(c.run(&["echo", "resynced"]).out(), "resynced\n");
}

#[test]
fn the_sessions_environment_reaches_every_command_under_its_own() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    let image_path = c.sh("echo $PATH").out();
    assert!(image_path.len() > 1, "{image_path:?}");

    let mut c = sb.raw_client();
    c.hello_env(&[("API_KEY", "from-hello"), ("HOME", "/tmp")]);
    // On top of the agent's own environment (the image's PATH still finds
    // programs), with `~` expanding to the sandbox's HOME.
    let mut r = req(&["sh", "-c", "echo $API_KEY:$HOME:$PATH; pwd"]);
    r.cwd = Some("~".into());
    assert_eq!(
        c.run_req(&r).out(),
        format!("from-hello:/tmp:{}/tmp\n", image_path)
    );
    // A command's own variable wins, and its HOME is its `~`.
    let mut r = req(&["sh", "-c", "echo $API_KEY; pwd"]);
    r.env = vec![
        ("API_KEY".into(), "mine".into()),
        ("HOME".into(), "/proc".into()),
    ];
    r.cwd = Some("~".into());
    assert_eq!(c.run_req(&r).out(), "mine\n/proc\n");

    // A new session brings its own environment; nothing of the old stays.
    c.hello_env(&[("OTHER", "o")]);
    assert_eq!(c.sh("echo \"[$API_KEY]$OTHER\"").out(), "[]o\n");
}

#[test]
fn a_new_session_ends_the_old_sessions_commands() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut old = sb.client();
    old.exec(
        1,
        &req(&["sh", "-c", "sleep 1234 & setsid sleep 1235 & sleep 1236"]),
    );
    assert_eq!(old.next_frame(1).kind, FrameKind::Started);
    std::thread::sleep(Duration::from_millis(300));
    assert!(processes(&mut old)
        .iter()
        .any(|(_, c)| c.contains("sleep 1236")));
    old.kill();

    // corral re-attaching after its stream broke.
    let mut new = sb.client();
    let t0 = Instant::now();
    loop {
        let ps = processes(&mut new);
        if !ps.iter().any(|(_, c)| c.contains("sleep 123")) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "left running: {ps:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The killed command of the old session reports nothing to the new one.
    assert!(new.stash_of(1).is_empty(), "{:?}", new.stash_of(1));
    assert!(sb.running());
}

#[test]
fn dead_man_switch_stops_an_abandoned_sandbox() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        grace_ms: 3000,
        ..Opts::default()
    });
    let mut c = sb.client();
    c.exec(1, &req(&["sleep", "1000"]));
    assert_eq!(c.next_frame(1).kind, FrameKind::Started);
    // Well past the grace, but corral keeps pinging: nothing happens.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(500));
        c.ping();
    }
    assert!(sb.running());

    c.kill();
    let took = sb
        .wait_stopped(Duration::from_secs(15))
        .expect("the sandbox stops after the grace");
    assert!(
        took >= Duration::from_millis(2000),
        "stopped before the grace: {took:?}"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert_eq!(sb.exit_code(), "0");
    assert!(sb.logs().contains("nothing from corral"), "{}", sb.logs());

    // Never attached at all: counted from the agent's start.
    let idle = Sandbox::start(Opts {
        grace_ms: 1500,
        ..Opts::default()
    });
    let took = idle
        .wait_stopped(Duration::from_secs(15))
        .expect("an unclaimed sandbox stops");
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

#[test]
fn commands_cannot_keep_the_dead_man_switch_alive() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        grace_ms: 3000,
        ..Opts::default()
    });
    let mut c = sb.client();
    // A background job that tries every way in: PID 1's stdin, the old
    // abstract socket, signals to PID 1.
    let attack = "( while :; do \
        printf x > /proc/1/fd/0 2>/dev/null; \
        echo x | nc local:@corral-agent 2>/dev/null; \
        kill -CONT 1 2>/dev/null; \
        sleep 0.2; done ) >/dev/null 2>&1 &";
    assert_eq!(c.sh(attack).report().exit_code, Some(0));
    c.kill();
    let took = sb
        .wait_stopped(Duration::from_secs(20))
        .expect("the switch fires although a command keeps trying");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn signals_from_inside_do_not_stop_the_agent() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    for sig in ["TERM", "INT", "HUP", "QUIT", "USR1", "KILL", "STOP"] {
        let o = c.sh(&format!("kill -{sig} 1; echo sent"));
        assert_eq!(o.out(), "sent\n", "kill -{sig} 1: {o:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(sb.running());
    assert_eq!(c.run(&["echo", "alive"]).out(), "alive\n");
    // Stopping from outside still works (SIGTERM forwarded, then the
    // daemon's SIGKILL).
    sb.stop(1);
    assert!(!sb.running());
}

#[test]
fn docker_stop_forwards_sigterm_and_the_daemon_ends_the_sandbox() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    c.exec(1, &req(&["sleep", "1000"]));
    assert_eq!(c.next_frame(1).kind, FrameKind::Started);
    // A process that ignores SIGTERM lives until the daemon's SIGKILL.
    c.exec(
        2,
        &req(&["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]),
    );
    assert_eq!(c.next_frame(2).kind, FrameKind::Started);
    std::thread::sleep(Duration::from_millis(300));

    // The agent forwards SIGTERM but does not stop on it (a command could
    // forge one): the daemon kills the sandbox after the stop timeout.
    let took = sb.stop(2);
    assert!(took < Duration::from_secs(8), "docker stop took {took:?}");
    assert_eq!(sb.exit_code(), "137");
    // The report of the command the forwarded SIGTERM ended still arrived.
    let o = c.wait(1);
    assert_eq!(o.report().signal, Some(15));
}

#[test]
fn runs_in_an_image_without_anything() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        image: "corral-test/scratch",
        ..Opts::default()
    });
    let mut c = sb.client();
    let o = c.run(&[support::AGENT_IN_CONTAINER, "--version"]);
    assert_eq!(
        o.out(),
        format!("corral-agent {}\n", env!("CARGO_PKG_VERSION"))
    );
    let msg = c
        .run(&["sh", "-c", "true"])
        .spawn_error
        .expect("no shell here");
    assert!(msg.contains("\"sh\""), "{msg}");
}

#[test]
fn statuses_go_to_the_right_command_under_load() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    // Rounds of concurrent commands that exit at once, mixed with exec
    // failures (std reaps those itself, racing the agent's reaper if the
    // agent got that wrong) and orphan-producing shells.
    for round in 0..5u32 {
        let ids: Vec<u32> = (1..=40).map(|i| round * 100 + i).collect();
        for &id in &ids {
            let argv: Vec<String> = match id % 4 {
                0 => vec!["no-such-binary".into()],
                1 => vec!["sh".into(), "-c".into(), format!("exit {}", id % 256)],
                2 => vec!["sh".into(), "-c".into(), format!("true & echo {id}")],
                _ => vec!["true".into()],
            };
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            c.exec(id, &req(&argv));
        }
        for &id in &ids {
            let o = c.wait(id);
            match id % 4 {
                0 => assert!(o.spawn_error.is_some(), "{id}: {o:?}"),
                1 => assert_eq!(o.report().exit_code, Some((id % 256) as i32), "{id}"),
                2 => assert_eq!(o.out(), format!("{id}\n")),
                _ => assert_eq!(o.report().exit_code, Some(0), "{id}"),
            }
        }
    }
    // Sequential round trips stay fast (no hidden poll or reaper delays).
    let t0 = Instant::now();
    for _ in 0..50 {
        assert_eq!(c.run(&["true"]).report().exit_code, Some(0));
    }
    let per = t0.elapsed() / 50;
    eprintln!("round trip of `true`: {per:?}");
    assert!(per < Duration::from_millis(100), "{per:?} per command");
    assert!(sb.running());
}

#[test]
fn other_signals_are_forwarded_without_stopping() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();
    c.exec(
        1,
        &req(&[
            "sh",
            "-c",
            "trap 'echo usr1; exit 0' USR1; while :; do sleep 0.1; done",
        ]),
    );
    assert_eq!(c.next_frame(1).kind, FrameKind::Started);
    std::thread::sleep(Duration::from_millis(300));
    sb.kill_signal("USR1");
    let o = c.wait(1);
    assert_eq!(o.out(), "usr1\n");
    assert_eq!(o.report().exit_code, Some(0));
    // The agent is still there and still serving.
    std::thread::sleep(Duration::from_millis(300));
    assert!(sb.running());
    assert_eq!(c.run(&["echo", "still"]).out(), "still\n");
}

#[test]
fn works_as_an_unprivileged_user_on_a_read_only_root() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        grace_ms: 2000,
        user: Some("1000:1000"),
        read_only: true,
        tmpfs: vec!["/tmp"],
        mount_agent: true,
        ..Opts::default()
    });
    let mut c = sb.client();
    assert_eq!(c.run(&["id", "-u"]).out(), "1000\n");
    assert_ne!(c.run(&["touch", "/x"]).report().exit_code, Some(0));
    assert_eq!(c.sh("echo hi > /tmp/f && cat /tmp/f").out(), "hi\n");
    let mut r = req(&["sh", "-c", "sleep 100 & sleep 100"]);
    r.timeout_ms = Some(300);
    assert!(c.run_req(&r).report().timed_out);
    std::thread::sleep(Duration::from_millis(300));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
    c.kill();
    assert!(sb.wait_stopped(Duration::from_secs(10)).is_some());
}
