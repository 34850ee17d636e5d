//! The tokens of port links (`api/ports.rs`): an HMAC-SHA256, under a key
//! the service makes at start, of a sandbox's provider key, its sandbox id
//! and the port, cut to 128 bits. Stateless; bound to that sandbox (the
//! same key's next sandbox gets new links) and that port; dead with the
//! service. Shared by the REST route and the MCP tool.
//!
//! And where links point: the port-link listener ([`PortOrigin`],
//! `server.ports_listen`), an origin of its own that serves nothing but
//! links, so that a page a sandbox serves never runs on the API's or the
//! dashboard's origin.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Hex digits of a link's token.
const TOKEN_HEX: usize = 32;

/// The service's key for port links. Cheap to clone.
#[derive(Clone)]
pub struct PortKey(Arc<str>);

impl Default for PortKey {
    fn default() -> Self {
        PortKey::new()
    }
}

impl PortKey {
    /// A fresh random key.
    pub fn new() -> PortKey {
        PortKey(corral::host::random_hex(64).into())
    }

    fn mac(&self, key: &str, sandbox: &str, port: u16) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut mac = match Hmac::<Sha256>::new_from_slice(self.0.as_bytes()) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        for part in [key, sandbox, &port.to_string()] {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        mac
    }

    /// The token of `port` of sandbox `sandbox` under provider key `key`.
    pub fn token(&self, key: &str, sandbox: &str, port: u16) -> String {
        let tag = self.mac(key, sandbox, port).finalize().into_bytes();
        hex::encode(&tag[..TOKEN_HEX / 2])
    }

    /// Whether `given` is that token (compared in constant time).
    pub fn verify(&self, key: &str, sandbox: &str, port: u16, given: &str) -> bool {
        match hex::decode(given) {
            Ok(bytes) if bytes.len() == TOKEN_HEX / 2 => self
                .mac(key, sandbox, port)
                .verify_truncated_left(&bytes)
                .is_ok(),
            _ => false,
        }
    }

    /// `/ports/KEY/PORT/TOKEN/`: the link's path.
    pub fn path(&self, key: &str, sandbox: &str, port: u16) -> String {
        format!("{}/", prefix(key, port, &self.token(key, sandbox, port)))
    }
}

/// `/ports/KEY/PORT/TOKEN`: what the proxy takes off a link's path.
pub fn prefix(key: &str, port: u16, token: &str) -> String {
    format!("/ports/{}/{port}/{token}", segment(key))
}

/// Where the service's port links are served: its key and its base URL
/// (`http://IP:PORT`), for the MCP tool, which has no request Host.
#[derive(Clone)]
pub struct PortLinks {
    /// The key.
    pub key: PortKey,
    /// `http://IP:PORT` of the port-link listener.
    pub base: String,
}

/// The port-link listener's address, and the API listener's IP it is
/// compared with to name it in a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortOrigin {
    /// Where the port-link listener is bound (the real port).
    pub ports: SocketAddr,
    /// The IP of the API's TCP listener.
    pub api: IpAddr,
}

impl PortOrigin {
    /// `http://NAME:PORT` of the port-link listener for a client that
    /// reached the API as `host` (a `Host` the guard accepted): the same
    /// name when both listeners share an IP (or the links' is unspecified),
    /// so a client behind a name it resolves keeps it; else the links' IP.
    pub fn base_for(&self, host: &str) -> String {
        let ip = self.ports.ip();
        let name = if ip.is_unspecified() || ip == self.api {
            crate::guard::split_host(host).0.to_string()
        } else {
            crate::guard::host_of(ip)
        };
        format!("http://{name}:{}", self.ports.port())
    }

    /// `http://IP:PORT` without a request to go by (the MCP tool): the
    /// listener's IP, loopback for an unspecified one.
    pub fn base(&self) -> String {
        let ip = match self.ports.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}:{}", crate::guard::host_of(ip), self.ports.port())
    }
}

/// Response headers a sandbox's server may not send through a link: each
/// reaches beyond the link's own pages. `Service-Worker-Allowed` would let
/// a worker claim every link of the origin (a worker's scope otherwise
/// stays under its script's path, the link's); `Clear-Site-Data` would
/// wipe what other links' pages keep on the site.
pub const DROPPED_RESPONSE_HEADERS: [&str; 2] = ["service-worker-allowed", "clear-site-data"];

/// Percent-encodes a path segment (a provider key may hold `:`).
pub fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_name_the_port_listener_as_the_client_named_the_api() {
        let o = |ports: &str, api: &str| PortOrigin {
            ports: ports.parse().expect("address"),
            api: api.parse().expect("ip"),
        };
        let lo = o("127.0.0.1:7071", "127.0.0.1");
        assert_eq!(lo.base_for("localhost:7070"), "http://localhost:7071");
        assert_eq!(lo.base_for("127.0.0.1:7070"), "http://127.0.0.1:7071");
        assert_eq!(lo.base(), "http://127.0.0.1:7071");
        let any = o("0.0.0.0:9000", "0.0.0.0");
        assert_eq!(any.base_for("box.lan:7070"), "http://box.lan:9000");
        assert_eq!(any.base_for("[fe80::1]:7070"), "http://[fe80::1]:9000");
        assert_eq!(any.base(), "http://127.0.0.1:9000");
        let apart = o("10.0.0.5:9000", "127.0.0.1");
        assert_eq!(apart.base_for("localhost:7070"), "http://10.0.0.5:9000");
        let v6 = o("[::]:9000", "::1");
        assert_eq!(v6.base(), "http://[::1]:9000");
    }

    #[test]
    fn keys_are_encoded_as_one_segment() {
        assert_eq!(segment("alice:ep-1"), "alice%3Aep-1");
        assert_eq!(segment("sb-0af3"), "sb-0af3");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn a_token_opens_its_port_of_its_sandbox_only() {
        let k = PortKey::new();
        let t = k.token("alice:ep", "sb1", 8080);
        assert_eq!(t.len(), TOKEN_HEX);
        assert!(k.verify("alice:ep", "sb1", 8080, &t));
        assert!(!k.verify("alice:ep", "sb1", 8081, &t));
        assert!(!k.verify("alice:ep", "sb2", 8080, &t));
        assert!(!k.verify("bob:ep", "sb1", 8080, &t));
        assert!(!PortKey::new().verify("alice:ep", "sb1", 8080, &t));
        assert!(!k.verify("alice:ep", "sb1", 8080, "zz"));
        assert!(!k.verify("alice:ep", "sb1", 8080, &t[..30]));
    }
}
