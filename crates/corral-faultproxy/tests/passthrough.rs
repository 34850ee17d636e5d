//! With no rules, everything bollard does against the real daemon works the
//! same through the proxy: plain calls, hijacked exec with stdin, large
//! request and response bodies, never-ending event streams, keep-alive.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::EventMessage;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bollard::{body_full, body_try_stream, Docker};
use bytes::Bytes;
use common::{docker_via, proxy, BoxError, Sandbox, TestResult, LABEL};
use futures_util::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn ping_version_and_list_pass_through() -> TestResult {
    let proxy = proxy("plain")?;
    let docker = docker_via(proxy.socket_path())?;

    assert_eq!(docker.ping().await?, "OK");
    let version = docker.version().await?;
    assert!(version.api_version.is_some(), "{version:?}");
    let filters = HashMap::from([("label", vec![LABEL])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker.list_containers(Some(options)).await?;

    let stats = proxy.stats();
    assert_eq!((stats.requests, stats.forwarded), (3, 3));
    assert_eq!(stats.upstream_errors, 0);
    Ok(())
}

/// `cat` through an attached exec: stdin bytes go in, the same bytes come
/// back, and closing stdin (half-close) ends the exec while output still
/// flows back.
#[tokio::test]
async fn exec_with_stdin_round_trips_through_the_hijack() -> TestResult {
    let proxy = proxy("exec")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("exec")?;
    let id = sandbox.create(&docker, &["sleep", "300"]).await?;
    docker.start_container(&id, None).await?;

    let exec = docker
        .create_exec(
            &id,
            CreateExecOptions {
                cmd: Some(vec!["cat"]),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = docker.start_exec(&exec.id, None).await?
    else {
        return Err("exec started detached".into());
    };

    // Read while writing: cat blocks once the output pipe is full.
    let reader = tokio::spawn(async move {
        let mut echoed = Vec::new();
        while let Some(chunk) = output.next().await {
            match chunk? {
                LogOutput::StdOut { message } => echoed.extend_from_slice(&message),
                other => return Err(format!("unexpected output {other:?}").into()),
            }
        }
        Ok::<_, BoxError>(echoed)
    });
    let payload: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    for chunk in payload.chunks(10_000) {
        input.write_all(chunk).await?;
    }
    input.shutdown().await?;

    let echoed = tokio::time::timeout(Duration::from_secs(60), reader).await???;
    assert_eq!(echoed.len(), payload.len());
    assert!(echoed == payload, "echoed bytes differ from what was sent");

    let inspected = docker.inspect_exec(&exec.id).await?;
    assert_eq!(inspected.exit_code, Some(0), "{inspected:?}");
    assert_eq!(inspected.running, Some(false));
    let container = docker.inspect_container(&id, None).await?;
    assert_eq!(container.state.and_then(|s| s.running), Some(true));

    docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::default().force(true).build()),
        )
        .await?;
    assert!(sandbox.remaining().is_empty());
    assert_eq!(proxy.stats().upgraded, 1);
    Ok(())
}

fn tar_of(name: &str, data: &[u8]) -> Result<Vec<u8>, BoxError> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, name, data)?;
    Ok(builder.into_inner()?)
}

async fn download(docker: &Docker, id: &str, path: &str) -> Result<Vec<u8>, BoxError> {
    let options = DownloadFromContainerOptionsBuilder::default()
        .path(path)
        .build();
    let chunks: Vec<Bytes> = docker
        .download_from_container(id, Some(options))
        .try_collect()
        .await?;
    let tar_bytes = chunks.concat();
    let mut archive = tar::Archive::new(tar_bytes.as_slice());
    let mut entry = archive.entries()?.next().ok_or("empty archive")??;
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut data)?;
    Ok(data)
}

/// A 1.5 MB tar goes up twice — with a Content-Length and chunked — and
/// comes back byte for byte.
#[tokio::test]
async fn large_archive_upload_and_download() -> TestResult {
    let proxy = proxy("archive")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("archive")?;
    let id = sandbox.create(&docker, &["sleep", "300"]).await?;

    let mut state = 0x1234_5678u32;
    let blob: Vec<u8> = (0..1_500_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let upload = || {
        UploadToContainerOptionsBuilder::default()
            .path("/tmp")
            .build()
    };

    let whole = tar_of("whole.bin", &blob)?;
    docker
        .upload_to_container(&id, Some(upload()), body_full(whole.into()))
        .await?;

    let streamed = tar_of("streamed.bin", &blob)?;
    let chunks: Vec<Result<Bytes, std::io::Error>> = streamed
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    docker
        .upload_to_container(
            &id,
            Some(upload()),
            body_try_stream(futures_util::stream::iter(chunks)),
        )
        .await?;

    assert!(download(&docker, &id, "/tmp/whole.bin").await? == blob);
    assert!(download(&docker, &id, "/tmp/streamed.bin").await? == blob);
    Ok(())
}

/// The events stream never ends, so seeing events at all proves the proxy
/// forwards it as it arrives; the second container is created only after
/// the stream already delivered, so its event cannot be a replay.
#[tokio::test]
async fn events_stream_is_forwarded_as_it_arrives() -> TestResult {
    let proxy = proxy("events")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("events")?;

    // `since` makes the daemon replay anything between now and the moment
    // the stream is established, so the first create cannot be missed.
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)?
        .as_secs()
        .saturating_sub(1)
        .to_string();
    let label = format!("{LABEL}={}", sandbox.label);
    let filters = HashMap::from([
        ("label", vec![label.as_str()]),
        ("type", vec!["container"]),
        ("event", vec!["create"]),
    ]);
    let options = EventsOptionsBuilder::default()
        .since(&since)
        .filters(&filters)
        .build();
    let mut events = Box::pin(docker.events(Some(options)));

    let first = sandbox.create(&docker, &["true"]).await?;
    assert_eq!(next_created(&mut events).await?, first);
    let second = sandbox.create(&docker, &["true"]).await?;
    assert_eq!(next_created(&mut events).await?, second);
    Ok(())
}

/// The id of the container in the next `create` event.
async fn next_created(
    events: &mut (impl Stream<Item = Result<EventMessage, bollard::errors::Error>> + Unpin),
) -> Result<String, BoxError> {
    let event = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await?
        .ok_or("event stream ended")??;
    assert_eq!(event.action.as_deref(), Some("create"));
    Ok(event.actor.and_then(|a| a.id).unwrap_or_default())
}

/// A followed log never ends while the container runs, so the first line
/// arriving proves the proxy streams it.
#[tokio::test]
async fn followed_logs_stream_as_they_arrive() -> TestResult {
    let proxy = proxy("logs")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("logs")?;
    let id = sandbox
        .create(&docker, &["sh", "-c", "echo first; sleep 300"])
        .await?;
    docker.start_container(&id, None).await?;
    let options = LogsOptionsBuilder::default()
        .follow(true)
        .stdout(true)
        .build();
    let mut logs = Box::pin(docker.logs(&id, Some(options)));
    let line = tokio::time::timeout(Duration::from_secs(30), logs.next())
        .await?
        .ok_or("log stream ended")??;
    assert_eq!(line.to_string(), "first\n");
    Ok(())
}

/// One client connection carries many requests, including one answered by
/// the proxy itself, a HEAD and a version-prefixed path.
#[tokio::test]
async fn keep_alive_connection_carries_many_requests() -> TestResult {
    use corral_faultproxy::{Action, Matcher, Rule};
    let proxy = proxy("keepalive")?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("GET", "/info"),
        Action::error(503, "injected"),
    )])?;
    let stream = tokio::net::UnixStream::connect(proxy.socket_path()).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);

    let requests = [
        ("GET", "/_ping", 200),
        ("HEAD", "/_ping", 200),
        ("GET", "/v1.41/version", 200),
        ("GET", "/info", 503),
        ("GET", "/containers/json?all=1", 200),
        ("GET", "/v1.41/_ping", 200),
    ];
    for (method, path, status) in requests {
        sender.ready().await?;
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "docker")
            .body(Empty::new())?;
        let response = sender.send_request(request).await?;
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        let body = response.into_body().collect().await?.to_bytes();
        match (method, path) {
            ("HEAD", _) => assert!(body.is_empty()),
            (_, "/_ping" | "/v1.41/_ping") => assert_eq!(body, "OK"),
            (_, "/info") => assert_eq!(body.as_ref(), b"{\"message\":\"injected\"}\n"),
            _ => assert!(!body.is_empty()),
        }
    }
    assert!(
        !connection.is_finished(),
        "the connection was not kept alive"
    );
    assert_eq!(proxy.stats().requests, requests.len() as u64);
    Ok(())
}
