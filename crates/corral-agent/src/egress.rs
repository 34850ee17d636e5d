//! The egress gateway (`corral-agent egress-gateway`): the one way out of
//! a sandbox with an egress policy.
//!
//! It runs as PID 1 of a `FROM scratch` gateway container on the sandbox's
//! internal network (no route out) and on an outside network. It answers
//! DNS (UDP 53) with its own address for allowed names and NXDOMAIN for the
//! rest, and accepts TCP on 80, 443 and every port a rule names. Each
//! connection's first bytes give the name (TLS SNI or HTTP `Host`, never
//! terminated); an allowed name is looked up upstream, its addresses are
//! checked against the CIDR rules, and the bytes are relayed unchanged.
//! Anything else is refused at once: an HTTP 403 or a TLS alert naming
//! nothing of the upstream. Counts go to `/egress-stats.json` (or the file
//! `CORRAL_EGRESS_STATS` names: a pod's root is read-only, so there it is
//! on an `emptyDir`), read by `corral-agent egress-stats` through `docker
//! exec` or the API server's exec.
//!
//! Threads, blocking IO: one per connection direction, which is fine at a
//! sandbox's scale and keeps the static binary free of a runtime. A client
//! holds at most [`MAX_HANDSHAKES`] connections that have not yet named
//! their destination; past that its oldest is closed, so connections
//! opened and left silent cannot take every thread the gateway may start
//! (its pids limit) and starve the sandbox's own next request.

mod dns;
mod sniff;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_core::egress::{EgressPolicy, Rules};

use sniff::Sniffed;

/// The environment variable holding the policy (JSON).
pub const POLICY_ENV: &str = "CORRAL_EGRESS_POLICY";
/// Where the counts are written by default.
pub const STATS_PATH: &str = "/egress-stats.json";
/// The environment variable naming another file for the counts.
pub const STATS_ENV: &str = "CORRAL_EGRESS_STATS";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections one client may hold before they name their destination.
pub const MAX_HANDSHAKES: usize = 64;

/// The connections still in their handshake (before the name is known),
/// oldest first, per client address.
#[derive(Default)]
struct Handshakes {
    pending: Mutex<HashMap<IpAddr, VecDeque<(u64, TcpStream)>>>,
    next: AtomicU64,
}

/// A connection's place among its client's handshakes, given up on drop.
struct Handshake<'a> {
    all: &'a Handshakes,
    client: IpAddr,
    id: u64,
}

impl Handshakes {
    /// Counts `conn` among its client's handshakes, closing the oldest when
    /// there are more than [`MAX_HANDSHAKES`] (its thread then sees the end
    /// of its stream and goes).
    fn enter(&self, conn: &TcpStream) -> Option<Handshake<'_>> {
        let client = conn.peer_addr().ok()?.ip();
        let handle = conn.try_clone().ok()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let queue = pending.entry(client).or_default();
        queue.push_back((id, handle));
        while queue.len() > MAX_HANDSHAKES {
            if let Some((_, oldest)) = queue.pop_front() {
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        Some(Handshake {
            all: self,
            client,
            id,
        })
    }
}

impl Drop for Handshake<'_> {
    fn drop(&mut self) {
        let mut pending = self.all.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = pending.get_mut(&self.client) {
            queue.retain(|(id, _)| *id != self.id);
            if queue.is_empty() {
                pending.remove(&self.client);
            }
        }
    }
}

#[derive(Default)]
struct Stats {
    dns_allowed: AtomicU64,
    dns_refused: AtomicU64,
    connections_allowed: AtomicU64,
    connections_refused: AtomicU64,
    recent: Mutex<Vec<String>>,
}

struct Gateway {
    rules: Rules,
    upstream: Vec<SocketAddr>,
    stats: Stats,
    stats_path: String,
    handshakes: Handshakes,
}

/// The file the counts go to: [`STATS_ENV`]'s, else [`STATS_PATH`].
fn stats_path() -> String {
    std::env::var(STATS_ENV)
        .ok()
        .filter(|p| p.starts_with('/'))
        .unwrap_or_else(|| STATS_PATH.to_string())
}

impl Gateway {
    fn refused(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        eprintln!("corral-egress: refused {what}");
        if let Ok(mut r) = self.stats.recent.lock() {
            r.push(what);
            let excess = r.len().saturating_sub(32);
            r.drain(..excess);
        }
        self.save();
    }

    fn save(&self) {
        let s = &self.stats;
        let recent = s.recent.lock().map(|r| r.clone()).unwrap_or_default();
        let json = serde_json::json!({
            "dns_allowed": s.dns_allowed.load(Ordering::Relaxed),
            "dns_refused": s.dns_refused.load(Ordering::Relaxed),
            "connections_allowed": s.connections_allowed.load(Ordering::Relaxed),
            "connections_refused": s.connections_refused.load(Ordering::Relaxed),
            "recent_refusals": recent,
        });
        let tmp = format!("{}.{:?}", self.stats_path, std::thread::current().id());
        if std::fs::write(&tmp, json.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, &self.stats_path);
        }
    }
}

/// Prints the gateway's counts (for `docker exec`).
pub fn stats() -> i32 {
    match std::fs::read_to_string(stats_path()) {
        Ok(s) => {
            println!("{s}");
            0
        }
        Err(_) => {
            println!(
                "{{\"dns_allowed\":0,\"dns_refused\":0,\"connections_allowed\":0,\"connections_refused\":0,\"recent_refusals\":[]}}"
            );
            0
        }
    }
}

/// Runs the gateway until killed.
pub fn run() -> i32 {
    let policy: EgressPolicy = match std::env::var(POLICY_ENV)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("corral-egress: {POLICY_ENV} holds no egress policy: {e}");
            return 2;
        }
    };
    let rules = match policy.rules() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("corral-egress: {e}");
            return 2;
        }
    };
    let gw = Arc::new(Gateway {
        rules,
        upstream: dns::nameservers(),
        stats: Stats::default(),
        stats_path: stats_path(),
        handshakes: Handshakes::default(),
    });
    // Counts that cannot be written would read as zeros: refuse to run.
    let probe = format!("{}.start", gw.stats_path);
    if let Err(e) = std::fs::write(&probe, b"") {
        eprintln!(
            "corral-egress: cannot write the counts next to {} ({e}); set {STATS_ENV} to a \
             writable file",
            gw.stats_path
        );
        return 1;
    }
    let _ = std::fs::remove_file(&probe);
    gw.save();
    for port in policy.ports() {
        let listener = match TcpListener::bind(("0.0.0.0", port)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("corral-egress: cannot listen on port {port}: {e}");
                return 1;
            }
        };
        let gw = gw.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let gw = gw.clone();
                // Out of threads (the gateway's pids limit): this
                // connection is dropped, the gateway keeps serving.
                let _ = std::thread::Builder::new().spawn(move || relay(&gw, conn, port));
            }
        });
    }
    let sock = match UdpSocket::bind("0.0.0.0:53") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("corral-egress: cannot listen on udp 53: {e}");
            return 1;
        }
    };
    // What it runs as, for whoever reads its log (and the tests that
    // check a pod's hardening took).
    eprintln!(
        "corral-egress: ready, ports {:?}, {}",
        policy.ports(),
        credentials()
    );
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if let Some(reply) = answer_dns(&gw, &buf[..n], peer) {
            let _ = sock.send_to(&reply, peer);
        }
    }
}

/// `uid U, CapEff X, root ro|rw`: the process's user, effective
/// capabilities and whether its root is mounted read-only.
fn credentials() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .and_then(|l| l.split_whitespace().nth(5))
        .map_or("?", |o| {
            if o.split(',').any(|f| f == "ro") {
                "ro"
            } else {
                "rw"
            }
        });
    format!(
        "uid {}, CapEff {}, root {root}",
        field("Uid:"),
        field("CapEff:")
    )
}

/// The gateway's own address as seen from `peer` (the kernel's route choice).
fn facing(peer: SocketAddr) -> Option<Ipv4Addr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect(peer).ok()?;
    match s.local_addr().ok()?.ip() {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

fn answer_dns(gw: &Gateway, msg: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
    let q = dns::parse_query(msg)?;
    if !gw.rules.name_allowed(&q.name) {
        gw.refused(&gw.stats.dns_refused, format!("dns {}", q.name));
        return Some(dns::answer(&q, None, true));
    }
    gw.stats.dns_allowed.fetch_add(1, Ordering::Relaxed);
    // Only A: no AAAA (no IPv6 path), nothing else (no TXT to tunnel through).
    let addr = if q.qtype == dns::TYPE_A {
        facing(peer)
    } else {
        None
    };
    Some(dns::answer(&q, addr, false))
}

fn refuse(gw: &Gateway, mut conn: TcpStream, tls: bool, port: u16, why: String) {
    gw.refused(&gw.stats.connections_refused, format!("port {port}: {why}"));
    if tls {
        // A fatal access_denied alert.
        let _ = conn.write_all(&[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 49]);
    } else {
        let body = format!("corral egress: {why}\n");
        let _ = write!(
            conn,
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let _ = conn.shutdown(Shutdown::Both);
}

fn relay(gw: &Gateway, mut conn: TcpStream, port: u16) {
    let _ = conn.set_read_timeout(Some(SNIFF_TIMEOUT));
    let handshake = gw.handshakes.enter(&conn);
    let mut prefix = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let sniffed = loop {
        match sniff::sniff(&prefix) {
            Sniffed::More if prefix.len() < sniff::MAX_PREFIX => {}
            Sniffed::More => break Sniffed::Unknown("no name in the first bytes"),
            other => break other,
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => prefix.extend_from_slice(&chunk[..n]),
        }
    };
    drop(handshake);
    let tls = prefix.first() == Some(&0x16);
    let name = match sniffed {
        Sniffed::Tls(n) | Sniffed::Http(n) => n,
        Sniffed::Unknown(why) => return refuse(gw, conn, tls, port, why.to_string()),
        Sniffed::More => return,
    };
    if !gw.rules.connect_allowed(&name, port) {
        return refuse(
            gw,
            conn,
            tls,
            port,
            format!("{name}:{port} is not allowed by this sandbox's egress policy"),
        );
    }
    let addrs = match dns::resolve(&name, &gw.upstream) {
        Ok(a) => a,
        Err(e) => {
            return refuse(
                gw,
                conn,
                tls,
                port,
                format!("{name} does not resolve upstream: {e}"),
            )
        }
    };
    let usable: Vec<Ipv4Addr> = addrs
        .into_iter()
        .filter(|a| {
            !(a.is_loopback() || a.is_unspecified() || a.is_multicast() || a.is_broadcast())
                && gw.rules.address_allowed(IpAddr::V4(*a), port)
        })
        .collect();
    let Some(upstream) = usable.iter().find_map(|a| {
        TcpStream::connect_timeout(&SocketAddr::from((*a, port)), CONNECT_TIMEOUT).ok()
    }) else {
        return refuse(
            gw,
            conn,
            tls,
            port,
            if usable.is_empty() {
                format!("{name} resolves to no address this sandbox may reach")
            } else {
                format!("{name}:{port} does not answer")
            },
        );
    };
    gw.stats.connections_allowed.fetch_add(1, Ordering::Relaxed);
    gw.save();
    let _ = conn.set_read_timeout(None);
    let _ = conn.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut up = upstream;
    if up.write_all(&prefix).is_err() {
        return;
    }
    let (Ok(mut up_r), Ok(mut conn_w)) = (up.try_clone(), conn.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new().spawn(move || {
        pipe(&mut up_r, &mut conn_w);
        let _ = conn_w.shutdown(Shutdown::Write);
    });
    let Ok(back) = back else {
        return;
    };
    pipe(&mut conn, &mut up);
    let _ = up.shutdown(Shutdown::Write);
    let _ = back.join();
}

/// Copies until EOF or an error, in large chunks (std's copy uses 8 KiB,
/// which costs a third of the throughput of bulk downloads).
fn pipe(from: &mut TcpStream, to: &mut TcpStream) {
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
