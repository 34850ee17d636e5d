//! The agent's TCP control path, the one the Kubernetes backend uses,
//! attacked from inside real sandboxes.
//!
//! No cluster is available in CI, so a test double stands in for the pod
//! network (`double/mod.rs`, `DockerAsPodNetworkDouble`): real Docker
//! containers whose agent listens as in a pod, reached at their bridge
//! address through the Kubernetes backend's own connector. The agent, the
//! handshake, the runtime and the container are all real; only "how the
//! address is found" differs from a cluster.

mod double;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use corral::{Runtime, RuntimeConfig};
use corral_core::agent_auth;
use corral_core::backend::{Backend, StartRequest};
use corral_core::protocol::{ExecRequest, Frame, FrameKind, Hello, PROTOCOL_VERSION, SYNC};
use corral_core::SandboxSpec;
use corral_docker::{DockerBackend, DockerConfig};
use corral_kube::control::{self, ControlError};
use corral_testing::contract::{sh, text};
use double::{container_ip, DockerAsPodNetworkDouble, PORT};

use corral_testing::images;

const IMAGE: &str = "corral-test/busybox";

/// Handshakes the agent runs at once per budget (its `MAX_PENDING`): as
/// many idle connections as fill one.
const AGENT_BUDGET: usize = 16;

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
    let double = Arc::new(DockerAsPodNetworkDouble::new(docker));
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

/// The bytes that open session `session` and run `argv`: the sync bytes,
/// a Hello and an Exec.
fn session_running(session: &str, argv: &[&str]) -> Vec<u8> {
    let mut out = SYNC.to_vec();
    Frame::json(
        FrameKind::Hello,
        1,
        &Hello {
            protocol: PROTOCOL_VERSION,
            session: session.into(),
            env: Vec::new(),
            restored: false,
        },
    )
    .encode_into(&mut out);
    Frame::json(
        FrameKind::Exec,
        2,
        &ExecRequest {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            stdin: false,
            timeout_ms: None,
            max_output: 1 << 20,
            exclusive: false,
            wait_for_output: false,
            pty: None,
            relay: false,
        },
    )
    .encode_into(&mut out);
    out
}

/// What a command inside would send to take over the agent: a session
/// whose command leaves a mark.
fn forged_session() -> Vec<u8> {
    session_running("forged", &["touch", "/tmp/pwned"])
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

    // A command holding many idle connections to the port (more than the
    // agent handshakes at once) cannot keep corral from connecting from
    // outside the pod.
    let r = sb
        .run(&sh(&format!(
            "for i in $(seq 40); do (sleep 10 | nc 127.0.0.1 {PORT} >/dev/null 2>&1 &); done; \
             sleep 1; echo flooding"
        )))
        .await;
    assert_eq!(text(&r.stdout), "flooding\n", "{r:?}");
    let during = control::connect_direct(ip, PORT, &secret, Duration::from_secs(3)).await;
    assert!(
        during.is_ok(),
        "corral could not connect while a command flooded the port: {:?}",
        during.err()
    );
    drop(during);
    // That connection took the agent over from the runtime, whose next
    // command may meet the ended stream (a typed agent error) before it
    // reconnects.
    let mut r = sb.run(&sh("echo after the flood")).await;
    if let Some(f) = &r.failure {
        assert!(f.message.contains("control stream"), "{f}");
        r = sb.run(&sh("echo after the flood")).await;
    }
    assert_eq!(text(&r.stdout), "after the flood\n", "{r:?}");

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

#[tokio::test(flavor = "multi_thread")]
async fn bytes_from_inside_cannot_keep_an_abandoned_sandbox_alive() {
    let test = "agent-port-deadman";
    let guard = Guard(test);
    images();
    let docker = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("these tests need a Docker daemon; see README");
    let double = DockerAsPodNetworkDouble::new(docker);
    // Straight on the backend, with no runtime: nothing pings the agent
    // but what this test sends.
    let mut spec = spec(test);
    spec.agent_grace_ms = 2_000;
    let owner = corral::host::this_owner();
    let id = format!("sb-deadman-{}", std::process::id());
    let req = StartRequest {
        sandbox_id: &id,
        spec: &spec,
        agent_env: Vec::new(),
        labels: HashMap::from([(corral_core::labels::SANDBOX.to_string(), id.clone())]),
        owner: &owner,
    };
    double.prepare(&req).await.expect("prepare");
    let placement = double.create(&req).await.expect("create");
    double.start(&req, &placement).await.expect("start");

    // The controller starts a process that keeps connecting to the agent's
    // port from inside and sending bytes, then goes away for good.
    // One connection first, checked: a stranger that never reached the
    // port would prove nothing.
    let stranger = "printf xxxxxxxx | nc -w 1 127.0.0.1 7150 && { \
                    setsid sh -c 'while :; do printf xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx \
                    | nc -w 1 127.0.0.1 7150; done' </dev/null >/dev/null 2>&1 & echo started; }";
    let session = session_running("deadman", &["sh", "-c", stranger]);
    let mut stream = double
        .connect(&placement, &id)
        .await
        .expect("the controller connects");
    {
        use futures_util::StreamExt;
        use tokio::io::AsyncWriteExt;
        stream.input.write_all(&session).await.expect("send");
        stream.input.flush().await.expect("flush");
        // Read until the command said "started" (or the stream ended).
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(corral_core::backend::AgentOutput::Control(b))) =
                stream.output.next().await
            {
                seen.extend_from_slice(&b);
                if seen.windows(7).any(|w| w == b"started") {
                    return;
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the stranger loop was not started");
    }
    drop(stream);

    // Abandoned: the switch fires after its 2 s grace, whatever the
    // stranger sends, and the agent's exit stops the container.
    let mut running = true;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let out = Command::new("docker")
            .args(["inspect", "-f", "{{.State.Running}}", placement.id()])
            .output()
            .expect("docker inspect");
        if String::from_utf8_lossy(&out.stdout).trim() == "false" {
            running = false;
            break;
        }
    }
    double.remove(&placement, &id).await.expect("remove");
    assert!(
        !running,
        "the sandbox outlived its dead-man grace by 8 s with a stranger sending bytes"
    );
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}

/// The attack helper (`attacks/hold.c`), built static, put at /tmp/hold.
async fn install_hold(sb: &corral::Sandbox) {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("corral-hold");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/attacks/hold.c");
    let built = Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("gcc runs");
    assert!(built.success(), "building {src} failed");
    let bin = std::fs::read(&out).expect("the attack helper");
    let opts = corral::FileOptions {
        mode: Some(0o755),
        ..Default::default()
    };
    sb.write_file("/tmp/hold", &bin, &opts)
        .await
        .expect("write helper");
}

/// Starts a command inside that holds `n` idle connections from `src` to
/// the agent's port on 127.0.0.1 (dialling again whenever one is closed),
/// and waits until they are open.
async fn hold_connections(sb: &corral::Sandbox, src: &str, n: usize) {
    let r = sb
        .run(&sh(&format!(
            "(setsid /tmp/hold {src} 127.0.0.1 {PORT} {n} </dev/null >/tmp/hold.out 2>&1 &); \
             for i in $(seq 100); do grep -q holding /tmp/hold.out && break; sleep 0.1; done; \
             cat /tmp/hold.out"
        )))
        .await;
    assert_eq!(text(&r.stdout), format!("holding {n}\n"), "{r:?}");
}

/// After a test's own connection took the agent over, the runtime's next
/// command may meet the ended stream (a typed agent error) before it
/// reconnects.
async fn runtime_goes_on(sb: &corral::Sandbox) {
    let mut r = sb.run(&sh("echo on")).await;
    if let Some(f) = &r.failure {
        assert!(f.message.contains("control stream"), "{f}");
        r = sb.run(&sh("echo on")).await;
    }
    assert_eq!(text(&r.stdout), "on\n", "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_from_any_address_of_the_pod_count_as_inside() {
    let test = "agent-port-own-ip";
    let guard = Guard(test);
    let (rt, double) = runtime().await;
    let sb = rt.create(&spec(test)).await.expect("create");
    let placement = sb.placement();
    let secret = double.secret_of(&placement).expect("secret");
    let ip = container_ip(placement.id()).expect("ip");
    install_hold(&sb).await;
    // Bound to the pod's own (non-loopback) address, dialling loopback:
    // neither end is loopback and the two differ, yet it is the pod.
    hold_connections(&sb, &ip.to_string(), AGENT_BUDGET).await;
    let during = control::connect_direct(ip, PORT, &secret, Duration::from_secs(3)).await;
    assert!(
        during.is_ok(),
        "corral could not connect while a command held connections from the pod's own address: {:?}",
        during.err()
    );
    drop(during);
    runtime_goes_on(&sb).await;
    sb.destroy().await.expect("destroy");
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handshake_dripped_a_byte_at_a_time_is_closed_at_its_deadline() {
    let test = "agent-port-drip";
    let guard = Guard(test);
    let (rt, _double) = runtime().await;
    let sb = rt.create(&spec(test)).await.expect("create");
    let ip = container_ip(sb.placement().id()).expect("ip");
    // A valid opening, one byte every 250 ms: 10 s in all, each byte well
    // within a per-read timeout, the whole far beyond the 5 s handshake
    // deadline. An agent that answers it let the drip hold the port.
    let answered = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let opening = agent_auth::opening(&[9; agent_auth::LEN]);
        let mut s = std::net::TcpStream::connect((ip, PORT)).expect("connect");
        for b in opening {
            if s.write_all(&[b]).is_err() {
                break; // closed by the agent
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut got = Vec::new();
        let mut buf = [0u8; 128];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got.len()
    })
    .await
    .expect("drip");
    assert_eq!(
        answered, 0,
        "the agent answered a handshake that took 10 s to send its opening"
    );
    let r = sb.run(&sh("echo still")).await;
    assert_eq!(text(&r.stdout), "still\n", "{r:?}");
    sb.destroy().await.expect("destroy");
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_loopback_connections_cannot_keep_a_port_forward_out() {
    let test = "agent-port-forward-flood";
    let guard = Guard(test);
    let (rt, double) = runtime().await;
    let sb = rt.create(&spec(test)).await.expect("create");
    let placement = sb.placement();
    let secret = double.secret_of(&placement).expect("secret");
    install_hold(&sb).await;
    hold_connections(&sb, "-", AGENT_BUDGET).await;
    // What a port-forward is to the agent: a connection from loopback,
    // made by a process in the pod's network namespace (here `docker exec`
    // of nc, relaying this test's bytes) rather than by a command.
    let mut relay = tokio::process::Command::new("docker")
        .args(["exec", "-i", placement.id(), "nc", "127.0.0.1"])
        .arg(PORT.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("docker exec");
    let (Some(to), Some(from)) = (relay.stdin.take(), relay.stdout.take()) else {
        panic!("the relay's pipes");
    };
    let mut forwarded = tokio::io::join(from, to);
    let proved = tokio::time::timeout(
        Duration::from_secs(20),
        control::handshake(&mut forwarded, &secret, "port-forward"),
    )
    .await
    .expect("the handshake ended");
    assert!(
        proved.is_ok(),
        "a port-forwarded connection was kept out by a command's idle connections: {:?}",
        proved.err()
    );
    drop(forwarded);
    let _ = relay.kill().await;
    runtime_goes_on(&sb).await;
    sb.destroy().await.expect("destroy");
    assert!(
        guard.remaining().is_empty(),
        "left: {:?}",
        guard.remaining()
    );
}
