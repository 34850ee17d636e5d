//! "The internet" of the egress tests and benchmarks (Docker's and
//! Kubernetes'), made on this machine: two servers (`pypi.test`, which is
//! also `mirror.test`, and `evil.test`) in containers on a network of
//! their own, serving HTTP on 80 and HTTPS on 443 and 8443 with a test CA
//! made for this run, a package index with one tiny wheel, a git
//! repository over HTTPS, `/big` (32 MiB) and a UDP echo on 53 and 443;
//! and `corral-test/net` with the test CA trusted (`Internet::image`).
//! [`Internet::join`] puts the servers on another network too, under the
//! same names (a local cluster's pod network). Torn down when the process
//! exits. Needs the `docker` CLI, `openssl` and a daemon.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// One internet per test binary.
pub struct Internet {
    /// The prefix of everything it made (`corral-egtest-<pid>`).
    pub tag: String,
    /// The servers' own network, whose resolver knows their names.
    pub network: String,
    /// `corral-test/net` with the test CA trusted.
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

static INTERNET: OnceLock<Internet> = OnceLock::new();
/// Docker sandboxes whose containers, gateways and networks the teardown
/// removes (a test that fails leaves nothing).
pub static SANDBOXES: Mutex<Vec<String>> = Mutex::new(Vec::new());

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

/// Runs `cmd`, asserting it succeeds; its stdout, trimmed.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `docker ARGS`, asserting it succeeds; its stdout, trimmed.
pub fn docker(args: &[&str]) -> String {
    run(Command::new("docker").args(args))
}

/// Removes a Docker sandbox's container, gateway and egress network.
pub fn remove_sandbox(id: &str) {
    let _ = Command::new("docker")
        .args(["rm", "-f", &format!("corral-{id}")])
        .output();
    let _ = Command::new("docker")
        .args(["rm", "-f", &format!("corral-egress-gw-{id}")])
        .output();
    let _ = Command::new("docker")
        .args(["network", "rm", &format!("corral-egress-{id}")])
        .output();
}

extern "C" fn tear_down() {
    let ids: Vec<String> = SANDBOXES.lock().map(|s| s.clone()).unwrap_or_default();
    for id in ids {
        remove_sandbox(&id);
    }
    if let Some(net) = INTERNET.get() {
        let _ = Command::new("docker")
            .args([
                "rm",
                "-f",
                &format!("{}-pypi", net.tag),
                &format!("{}-evil", net.tag),
            ])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &net.network])
            .output();
        let _ = Command::new("docker")
            .args(["rmi", "-f", &net.image])
            .output();
        let _ = std::fs::remove_dir_all(&net.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").current_dir(dir).args(args));
}

/// The internet, made on first use.
pub fn internet() -> &'static Internet {
    INTERNET.get_or_init(|| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/build-test-images.sh"
        );
        run(Command::new("bash").args([script, "--net"]));
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe { libc::atexit(tear_down) };
        let tag = format!("corral-egtest-{}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir).expect("temp dir");
        openssl(
            &dir,
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
        );
        openssl(
            &dir,
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
        );
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=DNS:pypi.test,DNS:mirror.test,DNS:evil.test\n",
        )
        .expect("write san");
        openssl(
            &dir,
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
        );
        std::fs::write(dir.join("serve.py"), SERVER).expect("write server");
        std::fs::write(
            dir.join("Dockerfile"),
            "FROM corral-test/net\nCOPY ca.crt /usr/local/share/ca-certificates/corral-test.crt\n\
             RUN update-ca-certificates >/dev/null\n\
             COPY serve.py server.crt server.key /certs/\n",
        )
        .expect("write Dockerfile");
        let image = format!("{tag}-image");
        docker(&[
            "build",
            "-q",
            "-t",
            &image,
            dir.to_str().expect("utf-8 path"),
        ]);
        let network = format!("{tag}-inet");
        docker(&["network", "create", "--label", "corral.egtest=1", &network]);
        let server = |who: &str, aliases: &[&str]| {
            let name = format!("{tag}-{who}");
            let mut args = vec![
                "run",
                "-d",
                "--name",
                &name,
                "--label",
                "corral.egtest=1",
                "--network",
                &network,
            ];
            for a in aliases {
                args.extend(["--network-alias", a]);
            }
            args.extend([image.as_str(), "python3", "/certs/serve.py", who]);
            docker(&args);
            docker(&[
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &name,
            ])
        };
        let pypi_ip = server("pypi", &["pypi.test", "mirror.test"]);
        let evil_ip = server("evil", &["evil.test"]);
        Internet {
            tag,
            network,
            image,
            evil_ip,
            pypi_ip,
            dir,
        }
    })
}

impl Internet {
    /// Connects the servers to `network` too, under the same names (its
    /// embedded resolver answers them there); their addresses on it.
    /// Joining twice is fine.
    pub fn join(&self, network: &str) -> Joined {
        let server = |who: &str, aliases: &[&str]| {
            let name = format!("{}-{who}", self.tag);
            let mut args = vec!["network", "connect"];
            for a in aliases {
                args.extend(["--alias", a]);
            }
            args.extend([network, name.as_str()]);
            let out = Command::new("docker").args(&args).output().expect("docker");
            let text = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || text.contains("already exists"),
                "connect {name} to {network}: {text}"
            );
            docker(&[
                "inspect",
                "-f",
                &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
                &name,
            ])
        };
        Joined {
            pypi_ip: server("pypi", &["pypi.test", "mirror.test"]),
            evil_ip: server("evil", &["evil.test"]),
        }
    }
}
