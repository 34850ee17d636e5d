//! What a client of the service may ask for: the server-side policy between
//! untrusted API and MCP clients and the host.
//!
//! corral runs code nobody trusts, and so does anyone who can reach
//! `corral serve`: a sandbox spec that bind-mounts `/var/run/docker.sock`,
//! adds `SYS_ADMIN` or turns off no-new-privileges is root on the host. So a
//! spec a client sends is checked against the spec it started from (the
//! operator's `defaults`): whatever the client left as the operator wrote it
//! is trusted, and whatever it changed must pass [`ClientPolicy::check_spec`].
//! Clients may choose the image ([`ClientPolicy::check_image`]), resource
//! limits up to the configured maxima, environment values, the working
//! directory, `network: none` (or the default), labels outside corral's
//! namespace, start-up commands and the recovery policy; they may not add
//! host mounts or capabilities, weaken any protection, change the runtime,
//! lower the isolation tier below the operator's, raise it to a tier that
//! does not hold result integrity ([`SandboxSpec::result_integrity`]: e.g.
//! gVisor for sandboxes that start as a user), read the host's
//! environment, lengthen the dead-man switch or set
//! `persistent`. Profiles and pools of the config are the operator's and are
//! not checked here.
//!
//! No IO: whether an image is present on the daemon is the caller's question
//! ([`ImageRule::MustBePresent`]).

use serde::{Deserialize, Serialize};

use crate::spec::{normalize_cap, EnvVar, Limits, SandboxSpec, Security};

/// The policy's knobs (`server.policy` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientPolicy {
    /// Images a client may name: exact references, or prefixes ending in
    /// `*` (`python:3.12*`, `registry.example.com/*`); a listed image is
    /// pulled when missing. Default empty: any image already on the daemon,
    /// and nothing is pulled for a client.
    pub images: Vec<String>,
    /// Largest memory limit a client may ask for, in bytes. Default
    /// 8589934592 (8 GiB).
    pub max_memory: u64,
    /// Most CPUs a client may ask for. Default 4.0.
    pub max_cpus: f64,
    /// Largest process limit a client may ask for. Default 4096.
    pub max_pids: i64,
    /// Largest writable-layer size a client may ask for, in bytes; `None`:
    /// any size (where the storage driver supports the limit at all).
    pub max_disk: Option<u64>,
    /// Let clients send a spec at all; `false`: only profiles and pools of
    /// the config (and the `defaults`). Default true.
    pub inline_specs: bool,
    /// Let clients ask for persistent sandboxes (`"persistent": true`),
    /// whose containers outlive the service and are adopted by the next
    /// request for the same session key, and whose workspace lives in a
    /// host directory. Default false.
    pub allow_persistent: bool,
    /// Destinations (egress rules, `HOST[:PORT]`) a client's own
    /// `network: {egress: ...}` may allow, on top of narrowing the
    /// operator's network; `None`: anything within the operator's network
    /// (everything when it is `bridge`).
    pub egress_allow: Option<Vec<String>>,
}

impl Default for ClientPolicy {
    fn default() -> Self {
        ClientPolicy {
            images: Vec::new(),
            max_memory: 8 << 30,
            max_cpus: 4.0,
            max_pids: 4096,
            max_disk: None,
            inline_specs: true,
            allow_persistent: false,
            egress_allow: None,
        }
    }
}

/// A request the policy refuses: the field (a spec path such as
/// `mounts[0]` or `security.cap_add[1]`, or a request field such as
/// `image`), the value asked for and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} '{value}' is not allowed: {reason}")]
pub struct Refusal {
    /// The field at fault.
    pub field: String,
    /// The value asked for.
    pub value: String,
    /// Why it is refused, and what to do instead.
    pub reason: String,
}

impl Refusal {
    fn new(field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        Refusal {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// What the caller must still check about an image the policy accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRule {
    /// `server.policy.images` lists it: use it (pulling it when missing).
    Listed,
    /// No allow-list: use it only if it is already on the daemon.
    MustBePresent,
}

/// Where the operator's escape hatch is, for every refusal of a spec field.
const USE_A_PROFILE: &str = "only the service's configuration may do that: ask its operator for a \
                             profile (profiles are trusted)";

impl ClientPolicy {
    /// Checks an image a client named (in `image` or a spec).
    pub fn check_image(&self, field: &str, image: &str) -> Result<ImageRule, Refusal> {
        if self.images.is_empty() {
            return Ok(ImageRule::MustBePresent);
        }
        let listed = self
            .images
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => image.starts_with(prefix),
                None => image == pattern,
            });
        if listed {
            Ok(ImageRule::Listed)
        } else {
            Err(Refusal::new(
                field,
                image,
                format!(
                    "not among the images this service allows (server.policy.images: {})",
                    self.images.join(", ")
                ),
            ))
        }
    }

    /// Checks the limits against the maxima (a spec without `base`, or a
    /// field the client changed).
    fn check_limits(&self, base: &Limits, asked: &Limits) -> Result<(), Refusal> {
        let Limits {
            memory,
            cpus,
            pids,
            disk,
        } = asked;
        limit("limits.memory", base.memory, *memory, Some(self.max_memory))?;
        limit("limits.cpus", base.cpus, *cpus, Some(self.max_cpus))?;
        limit("limits.pids", base.pids, *pids, Some(self.max_pids))?;
        limit("limits.disk", base.disk, *disk, self.max_disk)?;
        Ok(())
    }

    /// Checks a client's network against the operator's: `none` always, the
    /// operator's own, or an egress policy that narrows the operator's (any
    /// policy under `bridge`), and within [`ClientPolicy::egress_allow`].
    pub fn check_network(
        &self,
        base: &crate::Network,
        asked: &crate::Network,
    ) -> Result<(), Refusal> {
        use crate::Network;
        if asked == base || *asked == Network::None {
            return Ok(());
        }
        let Network::Egress(policy) = asked else {
            return Err(Refusal::new(
                "network",
                asked.as_str(),
                format!(
                    "clients may ask for none, the service's default ({}) or an egress policy \
                     within it",
                    base.as_str()
                ),
            ));
        };
        let rules = policy
            .rules()
            .map_err(|e| Refusal::new(e.field, e.value, e.reason))?;
        match base {
            Network::Egress(wide) => {
                let wide_rules = wide
                    .rules()
                    .map_err(|e| Refusal::new(e.field, e.value, e.reason))?;
                wide_rules
                    .narrowed_by(&rules, policy)
                    .map_err(|(field, value)| {
                        Refusal::new(
                            field,
                            value,
                            format!(
                                "a client may narrow the service's egress policy, never widen it \
                             (allowed: {}; denied: {})",
                                wide.allow.join(", "),
                                if wide.deny.is_empty() {
                                    "nothing".into()
                                } else {
                                    wide.deny.join(", ")
                                }
                            ),
                        )
                    })?;
            }
            Network::None => {
                return Err(Refusal::new(
                    "network",
                    asked.as_str(),
                    "the service gives sandboxes no network; clients may not add any",
                ))
            }
            Network::Bridge => {}
        }
        if let Some(limit) = &self.egress_allow {
            let limit_policy = crate::egress::EgressPolicy {
                allow: limit.clone(),
                deny: Vec::new(),
            };
            let limit_rules = limit_policy
                .rules()
                .map_err(|e| Refusal::new("server.policy.egress_allow", e.value, e.reason))?;
            for (i, r) in rules.allow.iter().enumerate() {
                if !limit_rules.allow.iter().any(|w| r.within(w)) {
                    return Err(Refusal::new(
                        format!("network.egress.allow[{i}]"),
                        &policy.allow[i],
                        format!("the service lets clients allow only {}", limit.join(", ")),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks `asked`, the spec a client's request resolved to, against
    /// `base`, the operator's spec it was made from: every field that
    /// differs must be one a client may set. The image is checked by
    /// [`ClientPolicy::check_image`], not here.
    pub fn check_spec(&self, base: &SandboxSpec, asked: &SandboxSpec) -> Result<(), Refusal> {
        // Named field by field, so a new field of SandboxSpec does not
        // compile until this policy has a rule for it.
        let SandboxSpec {
            image: _,
            workdir: _,
            env,
            expand_host_env,
            mounts,
            limits,
            tmpfs,
            security,
            network,
            runtime,
            isolation,
            labels,
            agent_grace_ms,
            recovery: _,
            startup: _,
            persistent,
            // Commands gain nothing from it (the agent's extra capabilities
            // never reach them; tested by attack).
            pristine: _,
        } = asked;
        if persistent.is_some() && *persistent != base.persistent {
            return Err(Refusal::new(
                "persistent",
                persistent.as_deref().unwrap_or_default(),
                "set by the service for persistent sessions, never by a client (ask for \
                 \"persistent\": true in the request when the service allows it)",
            ));
        }
        for (i, m) in mounts.iter().enumerate() {
            let trusted = base.mounts.iter().any(|b| {
                b.host == m.host
                    && b.container == m.container
                    && (m.read_only || !b.read_only)
                    && (m.nosuid || !b.nosuid)
            });
            if !trusted {
                return Err(Refusal::new(
                    format!("mounts[{i}]"),
                    format!("{}:{}", m.host, m.container),
                    format!("host mounts are refused to API clients; {USE_A_PROFILE}"),
                ));
            }
        }
        if *expand_host_env && !base.expand_host_env {
            return Err(Refusal::new(
                "expand_host_env",
                true,
                format!("the service's environment is not the client's to read; {USE_A_PROFILE}"),
            ));
        }
        for (i, var) in env.iter().enumerate() {
            if base.env.contains(var) {
                continue;
            }
            match var {
                EnvVar::Forward { forward } => {
                    return Err(Refusal::new(
                        format!("env[{i}]"),
                        format!("forward {forward}"),
                        "forwarding the service's environment variables is refused to API \
                         clients; send the value instead",
                    ))
                }
                EnvVar::Set { name, value } if *expand_host_env && value.starts_with('$') => {
                    return Err(Refusal::new(
                        format!("env[{i}].value"),
                        value,
                        format!(
                            "{name} would be expanded from the service's environment \
                             (expand_host_env is on); send the value instead"
                        ),
                    ))
                }
                EnvVar::Set { .. } => {}
            }
        }
        self.check_limits(&base.limits, limits)?;
        if *tmpfs != base.tmpfs {
            let i = tmpfs
                .iter()
                .zip(&base.tmpfs)
                .position(|(a, b)| a != b)
                .unwrap_or(tmpfs.len().min(base.tmpfs.len()));
            let value = tmpfs
                .get(i)
                .map(|t| format!("{} size={} {}", t.path, t.size, t.options))
                .unwrap_or_else(|| "(removed)".into());
            return Err(Refusal::new(
                format!("tmpfs[{i}]"),
                value,
                format!("the size-limited tmpfs mounts are part of the hardening; {USE_A_PROFILE}"),
            ));
        }
        check_security(&base.security, security)?;
        self.check_network(&base.network, network)?;
        if *runtime != base.runtime {
            return Err(Refusal::new(
                "runtime",
                runtime.as_deref().unwrap_or("(the daemon's default)"),
                format!("the OCI runtime is the service's choice; {USE_A_PROFILE}"),
            ));
        }
        if *isolation < base.isolation {
            return Err(Refusal::new(
                "isolation",
                isolation,
                format!(
                    "the service runs sandboxes under {} isolation; clients may raise it \
                     (to a tier that holds result integrity), never lower it",
                    base.isolation
                ),
            ));
        }
        if *isolation != base.isolation {
            if let Err(why) = asked.result_integrity() {
                return Err(Refusal::new(
                    "isolation",
                    isolation,
                    format!(
                        "{why}; clients may raise the isolation only to a tier that holds \
                         result integrity, so {USE_A_PROFILE}"
                    ),
                ));
            }
        }
        for (key, value) in labels {
            match base.labels.get(key) {
                Some(v) if v == value => {}
                Some(v) => {
                    return Err(Refusal::new(
                        format!("labels.{key}"),
                        value,
                        format!("the service's configuration sets this label (to '{v}')"),
                    ))
                }
                None if reserved_label(key) => {
                    return Err(Refusal::new(
                        format!("labels.{key}"),
                        value,
                        "labels starting with 'corral.' are corral's own: they mark sandboxes, \
                         their owners and persistent sessions",
                    ))
                }
                None => {}
            }
        }
        if let Some(key) = base.labels.keys().find(|k| !labels.contains_key(*k)) {
            return Err(Refusal::new(
                format!("labels.{key}"),
                "(removed)",
                "the service's configuration sets this label",
            ));
        }
        if *agent_grace_ms > base.agent_grace_ms {
            return Err(Refusal::new(
                "agent_grace_ms",
                agent_grace_ms,
                format!(
                    "at most the service's {} ms: a longer dead-man switch keeps a sandbox \
                     alive longer after the service is gone",
                    base.agent_grace_ms
                ),
            ));
        }
        Ok(())
    }
}

impl ClientPolicy {
    /// Checks `fork`, the spec a sandbox started from a snapshot would get
    /// (`SnapshotInfo::fork_spec`), against `base`, the operator's spec a
    /// client's sandbox is made from: as [`ClientPolicy::check_spec`] does
    /// for a create, with the differences a snapshot legitimately carries
    /// (its image, no start-up commands, not persistent) taken over into
    /// `base`. A snapshot of a sandbox with settings only the operator may
    /// give (a host mount, an added capability, a profile's limits) is
    /// refused, naming the field. Without inline specs a fork must have the
    /// operator's spec exactly. The image is the caller's to check: a
    /// snapshot's image is corral's own when the runtime listed it.
    pub fn check_fork(&self, base: &SandboxSpec, fork: &SandboxSpec) -> Result<(), Refusal> {
        let mut base = base.clone();
        base.image = fork.image.clone();
        base.startup.clear();
        base.persistent = None;
        self.check_spec(&base, fork)?;
        if !self.inline_specs && *fork != base {
            return Err(Refusal::new(
                "spec",
                "(the snapshot's)",
                "this service gives clients only its own specs (server.policy.inline_specs is \
                 false), and the snapshot was taken of a sandbox with another",
            ));
        }
        Ok(())
    }

    /// The policy of a client that may not choose a spec at all (an MCP
    /// session): what [`ClientPolicy::check_spec`] allows, but no limit
    /// above the operator's own.
    pub fn no_raise() -> ClientPolicy {
        ClientPolicy {
            max_memory: 0,
            max_cpus: 0.0,
            max_pids: 0,
            max_disk: Some(0),
            ..ClientPolicy::default()
        }
    }
}

/// Keys in corral's label namespace, in any letter case.
fn reserved_label(key: &str) -> bool {
    key.get(..crate::labels::PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(crate::labels::PREFIX))
}

/// A limit the client may lower, or raise up to `max` (or up to the
/// operator's own value when that is higher), but not remove.
fn limit<T: PartialOrd + Copy + std::fmt::Display>(
    field: &str,
    base: Option<T>,
    asked: Option<T>,
    max: Option<T>,
) -> Result<(), Refusal> {
    if asked == base {
        return Ok(());
    }
    let key = field.trim_start_matches("limits.");
    let Some(v) = asked else {
        return Err(Refusal::new(
            field,
            "null",
            match max {
                Some(m) => format!("removing a limit is refused; ask for at most {m}"),
                None => "removing a limit is refused".to_string(),
            },
        ));
    };
    let ceiling = match (max, base) {
        (Some(m), Some(b)) if b > m => Some(b),
        (Some(m), _) => Some(m),
        (None, _) => None,
    };
    match ceiling {
        Some(c) if v > c => Err(Refusal::new(
            field,
            v,
            format!("above this service's maximum {c} (server.policy.max_{key})"),
        )),
        _ => Ok(()),
    }
}

fn check_security(base: &Security, asked: &Security) -> Result<(), Refusal> {
    let Security {
        drop_all_caps,
        cap_add,
        setuid_caps,
        no_new_privileges,
        read_only_root,
        user,
    } = asked;
    let weakened = |field: &str, value: bool| {
        Err(Refusal::new(
            format!("security.{field}"),
            value,
            format!("turning off a protection is refused to API clients; {USE_A_PROFILE}"),
        ))
    };
    if base.drop_all_caps && !drop_all_caps {
        return weakened("drop_all_caps", false);
    }
    if base.no_new_privileges && !no_new_privileges {
        return weakened("no_new_privileges", false);
    }
    if base.read_only_root && !read_only_root {
        return weakened("read_only_root", false);
    }
    let allowed = base.effective_cap_add();
    for (i, cap) in cap_add.iter().enumerate() {
        if !allowed.contains(&normalize_cap(cap)) {
            return Err(Refusal::new(
                format!("security.cap_add[{i}]"),
                cap,
                format!(
                    "adding capabilities is refused to API clients (the service allows {}); \
                     {USE_A_PROFILE}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    if *setuid_caps && !base.setuid_caps {
        return Err(Refusal::new(
            "security.setuid_caps",
            true,
            format!("adding capabilities is refused to API clients; {USE_A_PROFILE}"),
        ));
    }
    if base.user.is_some() && *user != base.user {
        return Err(Refusal::new(
            "security.user",
            user.as_deref().unwrap_or("(the image's)"),
            format!(
                "the service runs sandboxes as '{}'",
                base.user.as_deref().unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Mount, Tmpfs};
    use crate::Network;

    fn refused(base: &SandboxSpec, asked: &SandboxSpec) -> Refusal {
        ClientPolicy::default()
            .check_spec(base, asked)
            .expect_err("should be refused")
    }

    #[test]
    fn an_unchanged_spec_and_the_allowed_changes_pass() {
        let base = SandboxSpec::new("img");
        let p = ClientPolicy::default();
        p.check_spec(&base, &base).expect("the operator's own spec");
        let mut asked = base.clone();
        asked.image = "other".into();
        asked.workdir = Some("/work".into());
        asked.env.push(EnvVar::Set {
            name: "A".into(),
            value: "$HOME".into(),
        });
        asked.limits.memory = Some(2 << 30);
        asked.limits.cpus = Some(4.0);
        asked.limits.disk = Some(1 << 30);
        asked.network = Network::None;
        asked.labels.insert("team".into(), "rl".into());
        asked.security.read_only_root = true;
        asked.security.user = Some("1000".into());
        asked.security.cap_add = vec!["cap_chown".into()];
        asked.agent_grace_ms = 1_000;
        asked.startup.push("true".into());
        asked.recovery = crate::Recovery::Recreate;
        p.check_spec(&base, &asked).expect("allowed changes");
    }

    #[test]
    fn isolation_is_raised_only_to_a_tier_that_holds_result_integrity_never_lowered() {
        let p = ClientPolicy::default();
        let container = SandboxSpec::new("img");
        let mut gvisor = container.clone();
        gvisor.isolation = crate::Isolation::Gvisor;
        p.check_spec(&container, &gvisor)
            .expect("a client may ask for the stronger tier, which holds result integrity");
        // Not where it does not: gVisor for sandboxes that start as a user.
        let mut as_user = container.clone();
        as_user.security.user = Some("1000".into());
        let mut gvisor_as_user = as_user.clone();
        gvisor_as_user.isolation = crate::Isolation::Gvisor;
        let why = gvisor_as_user.result_integrity().expect_err("a user");
        let e = refused(&as_user, &gvisor_as_user);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("isolation", "gvisor")
        );
        assert!(e.reason.starts_with(&why), "{e}");
        assert!(e.reason.contains("profile"), "{e}");
        // The operator's gVisor stays the client's to keep.
        p.check_spec(&gvisor, &gvisor).expect("the operator's tier");
        let e = refused(&gvisor, &container);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("isolation", "container")
        );
        assert!(e.reason.contains("gvisor"), "{e}");
    }

    #[test]
    fn each_attack_is_refused_by_field() {
        let base = SandboxSpec::new("img");
        let case = |f: &dyn Fn(&mut SandboxSpec)| {
            let mut asked = base.clone();
            f(&mut asked);
            refused(&base, &asked)
        };
        let e = case(&|s| {
            s.mounts.push(Mount {
                host: "/var/run/docker.sock".into(),
                container: "/d.sock".into(),
                read_only: true,
                nosuid: false,
            })
        });
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("mounts[0]", "/var/run/docker.sock:/d.sock")
        );
        let e = case(&|s| s.security.no_new_privileges = false);
        assert_eq!(e.field, "security.no_new_privileges");
        let e = case(&|s| s.security.drop_all_caps = false);
        assert_eq!(e.field, "security.drop_all_caps");
        let e = case(&|s| s.security.cap_add.push("SYS_ADMIN".into()));
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("security.cap_add[3]", "SYS_ADMIN")
        );
        let e = case(&|s| s.security.setuid_caps = true);
        assert_eq!(e.field, "security.setuid_caps");
        let e = case(&|s| {
            s.env.push(EnvVar::Forward {
                forward: "AWS_SECRET_ACCESS_KEY".into(),
            })
        });
        assert_eq!(e.field, "env[0]");
        assert!(e.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{e}");
        let e = case(&|s| s.expand_host_env = true);
        assert_eq!(e.field, "expand_host_env");
        let e = case(&|s| s.runtime = Some("runc".into()));
        assert_eq!(e.field, "runtime");
        let e = case(&|s| {
            s.labels.insert("Corral.Persistent".into(), "true".into());
        });
        assert_eq!(e.field, "labels.Corral.Persistent");
        let e = case(&|s| s.persistent = Some("victim".into()));
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("persistent", "victim")
        );
        let e = case(&|s| s.limits.memory = Some(64 << 30));
        assert_eq!(e.field, "limits.memory");
        assert!(e.reason.contains("server.policy.max_memory"), "{e}");
        let e = case(&|s| s.limits.pids = None);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("limits.pids", "null")
        );
        let e = case(&|s| s.limits.cpus = Some(64.0));
        assert_eq!(e.field, "limits.cpus");
        let e = case(&|s| {
            s.tmpfs.remove(0);
        });
        assert_eq!(e.field, "tmpfs[0]");
        let e = case(&|s| s.tmpfs[2].options = "nodev".into());
        assert_eq!(e.field, "tmpfs[2]");
        let e = case(&|s| s.agent_grace_ms = 3_600_000);
        assert_eq!(e.field, "agent_grace_ms");
        let mut none = base.clone();
        none.network = Network::None;
        let mut bridge = none.clone();
        bridge.network = Network::Bridge;
        assert_eq!(refused(&none, &bridge).field, "network");
    }

    #[test]
    fn a_client_egress_policy_may_narrow_never_widen() {
        use crate::egress::EgressPolicy;
        let egress = |allow: &[&str], deny: &[&str]| {
            Network::Egress(EgressPolicy {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            })
        };
        let p = ClientPolicy::default();
        let base = egress(&["*.test", "pypi.org"], &["evil.test"]);
        p.check_network(&base, &egress(&["pypi.test"], &["evil.test"]))
            .expect("narrower");
        p.check_network(&base, &Network::None).expect("none");
        let e = p
            .check_network(&base, &egress(&["pypi.test", "github.com"], &["evil.test"]))
            .expect_err("wider");
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("network.egress.allow[1]", "github.com")
        );
        assert!(e.reason.contains("never widen"), "{}", e.reason);
        let e = p
            .check_network(&base, &egress(&["pypi.test"], &[]))
            .expect_err("deny dropped");
        assert_eq!(e.field, "network.egress.deny");
        let e = p
            .check_network(&base, &Network::Bridge)
            .expect_err("bridge");
        assert_eq!((e.field.as_str(), e.value.as_str()), ("network", "bridge"));
        let e = p
            .check_network(&Network::None, &egress(&["pypi.test"], &[]))
            .expect_err("none base");
        assert_eq!(e.field, "network");
        // Under bridge any policy narrows; the service's egress_allow bounds it.
        p.check_network(&Network::Bridge, &egress(&["github.com"], &[]))
            .expect("narrows bridge");
        let limited = ClientPolicy {
            egress_allow: Some(vec!["*.test".into()]),
            ..ClientPolicy::default()
        };
        limited
            .check_network(&Network::Bridge, &egress(&["pypi.test"], &[]))
            .expect("within egress_allow");
        let e = limited
            .check_network(
                &Network::Bridge,
                &egress(&["pypi.test", "github.com:443"], &[]),
            )
            .expect_err("outside egress_allow");
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("network.egress.allow[1]", "github.com:443")
        );
        let e = p
            .check_network(&Network::Bridge, &egress(&["bad name"], &[]))
            .expect_err("invalid rule");
        assert_eq!(e.field, "network.egress.allow[0]");
    }

    #[test]
    fn what_the_operator_wrote_stays_trusted_but_is_not_widened() {
        let mut base = SandboxSpec::new("img");
        base.mounts.push(Mount {
            host: "/srv/data".into(),
            container: "/data".into(),
            read_only: true,
            nosuid: true,
        });
        base.env.push(EnvVar::Forward {
            forward: "TERM".into(),
        });
        base.expand_host_env = true;
        base.labels.insert("corral.x".into(), "op".into());
        base.security.user = Some("1000".into());
        base.limits.memory = Some(16 << 30);
        base.tmpfs = vec![Tmpfs {
            path: "/tmp".into(),
            size: 1 << 20,
            options: String::new(),
        }];
        let p = ClientPolicy::default();
        p.check_spec(&base, &base).expect("the operator's spec");
        let mut asked = base.clone();
        asked.limits.memory = Some(12 << 30);
        p.check_spec(&base, &asked)
            .expect("lowering the operator's limit, even above the maximum");
        asked.mounts[0].read_only = false;
        assert_eq!(refused(&base, &asked).field, "mounts[0]");
        let mut asked = base.clone();
        asked.mounts[0].nosuid = false;
        assert_eq!(refused(&base, &asked).field, "mounts[0]");
        let mut asked = base.clone();
        asked.env.push(EnvVar::Set {
            name: "K".into(),
            value: "$SECRET".into(),
        });
        assert_eq!(refused(&base, &asked).field, "env[1].value");
        let mut asked = base.clone();
        asked.labels.insert("corral.x".into(), "mine".into());
        assert_eq!(refused(&base, &asked).field, "labels.corral.x");
        asked.labels.clear();
        assert_eq!(refused(&base, &asked).field, "labels.corral.x");
        let mut asked = base.clone();
        asked.security.user = Some("0".into());
        assert_eq!(refused(&base, &asked).field, "security.user");
    }

    #[test]
    fn images_follow_the_allow_list() {
        let p = ClientPolicy::default();
        assert_eq!(
            p.check_image("image", "anything"),
            Ok(ImageRule::MustBePresent)
        );
        let p = ClientPolicy {
            images: vec!["python:3.12*".into(), "corral-test/busybox".into()],
            ..ClientPolicy::default()
        };
        assert_eq!(
            p.check_image("image", "python:3.12-slim"),
            Ok(ImageRule::Listed)
        );
        assert_eq!(
            p.check_image("image", "corral-test/busybox"),
            Ok(ImageRule::Listed)
        );
        let e = p
            .check_image("spec.image", "corral-test/busybox:evil")
            .expect_err("not listed");
        assert_eq!(e.field, "spec.image");
        assert!(e.to_string().contains("server.policy.images"), "{e}");
    }

    #[test]
    fn forks_pass_only_with_what_a_client_could_ask_for() {
        let base = SandboxSpec::new("img");
        let p = ClientPolicy::default();
        let mut fork = base.clone();
        fork.image = "corral-snapshot:prepared".into();
        fork.env.push(EnvVar::Set {
            name: "A".into(),
            value: "1".into(),
        });
        p.check_fork(&base, &fork).expect("a client's own snapshot");
        let mut withstartup = base.clone();
        withstartup.startup.push("make".into());
        p.check_fork(&withstartup, &fork)
            .expect("start-up commands are not run again");
        let mut mounted = fork.clone();
        mounted.mounts.push(Mount {
            host: "/".into(),
            container: "/host".into(),
            read_only: false,
            nosuid: false,
        });
        let e = p.check_fork(&base, &mounted).expect_err("a host mount");
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("mounts[0]", "/:/host")
        );
        let strict = ClientPolicy {
            inline_specs: false,
            ..ClientPolicy::default()
        };
        assert_eq!(
            strict.check_fork(&base, &fork).expect_err("env").field,
            "spec"
        );
        let mut same = base.clone();
        same.image = "corral-snapshot:x".into();
        strict
            .check_fork(&base, &same)
            .expect("the operator's spec");

        let mut limited = base.clone();
        limited.limits.memory = Some(1 << 30);
        let mut lower = limited.clone();
        lower.limits.memory = Some(512 << 20);
        ClientPolicy::no_raise()
            .check_fork(&limited, &lower)
            .expect("lower");
        lower.limits.memory = Some(2 << 30);
        let e = ClientPolicy::no_raise()
            .check_fork(&limited, &lower)
            .expect_err("higher");
        assert_eq!(e.field, "limits.memory");
    }
}
