//! TEST DOUBLE for a cluster's pod network, shared by the agent-port
//! tests and the control-path bench: the real Docker backend whose
//! sandboxes get the agent's listening environment (port and per-sandbox
//! secret, exactly as `corral_kube::pod` puts them into a pod) and whose
//! agents are reached at the container's bridge address through
//! `corral_kube::control`, the Kubernetes backend's own connector.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use corral_core::agent_auth::{self, Secret};
use corral_core::backend::{
    AgentStream, Backend, BackendCounters, BoxFuture, ImagePresence, OnDeath, Placement, Prepared,
    SandboxInfo, StartRequest,
};
use corral_core::{ContainerState, Error};
use corral_docker::DockerBackend;
use corral_kube::control;

/// The agent's port in the double's sandboxes.
pub const PORT: u16 = 7150;

/// TEST DOUBLE for a cluster's pod network: Docker containers whose agent
/// listens on [`PORT`], reached at their bridge IP.
pub struct DockerAsPodNetworkDouble {
    pub docker: DockerBackend,
    secrets: Mutex<HashMap<String, Secret>>,
}

impl DockerAsPodNetworkDouble {
    /// Wraps `docker`.
    pub fn new(docker: DockerBackend) -> Self {
        DockerAsPodNetworkDouble {
            docker,
            secrets: Mutex::new(HashMap::new()),
        }
    }

    /// The secret of a sandbox this double made.
    pub fn secret_of(&self, placement: &Placement) -> Option<Secret> {
        self.secrets
            .lock()
            .expect("lock")
            .get(placement.id())
            .cloned()
    }
}

/// The container's address on its network.
pub fn container_ip(id: &str) -> Option<IpAddr> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            id,
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|a| a.parse().ok())
}

impl Backend for DockerAsPodNetworkDouble {
    fn name(&self) -> &'static str {
        "Docker, as a pod network (test double)"
    }
    fn endpoint(&self) -> &str {
        self.docker.endpoint()
    }
    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        self.docker.ping()
    }
    fn prepare<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>> {
        self.docker.prepare(req)
    }
    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>> {
        Box::pin(async move {
            let secret = control::new_secret().expect("urandom");
            let mut agent_env = req.agent_env.clone();
            agent_env.push((agent_auth::LISTEN_ENV.into(), PORT.to_string()));
            agent_env.push((agent_auth::SECRET_ENV.into(), secret.to_hex()));
            let listening = StartRequest {
                agent_env,
                ..req.clone()
            };
            let placement = self.docker.create(&listening).await?;
            self.secrets
                .lock()
                .expect("lock")
                .insert(placement.id().to_string(), secret);
            Ok(placement)
        })
    }
    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.docker.start(req, placement)
    }
    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>> {
        Box::pin(async move {
            let agent = |message: String| Error::Agent {
                sandbox: sandbox_id.to_string(),
                message,
            };
            let secret = self
                .secret_of(placement)
                .ok_or_else(|| agent("no secret".into()))?;
            let ip = container_ip(placement.id()).ok_or_else(|| agent("no IP".into()))?;
            control::connect_direct(ip, PORT, &secret, Duration::from_secs(5))
                .await
                .map_err(|e| agent(e.to_string()))
        })
    }
    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>> {
        self.docker.state(placement)
    }
    fn exit_details<'a>(
        &'a self,
        placement: &'a Placement,
        seen: ContainerState,
    ) -> BoxFuture<'a, ContainerState> {
        self.docker.exit_details(placement, seen)
    }
    fn watch(&self, placement: &Placement, on_death: OnDeath) {
        self.docker.watch(placement, on_death)
    }
    fn unwatch(&self, placement: &Placement) {
        self.docker.unwatch(placement)
    }
    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.docker.remove(placement, sandbox_id)
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>> {
        self.docker.list()
    }
    fn image_present<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>> {
        self.docker.image_present(image)
    }
    fn counters(&self) -> BackendCounters {
        self.docker.counters()
    }
}
