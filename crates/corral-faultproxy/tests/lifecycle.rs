//! Starting and stopping a proxy: the socket file, stale and live sockets,
//! and a daemon socket that is not there.

mod common;

use bollard::errors::Error as DockerError;
use common::{docker_via, socket_path, TestResult};
use corral_faultproxy::{Error, FaultProxy, DEFAULT_UPSTREAM};

#[tokio::test]
async fn drop_removes_the_socket_and_stops_serving() -> TestResult {
    let path = socket_path("drop");
    let proxy = FaultProxy::start(&path, DEFAULT_UPSTREAM)?;
    assert_eq!(proxy.socket_path(), path);
    assert!(path.exists());
    drop(proxy);
    assert!(!path.exists());
    assert!(tokio::net::UnixStream::connect(&path).await.is_err());
    Ok(())
}

#[tokio::test]
async fn live_socket_is_refused_and_stale_one_replaced() -> TestResult {
    let path = socket_path("reuse");
    let first = FaultProxy::start(&path, DEFAULT_UPSTREAM)?;
    match FaultProxy::start(&path, DEFAULT_UPSTREAM) {
        Err(Error::InUse { path: p }) => assert_eq!(p, path),
        other => return Err(format!("expected InUse, got {other:?}").into()),
    }
    // The refused start must not have broken the running proxy.
    assert_eq!(docker_via(&path)?.ping().await?, "OK");
    drop(first);

    // A socket file nobody listens on, as a killed proxy leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&path)?);
    assert!(path.exists());
    let second = FaultProxy::start(&path, DEFAULT_UPSTREAM)?;
    assert_eq!(docker_via(second.socket_path())?.ping().await?, "OK");
    Ok(())
}

#[tokio::test]
async fn missing_daemon_is_a_502_not_a_hang() -> TestResult {
    let proxy = FaultProxy::start(socket_path("nodaemon"), socket_path("absent"))?;
    match docker_via(proxy.socket_path())?.ping().await {
        Err(DockerError::DockerResponseServerError {
            status_code: 502,
            message,
        }) => assert!(message.contains("cannot connect"), "{message}"),
        other => return Err(format!("expected a 502, got {other:?}").into()),
    }
    assert_eq!(proxy.stats().upstream_errors, 1);
    Ok(())
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let result = FaultProxy::start(socket_path("nort"), DEFAULT_UPSTREAM);
    assert!(matches!(result, Err(Error::NoRuntime(_))), "{result:?}");
}

/// Garbage on the socket gets hyper's 400 and a closed connection; the
/// proxy serves on.
#[tokio::test]
async fn malformed_http_does_not_hurt_the_proxy() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let proxy = FaultProxy::start(socket_path("garbage"), DEFAULT_UPSTREAM)?;
    let inputs: [&[u8]; 5] = [
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET /_ping HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"GET /_ping HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: x\r\n\r\nzz\r\n",
        b"PUT /_faultproxy/rules HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n[{]}\xff",
        b"GET /_ping HTTP/1.1\r\nHost: x\r\n",
    ];
    for input in inputs {
        let mut stream = tokio::net::UnixStream::connect(proxy.socket_path()).await?;
        stream.write_all(input).await?;
        stream.shutdown().await?;
        let mut answer = Vec::new();
        // Either an error answer or a plain close; never a hang or a crash.
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            stream.read_to_end(&mut answer),
        )
        .await?;
    }
    assert_eq!(docker_via(proxy.socket_path())?.ping().await?, "OK");
    Ok(())
}
