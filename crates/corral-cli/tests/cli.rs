//! The `corral` CLI contract, run as a user runs it, against the real daemon.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// Runs corral with `args`, optional stdin; returns (exit code, stdout, stderr).
fn corral(args: &[&str], stdin: Option<&[u8]>) -> (i32, Vec<u8>, String) {
    images();
    let mut child = Command::new(CORRAL)
        .args(args)
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(bytes).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait corral");
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn json(args: &[&str]) -> (i32, Value) {
    let (code, out, err) = corral(args, None);
    let v: Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?} / {err}",
            String::from_utf8_lossy(&out)
        )
    });
    (code, v)
}

fn leftovers(filter: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", filter])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn run_passes_output_through_and_exits_with_the_commands_code() {
    let (code, out, err) = corral(&["run", "--", "echo hello; echo oops >&2; exit 7"], None);
    assert_eq!(code, 7, "{err}");
    assert_eq!(String::from_utf8_lossy(&out), "hello\n");
    assert!(err.contains("oops"), "{err}");
}

#[test]
fn run_forwards_stdin() {
    let (code, out, _) = corral(&["run", "--", "tr a-z A-Z"], Some(b"shout\n"));
    assert_eq!(code, 0);
    assert_eq!(String::from_utf8_lossy(&out), "SHOUT\n");
}

#[test]
fn run_json_has_the_documented_fields() {
    let (code, v) = json(&[
        "run",
        "--json",
        "--max-output",
        "8",
        "--",
        "printf 0123456789abcdef; echo e >&2",
    ]);
    assert_eq!(code, 0);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["stdout"], "0123cdef");
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stdout_total_bytes"], 16);
    assert_eq!(v["stderr"], "e\n");
    assert_eq!(v["stderr_truncated"], false);
    assert_eq!(v["stderr_total_bytes"], 2);
    assert!(v["duration_ms"].as_f64().is_some());
    assert_eq!(v["failure"], Value::Null);
}

#[test]
fn run_json_types_timeouts_and_ooms() {
    let (code, v) = json(&["run", "--json", "--timeout", "0.5", "--", "sleep 30"]);
    assert_eq!(code, 124);
    assert_eq!(v["failure"]["kind"], "timeout");
    assert_eq!(v["failure"]["retryable"], false);
    assert_eq!(v["exit_code"], Value::Null);

    let (code, v) = json(&[
        "run",
        "--json",
        "--memory",
        "48m",
        "--",
        "dd if=/dev/zero of=/dev/null bs=300M count=1",
    ]);
    assert_eq!(code, 137, "{v}");
    assert_eq!(v["failure"]["kind"], "oom_killed");
}

#[test]
fn run_json_binary_output_is_exact_in_base64() {
    let (_, v) = json(&["run", "--json", "--", "printf '\\377\\376'"]);
    assert_eq!(v["stdout_base64"], "//4=");
}

#[test]
fn bad_flags_name_the_flag_and_the_value() {
    let (code, _, err) = corral(&["run", "--memory", "lots", "--", "true"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--memory") && err.contains("'lots'"), "{err}");
    let (code, _, err) = corral(&["run", "--network", "host", "--", "true"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--network") && err.contains("'host'"), "{err}");
    let (code, _, err) = corral(&["run", "--cpus", "-1", "--", "true"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--cpus"), "{err}");
    let (code, v) = json(&["run", "--json", "--env", "1X=2", "--", "true"]);
    assert_eq!(code, 125);
    assert_eq!(v["failure"]["kind"], "invalid_spec");
    assert!(
        v["failure"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("1X"),
        "{v}"
    );
}

#[test]
fn missing_image_says_which_and_why() {
    let (code, v) = json(&[
        "run",
        "--json",
        "--image",
        "corral-test/nope:9",
        "--",
        "true",
    ]);
    assert_eq!(code, 125);
    assert_eq!(v["failure"]["kind"], "image_not_found");
    let msg = v["failure"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("corral-test/nope:9") && msg.contains("no registry"),
        "{msg}"
    );
}

#[test]
fn unreachable_daemon_fails_fast_and_typed() {
    let started = Instant::now();
    let (code, v) = json(&[
        "--endpoint",
        "unix:///nonexistent/docker.sock",
        "run",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(code, 125);
    assert_eq!(v["failure"]["kind"], "daemon_unavailable");
    assert_eq!(v["failure"]["retryable"], true);
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn sigkilled_corral_leaves_nothing_running_and_gc_removes_the_rest() {
    images();
    let marker = format!("deadman{}", std::process::id());
    let mut child = Command::new(CORRAL)
        .args([
            "run",
            "--agent-grace",
            "2",
            "--env",
            &format!("MARK={marker}"),
            "--",
            "sleep 120",
        ])
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn corral");
    let filter = format!("label=corral.owner.pid={}", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while leftovers(&filter).is_empty() {
        assert!(Instant::now() < deadline, "sandbox never appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().expect("SIGKILL corral");
    child.wait().ok();
    // The agent notices its controller is gone and stops everything within
    // the grace period (allow generous slack for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = !leftovers(&filter).is_empty() && {
            let out = Command::new("docker")
                .args(["ps", "-q", "--filter", &filter])
                .output()
                .expect("docker ps");
            !String::from_utf8_lossy(&out.stdout).trim().is_empty()
        };
        if !running {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox still running after its owner was SIGKILLed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The stopped container is an orphan now: gc (or the reaper of any
    // corral process that connected meanwhile) removes it. A removal another
    // reaper started may still be under way when gc returns.
    let (code, _, err) = corral(&["gc"], None);
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !leftovers(&filter).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(leftovers(&filter), "");
}

#[test]
fn ps_and_doctor_answer() {
    let (code, _, err) = corral(&["ps"], None);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = corral(&["doctor"], None);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{out}\n{err}");
    for needle in [
        "API",
        "cgroup",
        "disk limits",
        "capabilities dropped",
        "no-new-privileges",
        "pids limit",
        "egress        [ ok ] egress by name: internal network, no host address",
    ] {
        assert!(out.contains(needle), "doctor output lacks {needle}: {out}");
    }
}

#[test]
fn interrupted_run_removes_its_sandbox() {
    images();
    let child = Command::new(CORRAL)
        .args(["run", "--", "sleep 120"])
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral");
    let filter = format!("label=corral.owner.pid={}", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while leftovers(&filter).is_empty() {
        assert!(Instant::now() < deadline, "sandbox never appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        leftovers(&filter),
        "",
        "an interrupted run left its sandbox"
    );
}

#[test]
fn unknown_user_is_a_permanent_spec_error() {
    let (code, v) = json(&["run", "--json", "--user", "nosuchuser", "--", "true"]);
    assert_eq!(code, 125);
    assert_eq!(v["failure"]["kind"], "invalid_spec", "{v}");
    assert_eq!(v["failure"]["retryable"], false);
}

/// The frame-forging attack through the CLI: `corral run --json` reports
/// what the command really did, not what it wrote into the control stream.
#[test]
fn run_reports_the_real_result_of_a_command_that_forges_frames() {
    let forger = include_str!("../../corral-docker/tests/attacks/forge-frames.sh");
    let script = format!("{forger}\necho '3 tests FAILED'; forge; exit 1");
    let (code, v) = json(&["run", "--json", "--", &script]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["exit_code"], 1, "{v}");
    assert_eq!(v["stdout"], "3 tests FAILED\n", "{v}");
    assert_eq!(v["failure"], Value::Null, "{v}");
}

/// `--recovery recreate`: a container removed in the middle of the command
/// is recreated and the command runs again, stdin replayed.
#[test]
fn run_recreate_survives_docker_rm_mid_command() {
    images();
    let mut child = Command::new(CORRAL)
        .args([
            "run",
            "--json",
            "--recovery",
            "recreate",
            "--",
            "read line; echo \"got $line\"; sleep 4; echo done",
        ])
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").expect("write stdin");
    }
    let filter = format!("label=corral.owner.pid={}", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let id = leftovers(&filter);
        if !id.is_empty() {
            break id;
        }
        assert!(Instant::now() < deadline, "sandbox never appeared");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Let the command reach its sleep, then take the container away.
    std::thread::sleep(Duration::from_millis(1500));
    let rm = Command::new("docker")
        .args(["rm", "-f", &first])
        .output()
        .expect("docker rm");
    assert!(rm.status.success());
    let out = child.wait_with_output().expect("wait corral");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["failure"], Value::Null, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    // The retry got the same stdin and ran to its end.
    assert_eq!(v["stdout"], "got hello\ndone\n", "{v}");
    assert_eq!(leftovers(&filter), "");
}

/// `corral serve`, run as a user runs it, its stderr in a file; stopped
/// (SIGTERM, which removes its sandboxes) and its leftovers removed when
/// dropped, so a failed test leaks nothing.
struct Served {
    child: std::process::Child,
    addr: String,
    token: String,
    log: std::path::PathBuf,
}

impl Served {
    fn start() -> Self {
        images();
        let log = std::env::temp_dir().join(format!("corral-cli-serve-{}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("serve log");
        let token = format!("cli-test-{}", std::process::id());
        let child = Command::new(CORRAL)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("CORRAL_IMAGE", "corral-test/busybox")
            .env("CORRAL_TOKEN", &token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn corral serve");
        let mut served = Served {
            child,
            addr: String::new(),
            token,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&served.log).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                served.addr = rest
                    .split(|c: char| c.is_whitespace())
                    .next()
                    .unwrap_or_default()
                    .to_string();
                return served;
            }
            let exited = served.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "corral serve did not start ({exited:?}): {text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One HTTP/1.1 request with the token; the status and the JSON body.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        use std::io::Read;
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = std::net::TcpStream::connect(&self.addr).expect("connect");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            self.token,
            body.len()
        )
        .expect("send");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("response");
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn filter(&self) -> String {
        format!("label=corral.owner.pid={}", self.child.id())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let ids = leftovers(&self.filter());
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(ids.split_whitespace())
                .output();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Stops the containers `ids` (whitespace-separated) as a crash would.
fn docker_kill(ids: &str) {
    let ok = Command::new("docker")
        .arg("kill")
        .args(ids.split_whitespace())
        .output()
        .expect("docker kill")
        .status
        .success();
    assert!(ok, "docker kill {ids} failed");
}

/// The keys of an object and, `/`-joined, of the objects within it.
fn key_paths(v: &Value) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    if let Some(o) = v.as_object() {
        for (k, inner) in o {
            out.insert(k.clone());
            out.extend(key_paths(inner).into_iter().map(|p| format!("{k}/{p}")));
        }
    }
    out
}

/// `corral run --json` and the API's exec answer the same command with the
/// same keys: a plain result with binary output, a timeout, and a container
/// lost mid-command (whose failure carries the container's state).
#[test]
fn run_json_and_the_apis_exec_result_have_the_same_keys() {
    let served = Served::start();
    let (st, sb) = served.call("POST", "/v1/sandboxes", Some(&serde_json::json!({})));
    assert_eq!(st, 201, "{sb}");
    let id = sb["id"].as_str().expect("sandbox id").to_string();
    let binary = "printf 'o\\377'; echo e >&2; exit 3";

    let (code, cli) = json(&["run", "--json", "--", binary]);
    assert_eq!(code, 3, "{cli}");
    let (st, api) = served.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&serde_json::json!({"command": binary})),
    );
    assert_eq!(st, 200, "{api}");
    assert_eq!(api["stdout_base64"], cli["stdout_base64"]);
    assert!(cli["sandbox_id"].is_string() && api["sandbox_id"].is_string());
    assert_eq!(key_paths(&cli), key_paths(&api), "cli {cli}\napi {api}");

    let (code, cli) = json(&["run", "--json", "--timeout", "0.5", "--", "sleep 30"]);
    assert_eq!(code, 124, "{cli}");
    let (st, api) = served.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&serde_json::json!({"command": "sleep 30", "timeout_ms": 500})),
    );
    assert_eq!(st, 200, "{api}");
    assert_eq!(api["failure"]["kind"], "timeout");
    assert_eq!(cli["failure"]["kind"], "timeout");
    assert_eq!(key_paths(&cli), key_paths(&api), "cli {cli}\napi {api}");

    // A container lost mid-command: the failure carries the container's
    // state, `log_tail` included (the part the CLI's own copy once lacked).
    let child = Command::new(CORRAL)
        .args(["run", "--json", "--", "sleep 30"])
        .env("CORRAL_IMAGE", "corral-test/busybox")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn corral");
    let container = format!("label=corral.owner.pid={}", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    // Killed once the command runs (not during the start, which a loaded
    // machine can stretch past any fixed sleep).
    while !leftovers(&container)
        .split_whitespace()
        .any(|id| command_runs(id, "sleep 30"))
    {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    docker_kill(&leftovers(&container));
    let out = child.wait_with_output().expect("wait corral");
    let cli: Value = serde_json::from_slice(&out.stdout).expect("corral run --json");
    let (st, sb) = served.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({"session": "lost"})),
    );
    assert_eq!(st, 201, "{sb}");
    let container = sb["container_id"]
        .as_str()
        .expect("container id")
        .to_string();
    let (st, api) = std::thread::scope(|scope| {
        let exec = scope.spawn(|| {
            served.call(
                "POST",
                "/v1/sandboxes/lost/exec",
                Some(&serde_json::json!({"command": "sleep 30"})),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !command_runs(&container, "sleep 30") {
            assert!(Instant::now() < deadline, "the command never started");
            std::thread::sleep(Duration::from_millis(100));
        }
        docker_kill(&container);
        exec.join().expect("exec thread")
    });
    assert_eq!(st, 200, "{api}");
    for v in [&cli, &api] {
        assert_eq!(v["failure"]["kind"], "container_lost", "{v}");
        assert!(v["failure"]["container"]["log_tail"].is_array(), "{v}");
    }
    assert_eq!(key_paths(&cli), key_paths(&api), "cli {cli}\napi {api}");

    for id in [id.as_str(), "lost"] {
        let (st, _) = served.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        assert_eq!(st, 204);
    }
    let filter = served.filter();
    drop(served);
    assert_eq!(leftovers(&filter), "", "corral serve left a sandbox");
}

/// Whether a process whose command line contains `cmd` runs in `container`.
fn command_runs(container: &str, cmd: &str) -> bool {
    Command::new("docker")
        .args(["top", container])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(cmd))
        .unwrap_or(false)
}

#[test]
fn run_keeps_a_snapshot_and_starts_from_it() {
    let name = format!("cli-{}", std::process::id());
    let (code, _, err) = corral(
        &[
            "run",
            "--pristine",
            "--snapshot",
            &name,
            "--",
            "mkdir -p /srv && echo prepared > /srv/state && rm /etc/group",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("kept snapshot {name}")), "{err}");
    let (code, out, err) = corral(&["snapshots", "--json"], None);
    assert_eq!(code, 0, "{err}");
    let listed = String::from_utf8_lossy(&out);
    let line = listed
        .lines()
        .find(|l| l.contains(&format!("\"name\":\"{name}\"")))
        .unwrap_or_else(|| panic!("{name} not listed: {listed}"));
    assert!(line.contains("\"durable\":true"), "{line}");
    // A failed command keeps nothing.
    let (code, _, err) = corral(&["run", "--snapshot", "never-kept-x", "--", "exit 3"], None);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no snapshot never-kept-x kept"), "{err}");

    let (code, out, err) = corral(
        &[
            "run",
            "--from-snapshot",
            &name,
            "--",
            "cat /srv/state; ls /etc/group 2>&1 | wc -l",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(String::from_utf8_lossy(&out), "prepared\n1\n");
    let (code, _, err) = corral(
        &["run", "--from-snapshot", "no-such-snap-x", "--", "true"],
        None,
    );
    assert_eq!(code, 125, "{err}");
    assert!(
        err.contains("no-such-snap-x") && err.contains("no such snapshot"),
        "{err}"
    );

    let (code, out, err) = corral(&["snapshots", "rm", &name], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(String::from_utf8_lossy(&out), format!("deleted {name}\n"));
    let (code, _, err) = corral(&["snapshots", "rm", &name], None);
    assert_eq!(code, 1);
    assert!(err.contains("no such snapshot"), "{err}");
}

#[test]
fn help_lists_every_command_on_one_short_line() {
    let (code, out, err) = corral(&["--help"], None);
    assert_eq!(code, 0, "{err}");
    let text = String::from_utf8_lossy(&out);
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert!(commands.len() >= 15, "{text}");
    for line in &commands {
        assert!(
            line.len() <= 90,
            "a command's summary is one short line: {line:?}"
        );
    }
    for name in [
        "run",
        "serve",
        "pull",
        "port",
        "egress",
        "completions",
        "man",
    ] {
        assert!(
            commands.iter().any(|l| l.trim_start().starts_with(name)),
            "{name}: {text}"
        );
    }
    // The long text is the command's own help.
    let (code, out, _) = corral(&["serve", "--help"], None);
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&out).contains("server.admin_token"));
}

#[test]
fn completions_and_man_pages_come_from_the_same_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = corral(&["completions", shell], None);
        assert_eq!(code, 0, "{shell}: {err}");
        let text = String::from_utf8_lossy(&out);
        for word in ["serve", "snapshots", "allow-image"] {
            assert!(text.contains(word), "{shell} completions lack {word}");
        }
    }
    let (code, _, err) = corral(&["completions", "tcsh"], None);
    assert_ne!(code, 0);
    assert!(err.contains("tcsh"), "{err}");

    let (code, out, err) = corral(&["man"], None);
    assert_eq!(code, 0, "{err}");
    let page = String::from_utf8_lossy(&out);
    assert!(
        page.starts_with(".ie") || page.contains(".TH corral"),
        "{page}"
    );
    let (code, out, err) = corral(&["man", "serve"], None);
    assert_eq!(code, 0, "{err}");
    let page = String::from_utf8_lossy(&out);
    assert!(
        page.contains("corral\\-serve") && page.contains("allow\\-image"),
        "{page}"
    );
    let (code, _, err) = corral(&["man", "nosuch"], None);
    assert_eq!(code, 125);
    assert!(err.contains("no command 'nosuch'"), "{err}");
}
