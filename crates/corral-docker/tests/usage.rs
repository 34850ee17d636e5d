//! A sandbox's usage, from the daemon's accounting of its cgroup and as
//! its agent reads the same cgroup from inside, moves as the sandbox
//! allocates memory, burns CPU and starts processes, and stays within its
//! limits (nothing here is timed); files a command plants where the agent
//! reads are not believed.

mod common;

use corral::backend::UsageSource;
use corral::CommandSpec;

use common::{backend, Guard, BUSYBOX};

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_moves_with_memory_cpu_and_processes_within_the_limits() {
    let g = Guard::new("usage");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.limits.memory = Some(256 * MIB);
    spec.limits.pids = Some(64);
    let sb = b.create(&spec).await.expect("start");

    let before = sb.usage().await.expect("usage");
    assert_eq!(before.memory_limit_bytes, Some(256 * MIB));
    assert_eq!(before.pids_limit, Some(64));
    assert!(before.pids >= 1, "the agent at least: {before:?}");

    // 64 MiB in a tmpfs file (charged to the sandbox's memory), a CPU
    // burner that stops by itself, and five sleepers.
    let out = sb
        .run(&CommandSpec::shell(
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null || \
             dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; \
             i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; \
             for n in 1 2 3 4 5; do setsid sleep 300 </dev/null >/dev/null 2>&1 & done; echo ok",
        ))
        .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{out:?}");
    let after = sb.usage().await.expect("usage");
    let inside = sb.usage_from_agent().await.expect("usage from the agent");
    println!("before {before:?}\nafter  {after:?}\ninside {inside:?}");
    assert_eq!(
        (after.source, inside.source),
        (UsageSource::Engine, UsageSource::Agent)
    );
    // The same cgroup read two ways a moment apart.
    let ratio = after.memory_bytes as f64 / inside.memory_bytes as f64;
    assert!((0.8..1.25).contains(&ratio), "{after:?} vs {inside:?}");
    assert!(inside.cpu_ns >= after.cpu_ns, "{after:?} vs {inside:?}");
    assert!(
        inside.pids >= before.pids + 5 && inside.pids <= 64,
        "{inside:?}"
    );
    assert_eq!(inside.memory_limit_bytes, Some(256 * MIB));
    assert!(inside.oom_kills.is_some() && after.oom_kills.is_none());
    assert!(
        after.memory_bytes >= before.memory_bytes + 60 * MIB,
        "64 MiB more in use: {before:?} -> {after:?}"
    );
    assert!(
        after.memory_bytes <= 256 * MIB,
        "within the limit: {after:?}"
    );
    if let Some(peak) = after.memory_peak_bytes {
        assert!(peak >= after.memory_bytes && peak <= 256 * MIB, "{after:?}");
    }
    assert!(
        after.cpu_ns > before.cpu_ns,
        "CPU time grew: {before:?} -> {after:?}"
    );
    assert!(
        after.pids >= before.pids + 5 && after.pids <= 64,
        "{before:?} -> {after:?}"
    );

    // Freed memory and ended processes come back down.
    let out = sb
        .run(&CommandSpec::shell(
            "rm -f /dev/shm/fill /tmp/fill; pkill sleep || killall sleep; true",
        ))
        .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let freed = sb.usage().await.expect("usage");
    assert!(
        freed.memory_bytes + 50 * MIB <= after.memory_bytes,
        "memory given back: {after:?} -> {freed:?}"
    );
    assert!(
        freed.cpu_ns >= after.cpu_ns,
        "CPU time never goes back: {freed:?}"
    );
    sb.destroy().await.expect("destroy");

    // A sandbox that is gone has no usage, and says so.
    let e = sb.usage().await.expect_err("gone");
    println!("usage of a removed sandbox: {e}");
    g.assert_clean();
}

/// Cgroup v1 puts a tmpfs at `/sys/fs/cgroup` (the controllers are mounted
/// read-only inside it) that root in a sandbox, with DAC_OVERRIDE, can
/// write to. A command plants files there that would pass for the v2
/// interface, with absurd values: the agent's reading is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_planted_by_a_command_are_not_believed() {
    let g = Guard::new("usage-planted");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.limits.memory = Some(96 * MIB);
    let sb = b.create(&spec).await.expect("start");
    let honest = sb.agent_usage().await.expect("usage from the agent");
    let out = sb
        .run(&CommandSpec::shell(
            "cd /sys/fs/cgroup && \
             echo 'memory cpu' > cgroup.controllers && echo 1 > memory.current && \
             echo 1 > memory.max && echo 'usage_usec 1' > cpu.stat && \
             cat memory.current cgroup.controllers",
        ))
        .await;
    let planted = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("honest {honest:?}\nplanting: {out:?}");
    if honest.cgroup == "v1" {
        // The attack is real on cgroup v1: the files are in place.
        assert_eq!(planted, "1\nmemory cpu\n", "{out:?}");
    }
    let after = sb.agent_usage().await.expect("usage from the agent");
    println!("after {after:?}");
    assert_eq!(after.cgroup, honest.cgroup, "{after:?}");
    assert_eq!(after.memory_limit_bytes, Some(96 * MIB), "{after:?}");
    assert!(after.memory_bytes.unwrap_or(0) > MIB, "{after:?}");
    assert!(after.cpu_ns.unwrap_or(0) > 1_000_000, "{after:?}");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
