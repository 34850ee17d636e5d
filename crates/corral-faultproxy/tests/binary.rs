//! The `corral-faultproxy` binary as another process would use it, and the
//! control API it shares with the library.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::errors::Error as DockerError;
use common::{docker_via, proxy, socket_path, unique, BoxError, TestResult};
use corral_faultproxy::{Action, ControlClient, ControlError, Matcher, Rule};
use http::{Method, StatusCode};

/// Kills the child if a test fails before stopping it.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_for_socket(path: &Path, child: &mut Child) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("corral-faultproxy exited early: {status}").into());
        }
        if Instant::now() > deadline {
            return Err("corral-faultproxy did not start listening".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rejected_field(result: Result<(), ControlError>) -> Option<(u16, Option<String>)> {
    match result {
        Err(ControlError::Rejected { status, field, .. }) => Some((status, field)),
        _ => None,
    }
}

#[tokio::test]
async fn binary_takes_rules_and_reports_stats_over_its_socket() -> TestResult {
    let listen = socket_path("bin");
    let rules_file = std::env::temp_dir().join(format!("{}.json", unique("rules")));
    std::fs::write(
        &rules_file,
        r#"{"seed": 7,
            "rules": [{"method": "GET", "path": "/version",
                       "action": {"error": {"status": 500, "message": "injected by file"}}}],
            "tracked": [{"method": "GET", "path": "/_ping"}]}"#,
    )?;
    let child = Command::new(env!("CARGO_BIN_EXE_corral-faultproxy"))
        .arg("--listen")
        .arg(&listen)
        .arg("--rules")
        .arg(&rules_file)
        .args(["--track", "GET /info"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()?;
    let mut child = Process(child);
    wait_for_socket(&listen, &mut child.0).await?;
    let docker = docker_via(&listen)?;
    let control = ControlClient::new(&listen);

    // Rules from the file apply.
    match docker.version().await {
        Err(DockerError::DockerResponseServerError {
            status_code: 500,
            message,
        }) => assert_eq!(message, "injected by file"),
        other => return Err(format!("expected the injected 500, got {other:?}").into()),
    }
    assert_eq!(docker.ping().await?, "OK");
    let stats = control.stats().await?;
    assert_eq!(stats.requests, 2);
    assert_eq!((stats.rules[0].matched, stats.rules[0].injected), (1, 1));
    let tracked: Vec<_> = stats
        .tracked
        .iter()
        .map(|t| (t.path.as_str(), t.total))
        .collect();
    assert_eq!(tracked, [("/_ping", 1), ("/info", 0)]);

    // Rules changed over the socket apply to the next request.
    control
        .set_rules(&[Rule::new(
            Matcher::new("GET", "/_ping"),
            Action::error(503, "changed at runtime"),
        )])
        .await?;
    docker.version().await?;
    match docker.ping().await {
        Err(DockerError::DockerResponseServerError { status_code, .. }) => {
            assert_eq!(status_code, 503)
        }
        other => return Err(format!("expected the injected 503, got {other:?}").into()),
    }
    assert_eq!(control.rules().await?.len(), 1);

    control.reset_stats().await?;
    assert_eq!(control.stats().await?.requests, 0);

    // Malformed control requests are refused, naming the field.
    let bad = control.send(
        Method::PUT,
        "rules",
        r#"[{"path": "/x", "action": "reset", "probability": "often"}]"#,
    );
    let (status, body) = bad.await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(body["field"], "rules[0].probability", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("often")),
        "{body}"
    );
    let (status, _) = control.send(Method::PUT, "rules", "{not json").await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = control.send(Method::GET, "nothing-here", "").await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = control.send(Method::DELETE, "stats", "").await?;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = control.send(Method::PUT, "seed", "-1").await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body)?["field"],
        "seed"
    );
    // The refused rules did not replace the good ones.
    assert_eq!(control.rules().await?.len(), 1);

    // SIGTERM stops it cleanly and removes the socket.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()?;
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.0.try_wait()?.is_none() {
        if Instant::now() > deadline {
            return Err("corral-faultproxy ignored SIGTERM".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!listen.exists(), "socket file left behind");
    let _ = std::fs::remove_file(&rules_file);
    Ok(())
}

#[tokio::test]
async fn binary_refuses_a_bad_rules_file_naming_the_field() -> TestResult {
    let listen = socket_path("badbin");
    let rules_file = std::env::temp_dir().join(format!("{}.json", unique("badrules")));
    std::fs::write(
        &rules_file,
        r#"[{"path": "/_ping", "action": {"delay_ms": 10}}, {"path": "/x", "action": "boom"}]"#,
    )?;
    let output = Command::new(env!("CARGO_BIN_EXE_corral-faultproxy"))
        .arg("--listen")
        .arg(&listen)
        .arg("--rules")
        .arg(&rules_file)
        .output()?;
    let _ = std::fs::remove_file(&rules_file);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("rules[1].action"), "{stderr}");
    assert!(!listen.exists());
    Ok(())
}

/// The library proxy serves the same control API, and both views agree.
#[tokio::test]
async fn library_proxy_serves_the_control_api() -> TestResult {
    let proxy = proxy("libctl")?;
    let control = ControlClient::new(proxy.socket_path());
    let rules = vec![
        Rule::new(Matcher::any_method("/containers/**"), Action::Reset).with_probability(0.25),
    ];
    control.set_rules(&rules).await?;
    assert_eq!(proxy.rules(), rules);
    control
        .set_tracked(&[Matcher::new("POST", "/containers/*/start")])
        .await?;
    control.set_seed(99).await?;
    assert_eq!(proxy.config().seed, 99);
    assert_eq!(proxy.config().tracked.len(), 1);

    let result = control
        .set_tracked(&[Matcher::new("POST", "no-leading-slash")])
        .await;
    assert_eq!(
        rejected_field(result),
        Some((400, Some("tracked[0].path".to_owned())))
    );

    docker_via(proxy.socket_path())?.ping().await?;
    assert_eq!(control.stats().await?, proxy.stats());
    assert_eq!(
        proxy.stats().requests,
        1,
        "control requests are not counted"
    );
    Ok(())
}
