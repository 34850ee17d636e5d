//! The control stream to a pod's agent: a TCP connection to the agent's
//! port, directly on the pod network or through the API server's
//! port-forward, opened by the handshake of
//! [`corral_core::agent_auth`].
//!
//! Why not `attach`/`exec` through the API server: every command's bytes
//! would then cross the API server (one long-lived websocket per sandbox,
//! multiplied by the fleet), and a fleet's control plane would be the API
//! server's capacity. The direct path keeps the API server out of the
//! data path; port-forward is the fallback for a corral that cannot reach
//! the pod network (a laptop against a remote cluster), and it carries the
//! same handshake, so the agent never trusts the path, only the secret.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use corral_core::agent_auth::{self, Secret, ANSWER_LEN, LEN};
use corral_core::backend::{AgentOutput, AgentStream};
use futures_util::{Stream, StreamExt};
use kube::api::Portforwarder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::io::ReaderStream;

/// Longest the agent may take to answer the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Read buffer of the control stream: frames are up to 64 KiB.
const READ_BUFFER: usize = 64 << 10;

/// Pause between connection attempts while the agent is not yet reachable.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Why a control connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing answered at the address within the connect timeout (the
    /// pod network is not reachable from here, or the pod is gone).
    #[error("cannot reach {addr} within {timeout_ms} ms: {source}")]
    Unreachable {
        /// Where corral tried.
        addr: String,
        /// The connect timeout.
        timeout_ms: u64,
        /// The last connection error.
        source: io::Error,
    },
    /// The peer did not complete the handshake.
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// Who was asked.
        peer: String,
        /// What went wrong on the wire.
        source: io::Error,
    },
    /// The peer answered without proving it holds the sandbox's secret:
    /// whatever listens there is not this sandbox's agent.
    #[error("{peer} did not prove it holds the sandbox's secret: not its agent")]
    Impostor {
        /// Who answered.
        peer: String,
    },
}

/// A fresh per-sandbox secret, from the kernel's generator.
pub fn new_secret() -> io::Result<Secret> {
    Ok(Secret::new(random()?))
}

fn random() -> io::Result<[u8; LEN]> {
    use std::io::Read;
    let mut out = [0u8; LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut out)?;
    Ok(out)
}

/// Runs the client's side of the handshake on `stream`.
pub async fn handshake<S>(stream: &mut S, secret: &Secret, peer: &str) -> Result<(), ControlError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let wire = |source: io::Error| ControlError::Handshake {
        peer: peer.to_string(),
        source,
    };
    let exchange = async {
        let client = random()?;
        stream.write_all(&agent_auth::opening(&client)).await?;
        stream.flush().await?;
        let mut answer = [0u8; ANSWER_LEN];
        stream.read_exact(&mut answer).await?;
        let (agent, proof) = answer.split_at(LEN);
        let agent: [u8; LEN] = agent
            .try_into()
            .map_err(|_| io::Error::other("short agent nonce"))?;
        if !secret.check_agent(&client, &agent, proof) {
            return Ok(false);
        }
        stream
            .write_all(&secret.client_proof(&client, &agent))
            .await?;
        stream.flush().await?;
        Ok::<bool, io::Error>(true)
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(ControlError::Impostor {
            peer: peer.to_string(),
        }),
        Ok(Err(e)) => Err(wire(e)),
        Err(_) => Err(wire(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {HANDSHAKE_TIMEOUT:?}"),
        ))),
    }
}

/// Connects to the agent at `ip:port` on the pod network. A failed
/// connection is tried again until `timeout` (the agent binds its port a
/// moment after the container runs, and a new pod's route may lag).
pub async fn connect_direct(
    ip: IpAddr,
    port: u16,
    secret: &Secret,
    timeout: Duration,
) -> Result<AgentStream, ControlError> {
    let addr = SocketAddr::new(ip, port);
    let deadline = tokio::time::Instant::now() + timeout;
    let unreachable = |source: io::Error| ControlError::Unreachable {
        addr: addr.to_string(),
        timeout_ms: timeout.as_millis() as u64,
        source,
    };
    let mut stream = loop {
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => break s,
            // Refused (not listening yet) or no route (the pod's network
            // is still being wired): both pass within moments of start.
            Ok(Err(e)) => {
                if tokio::time::Instant::now() + RETRY_PAUSE >= deadline {
                    return Err(unreachable(e));
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(_) => {
                return Err(unreachable(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connect timed out",
                )))
            }
        }
    };
    // Frames are written whole; Nagle would hold small ones back.
    let _ = stream.set_nodelay(true);
    handshake(&mut stream, secret, &addr.to_string()).await?;
    let (read, write) = stream.into_split();
    Ok(AgentStream {
        output: Box::pin(
            ReaderStream::with_capacity(read, READ_BUFFER).map(|r| r.map(AgentOutput::Control)),
        ),
        input: Box::pin(write),
    })
}

/// Opens the agent's stream through a port-forward the API server made.
pub async fn through_forward(
    mut forwarder: Portforwarder,
    port: u16,
    secret: &Secret,
    peer: &str,
) -> Result<AgentStream, ControlError> {
    let Some(mut stream) = forwarder.take_stream(port) else {
        return Err(ControlError::Handshake {
            peer: peer.to_string(),
            source: io::Error::other(format!("the port-forward has no stream for port {port}")),
        });
    };
    handshake(&mut stream, secret, peer).await?;
    let (read, write) = tokio::io::split(stream);
    let output = Forwarded {
        output: Box::pin(
            ReaderStream::with_capacity(read, READ_BUFFER).map(|r| r.map(AgentOutput::Control)),
        ),
        forwarder,
    };
    Ok(AgentStream {
        output: Box::pin(output),
        input: Box::pin(write),
    })
}

/// A port-forwarded stream's output, holding the forwarder: dropping it
/// closes the websocket.
struct Forwarded {
    output: Pin<Box<dyn Stream<Item = io::Result<AgentOutput>> + Send>>,
    forwarder: Portforwarder,
}

impl Drop for Forwarded {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

impl Stream for Forwarded {
    type Item = io::Result<AgentOutput>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.output.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent's side of the handshake, for the client's unit tests.
    async fn agent_side(
        mut s: tokio::io::DuplexStream,
        secret: Secret,
        lie: bool,
    ) -> io::Result<bool> {
        let mut opening = [0u8; agent_auth::OPENING_LEN];
        s.read_exact(&mut opening).await?;
        let client = agent_auth::parse_opening(&opening).ok_or(io::ErrorKind::InvalidData)?;
        let agent = [9u8; LEN];
        let mut proof = secret.agent_proof(&client, &agent);
        if lie {
            proof[0] ^= 1;
        }
        s.write_all(&agent).await?;
        s.write_all(&proof).await?;
        let mut answer = [0u8; LEN];
        s.read_exact(&mut answer).await?;
        Ok(secret.check_client(&client, &agent, &answer))
    }

    #[tokio::test]
    async fn the_client_proves_itself_and_checks_the_agent() {
        let secret = new_secret().expect("urandom");
        let (mut a, b) = tokio::io::duplex(1024);
        let agent = tokio::spawn(agent_side(b, secret.clone(), false));
        handshake(&mut a, &secret, "test").await.expect("handshake");
        assert!(agent.await.expect("join").expect("agent io"));

        // An agent without the secret is caught before a frame is sent.
        let (mut a, b) = tokio::io::duplex(1024);
        tokio::spawn(agent_side(b, secret.clone(), true));
        let e = handshake(&mut a, &secret, "test").await.expect_err("liar");
        assert!(matches!(e, ControlError::Impostor { .. }), "{e}");

        // A peer that hangs up mid-handshake is a wire error.
        let (mut a, b) = tokio::io::duplex(1024);
        drop(b);
        let e = handshake(&mut a, &secret, "test").await.expect_err("gone");
        assert!(matches!(e, ControlError::Handshake { .. }), "{e}");
    }

    #[test]
    fn secrets_are_fresh() {
        let a = new_secret().expect("urandom");
        let b = new_secret().expect("urandom");
        assert_ne!(a, b);
    }
}
