//! The agent's control stream over TCP, for engines with no attach to PID
//! 1 (a Kubernetes pod reached over the pod network).
//!
//! Anything that can reach the port may connect, a command of the sandbox
//! itself first of all (on loopback), so a connection is served only after
//! the handshake of `corral_core::agent_auth` proved it holds the
//! sandbox's secret. Only an authenticated connection feeds the dead-man
//! switch; a stranger can neither keep an abandoned sandbox alive nor see
//! or send a single frame.
//!
//! One controller at a time: an authenticated connection takes over from
//! the one before it (corral reconnecting after its stream broke), whose
//! session ends first, exactly as a new Hello ends the old session on
//! stdin.
//!
//! Handshakes are bounded so that nothing can hold corral out:
//! - one deadline ([`HANDSHAKE_DEADLINE`]) for the whole handshake, not
//!   per read, so a peer dripping a byte at a time is closed at it;
//! - two budgets of [`MAX_PENDING`] handshakes: from inside the pod (a
//!   peer address that is any address of the pod's own interfaces,
//!   loopback included: its commands, whatever source they bind, and the
//!   kubelet's port-forward, which the runtime delivers from inside the
//!   pod's network namespace) and from outside it (corral on the pod
//!   network). Nothing inside can spend the outside budget, so a command
//!   cannot keep corral from reconnecting directly;
//! - a new connection to a full budget evicts that budget's oldest
//!   unauthenticated handshake (shut down: its thread ends at once)
//!   instead of being refused. A port-forwarded connection cannot be told
//!   from a command's by its address (both are loopback), and nothing else
//!   tells them apart before the client's proof, the last message of
//!   `agent_auth` (the agent speaks second): a slot kept for corral would
//!   have to be handed out before that proof, so a command could take it
//!   as easily. With eviction, idle connections a command holds cannot
//!   keep corral's port-forward out: its connection takes a slot at once
//!   and keeps it until [`MAX_PENDING`] newer ones arrive, far longer than
//!   a handshake's round trip. A command opening connections faster than
//!   that can still delay it, which only hurts its own sandbox's
//!   controller (and the dead-man switch ends an abandoned one).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use corral_core::agent_auth::{self, Secret, ANSWER_LEN, LEN, OPENING_LEN};

use crate::control::lock;
use crate::server::{Conn, Shared};
use crate::writer::FrameWriter;

/// Longest a connection may take to prove itself, whole handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// Handshakes in progress at once, per budget (inside, outside).
pub const MAX_PENDING: usize = 16;

/// Small stacks for the handshake and session threads.
const THREAD_STACK: usize = 256 * 1024;

/// Where the agent listens and what proves a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenOptions {
    /// TCP port, on every address of the sandbox.
    pub port: u16,
    /// The sandbox's secret.
    pub secret: Secret,
}

/// Reads the listening options from the agent's environment and removes
/// them from it, so no command inherits the secret. `Ok(None)`: serve
/// stdin. Must run before any thread exists (the environment is not
/// thread-safe).
pub fn take_from_env() -> Result<Option<ListenOptions>, String> {
    let port = std::env::var(agent_auth::LISTEN_ENV).ok();
    let secret = std::env::var(agent_auth::SECRET_ENV).ok();
    std::env::remove_var(agent_auth::LISTEN_ENV);
    std::env::remove_var(agent_auth::SECRET_ENV);
    let Some(port) = port else {
        return Ok(None);
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            format!(
                "invalid {} '{port}': expected a TCP port from 1 to 65535",
                agent_auth::LISTEN_ENV
            )
        })?;
    // Never listen without a secret: anyone on the pod network, and every
    // command of the sandbox, could drive the agent.
    let secret = secret.ok_or_else(|| {
        format!(
            "{} is set but {} is not: refusing to listen unauthenticated",
            agent_auth::LISTEN_ENV,
            agent_auth::SECRET_ENV
        )
    })?;
    let secret = Secret::from_hex(&secret)
        .map_err(|e| format!("invalid {}: {e}", agent_auth::SECRET_ENV))?;
    Ok(Some(ListenOptions { port, secret }))
}

/// Binds the port on every address (IPv6 with IPv4 mapped, else IPv4).
pub fn bind(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
}

/// The connection being served and a flag raised once its session ended.
struct Current {
    stream: TcpStream,
    done: Arc<Done>,
}

#[derive(Default)]
struct Done {
    flag: Mutex<bool>,
    changed: Condvar,
}

impl Done {
    fn set(&self) {
        *lock(&self.flag) = true;
        self.changed.notify_all();
    }

    fn wait(&self) {
        let mut done = lock(&self.flag);
        while !*done {
            done = self
                .changed
                .wait(done)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

struct Server {
    conn: Conn,
    writer: Arc<FrameWriter>,
    secret: Secret,
    current: Mutex<Option<Current>>,
    /// Handshakes in progress from inside the pod, and from outside, oldest
    /// first: an id and a handle to shut the connection down with.
    pending: Mutex<[VecDeque<(u64, TcpStream)>; 2]>,
}

/// Serves controllers connecting to `listener`; never returns unless the
/// listener fails.
pub fn serve(shared: Shared, listener: TcpListener, secret: Secret) -> io::Error {
    // Until the first controller: frames have nowhere to go.
    let sink = match std::fs::OpenOptions::new().write(true).open("/dev/null") {
        Ok(f) => f,
        Err(e) => return e,
    };
    let writer = Arc::new(FrameWriter::new(sink));
    let server = Arc::new(Server {
        conn: Conn::new(shared, writer.clone()),
        writer,
        secret,
        current: Mutex::new(None),
        pending: Mutex::new([VecDeque::new(), VecDeque::new()]),
    });
    let mut next_id: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if is_transient(&e) => continue,
            Err(e) => return e,
        };
        let budget = usize::from(!from_inside(&stream, peer.ip()));
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        next_id += 1;
        let id = next_id;
        server.admit(budget, id, handle);
        let s = server.clone();
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .stack_size(THREAD_STACK)
            .spawn(move || s.handle(stream, budget, id));
        if spawned.is_err() {
            server.settled(budget, id);
        }
    }
}

/// Whether a connection comes from inside the pod: its peer is loopback,
/// the address it was made to, or any address of the pod's interfaces (a
/// process of the pod may bind any of them as its source, whatever it
/// dials).
fn from_inside(stream: &TcpStream, peer: IpAddr) -> bool {
    is_inside(peer, stream.local_addr().ok().map(|l| l.ip()))
}

/// [`from_inside`] for a peer and the local address it dialled.
fn is_inside(peer: IpAddr, local: Option<IpAddr>) -> bool {
    let peer = peer.to_canonical();
    if peer.is_loopback() || local.is_some_and(|l| l.to_canonical() == peer) {
        return true;
    }
    match crate::sys::local_addresses() {
        Ok(addrs) => addrs.iter().any(|a| a.to_canonical() == peer),
        // Unknown: inside, so a command can never spend the budget the
        // controller's direct path relies on.
        Err(_) => true,
    }
}

/// Accept errors that concern one connection, not the listener.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::EPERM
        )
    ) || e.kind() == io::ErrorKind::Interrupted
}

impl Server {
    /// Counts a new handshake against `budget`; when that is full, its
    /// oldest handshake is shut down (its thread sees the end and leaves).
    fn admit(&self, budget: usize, id: u64, handle: TcpStream) {
        let mut pending = lock(&self.pending);
        let queue = &mut pending[budget];
        while queue.len() >= MAX_PENDING {
            if let Some((_, oldest)) = queue.pop_front() {
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        queue.push_back((id, handle));
    }

    /// Takes handshake `id` off its budget; false when it was evicted.
    fn settled(&self, budget: usize, id: u64) -> bool {
        let mut pending = lock(&self.pending);
        let queue = &mut pending[budget];
        match queue.iter().position(|(i, _)| *i == id) {
            Some(at) => {
                queue.remove(at);
                true
            }
            None => false,
        }
    }

    fn handle(&self, stream: TcpStream, budget: usize, id: u64) {
        let proved = handshake(&stream, &self.secret);
        if !self.settled(budget, id) {
            // Evicted (shut down) while it ran: whatever it proved, the
            // connection is gone.
            return;
        }
        match proved {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("corral-agent: refused a connection that failed the handshake");
                return;
            }
            // Timeouts, resets, strangers hanging up: nothing to say.
            Err(_) => return,
        }
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        let _ = stream.set_nodelay(true);
        let done = match self.take_over(&stream) {
            Ok(done) => done,
            Err(e) => {
                eprintln!("corral-agent: cannot serve a controller connection: {e}");
                return;
            }
        };
        self.conn.serve(stream);
        done.set();
    }

    /// Makes `stream` the controller's: ends the session of the connection
    /// before it (waiting until its commands are gone) and points the
    /// writer at `stream`.
    fn take_over(&self, stream: &TcpStream) -> io::Result<Arc<Done>> {
        let mut current = lock(&self.current);
        if let Some(old) = current.take() {
            let _ = old.stream.shutdown(Shutdown::Both);
            old.done.wait();
        }
        let out = stream.try_clone()?;
        let keep = stream.try_clone()?;
        self.writer
            .replace_output(std::fs::File::from(OwnedFd::from(out)));
        let done = Arc::new(Done::default());
        *current = Some(Current {
            stream: keep,
            done: done.clone(),
        });
        Ok(done)
    }
}

/// Runs the agent's side of the handshake on `stream`: true when the peer
/// proved it holds `secret`, all within one [`HANDSHAKE_DEADLINE`].
fn handshake(stream: &TcpStream, secret: &Secret) -> io::Result<bool> {
    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
    let mut opening = [0u8; OPENING_LEN];
    read_by(stream, &mut opening, deadline)?;
    let Some(client) = agent_auth::parse_opening(&opening) else {
        return Ok(false);
    };
    let agent = random_nonce()?;
    let mut answer = [0u8; ANSWER_LEN];
    answer[..LEN].copy_from_slice(&agent);
    answer[LEN..].copy_from_slice(&secret.agent_proof(&client, &agent));
    write_by(stream, &answer, deadline)?;
    let mut proof = [0u8; LEN];
    read_by(stream, &mut proof, deadline)?;
    Ok(secret.check_client(&client, &agent, &proof))
}

/// Time left until `deadline`, or a timeout error when none is.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "handshake deadline passed",
        ));
    }
    Ok(left)
}

/// Fills `buf` from `stream`, each read bounded by what is left until
/// `deadline` (a per-read timeout alone would let a byte at a time keep a
/// handshake open for ever).
fn read_by(mut stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` to `stream` by `deadline`.
fn write_by(mut stream: &TcpStream, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(&buf[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// 32 bytes from the kernel's generator.
fn random_nonce() -> io::Result<[u8; LEN]> {
    let mut out = [0u8; LEN];
    let mut filled = 0;
    while filled < LEN {
        // SAFETY: the pointer and length describe the unfilled tail of
        // `out`, which outlives the call.
        let n = unsafe { libc::getrandom(out[filled..].as_mut_ptr().cast(), LEN - filled, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_of_this_host_is_inside() {
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let own: Vec<IpAddr> = crate::sys::local_addresses()
            .expect("getifaddrs")
            .into_iter()
            .filter(|a| !a.is_loopback())
            .collect();
        assert!(!own.is_empty(), "this test needs a non-loopback interface");
        for a in own {
            // A process binding its own address as the source and dialling
            // loopback: neither end is loopback and they differ.
            assert!(is_inside(a, Some(loopback)), "{a} dialling {loopback}");
            let mapped = match a {
                IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
                v6 => v6,
            };
            assert!(is_inside(mapped, None), "{mapped}");
        }
        assert!(is_inside(loopback, None));
        assert!(is_inside("::1".parse().expect("ip"), None));
        // TEST-NET-3: never an address of this host.
        let stranger: IpAddr = [203, 0, 113, 7].into();
        assert!(!is_inside(stranger, Some(loopback)));
        assert!(!is_inside(stranger, None));
    }

    #[test]
    fn nonces_are_fresh() {
        let a = random_nonce().expect("getrandom");
        let b = random_nonce().expect("getrandom");
        assert_ne!(a, b);
    }
}
