//! Connections to ports of servers inside pods (`Backend::open_port`).
//!
//! Where corral reaches the pod network (`control: direct`, or `auto`
//! while it is reachable) a connection is a TCP connect to the pod's IP,
//! as Docker's host reaches its containers' addresses: the API server is
//! not involved, and the namespace's ingress policy lets corral (and only
//! corral) in. Otherwise it is one port-forward through the API server
//! per connection, which takes a token of the rate limit. A `network:
//! none` pod is reached the same way and gains no way out by it (its
//! egress policy still denies everything it would start). The agent's own
//! port is not a server's: it is refused.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use corral_core::backend::{Placement, PortStream};
use corral_core::config::ControlPath;
use corral_core::Error;
use kube::api::Portforwarder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{api_err, lock, KubeBackend, DIRECT_RETRY};

impl KubeBackend {
    pub(super) async fn connect_port(
        &self,
        placement: &Placement,
        port: u16,
    ) -> Result<PortStream, Error> {
        let name = placement.id();
        let config = &self.inner.config;
        if port == config.agent_port {
            return Err(Error::Unsupported {
                what: format!(
                    "port {port} of pod {name}: it is the agent's control port \
                     (kubernetes.agent_port), not a server's"
                ),
            });
        }
        let direct = match config.control {
            ControlPath::Direct => true,
            ControlPath::PortForward => false,
            ControlPath::Auto => lock(&self.inner.direct_unreachable)
                .is_none_or(|failed: Instant| failed.elapsed() >= DIRECT_RETRY),
        };
        if direct {
            let endpoint = self.endpoint(name, name).await?;
            let Some(ip) = endpoint.ip else {
                return Err(Error::Agent {
                    sandbox: name.to_string(),
                    message: format!("pod {name} has no IP yet"),
                });
            };
            return corral_core::backend::connect_port(name, &format!("pod {name}"), ip, port)
                .await;
        }
        self.inner.limiter.acquire().await;
        let pods = &self.inner.pods;
        let what = format!("port-forward to port {port} of pod {name}");
        let ports = [port];
        let mut forwarder = self
            .call(&what, || pods.portforward(name, &ports))
            .await
            .map_err(|e| api_err(what.clone(), e))?;
        let Some(stream) = forwarder.take_stream(port) else {
            forwarder.abort();
            return Err(Error::Agent {
                sandbox: name.to_string(),
                message: format!("{what}: the port-forward has no stream for the port"),
            });
        };
        Ok(Box::new(Forwarded { stream, forwarder }))
    }
}

/// One port-forwarded connection, holding its forwarder: dropping it
/// closes the websocket.
struct Forwarded<S> {
    stream: S,
    forwarder: Portforwarder,
}

impl<S> Drop for Forwarded<S> {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Forwarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Forwarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
