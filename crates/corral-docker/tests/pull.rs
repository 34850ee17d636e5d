//! Pulls from a real registry (Debian's `docker-registry` on loopback,
//! `corral_testing::registry`): a missing image is pulled and runs, a
//! missing tag is `image_not_found`, a registry that is down is retryable,
//! and concurrent starts of one missing image make one pull, as the
//! registry's own access log counts them; at most `daemon.pull_limit` pulls
//! run at once (the others are seen queued); a registry that wants a login
//! is pulled from with the operator's credentials file and refused without
//! it; a registry that dies mid-pull (a relay in front of it cuts every
//! connection) is a retryable failure and the next start after it comes
//! back pulls afresh. Each test prints its timings (a start that pulls
//! against one that does not); nothing asserts a speed.

mod common;

use std::time::Instant;

use corral::{CommandSpec, FailureKind};
use corral_testing::registry::{Registry, Relay};

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

/// A registry holding `repo:tag`: the test image plus a layer of 4 MB no
/// daemon holds, so a pull downloads it (the test image's own layers are
/// on the daemon already).
fn registry_with(repo: &str, tag: &str) -> (Registry, String) {
    common::images();
    let registry = Registry::start().expect("start a registry on loopback");
    let image = registry
        .push_unique(BUSYBOX, repo, tag, 4 << 20)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_beyond_the_limit_queue_and_every_start_gets_its_image() {
    common::images();
    let registry = Registry::start().expect("start a registry on loopback");
    let relay = Relay::start(&registry.host).expect("relay");
    let tags = ["a", "b", "c"];
    for tag in tags {
        registry
            .push_unique(BUSYBOX, "corral/limited", tag, 256 << 10)
            .expect("push an image with a new layer");
    }
    // Each pull takes a while (the relay paces the registry's answers),
    // so the three are in flight together unless the limit holds them.
    relay.slow_down(20);
    let g = Guard::new("pull-limit");
    let b = common::connect(&BackendConfig {
        pull_limit: 1,
        ..BackendConfig::default()
    })
    .await
    .expect("connect");

    let specs: Vec<_> = tags
        .iter()
        .map(|t| g.spec(&relay.image("corral/limited", t)))
        .collect();
    let starts = futures_util::future::join_all(specs.iter().map(|s| b.create(s)));
    let watch = async {
        let (mut most_pulling, mut queued_seen) = (0, 0);
        loop {
            let pulls = b.backend().pulls();
            let pulling = pulls.iter().filter(|p| !p.progress.queued).count();
            most_pulling = most_pulling.max(pulling);
            queued_seen = queued_seen.max(pulls.len() - pulling);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            if pulls.is_empty() && queued_seen > 0 {
                return (most_pulling, queued_seen);
            }
        }
    };
    let t = Instant::now();
    let (sandboxes, (most_pulling, queued_seen)) = tokio::join!(starts, watch);
    println!("3 images, pull_limit 1: {:?}", t.elapsed());
    let sandboxes: Vec<_> = sandboxes
        .into_iter()
        .map(|r| r.expect("every start gets its image"))
        .collect();
    for sb in sandboxes {
        sb.destroy().await.expect("destroy");
    }
    assert_eq!(
        most_pulling, 1,
        "never more than daemon.pull_limit pulls at once"
    );
    assert!(queued_seen >= 1, "the others waited, seen as queued");
    relay.revive();
    g.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_with_a_login_is_pulled_from_with_the_operators_credentials_file() {
    common::images();
    let registry = Registry::start_with_login("trainer", "s3cret-pass")
        .expect("start a registry with a login");
    let image = registry
        .push(BUSYBOX, "corral/private", "v1")
        .expect("push with the registry's login");
    let g = Guard::new("pull-login");

    // Anonymous: refused, and retrying would not help.
    let b = backend().await;
    let e = start_error(&b, &g.spec(&image)).await;
    assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");
    assert!(!e.retryable(), "{e}");

    // A credentials file with another password: refused the same way.
    let dir = std::env::temp_dir().join(format!("corral-auth-{}", corral::host::random_hex(6)));
    std::fs::create_dir_all(&dir).expect("dir");
    let wrong = dir.join("wrong.json");
    let auth = base64_of(b"trainer:not-the-password");
    std::fs::write(
        &wrong,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#,
            registry.host
        ),
    )
    .expect("write");
    let b = common::connect(&BackendConfig {
        registry_auth_file: Some(wrong.clone()),
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let e = start_error(&b, &g.spec(&image)).await;
    assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");

    // A file that is not a credentials file: the error names it.
    let broken = dir.join("broken.json");
    std::fs::write(&broken, "{not json").expect("write");
    let b = common::connect(&BackendConfig {
        registry_auth_file: Some(broken.clone()),
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let e = start_error(&b, &g.spec(&image)).await;
    assert!(
        e.to_string().contains(&broken.display().to_string())
            && e.to_string().contains("daemon.registry_auth_file"),
        "{e}"
    );

    // The file `docker login` wrote: pulled, and it runs.
    let b = common::connect(&BackendConfig {
        registry_auth_file: registry.credentials_file(),
        ..BackendConfig::default()
    })
    .await
    .expect("connect");
    let sb = b
        .create(&g.spec(&image))
        .await
        .expect("pulled with the login");
    let out = sb.run(&CommandSpec::shell("echo private-ok")).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "private-ok",
        "{out:?}"
    );
    sb.destroy().await.expect("destroy");
    let _ = std::fs::remove_dir_all(&dir);
    g.assert_clean();
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_dies_mid_pull_is_retryable_and_the_next_start_pulls_afresh() {
    common::images();
    let registry = Registry::start().expect("start a registry on loopback");
    // A layer of 4 MB no daemon holds: the pull has to download it.
    registry
        .push_unique(BUSYBOX, "corral/dies", "v1", 4 << 20)
        .expect("push an image with a new layer");
    let relay = Relay::start(&registry.host).expect("relay");
    let image = relay.image("corral/dies", "v1");
    let g = Guard::new("pull-dies");
    // Past the manifest and config (a few KiB), inside the layer: the
    // registry dies while the daemon downloads it. The daemon retries a
    // layer on its own for a while; the pull's bound ends the wait.
    relay.die_after(64 * 1024);
    let b = common::connect(&BackendConfig {
        pull_timeout: std::time::Duration::from_secs(4),
        ..BackendConfig::default()
    })
    .await
    .expect("connect");

    let t = Instant::now();
    let e = start_error(&b, &g.spec(&image)).await;
    println!("a pull whose registry died: {:?}: {e}", t.elapsed());
    assert!(relay.is_dead(), "the registry died mid-pull");
    assert_eq!(e.kind(), FailureKind::DaemonUnavailable, "{e}");
    assert!(e.retryable(), "{e}");
    assert!(e.to_string().contains(&image), "{e}");
    assert!(b.backend().pulls().is_empty(), "nothing is left in flight");

    // The registry is back: the next start pulls, and runs.
    relay.revive();
    let sb = b
        .create(&g.spec(&image))
        .await
        .expect("pulled once the registry is back");
    let out = sb.run(&CommandSpec::shell("echo back-ok")).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "back-ok",
        "{out:?}"
    );
    sb.destroy().await.expect("destroy");
    g.assert_clean();
}
