//! `corral-agent attach`: the relay between `docker exec -i` and the agent.
//!
//! corral cannot reach an abstract socket inside the container's network
//! namespace, but it can run a process there with attached stdin/stdout.
//! This relay connects to the agent's socket and copies bytes both ways,
//! unchanged: the framing is end to end between corral and the agent.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use corral_core::protocol::AGENT_SOCKET;

use crate::sys;

/// The agent may still be starting when corral attaches.
const CONNECT_FOR: Duration = Duration::from_secs(5);
const CONNECT_RETRY: Duration = Duration::from_millis(5);
const CHUNK: usize = 64 * 1024;

/// Runs the relay; returns the process exit code.
pub fn run() -> i32 {
    // The agent forwards signals to every process in the sandbox, this relay
    // included. It must not die of them: it carries the very connection on
    // which the client learns how its commands ended. It exits when the
    // agent or the client closes instead.
    for sig in sys::FORWARDED {
        sys::ignore_signal(sig);
    }
    let sock = match connect() {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "corral-agent attach: cannot connect to the agent at abstract socket @{AGENT_SOCKET} within {} s: {e} (is `corral-agent init` running as PID 1?)",
                CONNECT_FOR.as_secs()
            );
            return 1;
        }
    };
    let Ok(to_agent) = sock.try_clone() else {
        eprintln!("corral-agent attach: cannot duplicate the agent socket");
        return 1;
    };
    let upstream = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || copy_stdin(to_agent));
    if let Err(e) = upstream {
        eprintln!("corral-agent attach: cannot start the stdin thread: {e}");
        return 1;
    }
    copy_to_stdout(sock)
}

fn connect() -> io::Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(AGENT_SOCKET.as_bytes())?;
    let until = Instant::now() + CONNECT_FOR;
    loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => std::thread::sleep(CONNECT_RETRY),
        }
    }
}

/// stdin -> agent. On EOF, half-closes so the agent sees the client leave
/// while its last answers still flow back; on a read or write error the
/// relay is useless and exits.
fn copy_stdin(mut sock: UnixStream) {
    let mut stdin = io::stdin().lock();
    let mut buf = vec![0u8; CHUNK];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => {
                let _ = sock.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if sock.write_all(&buf[..n]).is_err() {
                    std::process::exit(0);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::process::exit(0),
        }
    }
}

/// agent -> stdout, until the agent closes. Flushed per chunk: frames must
/// not sit in a buffer while the client waits for them.
fn copy_to_stdout(mut sock: UnixStream) -> i32 {
    let mut stdout = io::stdout().lock();
    let mut buf = vec![0u8; CHUNK];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return 0,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return 0;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return 0,
        }
    }
}
