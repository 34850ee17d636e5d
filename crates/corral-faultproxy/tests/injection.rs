//! Rules inject what bollard sees from a failing daemon: error answers,
//! dropped connections, slow answers, with seeded probabilities.

mod common;

use std::time::{Duration, Instant};

use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use common::{docker_via, proxy, Sandbox, TestResult};
use corral_faultproxy::{Action, Matcher, Rule};

fn status_of(result: Result<impl std::fmt::Debug, DockerError>) -> Option<(u16, String)> {
    match result {
        Err(DockerError::DockerResponseServerError {
            status_code,
            message,
        }) => Some((status_code, message)),
        _ => None,
    }
}

#[tokio::test]
async fn start_fails_once_with_database_is_locked() -> TestResult {
    let proxy = proxy("start500")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("start500")?;
    let id = sandbox.create(&docker, &["sleep", "300"]).await?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("POST", "/containers/*/start"),
        Action::error(500, "database is locked"),
    )
    .with_probability(1.0)
    .with_max_hits(1)])?;

    let first = docker.start_container(&id, None).await;
    assert_eq!(
        status_of(first),
        Some((500, "database is locked".to_owned()))
    );
    let inspected = docker.inspect_container(&id, None).await?;
    assert_eq!(
        inspected.state.and_then(|s| s.running),
        Some(false),
        "the injected failure must not have reached the daemon"
    );

    docker.start_container(&id, None).await?;
    let inspected = docker.inspect_container(&id, None).await?;
    assert_eq!(inspected.state.and_then(|s| s.running), Some(true));

    let rule = &proxy.stats().rules[0];
    assert_eq!((rule.matched, rule.injected), (2, 1));
    Ok(())
}

#[tokio::test]
async fn reset_makes_ping_fail_with_a_connection_error() -> TestResult {
    let proxy = proxy("reset")?;
    let docker = docker_via(proxy.socket_path())?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("GET", "/_ping"),
        Action::Reset,
    )])?;

    let error = match docker.ping().await {
        Ok(answer) => return Err(format!("ping answered {answer:?} despite the reset").into()),
        Err(error) => error,
    };
    eprintln!("bollard sees the reset as: {error:?}");
    assert!(
        matches!(
            error,
            DockerError::HyperLegacyError { .. }
                | DockerError::HyperResponseError { .. }
                | DockerError::IOError { .. }
        ),
        "expected a connection error, got {error:?}"
    );
    // Other paths are untouched, and the proxy serves on after a reset.
    docker.version().await?;
    proxy.set_rules(vec![])?;
    assert_eq!(docker.ping().await?, "OK");
    Ok(())
}

#[tokio::test]
async fn delay_holds_the_request_back() -> TestResult {
    let proxy = proxy("delay")?;
    let docker = docker_via(proxy.socket_path())?;
    let delay = Duration::from_millis(400);
    proxy.set_rules(vec![Rule::new(
        Matcher::new("GET", "/_ping"),
        Action::delay(delay),
    )])?;

    let started = Instant::now();
    assert_eq!(docker.ping().await?, "OK");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= delay,
        "ping took {elapsed:?}, delay is {delay:?}"
    );
    assert_eq!(proxy.stats().rules[0].injected, 1);
    Ok(())
}

/// Half of 40 pings fail, with a pattern the seed fixes.
#[tokio::test]
async fn probability_is_seeded_and_partial() -> TestResult {
    let proxy = proxy("prob")?;
    let docker = docker_via(proxy.socket_path())?;
    proxy.set_seed(20240601);
    let rule =
        Rule::new(Matcher::new("GET", "/_ping"), Action::error(503, "flaky")).with_probability(0.5);

    let mut patterns = Vec::new();
    for _ in 0..2 {
        // Setting the rules restarts the generator from the seed.
        proxy.set_rules(vec![rule.clone()])?;
        let mut pattern = Vec::new();
        for _ in 0..40 {
            let result = docker.ping().await;
            match status_of(result) {
                Some((503, message)) => {
                    assert_eq!(message, "flaky");
                    pattern.push(true);
                }
                None => pattern.push(false),
                Some(other) => return Err(format!("unexpected answer {other:?}").into()),
            }
        }
        let injected = pattern.iter().filter(|p| **p).count();
        assert!(0 < injected && injected < 40, "{injected} of 40 injected");
        assert_eq!(proxy.stats().rules[0].injected, injected as u64);
        patterns.push(pattern);
    }
    assert_eq!(patterns[0], patterns[1], "same seed, different faults");
    Ok(())
}

/// An error on the hijacked exec start is an ordinary answer; the next
/// exec start is hijacked as usual.
#[tokio::test]
async fn error_on_exec_start_then_hijack_works() -> TestResult {
    let proxy = proxy("execerr")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("execerr")?;
    let id = sandbox.create(&docker, &["sleep", "300"]).await?;
    docker.start_container(&id, None).await?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("POST", "/exec/*/start"),
        Action::error(500, "exec failed by rule"),
    )
    .with_max_hits(1)])?;

    let options = || CreateExecOptions {
        cmd: Some(vec!["echo", "hello"]),
        attach_stdout: Some(true),
        ..Default::default()
    };
    let exec = docker.create_exec(&id, options()).await?;
    let failed = docker
        .start_exec(&exec.id, None::<StartExecOptions>)
        .await
        .map(|_| ());
    assert_eq!(
        status_of(failed),
        Some((500, "exec failed by rule".to_owned()))
    );

    let exec = docker.create_exec(&id, options()).await?;
    let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await?
    else {
        return Err("exec started detached".into());
    };
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(
        Duration::from_secs(30),
        futures_util::StreamExt::next(&mut output),
    )
    .await?
    {
        text.push_str(&chunk?.to_string());
    }
    assert_eq!(text, "hello\n");
    assert_eq!(proxy.stats().upgraded, 1);
    Ok(())
}

/// Rules match paths with a version prefix too (bollard 0.21 sends none).
#[tokio::test]
async fn rules_ignore_the_version_prefix() -> TestResult {
    let proxy = proxy("prefix")?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("GET", "/version"),
        Action::error(500, "versioned"),
    )])?;
    let stream = tokio::net::UnixStream::connect(proxy.socket_path()).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(hyper_util::rt::TokioIo::new(stream))
    .await?;
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("/v1.41/version?x=1")
        .header("host", "docker")
        .body(http_body_util::Empty::new())?;
    let response = sender.send_request(request).await?;
    assert_eq!(response.status().as_u16(), 500);
    assert_eq!(proxy.stats().rules[0].injected, 1);
    Ok(())
}
