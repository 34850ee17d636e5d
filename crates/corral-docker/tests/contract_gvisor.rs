//! The engine contract (`corral_testing::contract`) against the real
//! Docker daemon with every sandbox under `isolation: gvisor` (runtime
//! `runsc`, registered by `scripts/ensure-gvisor.sh`). A case that cannot
//! hold under gVisor is listed in [`CANNOT_HOLD`] with why; what a user
//! sees instead is asserted by the gVisor-only tests at the end. Without
//! the runtime every case prints that it was skipped and why. Cases run
//! in parallel (`--test-threads`): each has its own sandboxes and label.
//! The target is `common::ContractTarget`, the one `contract.rs` runs
//! under runc.

mod common;

use std::io::Write;

use corral::{Isolation, SandboxSpec};
use corral_testing::contract::{Target, TEST_LABEL};

const NO_IN_PLACE_RESET: &str = "in-place reset is runc's (SandboxSpec::in_place_reset refuses \
     isolation gvisor): a reset replaces the sandbox and says why \
     (gvisor_reset_replaces_and_names_isolation)";
const NO_DELTA: &str = "a delta snapshot needs a sandbox that resets in place, which gVisor's \
     do not: the snapshot is refused naming isolation gvisor \
     (gvisor_reset_replaces_and_names_isolation)";
const WHOLE_SANDBOX_OOM: &str = "gVisor charges memory to the whole sandbox, not the \
     command: an OOM stops the sandbox, typed oom_killed (pid1_oom_is_reported_as_oom_killed, \
     gvisor_a_command_oom_stops_the_sandbox_typed)";

/// Contract cases that cannot hold under gVisor, and why; each reason
/// names the test that asserts what a user sees instead.
const CANNOT_HOLD: &[(&str, &str)] = &[
    ("oom_kill_is_attributed_to_the_command", WHOLE_SANDBOX_OOM),
    (
        "shell_killed_by_the_oom_killer_is_oom_killed",
        WHOLE_SANDBOX_OOM,
    ),
    (
        "usage_of_the_sandbox_moves_with_what_it_does",
        "gVisor's kernel shows the agent no cgroup: the agent's own report reads cgroup \
         'none' with every counter absent, never zero; the engine's usage still holds \
         (gvisor_agent_usage_is_absent_not_zero)",
    ),
    (
        "reset_in_place_is_indistinguishable_from_a_new_sandbox",
        NO_IN_PLACE_RESET,
    ),
    (
        "reset_in_place_commands_get_none_of_the_agents_privileges",
        NO_IN_PLACE_RESET,
    ),
    (
        "reset_in_place_clears_ipc_objects_and_dev",
        NO_IN_PLACE_RESET,
    ),
    (
        "reset_in_place_undoes_writes_to_sys_and_pid1",
        NO_IN_PLACE_RESET,
    ),
    ("reset_in_place_serves_a_pristine_pool", NO_IN_PLACE_RESET),
    (
        "snapshot_forks_of_n_have_the_files_and_reset_to_the_snapshot",
        NO_DELTA,
    ),
    ("snapshot_a_fork_of_a_fork_has_both_layers", NO_DELTA),
    ("snapshot_fork_is_all_or_nothing", NO_DELTA),
    ("snapshot_a_durable_delta_outlives_its_runtime", NO_DELTA),
    (
        "pty_runs_an_interactive_shell",
        "KNOWN BROKEN under gVisor: on a terminal (opened by number, gVisor has no \
         TIOCGPTPEER) input, output, the size and a resize hold, but Ctrl-C does not \
         interrupt the shell's foreground command; to be fixed, not kept",
    ),
];

async fn gvisor(case: &str) -> Option<Box<dyn Target>> {
    if let Some((_, why)) = CANNOT_HOLD.iter().find(|(name, _)| *name == case) {
        let _ = writeln!(std::io::stderr(), "not under gVisor: {case}: {why}");
        return None;
    }
    if !common::tier_available(Isolation::Gvisor, case) {
        return None;
    }
    Some(Box::new(common::ContractTarget {
        runtime: common::backend().await,
        isolation: Isolation::Gvisor,
    }))
}

corral_testing::contract_suite!(gvisor);

/// A gVisor sandbox for the tests below, or `None` when runsc is missing.
async fn sandbox(test: &str, spec: impl FnOnce(&mut SandboxSpec)) -> Option<corral::Sandbox> {
    if !common::tier_available(Isolation::Gvisor, test) {
        return None;
    }
    let runtime = common::backend().await;
    let mut s = SandboxSpec::new(common::BUSYBOX);
    s.isolation = Isolation::Gvisor;
    s.labels
        .insert(TEST_LABEL.into(), format!("{test}-{}", std::process::id()));
    spec(&mut s);
    Some(runtime.create(&s).await.expect("create a gVisor sandbox"))
}

async fn out(sb: &corral::Sandbox, script: &str) -> String {
    corral_testing::contract::out(sb, script).await
}

/// Commands of an `isolation: gvisor` sandbox talk to gVisor's kernel,
/// not the host's: its kernel log and version are gVisor's own.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_commands_run_on_gvisors_kernel_not_the_hosts() {
    let Some(sb) = sandbox("gvisor_kernel", |_| {}).await else {
        return;
    };
    let dmesg = out(&sb, "dmesg | head -1").await;
    assert!(dmesg.contains("Starting gVisor"), "{dmesg}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("host kernel");
    let inside = out(&sb, "uname -r").await;
    assert_ne!(inside.trim(), host.trim(), "the host's kernel answered");
    sb.destroy().await.expect("destroy");
}

/// A pristine gVisor sandbox resets by replacement, and the outcome says
/// it is the isolation; a delta snapshot is refused naming it.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_reset_replaces_and_names_isolation() {
    let Some(sb) = sandbox("gvisor_reset", |s| s.pristine = true).await else {
        return;
    };
    let why = sb
        .resets_in_place()
        .expect_err("gVisor cannot reset in place");
    assert!(why.contains("isolation gvisor"), "{why}");
    let before = sb.container_id();
    out(&sb, "echo x > /tmp/x").await;
    let outcome = sb.reset().await.expect("reset");
    assert_eq!(outcome.mode, corral::ResetMode::Replaced, "{outcome:?}");
    assert!(
        outcome
            .fallback_reason
            .as_deref()
            .is_some_and(|r| r.contains("isolation gvisor")),
        "{outcome:?}"
    );
    assert_ne!(sb.container_id(), before, "not replaced");
    assert_eq!(out(&sb, "ls /tmp | wc -l").await, "0\n");
    sb.destroy().await.expect("destroy");
}

/// A command that outgrows the memory limit stops the whole gVisor
/// sandbox, typed: the command's failure is oom_killed.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_a_command_oom_stops_the_sandbox_typed() {
    let Some(sb) = sandbox("gvisor_oom", |s| s.limits.memory = Some(64 << 20)).await else {
        return;
    };
    let r = sb
        .run(&corral_testing::contract::sh(
            "head -c 200000000 /dev/zero | tail > /dev/null",
        ))
        .await;
    let failure = r.failure.expect("the command outgrew the limit");
    assert_eq!(failure.kind, corral::FailureKind::OomKilled, "{failure:?}");
    let _ = sb.destroy().await;
}

/// gVisor's kernel shows the agent no cgroup: its report says so
/// (cgroup none, counters absent), never a made-up zero, while the
/// engine's usage still reads the sandbox's limit.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_agent_usage_is_absent_not_zero() {
    let Some(sb) = sandbox("gvisor_usage", |s| s.limits.memory = Some(256 << 20)).await else {
        return;
    };
    let raw = sb.agent_usage().await.expect("the agent's report");
    assert_eq!(raw.cgroup, "none", "{raw:?}");
    assert_eq!((raw.cpu_ns, raw.memory_bytes), (None, None), "{raw:?}");
    let engine = sb.usage().await.expect("usage");
    assert_eq!(engine.memory_limit_bytes, Some(256 << 20), "{engine:?}");
    sb.destroy().await.expect("destroy");
}

/// A gVisor sandbox's engine pids limit stays within half the host's
/// `pid_max` (the daemon is local here): the largest `limits.pids` that
/// fits starts, and its engine limit is below `pid_max`; one more is
/// refused naming `limits.pids`, before any container is made.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_pids_limit_stays_under_the_hosts_pid_max() {
    let pid_max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("a number");
    let max = corral_core::spec::gvisor_max_pids(pid_max);
    let Some(sb) = sandbox("gvisor_pids_max", |s| s.limits.pids = Some(max)).await else {
        return;
    };
    let engine = sb.usage().await.expect("usage");
    let limit = engine.pids_limit.expect("an engine pids limit");
    assert!(
        limit <= u64::try_from(pid_max / 2).expect("positive"),
        "{limit} of {pid_max}"
    );
    sb.destroy().await.expect("destroy");
    let label = format!("gvisor_pids_over-{}", std::process::id());
    let mut s = SandboxSpec::new(common::BUSYBOX);
    s.isolation = Isolation::Gvisor;
    s.labels.insert(TEST_LABEL.into(), label.clone());
    s.limits.pids = Some(max + 1);
    let e = match common::backend().await.create(&s).await {
        Ok(_) => panic!(
            "created with limits.pids {} above the host's bound",
            max + 1
        ),
        Err(e) => e,
    };
    match &e {
        corral::Error::InvalidSpec(se) => {
            assert_eq!(se.field, "limits.pids", "{e}");
            assert_eq!(se.value, (max + 1).to_string(), "{e}");
            assert!(se.reason.contains(&format!("at most {max}")), "{e}");
        }
        other => panic!("not an invalid spec: {other}"),
    }
    let left = common::docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label={TEST_LABEL}={label}"),
    ]);
    assert_eq!(left.trim(), "", "a refused create left a container");
}

/// The copies of checkpoints the daemon's shim made in the host's /tmp
/// (`ctrd-checkpoint*`).
fn shim_copies() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/tmp")
        .expect("read /tmp")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("ctrd-checkpoint")
        })
        .map(|e| e.path())
        .collect()
}

/// The counter a background shell of the live-snapshot test writes each
/// tenth of a second, read twice a second apart: it must be moving.
async fn counting(sb: &corral::Sandbox) -> (u64, u64) {
    let text = out(sb, "cat /tmp/count; sleep 1; cat /tmp/count").await;
    let mut n = text
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("a count"));
    let (a, b) = (n.next().expect("first"), n.next().expect("second"));
    assert!(b > a, "the counter stands still: {a} then {b}");
    (a, b)
}

/// A live snapshot of a gVisor sandbox without network takes its running
/// processes along: a shell counting in memory goes on from where it was
/// in the source and in each of two forks, which diverge; a server that
/// listened before the snapshot answers in every fork; files in the root
/// file system and in /tmp come along; each fork is a sandbox of its own.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_live_snapshot_forks_running_processes() {
    let Some(sb) = sandbox("gvisor_live", |s| s.network = corral::Network::None).await else {
        return;
    };
    let copies_before = shim_copies();
    out(
        &sb,
        "mkdir -p /www && echo served > /www/page && echo rooted > /rootfile && \
         setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' \
           </dev/null >/dev/null 2>&1 & \
         setsid httpd -f -p 8080 -h /www </dev/null >/dev/null 2>&1 & \
         sleep 1",
    )
    .await;
    let (_, before) = counting(&sb).await;
    // A command in flight when the snapshot is taken: its timeout (4 s)
    // still ends it in the source and in every fork; its caller here gets
    // the stream's end, typed, not a hang.
    let inflight = sb
        .exec(
            &corral::CommandSpec::shell("exec sleep 60").timeout(std::time::Duration::from_secs(4)),
        )
        .await
        .expect("start sleep");
    let name = format!("live-{}", std::process::id());
    let opts = corral::SnapshotOptions {
        kind: Some(corral::snapshot::SnapshotKind::Live),
        ..Default::default()
    };
    let info = sb.snapshot(&name, opts).await.expect("live snapshot");
    assert_eq!(info.kind, corral::snapshot::SnapshotKind::Live);
    assert!(info.size > 0, "{info:?}");
    // The source goes on from its own state (restored in place).
    let (after, _) = counting(&sb).await;
    assert!(
        after >= before,
        "the source started over: {before} then {after}"
    );
    let cut = tokio::time::timeout(std::time::Duration::from_secs(30), inflight.wait())
        .await
        .expect("the in-flight command's caller waits forever");
    assert!(cut.failure.is_some(), "{cut:?}");
    let runtime = common::backend().await;
    let forks = runtime.fork(&name, 2).await.expect("fork 2");
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    for f in &forks {
        // Its clock is the host's, not the snapshot's.
        let then: i64 = out(f, "date +%s").await.trim().parse().expect("a time");
        assert!(
            (then - host_now).abs() < 30,
            "fork clock {then}, host {host_now}"
        );
        let (n, _) = counting(f).await;
        assert!(n >= before, "a fork started over: {before} then {n}");
        assert_eq!(out(f, "cat /rootfile").await, "rooted\n");
        // Seen once in about ten runs: the first answer of a restored
        // busybox httpd came back empty; a second try is served.
        assert_eq!(
            out(
                f,
                "for i in 1 2 3; do r=$(wget -qO- http://127.0.0.1:8080/page); \
                 [ -n \"$r\" ] && break; sleep 0.3; done; echo \"$r\""
            )
            .await,
            "served\n"
        );
        assert_ne!(f.id(), sb.id());
        assert_ne!(f.container_id(), sb.container_id());
    }
    // The in-flight command's timeout ended it everywhere.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    for s in forks.iter().chain(std::iter::once(&sb)) {
        assert_eq!(
            out(s, "ps -o args | grep -c '^sleep 60' || true").await,
            "0\n"
        );
    }
    out(&forks[0], "echo one > /tmp/mine").await;
    assert_eq!(
        out(&forks[1], "cat /tmp/mine 2>/dev/null || echo absent").await,
        "absent\n"
    );
    assert_eq!(
        out(&sb, "cat /tmp/mine 2>/dev/null || echo absent").await,
        "absent\n"
    );
    for f in forks {
        f.destroy().await.expect("destroy a fork");
    }
    runtime.delete_snapshot(&name).await.expect("delete");
    assert!(runtime.snapshot_info(&name).await.is_err(), "still listed");
    sb.destroy().await.expect("destroy");
    // The daemon's shim copies every restored checkpoint into the host's
    // /tmp and leaves it there: none of this test's may stay. Another
    // test's restore in flight has one for a moment (removed once its
    // restore is done), so a copy must be gone within a few seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let left: Vec<_> = shim_copies()
            .into_iter()
            .filter(|p| !copies_before.contains(p))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "checkpoint copies left in /tmp: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// gVisor on the host network stack (a sandbox with network) cannot be
/// checkpointed: a live snapshot is refused by name, and the sandbox goes
/// on as it was.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_with_network_refuses_a_live_snapshot_by_name() {
    let Some(sb) = sandbox("gvisor_live_net", |_| {}).await else {
        return;
    };
    out(&sb, "echo kept > /tmp/kept").await;
    let opts = corral::SnapshotOptions {
        kind: Some(corral::snapshot::SnapshotKind::Live),
        ..Default::default()
    };
    let e = sb
        .snapshot(&format!("net-{}", std::process::id()), opts)
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), corral::FailureKind::Unsupported, "{e}");
    assert!(e.to_string().contains("host network stack"), "{e}");
    assert_eq!(out(&sb, "cat /tmp/kept").await, "kept\n");
    sb.destroy().await.expect("destroy");
}

/// Pausing a gVisor sandbox without network goes to disk: its container
/// stops (no process, no memory held) and its usage reads zero memory;
/// resuming restores it and the shell counting in memory goes on from
/// where it was, as does a command started before.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_pause_to_disk_holds_no_memory_and_resume_goes_on() {
    let Some(sb) = sandbox("gvisor_pause", |s| s.network = corral::Network::None).await else {
        return;
    };
    out(
        &sb,
        "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' \
           </dev/null >/dev/null 2>&1 & sleep 0.5",
    )
    .await;
    let (_, before) = counting(&sb).await;
    sb.pause().await.expect("pause");
    assert!(sb.is_paused() && sb.is_paused_to_disk());
    let running = common::docker(&["inspect", "-f", "{{.State.Running}}", &sb.container_id()]);
    assert_eq!(running.trim(), "false");
    assert_eq!(sb.usage().await.expect("usage").memory_bytes, 0);
    // A paused sandbox forks (its checkpoint is the live snapshot), and
    // takes no command meanwhile.
    let r = sb.run(&corral_testing::contract::sh("echo no")).await;
    assert!(
        r.failure
            .as_ref()
            .is_some_and(|f| f.message.contains("paused")),
        "{r:?}"
    );
    let name = format!("paused-{}", std::process::id());
    let opts = corral::SnapshotOptions {
        kind: Some(corral::snapshot::SnapshotKind::Live),
        ..Default::default()
    };
    sb.snapshot(&name, opts)
        .await
        .expect("a live snapshot of a paused sandbox");
    let runtime = common::backend().await;
    let forks = runtime.fork(&name, 1).await.expect("fork a paused sandbox");
    let (forked, _) = counting(&forks[0]).await;
    assert!(
        forked >= before,
        "the fork started over: {before} then {forked}"
    );
    for f in forks {
        f.destroy().await.expect("destroy the fork");
    }
    runtime.delete_snapshot(&name).await.expect("delete");
    assert!(sb.is_paused_to_disk(), "the snapshot resumed the source");
    sb.resume().await.expect("resume");
    assert!(!sb.is_paused());
    let (after, _) = counting(&sb).await;
    assert!(
        after >= before,
        "the counter started over: {before} then {after}"
    );
    // Again: a checkpoint of a sandbox that was itself restored (runsc
    // leaves its state behind then, and the daemon would not start it).
    sb.pause().await.expect("pause again");
    sb.resume().await.expect("resume again");
    let (again, _) = counting(&sb).await;
    assert!(
        again >= after,
        "the counter started over: {after} then {again}"
    );
    let cid = sb.container_id();
    sb.destroy().await.expect("destroy");
    let runsc = std::process::Command::new("runsc")
        .args(["--root", "/var/run/docker/runtime-runc/moby", "list"])
        .output()
        .expect("runsc list");
    let listed = String::from_utf8_lossy(&runsc.stdout);
    assert!(!listed.contains(&cid), "runsc still holds {cid}: {listed}");
}

/// A fork restored long after its snapshot was taken (longer than the
/// agent's dead-man grace) starts: the time the checkpoint spent on disk is
/// not time without a controller.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_a_fork_restored_after_the_agents_grace_starts() {
    let Some(sb) = sandbox("gvisor_live_grace", |s| {
        s.network = corral::Network::None;
        s.agent_grace_ms = 2000;
    })
    .await
    else {
        return;
    };
    out(&sb, "echo before > /tmp/state").await;
    let name = format!("grace-{}", std::process::id());
    let opts = corral::SnapshotOptions {
        kind: Some(corral::snapshot::SnapshotKind::Live),
        ..Default::default()
    };
    sb.snapshot(&name, opts).await.expect("live snapshot");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let runtime = common::backend().await;
    let forks = runtime.fork(&name, 1).await.expect("fork after the grace");
    assert_eq!(out(&forks[0], "cat /tmp/state").await, "before\n");
    // And it stays up past the grace, fed by corral as any sandbox.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(out(&forks[0], "echo up").await, "up\n");
    for f in forks {
        f.destroy().await.expect("destroy the fork");
    }
    runtime.delete_snapshot(&name).await.expect("delete");
    sb.destroy().await.expect("destroy");
}

/// A gVisor sandbox that starts as root holds result integrity: its
/// agent runs behind the door, in a PID namespace of its own (its
/// stream's sockets are all a command finds at `/proc/1/fd`). One whose
/// image's `USER` is not root cannot split, runs anyway, and says why its
/// results are not integrity-protected (the spec alone cannot tell).
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_an_image_user_that_is_not_root_says_results_are_not_integrity_protected() {
    let Some(sb) = sandbox("gvisor_integrity_root", |_| {}).await else {
        return;
    };
    assert_eq!(sb.result_integrity(), Ok(()));
    let fds = out(&sb, "for f in /proc/1/fd/[012]; do readlink $f; done").await;
    assert!(
        fds.lines().count() == 3 && fds.lines().all(|l| l.starts_with("socket:")),
        "{fds}"
    );
    sb.destroy().await.expect("destroy");

    let image = format!("corral-test/busybox-user-{}", std::process::id());
    let built = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &image, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(format!("FROM {}\nUSER 1000:1000\n", common::BUSYBOX).as_bytes())?;
            drop(stdin);
            child.wait()
        })
        .expect("docker build");
    assert!(built.success(), "docker build {image}");
    let sb = sandbox("gvisor_integrity_user", |s| s.image = image.clone())
        .await
        .expect("the tier is there");
    assert_eq!(out(&sb, "id -u").await, "1000\n");
    let why = sb
        .result_integrity()
        .expect_err("a user's agent cannot split");
    assert!(
        why.starts_with("isolation gvisor") && why.contains("uid 1000"),
        "{why}"
    );
    sb.destroy().await.expect("destroy");
    let _ = std::process::Command::new("docker")
        .args(["rmi", "-f", &image])
        .output();
}

/// runsc-live keeps a gVisor sandbox's root file system changes in its
/// own memory (`--overlay`), not in the container: a `docker commit`
/// would miss them. So there a snapshot is live unless asked otherwise,
/// an image snapshot is refused by name, and a fork has the files.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_without_network_snapshots_live_by_default_and_keeps_its_files() {
    let Some(sb) = sandbox("gvisor_live_default", |s| s.network = corral::Network::None).await
    else {
        return;
    };
    let runtimes = std::process::Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .expect("docker info");
    if !String::from_utf8_lossy(&runtimes.stdout).contains("\"runsc-live\"") {
        eprintln!("skipped: the daemon has no runtime runsc-live (scripts/ensure-gvisor.sh)");
        sb.destroy().await.expect("destroy");
        return;
    }
    let runtime = common::backend().await;
    out(&sb, "echo rooted > /rootfile && echo tmp > /tmp/t").await;
    let image = corral::SnapshotOptions {
        kind: Some(corral::snapshot::SnapshotKind::Image),
        ..Default::default()
    };
    let name = format!("live-default-{}", std::process::id());
    match sb.snapshot(&name, image).await {
        Err(corral::Error::Unsupported { what }) => {
            assert!(what.contains("image snapshot"), "{what}")
        }
        other => panic!("an image snapshot under runsc-live: {other:?}"),
    }
    let info = sb
        .snapshot(&name, corral::SnapshotOptions::default())
        .await
        .expect("snapshot");
    assert_eq!(info.kind, corral::snapshot::SnapshotKind::Live);
    let forks = runtime.fork(&name, 1).await.expect("fork");
    assert_eq!(
        out(&forks[0], "cat /rootfile /tmp/t").await,
        "rooted\ntmp\n"
    );
    for f in forks {
        f.destroy().await.expect("destroy a fork");
    }
    runtime.delete_snapshot(&name).await.expect("delete");
    sb.destroy().await.expect("destroy");
}

/// A private snapshot directory of a test's own, so what a runtime leaves
/// there is this test's alone.
fn private_snapshot_dir(test: &str) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("corral-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .expect("make a snapshot dir");
    dir
}

/// A runtime over the Docker backend keeping its snapshots in `dir`.
async fn runtime_in(dir: &std::path::Path) -> corral::Runtime {
    common::images();
    let docker = corral_docker::DockerBackend::connect(&corral_docker::DockerConfig::default())
        .await
        .expect("a Docker daemon");
    corral::Runtime::new(
        std::sync::Arc::new(docker),
        corral::RuntimeConfig {
            snapshot_dir: Some(dir.to_path_buf()),
            ..corral::RuntimeConfig::default()
        },
    )
}

/// `on_idle: pause`: a session's gVisor sandbox without network, idle past
/// its timeout, is paused to disk, not released. Its provider shuts down
/// and leaves it stopped, with its checkpoint; a second provider (a
/// restarted service) serves the session again, paused, with the notes its
/// front end left, and a resume brings back the shell counting in memory.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_an_idle_session_pauses_to_disk_and_outlives_its_provider() {
    let test = "gvisor_idle_pause";
    if !common::tier_available(Isolation::Gvisor, test) {
        return;
    }
    let dir = private_snapshot_dir(test);
    let config = corral::pool::ProviderConfig {
        idle_timeout_ms: 1500,
        reap_interval_ms: 200,
        on_idle: corral::pool::IdleAction::Pause,
        ..Default::default()
    };
    let mut spec = SandboxSpec::new(common::BUSYBOX);
    spec.isolation = Isolation::Gvisor;
    spec.network = corral::Network::None;
    spec.labels
        .insert(TEST_LABEL.into(), format!("{test}-{}", std::process::id()));
    let first = corral::Provider::new(runtime_in(&dir).await, config.clone());
    let key = "idle-pause";
    let lease = first.acquire_spec(key, &spec).await.expect("acquire");
    lease.set_note("owner", "tenant:alice");
    out(
        &lease,
        "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' \
           </dev/null >/dev/null 2>&1 & sleep 0.5",
    )
    .await;
    let (_, before) = counting(&lease).await;
    let sandbox_id = lease.id().to_string();
    let container = lease.container_id();
    drop(lease);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !first.peek(key).is_some_and(|sb| sb.is_paused_to_disk()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle sandbox was not paused to disk: {:?}",
            first.peek(key).map(|sb| sb.is_paused())
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Paused, it is neither expired nor evicted by the idle timeout.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(first.peek(key).is_some(), "a paused sandbox was evicted");
    first.shutdown().await;
    let running = common::docker(&["inspect", "-f", "{{.State.Running}}", &container]);
    assert_eq!(running.trim(), "false", "shutdown removed or restarted it");
    assert!(dir
        .join("paused")
        .join(format!("{sandbox_id}.json"))
        .exists());

    // Every corral on the host keeps it, not only one reading this store:
    // another's listing, which knows nothing of the record, judges it kept
    // (what its orphan reaper and `gc --all` go by).
    let elsewhere = private_snapshot_dir("gvisor_idle_pause_elsewhere");
    let other = runtime_in(&elsewhere).await;
    let seen = other.list_sandboxes().await.expect("list");
    let ours = seen
        .iter()
        .find(|i| i.sandbox_id == sandbox_id)
        .expect("listed");
    assert_eq!(
        ours.ownership,
        corral::labels::Ownership::Persistent,
        "another corral would remove a sandbox paused to disk"
    );
    let _ = std::fs::remove_dir_all(&elsewhere);
    let runtime = runtime_in(&dir).await;
    // The orphan reaper keeps a sandbox paused to disk.
    runtime.gc(false).await.expect("gc");
    let second = corral::Provider::new(runtime, config);
    let recovered = second.recover_paused().await.expect("recover");
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0].0, key);
    assert_eq!(
        recovered[0].1.get("owner").map(String::as_str),
        Some("tenant:alice")
    );
    let lease = second.lease(key).await.expect("a session").expect("lease");
    assert!(lease.is_paused_to_disk());
    assert_eq!(lease.id(), sandbox_id);
    let r = lease.run(&corral_testing::contract::sh("echo no")).await;
    assert!(
        r.failure
            .as_ref()
            .is_some_and(|f| f.message.contains("paused")),
        "{r:?}"
    );
    lease.resume().await.expect("resume");
    let (after, _) = counting(&lease).await;
    assert!(
        after >= before,
        "the counter started over: {before} then {after}"
    );
    drop(lease);
    second.release_and_wait(key).await.expect("release");
    second.shutdown().await;
    assert!(
        !dir.join("paused")
            .join(format!("{sandbox_id}.json"))
            .exists(),
        "the record outlived its sandbox"
    );
    let gone = std::process::Command::new("docker")
        .args(["inspect", &container])
        .output()
        .expect("docker inspect");
    assert!(!gone.status.success(), "its container is left");
    let _ = std::fs::remove_dir_all(&dir);
}
