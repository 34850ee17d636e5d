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
//!
//! And which cookies pass ([`CookieNames`]): a browser sends a link's
//! server every cookie it holds for the link's host name, also those a
//! page of another link (or another app) set for a parent domain. The
//! proxy sends on only the cookies whose names the link's own server set,
//! and keeps the server's cookies to its host name (`Domain` taken off),
//! so no link's server learns, or tosses, another's.

use std::collections::{BTreeSet, HashMap};
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

/// Cookie names one link's server may set before the oldest is forgotten.
const MAX_COOKIE_NAMES: usize = 64;

/// The names of the cookies each link's server set (`Set-Cookie`), by
/// sandbox id and port: the only cookies the proxy sends it. A cookie a
/// page's script sets, never the server, is not sent on. Kept for the
/// service's life, forgotten with the sandbox. Cheap to clone.
#[derive(Clone, Default)]
pub struct CookieNames(Arc<Mutex<NamesByPort>>);

/// Cookie names by sandbox id and port.
type NamesByPort = HashMap<(String, u16), BTreeSet<String>>;

impl CookieNames {
    fn lock(&self) -> std::sync::MutexGuard<'_, NamesByPort> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps from `headers` (a request to port `port` of `sandbox`) only
    /// the cookies that port's server set.
    pub fn filter_request(&self, sandbox: &str, port: u16, headers: &mut axum::http::HeaderMap) {
        let sent: Vec<String> = headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .map(|pair| pair.trim().to_string())
            .filter(|pair| !pair.is_empty())
            .collect();
        headers.remove(axum::http::header::COOKIE);
        let names = self.lock();
        let Some(set) = names.get(&(sandbox.to_string(), port)) else {
            return;
        };
        let kept: Vec<&str> = sent
            .iter()
            .map(String::as_str)
            .filter(|pair| set.contains(cookie_name(pair)))
            .collect();
        if kept.is_empty() {
            return;
        }
        if let Ok(value) = axum::http::HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(axum::http::header::COOKIE, value);
        }
    }

    /// Learns the cookies a response of port `port` of `sandbox` sets,
    /// and takes their `Domain` off: a link's cookie is its host name's.
    pub fn learn_response(&self, sandbox: &str, port: u16, headers: &mut axum::http::HeaderMap) {
        let set: Vec<axum::http::HeaderValue> = headers
            .get_all(axum::http::header::SET_COOKIE)
            .iter()
            .cloned()
            .collect();
        if set.is_empty() {
            return;
        }
        headers.remove(axum::http::header::SET_COOKIE);
        let mut names = self.lock();
        if names.len() >= MAX_REMEMBERED && !names.contains_key(&(sandbox.to_string(), port)) {
            names.clear();
        }
        let learnt = names.entry((sandbox.to_string(), port)).or_default();
        for value in set {
            let Ok(text) = value.to_str() else {
                continue; // not text: no cookie a browser keeps
            };
            let name = cookie_name(text);
            if name.is_empty() {
                continue;
            }
            if !learnt.contains(name) && learnt.len() >= MAX_COOKIE_NAMES {
                continue; // past the bound: set, never sent back
            }
            learnt.insert(name.to_string());
            if let Ok(v) = axum::http::HeaderValue::from_str(&without_domain(text)) {
                headers.append(axum::http::header::SET_COOKIE, v);
            }
        }
    }

    /// Forgets every port of `sandbox` (it is gone).
    pub fn forget(&self, sandbox: &str) {
        self.lock().retain(|(id, _), _| id != sandbox);
    }
}

/// The name of a `name=value[; attributes]` cookie, trimmed.
fn cookie_name(cookie: &str) -> &str {
    let pair = cookie.split(';').next().unwrap_or_default();
    pair.split('=').next().unwrap_or_default().trim()
}

/// A `Set-Cookie` value without its `Domain` attributes.
fn without_domain(value: &str) -> String {
    value
        .split(';')
        .enumerate()
        .filter(|(i, part)| {
            *i == 0
                || !part
                    .trim()
                    .get(..6)
                    .is_some_and(|a| a.eq_ignore_ascii_case("domain"))
        })
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(";")
}

/// Response headers a sandbox's server may not send through a link.
/// Each link being an origin of its own, these reach no other link's
/// pages; they are dropped still, as a second wall: `Service-Worker-Allowed`
/// would let a worker claim the link's whole origin beyond its token's
/// path, `Clear-Site-Data` would wipe the origin's storage.
pub const DROPPED_RESPONSE_HEADERS: [&str; 2] = ["service-worker-allowed", "clear-site-data"];

/// Request headers never sent on to a sandbox's server through a link:
/// credentials a browser or a client holds for something else (a bearer
/// token of the API sent by mistake, a proxy's). Of the cookies, only the
/// link's own server's pass ([`CookieNames`]).
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
    fn only_cookies_a_links_server_set_are_sent_to_it_and_none_beyond_its_host() {
        use axum::http::header::{COOKIE, SET_COOKIE};
        let jar = CookieNames::default();
        let mut req = axum::http::HeaderMap::new();
        req.insert(COOKIE, "sid=1; other=stolen".parse().expect("value"));
        jar.filter_request("sb-1", 8080, &mut req);
        assert_eq!(req.get(COOKIE), None, "nothing set yet, nothing sent");
        let mut resp = axum::http::HeaderMap::new();
        resp.append(
            SET_COOKIE,
            "sid=1; Domain=localhost; Path=/; HttpOnly"
                .parse()
                .expect("value"),
        );
        resp.append(
            SET_COOKIE,
            "pref=dark;domain=.localhost".parse().expect("value"),
        );
        jar.learn_response("sb-1", 8080, &mut resp);
        let set: Vec<_> = resp.get_all(SET_COOKIE).iter().collect();
        assert_eq!(set, ["sid=1; Path=/; HttpOnly", "pref=dark"]);
        for cookie in [
            "sid=1; other=stolen; pref=dark",
            "other=stolen;sid=1;pref=dark",
        ] {
            let mut req = axum::http::HeaderMap::new();
            req.insert(COOKIE, cookie.parse().expect("value"));
            jar.filter_request("sb-1", 8080, &mut req);
            let sent = req.get(COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
            assert!(
                sent.contains("sid=1") && sent.contains("pref=dark") && !sent.contains("other"),
                "{sent}"
            );
        }
        // Another port, another sandbox: their own servers set nothing.
        for (id, port) in [("sb-1", 8081), ("sb-2", 8080)] {
            let mut req = axum::http::HeaderMap::new();
            req.insert(COOKIE, "sid=1".parse().expect("value"));
            jar.filter_request(id, port, &mut req);
            assert_eq!(req.get(COOKIE), None, "{id}:{port}");
        }
        jar.forget("sb-1");
        let mut req = axum::http::HeaderMap::new();
        req.insert(COOKIE, "sid=1".parse().expect("value"));
        jar.filter_request("sb-1", 8080, &mut req);
        assert_eq!(req.get(COOKIE), None, "forgotten");
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
