//! A real container registry on loopback for the tests that pull: Debian's
//! `docker-registry` (the reference distribution registry), installed by
//! `scripts/ensure-registry.sh` when missing, started per test on
//! `127.0.0.1:<free port>` with its own config and storage in a temp dir.
//! Docker allows 127.0.0.0/8 registries without TLS, so the daemon pushes
//! and pulls there as from any registry. The registry's access log is the
//! witness of what the daemon asked it (how many manifest fetches, so how
//! many pulls).
//!
//! Dropping a [`Registry`] stops it, removes its storage and every image of
//! it the daemon holds.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running registry; see the module comment.
pub struct Registry {
    /// `127.0.0.1:PORT`, the prefix of its images' names.
    pub host: String,
    dir: PathBuf,
    child: Option<Child>,
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("run {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Registry {
    /// Installs (when missing) and starts a registry, and waits until it
    /// answers `GET /v2/`.
    pub fn start() -> Result<Registry, String> {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/ensure-registry.sh"
        );
        let bin = run("bash", &[script])?;
        let bin = bin.lines().last().unwrap_or("docker-registry").to_string();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("find a free port: {e}"))?
            .port();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "corral-registry-{}-{port}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("storage"))
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {host}\n",
            dir.join("storage").display()
        );
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config).map_err(|e| format!("write config: {e}"))?;
        let log = std::fs::File::create(dir.join("registry.log"))
            .map_err(|e| format!("create the registry log: {e}"))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("share the registry log: {e}"))?;
        let child = Command::new(&bin)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {bin}: {e}"))?;
        let registry = Registry {
            host,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !registry.answers() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the registry at {} did not answer within 30 s: {}",
                    registry.host,
                    registry.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    /// Whether `GET /v2/` answers 200.
    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(&self.host) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!(
            "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.host
        );
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply.starts_with("HTTP/1.1 200")
    }

    /// `127.0.0.1:PORT/<repo>:<tag>`.
    pub fn image(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host)
    }

    /// Pushes the local image `local` as `<repo>:<tag>` and removes the
    /// local name again, so the daemon has to pull it; returns its name.
    pub fn push(&self, local: &str, repo: &str, tag: &str) -> Result<String, String> {
        let name = self.image(repo, tag);
        run("docker", &["tag", local, &name])?;
        let pushed = run("docker", &["push", &name]);
        let removed = run("docker", &["rmi", &name]);
        pushed?;
        removed?;
        Ok(name)
    }

    /// The registry's log so far (access log and its own lines).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// How many times the daemon asked for the manifest of `<repo>:<tag>`
    /// by its tag (`HEAD` or `GET`, as the registry's access log counts
    /// them; a pull resolves the tag once, then fetches by digest).
    pub fn tag_requests(&self, repo: &str, tag: &str) -> usize {
        let head = format!("\"HEAD /v2/{repo}/manifests/{tag} ");
        let get = format!("\"GET /v2/{repo}/manifests/{tag} ");
        self.log()
            .lines()
            .filter(|l| l.contains(&head) || l.contains(&get))
            .count()
    }

    /// Stops the registry (its storage stays until drop), so pulls find it
    /// unreachable.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Removes every image of this registry from the daemon.
    pub fn remove_pulled(&self) {
        let Ok(list) = run(
            "docker",
            &["images", "--format", "{{.Repository}}:{{.Tag}}"],
        ) else {
            return;
        };
        let prefix = format!("{}/", self.host);
        let ours: Vec<&str> = list.lines().filter(|l| l.starts_with(&prefix)).collect();
        if !ours.is_empty() {
            let mut args = vec!["rmi", "-f"];
            args.extend(ours);
            let _ = run("docker", &args);
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        self.remove_pulled();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
