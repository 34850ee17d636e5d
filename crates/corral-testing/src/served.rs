//! A real `corral serve` process, run as a user runs it, for the tests of
//! commands that talk to a service (`corral events`) and for benchmarks:
//! its config file (the test's label on every sandbox, runtime files in a
//! scratch directory) written to a scratch directory, its stderr in a file
//! there, stopped with SIGTERM (which removes its sandboxes) when dropped,
//! so a failed test leaks nothing.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `corral serve`.
pub struct Served {
    child: Child,
    /// `IP:PORT` it listens on.
    pub addr: String,
    /// The token of tenant `default` it was given.
    pub token: String,
    /// The scratch directory (config, log, runtime files).
    pub dir: PathBuf,
}

impl Served {
    /// Starts `corral` (the binary at `corral`) as `corral --config FILE
    /// serve` on a free loopback port, every sandbox labelled
    /// `corraltest=<label>`, with `extra_yaml` appended to the config's
    /// `server:` section (indented by the caller, two spaces).
    pub fn start(corral: &str, label: &str, extra_yaml: &str) -> Served {
        let dir =
            std::env::temp_dir().join(format!("corral-served-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "defaults:\n  image: corral-test/busybox\n  labels: {{corraltest: {label}}}\n\
                 server:\n  listen: 127.0.0.1:0\n  runtime_dir: {}\n  shutdown_grace_ms: 1000\n{extra_yaml}",
                dir.join("runtime").display()
            ),
        )
        .expect("config file");
        let log = dir.join("serve.log");
        let token = format!("served-{label}-{}", std::process::id());
        let child = Command::new(corral)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("CORRAL_TOKEN", &token)
            .env_remove("CORRAL_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("serve log"))
            .spawn()
            .expect("spawn corral serve");
        let mut served = Served {
            child,
            addr: String::new(),
            token,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
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

    /// The service's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One HTTP/1.1 request with the token: the status and the body.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let body = body.unwrap_or_default();
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
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("response");
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, body.to_string())
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Served {
    /// SIGTERM, as a user stops it: it removes its sandboxes, then exits;
    /// SIGKILL if it has not within a minute.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
