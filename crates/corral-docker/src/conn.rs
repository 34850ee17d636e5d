//! The control stream to a sandbox's agent: one attached exec of
//! `corral-agent attach`, carrying multiplexed frames for every command.
//!
//! A reader task decodes frames and routes them by command id; a writer task
//! owns the exec's stdin. No lock is held across an await: the routing table
//! sits behind a std mutex touched only for map operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use corral_core::protocol::{
    Decoder, Frame, FrameKind, Hello, HelloAck, AGENT_PATH, PROTOCOL_VERSION,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::DockerError;
use crate::metrics::Metrics;
use crate::retry::retry;
use corral_core::RetryPolicy;

/// How long the agent may take to answer the handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Routes {
    map: HashMap<u32, mpsc::UnboundedSender<Frame>>,
    /// Why the stream ended, once it has.
    closed: Option<String>,
    /// The last lines the relay wrote to stderr, for diagnostics.
    relay_stderr: String,
}

/// A live control stream.
pub(crate) struct AgentConn {
    routes: Arc<Mutex<Routes>>,
    writer: mpsc::Sender<Vec<u8>>,
    next_id: AtomicU32,
    reader: JoinHandle<()>,
    /// What the agent said about itself.
    pub hello: HelloAck,
}

fn lock(routes: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    // A panic while holding this lock cannot leave the map inconsistent
    // (every critical section is a single map operation), so poisoning is
    // safe to ignore.
    routes.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentConn {
    /// Starts the relay in `container` and performs the handshake. Creating
    /// and starting the relay exec are retried on transient daemon errors
    /// (a fresh exec each time: a failed start may have consumed the old one).
    pub async fn attach(
        docker: &Docker,
        container: &str,
        sandbox: &str,
        policy: &RetryPolicy,
        metrics: &Metrics,
    ) -> Result<Self, DockerError> {
        let what = format!("attach to the agent in sandbox {sandbox}");
        let started = retry(policy, metrics, &what, || async {
            let exec = docker
                .create_exec(
                    container,
                    CreateExecOptions::<String> {
                        attach_stdin: Some(true),
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        tty: Some(false),
                        cmd: Some(vec![AGENT_PATH.to_string(), "attach".to_string()]),
                        ..Default::default()
                    },
                )
                .await?;
            docker
                .start_exec(
                    &exec.id,
                    Some(StartExecOptions {
                        detach: false,
                        tty: false,
                        output_capacity: Some(256 * 1024),
                    }),
                )
                .await
        })
        .await
        .map_err(|e| DockerError::api(what.clone(), e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(DockerError::Agent {
                sandbox: sandbox.to_string(),
                message: "daemon started the agent exec detached".into(),
            });
        };

        let routes = Arc::new(Mutex::new(Routes::default()));
        let (hello_tx, mut hello_rx) = mpsc::unbounded_channel();
        lock(&routes).map.insert(0, hello_tx);

        let reader_routes = routes.clone();
        let sandbox_name = sandbox.to_string();
        let reader = tokio::spawn(async move {
            let mut decoder = Decoder::new();
            let reason = loop {
                match output.next().await {
                    None => break "the control stream ended".to_string(),
                    Some(Err(e)) => break format!("the control stream failed: {e}"),
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                        decoder.extend(&message);
                        let mut violation = None;
                        loop {
                            match decoder.next_frame() {
                                Ok(Some(frame)) => {
                                    let r = lock(&reader_routes);
                                    if let Some(tx) = r.map.get(&frame.id) {
                                        let _ = tx.send(frame);
                                    }
                                }
                                Ok(None) => break,
                                Err(e) => {
                                    violation = Some(e.to_string());
                                    break;
                                }
                            }
                        }
                        if let Some(v) = violation {
                            break format!("agent protocol violation: {v}");
                        }
                    }
                    Some(Ok(other)) => {
                        let text = String::from_utf8_lossy(&other.into_bytes()).to_string();
                        tracing::warn!(sandbox = %sandbox_name, relay = %text.trim_end(), "agent relay stderr");
                        let mut r = lock(&reader_routes);
                        r.relay_stderr.push_str(&text);
                        let len = r.relay_stderr.len();
                        if len > 4096 {
                            let cut = r.relay_stderr.ceil_char_boundary(len - 4096);
                            r.relay_stderr.drain(..cut);
                        }
                    }
                }
            };
            let mut r = lock(&reader_routes);
            r.closed = Some(reason);
            r.map.clear();
        });

        let (writer, mut rx) = mpsc::channel::<Vec<u8>>(1024);
        let writer_sandbox = sandbox.to_string();
        tokio::spawn(async move {
            while let Some(mut buf) = rx.recv().await {
                // Batch whatever else is queued into one write.
                while let Ok(more) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
                let res = async {
                    input.write_all(&buf).await?;
                    input.flush().await
                }
                .await;
                if let Err(e) = res {
                    tracing::debug!(sandbox = %writer_sandbox, error = %e, "writing to the agent failed");
                    return;
                }
            }
            let _ = input.shutdown().await;
        });

        let mut conn = AgentConn {
            routes,
            writer,
            next_id: AtomicU32::new(1),
            reader,
            hello: HelloAck {
                protocol: 0,
                agent_version: String::new(),
                oom_counter: String::new(),
            },
        };
        conn.send(Frame::json(
            FrameKind::Hello,
            0,
            &Hello {
                protocol: PROTOCOL_VERSION,
            },
        ))
        .await
        .map_err(|reason| DockerError::Agent {
            sandbox: sandbox.to_string(),
            message: format!("handshake failed: {reason}"),
        })?;
        let answer = tokio::time::timeout(HELLO_TIMEOUT, hello_rx.recv()).await;
        lock(&conn.routes).map.remove(&0);
        let agent_err = |message: String| DockerError::Agent {
            sandbox: sandbox.to_string(),
            message,
        };
        let frame = match answer {
            Err(_) => {
                return Err(agent_err(format!(
                    "no handshake answer within {HELLO_TIMEOUT:?}"
                )))
            }
            Ok(None) => {
                return Err(agent_err(format!(
                    "handshake failed: {}",
                    conn.closed_reason()
                )))
            }
            Ok(Some(f)) => f,
        };
        match frame.kind {
            FrameKind::HelloAck => {
                let ack: HelloAck = frame.parse().map_err(|e| agent_err(e.to_string()))?;
                if ack.protocol != PROTOCOL_VERSION {
                    return Err(agent_err(format!(
                        "agent speaks protocol {}, corral speaks {PROTOCOL_VERSION}",
                        ack.protocol
                    )));
                }
                conn.hello = ack;
                Ok(conn)
            }
            other => Err(agent_err(format!(
                "unexpected handshake answer {other:?}: {}",
                String::from_utf8_lossy(&frame.payload)
            ))),
        }
    }

    /// A fresh command id.
    pub fn next_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// Routes frames for `id` to the returned receiver; fails when the stream
    /// has already ended.
    pub fn register(&self, id: u32) -> Result<mpsc::UnboundedReceiver<Frame>, String> {
        let mut r = lock(&self.routes);
        if let Some(reason) = &r.closed {
            return Err(reason.clone());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        r.map.insert(id, tx);
        Ok(rx)
    }

    /// Stops routing frames for `id`.
    pub fn unregister(&self, id: u32) {
        lock(&self.routes).map.remove(&id);
    }

    /// Queues a frame for the agent.
    pub async fn send(&self, frame: Frame) -> Result<(), String> {
        self.writer
            .send(frame.encode())
            .await
            .map_err(|_| self.closed_reason())
    }

    /// A cheap handle for sending frames from other tasks.
    pub fn sender(&self) -> mpsc::Sender<Vec<u8>> {
        self.writer.clone()
    }

    /// Ends the stream from outside (the container died): commands in
    /// flight see it closed and look at the container's state.
    pub fn close(&self, reason: String) {
        let mut r = lock(&self.routes);
        if r.closed.is_none() {
            r.closed = Some(reason);
        }
        r.map.clear();
    }

    /// True once the stream has ended.
    pub fn is_closed(&self) -> bool {
        lock(&self.routes).closed.is_some() || self.writer.is_closed()
    }

    /// Why the stream ended (or "closed" when it has not been recorded yet).
    pub fn closed_reason(&self) -> String {
        let r = lock(&self.routes);
        let mut reason = r
            .closed
            .clone()
            .unwrap_or_else(|| "the control stream closed".into());
        let stderr = r.relay_stderr.trim();
        if !stderr.is_empty() {
            reason.push_str(&format!(" (relay said: {stderr})"));
        }
        reason
    }
}

impl Drop for AgentConn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
