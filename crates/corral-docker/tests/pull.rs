//! Pulls from a real registry (Debian's `docker-registry` on loopback,
//! `corral_testing::registry`): a missing image is pulled and runs, a
//! missing tag is `image_not_found`, a registry that is down is retryable,
//! and concurrent starts of one missing image make one pull, as the
//! registry's own access log counts them. Each test prints its timings (a
//! start that pulls against one that does not); nothing asserts a speed.

mod common;

use std::time::Instant;

use corral::{CommandSpec, FailureKind};
use corral_testing::registry::Registry;

use common::{backend, BackendConfig, Guard, BUSYBOX};
use corral_faultproxy::{Action, FaultProxy, Matcher, Rule};

/// The error of a start that must fail (a sandbox that started anyway is
/// destroyed first).
async fn start_error(b: &corral::Runtime, spec: &corral::SandboxSpec) -> corral::Error {
    match b.create(spec).await {
        Ok(sb) => {
            let _ = sb.destroy().await;
            panic!("the start of {} succeeded", spec.image)
        }
        Err(e) => e,
    }
}

fn registry_with(repo: &str, tag: &str) -> (Registry, String) {
    common::images();
    let registry = Registry::start().expect("start a registry on loopback");
    let image = registry
        .push(BUSYBOX, repo, tag)
        .expect("push the test image to the registry");
    (registry, image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_pulled_and_runs() {
    let (registry, image) = registry_with("corral/pulled", "v1");
    let g = Guard::new("pull-runs");
    let b = backend().await;

    let t = Instant::now();
    let sb = b.create(&g.spec(&image)).await.expect("pulled and started");
    let first = t.elapsed();
    let out = sb.run(&CommandSpec::shell("echo pulled-ok")).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pulled-ok",
        "{out:?}"
    );
    sb.destroy().await.expect("destroy");

    let t = Instant::now();
    let sb = b.create(&g.spec(&image)).await.expect("present now");
    let second = t.elapsed();
    sb.destroy().await.expect("destroy");
    println!("first start (pull included) {first:?}, a start of the present image {second:?}");

    assert_eq!(
        registry.tag_requests("corral/pulled", "v1"),
        1,
        "one pull, the second start found the image: {}",
        registry.log()
    );
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_tag_is_image_not_found_for_every_start_waiting() {
    let (registry, image) = registry_with("corral/tagged", "v1");
    let missing = image.replace(":v1", ":nosuchtag");
    let g = Guard::new("pull-missing-tag");
    let b = backend().await;

    let spec = g.spec(&missing);
    let e = start_error(&b, &spec).await;
    assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");
    assert!(!e.retryable(), "{e}");
    assert!(e.to_string().contains(&missing), "{e}");
    let one_pull = registry.tag_requests("corral/tagged", "nosuchtag");
    assert!(
        one_pull > 0,
        "the daemon asked the registry: {}",
        registry.log()
    );

    // Eight starts at once share one pull and its typed failure. The pull
    // is held at a fault proxy in front of the daemon, so that all eight
    // are waiting before it fails (a start after a failed pull ended makes
    // a new one: the tag may have been pushed meanwhile).
    let sock = std::env::temp_dir().join(format!("corral-pull-tag-{}.sock", std::process::id()));
    let proxy = FaultProxy::start(&sock, "/var/run/docker.sock").expect("proxy");
    proxy
        .set_rules(vec![Rule::new(
            Matcher::new("POST", "/images/create"),
            Action::DelayMs(2000),
        )])
        .expect("rules");
    let b = common::connect(&BackendConfig {
        endpoint: Some(format!("unix://{}", sock.display())),
        ..BackendConfig::default()
    })
    .await
    .expect("connect through the proxy");
    let starts = (0..8).map(|_| start_error(&b, &spec));
    for e in futures_util::future::join_all(starts).await {
        assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");
    }
    assert_eq!(
        registry.tag_requests("corral/tagged", "nosuchtag"),
        2 * one_pull,
        "eight concurrent starts made one pull: {}",
        registry.log()
    );
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_is_down_is_a_retryable_failure() {
    let (mut registry, image) = registry_with("corral/down", "v1");
    registry.stop();
    let g = Guard::new("pull-down");
    let b = backend().await;

    let e = start_error(&b, &g.spec(&image)).await;
    assert_eq!(e.kind(), FailureKind::DaemonUnavailable, "{e}");
    assert!(e.retryable(), "{e}");
    assert!(e.to_string().contains(&image), "{e}");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_past_its_time_is_a_retryable_failure() {
    let (_registry, image) = registry_with("corral/slow", "v1");
    let g = Guard::new("pull-slow");
    // The daemon's pull is held at a fault proxy far longer than the
    // pull may take.
    let sock = std::env::temp_dir().join(format!("corral-pull-slow-{}.sock", std::process::id()));
    let proxy = FaultProxy::start(&sock, "/var/run/docker.sock").expect("proxy");
    proxy
        .set_rules(vec![Rule::new(
            Matcher::new("POST", "/images/create"),
            Action::DelayMs(10_000),
        )])
        .expect("rules");
    let b = common::connect(&BackendConfig {
        endpoint: Some(format!("unix://{}", sock.display())),
        pull_timeout: std::time::Duration::from_millis(300),
        ..BackendConfig::default()
    })
    .await
    .expect("connect through the proxy");

    let e = start_error(&b, &g.spec(&image)).await;
    assert_eq!(e.kind(), FailureKind::DaemonUnavailable, "{e}");
    assert!(e.retryable(), "{e}");
    assert!(e.to_string().contains("daemon.pull_timeout_ms"), "{e}");
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_of_a_missing_image_make_one_pull() {
    let (registry, image) = registry_with("corral/shared", "v1");
    let g = Guard::new("pull-shared");
    let b = backend().await;

    let t = Instant::now();
    let spec = g.spec(&image);
    let starts = (0..8).map(|_| b.create(&spec));
    let sandboxes: Vec<_> = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.expect("every start gets the pulled image"))
        .collect();
    let took = t.elapsed();
    let pulls = registry.tag_requests("corral/shared", "v1");
    println!("8 concurrent starts of a missing image: {took:?}, {pulls} pull(s)");
    for sb in &sandboxes {
        let out = sb.run(&CommandSpec::shell("echo ok")).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{out:?}");
    }
    for sb in sandboxes {
        sb.destroy().await.expect("destroy");
    }
    assert_eq!(pulls, 1, "one pull for eight starts: {}", registry.log());
    g.assert_clean();
}
