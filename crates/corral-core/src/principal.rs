//! Principals: who a request acts as, and the one place that decides what
//! each may do with a sandbox session or a snapshot.
//!
//! Every front end turns its caller into a [`Principal`] before it touches
//! anything: the CLI on the host is the operator; `corral serve` maps a
//! bearer token to the operator (`server.admin_token`) or to a tenant
//! (`server.token` is tenant `default`, each of `server.tenants` names
//! one); an MCP session is a principal of its own, acting for the tenant
//! that opened it. Front ends then ask [`Principal::may_session`] and
//! [`Principal::may_snapshot`] and never decide ownership themselves.
//!
//! Objects are namespaced by their owner, so two tenants may both call a
//! session `ep-1` or a snapshot `repo-ready` without meeting:
//! - a session key becomes the provider key [`Principal::session_key`]
//!   (`alice:ep-1`; tenant `default` and the operator keep bare keys, so a
//!   single-token service's persistent sessions keep their names);
//! - a snapshot lives in its owner's namespace
//!   ([`Principal::snapshot_namespace`]: none for the operator, `alice` for
//!   a tenant, `alice.mcp-<id>` for one of its MCP sessions), written
//!   `namespace/name` when qualified ([`QualifiedName`]).
//!
//! What is not one's own is answered as absent (the front ends turn a
//! refusal into 404), so a tenant cannot learn what another holds. The
//! operator may share its own snapshots read-only: with every tenant
//! (`server.shared_snapshots`) or with MCP sessions
//! (`server.mcp_snapshots`).

use std::fmt;

use crate::snapshot::SnapshotInfo;
use crate::SpecError;

/// The tenant a single `server.token` (or `CORRAL_TOKEN`) stands for.
pub const DEFAULT_TENANT: &str = "default";

/// Name reserved for the operator in namespaces (`operator.mcp-...`).
const OPERATOR: &str = "operator";

/// Longest tenant name.
pub const MAX_TENANT: usize = 32;

/// Separates a tenant from its key in a provider key (`alice:ep-1`);
/// clients' keys cannot hold it.
pub const KEY_SEPARATOR: char = ':';

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The operator: the CLI on the host, the service's admin token, the
    /// owner of its Unix socket. May do anything.
    Operator,
    /// A tenant of the service, by name.
    Tenant(String),
    /// An MCP session (the model): acts for `tenant` (`None`: the
    /// operator, e.g. `corral mcp` on stdio), but only on its own sandbox
    /// and snapshots, plus the operator's snapshots shared with MCP.
    Mcp {
        /// The tenant it acts for; `None` for the operator.
        tenant: Option<String>,
        /// The session's own id (`mcp-<hex>`).
        session: String,
    },
}

/// What a principal wants to do with a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotAccess {
    /// See it listed, inspect it, fork or restore from it.
    Read,
    /// Take it (create or overwrite) or delete it.
    Write,
}

/// What looking a snapshot up by name found for a principal
/// ([`Principal::find_snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SnapshotLookup<'a> {
    /// One it may act on as asked; `read_only` when it may not write it.
    Found {
        /// The snapshot.
        info: &'a SnapshotInfo,
        /// It may read it only (an operator's shared one).
        read_only: bool,
    },
    /// One it may read but was asked to write (an operator's shared one).
    ReadOnly(&'a SnapshotInfo),
    /// None it may see: answered as absent.
    Absent,
}

/// The operator's snapshots it shares read-only (by name, in its own
/// namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sharing {
    /// Readable by every tenant (`server.shared_snapshots`).
    pub tenants: Vec<String>,
    /// Readable by every MCP session (`server.mcp_snapshots`).
    pub mcp: Vec<String>,
}

/// A snapshot name with its namespace: `name` (the operator's) or
/// `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    /// The owner's namespace; `None` for the operator's.
    pub namespace: Option<String>,
    /// The name within it.
    pub name: String,
}

impl QualifiedName {
    /// Parses `name` or `namespace/name`, checking both parts.
    pub fn parse(text: &str) -> Result<QualifiedName, SpecError> {
        let (namespace, name) = match text.split_once('/') {
            None => (None, text),
            Some((ns, name)) => {
                validate_namespace(ns).map_err(|reason| SpecError {
                    field: "name".into(),
                    value: text.into(),
                    reason,
                })?;
                (Some(ns.to_string()), name)
            }
        };
        crate::snapshot::validate_name(name).map_err(|mut e| {
            e.value = text.into();
            e
        })?;
        Ok(QualifiedName {
            namespace,
            name: name.to_string(),
        })
    }

    /// The operator's snapshot `name`.
    pub fn operator(name: &str) -> QualifiedName {
        QualifiedName {
            namespace: None,
            name: name.to_string(),
        }
    }

    /// Who owns a snapshot in this namespace.
    pub fn owner(&self) -> Principal {
        owner_of_namespace(self.namespace.as_deref())
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            None => f.write_str(&self.name),
            Some(ns) => write!(f, "{ns}/{}", self.name),
        }
    }
}

/// Checks a tenant name: 1 to 32 of `a-z 0-9 -`, starting and ending with
/// a letter or digit, not `operator`. It becomes part of provider keys,
/// snapshot namespaces and image references.
pub fn validate_tenant(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(format!(
            "a tenant name is 1 to {MAX_TENANT} lower-case letters, digits and '-', starting \
             and ending with a letter or digit"
        ));
    }
    if name == OPERATOR {
        return Err("'operator' is reserved for the operator".into());
    }
    Ok(())
}

/// Checks a snapshot namespace: a tenant, or `<tenant|operator>.mcp-<id>`.
fn validate_namespace(ns: &str) -> Result<(), String> {
    let (owner, session) = match ns.split_once('.') {
        None => (ns, None),
        Some((o, s)) => (o, Some(s)),
    };
    match session {
        None => validate_tenant(owner),
        Some(s) => {
            if owner != OPERATOR {
                validate_tenant(owner)?;
            }
            let id = s.strip_prefix("mcp-").unwrap_or_default();
            if id.is_empty()
                || id.len() > 64
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(format!(
                    "namespace '{ns}' is not a tenant or an MCP session's (TENANT.mcp-ID)"
                ));
            }
            Ok(())
        }
    }
}

/// The owner of snapshots in namespace `ns` (`None`: the operator's).
fn owner_of_namespace(ns: Option<&str>) -> Principal {
    match ns {
        None => Principal::Operator,
        Some(ns) => match ns.split_once('.') {
            None => Principal::Tenant(ns.to_string()),
            Some((owner, session)) => Principal::Mcp {
                tenant: (owner != OPERATOR).then(|| owner.to_string()),
                session: session.to_string(),
            },
        },
    }
}

impl Principal {
    /// A stable text form for logs, listings and labels: `operator`,
    /// `tenant:alice`, `mcp:alice:mcp-...` (`mcp:operator:...`).
    pub fn id(&self) -> String {
        match self {
            Principal::Operator => OPERATOR.to_string(),
            Principal::Tenant(t) => format!("tenant:{t}"),
            Principal::Mcp { tenant, session } => {
                format!("mcp:{}:{session}", tenant.as_deref().unwrap_or(OPERATOR))
            }
        }
    }

    /// The principal whose [`Principal::id`] is `id`; `None` for text no
    /// principal prints.
    pub fn from_id(id: &str) -> Option<Principal> {
        if id == OPERATOR {
            return Some(Principal::Operator);
        }
        if let Some(t) = id.strip_prefix("tenant:") {
            return (!t.is_empty() && !t.contains(KEY_SEPARATOR))
                .then(|| Principal::Tenant(t.to_string()));
        }
        let (tenant, session) = id.strip_prefix("mcp:")?.split_once(KEY_SEPARATOR)?;
        if tenant.is_empty() || session.is_empty() || session.contains(KEY_SEPARATOR) {
            return None;
        }
        Some(Principal::Mcp {
            tenant: (tenant != OPERATOR).then(|| tenant.to_string()),
            session: session.to_string(),
        })
    }

    /// The tenant whose quotas it spends; `None` for the operator and its
    /// MCP sessions.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t),
            Principal::Mcp { tenant, .. } => tenant.as_deref(),
        }
    }

    /// An MCP session of this principal (the tenant it acts for, or the
    /// operator's when this is the operator).
    pub fn mcp_session(&self, session: &str) -> Principal {
        Principal::Mcp {
            tenant: self.tenant().map(str::to_string),
            session: session.to_string(),
        }
    }

    /// The namespace its snapshots live in: `None` for the operator's.
    pub fn snapshot_namespace(&self) -> Option<String> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t.clone()),
            Principal::Mcp { tenant, session } => Some(format!(
                "{}.{session}",
                tenant.as_deref().unwrap_or(OPERATOR)
            )),
        }
    }

    /// The snapshot `name` as this principal names it: a qualified name as
    /// given, else the name in its own namespace.
    pub fn own_snapshot(&self, name: &str) -> Result<QualifiedName, SpecError> {
        let mut q = QualifiedName::parse(name)?;
        if q.namespace.is_none() && !name.contains('/') {
            q.namespace = self.snapshot_namespace();
        }
        Ok(q)
    }

    /// Where to look for snapshot `name`, in order: a qualified name as
    /// given; else its own namespace, then the operator's (which it may
    /// read only when shared with it, see [`Principal::may_snapshot`]).
    pub fn snapshot_candidates(&self, name: &str) -> Result<Vec<QualifiedName>, SpecError> {
        let q = QualifiedName::parse(name)?;
        if name.contains('/') || matches!(self, Principal::Operator) {
            return Ok(vec![q]);
        }
        Ok(vec![
            QualifiedName {
                namespace: self.snapshot_namespace(),
                name: q.name.clone(),
            },
            q,
        ])
    }

    /// How this principal sees a snapshot's name: bare when it is in its
    /// own namespace (or the operator's, for the operator), else qualified.
    pub fn display_snapshot(&self, q: &QualifiedName) -> String {
        if q.namespace == self.snapshot_namespace() {
            q.name.clone()
        } else {
            q.to_string()
        }
    }

    /// Whether it may `access` snapshot `q`. Refusals are answered as if
    /// the snapshot did not exist.
    pub fn may_snapshot(
        &self,
        access: SnapshotAccess,
        q: &QualifiedName,
        sharing: &Sharing,
    ) -> bool {
        let ns = q.namespace.as_deref();
        match self {
            Principal::Operator => true,
            Principal::Tenant(t) => match ns {
                // Its own, and its MCP sessions' (they spend its quota).
                Some(ns) => {
                    ns == t
                        || ns
                            .strip_prefix(t.as_str())
                            .is_some_and(|r| r.starts_with(".mcp-"))
                }
                None => access == SnapshotAccess::Read && sharing.tenants.contains(&q.name),
            },
            Principal::Mcp { .. } => match ns {
                Some(ns) => Some(ns) == self.snapshot_namespace().as_deref(),
                None => access == SnapshotAccess::Read && sharing.mcp.contains(&q.name),
            },
        }
    }

    /// Whether it may start a sandbox from `image`, a reference it named
    /// itself: one that points into a snapshot repository, however
    /// spelled ([`crate::image_ref::Reference::snapshot_namespace`]), only
    /// when it may read that snapshot. A snapshot is another's files, and
    /// naming its image must not get round [`Principal::may_snapshot`].
    /// A reference the engine resolves to a snapshot's image by other
    /// means (an image id, a digest) is the caller's to check with
    /// [`Principal::may_snapshot`] on what the engine found.
    pub fn may_name_image(&self, image: &str, sharing: &Sharing) -> bool {
        let reference = crate::image_ref::Reference::parse(image);
        let Some(namespace) = reference.snapshot_namespace() else {
            return true;
        };
        // Without a tag an engine takes `latest`; a digest alone names no
        // snapshot that could have been shared by name.
        let name = match (reference.tag, &reference.digest) {
            (Some(tag), _) => tag,
            (None, None) => "latest".to_string(),
            (None, Some(_)) => String::new(),
        };
        let q = QualifiedName { namespace, name };
        self.may_snapshot(SnapshotAccess::Read, &q, sharing)
    }

    /// Snapshot `name` among `all`, as this principal names it and may
    /// `access` it: the first of [`Principal::snapshot_candidates`] that
    /// exists and it may see. Every front end looks snapshots up here.
    pub fn find_snapshot<'a>(
        &self,
        name: &str,
        all: &'a [SnapshotInfo],
        access: SnapshotAccess,
        sharing: &Sharing,
    ) -> Result<SnapshotLookup<'a>, SpecError> {
        for q in self.snapshot_candidates(name)? {
            let Some(info) = all.iter().find(|i| i.qualified() == q) else {
                continue;
            };
            let writable = self.may_snapshot(SnapshotAccess::Write, &q, sharing);
            let readable = writable || self.may_snapshot(SnapshotAccess::Read, &q, sharing);
            match access {
                SnapshotAccess::Write if writable => {
                    return Ok(SnapshotLookup::Found {
                        info,
                        read_only: false,
                    })
                }
                SnapshotAccess::Write if readable => return Ok(SnapshotLookup::ReadOnly(info)),
                SnapshotAccess::Read if readable => {
                    return Ok(SnapshotLookup::Found {
                        info,
                        read_only: !writable,
                    })
                }
                _ => {}
            }
        }
        Ok(SnapshotLookup::Absent)
    }

    /// The provider key of session `key` as this principal names it. The
    /// operator may name another tenant's with its provider key
    /// (`alice:ep-1`).
    pub fn session_key(&self, key: &str) -> String {
        match self {
            Principal::Operator => key.to_string(),
            Principal::Tenant(t) if t == DEFAULT_TENANT => key.to_string(),
            Principal::Tenant(t) => format!("{t}{KEY_SEPARATOR}{key}"),
            Principal::Mcp { tenant, session } => format!(
                "{}{KEY_SEPARATOR}{session}{KEY_SEPARATOR}{key}",
                tenant.as_deref().unwrap_or(OPERATOR)
            ),
        }
    }

    /// How this principal sees provider key `key`: its own key without
    /// the namespace, another's (for the operator) whole.
    pub fn display_key(&self, key: &str) -> String {
        let own = self.session_key("");
        if own.is_empty() {
            return key.to_string();
        }
        key.strip_prefix(own.as_str()).unwrap_or(key).to_string()
    }

    /// Whether it may see and act on a session `owner` owns.
    pub fn may_session(&self, owner: &Principal) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Tenant(t) => match owner {
                Principal::Tenant(o) => o == t,
                Principal::Mcp { tenant, .. } => tenant.as_deref() == Some(t.as_str()),
                Principal::Operator => false,
            },
            Principal::Mcp { .. } => owner == self,
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

/// A tenant's quotas; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Live sandboxes at once (its MCP sessions' included).
    pub max_sandboxes: Option<u64>,
    /// Snapshots kept (its MCP sessions' included).
    pub max_snapshots: Option<u64>,
    /// Bytes its snapshots hold beyond their base images.
    pub max_snapshot_bytes: Option<u64>,
}

/// A quota a request would exceed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant '{tenant}' is at its quota {what} ({limit}): {used} in use{}", adding.map(|a| format!(", {a} more asked")).unwrap_or_default())]
pub struct QuotaExceeded {
    /// The tenant.
    pub tenant: String,
    /// Which quota (`max_sandboxes`, ...).
    pub what: &'static str,
    /// Its limit.
    pub limit: u64,
    /// What is in use now.
    pub used: u64,
    /// What the request adds, when it says.
    pub adding: Option<u64>,
}

impl Quota {
    /// Refuses `adding` more sandboxes when `live` are in use.
    pub fn sandboxes(&self, tenant: &str, live: u64, adding: u64) -> Result<(), QuotaExceeded> {
        check(tenant, "max_sandboxes", self.max_sandboxes, live, adding)
    }

    /// Refuses one more snapshot when `kept` exist and they hold `bytes`.
    pub fn snapshots(&self, tenant: &str, kept: u64, bytes: u64) -> Result<(), QuotaExceeded> {
        check(tenant, "max_snapshots", self.max_snapshots, kept, 1)?;
        // Bytes are known once taken: refused when already at the limit.
        match self.max_snapshot_bytes {
            Some(limit) if bytes >= limit => Err(QuotaExceeded {
                tenant: tenant.into(),
                what: "max_snapshot_bytes",
                limit,
                used: bytes,
                adding: None,
            }),
            _ => Ok(()),
        }
    }

    /// Refuses snapshots that hold more than the byte quota (checked once
    /// a new one is taken and its size known).
    pub fn snapshot_bytes(&self, tenant: &str, bytes: u64) -> Result<(), QuotaExceeded> {
        match self.max_snapshot_bytes {
            Some(limit) if bytes > limit => Err(QuotaExceeded {
                tenant: tenant.into(),
                what: "max_snapshot_bytes",
                limit,
                used: bytes,
                adding: None,
            }),
            _ => Ok(()),
        }
    }
}

fn check(
    tenant: &str,
    what: &'static str,
    limit: Option<u64>,
    used: u64,
    adding: u64,
) -> Result<(), QuotaExceeded> {
    match limit {
        Some(limit) if used.saturating_add(adding) > limit => Err(QuotaExceeded {
            tenant: tenant.into(),
            what,
            limit,
            used,
            adding: Some(adding),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(t: &str) -> Principal {
        Principal::Tenant(t.into())
    }

    fn q(s: &str) -> QualifiedName {
        QualifiedName::parse(s).expect(s)
    }

    #[test]
    fn tenant_names_are_checked() {
        for ok in ["alice", "team-7", "a", "default"] {
            assert!(validate_tenant(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Alice",
            "-a",
            "a-",
            "a.b",
            "a:b",
            "a/b",
            "operator",
            &"x".repeat(33),
        ] {
            assert!(validate_tenant(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn qualified_names_parse_and_print() {
        assert_eq!(q("repo-ready"), QualifiedName::operator("repo-ready"));
        let n = q("alice/repo-ready");
        assert_eq!(n.namespace.as_deref(), Some("alice"));
        assert_eq!(n.to_string(), "alice/repo-ready");
        assert_eq!(n.owner(), tenant("alice"));
        let m = q("alice.mcp-0a1b/x");
        assert_eq!(
            m.owner(),
            Principal::Mcp {
                tenant: Some("alice".into()),
                session: "mcp-0a1b".into()
            }
        );
        assert_eq!(q("operator.mcp-ff/x").owner().tenant(), None);
        for bad in [
            "",
            "/x",
            "Alice/x",
            "alice/",
            "alice/B",
            "a/b/c",
            "operator/x",
            "alice.evil/x",
            "alice.mcp-/x",
        ] {
            let e = QualifiedName::parse(bad).expect_err(bad);
            assert_eq!(e.field, "name", "{bad}");
            assert_eq!(e.value, bad);
        }
    }

    #[test]
    fn tenants_reach_their_own_snapshots_and_shared_ones_read_only() {
        let sharing = Sharing {
            tenants: vec!["base".into()],
            mcp: vec!["task".into()],
        };
        let alice = tenant("alice");
        let read = SnapshotAccess::Read;
        let write = SnapshotAccess::Write;
        assert!(alice.may_snapshot(write, &q("alice/x"), &sharing));
        assert!(alice.may_snapshot(write, &q("alice.mcp-01/x"), &sharing));
        assert!(!alice.may_snapshot(read, &q("bob/x"), &sharing));
        assert!(!alice.may_snapshot(read, &q("alicex/x"), &sharing));
        assert!(!alice.may_snapshot(read, &q("alicex.mcp-01/x"), &sharing));
        assert!(!alice.may_snapshot(read, &q("repo-ready"), &sharing));
        assert!(alice.may_snapshot(read, &q("base"), &sharing));
        assert!(!alice.may_snapshot(write, &q("base"), &sharing));
        assert!(!alice.may_snapshot(read, &q("task"), &sharing));
        assert!(Principal::Operator.may_snapshot(write, &q("bob/x"), &sharing));
    }

    #[test]
    fn an_mcp_session_reaches_only_its_own_snapshots_and_those_shared_with_mcp() {
        let sharing = Sharing {
            tenants: vec!["base".into()],
            mcp: vec!["task".into()],
        };
        let model = tenant("alice").mcp_session("mcp-01");
        let other = tenant("alice").mcp_session("mcp-02");
        assert_eq!(model.snapshot_namespace().as_deref(), Some("alice.mcp-01"));
        let own = model.own_snapshot("x").expect("name");
        assert_eq!(own.to_string(), "alice.mcp-01/x");
        assert!(model.may_snapshot(SnapshotAccess::Write, &own, &sharing));
        assert!(!other.may_snapshot(SnapshotAccess::Read, &own, &sharing));
        assert!(!model.may_snapshot(SnapshotAccess::Read, &q("alice/x"), &sharing));
        assert!(!model.may_snapshot(SnapshotAccess::Read, &q("repo-ready"), &sharing));
        assert!(!model.may_snapshot(SnapshotAccess::Read, &q("base"), &sharing));
        assert!(model.may_snapshot(SnapshotAccess::Read, &q("task"), &sharing));
        assert!(!model.may_snapshot(SnapshotAccess::Write, &q("task"), &sharing));
        let stdio = Principal::Operator.mcp_session("mcp-03");
        assert_eq!(
            stdio.snapshot_namespace().as_deref(),
            Some("operator.mcp-03")
        );
        assert!(!stdio.may_snapshot(SnapshotAccess::Read, &q("repo-ready"), &sharing));
        assert_eq!(
            model.snapshot_candidates("task").expect("name"),
            vec![q("alice.mcp-01/task"), q("task")]
        );
        assert_eq!(model.display_snapshot(&own), "x");
        assert_eq!(Principal::Operator.display_snapshot(&own), "alice.mcp-01/x");
    }

    #[test]
    fn a_snapshot_image_is_named_only_by_who_may_read_the_snapshot() {
        let sharing = Sharing {
            tenants: vec!["base".into()],
            mcp: Vec::new(),
        };
        let bob = tenant("bob");
        for foreign in [
            "corral-snapshot/alice:secret",
            "corral-snapshot/alice",
            "docker.io/corral-snapshot/alice:secret",
            "corral-snapshot/alice@sha256:00",
            "corral-snapshot/alice.mcp-01:x",
            "corral-snapshot:secret",
            "corral-snapshot",
            "corral-snapshot@sha256:00",
            "docker.io/library/corral-snapshot:secret",
            "index.docker.io/library/corral-snapshot:other@sha256:00",
        ] {
            assert!(!bob.may_name_image(foreign, &sharing), "{foreign}");
        }
        // Its own, its MCP sessions' for a tenant, and shared ones.
        for own in [
            "corral-snapshot/bob:x",
            "docker.io/corral-snapshot/bob:x",
            "corral-snapshot:base",
            "docker.io/library/corral-snapshot:base",
            "busybox",
            "127.0.0.1:5000/corral-snapshot:secret",
        ] {
            assert!(bob.may_name_image(own, &sharing), "{own}");
        }
        assert!(bob.may_name_image("corral-snapshot/bob.mcp-01:x", &Sharing::default()));
        assert!(!bob
            .mcp_session("mcp-02")
            .may_name_image("corral-snapshot/bob:x", &sharing));
        assert!(Principal::Operator.may_name_image("corral-snapshot/alice:secret", &sharing));
    }

    #[test]
    fn lookups_find_the_own_snapshot_first_then_a_shared_one() {
        let info = |q: &str| {
            let q = QualifiedName::parse(q).expect(q);
            SnapshotInfo {
                name: q.name.clone(),
                kind: crate::snapshot::SnapshotKind::Image,
                namespace: q.namespace.clone(),
                image: String::new(),
                source_sandbox: String::new(),
                spec: crate::SandboxSpec::new("img"),
                env_names: Vec::new(),
                created: 0,
                size: 0,
                durable: false,
                owner: None,
                ownership: crate::labels::Ownership::Orphan,
            }
        };
        let all = [
            info("base"),
            info("alice/base"),
            info("secret"),
            info("bob/x"),
        ];
        let sharing = Sharing {
            tenants: vec!["base".into(), "other".into()],
            mcp: Vec::new(),
        };
        let alice = tenant("alice");
        let read = SnapshotAccess::Read;
        let write = SnapshotAccess::Write;
        let found = |p: &Principal, name: &str, access| match p
            .find_snapshot(name, &all, access, &sharing)
            .expect(name)
        {
            SnapshotLookup::Found { info, read_only } => {
                format!("{} {read_only}", info.qualified())
            }
            SnapshotLookup::ReadOnly(info) => format!("{} read-only", info.qualified()),
            SnapshotLookup::Absent => "absent".into(),
        };
        assert_eq!(found(&alice, "base", write), "alice/base false");
        assert_eq!(found(&tenant("carol"), "base", read), "base true");
        assert_eq!(found(&tenant("carol"), "base", write), "base read-only");
        assert_eq!(found(&alice, "secret", read), "absent");
        assert_eq!(found(&alice, "bob/x", read), "absent");
        assert_eq!(found(&alice, "missing", read), "absent");
        assert_eq!(found(&Principal::Operator, "bob/x", write), "bob/x false");
        let model = alice.mcp_session("mcp-01");
        assert_eq!(found(&model, "base", read), "absent");
        assert!(alice
            .find_snapshot("Bad Name", &all, read, &sharing)
            .is_err());
    }

    #[test]
    fn session_keys_are_namespaced_by_tenant() {
        let alice = tenant("alice");
        assert_eq!(alice.session_key("ep-1"), "alice:ep-1");
        assert_eq!(alice.display_key("alice:ep-1"), "ep-1");
        assert_eq!(tenant(DEFAULT_TENANT).session_key("ep-1"), "ep-1");
        assert_eq!(Principal::Operator.session_key("alice:ep-1"), "alice:ep-1");
        assert_eq!(Principal::Operator.display_key("alice:ep-1"), "alice:ep-1");
        assert!(alice.may_session(&alice));
        assert!(alice.may_session(&alice.mcp_session("mcp-1")));
        assert!(!alice.may_session(&tenant("bob")));
        assert!(!alice.may_session(&Principal::Operator));
        assert!(!tenant("bob").may_session(&alice.mcp_session("mcp-1")));
        assert!(Principal::Operator.may_session(&alice));
        let model = alice.mcp_session("mcp-1");
        assert!(model.may_session(&model));
        assert!(!model.may_session(&alice));
    }

    #[test]
    fn quotas_refuse_past_their_limits() {
        let quota = Quota {
            max_sandboxes: Some(2),
            max_snapshots: Some(1),
            max_snapshot_bytes: Some(100),
        };
        assert!(quota.sandboxes("a", 1, 1).is_ok());
        let e = quota.sandboxes("a", 1, 2).expect_err("over");
        assert_eq!((e.what, e.limit, e.used), ("max_sandboxes", 2, 1));
        assert!(e.to_string().contains("tenant 'a'"), "{e}");
        assert!(quota.snapshots("a", 0, 0).is_ok());
        assert_eq!(
            quota.snapshots("a", 1, 0).expect_err("count").what,
            "max_snapshots"
        );
        assert_eq!(
            quota.snapshots("a", 0, 100).expect_err("bytes").what,
            "max_snapshot_bytes"
        );
        assert!(quota.snapshot_bytes("a", 100).is_ok());
        assert!(quota.snapshot_bytes("a", 101).is_err());
        assert!(Quota::default().sandboxes("a", 1000, 1000).is_ok());
    }

    #[test]
    fn a_principal_reads_back_from_its_id_and_nothing_else_does() {
        let all = [
            Principal::Operator,
            tenant("alice"),
            Principal::Mcp {
                tenant: Some("alice".into()),
                session: "mcp-1f".into(),
            },
            Principal::Mcp {
                tenant: None,
                session: "mcp-2e".into(),
            },
        ];
        for p in all {
            assert_eq!(Principal::from_id(&p.id()), Some(p));
        }
        for bad in [
            "",
            "tenant:",
            "tenant:a:b",
            "mcp:alice",
            "mcp::x",
            "mcp:a:b:c",
            "alice",
        ] {
            assert_eq!(Principal::from_id(bad), None, "{bad}");
        }
    }
}
