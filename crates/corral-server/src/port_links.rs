//! The tokens of port links (`api/ports.rs`): an HMAC-SHA256, under a key
//! the service makes at start, of a sandbox's provider key, its sandbox id
//! and the port, cut to 128 bits. Stateless but for which provider key
//! each sandbox id that was given a link has; bound to that sandbox (the
//! same key's next sandbox gets new links) and that port; dead with the
//! service. Shared by the REST route and the MCP tool.
//!
//! And where links point ([`PortOrigin`]): each link is an origin of its
//! own, the host name `PORT-SANDBOXID.DOMAIN` (E2B's addressing) on the
//! port-link listener (`server.ports_listen`), `DOMAIN` being
//! `server.ports_domain` or `localhost` (browsers resolve every
//! `*.localhost` to loopback). The browser keeps cookies, storage,
//! service workers, caches and `clients` per origin, so one sandbox's pages
//! never see another's, nor the API's or the dashboard's. The link's token
//! is the first segment of its path, never part of the host name: an
//! origin travels in `Origin` and `Referer` headers, a path does not
//! (cross-origin).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use corral_core::config::PortsDomain;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Hex digits of a link's token.
const TOKEN_HEX: usize = 32;

/// The most sandbox ids remembered for links: past it the oldest
/// half-guess is not worth keeping, the map is cleared (links of live
/// sandboxes are remembered again when asked for).
const MAX_REMEMBERED: usize = 65_536;

/// The service's key for port links, and the provider key of each sandbox
/// id it made a link for (a link names the sandbox id, the HMAC needs the
/// key too). Cheap to clone.
#[derive(Clone)]
pub struct PortKey(Arc<KeyInner>);

struct KeyInner {
    secret: String,
    keys: Mutex<HashMap<String, String>>,
}

impl Default for PortKey {
    fn default() -> Self {
        PortKey::new()
    }
}

impl PortKey {
    /// A fresh random key.
    pub fn new() -> PortKey {
        PortKey(Arc::new(KeyInner {
            secret: corral::host::random_hex(64),
            keys: Mutex::new(HashMap::new()),
        }))
    }

    fn mac(&self, key: &str, sandbox: &str, port: u16) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut mac = match Hmac::<Sha256>::new_from_slice(self.0.secret.as_bytes()) {
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

    /// [`PortKey::token`], remembering that `sandbox` is under `key` so
    /// the link (which names the sandbox only) can be checked.
    pub fn link_token(&self, key: &str, sandbox: &str, port: u16) -> String {
        let mut keys = self.0.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= MAX_REMEMBERED && !keys.contains_key(sandbox) {
            keys.clear();
        }
        keys.insert(sandbox.to_string(), key.to_string());
        drop(keys);
        self.token(key, sandbox, port)
    }

    /// The provider key of `sandbox`, when a link to it was made.
    pub fn key_of(&self, sandbox: &str) -> Option<String> {
        let keys = self.0.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(sandbox).cloned()
    }

    /// Forgets `sandbox` (it is gone).
    pub fn forget(&self, sandbox: &str) {
        let mut keys = self.0.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.remove(sandbox);
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
}

/// The service's port links as a front end without a request hands them
/// out (the MCP tool): the key and where links point.
#[derive(Clone)]
pub struct PortLinks {
    /// The key.
    pub key: PortKey,
    /// Where links point.
    pub origin: PortOrigin,
}

/// One link, as every front end describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// `SCHEME://PORT-ID.DOMAIN[:PORT]/TOKEN/`: what a browser opens.
    pub url: String,
    /// `PORT-ID.DOMAIN[:PORT]`: the link's host name, what a program that
    /// cannot resolve it sends as `Host`.
    pub host: String,
    /// `/TOKEN/`: the link's path.
    pub path: String,
    /// `http://IP:PORT` of the port-link listener: where such a program
    /// connects.
    pub connect: String,
}

/// Where port links point: the port-link listener's address, the API
/// listener's IP it is compared with to name it, and the domain of the
/// links' host names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortOrigin {
    /// Where the port-link listener is bound (the real port).
    pub ports: SocketAddr,
    /// The IP of the API's TCP listener.
    pub api: IpAddr,
    /// `server.ports_domain`, or `localhost`.
    pub domain: PortsDomain,
}

impl PortOrigin {
    /// The link to `port` of sandbox `sandbox` with `token`, for a client
    /// that reached the API as `host` (a `Host` the guard accepted; `None`
    /// without a request).
    pub fn link(&self, sandbox: &str, port: u16, token: &str, host: Option<&str>) -> Link {
        let d = &self.domain;
        let port_part = match (d.behind_proxy, d.port) {
            (true, Some(p)) => format!(":{p}"),
            (true, None) => String::new(),
            (false, _) => format!(":{}", self.ports.port()),
        };
        let name = format!("{}.{}{port_part}", label(port, sandbox), d.domain);
        let path = format!("/{token}/");
        Link {
            url: format!("{}://{name}{path}", d.scheme),
            host: name,
            path,
            connect: match host {
                Some(h) => self.base_for(h),
                None => self.base(),
            },
        }
    }

    /// The sandbox id and port a `Host` (lower case) names under this
    /// domain, `PORT-ID.DOMAIN[:ANYPORT]`; `None` for any other host. The
    /// port is not checked: the name is the service's own, which a
    /// rebinding page cannot borrow.
    pub fn of_host<'a>(&self, host: &'a str) -> Option<(u16, &'a str)> {
        of_host(host, &self.domain.domain)
    }

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

/// `PORT-ID`: a link's first host label.
fn label(port: u16, sandbox: &str) -> String {
    format!("{port}-{}", sandbox.to_ascii_lowercase())
}

/// Whether `sandbox` can stand in a host label (`PORT-` in front): corral's
/// ids (`sb-` and hex) can.
pub fn id_fits_a_host_name(sandbox: &str) -> bool {
    !sandbox.is_empty()
        && sandbox.len() <= 57
        && !sandbox.ends_with('-')
        && sandbox
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `PORT-ID.DOMAIN[:ANYPORT]` read against `domain`.
pub fn of_host<'a>(host: &'a str, domain: &str) -> Option<(u16, &'a str)> {
    let (name, _) = crate::guard::split_host(host);
    let first = name.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = first.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    // One label: a name under a link's name is no link.
    (!first.contains('.') && id_fits_a_host_name(id)).then_some((port, id))
}

/// Response headers a sandbox's server may not send through a link.
/// Each link being an origin of its own, these reach no other link's
/// pages; they are dropped still, as a second wall: `Service-Worker-Allowed`
/// would let a worker claim the link's whole origin beyond its token's
/// path, `Clear-Site-Data` would wipe the origin's storage.
pub const DROPPED_RESPONSE_HEADERS: [&str; 2] = ["service-worker-allowed", "clear-site-data"];

/// Request headers never sent on to a sandbox's server through a link:
/// credentials a browser or a client holds for something else (a bearer
/// token of the API sent by mistake, a proxy's). The sandbox's own cookies
/// pass: on a link's origin the browser sends no others.
pub const DROPPED_REQUEST_HEADERS: [&str; 2] = ["authorization", "proxy-authorization"];

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(ports: &str, api: &str, domain: PortsDomain) -> PortOrigin {
        PortOrigin {
            ports: ports.parse().expect("address"),
            api: api.parse().expect("ip"),
            domain,
        }
    }

    #[test]
    fn links_name_the_port_listener_as_the_client_named_the_api() {
        let o = |ports: &str, api: &str| origin(ports, api, PortsDomain::localhost());
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
    fn each_link_has_a_host_name_of_its_own() {
        let lo = origin("127.0.0.1:7071", "127.0.0.1", PortsDomain::localhost());
        let l = lo.link("sb-0af3", 8080, "t0k", Some("localhost:7070"));
        assert_eq!(l.url, "http://8080-sb-0af3.localhost:7071/t0k/");
        assert_eq!(l.host, "8080-sb-0af3.localhost:7071");
        assert_eq!(l.path, "/t0k/");
        assert_eq!(l.connect, "http://localhost:7071");
        let proxied = origin(
            "0.0.0.0:7071",
            "0.0.0.0",
            PortsDomain::parse("https://ports.example.com").expect("domain"),
        );
        let l = proxied.link("sb-1", 3000, "t", None);
        assert_eq!(l.url, "https://3000-sb-1.ports.example.com/t/");
        assert_eq!(l.connect, "http://127.0.0.1:7071");
        let bare = origin(
            "0.0.0.0:7071",
            "0.0.0.0",
            PortsDomain::parse("ports.example.com").expect("domain"),
        );
        assert_eq!(
            bare.link("sb-1", 3000, "t", None).url,
            "http://3000-sb-1.ports.example.com:7071/t/"
        );
        // Read back, whatever the port; nothing else is a link.
        assert_eq!(
            lo.of_host("8080-sb-0af3.localhost:7071"),
            Some((8080, "sb-0af3"))
        );
        assert_eq!(
            lo.of_host("8080-sb-0af3.localhost"),
            Some((8080, "sb-0af3"))
        );
        for other in [
            "localhost:7071",
            "127.0.0.1:7071",
            "8080-sb-0af3.evil.example",
            "8080-sb-0af3.localhost.evil.example",
            "x.8080-sb-0af3.localhost",
            "0-sb-1.localhost",
            "70000-sb-1.localhost",
            "8080-.localhost",
            "8080-SB-1.localhost",
            "8080-sb_1.localhost",
            "evil8080-sb-1localhost",
        ] {
            assert_eq!(lo.of_host(other), None, "{other}");
        }
        assert_eq!(
            proxied.of_host("3000-sb-1.ports.example.com"),
            Some((3000, "sb-1"))
        );
        assert_eq!(proxied.of_host("3000-sb-1.localhost"), None);
    }

    #[test]
    fn a_link_remembers_which_key_its_sandbox_is_under() {
        let k = PortKey::new();
        assert_eq!(k.key_of("sb-1"), None);
        let t = k.link_token("alice:ep", "sb-1", 8080);
        assert_eq!(t, k.token("alice:ep", "sb-1", 8080));
        assert_eq!(k.key_of("sb-1").as_deref(), Some("alice:ep"));
        k.forget("sb-1");
        assert_eq!(k.key_of("sb-1"), None);
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
