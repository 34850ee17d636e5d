//! The tokens of port links (`api/ports.rs`): an HMAC-SHA256, under a key
//! the service makes at start, of a sandbox's provider key, its sandbox id
//! and the port, cut to 128 bits. Stateless; bound to that sandbox (the
//! same key's next sandbox gets new links) and that port; dead with the
//! service. Shared by the REST route and the MCP tool.

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
    /// `http://IP:PORT` of the service's TCP listener.
    pub base: String,
}

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
