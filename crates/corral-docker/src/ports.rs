//! Connections to ports of servers inside sandboxes (`Backend::open_port`).
//!
//! A sandbox with an address (on corral's network, or any other) is
//! reached there directly: the host reaches its containers' bridge
//! addresses, and that costs one TCP connect. A sandbox with none
//! (`network: none`) is reached through an exec of the agent's `port`
//! tool, which joins the sandbox's network namespace and relays one
//! connection to its loopback over the exec's stdin and stdout (about one
//! exec's cost per connection); the sandbox gains no way out by it. So is
//! a sandbox with an egress policy: the host has no address on its
//! internal network. The
//! tool runs as `nobody`, with the sandbox's confinement (capabilities,
//! seccomp, no-new-privileges: what every exec into it inherits).

use std::net::IpAddr;

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use corral_core::backend::{Placement, PortStream};
use corral_core::protocol::AGENT_PATH;
use corral_core::Error;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::api;
use crate::DockerBackend;

/// Bytes buffered between the exec's stream and the caller's.
const RELAY_BUFFER: usize = 256 * 1024;

/// The user the relay runs as: it needs nothing but a socket.
const RELAY_USER: &str = "65534:65534";

impl DockerBackend {
    pub(crate) async fn connect_port(
        &self,
        placement: &Placement,
        port: u16,
    ) -> Result<PortStream, Error> {
        let docker = self.docker();
        let container = placement.id();
        let what = format!("inspect container {container}");
        let info = self
            .call(&what, || docker.inspect_container(container, None))
            .await
            .map_err(|e| api(what.clone(), e))?;
        let address = info
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|nets| {
                nets.iter()
                    // The host has no address on a sandbox's egress network:
                    // such a sandbox is reached through the relay, like one
                    // with no network.
                    .filter(|(name, _)| !crate::egress::is_egress_network(name))
                    .filter_map(|(_, e)| e.ip_address.as_deref())
                    .find_map(|ip| ip.parse::<IpAddr>().ok())
            });
        match address {
            Some(ip) => {
                corral_core::backend::connect_port(container, "the sandbox", ip, port).await
            }
            None => self.relay(container, port).await,
        }
    }

    /// An exec of the agent's `port` tool, its stdin and stdout as one
    /// byte stream.
    async fn relay(&self, container: &str, port: u16) -> Result<PortStream, Error> {
        let docker = self.docker();
        let what = format!("exec the port relay in container {container}");
        let exec = docker
            .create_exec(
                container,
                ExecConfig {
                    cmd: Some(vec![
                        AGENT_PATH.to_string(),
                        "port".to_string(),
                        port.to_string(),
                    ]),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    user: Some(RELAY_USER.to_string()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| api(what.clone(), e))?;
        let started = docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(RELAY_BUFFER),
                }),
            )
            .await
            .map_err(|e| api(what.clone(), e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(Error::Agent {
                sandbox: container.to_string(),
                message: "the port relay's exec started detached".into(),
            });
        };
        let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
        let (mut from_caller, mut to_caller) = tokio::io::split(theirs);
        let container = container.to_string();
        // The caller's bytes → the relay's stdin; the caller's EOF closes it.
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from_caller.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if input.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        let _ = input.flush().await;
                    }
                }
            }
            let _ = input.shutdown().await;
        });
        // The relay's stdout → the caller; its stderr says why it ended.
        tokio::spawn(async move {
            while let Some(item) = output.next().await {
                match item {
                    Ok(LogOutput::StdOut { message }) => {
                        if to_caller.write_all(&message).await.is_err() {
                            break;
                        }
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        tracing::debug!(
                            container = %container,
                            port,
                            "port relay: {}",
                            String::from_utf8_lossy(&message).trim()
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(container = %container, port, error = %e, "port relay stream ended");
                        break;
                    }
                }
            }
            let _ = to_caller.shutdown().await;
        });
        Ok(Box::new(ours))
    }
}
