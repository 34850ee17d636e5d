//! The runtime over the real agent as a local process: commands, limits,
//! shells and files, as a user sees them.

mod common;

use std::time::{Duration, Instant};

use common::{harness, spec, within};
use corral::{CommandSpec, EnvVar, FailureKind, FileError, FileOptions};

const T: Duration = Duration::from_secs(10);

#[tokio::test]
async fn echo_exit_code_stdin_and_env() {
    let h = harness();
    let mut s = spec();
    s.env.push(EnvVar::Set {
        name: "GREETING".into(),
        value: "hello".into(),
    });
    within(T, async {
        let sb = h.runtime.create(&s).await.expect("create");
        let r = sb.run(&CommandSpec::shell("echo $GREETING; exit 3")).await;
        assert!(r.failure.is_none(), "{:?}", r.failure);
        assert_eq!(r.stdout, b"hello\n");
        assert_eq!(r.exit_code, Some(3));

        let r = sb
            .run(&CommandSpec::shell("cat; echo err >&2").stdin("abc"))
            .await;
        assert_eq!(r.stdout, b"abc");
        assert_eq!(r.stderr, b"err\n");
        assert_eq!(r.exit_code, Some(0));

        // PID 1 of its own namespace: the agent, and nothing of the host.
        let r = sb
            .run(&CommandSpec::shell(
                "cat /proc/1/comm; ls -d /proc/[0-9]* | wc -l",
            ))
            .await;
        let out = String::from_utf8_lossy(&r.stdout).to_string();
        assert!(out.starts_with("corral-agent\n"), "{out}");
        sb.destroy().await.expect("destroy");
    })
    .await;
    assert_eq!(h.backend.count(), 0, "destroy leaves nothing");
}

#[tokio::test]
async fn timeout_kills_the_whole_tree() {
    let h = harness();
    within(T, async {
        let sb = h.runtime.create(&spec()).await.expect("create");
        let t = Instant::now();
        let r = sb
            .run(
                &CommandSpec::shell("sleep 30 & sleep 31 & sleep 32")
                    .timeout(Duration::from_millis(300)),
            )
            .await;
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let f = r.failure.expect("a timeout failure");
        assert_eq!(f.kind, FailureKind::Timeout, "{f}");
        // Killed is not yet reaped: under load a sleep may still show (as a
        // zombie or mid-exit) for a moment. One that survives stays.
        let count = "n=0; while [ $n -lt 50 ]; do \
             c=$(for p in /proc/[0-9]*/comm; do cat $p; done 2>/dev/null | grep -c '^sleep$'); \
             [ \"$c\" = 0 ] && break; n=$((n+1)); sleep 0.1; done; echo $c";
        let r = sb.run(&CommandSpec::shell(count)).await;
        assert_eq!(
            String::from_utf8_lossy(&r.stdout).trim(),
            "0",
            "a sleep survived the timeout"
        );
        sb.destroy().await.expect("destroy");
    })
    .await;
}

#[tokio::test]
async fn output_is_capped_with_head_and_tail() {
    let h = harness();
    within(T, async {
        let sb = h.runtime.create(&spec()).await.expect("create");
        let r = sb
            .run(&CommandSpec::shell("head -c 200000 /dev/zero | tr '\\0' x").max_output(1000))
            .await;
        assert!(r.failure.is_none(), "{:?}", r.failure);
        assert!(r.stdout_truncated);
        assert_eq!(r.stdout_total_bytes, 200_000);
        assert!(r.stdout.len() <= 1000, "kept {} bytes", r.stdout.len());
        sb.destroy().await.expect("destroy");
    })
    .await;
}

#[tokio::test]
async fn a_shell_session_keeps_cwd_and_env() {
    let h = harness();
    within(T, async {
        let sb = h.runtime.create(&spec()).await.expect("create");
        let sh = sb.shell("main");
        let r = sh
            .run("cd /proc/self && export CORRAL_X=kept", None, 4096)
            .await;
        assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result.failure);
        let r = sh
            .run("pwd -P >/dev/null; echo \"$PWD $CORRAL_X\"", None, 4096)
            .await;
        assert_eq!(
            String::from_utf8_lossy(&r.result.stdout),
            "/proc/self kept\n"
        );
        assert!(!r.restarted);
        sb.destroy().await.expect("destroy");
    })
    .await;
}

#[tokio::test]
async fn files_round_trip_and_not_found_is_typed() {
    let h = harness();
    within(T, async {
        let sb = h.runtime.create(&spec()).await.expect("create");
        // The sandbox's working directory is a per-sandbox host directory.
        let r = sb.run(&CommandSpec::shell("pwd")).await;
        let dir = String::from_utf8_lossy(&r.stdout).trim().to_string();
        assert!(dir.contains("corral-local-"), "{dir}");
        let path = format!("{dir}/data.bin");
        let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let opts = FileOptions::default();
        sb.write_file(&path, &bytes, &opts).await.expect("write");
        assert_eq!(sb.read_file(&path, &opts).await.expect("read"), bytes);
        let missing = sb.read_file(&format!("{dir}/missing"), &opts).await;
        assert!(
            matches!(missing, Err(FileError::NotFound { .. })),
            "{missing:?}"
        );
        sb.destroy().await.expect("destroy");
        assert!(
            !std::path::Path::new(&dir).exists(),
            "the directory is removed"
        );
    })
    .await;
}
