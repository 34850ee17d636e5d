//! Egress policy by name: which destinations a sandbox with `network:
//! {egress: ...}` may reach, and the rules' matching and narrowing.
//!
//! A rule is `HOST[:PORT]`. HOST is an exact domain name (`pypi.org`), a
//! wildcard of its subdomains (`*.github.com`, which does not match
//! `github.com` itself) or a CIDR (`10.0.0.0/8`, `192.0.2.7`); PORT is one
//! port, and a name rule without one allows 80 and 443. Names are what a
//! sandbox can resolve and connect to; CIDRs are where an allowed name may
//! lead: when `allow` holds a CIDR, an allowed name's addresses must fall in
//! an allowed CIDR, and an address in a `deny` CIDR is never connected to.
//! `deny` wins over `allow`; a link-local address (169.254.0.0/16, where
//! cloud metadata services answer) is refused unless an allow CIDR names
//! it. There is no rule for an IP literal to be
//! reached directly: a sandbox with an egress policy has no route but the
//! gateway (see the book's security model, docs/book/src/security.md).
//!
//! No IO: the gateway (in the agent binary) and the client policy use this.

use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// Ports a name rule without a port allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Most rules in one list.
pub const MAX_RULES: usize = 256;

/// `network: {egress: {allow, deny}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressPolicy {
    /// Destinations the sandbox may reach; nothing else is reachable.
    pub allow: Vec<String>,
    /// Destinations refused even when `allow` matches them.
    pub deny: Vec<String>,
}

/// What one sandbox's egress gateway allowed and refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressCounts {
    /// DNS questions for allowed names.
    pub dns_allowed: u64,
    /// DNS questions refused (answered NXDOMAIN).
    pub dns_refused: u64,
    /// Connections relayed to an allowed destination.
    pub connections_allowed: u64,
    /// Connections refused (a name not allowed, no name, no usable address).
    pub connections_refused: u64,
    /// The last refusals (at most 32), oldest first, e.g. `dns evil.test`.
    pub recent_refusals: Vec<String>,
}

/// What a rule's host part is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An exact name, lower case, no trailing dot.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix` (lower case).
    Wildcard(String),
    /// An IPv4 network.
    Cidr(Ipv4Addr, u8),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Name, wildcard or CIDR.
    pub host: Host,
    /// One port; `None`: 80 and 443 for names, every port for CIDRs.
    pub port: Option<u16>,
}

impl Rule {
    /// Parses `HOST[:PORT]`; `field` names the list entry in errors.
    pub fn parse(field: &str, text: &str) -> Result<Rule, SpecError> {
        let bad = |reason: &str| SpecError {
            field: field.to_string(),
            value: text.to_string(),
            reason: reason.to_string(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("empty rule"));
        }
        if t.contains('[') || t.matches(':').count() > 1 {
            return Err(bad("IPv6 destinations are not supported (sandboxes with an egress policy have no IPv6)"));
        }
        let (host, port) = match t.rsplit_once(':') {
            Some((h, p)) => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
                (h, Some(port))
            }
            None => (t, None),
        };
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host).to_string();
        if let Some((addr, len)) = host.split_once('/') {
            let addr: Ipv4Addr = addr
                .parse()
                .map_err(|_| bad("a CIDR needs an IPv4 address, e.g. 10.0.0.0/8"))?;
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| bad("a CIDR's prefix length must be 0 to 32"))?;
            return Ok(Rule {
                host: Host::Cidr(mask(addr, len), len),
                port,
            });
        }
        if let Ok(addr) = host.parse::<Ipv4Addr>() {
            return Ok(Rule {
                host: Host::Cidr(addr, 32),
                port,
            });
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, host.clone()),
        };
        if !valid_name(&name) {
            return Err(bad(
                "not a domain name (letters, digits, '-' and '.', labels of 1 to 63 characters; \
                 a wildcard is '*.' followed by a name)",
            ));
        }
        Ok(Rule {
            host: if wild {
                Host::Wildcard(name)
            } else {
                Host::Name(name)
            },
            port,
        })
    }

    fn name_matches(&self, name: &str) -> bool {
        match &self.host {
            Host::Name(n) => n == name,
            Host::Wildcard(s) => {
                name.len() > s.len() + 1 && name.ends_with(s.as_str()) && {
                    name.as_bytes()[name.len() - s.len() - 1] == b'.'
                }
            }
            Host::Cidr(..) => false,
        }
    }

    fn port_matches(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => matches!(self.host, Host::Cidr(..)) || DEFAULT_PORTS.contains(&port),
        }
    }

    fn addr_matches(&self, addr: Ipv4Addr) -> bool {
        match self.host {
            Host::Cidr(net, len) => mask(addr, len) == net,
            _ => false,
        }
    }

    /// Whether everything this rule allows is allowed by `wider` too.
    pub fn within(&self, wider: &Rule) -> bool {
        let ports = match (self.port, wider.port) {
            (_, None) if matches!(wider.host, Host::Cidr(..)) => true,
            (Some(p), None) => DEFAULT_PORTS.contains(&p),
            (None, None) => true,
            (Some(p), Some(q)) => p == q,
            (None, Some(_)) => false,
        };
        let hosts = match (&self.host, &wider.host) {
            (Host::Name(n), _) => wider.name_matches(n),
            (Host::Wildcard(a), Host::Wildcard(b)) => a == b || wider.name_matches(a),
            (Host::Wildcard(_), _) => false,
            (Host::Cidr(net, len), Host::Cidr(wnet, wlen)) => {
                len >= wlen && mask(*net, *wlen) == *wnet
            }
            (Host::Cidr(..), _) => false,
        };
        ports && hosts
    }
}

/// A policy with its rules parsed, as the gateway uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Parsed `allow`.
    pub allow: Vec<Rule>,
    /// Parsed `deny`.
    pub deny: Vec<Rule>,
}

impl EgressPolicy {
    /// Parses every rule; errors name `network.egress.allow[i]` and the value.
    pub fn rules(&self) -> Result<Rules, SpecError> {
        let list = |key: &str, v: &[String]| -> Result<Vec<Rule>, SpecError> {
            if v.len() > MAX_RULES {
                return Err(SpecError {
                    field: format!("network.egress.{key}"),
                    value: format!("{} rules", v.len()),
                    reason: format!("at most {MAX_RULES}"),
                });
            }
            v.iter()
                .enumerate()
                .map(|(i, r)| Rule::parse(&format!("network.egress.{key}[{i}]"), r))
                .collect()
        };
        Ok(Rules {
            allow: list("allow", &self.allow)?,
            deny: list("deny", &self.deny)?,
        })
    }

    /// Ports the gateway must listen on: 80, 443 and every port a rule names.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = DEFAULT_PORTS.to_vec();
        if let Ok(r) = self.rules() {
            ports.extend(r.allow.iter().filter_map(|r| r.port));
        }
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

impl Rules {
    /// Whether `name` may be resolved at all (on some port).
    pub fn name_allowed(&self, name: &str) -> bool {
        let name = normalize(name);
        self.allow.iter().any(|r| r.name_matches(&name))
            && !self
                .deny
                .iter()
                .any(|r| r.name_matches(&name) && r.port.is_none())
    }

    /// Whether a connection to `name` on `port` may be made.
    pub fn connect_allowed(&self, name: &str, port: u16) -> bool {
        let name = normalize(name);
        self.allow
            .iter()
            .any(|r| r.name_matches(&name) && r.port_matches(port))
            && !self
                .deny
                .iter()
                .any(|r| r.name_matches(&name) && r.port_matches(port))
    }

    /// Whether an allowed name's address `addr` may be connected to on `port`.
    pub fn address_allowed(&self, addr: IpAddr, port: u16) -> bool {
        let IpAddr::V4(v4) = addr else {
            return false;
        };
        let cidr = |r: &&Rule| matches!(r.host, Host::Cidr(..));
        let any_allow_cidr = self.allow.iter().any(|r| cidr(&r));
        let explicitly = self
            .allow
            .iter()
            .any(|r| r.addr_matches(v4) && r.port_matches(port));
        // Link-local (cloud metadata services at 169.254.169.254) only when
        // a CIDR rule names it: a name that resolves there is refused.
        if v4.is_link_local() && !explicitly {
            return false;
        }
        (!any_allow_cidr
            || self
                .allow
                .iter()
                .any(|r| r.addr_matches(v4) && r.port_matches(port)))
            && !self
                .deny
                .iter()
                .any(|r| r.addr_matches(v4) && r.port_matches(port))
    }

    /// Checks that `asked` allows nothing this policy does not: every allow
    /// rule of `asked` lies within one of ours, and every deny rule of ours
    /// is in `asked`. The error names the field and value at fault.
    pub fn narrowed_by(&self, asked: &Rules, raw: &EgressPolicy) -> Result<(), (String, String)> {
        for (i, r) in asked.allow.iter().enumerate() {
            if !self.allow.iter().any(|w| r.within(w)) {
                return Err((
                    format!("network.egress.allow[{i}]"),
                    raw.allow.get(i).cloned().unwrap_or_default(),
                ));
            }
        }
        for d in &self.deny {
            if !asked.deny.contains(d) {
                return Err(("network.egress.deny".into(), raw.deny.join(",")));
            }
        }
        Ok(())
    }
}

fn normalize(name: &str) -> String {
    let n = name.to_ascii_lowercase();
    n.strip_suffix('.').unwrap_or(&n).to_string()
}

fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    let bits = u32::from(addr);
    let m = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Ipv4Addr::from(bits & m)
}

/// A DNS name of letters, digits and '-' in labels of 1..=63, 253 at most.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        EgressPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
        .rules()
        .expect("valid")
    }

    #[test]
    fn names_wildcards_and_ports_match() {
        let r = rules(
            &["pypi.test", "*.github.test", "git.test:9418"],
            &["secret.github.test"],
        );
        assert!(r.connect_allowed("pypi.test", 443));
        assert!(r.connect_allowed("PyPI.test.", 80));
        assert!(!r.connect_allowed("pypi.test", 22));
        assert!(!r.connect_allowed("evil.test", 443));
        assert!(!r.connect_allowed("xpypi.test", 443));
        assert!(r.connect_allowed("api.github.test", 443));
        assert!(
            !r.connect_allowed("github.test", 443),
            "a wildcard is subdomains only"
        );
        assert!(!r.connect_allowed("evilgithub.test", 443));
        assert!(!r.connect_allowed("secret.github.test", 443));
        assert!(!r.name_allowed("secret.github.test"));
        assert!(r.connect_allowed("git.test", 9418));
        assert!(!r.connect_allowed("git.test", 443));
    }

    #[test]
    fn cidrs_bound_where_names_lead() {
        let r = rules(&["pypi.test"], &["169.254.0.0/16", "10.0.0.0/8"]);
        assert!(r.address_allowed("192.0.2.1".parse().expect("ip"), 443));
        assert!(!r.address_allowed("169.254.169.254".parse().expect("ip"), 80));
        assert!(!r.address_allowed("10.1.2.3".parse().expect("ip"), 443));
        assert!(!r.address_allowed("::1".parse().expect("ip"), 443));
        let plain = rules(&["pypi.test"], &[]);
        assert!(
            !plain.address_allowed("169.254.169.254".parse().expect("ip"), 80),
            "metadata is refused without a rule naming it"
        );
        let meta = rules(&["pypi.test", "169.254.169.254/32:80"], &[]);
        assert!(meta.address_allowed("169.254.169.254".parse().expect("ip"), 80));
        let only = rules(&["pypi.test", "192.0.2.0/24"], &[]);
        assert!(only.address_allowed("192.0.2.9".parse().expect("ip"), 443));
        assert!(!only.address_allowed("198.51.100.1".parse().expect("ip"), 443));
    }

    #[test]
    fn bad_rules_name_the_entry() {
        for (bad, why) in [
            ("", "empty"),
            ("pypi.test:0", "port"),
            ("pypi.test:http", "port"),
            ("10.0.0.0/40", "prefix"),
            ("bad name", "domain"),
            ("*", "domain"),
            ("[::1]:443", "IPv6"),
            ("2001:db8::1", "IPv6"),
        ] {
            let e = EgressPolicy {
                allow: vec!["ok.test".into(), bad.into()],
                deny: vec![],
            }
            .rules()
            .expect_err(bad);
            assert_eq!(e.field, "network.egress.allow[1]", "{bad}");
            assert_eq!(e.value, bad);
            assert!(e.reason.contains(why), "{bad}: {}", e.reason);
        }
    }

    #[test]
    fn narrowing_is_checked_rule_by_rule() {
        let base = rules(&["*.test", "pypi.org", "10.0.0.0/8"], &["evil.test"]);
        let raw = |a: &[&str], d: &[&str]| EgressPolicy {
            allow: a.iter().map(|s| s.to_string()).collect(),
            deny: d.iter().map(|s| s.to_string()).collect(),
        };
        let ok = raw(
            &["pypi.test", "*.a.test", "pypi.org:443", "10.1.0.0/16"],
            &["evil.test"],
        );
        assert_eq!(base.narrowed_by(&ok.rules().expect("ok"), &ok), Ok(()));
        for (i, wide) in ["github.com", "pypi.org:22", "*.org", "0.0.0.0/0"]
            .iter()
            .enumerate()
        {
            let asked = raw(&["pypi.test", wide], &["evil.test"]);
            let e = base
                .narrowed_by(&asked.rules().expect("parses"), &asked)
                .expect_err(wide);
            assert_eq!(
                e,
                ("network.egress.allow[1]".to_string(), wide.to_string()),
                "{i}"
            );
        }
        let dropped = raw(&["pypi.test"], &[]);
        let e = base
            .narrowed_by(&dropped.rules().expect("ok"), &dropped)
            .expect_err("deny dropped");
        assert_eq!(e.0, "network.egress.deny");
    }
}
