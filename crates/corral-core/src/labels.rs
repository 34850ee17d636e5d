//! The labels corral puts on every container, and the orphan rule built on them.
//!
//! Labels are how corral finds its containers again: after a crash, from
//! another process, or from `corral gc`. The owner labels say which corral
//! process created a container, so a later run can tell a live owner's
//! containers from orphans without any shared state.

use std::collections::HashMap;

/// Prefix reserved for corral's own labels.
pub const PREFIX: &str = "corral.";
/// The sandbox id; present on every container corral creates.
pub const SANDBOX: &str = "corral.sandbox";
/// Host name of the owning corral process.
pub const OWNER_HOST: &str = "corral.owner.host";
/// Pid of the owning corral process.
pub const OWNER_PID: &str = "corral.owner.pid";
/// Start time of the owning process (clock ticks since boot, from
/// `/proc/<pid>/stat`), so a reused pid is not mistaken for the owner.
pub const OWNER_START: &str = "corral.owner.start";
/// Version of corral that created the container.
pub const VERSION: &str = "corral.version";
/// Present (value `true`) on sandboxes that outlive their owner by design.
pub const PERSISTENT: &str = "corral.persistent";
/// The session key of a persistent sandbox.
pub const SESSION: &str = "corral.session";
/// Present (value `true`) in a listing of a sandbox of a session paused to
/// disk, which outlives its owner by design until a later service resumes
/// it (a container's labels are fixed at its creation: a backend sets it
/// from what marks the container, [`crate::Backend::mark_paused`]).
pub const PAUSED: &str = "corral.paused";
/// SHA-256 (hex) of the spec a persistent sandbox was made from.
pub const SPEC_DIGEST: &str = "corral.spec";
/// HMAC-SHA256 (hex), under the user's secret key, of the sandbox id, the
/// session key and the spec digest: proof that this user's corral made the
/// container for that session and spec.
pub const SEAL: &str = "corral.seal";
/// On volumes: what a per-sandbox volume holds (`mount` or `agent`).
pub const VOLUME: &str = "corral.volume";

/// The process that owns a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks since boot.
    pub start: u64,
}

impl Owner {
    /// The owner labels for this owner.
    pub fn labels(&self) -> [(String, String); 3] {
        [
            (OWNER_HOST.to_string(), self.host.clone()),
            (OWNER_PID.to_string(), self.pid.to_string()),
            (OWNER_START.to_string(), self.start.to_string()),
        ]
    }

    /// Reads the owner back from a container's labels; `None` when any is
    /// missing or malformed.
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<Owner> {
        Some(Owner {
            host: labels.get(OWNER_HOST)?.clone(),
            pid: labels.get(OWNER_PID)?.parse().ok()?,
            start: labels.get(OWNER_START)?.parse().ok()?,
        })
    }
}

/// Why a container is or is not an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Its owner is alive on this host: leave it alone.
    LiveOwner,
    /// Its owner is gone (or its labels are unreadable): safe to remove.
    Orphan,
    /// Owned by a process on another host; this host cannot tell.
    ForeignHost,
    /// Persistent by design; left for adoption.
    Persistent,
}

/// Classifies a container by its labels. `alive(pid, start)` answers whether a
/// process with that pid and start time runs on this host.
pub fn ownership(
    labels: &HashMap<String, String>,
    this_host: &str,
    alive: impl Fn(u32, u64) -> bool,
) -> Ownership {
    if labels.get(PERSISTENT).map(String::as_str) == Some("true")
        || labels.get(PAUSED).map(String::as_str) == Some("true")
    {
        return Ownership::Persistent;
    }
    match Owner::from_labels(labels) {
        None => Ownership::Orphan,
        Some(o) if o.host != this_host => Ownership::ForeignHost,
        Some(o) if alive(o.pid, o.start) => Ownership::LiveOwner,
        Some(_) => Ownership::Orphan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(owner: &Owner) -> HashMap<String, String> {
        let mut m: HashMap<_, _> = owner.labels().into_iter().collect();
        m.insert(SANDBOX.into(), "sb".into());
        m
    }

    #[test]
    fn tells_live_owners_from_orphans() {
        let o = Owner {
            host: "h".into(),
            pid: 42,
            start: 7,
        };
        let l = labels(&o);
        assert_eq!(Owner::from_labels(&l), Some(o));
        assert_eq!(
            ownership(&l, "h", |p, s| p == 42 && s == 7),
            Ownership::LiveOwner
        );
        // Same pid, different start time: the pid was reused.
        assert_eq!(
            ownership(&l, "h", |p, s| p == 42 && s == 8),
            Ownership::Orphan
        );
        assert_eq!(ownership(&l, "other", |_, _| false), Ownership::ForeignHost);
        let mut p = l.clone();
        p.insert(PERSISTENT.into(), "true".into());
        assert_eq!(ownership(&p, "h", |_, _| false), Ownership::Persistent);
        let mut broken = l;
        broken.insert(OWNER_PID.into(), "x".into());
        assert_eq!(ownership(&broken, "h", |_, _| true), Ownership::Orphan);
    }
}
