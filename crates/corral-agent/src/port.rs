//! `corral-agent port PORT`: one connection to a server listening on
//! PORT inside the sandbox (its loopback: `127.0.0.1`, then `::1`), relayed
//! over the tool's stdin and stdout. corral runs it through the engine's
//! exec (which shares the sandbox's network namespace) to reach a port of
//! a sandbox that has no address of its own (`network: none`): the
//! sandbox gains no way out, since nothing but this one connection to its
//! own loopback is made. Exit 0 when both directions are done, 1 when
//! nothing listens (the reason on stderr), 2 for a usage error.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// How long the connection to the sandbox's own server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Parses PORT (1 to 65535).
pub fn parse(rest: &[String]) -> Result<u16, String> {
    match rest {
        [port] => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port: '{port}' is not a port (1 to 65535)")),
        _ => Err("port takes one PORT".to_string()),
    }
}

/// Relays until both directions end; the exit code.
pub fn run(port: u16) -> i32 {
    let targets = [
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
    ];
    let mut last = String::new();
    let stream =
        targets.iter().find_map(
            |addr| match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
                Ok(s) => Some(s),
                Err(e) => {
                    last = format!("{addr}: {e}");
                    None
                }
            },
        );
    let Some(stream) = stream else {
        eprintln!(
            "corral-agent port: nothing accepts connections on port {port} in the sandbox ({last})"
        );
        return 1;
    };
    let _ = stream.set_nodelay(true);
    let Ok(mut upstream) = stream.try_clone() else {
        eprintln!("corral-agent port: cannot share the connection");
        return 1;
    };
    // stdin → the server; its EOF half-closes the connection.
    let to_server = std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if upstream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = upstream.shutdown(Shutdown::Write);
    });
    // The server → stdout, flushed as it comes.
    let mut downstream = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match downstream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(stdout);
    // The server closed: stop reading stdin too (the caller closes it).
    let _ = downstream.shutdown(Shutdown::Both);
    let _ = to_server.join();
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_numbers_from_1() {
        assert_eq!(parse(&["8080".into()]), Ok(8080));
        assert!(parse(&["0".into()]).is_err());
        assert!(parse(&["http".into()])
            .expect_err("should fail")
            .contains("'http'"));
        assert!(parse(&[]).is_err());
        assert!(parse(&["1".into(), "2".into()]).is_err());
    }
}
