//! "The internet" of corral's egress tests and network benchmarks, made on
//! the local Docker daemon, no registry needed: two servers (`pypi.test`,
//! which is also `mirror.test`, and `evil.test`) in containers on a
//! network of their own, serving HTTP on 80 and HTTPS on 443 and 8443 with
//! a CA made for this internet, a package index with one tiny wheel, a git
//! repository over HTTPS, an apt repository, `/big` (32 MiB) and a UDP echo
//! on 53 and 443. [`Internet::image`] is the base image (`corral-test/net`,
//! `scripts/build-test-images.sh --net`) with the CA trusted, for clients.
//!
//! A product crate, not a test one: `corral bench --rows net` measures
//! against it, and the egress tests (`corral_testing::internet`), the
//! cargo bench and the Python tests (through the `corral-internet`
//! binary) use the same code. It needs the `docker` CLI and `openssl` on
//! the host; it never panics on what they answer, and
//! [`Internet::tear_down`] removes everything it made (containers,
//! network, image, files), all labelled `corral.egtest=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The label on everything an internet makes (for a sweep by hand).
pub const LABEL: &str = "corral.egtest=1";

/// The base image an internet's servers and client image are built from.
pub const BASE_IMAGE: &str = "corral-test/net";

/// Making or using an internet failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command (docker, openssl) could not be run at all.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not be started (e.g. not installed).
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("{command} failed: {output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// A file of the internet's could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One internet: its servers, network, client image and files.
#[derive(Debug, Clone)]
pub struct Internet {
    /// The prefix of everything it made (e.g. `corral-egtest-<pid>`).
    pub tag: String,
    /// The servers' own network, whose resolver knows their names.
    pub network: String,
    /// [`BASE_IMAGE`] with the CA trusted.
    pub image: String,
    /// `evil.test`'s address on [`Internet::network`].
    pub evil_ip: String,
    /// `pypi.test`'s (and `mirror.test`'s) address there.
    pub pypi_ip: String,
    /// The CA, certificates and server script.
    pub dir: PathBuf,
}

/// The servers' addresses on a network they joined ([`Internet::join`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// `pypi.test`'s (and `mirror.test`'s).
    pub pypi_ip: String,
    /// `evil.test`'s.
    pub evil_ip: String,
}

const SERVER: &str = r#"
import base64, hashlib, http.server, io, os, ssl, subprocess, sys, threading, zipfile
name = sys.argv[1]
os.makedirs("/srv/www", exist_ok=True)
def wheel():
    files = {"tinypkg/__init__.py": b"GREETING = 'tinypkg from the local index'\n",
             "tinypkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
             "tinypkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for p, b in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
        record += f"{p},sha256={h},{len(b)}\n"
    record += "tinypkg-0.1.dist-info/RECORD,,\n"
    files["tinypkg-0.1.dist-info/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
    return buf.getvalue()
WHEEL = wheel()
BIG = os.urandom(32 << 20)
subprocess.run("set -e; git init -q /srv/work; cd /srv/work; echo cloned-from-the-test-host > README; "
               "git -c user.name=t -c user.email=t@t add README; git -c user.name=t -c user.email=t@t commit -qm init; "
               "git clone -q --bare /srv/work /srv/www/repo.git; git -C /srv/www/repo.git update-server-info",
               shell=True, check=True)
subprocess.run("set -e; mkdir -p /srv/deb/tinydeb/DEBIAN /srv/deb/tinydeb/usr/share/tinydeb /srv/www/debian; "
               "printf 'Package: tinydeb\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: test\\n' > /srv/deb/tinydeb/DEBIAN/control; "
               "echo installed-by-apt > /srv/deb/tinydeb/usr/share/tinydeb/marker; "
               "dpkg-deb -Zgzip --build /srv/deb/tinydeb /srv/www/debian/tinydeb_1.0_all.deb >/dev/null",
               shell=True, check=True)
deb = open("/srv/www/debian/tinydeb_1.0_all.deb", "rb").read()
with open("/srv/deb/tinydeb/DEBIAN/control") as f:
    control = f.read()
packages = control + f"Filename: ./tinydeb_1.0_all.deb\nSize: {len(deb)}\nSHA256: {hashlib.sha256(deb).hexdigest()}\n\n"
open("/srv/www/debian/Packages", "w").write(packages)
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory="/srv/www", **k)
    def log_message(self, *a):
        pass
    def send_body(self, body, ctype="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        host = self.headers.get("Host", "")
        if self.path.startswith("/simple/tinypkg"):
            self.send_body(b'<html><body><a href="/files/tinypkg-0.1-py3-none-any.whl">tinypkg-0.1-py3-none-any.whl</a></body></html>', "text/html")
        elif self.path == "/files/tinypkg-0.1-py3-none-any.whl":
            self.send_body(WHEEL, "application/octet-stream")
        elif self.path == "/big":
            self.send_body(BIG, "application/octet-stream")
        elif self.path.startswith("/repo.git") or self.path.startswith("/debian/"):
            super().do_GET()
        else:
            self.send_body(f"hello from {name} (Host {host})\n".encode())
http.server.ThreadingHTTPServer.daemon_threads = True
def serve(port, tls):
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain("/certs/server.crt", "/certs/server.key")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()
import socket
def udp_echo(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
    while True:
        data, peer = u.recvfrom(2048); u.sendto(b"echo:" + data[:16], peer)
for port in (53, 443):
    threading.Thread(target=udp_echo, args=(port,), daemon=True).start()
for port, tls in [(443, True), (8443, True)]:
    threading.Thread(target=serve, args=(port, tls), daemon=True).start()
serve(80, False)
"#;

/// Runs `cmd`; its stdout, trimmed, or why it failed.
pub fn run(cmd: &mut Command) -> Result<String, Error> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| Error::Spawn {
        command: command.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            command,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .trim()
            .to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `docker ARGS`; its stdout, trimmed.
pub fn docker(args: &[&str]) -> Result<String, Error> {
    run(Command::new("docker").args(args))
}

/// Removes a Docker sandbox's container, gateway and egress network by
/// name, whatever is left of them (for a test's guard).
pub fn remove_sandbox(id: &str) {
    let _ = docker(&["rm", "-f", &format!("corral-{id}")]);
    let _ = docker(&["rm", "-f", &format!("corral-egress-gw-{id}")]);
    let _ = docker(&["network", "rm", &format!("corral-egress-{id}")]);
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), Error> {
    run(Command::new("openssl").current_dir(dir).args(args)).map(drop)
}

fn write(path: PathBuf, text: &str) -> Result<(), Error> {
    std::fs::write(&path, text).map_err(|source| Error::Write { path, source })
}

impl Internet {
    /// Makes an internet whose every name starts with `tag`, from
    /// [`BASE_IMAGE`] (which must be on the daemon). What it made before
    /// failing is removed.
    pub fn start(tag: &str) -> Result<Internet, Error> {
        let net = Internet::named(tag);
        match net.clone().make() {
            Ok(net) => Ok(net),
            Err(e) => {
                net.tear_down();
                Err(e)
            }
        }
    }

    /// The names an internet of `tag` has, without making anything (to
    /// tear one down that another process made).
    pub fn named(tag: &str) -> Internet {
        Internet {
            tag: tag.to_string(),
            network: format!("{tag}-inet"),
            image: format!("{tag}-image"),
            evil_ip: String::new(),
            pypi_ip: String::new(),
            dir: std::env::temp_dir().join(tag),
        }
    }

    /// What a client of another process needs to know, as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tag": self.tag,
            "network": self.network,
            "image": self.image,
            "pypi_ip": self.pypi_ip,
            "evil_ip": self.evil_ip,
        })
    }

    fn make(mut self) -> Result<Internet, Error> {
        docker(&["image", "inspect", "-f", "{{.Id}}", BASE_IMAGE]).map_err(|e| Error::Failed {
            command: format!("docker image inspect {BASE_IMAGE}"),
            output: format!("{e} (build it with scripts/build-test-images.sh --net)"),
        })?;
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.clone(),
            source,
        })?;
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=corral test CA",
            ],
        )?;
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=pypi.test",
            ],
        )?;
        write(
            dir.join("san.ext"),
            "subjectAltName=DNS:pypi.test,DNS:mirror.test,DNS:evil.test\n",
        )?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        )?;
        write(dir.join("serve.py"), SERVER)?;
        write(
            dir.join("Dockerfile"),
            &format!(
                "FROM {BASE_IMAGE}\nCOPY ca.crt /usr/local/share/ca-certificates/corral-test.crt\n\
                 RUN update-ca-certificates >/dev/null\n\
                 COPY serve.py server.crt server.key /certs/\n"
            ),
        )?;
        docker(&[
            "build",
            "-q",
            "--label",
            LABEL,
            "-t",
            &self.image,
            &dir.to_string_lossy(),
        ])?;
        docker(&["network", "create", "--label", LABEL, &self.network])?;
        self.pypi_ip = self.server("pypi", &["pypi.test", "mirror.test"])?;
        self.evil_ip = self.server("evil", &["evil.test"])?;
        Ok(self)
    }

    fn server(&self, who: &str, aliases: &[&str]) -> Result<String, Error> {
        let name = format!("{}-{who}", self.tag);
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            LABEL,
            "--network",
            &self.network,
        ];
        for a in aliases {
            args.extend(["--network-alias", a]);
        }
        args.extend([self.image.as_str(), "python3", "/certs/serve.py", who]);
        docker(&args)?;
        docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &name,
        ])
    }

    /// Connects the servers to `network` too, under the same names (its
    /// embedded resolver answers them there); their addresses on it.
    /// Joining twice is fine.
    pub fn join(&self, network: &str) -> Result<Joined, Error> {
        let server = |who: &str, aliases: &[&str]| {
            let name = format!("{}-{who}", self.tag);
            let mut args = vec!["network", "connect"];
            for a in aliases {
                args.extend(["--alias", a]);
            }
            args.extend([network, name.as_str()]);
            match docker(&args) {
                Ok(_) => {}
                Err(Error::Failed { output, .. }) if output.contains("already exists") => {}
                Err(e) => return Err(e),
            }
            docker(&[
                "inspect",
                "-f",
                &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
                &name,
            ])
        };
        Ok(Joined {
            pypi_ip: server("pypi", &["pypi.test", "mirror.test"])?,
            evil_ip: server("evil", &["evil.test"])?,
        })
    }

    /// Removes the servers, their network, the client image and the files;
    /// whatever of them exists (so it also cleans up after a failed start).
    pub fn tear_down(&self) {
        let _ = docker(&[
            "rm",
            "-f",
            &format!("{}-pypi", self.tag),
            &format!("{}-evil", self.tag),
        ]);
        let _ = docker(&["network", "rm", &self.network]);
        let _ = docker(&["rmi", "-f", &self.image]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
