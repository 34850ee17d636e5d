//! Self-healing on the real daemon: `recreate` keeping a bind-mounted
//! workspace and replacing a killed container, start-up commands, a cut
//! control stream, the start breaker, and orphan reaping. A sandbox
//! removed out of band under `fail` and `recreate` is a case of the
//! shared contract in `tests/contract.rs`.

mod common;

use std::time::Duration;

use common::{backend, docker, Guard, BUSYBOX};
use corral_core::{CommandSpec, FailureKind, Recovery};

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn recreate_policy_brings_the_container_back_and_retries_once() {
    let g = Guard::new("policy-recreate");
    let b = backend().await;
    let dir = std::env::temp_dir().join(format!("corral-recreate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut spec = g.spec(BUSYBOX);
    spec.recovery = Recovery::Recreate;
    spec.mounts = vec![corral_core::Mount {
        host: dir.display().to_string(),
        container: "/workspace".into(),
        read_only: false,
        nosuid: false,
    }];
    spec.startup = vec!["echo started >> /workspace/startups".into()];
    let sb = b.create(&spec).await.expect("create");
    sb.run(&sh("echo kept > /workspace/file")).await;
    let old = sb.container_id();

    // Removed while a command runs: the command is retried in a new container.
    let running = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.run(&sh("sleep 2; cat /workspace/file")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    docker(&["rm", "-f", &old]);
    let r = running.await.expect("join");
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(
        text(&r.stdout),
        "kept\n",
        "the bind-mounted workspace survives"
    );
    assert_ne!(sb.container_id(), old);
    assert_eq!(
        std::fs::read_to_string(dir.join("startups")).expect("startups"),
        "started\nstarted\n"
    );

    // Killed between commands: the next command recreates transparently.
    docker(&["kill", &sb.container_id()]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = sb.run(&sh("echo again")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "again\n");

    // A genuine non-zero exit is never mistaken for a lost container.
    let before = sb.container_id();
    let r = sb.run(&sh("exit 1")).await;
    assert_eq!((r.exit_code, r.failure), (Some(1), None));
    assert_eq!(sb.container_id(), before);
    assert_eq!(b.metrics().recreated, 2);

    sb.destroy().await.expect("destroy");
    std::fs::remove_dir_all(&dir).ok();
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_startup_command_fails_the_start_and_leaves_nothing() {
    let g = Guard::new("startup-fails");
    let b = backend().await;
    let mut spec = g.spec(BUSYBOX);
    spec.startup = vec!["true".into(), "echo no >&2; exit 4".into()];
    let e = b.create(&spec).await.err().expect("start-up fails");
    assert!(
        e.to_string().contains("start-up command 1") && e.to_string().contains("no"),
        "{e}"
    );
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_control_stream_is_reattached_for_the_next_command() {
    use common::BackendConfig;
    use corral_faultproxy::FaultProxy;

    common::images();
    let g = Guard::new("stream-cut");
    let sock = std::env::temp_dir().join(format!("corral-cut-{}.sock", std::process::id()));
    let proxy = FaultProxy::start(&sock, "/var/run/docker.sock").expect("proxy");
    let b = common::connect(&BackendConfig {
        endpoint: Some(format!("unix://{}", sock.display())),
        shared_slots: false,
        reap_orphans: false,
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let sb = b.create(&g.spec(BUSYBOX)).await.expect("create");
    assert_eq!(text(&sb.run(&sh("echo before")).await.stdout), "before\n");

    // The attach connection drops while a command runs (a daemon restart, a
    // network fault): that command cannot be reported, the sandbox lives on.
    let runner = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.run(&sh("sleep 30; echo never")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.cut_hijacked();
    let r = runner.await.expect("join");
    let f = r.failure.expect("a command cut off from its report fails");
    assert_eq!(f.kind, FailureKind::AgentError, "{f}");

    // The next command re-attaches (a new session: the cut-off command's
    // tree is killed) and runs normally.
    let r = sb
        .run(&sh("echo after; ps -o args | grep -c '[s]leep 30'"))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "after\n0\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn breaker_opens_on_daemon_errors_and_recovers_by_itself() {
    use common::BackendConfig;
    use corral_core::breaker::BreakerConfig;
    use corral_core::RetryPolicy;
    use corral_faultproxy::{Action, FaultProxy, Matcher, Rule};

    common::images();
    let g = Guard::new("breaker");
    let sock = std::env::temp_dir().join(format!("corral-breaker-{}.sock", std::process::id()));
    let proxy = FaultProxy::start(&sock, "/var/run/docker.sock").expect("proxy");
    // Six starts in a row fail as if the daemon were overloaded, then it heals.
    proxy
        .set_rules(vec![Rule::new(
            Matcher::new("POST", "/containers/*/start"),
            Action::error(500, "database is locked"),
        )
        .with_max_hits(6)])
        .expect("rules");
    let b = common::connect(&BackendConfig {
        endpoint: Some(format!("unix://{}", sock.display())),
        retry: RetryPolicy::none(),
        shared_slots: false,
        reap_orphans: false,
        breaker: BreakerConfig {
            window: 4,
            min_samples: 4,
            error_rate: 0.5,
            cooldown_ms: 300,
            ..BreakerConfig::default()
        },
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let mut failures = 0;
    let mut created = None;
    for _ in 0..10 {
        match b.create(&g.spec(BUSYBOX)).await {
            Ok(sb) => {
                created = Some(sb);
                break;
            }
            Err(e) => {
                assert_eq!(e.failure().kind, FailureKind::DaemonUnavailable, "{e}");
                assert!(e.retryable());
                failures += 1;
            }
        }
    }
    let sb = created.expect("starts recover once the daemon heals");
    let m = b.metrics();
    assert_eq!(failures, 6);
    // Four failures open it; the two failed half-open probes reopen it.
    assert_eq!(m.breaker_opened, 3, "{m:?}");
    // Held back while open (how long depends on the machine's load: part of
    // each cool-down passes while the failed start is cleaned up).
    assert!(
        m.breaker_wait_us > 0,
        "starts were held back while open: {m:?}"
    );
    let r = sb.run(&sh("echo ok")).await;
    assert_eq!(text(&r.stdout), "ok\n");
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn orphans_are_reaped_at_connect_but_live_owners_are_not() {
    use common::BackendConfig;
    common::images();
    let g = Guard::new("reaper");
    let host = corral::host::hostname();
    // An orphan: its owner pid does not exist (pid_max is far below this).
    let orphan = docker(&[
        "create",
        "--label",
        "corral.sandbox=orphan-test",
        "--label",
        "corraltest=reaper",
        "--label",
        &format!("corral.owner.host={host}"),
        "--label",
        "corral.owner.pid=999999999",
        "--label",
        "corral.owner.start=1",
        BUSYBOX,
        "true",
    ]);
    // A live one: owned by this very process.
    let me = corral::host::this_owner();
    let live = docker(&[
        "create",
        "--label",
        "corral.sandbox=live-test",
        "--label",
        "corraltest=reaper",
        "--label",
        &format!("corral.owner.host={}", me.host),
        "--label",
        &format!("corral.owner.pid={}", me.pid),
        "--label",
        &format!("corral.owner.start={}", me.start),
        BUSYBOX,
        "true",
    ]);
    // `docker ps -q` lists short ids.
    let short = |id: &str| id.trim().chars().take(12).collect::<String>();
    let (orphan, live) = (short(&orphan), short(&live));
    // The orphan may already be gone: every backend connected in this test
    // process reaps at connect, and other tests connect concurrently. The
    // live one must be there, now and after the reap below.
    assert!(!orphan.is_empty(), "docker create printed no id");
    let present = g.remaining();
    assert!(present.contains(&live), "{present:?}");
    let _b = common::connect(&BackendConfig {
        shared_slots: false,
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // This backend's reaper (or another test's, in this process) removes it.
    while g.remaining().contains(&orphan) {
        assert!(
            std::time::Instant::now() < deadline,
            "the orphan was not reaped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        g.remaining().contains(&live),
        "a live owner's container was reaped"
    );
    docker(&["rm", "-f", &live]);
    g.assert_clean();
}
