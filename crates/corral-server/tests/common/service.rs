//! A real service for the trust tests: `corral_server::serve` on a real
//! TCP listener (and Unix socket) over the real daemon, its runtime files in
//! a scratch directory, and raw HTTP/1.1 requests, so every header is
//! exactly what a client or an attacker sends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral::{Provider, Runtime, RuntimeConfig};
use corral_core::config::Config;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::{images, BUSYBOX};

/// A running service and what a local client knows about it.
pub struct Service {
    pub addr: SocketAddr,
    /// The port-link listener.
    pub ports: SocketAddr,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub unix: Option<PathBuf>,
    /// The E2B-compatible listener, when the config asks for one.
    pub e2b: Option<SocketAddr>,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub dir: PathBuf,
}

/// A scratch directory under the system's temp dir, removed by `Service::stop`.
fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "corral-trust-{label}-{}",
        corral::host::random_hex(8)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The service with the test's label on every sandbox, its runtime files
/// in a scratch directory, and `tweak` applied to the configuration.
pub async fn start(label: &str, tweak: impl FnOnce(&mut Config, &Path)) -> Service {
    images();
    let dir = scratch(label);
    let mut c = Config::default();
    c.defaults.image = BUSYBOX.into();
    c.defaults.labels.insert("corraltest".into(), label.into());
    c.server.listen = "127.0.0.1:0".into();
    c.server.runtime_dir = Some(dir.join("runtime").display().to_string());
    c.server.shutdown_grace_ms = 1_000;
    c.persistence_root = Some(dir.join("workspaces").display().to_string());
    tweak(&mut c, &dir);
    // Other people's tests share the daemon: reap nothing of theirs.
    let backend = runtime(RuntimeConfig {
        reap_orphans: false,
        snapshot_dir: Some(dir.join("snapshots")),
        ..RuntimeConfig::default()
    })
    .await;
    let provider = Provider::with_persistence_root(
        backend.clone(),
        c.provider.clone(),
        c.persistence_root(&corral::host::RealHost),
    );
    let configured = c.server.token.clone();
    let unix = c.server.unix_socket.clone().map(PathBuf::from);
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(corral_server::serve(
        c,
        backend,
        provider,
        BUSYBOX.into(),
        stop.clone(),
        move |b| {
            let _ = tx.send(b.clone());
        },
    ));
    let bound = rx.await.expect("the service bound its listeners");
    // What a local client does: read the generated token from its file.
    let token = match &bound.token_file {
        Some(file) => {
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(file).expect("token file"))
                    .expect("token file is JSON");
            assert_eq!(v["url"], format!("http://{}", bound.tcp));
            v["token"].as_str().map(String::from)
        }
        None => configured,
    };
    Service {
        addr: bound.tcp,
        ports: bound.ports,
        token,
        token_file: bound.token_file,
        unix,
        e2b: bound.e2b,
        stop,
        task,
        dir,
    }
}

impl Service {
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token.as_deref().expect("a token"))
    }

    /// A request with the right Host and the token.
    pub fn req(&self, method: &str, path: &str) -> Req {
        Req::new(method, path).header("Authorization", &self.bearer())
    }

    pub async fn send(&self, req: Req) -> Resp {
        let mut stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        req.send(&mut stream, &self.addr.to_string()).await
    }

    /// Sends `req` to the E2B-compatible listener (Host: its address,
    /// unless `req` names one).
    pub async fn send_e2b(&self, req: Req) -> Resp {
        let addr = self.e2b.expect("the service has an E2B listener");
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        req.send(&mut stream, &addr.to_string()).await
    }

    /// Stops the service as SIGTERM would and checks it took its token
    /// file along.
    pub async fn stop(mut self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("the service stops")
            .expect("join")
            .expect("serve");
        if let Some(file) = &self.token_file {
            assert!(!file.exists(), "the token file outlived the service");
        }
    }
}

impl Drop for Service {
    /// A failed test still stops its service (its sandboxes go with it, or
    /// with the test's label guard) and removes its scratch directory.
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One raw HTTP/1.1 request.
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Its answer: status and body (JSON when it is JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub text: String,
    pub json: Value,
}

impl Resp {
    pub fn field(&self) -> &str {
        self.json["error"]["field"].as_str().unwrap_or_default()
    }
    pub fn message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or_default()
    }
}

/// A request with `token` as its bearer token.
pub fn as_(token: &str, method: &str, path: &str) -> Req {
    Req::new(method, path).header("Authorization", &format!("Bearer {token}"))
}

impl Req {
    pub fn new(method: &str, path: &str) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn json(self, body: Value) -> Req {
        self.body_as("application/json", body.to_string())
    }

    pub fn body_as(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Req {
        self.body = body.into();
        self.header("Content-Type", content_type)
    }

    pub fn head(&self, default_host: &str) -> String {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            head.push_str(&format!("Host: {default_host}\r\n"));
        }
        for (n, v) in &self.headers {
            if !v.is_empty() || !n.eq_ignore_ascii_case("host") {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        head
    }

    /// Sends it over `stream` (Host `host` unless it names one) and reads the answer.
    pub async fn send<S: AsyncRead + AsyncWrite + Unpin>(self, stream: &mut S, host: &str) -> Resp {
        let mut bytes = self.head(host).into_bytes();
        bytes.extend_from_slice(&self.body);
        stream.write_all(&bytes).await.expect("write");
        let mut out = Vec::new();
        // MCP answers may be an SSE stream; the status and first event are
        // all these tests need.
        let _ = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let json = serde_json::from_str(body).unwrap_or(Value::Null);
        Resp { status, text, json }
    }
}

pub fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "trust-test", "version": "0"}}})
}

pub fn mcp(req: Req) -> Req {
    req.header("Accept", "application/json, text/event-stream")
}

/// The runtime over the local Docker daemon.
pub async fn runtime(config: RuntimeConfig) -> Runtime {
    let docker = corral_docker::DockerBackend::connect(&corral_docker::DockerConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README");
    Runtime::new(std::sync::Arc::new(docker), config)
}
