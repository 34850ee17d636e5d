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
//!
//! [`Registry::start_with_login`] makes one that refuses anonymous pulls
//! (htpasswd basic auth, `htpasswd` from Debian's apache2-utils); its pushes
//! log in with a Docker client configuration of their own, which is also
//! the credentials file a pull can be given. [`Relay`] stands between the
//! daemon and a registry on another port: it can slow the registry's
//! answers down (so a pull is seen under way) and make the registry die
//! mid-pull (every connection cut, every new one refused) and come back.

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
    /// The Docker client configuration its pushes log in with (a registry
    /// with a login only).
    docker_config: Option<PathBuf>,
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
        Registry::launch(None)
    }

    /// A registry that serves only `user` with `password` (basic auth), and
    /// has the daemon's pushes logged in as them.
    pub fn start_with_login(user: &str, password: &str) -> Result<Registry, String> {
        let mut registry = Registry::launch(Some((user, password)))?;
        let config = registry.dir.join("docker-config");
        std::fs::create_dir_all(&config)
            .map_err(|e| format!("create {}: {e}", config.display()))?;
        let config_arg = config.display().to_string();
        let mut login = Command::new("docker")
            .args([
                "--config",
                &config_arg,
                "login",
                "--username",
                user,
                "--password-stdin",
            ])
            .arg(&registry.host)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run docker login: {e}"))?;
        if let Some(mut stdin) = login.stdin.take() {
            stdin
                .write_all(password.as_bytes())
                .map_err(|e| format!("docker login: {e}"))?;
        }
        let out = login
            .wait_with_output()
            .map_err(|e| format!("docker login: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "docker login {}: {}",
                registry.host,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        registry.docker_config = Some(config);
        Ok(registry)
    }

    /// The Docker client configuration (`config.json`, with this
    /// registry's `auths` entry) of a registry with a login.
    pub fn credentials_file(&self) -> Option<PathBuf> {
        self.docker_config.as_ref().map(|d| d.join("config.json"))
    }

    fn launch(login: Option<(&str, &str)>) -> Result<Registry, String> {
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
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {host}\n",
            dir.join("storage").display()
        );
        if let Some((user, password)) = login {
            let htpasswd = run("htpasswd", &["-Bbn", user, password]).map_err(|e| {
                format!("{e} (htpasswd comes with Debian's apache2-utils; scripts/ensure-registry.sh installs it)")
            })?;
            let path = dir.join("htpasswd");
            std::fs::write(&path, format!("{htpasswd}\n"))
                .map_err(|e| format!("write {}: {e}", path.display()))?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: corral-test\n    path: {}\n",
                path.display()
            ));
        }
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
            docker_config: None,
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

    /// Whether `GET /v2/` answers (200, or 401 asking for a login).
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
        reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.1 401")
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
        let pushed = match &self.docker_config {
            Some(config) => run(
                "docker",
                &["--config", &config.display().to_string(), "push", &name],
            ),
            None => run("docker", &["push", &name]),
        };
        let removed = run("docker", &["rmi", &name]);
        pushed?;
        removed?;
        Ok(name)
    }

    /// Pushes a new image made of `local` and one more layer of `bytes`
    /// random bytes (a layer no daemon holds, so a pull must download it),
    /// as `<repo>:<tag>`; the daemon keeps neither name nor that layer.
    pub fn push_unique(
        &self,
        local: &str,
        repo: &str,
        tag: &str,
        bytes: usize,
    ) -> Result<String, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let scratch = format!("corral-unique-{}-{nanos}", std::process::id());
        let file = self.dir.join(&scratch);
        let mut data = Vec::with_capacity(bytes);
        // xorshift: incompressible enough that the layer stays `bytes` big.
        let mut x = (nanos as u64) | 1;
        while data.len() < bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(&file, &data).map_err(|e| format!("write {}: {e}", file.display()))?;
        let local_name = format!("corral-test/{scratch}:unique");
        let made = run("docker", &["create", "--name", &scratch, local])
            .and_then(|_| {
                run(
                    "docker",
                    &[
                        "cp",
                        &file.display().to_string(),
                        &format!("{scratch}:/unique"),
                    ],
                )
            })
            .and_then(|_| run("docker", &["commit", &scratch, &local_name]));
        let _ = run("docker", &["rm", "-f", &scratch]);
        let _ = std::fs::remove_file(&file);
        made?;
        let pushed = self.push(&local_name, repo, tag);
        let _ = run("docker", &["rmi", &local_name]);
        pushed
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
        remove_images_of(&self.host);
    }
}

/// Removes every image named `host/...` from the daemon.
fn remove_images_of(host: &str) {
    let Ok(list) = run(
        "docker",
        &["images", "--format", "{{.Repository}}:{{.Tag}}"],
    ) else {
        return;
    };
    let prefix = format!("{host}/");
    let ours: Vec<&str> = list.lines().filter(|l| l.starts_with(&prefix)).collect();
    if !ours.is_empty() {
        let mut args = vec!["rmi", "-f"];
        args.extend(ours);
        let _ = run("docker", &args);
    }
}

/// A TCP relay in front of a registry (see the module comment): the
/// daemon pulls `relay.host/...` and the relay forwards to the registry,
/// until it is told to slow down or to die.
pub struct Relay {
    /// `127.0.0.1:PORT` of the relay: the host part of the images pulled
    /// through it.
    pub host: String,
    state: std::sync::Arc<RelayState>,
}

#[derive(Default)]
struct RelayState {
    /// Bytes relayed from the registry so far.
    relayed: std::sync::atomic::AtomicU64,
    /// Past this many relayed bytes the registry dies (0: never).
    die_after: std::sync::atomic::AtomicU64,
    dead: std::sync::atomic::AtomicBool,
    /// A pause after each chunk from the registry, in ms.
    delay_ms: std::sync::atomic::AtomicU64,
    /// Every connection's sockets, to cut them when the registry dies.
    open: std::sync::Mutex<Vec<TcpStream>>,
    stopped: std::sync::atomic::AtomicBool,
}

impl RelayState {
    fn die(&self) {
        use std::sync::atomic::Ordering;
        self.dead.store(true, Ordering::SeqCst);
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(|p| p.into_inner()));
        for s in open {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// How much of the registry's answer is relayed at a time.
const RELAY_CHUNK: usize = 16 * 1024;

impl Relay {
    /// A relay to `upstream` (`127.0.0.1:PORT`) on a free loopback port.
    pub fn start(upstream: &str) -> Result<Relay, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind the relay: {e}"))?;
        let host = listener
            .local_addr()
            .map_err(|e| format!("the relay's address: {e}"))?
            .to_string();
        let state = std::sync::Arc::new(RelayState::default());
        let upstream = upstream.to_string();
        let st = state.clone();
        std::thread::spawn(move || {
            use std::sync::atomic::Ordering;
            for client in listener.incoming() {
                if st.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if st.dead.load(Ordering::SeqCst) {
                    // A dead registry: the connection is closed at once.
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                {
                    let mut open = st.open.lock().unwrap_or_else(|p| p.into_inner());
                    for s in [&client, &server] {
                        if let Ok(s) = s.try_clone() {
                            open.push(s);
                        }
                    }
                }
                // Requests pass as they are.
                std::thread::spawn(move || {
                    let (mut from, mut to) = (c2, s2);
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
                // Answers are counted, slowed down, cut.
                let st = st.clone();
                std::thread::spawn(move || {
                    let (mut from, mut to) = (server, client);
                    let mut buf = vec![0u8; RELAY_CHUNK];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if st.dead.load(Ordering::SeqCst) {
                            break;
                        }
                        let total = st.relayed.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
                        let limit = st.die_after.load(Ordering::SeqCst);
                        if limit > 0 && total > limit {
                            st.die();
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let delay = st.delay_ms.load(Ordering::SeqCst);
                        if delay > 0 {
                            std::thread::sleep(Duration::from_millis(delay));
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Ok(Relay { host, state })
    }

    /// `relay.host/<repo>:<tag>`: the image of the registry behind, pulled
    /// through the relay.
    pub fn image(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host)
    }

    /// Pauses `ms` after each 16 KiB of the registry's answers.
    pub fn slow_down(&self, ms: u64) {
        self.state
            .delay_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// The registry dies once `bytes` more of its answers have been relayed:
    /// every connection is cut and new ones are closed at once.
    pub fn die_after(&self, bytes: u64) {
        use std::sync::atomic::Ordering;
        let now = self.state.relayed.load(Ordering::SeqCst);
        self.state.die_after.store(now + bytes, Ordering::SeqCst);
    }

    /// Whether the registry has died.
    pub fn is_dead(&self) -> bool {
        self.state.dead.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The registry comes back (answers relayed again, at full speed).
    pub fn revive(&self) {
        use std::sync::atomic::Ordering;
        self.state.die_after.store(0, Ordering::SeqCst);
        self.state.delay_ms.store(0, Ordering::SeqCst);
        self.state.dead.store(false, Ordering::SeqCst);
    }

    /// Removes every image pulled through the relay from the daemon.
    pub fn remove_pulled(&self) {
        remove_images_of(&self.host);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.die();
        // Wakes the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(&self.host);
        self.remove_pulled();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        self.remove_pulled();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
