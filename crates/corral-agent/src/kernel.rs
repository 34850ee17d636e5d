//! `corral-agent kernel LANGUAGE`: a Jupyter kernel of the sandbox, spoken
//! to over the Jupyter messaging protocol (ZeroMQ through the `zeromq`
//! crate, HMAC-SHA256 signed) and relayed to corral as JSON lines over the
//! tool's stdin and stdout.
//!
//! corral runs it as an ordinary command, so a kernel is bounded like one
//! (the sandbox's limits, seccomp, its process tree ended by a reset, an
//! exclusive command or a new session). The tool writes a connection file
//! with five free ports on `127.0.0.1` and a fresh random key into a private
//! directory, starts the kernel (`python3 -m ipykernel_launcher -f FILE`) as
//! its child with a parent-death signal, and connects the shell, control
//! and iopub channels. Only something inside this sandbox can reach the
//! ports, and only a holder of the key can drive them.
//!
//! Input lines: `{"op":"send","channel":"shell"|"control","msg_id":..,
//! "msg_type":..,"content":{..}}` and `{"op":"interrupt"}` (SIGINT to the
//! kernel). Output lines: `{"event":"ready","pid":N}`, `{"event":"message",
//! "channel":..,"msg_type":..,"parent":..,"content":{..}}` for every signed
//! message the kernel sends, `{"event":"exited","code":..,"signal":..,
//! "oom_killed":..}` when the kernel ends (the tool then exits), and
//! `{"event":"failed","message":..}` when it cannot start. stdin's EOF
//! ends the kernel.

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::oom::OomCounter;
use crate::sys;

/// How long the kernel may take to answer its first `kernel_info_request`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The delimiter between routing identities and a Jupyter message.
const DELIM: &[u8] = b"<IDS|MSG>";

/// Parses LANGUAGE; the languages this tool can start a kernel for.
pub fn parse(rest: &[String]) -> Result<String, String> {
    match rest {
        [lang] => Ok(lang.clone()),
        _ => Err("kernel takes one LANGUAGE".to_string()),
    }
}

/// The kernel's argv for `language`, or why there is none.
fn kernel_argv(language: &str, connection_file: &str) -> Result<Vec<String>, String> {
    match language {
        "python" | "python3" => Ok(vec![
            "python3".into(),
            "-m".into(),
            "ipykernel_launcher".into(),
            "-f".into(),
            connection_file.into(),
        ]),
        other => Err(format!(
            "no kernel for language '{other}': corral starts Python kernels (ipykernel)"
        )),
    }
}

/// Writes one JSON line to stdout.
fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn failed(message: impl Into<String>) -> i32 {
    emit(&json!({"event": "failed", "message": message.into()}));
    1
}

/// Runs the tool; the exit code.
pub fn run(language: &str) -> i32 {
    let key = match random_hex(32) {
        Ok(k) => k,
        Err(e) => {
            return failed(format!(
                "cannot read random bytes for the kernel's key: {e}"
            ))
        }
    };
    let dir = match private_dir() {
        Ok(d) => d,
        Err(e) => return failed(format!("cannot make the kernel's directory: {e}")),
    };
    let ports = match free_ports(5) {
        Ok(p) => p,
        Err(e) => return failed(format!("cannot find free loopback ports: {e}")),
    };
    let conn = json!({
        "transport": "tcp", "ip": "127.0.0.1",
        "shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
        "control_port": ports[3], "hb_port": ports[4],
        "key": key, "signature_scheme": "hmac-sha256",
    });
    let file = format!("{dir}/connection.json");
    if let Err(e) = write_private(&file, conn.to_string().as_bytes()) {
        return failed(format!("cannot write {file}: {e}"));
    }
    let argv = match kernel_argv(language, &file) {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // debugpy's note about frozen modules, on every start, is noise.
        .env("PYDEVD_DISABLE_FILE_VALIDATION", "1");
    sys::die_with_parent(&mut cmd);
    let oom = OomCounter::detect();
    let oom_before = oom.read();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {}: {e}", argv.join(" "))),
    };
    let pid = child.id() as i32;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = child.kill();
            return failed(format!("cannot start the kernel's event loop: {e}"));
        }
    };
    let session = random_hex(16).unwrap_or_default();
    let relay = Relay {
        key: key.into_bytes(),
        session,
    };
    let code = rt.block_on(relay.serve(&ports, pid, &mut child));
    let _ = child.kill();
    let status = child.wait().ok();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(status) = status {
        use std::os::unix::process::ExitStatusExt;
        let signal = status.signal();
        emit(&json!({
            "event": "exited",
            "code": status.code(),
            "signal": signal,
            "oom_killed": crate::oom::oom_killed(oom_before, oom.read(), signal, false),
        }));
    }
    code
}

struct Relay {
    key: Vec<u8>,
    session: String,
}

/// A line corral sent, or the end of its stdin.
enum Input {
    Line(String),
    Eof,
}

impl Relay {
    async fn serve(&self, ports: &[u16], pid: i32, child: &mut Child) -> i32 {
        let endpoint = |p: u16| format!("tcp://127.0.0.1:{p}");
        let mut shell = DealerSocket::new();
        let mut control = DealerSocket::new();
        let mut iopub = SubSocket::new();
        let started = Instant::now();
        // The kernel binds its ports a moment after it starts.
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return failed(format!(
                    "the kernel exited before it listened ({status}); is ipykernel installed \
                     in the image (python3 -m ipykernel_launcher)?"
                ));
            }
            if started.elapsed() > START_TIMEOUT {
                return failed("the kernel did not listen within 60 s");
            }
            let ok = shell.connect(&endpoint(ports[0])).await.is_ok()
                && control.connect(&endpoint(ports[3])).await.is_ok()
                && iopub.connect(&endpoint(ports[1])).await.is_ok();
            if ok {
                break;
            }
            shell = DealerSocket::new();
            control = DealerSocket::new();
            iopub = SubSocket::new();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Err(e) = iopub.subscribe("").await {
            return failed(format!("cannot subscribe to the kernel's iopub: {e}"));
        }
        // Ready once the kernel answers kernel_info on shell; iopub's
        // subscription is in place by then too (a kernel_info's status
        // message arrives on it).
        let info_id = random_hex(16).unwrap_or_default();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return failed(format!("the kernel exited while starting ({status})"));
            }
            if started.elapsed() > START_TIMEOUT {
                return failed("the kernel did not answer within 60 s");
            }
            let msg = self.message(&info_id, "kernel_info_request", json!({}));
            if shell.send(msg).await.is_err() {
                return failed("cannot send to the kernel's shell channel");
            }
            let deadline = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(deadline);
            let mut answered = false;
            let mut saw_iopub = false;
            while !(answered && saw_iopub) {
                tokio::select! {
                    m = shell.recv() => {
                        if let Ok(m) = m {
                            if self.verify(m).is_some() {
                                answered = true;
                            }
                        }
                    }
                    m = iopub.recv() => {
                        if m.is_ok() {
                            saw_iopub = true;
                        }
                    }
                    _ = &mut deadline => break,
                }
            }
            if answered && saw_iopub {
                break;
            }
        }
        emit(&json!({"event": "ready", "pid": pid}));

        let (tx, mut rx) = tokio::sync::mpsc::channel::<Input>(64);
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                if tx.blocking_send(Input::Line(line)).is_err() {
                    return;
                }
            }
            let _ = tx.blocking_send(Input::Eof);
        });
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                input = rx.recv() => match input {
                    None | Some(Input::Eof) => return 0,
                    Some(Input::Line(line)) => {
                        if let Err(e) = self.input(&line, pid, &mut shell, &mut control).await {
                            emit(&json!({"event": "refused", "message": e}));
                        }
                    }
                },
                m = shell.recv() => if let Ok(m) = m { self.relay("shell", m) },
                m = control.recv() => if let Ok(m) = m { self.relay("control", m) },
                m = iopub.recv() => if let Ok(m) = m { self.relay("iopub", m) },
                _ = tick.tick() => {
                    if let Ok(Some(_)) = child.try_wait() {
                        return 0;
                    }
                }
            }
        }
    }

    /// Acts on one input line.
    async fn input(
        &self,
        line: &str,
        pid: i32,
        shell: &mut DealerSocket,
        control: &mut DealerSocket,
    ) -> Result<(), String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("input line: {e}"))?;
        match v.get("op").and_then(Value::as_str) {
            Some("interrupt") => {
                sys::kill(pid, libc::SIGINT).map_err(|e| format!("interrupt: {e}"))
            }
            Some("send") => {
                let field = |name: &str| {
                    v.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("send: field '{name}' is missing"))
                };
                let msg_id = field("msg_id")?;
                let msg_type = field("msg_type")?;
                let content = v.get("content").cloned().unwrap_or_else(|| json!({}));
                let msg = self.message(msg_id, msg_type, content);
                let socket = match field("channel")? {
                    "shell" => shell,
                    "control" => control,
                    other => {
                        return Err(format!("send: channel '{other}' is not shell or control"))
                    }
                };
                socket.send(msg).await.map_err(|e| format!("send: {e}"))
            }
            other => Err(format!("input line: op {other:?} is not send or interrupt")),
        }
    }

    /// A signed Jupyter message with no parent.
    fn message(&self, msg_id: &str, msg_type: &str, content: Value) -> ZmqMessage {
        let header = json!({
            "msg_id": msg_id, "msg_type": msg_type, "session": self.session,
            "username": "corral", "version": "5.3", "date": "1970-01-01T00:00:00.000000Z",
        })
        .to_string();
        let parts = [
            header,
            "{}".to_string(),
            "{}".to_string(),
            content.to_string(),
        ];
        let sig = self.sign(&parts);
        let mut frames: Vec<Bytes> = vec![Bytes::from_static(DELIM), Bytes::from(sig)];
        frames.extend(parts.into_iter().map(Bytes::from));
        ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Vec::<u8>::new()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        Hmac::<Sha256>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!())
    }

    fn sign<T: AsRef<[u8]>>(&self, parts: &[T]) -> String {
        let mut mac = self.mac();
        for p in parts {
            mac.update(p.as_ref());
        }
        hex(&mac.finalize().into_bytes())
    }

    /// The message's header, parent header and content, when its signature
    /// is the key's.
    fn verify(&self, msg: ZmqMessage) -> Option<(Value, Value, Value)> {
        let frames = msg.into_vec();
        let at = frames.iter().position(|f| f.as_ref() == DELIM)?;
        let rest = &frames[at + 1..];
        if rest.len() < 5 {
            return None;
        }
        let mut mac = self.mac();
        for p in &rest[1..5] {
            mac.update(p);
        }
        let given = std::str::from_utf8(&rest[0]).ok()?;
        let want = unhex(given)?;
        mac.verify_slice(&want).ok()?;
        let header = serde_json::from_slice(&rest[1]).ok()?;
        let parent = serde_json::from_slice(&rest[2]).ok()?;
        let content = serde_json::from_slice(&rest[4]).ok()?;
        Some((header, parent, content))
    }

    /// Passes a verified message on to corral.
    fn relay(&self, channel: &str, msg: ZmqMessage) {
        let Some((header, parent, content)) = self.verify(msg) else {
            return;
        };
        emit(&json!({
            "event": "message",
            "channel": channel,
            "msg_type": header.get("msg_type").cloned().unwrap_or(Value::Null),
            "parent": parent.get("msg_id").cloned().unwrap_or(Value::Null),
            "content": content,
        }));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex(&buf))
}

/// A fresh directory only this user can enter, under `$TMPDIR` or `/tmp`.
fn private_dir() -> std::io::Result<String> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
    let dir = format!("{base}/corral-kernel-{}", random_hex(8)?);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

fn write_private(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// `n` distinct ports free on loopback now (bound, then released).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_and_verifies_with_the_key_only() {
        let relay = Relay {
            key: b"k".to_vec(),
            session: "s".into(),
        };
        let msg = relay.message("id1", "execute_request", json!({"code": "1"}));
        let (header, _, content) = relay.verify(msg.clone()).expect("own signature verifies");
        assert_eq!(header["msg_id"], "id1");
        assert_eq!(content["code"], "1");
        let other = Relay {
            key: b"other".to_vec(),
            session: "s".into(),
        };
        assert!(
            other.verify(msg).is_none(),
            "another key's signature is refused"
        );
    }

    #[test]
    fn only_python_has_a_kernel() {
        assert!(kernel_argv("python", "/f").is_ok());
        let e = kernel_argv("r", "/f").expect_err("no R kernel");
        assert!(e.contains("'r'"), "{e}");
        assert_eq!(unhex(&hex(&[0, 255, 16])), Some(vec![0, 255, 16]));
        assert_eq!(unhex("zz"), None);
    }
}
