//! The trust boundary, attacked from inside real sandboxes: a command tries
//! to forge results (its own, and a later command's), to reach PID 1's
//! stdio and memory, to learn command ids, and to stop the agent. Each test
//! runs the attack and checks what corral reports. One set of cases, run
//! under each isolation tier: `trust.rs` (runc) and `trust_gvisor.rs`
//! instantiate it with their [`super::ISOLATION`].

use std::time::Duration;

use super::common::{self, backend, Guard, BUSYBOX};
use super::ISOLATION;
use corral_core::{CommandSpec, FailureKind, Isolation, SandboxSpec};

/// Cases that fail under gVisor, and why: a run prints each as skipped
/// with its reason. The forging cases ran here once too: gVisor's procfs
/// let a root command reopen PID 1's pipes through `/proc/1/fd`, until
/// the agent moved behind a door (corral-agent's `door`).
const BROKEN_UNDER_GVISOR: &[(&str, &str)] = &[(
    "trust-oom-verdict",
    "gVisor charges memory to the whole sandbox: a helper's OOM stops the sandbox, \
         typed oom_killed (contract_gvisor.rs asserts it)",
)];

/// The test's guard, or `None` (the test is skipped, saying why) when
/// this daemon cannot run the tier or the case is known not to hold
/// under it.
fn guard(name: &str) -> Option<Guard> {
    use std::io::Write;
    if ISOLATION == Isolation::Gvisor {
        if let Some((_, why)) = BROKEN_UNDER_GVISOR.iter().find(|(n, _)| *n == name) {
            // Straight to stderr: a skip must be seen.
            let _ = writeln!(std::io::stderr(), "skipped {name} under gVisor: {why}");
            return None;
        }
    }
    common::tier_available(ISOLATION, name)
        .then(|| Guard::new(&format!("{name}-{}", ISOLATION.as_str())))
}

/// The hardened busybox spec of `g`, under the tier.
fn spec(g: &Guard) -> SandboxSpec {
    let mut spec = g.spec(BUSYBOX);
    spec.isolation = ISOLATION;
    spec
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Shell functions that write protocol frames (kind, id, payload) to a
/// file, and a `forge` that writes a fake "all tests passed" + exit 0 for
/// every command id it can guess into every stream it can open: PID 1's
/// stdout, and the stdout of any relay process it finds (stopping the relay
/// first so its own writes do not interleave). Ids come from the agent's
/// thread names when they show them, else ids 1..40 are all tried.
const FORGER: &str = include_str!("../attacks/forge-frames.sh");

#[tokio::test(flavor = "multi_thread")]
async fn a_command_cannot_forge_its_own_result() {
    let Some(g) = guard("trust-forge-own") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    let r = sb
        .run(&sh(&format!(
            "{FORGER}\necho '3 tests FAILED'; forge; exit 1"
        )))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(1), "forged exit code: {r:?}");
    let out = text(&r.stdout);
    assert_eq!(out, "3 tests FAILED\n", "forged output: {out:?}");
    // The attack ran and was refused by the kernel, not skipped.
    let err = text(&r.stderr);
    assert!(
        err.contains("forge: cannot write /proc/1/fd/1"),
        "the forger did not try PID 1's stdout: {err}"
    );
    // The stream is intact: the sandbox goes on.
    let r = sb.run(&sh("echo fine")).await;
    assert_eq!((r.exit_code, text(&r.stdout)), (Some(0), "fine\n".into()));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_process_cannot_forge_a_later_commands_result() {
    let Some(g) = guard("trust-forge-later") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    // The rollout leaves a forger behind that keeps trying for 5 s...
    let r = sb
        .run(&sh(&format!(
            "{FORGER}\n( end=$(($(date +%s)+5)); while [ $(date +%s) -lt $end ]; do forge; done ) >/dev/null 2>&1 &\necho planted"
        )))
        .await;
    assert_eq!(text(&r.stdout), "planted\n", "{r:?}");
    // ...while the grader runs and fails.
    for _ in 0..3 {
        let r = sb.run(&sh("sleep 1; echo '3 tests FAILED'; exit 1")).await;
        assert_eq!(r.failure, None, "{r:?}");
        assert_eq!(r.exit_code, Some(1), "forged grader result: {r:?}");
        assert_eq!(text(&r.stdout), "3 tests FAILED\n", "{r:?}");
    }
    // File reads travel the same path and are not forged either.
    sb.write_file("/tmp/grade", b"FAIL\n", &Default::default())
        .await
        .expect("write");
    let bytes = sb
        .read_file("/tmp/grade", &Default::default())
        .await
        .expect("read");
    assert_eq!(bytes, b"FAIL\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn pid1_is_out_of_reach_of_commands() {
    let Some(g) = guard("trust-pid1") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    let probe = |path: &str| {
        format!("if cat {path} >/dev/null 2>&1; then echo '{path} open'; else echo '{path} refused'; fi")
    };
    let script = [
        probe("/proc/1/mem"),
        probe("/proc/1/environ"),
        "if readlink /proc/1/fd/1 >/dev/null 2>&1; then echo 'fd open'; else echo 'fd refused'; fi".into(),
        "if printf junk > /proc/1/fd/0 2>/dev/null; then echo 'stdin open'; else echo 'stdin refused'; fi".into(),
        "if printf junk > /proc/1/fd/1 2>/dev/null; then echo 'stdout open'; else echo 'stdout refused'; fi".into(),
        // Command ids in thread names, and a socket to connect to.
        "cat /proc/1/task/*/comm | grep -c '[0-9]' || true".into(),
        "grep -c corral /proc/net/unix || true".into(),
    ]
    .join("\n");
    let r = sb.run(&sh(&script)).await;
    assert_eq!(r.failure, None, "{r:?}");
    // gVisor's procfs ignores PID 1's non-dumpable flag for `environ` (the
    // image's variables, which every command has) and the names of its
    // descriptors (sockets, which cannot be opened through /proc).
    let (environ, fd) = match ISOLATION {
        Isolation::Gvisor => ("open", "open"),
        _ => ("refused", "refused"),
    };
    assert_eq!(
        text(&r.stdout),
        format!("/proc/1/mem refused\n/proc/1/environ {environ}\nfd {fd}\nstdin refused\nstdout refused\n0\n0\n"),
        "{r:?}"
    );
    // Nothing got through to the control stream.
    let r = sb.run(&sh("echo fine")).await;
    assert_eq!((r.failure, text(&r.stdout)), (None, "fine\n".into()));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn signalling_pid1_cannot_turn_a_failure_into_a_lost_container() {
    let Some(g) = guard("trust-signals") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    // A failing rollout tries to take the sandbox down with it, hoping to be
    // reported as container_lost (retryable) instead of its own exit code.
    let r = sb
        .run(&sh(
            "for s in TERM INT HUP QUIT KILL STOP; do kill -$s 1; done; sleep 1; exit 3",
        ))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    // Refused by the agent's filter, not dropped by the kernel (gVisor
    // would deliver them): every one of the six is answered EPERM.
    let err = text(&r.stderr);
    assert_eq!(
        err.matches("can't kill pid 1: Operation not permitted")
            .count(),
        6,
        "the signals to PID 1 were not all refused: {err}"
    );
    let r = sb.run(&sh("echo alive")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "alive\n");
    assert_eq!(sb.state().await.expect("state").status, "running");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_shell_job_is_bounded_and_counted() {
    let Some(g) = guard("trust-shell-flood") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    let shell = sb.shell("main");
    // A background job prints as fast as it can between commands.
    let r = shell
        .run(
            "( yes flood-flood-flood & p=$!; sleep 2; kill $p ) & echo started",
            None,
            1 << 20,
        )
        .await;
    assert_eq!(r.result.failure, None, "{r:?}");
    assert!(!r.trusted, "shell results are never marked trusted");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = shell.run("echo next", None, 1 << 20).await;
    assert_eq!(r.result.failure, None, "{r:?}");
    // The flood from between the commands is dropped and counted (far more
    // than the 1 MiB corral keeps queued), not attributed to this command.
    assert!(
        r.dropped_between_bytes > 4 << 20,
        "dropped {}",
        r.dropped_between_bytes
    );
    let out = text(&r.result.stdout);
    assert_eq!(out, "next\n", "{}", &out[out.len().saturating_sub(200)..]);
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_results_are_marked_untrusted_because_they_can_be_faked() {
    let Some(g) = guard("trust-shell-fake") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    let shell = sb.shell("main");
    // A command can rewrite what reports the next command's exit code.
    let _ = shell
        .run("__corral_run() { command eval \"$__corral_cmd\" </dev/null >/dev/null 2>&1; return 0; }", None, 1 << 10)
        .await;
    let r = shell
        .run("echo '3 tests FAILED'; false", None, 1 << 10)
        .await;
    assert_eq!(r.result.exit_code, Some(0), "the fake worked: {r:?}");
    assert!(!r.trusted);
    // The plain exec path is not fooled.
    let r = sb.run(&sh("echo '3 tests FAILED'; exit 1")).await;
    assert_eq!(r.exit_code, Some(1));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_killed_from_outside_is_still_lost_not_hidden() {
    // Stopping from outside keeps its meaning: `docker stop` (SIGTERM,
    // forwarded to the commands, then the daemon's SIGKILL) is a lost
    // container, retryable, as before.
    let Some(g) = guard("trust-outside-kill") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    common::docker(&["stop", "-t", "1", &sb.container_id()]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = sb.run(&sh("echo hi")).await;
    let f = r.failure.expect("stopped from outside");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    assert!(f.retryable());
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// Starts a plain container whose PID 1 is the test double of the agent
/// (`attacks/double-agent.sh`) misbehaving as `scenario`, labelled like a
/// sandbox of this test process; returns its id.
fn start_double_agent(g: &Guard, scenario: &str) -> String {
    let script = format!("{FORGER}\n{}", include_str!("../attacks/double-agent.sh"));
    let owner = corral::host::this_owner();
    let mut args = vec![
        "run".to_string(),
        "-d".into(),
        "-i".into(),
        "--log-driver".into(),
        "none".into(),
        "--label".into(),
        format!("corraltest={}", g.name),
        "--label".into(),
        format!("corral.sandbox=double-{scenario}"),
    ];
    for (k, v) in owner.labels() {
        args.push("--label".into());
        args.push(format!("{k}={v}"));
    }
    if ISOLATION == Isolation::Gvisor {
        args.extend(["--runtime".into(), corral_core::spec::GVISOR_RUNTIME.into()]);
    }
    args.extend([
        "--entrypoint".into(),
        "sh".into(),
        BUSYBOX.into(),
        "-c".into(),
        script,
        "double".into(),
        scenario.into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = common::docker(&args).trim().to_string();
    assert_eq!(id.len(), 64, "docker run failed: {id:?}");
    id
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_violations_fail_typed_and_finish_the_sandbox() {
    let Some(g) = guard("trust-violations") else {
        return;
    };
    let b = backend().await;
    for scenario in ["unknown-id", "exit-first", "after-exit"] {
        let cid = start_double_agent(&g, scenario);
        let sb = b
            .adopt(
                &corral::Placement(cid.clone()),
                &format!("double-{scenario}"),
                &spec(&g),
            )
            .await
            .expect("the double completes the handshake");
        let first = sb.run(&sh("echo '3 tests FAILED'; exit 1")).await;
        // After Exited, the trailing frame can only fail what comes next.
        if scenario != "after-exit" {
            let f = first.failure.clone().unwrap_or_else(|| {
                panic!("{scenario}: a violating stream gave a result: {first:?}")
            });
            assert_eq!(f.kind, FailureKind::ProtocolViolation, "{scenario}: {f}");
            assert!(!f.retryable());
            assert!(
                !text(&first.stdout).contains("passed"),
                "{scenario}: {first:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let next = sb.run(&sh("true")).await;
        let f = next.failure.expect("the sandbox is finished");
        assert_eq!(f.kind, FailureKind::ProtocolViolation, "{scenario}: {f}");
        assert!(sb.dead().is_some(), "{scenario}: not marked dead");
        sb.destroy().await.expect("destroy");
    }
    g.assert_clean();
}

/// Compiles `attacks/<name>.c` statically on the host (the sandbox image
/// has no compiler; a rollout would bring its own binary).
fn compile_attack(name: &str) -> Vec<u8> {
    let src = format!("{}/tests/attacks/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("corral-attack-{name}-{}", std::process::id()));
    let status = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("these tests compile their attack programs with gcc");
    assert!(status.success(), "compiling {src} failed");
    let bytes = std::fs::read(&out).expect("compiled attack");
    let _ = std::fs::remove_file(&out);
    bytes
}

/// Puts the compiled attack `name` into the sandbox at `path`, executable.
async fn upload_attack(sb: &corral::Sandbox, name: &str, path: &str) {
    let opts = corral::FileOptions {
        mode: Some(0o755),
        ..Default::default()
    };
    sb.write_file(path, &compile_attack(name), &opts)
        .await
        .expect("upload");
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_cannot_limit_starve_trace_or_stop_the_agent() {
    let Some(g) = guard("trust-reach-pid1") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    upload_attack(&sb, "reach-pid1", "/tmp/reach").await;
    let r = sb.run(&sh("trap '' TERM; /tmp/reach")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    let out = text(&r.stdout);
    for name in [
        "prlimit-cpu",
        "prlimit-x32",
        "prlimit-sigpending",
        "sched-idle",
        "sched-affinity",
        "nice-pid1",
        "nice-user",
        "ioprio-pid1",
        "ptrace-seize",
        "process-vm-readv",
    ] {
        assert!(out.contains(&format!("{name} refused\n")), "{name}: {out}");
    }
    assert!(out.contains("nice-self ALLOWED\n"), "{out}");
    assert!(out.contains("sched-other-own-tid ALLOWED\n"), "{out}");
    // The forged SIGTERM (no sender details, like docker stop) is refused
    // by the filter (rt_sigqueueinfo to PID 1) before the agent's own check
    // of the sender would see it: the sandbox goes on and reports the next
    // command.
    assert!(out.contains("forged-sigterm sent=0"), "{out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sb.state().await.expect("state").status, "running");
    let r = sb.run(&sh("echo '3 tests FAILED'; exit 1")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(
        (r.exit_code, text(&r.stdout)),
        (Some(1), "3 tests FAILED\n".into())
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exclusive_grader_cannot_be_tampered_with_by_leftovers() {
    let Some(g) = guard("trust-exclusive") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    // The rollout leaves a process that writes into the stdout of every
    // process it can reach (same user, so it can open /proc/PID/fd/1).
    let plant = "( while :; do for f in /proc/[0-9]*/fd/1; do echo 'ALL TESTS PASSED' > $f; done 2>/dev/null; sleep 0.05; done ) >/dev/null 2>&1 & echo planted";
    // The planted loop may already write into this very command's stdout
    // before it returns (it reaches every fd 1): only its start matters.
    let planted = text(&sb.run(&sh(plant)).await.stdout);
    // Each echo is one write, so lines stay whole; the loop's first one may
    // come before this command's own (seen under load).
    assert!(planted.lines().any(|l| l == "planted"), "{planted:?}");
    let grader = "sleep 1; echo '3 tests FAILED'; exit 1";
    // Without exclusive the leftover gets text into the grader's output (the
    // exit code stays real): this is what exclusive is for.
    let r = sb.run(&sh(grader)).await;
    assert_eq!(r.exit_code, Some(1));
    assert!(
        text(&r.stdout).contains("ALL TESTS PASSED"),
        "the attack did not reach the grader: {r:?}"
    );
    // Exclusive: every other process is killed first; output is the
    // grader's alone.
    let r = sb.run(&sh(grader).exclusive()).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(1));
    assert_eq!(text(&r.stdout), "3 tests FAILED\n", "{r:?}");
    // Nothing of the planted loop is left (counting processes raced with
    // the pipeline's own forks: look for the loop itself).
    let r = sb.run(&sh("ps -o args=")).await;
    let ps = text(&r.stdout);
    assert!(
        !ps.contains("planted") && !ps.contains("sleep 0.05"),
        "a leftover survived the exclusive grader: {ps}"
    );
    // Nor does a rollout's change to PID 1 (an OOM score that would make
    // the agent the victim of the grader's allocations) reach the grader.
    let r = sb.run(&sh("echo 1000 > /proc/1/oom_score_adj")).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = sb.run(&sh("cat /proc/1/oom_score_adj").exclusive()).await;
    assert_eq!(text(&r.stdout), "0\n", "{r:?}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_cannot_stop_the_agent_by_a_thread_and_answer_for_it() {
    let Some(g) = guard("trust-tkill-hijack") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    upload_attack(&sb, "tkill-hijack", "/tmp/hijack").await;
    // The rollout leaves a process that, a second later, SIGSTOPs one of
    // PID 1's threads (not the main one) and takes over PID 1's stdin and
    // stdout through /proc/1/fd to answer the grader's Exec itself.
    let r = sb
        .run(&sh(
            "setsid /tmp/hijack 1000 >/tmp/hijack.log 2>&1 </dev/null & echo planted",
        ))
        .await;
    assert_eq!(text(&r.stdout), "planted\n", "{r:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The grader fails, and carries a secret.
    let r = sb
        .run(
            &sh("echo '3 tests FAILED'; exit 1")
                .env("GRADER_SECRET", "s3cr3t-grader-key")
                .exclusive(),
        )
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(1), "forged grader result: {r:?}");
    assert_eq!(text(&r.stdout), "3 tests FAILED\n", "{r:?}");
    // The attack ran and the kernel refused it: no thread of PID 1 could
    // be stopped (another uid's), nothing captured. Under runc neither
    // descriptor opens either (PID 1 is non-dumpable, and another uid's);
    // gVisor's procfs checks only the file's own mode, and the engine's
    // pipes are root's: the trust-forge cases say what that still allows.
    let r = sb
        .run(&sh(
            "cat /tmp/hijack.log; cat /tmp/captured 2>/dev/null; true",
        ))
        .await;
    let log = text(&r.stdout);
    assert!(log.contains("tkill refused\n"), "{log}");
    assert!(!log.contains(" sent\n"), "{log}");
    if ISOLATION == Isolation::Container {
        assert!(
            log.contains("fd0 refused") && log.contains("fd1 refused"),
            "{log}"
        );
    }
    assert!(!log.contains("forged"), "{log}");
    assert!(
        !log.contains("s3cr3t"),
        "the grader's secret was taken: {log}"
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// Probes every relay and the agent from a command (`attacks/reach-relay.sh`).
const REACH_RELAY: &str = include_str!("../attacks/reach-relay.sh");

#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_cannot_stop_or_speak_for_a_code_contexts_relay() {
    let Some(g) = guard("trust-relay") else {
        return;
    };
    let b = backend().await;
    let mut spec = spec(&g);
    spec.image = "corral-test/python".into();
    let sb = b.create(&spec).await.expect("create");
    let run = |code: &'static str| {
        let sb = sb.clone();
        async move {
            let mut out = String::new();
            let r = sb
                .run_code(None, &corral::RunCode::new(code), |e| {
                    if let corral::CodeEvent::Stdout { text } = e {
                        out.push_str(&text);
                    }
                })
                .await
                .expect("run_code");
            assert_eq!(r.failure, None, "{r:?}");
            out
        }
    };
    assert_eq!(run("x = 40 + 2; print(x)").await, "42\n");
    // A command's leftover probes the relay (and the agent) while the
    // context lives, and keeps at it across the next execution.
    let r = sb
        .run(&sh(&format!(
            "( for i in 1 2 3; do {{ {REACH_RELAY}\n}} >/tmp/reach.$i 2>&1; sleep 0.5; done; touch /tmp/reach.done ) </dev/null >/dev/null 2>&1 & echo planted"
        )))
        .await;
    assert_eq!(text(&r.stdout), "planted\n", "{r:?}");
    assert_eq!(run("print(x + 1)").await, "43\n");
    let log = text(
        &sb.run(&sh(
            "for i in $(seq 300); do [ -e /tmp/reach.done ] && break; sleep 0.1; done; cat /tmp/reach.1 /tmp/reach.3",
        ))
        .await
        .stdout,
    );
    // The relay runs under a uid of its own (corral's relay range), its
    // kernel as the commands' user (root).
    assert!(log.contains("relay uid 655"), "{log}");
    assert!(log.contains("kernel uid 0\n"), "{log}");
    for refused in [
        "relay stop refused",
        "relay fd0 refused",
        "relay fd1 refused",
    ] {
        assert_eq!(log.matches(refused).count(), 2, "{refused}: {log}");
    }
    assert!(!log.contains("relay stop sent"), "{log}");
    assert_eq!(log.matches("agent stop refused").count(), 2, "{log}");
    assert!(log.contains(&format!("agent uid {}\n", 65500)), "{log}");
    if ISOLATION == Isolation::Container {
        assert!(
            log.contains("agent fd0 refused") && log.contains("agent fd1 refused"),
            "{log}"
        );
    }
    // The context still answers, and truly.
    assert_eq!(run("print(x * 2)").await, "84\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_child_cannot_hold_the_agent() {
    let Some(g) = guard("trust-stop-spawn") else {
        return;
    };
    let b = backend().await;
    let sb = b.create(&spec(&g)).await.expect("create");
    upload_attack(&sb, "stop-spawn", "/tmp/stopper").await;
    let r = sb
        .run(&sh(
            "setsid /tmp/stopper >/tmp/stopper.log 2>&1 </dev/null & echo planted",
        ))
        .await;
    assert_eq!(text(&r.stdout), "planted\n", "{r:?}");
    // Every later command is answered: run normally, or killed by signal 9
    // when the leftover caught its process before exec. Never a hang or an
    // agent_error (retryable).
    let mut held = 0;
    for _ in 0..8 {
        let r = sb
            .run(&CommandSpec::argv(["echo", "hi"]).timeout(Duration::from_secs(5)))
            .await;
        assert_eq!(r.failure, None, "{r:?}");
        match (r.exit_code, r.signal) {
            (Some(0), None) => assert_eq!(text(&r.stdout), "hi\n"),
            (None, Some(9)) => held += 1,
            other => panic!("unexpected outcome {other:?}: {r:?}"),
        }
    }
    eprintln!("spawns held up by the leftover and unstuck: {held}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exit_137_after_a_helpers_oom_is_the_commands_own_result() {
    let Some(g) = guard("trust-oom-verdict") else {
        return;
    };
    let b = backend().await;
    let mut spec = spec(&g);
    spec.limits.memory = Some(64 << 20);
    let sb = b.create(&spec).await.expect("create");
    // A helper (a subshell's `dd`) is OOM-killed; the command itself goes
    // on, says so, and exits 137 on its own: a genuine exit, not a failure.
    let r = sb
        .run(&sh(
            "(dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null); echo \"helper $?\"; exit 137",
        ))
        .await;
    assert_eq!(
        text(&r.stdout),
        "helper 137\n",
        "the helper was not OOM-killed: {r:?}"
    );
    assert_eq!(
        (r.exit_code, r.signal, r.failure.as_ref().map(|f| f.kind)),
        (Some(137), None, None),
        "an exit was reported as a failure: {r:?}"
    );
    // The main process itself OOM-killed stays `oom_killed`.
    let r = sb
        .run(&sh("dd if=/dev/zero of=/dev/null bs=200M count=1"))
        .await;
    let f = r.failure.expect("the main process was OOM-killed");
    assert_eq!(f.kind, FailureKind::OomKilled, "{f}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// The bits of `field` (`CapEff`, `CapBnd`, ...) in a `/proc/PID/status`.
fn cap_bits(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

const CAP_KILL: u64 = 1 << 5;
const CAP_SETUID: u64 = 1 << 7;

/// `sleep 1000` processes of user nobody, as `ps` shows them.
async fn nobody_sleepers(sb: &corral::Sandbox) -> String {
    let r = sb
        .run(&sh("ps -o user,args | grep '[s]leep 1000' || true"))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    text(&r.stdout)
}

/// Leaves a `sleep 1000` of user nobody running (a command switching uid
/// with its CAP_SETUID) and returns its pid.
async fn plant_nobody(sb: &corral::Sandbox) -> String {
    let r = sb
        .run(&sh(
            "su -s /bin/sh nobody -c 'exec sleep 1000' </dev/null >/dev/null 2>&1 & echo $!",
        ))
        .await;
    assert_eq!((r.failure.as_ref(), r.exit_code), (None, Some(0)), "{r:?}");
    let pid = text(&r.stdout).trim().to_string();
    let who = sb
        .run(&sh(&format!(
            "while [ \"$(stat -c %U /proc/{pid})\" != nobody ]; do sleep 0.05; done; stat -c %U /proc/{pid}"
        )))
        .await;
    assert_eq!(
        text(&who.stdout),
        "nobody\n",
        "the leftover did not switch uid: {who:?}"
    );
    pid
}

#[tokio::test(flavor = "multi_thread")]
async fn with_setuid_caps_the_agent_still_ends_what_commands_start() {
    let Some(g) = guard("trust-setuid-kill") else {
        return;
    };
    let b = backend().await;
    let mut spec = spec(&g);
    spec.security.setuid_caps = true;
    let sb = b.create(&spec).await.expect("create");

    // A command that switched uid and hangs times out as any other: its
    // process is killed, the failure is `timeout` (not a retryable
    // agent_error).
    let r = sb
        .run(
            &CommandSpec::shell("exec su -s /bin/sh nobody -c 'exec sleep 1000'")
                .timeout(Duration::from_secs(2)),
        )
        .await;
    assert_eq!(
        r.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Timeout),
        "{r:?}"
    );
    assert_eq!(
        nobody_sleepers(&sb).await,
        "",
        "the timed-out process lives on"
    );

    // The agent holds CAP_KILL; commands can switch uid but hold no
    // CAP_KILL, not even in their bounding set, and so cannot kill another
    // user's process.
    let agent = text(&sb.run(&sh("cat /proc/1/status")).await.stdout);
    assert_ne!(cap_bits(&agent, "CapEff") & CAP_KILL, 0, "{agent}");
    let own = text(&sb.run(&sh("cat /proc/self/status")).await.stdout);
    assert_ne!(cap_bits(&own, "CapEff") & CAP_SETUID, 0, "{own}");
    for field in ["CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"] {
        // gVisor has no ambient set (and no such line).
        if field == "CapAmb" && ISOLATION == Isolation::Gvisor && !own.contains("CapAmb") {
            continue;
        }
        assert_eq!(cap_bits(&own, field) & CAP_KILL, 0, "{field}: {own}");
    }
    let pid = plant_nobody(&sb).await;
    let r = sb.run(&sh(&format!("kill -9 {pid}"))).await;
    assert_ne!(
        r.exit_code,
        Some(0),
        "a command killed another user's process: {r:?}"
    );
    assert!(nobody_sleepers(&sb).await.contains("nobody"));

    // An exclusive grader runs after the uid-switched leftover is killed.
    let r = sb.run(&sh("echo graded").exclusive()).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "graded\n");
    assert_eq!(
        nobody_sleepers(&sb).await,
        "",
        "the leftover survived exclusive"
    );
    sb.destroy().await.expect("destroy");

    // A pristine sandbox resets with such a leftover: in place under
    // runc, by replacement (saying why) under gVisor.
    spec.pristine = true;
    let sb = b.create(&spec).await.expect("create pristine");
    let expected = match ISOLATION {
        Isolation::Container => {
            sb.resets_in_place().expect("in place");
            corral::ResetMode::InPlace
        }
        Isolation::Gvisor => {
            let why = sb.resets_in_place().expect_err("not in place");
            assert!(why.contains("isolation gvisor"), "{why}");
            corral::ResetMode::Replaced
        }
    };
    plant_nobody(&sb).await;
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, expected, "{outcome:?}");
    assert_eq!(
        nobody_sleepers(&sb).await,
        "",
        "the leftover survived the reset"
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// The process limit (`limits.pids`) a namespace attack must stay under.
const NS_PIDS: i64 = 64;

#[tokio::test(flavor = "multi_thread")]
async fn a_command_cannot_make_a_namespace_to_leave_the_process_limit() {
    let Some(g) = guard("trust-namespaces") else {
        return;
    };
    let b = backend().await;
    let mut spec = spec(&g);
    spec.limits.pids = Some(NS_PIDS);
    let sb = b.create(&spec).await.expect("create");
    upload_attack(&sb, "namespaces", "/tmp/ns").await;
    // Inside a user namespace a process holds every capability, and
    // gVisor does not hold a process with CAP_SYS_ADMIN to RLIMIT_NPROC:
    // each attempt that gets a namespace forks up to twice the limit.
    let r = sb
        .run(&sh(&format!(
            "/tmp/ns {}; unshare -U -r sh -c 'echo INSIDE'; echo \"unshare-cli $?\"",
            NS_PIDS * 2
        )))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    let out = text(&r.stdout);
    for attempt in [
        "unshare-user",
        "setns-user",
        "clone-user-pid",
        "clone3-user-pid",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{attempt} ")))
            .unwrap_or_else(|| panic!("{attempt} did not run: {out}\n{}", text(&r.stderr)));
        assert!(
            line.starts_with(&format!("{attempt} refused ")),
            "a command made a namespace: {line}\n{out}"
        );
    }
    assert!(!out.contains("INSIDE"), "unshare -U ran a shell: {out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("unshare-cli ") && l != "unshare-cli 0"),
        "{out}"
    );
    // Programs still fork and start threads (glibc falls back from
    // clone3 to clone), and forks stop at the limit.
    assert!(out.contains("fork ok\n"), "{out}");
    assert!(out.contains("thread ok\n"), "{out}");
    let forks: i64 = out
        .lines()
        .find_map(|l| l.strip_prefix("forks "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fork count: {out}"));
    assert!(
        (8..NS_PIDS).contains(&forks),
        "{forks} processes at once under limits.pids {NS_PIDS}: {out}"
    );
    // The sandbox is intact.
    let r = sb.run(&sh("echo fine")).await;
    assert_eq!((r.exit_code, text(&r.stdout)), (Some(0), "fine\n".into()));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
