//! A sandbox's usage, from the daemon's accounting of its cgroup, moves as
//! the sandbox allocates memory, burns CPU and starts processes, and stays
//! within its limits (nothing here is timed).

mod common;

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
    println!("before {before:?}\nafter  {after:?}");
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
