//! Test harness: a real container running the static agent as PID 1, and a
//! client speaking the protocol through `docker attach` to PID 1's stdin and
//! stdout, exactly the path corral uses.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corral_core::protocol::{
    ExecRequest, ExitReport, Frame, FrameKind, Hello, HelloAck, Item, ProtocolError, SpawnError,
    Started, SyncDecoder, PROTOCOL_VERSION, SYNC,
};

/// Where the agent sits inside test containers.
pub const AGENT_IN_CONTAINER: &str = "/corral-agent";

/// How long any single expected frame may take.
pub const FRAME_WAIT: Duration = Duration::from_secs(20);

/// True when a Docker daemon answers; tests skip (and say so) otherwise.
pub fn docker_available() -> bool {
    let ok = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: `docker info` failed, no Docker daemon to test against");
    }
    ok
}

/// The static agent binary: `CORRAL_AGENT_BIN`, or built once per test run
/// the way it ships.
pub fn agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("CORRAL_AGENT_BIN") {
            return PathBuf::from(p);
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        // Inside this checkout: a target directory shared by several
        // checkouts can take one's stale build for another's.
        let target_dir = root.join("target").join("agent-test");
        let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
        cmd.current_dir(&root)
            .args(["build", "-p", "corral-agent", "--release"])
            .args(["--target", "x86_64-unknown-linux-gnu", "--target-dir"])
            .arg(&target_dir)
            .env("RUSTFLAGS", "-C target-feature=+crt-static");
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTC_WRAPPER",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
        ] {
            cmd.env_remove(var);
        }
        let status = cmd.status().expect("run cargo to build the static agent");
        assert!(
            status.success(),
            "building the static agent failed: {status}"
        );
        target_dir.join("x86_64-unknown-linux-gnu/release/corral-agent")
    })
    .clone()
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("run the docker CLI")
}

fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// How to create a test sandbox.
pub struct Opts {
    pub image: &'static str,
    /// Memory limit (and memory+swap), in MiB.
    pub memory_mib: u64,
    pub grace_ms: u64,
    /// Run as this user instead of the image's.
    pub user: Option<&'static str>,
    /// Read-only root filesystem.
    pub read_only: bool,
    /// tmpfs mounts.
    pub tmpfs: Vec<&'static str>,
    /// Bind-mount the agent instead of `docker cp`-ing it (which a
    /// read-only root filesystem refuses). Needs a local daemon.
    pub mount_agent: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            image: "corral-test/busybox",
            memory_mib: 64,
            grace_ms: 30_000,
            user: None,
            read_only: false,
            tmpfs: Vec::new(),
            mount_agent: false,
        }
    }
}

/// `POST path` with a JSON body to the local daemon's socket; the status
/// code and the body. The CLI cannot make a container whose stdin stays
/// open across attaches (`docker create -i` sets StdinOnce), so test
/// containers are created through the Engine API, as corral does.
fn engine_post(path: &str, body: &serde_json::Value) -> (u16, String) {
    use std::os::unix::net::UnixStream;
    let body = body.to_string();
    let mut s = UnixStream::connect("/var/run/docker.sock").expect("connect to the daemon");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send to the daemon");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .expect("read the daemon's answer");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// A running container with the agent as PID 1; removed on drop, whatever
/// happened in the test.
pub struct Sandbox {
    pub name: String,
}

impl Sandbox {
    pub fn start(opts: Opts) -> Sandbox {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "agenttest-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let bin = agent_bin();
        // The guard exists before the container does, so a failure anywhere
        // below still removes it.
        let sb = Sandbox { name };
        let bin = bin.to_str().expect("agent path is UTF-8");
        // Owner labels naming this test process, so a corral reaper running
        // elsewhere on the host does not take the container for an orphan.
        let mut labels: serde_json::Map<String, serde_json::Value> = test_owner_labels()
            .into_iter()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                Some((k.to_string(), v.into()))
            })
            .collect();
        labels.insert("corral.sandbox".into(), "agenttest".into());
        let memory = opts.memory_mib << 20;
        let tmpfs: serde_json::Map<String, serde_json::Value> = opts
            .tmpfs
            .iter()
            .map(|t| (t.to_string(), "".into()))
            .collect();
        let binds: Vec<String> = if opts.mount_agent {
            vec![format!("{bin}:{AGENT_IN_CONTAINER}:ro")]
        } else {
            Vec::new()
        };
        let body = serde_json::json!({
            "Image": opts.image,
            "Entrypoint": [AGENT_IN_CONTAINER],
            "Cmd": ["init", "--grace-ms", opts.grace_ms.to_string()],
            "User": opts.user.unwrap_or(""),
            "Labels": labels,
            "OpenStdin": true,
            "StdinOnce": false,
            "HostConfig": {
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges"],
                "PidsLimit": 256,
                "Memory": memory,
                "MemorySwap": memory,
                "NetworkMode": "none",
                "ReadonlyRootfs": opts.read_only,
                "Tmpfs": tmpfs,
                "Binds": binds,
            },
        });
        let (status, answer) = engine_post(&format!("/containers/create?name={}", sb.name), &body);
        assert_eq!(status, 201, "creating the test container failed: {answer}");
        if !opts.mount_agent {
            docker_ok(&["cp", bin, &format!("{}:{AGENT_IN_CONTAINER}", sb.name)]);
        }
        docker_ok(&["start", &sb.name]);
        sb
    }

    /// Connects a client and completes the handshake.
    pub fn client(&self) -> Client {
        let mut c = self.raw_client();
        let ack = c.hello();
        assert_eq!(ack.protocol, PROTOCOL_VERSION);
        assert_eq!(ack.agent_version, env!("CARGO_PKG_VERSION"));
        c
    }

    /// Connects a client without any handshake.
    pub fn raw_client(&self) -> Client {
        Client::connect(&self.name)
    }

    /// `State.Running` of the container.
    pub fn running(&self) -> bool {
        docker_ok(&["inspect", "-f", "{{.State.Running}}", &self.name]) == "true"
    }

    /// `State.ExitCode` of the container.
    pub fn exit_code(&self) -> String {
        docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &self.name])
    }

    /// The container's log (the agent's stderr).
    pub fn logs(&self) -> String {
        let out = docker(&["logs", &self.name]);
        String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned()
    }

    /// Waits until the container stops; returns how long that took, or None.
    pub fn wait_stopped(&self, within: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if !self.running() {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// `docker kill -s <signal>`: a signal to the agent (PID 1).
    pub fn kill_signal(&self, signal: &str) {
        docker_ok(&["kill", "-s", signal, &self.name]);
    }

    /// `docker stop -t <secs>`; returns how long it took.
    pub fn stop(&self, secs: u32) -> Duration {
        let t0 = Instant::now();
        docker_ok(&["stop", "-t", &secs.to_string(), &self.name]);
        t0.elapsed()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", "-v", &self.name]);
    }
}

/// Everything a command sent, gathered until its last frame.
#[derive(Debug, Default)]
pub struct Outcome {
    pub pid: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_tail: Vec<u8>,
    pub stderr_tail: Vec<u8>,
    pub report: Option<ExitReport>,
    pub spawn_error: Option<String>,
    pub frames: Vec<Frame>,
}

impl Outcome {
    /// The report; panics (failing the test) when the command did not run.
    pub fn report(&self) -> &ExitReport {
        self.report
            .as_ref()
            .unwrap_or_else(|| panic!("no Exited frame: {self:?}"))
    }

    /// Head and tail of stdout as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&[self.stdout.clone(), self.stdout_tail.clone()].concat())
            .into_owned()
    }
}

/// A protocol client over `docker attach <sandbox>` (PID 1's stdio).
pub struct Client {
    exec: Child,
    stdin: Option<ChildStdin>,
    frames: Receiver<Frame>,
    stash: HashMap<u32, VecDeque<Frame>>,
    next_id: u32,
}

impl Client {
    fn connect(sandbox: &str) -> Client {
        let mut exec = Command::new("docker")
            .args(["attach", "--sig-proxy=false", sandbox])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn docker exec");
        let stdin = exec.stdin.take();
        // `docker attach` forwards stdin only once attached; give it a
        // moment so nothing the agent answers is missed.
        std::thread::sleep(Duration::from_millis(300));
        let mut stdout = exec.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut d = SyncDecoder::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                d.extend(&buf[..n]);
                loop {
                    match d.next_item() {
                        Ok(Some(Item::Frame(f))) => {
                            if tx.send(f).is_err() {
                                return;
                            }
                        }
                        Ok(Some(Item::Synced)) => {}
                        Ok(None) => break,
                        // Another session's sync bytes: hunt on.
                        Err(_) => d.resync(),
                    }
                }
            }
        });
        Client {
            exec,
            stdin,
            frames: rx,
            stash: HashMap::new(),
            next_id: 1000,
        }
    }

    /// Writes raw bytes to the agent.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(bytes).expect("write to docker exec");
        stdin.flush().expect("flush docker exec");
    }

    pub fn send(&mut self, frame: &Frame) {
        self.send_raw(&frame.encode());
    }

    /// SIGKILLs the `docker exec` process, like corral dying.
    pub fn kill(&mut self) {
        let _ = self.exec.kill();
        let _ = self.exec.wait();
    }

    /// Starts a session (sync bytes, then Hello) and returns the answer.
    pub fn hello(&mut self) -> HelloAck {
        self.hello_with(PROTOCOL_VERSION)
    }

    /// Starts a session speaking protocol `version`.
    pub fn hello_with(&mut self, version: u32) -> HelloAck {
        self.hello_full(version, Vec::new())
    }

    /// Starts a session whose commands get the sandbox environment `env`.
    pub fn hello_env(&mut self, env: &[(&str, &str)]) -> HelloAck {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.hello_full(PROTOCOL_VERSION, env)
    }

    fn hello_full(&mut self, version: u32, env: Vec<(String, String)>) -> HelloAck {
        static N: AtomicUsize = AtomicUsize::new(0);
        let session = format!(
            "test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut bytes = SYNC.to_vec();
        Frame::json(
            FrameKind::Hello,
            0,
            &Hello {
                protocol: version,
                session: session.clone(),
                env,
                restored: false,
            },
        )
        .encode_into(&mut bytes);
        self.send_raw(&bytes);
        loop {
            let f = self.next_frame(0);
            if f.kind != FrameKind::HelloAck {
                continue; // e.g. a Pong of an earlier session
            }
            let ack: HelloAck = f.parse().expect("HelloAck payload");
            if ack.session == session {
                return ack;
            }
        }
    }

    /// Sends a keepalive ping (the dead-man switch's food).
    pub fn ping(&mut self) {
        self.send(&Frame::new(FrameKind::Ping, 0, Vec::new()));
    }

    /// The next frame from the agent for any id, or None when the agent
    /// closed the connection within `wait`.
    pub fn recv_any(&mut self, wait: Duration) -> Option<Frame> {
        match self.frames.recv_timeout(wait) {
            Ok(f) => Some(f),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("no frame from the agent within {wait:?}"),
        }
    }

    /// The next frame for `id`, stashing frames of other ids.
    pub fn next_frame(&mut self, id: u32) -> Frame {
        if let Some(f) = self.stash.get_mut(&id).and_then(VecDeque::pop_front) {
            return f;
        }
        loop {
            let f = self
                .recv_any(FRAME_WAIT)
                .unwrap_or_else(|| panic!("agent closed the connection while waiting for id {id}"));
            if f.id == id {
                return f;
            }
            self.stash.entry(f.id).or_default().push_back(f);
        }
    }

    /// Frames for `id` received and not yet taken, after a short wait for
    /// stragglers.
    pub fn stash_of(&mut self, id: u32) -> Vec<Frame> {
        while let Ok(f) = self.frames.recv_timeout(Duration::from_millis(300)) {
            self.stash.entry(f.id).or_default().push_back(f);
        }
        self.stash
            .get(&id)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The next Error frame's message for `id`.
    pub fn expect_error(&mut self, id: u32) -> String {
        let f = self.next_frame(id);
        assert_eq!(f.kind, FrameKind::Error, "expected an Error frame: {f:?}");
        f.parse::<ProtocolError>().expect("Error payload").message
    }

    pub fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    pub fn exec(&mut self, id: u32, req: &ExecRequest) {
        self.send(&Frame::json(FrameKind::Exec, id, req));
    }

    /// Collects frames for `id` until Exited or SpawnFailed.
    pub fn wait(&mut self, id: u32) -> Outcome {
        let mut o = Outcome::default();
        loop {
            let f = self.next_frame(id);
            o.frames.push(f.clone());
            match f.kind {
                FrameKind::Started => o.pid = Some(f.parse::<Started>().expect("Started").pid),
                FrameKind::Stdout => o.stdout.extend_from_slice(&f.payload),
                FrameKind::Stderr => o.stderr.extend_from_slice(&f.payload),
                FrameKind::StdoutTail => o.stdout_tail.extend_from_slice(&f.payload),
                FrameKind::StderrTail => o.stderr_tail.extend_from_slice(&f.payload),
                FrameKind::Exited => {
                    o.report = Some(f.parse().expect("Exited payload"));
                    return o;
                }
                FrameKind::SpawnFailed => {
                    o.spawn_error = Some(f.parse::<SpawnError>().expect("SpawnFailed").message);
                    return o;
                }
                other => panic!("unexpected frame {other:?} for command {id}: {f:?}"),
            }
        }
    }

    /// Runs `req` as command `id` to completion.
    pub fn run_with_id(&mut self, id: u32, req: &ExecRequest) -> Outcome {
        self.exec(id, req);
        self.wait(id)
    }

    /// Runs `req` to completion.
    pub fn run_req(&mut self, req: &ExecRequest) -> Outcome {
        let id = self.fresh_id();
        self.exec(id, req);
        self.wait(id)
    }

    /// Runs `argv` with defaults (no stdin, 1 MiB budget, 30 s timeout).
    pub fn run(&mut self, argv: &[&str]) -> Outcome {
        self.run_req(&req(argv))
    }

    /// Runs `sh -c script`.
    pub fn sh(&mut self, script: &str) -> Outcome {
        self.run(&["sh", "-c", script])
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An ExecRequest with test defaults.
pub fn req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: Vec::new(),
        stdin: false,
        timeout_ms: Some(30_000),
        max_output: 1 << 20,
        exclusive: false,
        wait_for_output: false,
        pty: None,
        relay: false,
    }
}

/// Commands (`comm`) of the processes in the sandbox with their state, as
/// `ps` inside it sees them.
pub fn processes(c: &mut Client) -> Vec<(String, String)> {
    let o = c.run(&["ps", "-o", "stat,comm,args"]);
    assert_eq!(o.report().exit_code, Some(0), "ps failed: {o:?}");
    o.out()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let stat = w.next()?.to_string();
            let rest: Vec<&str> = w.collect();
            Some((stat, rest.join(" ")))
        })
        .collect()
}

/// `corral.owner.*` labels for this test process (host, pid, start time in
/// clock ticks, as corral's orphan rule reads them).
fn test_owner_labels() -> Vec<String> {
    let pid = std::process::id();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let start = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.get(stat.rfind(')')? + 1..)?.to_string();
            rest.split_whitespace().nth(19).map(str::to_string)
        })
        .unwrap_or_default();
    vec![
        format!("corral.owner.host={host}"),
        format!("corral.owner.pid={pid}"),
        format!("corral.owner.start={start}"),
    ]
}
