//! What only the Docker engine has, against the real daemon: the pids
//! limit, the hardened defaults as mounts and capabilities, spec options
//! (binds, users, network), the disk limit, `FROM scratch` images, what
//! `docker kill` and `docker rm -f` leave, gVisor. The engine-neutral
//! cases (commands, stdin, the output cap, timeouts, OOM, recovery) are
//! the shared contract in `tests/contract.rs`.

mod common;

use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX, SCRATCH};
use corral_core::{CommandSpec, EnvVar, FailureKind, Mount, Network};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_stops_at_the_pids_limit() {
    let g = Guard::new("forkbomb");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.limits.pids = Some(64);
    let sb = b.create(&spec).await.expect("create");
    let r = sb
        .run(&CommandSpec::shell("b() { b | b & }; b; sleep 3").timeout(Duration::from_secs(3)))
        .await;
    assert!(r.failure.is_some() || r.exit_code != Some(0), "{r:?}");
    // The agent keeps working and the bomb is gone.
    let r = sb
        .run(&sh(
            "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null; echo alive",
        ))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "64\nalive\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn hardened_defaults_hold_inside_the_sandbox() {
    let g = Guard::new("hardening");
    let b = backend().await;
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    let r = sb
        .run(&sh(
            "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; cat /sys/fs/cgroup/pids/pids.max; \
                  grep -E ' /(tmp|var/tmp|run) ' /proc/mounts | cut -d' ' -f2,4",
        ))
        .await;
    let out = text(&r.stdout);
    assert!(out.contains("CapEff:\t000000000000000b"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("\n256\n"), "{out}");
    let run_opts = out
        .lines()
        .find(|l| l.starts_with("/run "))
        .expect("/run tmpfs");
    assert!(
        run_opts.contains("noexec") && run_opts.contains("nosuid"),
        "{run_opts}"
    );
    let tmp_opts = out
        .lines()
        .find(|l| l.starts_with("/tmp "))
        .expect("/tmp tmpfs");
    assert!(
        tmp_opts.contains("nosuid") && tmp_opts.contains("size=") && !tmp_opts.contains("noexec"),
        "{tmp_opts}"
    );
    // /tmp runs programs (scripts written there by agents); noexec really
    // holds on /run.
    let r = sb
        .run(&sh(
            "printf '#!/bin/sh\necho ran\n' > /tmp/s.sh && chmod +x /tmp/s.sh && /tmp/s.sh",
        ))
        .await;
    assert_eq!(
        text(&r.stdout),
        "ran
",
        "{r:?}"
    );
    let r = sb.run(&sh("cp /bin/busybox /run/x && /run/x true")).await;
    assert_ne!(r.exit_code, Some(0));
    // Root without CAP_SYS_ADMIN cannot mount.
    let r = sb.run(&sh("mount -t tmpfs none /mnt")).await;
    assert_ne!(r.exit_code, Some(0));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_options_take_effect() {
    let g = Guard::new("options");
    let b = backend().await;
    let dir = std::env::temp_dir().join(format!("corral-test-mount-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("f.txt"), "from host").expect("write");
    std::env::set_var("CORRAL_TEST_FORWARDED", "fwd");
    let mut spec = g.spec(BUSYBOX);
    spec.network = Network::None;
    spec.security.read_only_root = true;
    spec.security.user = Some("1000:1000".into());
    spec.workdir = Some("/tmp".into());
    spec.env = vec![
        EnvVar::Set {
            name: "PLAIN".into(),
            value: "v".into(),
        },
        EnvVar::Forward {
            forward: "CORRAL_TEST_FORWARDED".into(),
        },
        EnvVar::Set {
            name: "EXPANDED".into(),
            value: "$CORRAL_TEST_FORWARDED".into(),
        },
    ];
    spec.expand_host_env = true;
    spec.mounts = vec![Mount {
        host: dir.display().to_string(),
        container: "/data".into(),
        read_only: true,
        nosuid: false,
    }];
    let sb = b.create(&spec).await.expect("create");
    let r = sb
        .run(&sh("id -u; pwd; ls /sys/class/net; echo $PLAIN $CORRAL_TEST_FORWARDED $EXPANDED; cat /data/f.txt; echo; \
                  touch /rootfs-write 2>/dev/null && echo rootfs-writable; touch /data/x 2>/dev/null && echo mount-writable; \
                  touch /tmp/ok && echo tmp-writable"))
        .await;
    assert_eq!(
        text(&r.stdout),
        "1000\n/tmp\nlo\nv fwd fwd\nfrom host\ntmp-writable\n",
        "stderr: {}",
        text(&r.stderr)
    );
    sb.destroy().await.expect("destroy");
    std::fs::remove_dir_all(&dir).ok();
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_specs_are_rejected_by_name_before_anything_is_created() {
    let g = Guard::new("badspec");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.mounts = vec![Mount {
        host: "/definitely/not/here".into(),
        container: "/x".into(),
        read_only: false,
        nosuid: false,
    }];
    let e = b.create(&spec).await.err().expect("rejected");
    assert_eq!(e.failure().kind, FailureKind::InvalidSpec);
    assert!(
        e.to_string().contains("mounts[0].host") && e.to_string().contains("/definitely/not/here"),
        "{e}"
    );

    let mut spec = g.spec(BUSYBOX);
    spec.env = vec![EnvVar::Set {
        name: "BAD-NAME".into(),
        value: "x".into(),
    }];
    let e = b.create(&spec).await.err().expect("rejected");
    assert!(
        e.to_string().contains("env[0]") && e.to_string().contains("BAD-NAME"),
        "{e}"
    );

    let e = b
        .create(&g.spec("corral-test/does-not-exist:1"))
        .await
        .err()
        .expect("missing image");
    let f = e.failure();
    assert_eq!(f.kind, FailureKind::ImageNotFound);
    assert!(
        f.message.contains("corral-test/does-not-exist:1") && f.message.contains("no registry"),
        "{}",
        f.message
    );
    assert!(!f.retryable());
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_limit_is_applied_or_refused_clearly() {
    let g = Guard::new("disk");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.limits.disk = Some(1 << 30);
    let supported = common::docker_backend()
        .await
        .storage_opt_supported(BUSYBOX, b.owner())
        .await
        .expect("probe");
    match b.create(&spec).await {
        Ok(sb) => {
            assert!(supported);
            sb.destroy().await.expect("destroy");
        }
        Err(e) => {
            assert!(!supported, "{e}");
            assert_eq!(e.failure().kind, FailureKind::Unsupported);
            assert!(e.to_string().contains("limits.disk"), "{e}");
        }
    }
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn scratch_images_run_the_agent() {
    let g = Guard::new("scratch");
    let b = backend().await;
    let sb = b
        .create(&g.spec(SCRATCH))
        .await
        .expect("create from scratch");
    let r = sb
        .run(&CommandSpec::argv(["/.corral/corral-agent", "--version"]))
        .await;
    assert_eq!(r.failure, None);
    assert!(
        text(&r.stdout).starts_with("corral-agent "),
        "{}",
        text(&r.stdout)
    );
    // No shell in the image: a typed spawn failure, not a hang or a panic.
    let r = sb.run(&sh("true")).await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::SpawnFailed));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

/// What `docker kill` and `docker rm -f` leave is told apart in the
/// failure's state: exited 137, or removed. (The engine-neutral
/// `container_lost` cases are in the shared contract, `tests/contract.rs`.)
#[tokio::test(flavor = "multi_thread")]
async fn container_killed_or_removed_out_of_band_reports_its_state() {
    let g = Guard::new("killed");
    let b = backend().await;
    let spec = g.spec(BUSYBOX);
    let (killed, removed) = tokio::join!(b.create(&spec), b.create(&spec));
    let (killed, removed) = (killed.expect("create"), removed.expect("create"));
    let running = |sb: &corral::Sandbox| {
        let sb = sb.clone();
        tokio::spawn(async move { sb.run(&sh("sleep 60")).await })
    };
    let (on_killed, on_removed) = (running(&killed), running(&removed));
    tokio::time::sleep(Duration::from_millis(500)).await;
    docker(&["kill", &killed.container_id()]);
    docker(&["rm", "-f", &removed.container_id()]);

    let r = on_killed.await.expect("join");
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    let state = f.container.expect("state attached");
    assert_eq!(state.status, "exited");
    assert_eq!(state.exit_code, Some(137));
    assert!(!state.oom_killed);

    let r = on_removed.await.expect("join");
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    assert!(f.message.contains(removed.id()), "{}", f.message);
    assert_eq!(
        f.container.map(|c| c.status.to_string()),
        Some("removed".to_string())
    );
    killed.destroy().await.expect("destroy");
    removed
        .destroy()
        .await
        .expect("destroy of a removed container is fine");
    g.assert_clean();
}

/// gVisor is optional: registering `runsc` reconfigures the daemon, which no
/// ordinary test does, so this runs only where an operator registered it
/// (`corral doctor` says so) and reports a skip elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn gvisor_sandboxes_work_when_runsc_is_registered() {
    let g = Guard::new("gvisor");
    let b = backend().await;
    let report = common::docker_backend()
        .await
        .doctor(None, b.owner())
        .await
        .expect("doctor");
    if !report.runtimes.iter().any(|r| r == "runsc") {
        eprintln!("skipped: the daemon has no runsc runtime registered");
        return;
    }
    let mut spec = g.spec(BUSYBOX);
    spec.runtime = Some("runsc".into());
    spec.network = Network::None;
    spec.limits.memory = Some(64 << 20);
    let sb = b.create(&spec).await.expect("create under gVisor");
    let r = sb.run(&sh("uname -r")).await;
    assert_eq!(r.failure, None);
    assert_eq!(
        text(&r.stdout),
        "4.4.0\n",
        "gVisor reports its own kernel version"
    );
    let r = sb
        .run(&CommandSpec::shell("sleep 100 & sleep 100").timeout(Duration::from_millis(800)))
        .await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::Timeout));
    // Under gVisor the whole sandbox is charged for memory, so an OOM takes
    // the sandbox down: typed as an OOM all the same, never a hang.
    let r = sb
        .run(&sh("dd if=/dev/zero of=/dev/null bs=200M count=1"))
        .await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::OomKilled));
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
