//! `corral-agent netpol-probe IP ALLOWED DENIED`: whether the cluster's
//! network plugin enforces NetworkPolicy, seen from inside a pod that a
//! policy lets reach `IP` on port `ALLOWED` only (`corral doctor` and the
//! first start of a sandbox with an egress policy on Kubernetes run it).
//!
//! `IP` listens on both ports (an egress gateway does, on 80 and 443).
//! First `ALLOWED` must answer: that proves the path works at all (the
//! listener may still be starting, so it is tried for a while). Then
//! `DENIED` is tried for a few seconds: a plugin that enforces the policy
//! drops or rejects it (at once, or once it has programmed a pod it saw
//! late); one that does not lets every attempt through. One line says
//! which: `enforced: ...`, `not-enforced: ...` or `unreachable: ...`.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long `ALLOWED` may take to answer (the listener's pod starting).
const REACH_WAIT: Duration = Duration::from_secs(60);
/// How long `DENIED` must stay reachable to call the policy unenforced.
const DENY_WAIT: Duration = Duration::from_secs(5);
/// One connection attempt's limit.
const ATTEMPT: Duration = Duration::from_secs(1);
/// Between attempts.
const PAUSE: Duration = Duration::from_millis(250);

/// What the probe asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The listener's address.
    pub ip: IpAddr,
    /// The port the policy allows.
    pub allowed: u16,
    /// The port the policy does not allow.
    pub denied: u16,
}

/// Parses `IP ALLOWED DENIED`.
pub fn parse(rest: &[String]) -> Result<Probe, String> {
    let [ip, allowed, denied] = rest else {
        return Err("netpol-probe takes IP ALLOWED_PORT DENIED_PORT".to_string());
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("netpol-probe: '{ip}' is not an IP address"))?;
    let port = |p: &String| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("netpol-probe: '{p}' is not a port (1 to 65535)"))
    };
    Ok(Probe {
        ip,
        allowed: port(allowed)?,
        denied: port(denied)?,
    })
}

/// Runs the probe and prints its verdict; 0 whatever the verdict.
pub fn run(probe: Probe) -> i32 {
    println!("{}", verdict(probe, REACH_WAIT, DENY_WAIT));
    0
}

fn verdict(probe: Probe, reach_wait: Duration, deny_wait: Duration) -> String {
    let allowed = SocketAddr::new(probe.ip, probe.allowed);
    let denied = SocketAddr::new(probe.ip, probe.denied);
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&allowed, ATTEMPT) {
            Ok(_) => break,
            Err(e) if start.elapsed() >= reach_wait => {
                return format!(
                    "unreachable: {allowed}, which the policy allows, did not answer within {} s \
                     ({e})",
                    reach_wait.as_secs()
                );
            }
            Err(_) => std::thread::sleep(PAUSE),
        }
    }
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&denied, ATTEMPT) {
            Err(e) => {
                return format!(
                    "enforced: {denied}, which the policy denies, could not be reached ({e}); \
                     {allowed} could"
                )
            }
            Ok(_) if start.elapsed() >= deny_wait => {
                return format!(
                    "not-enforced: {denied}, which the policy denies, was reached for {} s",
                    deny_wait.as_secs()
                )
            }
            Ok(_) => std::thread::sleep(PAUSE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_are_checked_by_name() {
        assert_eq!(
            parse(&args(&["10.0.0.7", "443", "80"])),
            Ok(Probe {
                ip: "10.0.0.7".parse().expect("ip"),
                allowed: 443,
                denied: 80
            })
        );
        assert!(parse(&args(&["x", "443", "80"]))
            .expect_err("ip")
            .contains("'x'"));
        assert!(parse(&args(&["10.0.0.7", "0", "80"]))
            .expect_err("port")
            .contains("'0'"));
        assert!(parse(&args(&["10.0.0.7", "443"])).is_err());
    }

    #[test]
    fn the_verdict_follows_what_answers() {
        let open = TcpListener::bind("127.0.0.1:0").expect("bind");
        let also_open = TcpListener::bind("127.0.0.1:0").expect("bind");
        // A port nobody listens on: bound, then closed.
        let closed = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let port = |l: &TcpListener| l.local_addr().expect("addr").port();
        let ip = "127.0.0.1".parse().expect("ip");
        let short = Duration::from_millis(600);
        let both = verdict(
            Probe {
                ip,
                allowed: port(&open),
                denied: port(&also_open),
            },
            short,
            short,
        );
        assert!(both.starts_with("not-enforced:"), "{both}");
        let blocked = verdict(
            Probe {
                ip,
                allowed: port(&open),
                denied: closed,
            },
            short,
            short,
        );
        assert!(blocked.starts_with("enforced:"), "{blocked}");
        let none = verdict(
            Probe {
                ip,
                allowed: closed,
                denied: port(&open),
            },
            short,
            short,
        );
        assert!(none.starts_with("unreachable:"), "{none}");
    }
}
