//! The small part of DNS the egress gateway speaks: one-question queries
//! in, answers of the gateway's own address (or NXDOMAIN) out, and A
//! lookups of allowed names against the upstream resolver.
//!
//! Every message comes from a sandbox or from the network and is read with
//! bounds checks; anything unexpected is an error, never a panic.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// Record type A.
pub const TYPE_A: u16 = 1;

/// One parsed question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The message id.
    pub id: u16,
    /// Recursion desired, echoed back.
    pub rd: bool,
    /// The name asked for, lower case, no trailing dot.
    pub name: String,
    /// Its type.
    pub qtype: u16,
    /// The question section as received (echoed in the answer).
    pub question: Vec<u8>,
}

/// Parses a query of exactly one question; `None` for anything else.
pub fn parse_query(msg: &[u8]) -> Option<Query> {
    if msg.len() < 12 {
        return None;
    }
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    let qr = flags & 0x8000 != 0;
    let opcode = (flags >> 11) & 0xf;
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if qr || opcode != 0 || qdcount != 1 {
        return None;
    }
    let (name, end) = read_name(msg, 12, false)?;
    let fixed = msg.get(end..end + 4)?;
    Some(Query {
        id: u16::from_be_bytes([msg[0], msg[1]]),
        rd: flags & 0x0100 != 0,
        name,
        qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
        question: msg.get(12..end + 4)?.to_vec(),
    })
}

/// Reads a name at `at`; with `pointers`, follows compression (answers),
/// without, refuses it (questions). Returns the name and where it ends.
fn read_name(msg: &[u8], mut at: usize, pointers: bool) -> Option<(String, usize)> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(at)? as usize;
        if len == 0 {
            at += 1;
            break;
        }
        if len & 0xc0 == 0xc0 {
            if !pointers || jumps > 16 {
                return None;
            }
            let target = ((len & 0x3f) << 8) | *msg.get(at + 1)? as usize;
            end.get_or_insert(at + 2);
            at = target;
            jumps += 1;
            continue;
        }
        if len > 63 {
            return None;
        }
        let label = msg.get(at + 1..at + 1 + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += 1 + len;
        if labels.iter().map(|l| l.len() + 1).sum::<usize>() > 255 {
            return None;
        }
    }
    Some((labels.join("."), end.unwrap_or(at)))
}

/// An answer to `q`: `addr` as its one A record, or no record (NODATA)
/// when `addr` is `None` and `nxdomain` is false, or NXDOMAIN.
pub fn answer(q: &Query, addr: Option<Ipv4Addr>, nxdomain: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, AA, RD as asked, RA; rcode 3 for NXDOMAIN.
    let mut flags: u16 = 0x8000 | 0x0400 | 0x0080;
    if q.rd {
        flags |= 0x0100;
    }
    if nxdomain {
        flags |= 3;
    }
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::from(addr.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&q.question);
    if let Some(a) = addr {
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&30u32.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&a.octets());
    }
    out
}

/// A query for `name`'s A records.
pub fn query(id: u16, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&TYPE_A.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out
}

/// The A records of a response to query `id`.
pub fn parse_a_records(msg: &[u8], id: u16) -> Option<Vec<Ipv4Addr>> {
    if msg.len() < 12 || u16::from_be_bytes([msg[0], msg[1]]) != id || msg[2] & 0x80 == 0 {
        return None;
    }
    let qd = u16::from_be_bytes([msg[4], msg[5]]);
    let an = u16::from_be_bytes([msg[6], msg[7]]);
    let mut at = 12;
    for _ in 0..qd {
        at = read_name(msg, at, true)?.1 + 4;
    }
    let mut addrs = Vec::new();
    for _ in 0..an {
        at = read_name(msg, at, true)?.1;
        let fixed = msg.get(at..at + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let len = u16::from_be_bytes([fixed[8], fixed[9]]) as usize;
        let data = msg.get(at + 10..at + 10 + len)?;
        if rtype == TYPE_A && len == 4 {
            addrs.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        at += 10 + len;
    }
    Some(addrs)
}

/// The name servers of `/etc/resolv.conf` (the gateway's own, upstream).
pub fn nameservers() -> Vec<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Looks `name` up upstream: its A records, from the first server that answers.
pub fn resolve(name: &str, servers: &[SocketAddr]) -> std::io::Result<Vec<Ipv4Addr>> {
    let mut last = std::io::Error::other("no name server in /etc/resolv.conf");
    for server in servers {
        for _attempt in 0..2 {
            let sock = UdpSocket::bind("0.0.0.0:0")?;
            sock.set_read_timeout(Some(Duration::from_secs(2)))?;
            sock.connect(server)?;
            let id = random_id();
            sock.send(&query(id, name))?;
            let mut buf = [0u8; 1500];
            match sock.recv(&mut buf) {
                Ok(n) => match parse_a_records(&buf[..n], id) {
                    Some(a) => return Ok(a),
                    None => last = std::io::Error::other(format!("bad answer from {server}")),
                },
                Err(e) => last = e,
            }
        }
    }
    Err(last)
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        return (t ^ (t >> 16)) as u16;
    }
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_round_trips_and_answers_carry_the_question() {
        let q = parse_query(&query(7, "PyPI.test")).expect("parses");
        assert_eq!((q.id, q.name.as_str(), q.qtype), (7, "pypi.test", TYPE_A));
        let a = answer(&q, Some(Ipv4Addr::new(10, 0, 0, 2)), false);
        assert_eq!(
            parse_a_records(&a, 7),
            Some(vec![Ipv4Addr::new(10, 0, 0, 2)])
        );
        let nx = answer(&q, None, true);
        assert_eq!(nx[3] & 0xf, 3);
        assert_eq!(parse_a_records(&nx, 7), Some(vec![]));
    }

    #[test]
    fn hostile_messages_are_refused_not_panicked_on() {
        assert_eq!(parse_query(&[]), None);
        assert_eq!(parse_query(&[0; 11]), None);
        let mut loopy = query(1, "a.test");
        loopy[12] = 0xc0;
        loopy[13] = 12;
        assert_eq!(parse_query(&loopy), None, "no pointers in questions");
        let mut truncated = query(1, "a.test");
        truncated.truncate(16);
        assert_eq!(parse_query(&truncated), None);
        // A pointer loop in an answer ends.
        let mut ans = answer(
            &parse_query(&query(2, "b.test")).expect("ok"),
            Some(Ipv4Addr::LOCALHOST),
            false,
        );
        let at = ans.len() - 16;
        ans[at] = 0xc0;
        ans[at + 1] = at as u8;
        assert_eq!(parse_a_records(&ans, 2), None);
        for n in 0..64 {
            let garbage: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let _ = parse_query(&garbage);
            let _ = parse_a_records(&garbage, 0);
        }
    }
}
