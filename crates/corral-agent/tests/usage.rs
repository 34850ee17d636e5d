//! Usage as the agent measures it, over the real protocol in a real
//! container: a command's exit report carries its CPU time and peak memory
//! (the main process with what it waited for, and its group's orphans),
//! and a `Usage` request is answered from the sandbox's own cgroup and
//! network counters (`corral-docker/tests/usage.rs` plants fake ones from
//! inside a hardened sandbox).
//!
//! Each test makes its own container (removed by a guard even on failure)
//! and skips only when no Docker daemon answers.

// Each test binary uses its own part of the shared harness.
#[allow(dead_code)]
mod support;

use corral_core::protocol::{CommandUsage, Frame, FrameKind, SandboxUsage};
use support::{docker_available, req, Client, Opts, Sandbox};

macro_rules! need_docker {
    () => {
        if !docker_available() {
            return;
        }
    };
}

const MIB: u64 = 1 << 20;
const BUSY: &str = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done";

fn usage_of(c: &mut Client, script: &str, wait_for_output: bool) -> CommandUsage {
    let mut r = req(&["sh", "-c", script]);
    r.wait_for_output = wait_for_output;
    let o = c.run_req(&r);
    assert_eq!(o.report().exit_code, Some(0), "{o:?}");
    o.report()
        .usage
        .unwrap_or_else(|| panic!("no usage: {o:?}"))
}

fn sandbox_usage(c: &mut Client) -> SandboxUsage {
    let id = c.fresh_id();
    c.send(&Frame::new(FrameKind::Usage, id, Vec::new()));
    let f = c.next_frame(id);
    assert_eq!(f.kind, FrameKind::UsageReport, "{f:?}");
    f.parse().expect("a usage report")
}

#[test]
fn exit_reports_carry_cpu_time_and_peak_memory_with_orphans_counted() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        memory_mib: 256,
        ..Opts::default()
    });
    let mut c = sb.client();

    let idle = usage_of(&mut c, "true", false);
    let busy = usage_of(&mut c, BUSY, false);
    let cpu = |u: &CommandUsage| u.user_us + u.system_us;
    assert!(
        cpu(&busy) >= 10 * cpu(&idle) && cpu(&busy) >= 20_000,
        "busy {busy:?} vs true {idle:?}"
    );
    assert_eq!((idle.orphans, busy.orphans), (0, 0));

    // dd's buffer is one process's; a pipeline's reader waited for by the
    // shell counts through the shell's wait.
    let big = usage_of(
        &mut c,
        "dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null",
        false,
    );
    assert!(big.max_rss_bytes >= 64 * MIB, "{big:?}");
    assert!(idle.max_rss_bytes < 16 * MIB, "{idle:?}");
    let held = usage_of(
        &mut c,
        "dd if=/dev/zero bs=48M count=1 2>/dev/null | cat >/dev/null",
        false,
    );
    assert!(held.max_rss_bytes >= 48 * MIB, "{held:?}");

    // The loop runs in a subshell the main shell leaves behind: it is
    // re-parented to PID 1, reaped there and charged to the command,
    // which waits for its output to close.
    let orphaned = usage_of(&mut c, &format!("({BUSY}) & exit 0"), true);
    assert!(orphaned.orphans >= 1, "{orphaned:?}");
    assert!(cpu(&orphaned) >= cpu(&busy) / 3, "{orphaned:?} vs {busy:?}");
    // A job that outlives the command is not counted (nor waited for).
    let left = usage_of(&mut c, &format!("({BUSY}) >/dev/null 2>&1 & exit 0"), false);
    assert!(cpu(&left) < cpu(&busy) / 3, "{left:?} vs {busy:?}");
}

#[test]
fn a_usage_request_reads_the_sandboxs_own_cgroup_and_network() {
    need_docker!();
    let sb = Sandbox::start(Opts {
        memory_mib: 192,
        ..Opts::default()
    });
    let mut c = sb.client();
    let before = sandbox_usage(&mut c);
    assert!(before.cgroup == "v1" || before.cgroup == "v2", "{before:?}");
    assert_eq!(before.memory_limit_bytes, Some(192 * MIB), "{before:?}");
    assert_eq!(before.pids_limit, Some(256), "{before:?}");
    for (what, v) in [
        ("cpu_ns", before.cpu_ns),
        ("memory_bytes", before.memory_bytes),
        ("pids", before.pids),
        ("oom_kills", before.oom_kills),
        // `--network none`: only loopback, which is left out.
        ("net_rx_bytes", before.net_rx_bytes),
    ] {
        assert!(v.is_some(), "{what} missing: {before:?}");
    }
    assert_eq!(before.net_rx_bytes, Some(0), "{before:?}");

    // A process holding 64 MiB, and CPU burnt.
    c.sh("(dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 300) >/dev/null 2>&1 &");
    let o = c.sh(&format!(
        "while [ \"$(grep VmRSS /proc/*/status 2>/dev/null | awk '{{s+=$2}} END {{print s}}')\" -lt 65536 ]; \
         do sleep 0.05; done; {BUSY}"
    ));
    assert_eq!(o.report().exit_code, Some(0), "{o:?}");
    let after = sandbox_usage(&mut c);
    let (m0, m1) = (
        before.memory_bytes.unwrap_or(0),
        after.memory_bytes.unwrap_or(0),
    );
    assert!(
        m1 >= m0 + 48 * MIB && m1 <= 192 * MIB,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.cpu_ns.unwrap_or(0) >= before.cpu_ns.unwrap_or(0) + 20_000_000,
        "{before:?} -> {after:?}"
    );
    assert!(after.pids.unwrap_or(0) >= before.pids.unwrap_or(0) + 2);
    assert!(after.memory_peak_bytes.is_none_or(|p| p >= m1), "{after:?}");

    // A usage request with id 0 is refused; the session goes on.
    c.send(&Frame::new(FrameKind::Usage, 0, Vec::new()));
    let f = c.next_frame(0);
    assert_eq!(f.kind, FrameKind::Error, "{f:?}");
    assert_eq!(c.sh("echo ok").out(), "ok\n");
}
