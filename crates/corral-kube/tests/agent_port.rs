//! The agent's TCP control path, the one the Kubernetes backend uses,
//! attacked from inside real sandboxes.
//!
//! No cluster is available in CI, so a test double stands in for the pod
//! network: [`DockerAsPodNetworkDouble`] is the real Docker backend whose
//! sandboxes get the agent's listening environment (port and per-sandbox
//! secret, exactly as `corral_kube::pod` puts them into a pod) and whose
//! agents are reached at the container's bridge address through
//! `corral_kube::control`, the Kubernetes backend's own connector. The
//! agent, the handshake, the runtime and the container are all real; only
//! "how the address is found" differs from a cluster.

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral::{Runtime, RuntimeConfig};
use corral_core::agent_auth::{self, Secret};
use corral_core::backend::{
    AgentStream, Backend, BackendCounters, BoxFuture, OnDeath, Placement, Prepared, SandboxInfo,
    StartRequest,
};
use corral_core::protocol::{ExecRequest, Frame, FrameKind, Hello, PROTOCOL_VERSION, SYNC};
use corral_core::{CommandSpec, ContainerState, Error, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};
use corral_kube::control::{self, ControlError};

const PORT: u16 = 7150;
const IMAGE: &str = "corral-test/busybox";

/// TEST DOUBLE for a cluster's pod network: Docker containers whose agent
/// listens on [`PORT`], reached at their bridge IP.
struct DockerAsPodNetworkDouble {
    docker: DockerBackend,
    secrets: Mutex<HashMap<String, Secret>>,
}

impl DockerAsPodNetworkDouble {
    fn secret_of(&self, placement: &Placement) -> Option<Secret> {
        self.secrets
            .lock()
            .expect("lock")
            .get(placement.id())
            .cloned()
    }
}

/// The container's address on its network.
fn container_ip(id: &str) -> Option<IpAddr> {
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
            let mut env = req.env.clone();
            env.push((agent_auth::LISTEN_ENV.into(), PORT.to_string()));
            env.push((agent_auth::SECRET_ENV.into(), secret.to_hex()));
            let listening = StartRequest { env, ..req.clone() };
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
    fn image_present<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.docker.image_present(image)
    }
    fn counters(&self) -> BackendCounters {
        self.docker.counters()
    }
}

fn images() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/build-test-images.sh"
    );
    let ok = Command::new("bash")
        .arg(script)
        .status()
        .expect("run build-test-images.sh")
        .success();
    assert!(ok, "building the test images failed");
}

/// Removes the test's containers even when it fails.
struct Guard(&'static str);

impl Guard {
    fn remaining(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corraltest={}", self.0),
            ])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let left = self.remaining();
        if !left.is_empty() {
            let _ = Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(&left)
                .output();
        }
    }
}

async fn runtime() -> (Runtime, Arc<DockerAsPodNetworkDouble>) {
    images();
    let docker = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README");
    let double = Arc::new(DockerAsPodNetworkDouble {
        docker,
        secrets: Mutex::new(HashMap::new()),
    });
    let rt = Runtime::new(
        double.clone(),
        RuntimeConfig {
            shared_slots: false,
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    (rt, double)
}

fn spec(test: &str) -> SandboxSpec {
    let mut spec = SandboxSpec::new(IMAGE);
    spec.labels.insert("corraltest".into(), test.into());
    spec
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::argv(["sh", "-c", script])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What a command inside would send to take over the agent: a Hello and
/// an Exec that leaves a mark.
fn forged_session() -> Vec<u8> {
    let mut out = SYNC.to_vec();
    Frame::json(
        FrameKind::Hello,
        1,
        &Hello {
            protocol: PROTOCOL_VERSION,
            session: "forged".into(),
        },
    )
    .encode_into(&mut out);
    Frame::json(
        FrameKind::Exec,
        2,
        &ExecRequest {
            argv: vec!["touch".into(), "/tmp/pwned".into()],
            cwd: None,
            env: Vec::new(),
            stdin: false,
            timeout_ms: None,
            max_output: 1 << 20,
            exclusive: false,
            wait_for_output: false,
        },
    )
    .encode_into(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_run_over_the_agent_port_and_nothing_inside_can_use_it() {
    let test = "agent-port-attack";
    let guard = Guard(test);
    let (rt, double) = runtime().await;
    let sb = rt.create(&spec(test)).await.expect("create");
    let placement = sb.placement();
    let secret = double.secret_of(&placement).expect("secret");

    let r = sb.run(&sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(
        (r.exit_code, text(&r.stdout), text(&r.stderr)),
        (Some(3), "out\n".into(), "err\n".into())
    );

    // The secret is nowhere a command can read: not inherited, not in
    // PID 1's environment or memory, not among its descriptors.
    let r = sb
        .run(&sh(
            "env; echo ---; cat /proc/1/environ; echo \"environ=$?\"; \
             for f in /proc/1/fd/*; do readlink $f && echo LINKED; \
               (echo x > $f) 2>/dev/null && echo OPENED; cat $f 2>/dev/null && echo READ; done; \
             grep -rl CORRAL_AGENT /proc/*/environ 2>/dev/null; echo done",
        ))
        .await;
    let out = text(&r.stdout);
    assert!(out.ends_with("done\n"), "{r:?}");
    assert!(
        !out.contains(&secret.to_hex()) && !out.contains("CORRAL_AGENT"),
        "the secret or its variable leaked into the sandbox: {out}"
    );
    assert!(
        out.contains("environ=1")
            && !out.contains("LINKED")
            && !out.contains("OPENED")
            && !out.contains("READ"),
        "PID 1's environment and descriptors (its sockets) must be closed to commands: {out} {}",
        text(&r.stderr)
    );

    // A command connecting to the agent's port on loopback. Without the
    // handshake's magic it gets no byte at all; with the magic but no
    // proof it gets only the agent's nonce and proof (64 bytes) and the
    // connection closes before any of its frames is read.
    let no_magic = forged_session();
    let mut bad_proof = agent_auth::opening(&[7; agent_auth::LEN]).to_vec();
    bad_proof.extend_from_slice(&[0u8; agent_auth::LEN]);
    bad_proof.extend_from_slice(&forged_session());
    for (what, payload, expected) in [("no magic", no_magic, "0"), ("bad proof", bad_proof, "64")] {
        let r = sb
            .run(
                &sh(&format!(
                    "nc -w 3 127.0.0.1 {PORT} | wc -c; sleep 0.5; test -e /tmp/pwned && echo PWNED; true"
                ))
                .stdin(payload),
            )
            .await;
        assert_eq!(r.failure, None, "{what}: {r:?}");
        let out = text(&r.stdout);
        assert!(!out.contains("PWNED"), "{what}: a forged Exec ran: {out}");
        assert_eq!(
            out.split_whitespace().next(),
            Some(expected),
            "{what}: bytes the agent sent back: {out} {}",
            text(&r.stderr)
        );
    }

    // The controller's own session is untouched by all of it.
    let r = sb.run(&sh("echo still")).await;
    assert_eq!(text(&r.stdout), "still\n", "{r:?}");

    // From outside, a client without this sandbox's secret is refused,
    // and the agent is caught if it cannot prove it holds it.
    let ip = container_ip(placement.id()).expect("ip");
    let other = control::new_secret().expect("urandom");
    match control::connect_direct(ip, PORT, &other, Duration::from_secs(5)).await {
        Err(ControlError::Impostor { .. }) => {}
        Err(e) => panic!("expected the handshake to fail on the proof, got {e}"),
        Ok(_) => panic!("a client with another secret was let in"),
    }
    let r = sb.run(&sh("echo after")).await;
    assert_eq!(text(&r.stdout), "after\n", "{r:?}");

    sb.destroy().await.expect("destroy");
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconnecting_controller_takes_over_and_old_commands_end() {
    let test = "agent-port-takeover";
    let guard = Guard(test);
    let (rt, double) = runtime().await;
    let sb = rt.create(&spec(test)).await.expect("create");
    let placement = sb.placement();
    let secret = double.secret_of(&placement).expect("secret");
    let ip = container_ip(placement.id()).expect("ip");

    // A second controller with the secret (corral reconnecting after its
    // stream broke) takes the agent over: the first stream ends.
    let first = double
        .connect(&placement, sb.id())
        .await
        .expect("first connection");
    let second = control::connect_direct(ip, PORT, &secret, Duration::from_secs(5))
        .await
        .expect("second connection");
    let mut first_output = first.output;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        use futures_util::StreamExt;
        while let Some(item) = first_output.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the older connection was not closed");
    drop(second);

    // The runtime's session was taken over too; it reconnects and goes on.
    let r = sb.run(&sh("echo back")).await;
    assert_eq!(text(&r.stdout), "back\n", "{r:?}");
    sb.destroy().await.expect("destroy");
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}
