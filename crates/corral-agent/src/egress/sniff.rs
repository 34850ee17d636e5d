//! Where a connection wants to go, read from its first bytes without
//! terminating anything: the SNI of a TLS ClientHello, or the `Host` of an
//! HTTP request.

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    More,
    /// TLS with this server name.
    Tls(String),
    /// HTTP with this host (port stripped).
    Http(String),
    /// Neither, or no name in it.
    Unknown(&'static str),
}

/// Longest prefix read before deciding.
pub const MAX_PREFIX: usize = 16 * 1024 + 5;

/// Looks at the first bytes of a connection.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::More,
        Some(0x16) => tls(buf),
        Some(_) => http(buf),
    }
}

fn tls(buf: &[u8]) -> Sniffed {
    let Some(hdr) = buf.get(..5) else {
        return Sniffed::More;
    };
    let len = u16::from_be_bytes([hdr[3], hdr[4]]) as usize;
    let Some(record) = buf.get(5..5 + len) else {
        return if 5 + len > MAX_PREFIX {
            Sniffed::Unknown("TLS record too large")
        } else {
            Sniffed::More
        };
    };
    match server_name(record) {
        Some(name) => Sniffed::Tls(name),
        None => Sniffed::Unknown("a TLS ClientHello without a server name (SNI)"),
    }
}

/// The host_name of the server_name extension of a ClientHello handshake.
fn server_name(h: &[u8]) -> Option<String> {
    let mut r = Reader(h, 0);
    if r.u8()? != 1 {
        return None;
    }
    r.skip(3)?; // handshake length
    r.skip(2 + 32)?; // version, random
    let sid = r.u8()? as usize;
    r.skip(sid)?;
    let suites = r.u16()? as usize;
    r.skip(suites)?;
    let comp = r.u8()? as usize;
    r.skip(comp)?;
    let ext_len = r.u16()? as usize;
    let end = r.1.checked_add(ext_len)?;
    while r.1 + 4 <= end {
        let ty = r.u16()?;
        let len = r.u16()? as usize;
        if ty != 0 {
            r.skip(len)?;
            continue;
        }
        let mut s = Reader(r.take(len)?, 0);
        let list = s.u16()? as usize;
        let mut l = Reader(s.take(list)?, 0);
        while l.1 < l.0.len() {
            let kind = l.u8()?;
            let n = l.u16()? as usize;
            let name = l.take(n)?;
            if kind == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(name.to_ascii_lowercase());
            }
        }
        return None;
    }
    None
}

struct Reader<'a>(&'a [u8], usize);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.0.get(self.1..self.1.checked_add(n)?)?;
        self.1 += n;
        Some(s)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

fn http(buf: &[u8]) -> Sniffed {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_PREFIX {
            Sniffed::Unknown("HTTP request headers too long")
        } else {
            Sniffed::More
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Sniffed::Unknown("HTTP request headers are not UTF-8");
    };
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if method == "CONNECT" || target.contains("://") {
        return Sniffed::Unknown(
            "a proxy request (CONNECT or an absolute URL); connect to the name itself",
        );
    }
    let mut hosts = lines.filter_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim())
    });
    let Some(host) = hosts.next() else {
        return Sniffed::Unknown("an HTTP request without a Host header");
    };
    if hosts.next().is_some() {
        return Sniffed::Unknown("an HTTP request with two Host headers");
    }
    let name = match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    Sniffed::Http(name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_hello(name: &str) -> Vec<u8> {
        let mut ext = vec![0, 0];
        let entry_len = 3 + name.len();
        ext.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name.as_bytes());
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn sni_and_host_are_found() {
        let hello = client_hello("PyPI.test");
        assert_eq!(sniff(&hello), Sniffed::Tls("pypi.test".into()));
        assert_eq!(sniff(&hello[..hello.len() - 1]), Sniffed::More);
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nhost: Pypi.Test:8080\r\n\r\n"),
            Sniffed::Http("pypi.test".into())
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHost: a"), Sniffed::More);
    }

    #[test]
    fn requests_without_a_single_name_are_unknown() {
        for bad in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
            b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            b"GET http://evil.test/ HTTP/1.1\r\nHost: pypi.test\r\n\r\n",
        ] {
            assert!(matches!(sniff(bad), Sniffed::Unknown(_)), "{bad:?}");
        }
        let mut hello = client_hello("x.test");
        hello[5] = 2; // not a ClientHello
        assert!(matches!(sniff(&hello), Sniffed::Unknown(_)));
        for n in 0..200 {
            let garbage: Vec<u8> = std::iter::once(0x16)
                .chain((0..n).map(|i| (i * 31) as u8))
                .collect();
            let _ = sniff(&garbage);
        }
    }
}
