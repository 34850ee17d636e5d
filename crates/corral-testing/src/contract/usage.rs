//! Contract cases for usage: what a command's processes used (CPU time,
//! peak memory) comes back with its result, and a sandbox's usage
//! (`Sandbox::usage`: the engine's accounting, or its agent's reading from
//! inside where the engine has none) moves with what it does, within its
//! limits. Numbers are checked against each other and against the limits,
//! never against the clock.

use corral::backend::UsageSource;

use super::{sh, Case};

const MIB: u64 = 1 << 20;

/// A shell loop that burns CPU in the shell itself (no child processes).
const BUSY: &str = "i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done";

/// A busy command reports several times the CPU of `true`, and no more than its
/// wall time (one thread); one that holds a 64 MiB buffer reports a peak
/// of at least that, `true` a small fraction; CPU burnt by an orphan of
/// the command's group that ends before the command does is counted too.
pub async fn usage_of_commands_counts_cpu_and_peak_memory(c: &Case) {
    let mut spec = c.spec();
    spec.limits.memory = Some(256 * MIB);
    let sb = c.create(&spec).await;

    let idle = sb.run(&sh("true")).await;
    let busy = sb.run(&sh(BUSY)).await;
    assert_eq!((idle.exit_code, busy.exit_code), (Some(0), Some(0)));
    let (idle_u, busy_u) = (
        idle.usage.expect("true: usage reported"),
        busy.usage.expect("busy: usage reported"),
    );
    // Four times, not more: under gVisor on a loaded machine the exec of
    // `true` alone has cost 160 ms of system time (against 1.4 s for the
    // loop).
    assert!(
        busy_u.cpu() >= idle_u.cpu() * 4 && busy_u.cpu().as_millis() >= 20,
        "busy {busy_u:?} vs true {idle_u:?}"
    );
    // One thread cannot use more CPU than wall time (plus the accounting
    // granularity of a tick).
    assert!(
        busy_u.cpu() <= busy.duration + std::time::Duration::from_millis(20),
        "cpu {:?} > wall {:?}",
        busy_u.cpu(),
        busy.duration
    );

    let big = sb
        .run(&sh(
            "dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null",
        ))
        .await;
    assert_eq!(big.exit_code, Some(0), "{big:?}");
    let big_u = big.usage.expect("dd: usage reported");
    assert!(big_u.peak_memory_bytes >= 64 * MIB, "{big_u:?}");
    assert!(idle_u.peak_memory_bytes < 16 * MIB, "{idle_u:?}");

    // The loop runs in a background subshell re-parented to PID 1 when
    // the main shell exits at once; the command waits for its output to
    // close, so the orphan has ended (and is reaped) before the report.
    let orphaned = sb
        .run(&sh(&format!("({BUSY}) & exit 0")).wait_for_output())
        .await;
    assert_eq!(orphaned.exit_code, Some(0), "{orphaned:?}");
    let orphan_u = orphaned.usage.expect("usage reported");
    assert!(
        orphan_u.cpu() >= busy_u.cpu() / 3,
        "the orphan's CPU is counted: {orphan_u:?} vs busy {busy_u:?}"
    );
    sb.destroy().await.expect("destroy");
}

/// The sandbox's usage, as `Sandbox::usage` gives it and as the agent
/// reads it from inside, moves with what the sandbox does: memory rises by
/// what a process holds (and stays under the limit), CPU time grows with
/// a busy command, processes count; the two readings agree within the
/// same order.
pub async fn usage_of_the_sandbox_moves_with_what_it_does(c: &Case) {
    // The pids limit stays the engine's base spec's (a pod cannot have one).
    let mut spec = c.spec();
    spec.limits.memory = Some(256 * MIB);
    let pids_limit = spec.limits.pids.and_then(|p| u64::try_from(p).ok());
    let sb = c.create(&spec).await;

    let before = sb.usage().await.expect("usage");
    let inside = sb.usage_from_agent().await.expect("usage from the agent");
    assert_eq!(inside.source, UsageSource::Agent);
    assert_eq!(before.memory_limit_bytes, Some(256 * MIB));
    assert_eq!(before.pids_limit, pids_limit);
    // The agent reads the cgroup's own limits: the spec's.
    let raw = sb.agent_usage().await.expect("the agent's report");
    assert_eq!(raw.memory_limit_bytes, Some(256 * MIB), "{raw:?}");
    if pids_limit.is_some() {
        assert_eq!(raw.pids_limit, pids_limit, "{raw:?}");
    }
    assert!(raw.cgroup == "v1" || raw.cgroup == "v2", "{raw:?}");

    // A background process holds a 64 MiB buffer (dd blocks writing into
    // a pipe nobody reads) while three sleepers add processes.
    let r = sb
        .run(&sh(
            "(dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 300) & \
             sleep 300 & sleep 300 & sleep 300 & \
             while [ \"$(grep VmRSS /proc/*/status 2>/dev/null | awk '{s+=$2} END {print s}')\" -lt 65536 ]; do sleep 0.05; done; \
             i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
        ))
        .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let after = sb.usage().await.expect("usage");
    let inside_after = sb.usage_from_agent().await.expect("usage from the agent");
    for (what, b, a) in [
        ("usage", &before, &after),
        ("agent", &inside, &inside_after),
    ] {
        assert!(
            a.memory_bytes >= b.memory_bytes + 48 * MIB,
            "{what}: memory rose by what dd holds: {b:?} -> {a:?}"
        );
        assert!(
            a.memory_bytes <= 256 * MIB,
            "{what}: under the limit: {a:?}"
        );
        assert!(
            a.cpu_ns >= b.cpu_ns + 20_000_000,
            "{what}: CPU time grew: {b:?} -> {a:?}"
        );
        assert!(
            a.pids >= b.pids + 5,
            "{what}: processes counted: {b:?} -> {a:?}"
        );
    }
    // The two readings of the same cgroup, a moment apart: same order.
    let (m1, m2) = (after.memory_bytes as f64, inside_after.memory_bytes as f64);
    assert!(
        m1 / m2 < 2.0 && m2 / m1 < 2.0,
        "{after:?} vs {inside_after:?}"
    );
    sb.destroy().await.expect("destroy");
}
