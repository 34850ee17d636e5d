//! Snapshots: a sandbox's file system kept under a name, to start sandboxes
//! from (`fork`). Pure: names, the labels a backend puts on what it keeps,
//! and the spec a fork starts from.
//!
//! A snapshot records the spec of the sandbox it was taken from, so a fork
//! gets the same environment, working directory, limits and protections;
//! its image is the snapshot, and its start-up commands are not run again
//! (their effect is in the snapshot).
//!
//! Ownership is recorded under keys of the snapshot's own
//! (`corral.snapshot.owner.*`): a backend may pass its labels on to the
//! sandboxes started from it, which must not look owned by the snapshot's
//! owner or persistent.

use std::collections::HashMap;

use serde::Serialize;

use crate::labels::{Owner, Ownership, OWNER_HOST, OWNER_PID, OWNER_START, PERSISTENT};
use crate::{SandboxSpec, SpecError};

/// The snapshot's name.
pub const NAME: &str = "corral.snapshot";
/// The source sandbox's spec, as JSON.
pub const SPEC: &str = "corral.snapshot.spec";
/// The sandbox it was taken from.
pub const SOURCE: &str = "corral.snapshot.source";
/// `true` for a durable snapshot (kept until deleted).
pub const DURABLE: &str = "corral.snapshot.durable";
/// Owner of a snapshot that is not durable: host, pid, start.
pub const OWNER_PREFIX: &str = "corral.snapshot.owner.";

/// Longest snapshot name.
pub const MAX_NAME: usize = 128;

/// Checks a snapshot name: 1 to 128 of `a-z 0-9 . _ -`, starting with a
/// letter or digit (it becomes part of an image reference).
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    let bad = |reason: &str| SpecError {
        field: "name".into(),
        value: name.into(),
        reason: reason.into(),
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(bad("a snapshot name is 1 to 128 characters"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(bad("a snapshot name starts with a letter or digit"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        return Err(bad(
            "a snapshot name has only lower-case letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// What a backend needs to take a snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotRequest<'a> {
    /// Its name.
    pub name: &'a str,
    /// The sandbox it is taken from.
    pub sandbox_id: &'a str,
    /// That sandbox's spec.
    pub spec: &'a SandboxSpec,
    /// Who owns it, unless durable.
    pub owner: &'a Owner,
    /// Kept until deleted, whatever becomes of its owner.
    pub durable: bool,
}

impl SnapshotRequest<'_> {
    /// The labels the backend puts on the snapshot.
    pub fn labels(&self) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (NAME.to_string(), self.name.to_string()),
            (SOURCE.to_string(), self.sandbox_id.to_string()),
            (
                SPEC.to_string(),
                serde_json::to_string(self.spec).unwrap_or_default(),
            ),
            (DURABLE.to_string(), self.durable.to_string()),
        ]);
        if !self.durable {
            for (k, v) in self.owner.labels() {
                let key = k.strip_prefix("corral.owner.").unwrap_or(&k);
                l.insert(format!("{OWNER_PREFIX}{key}"), v);
            }
        }
        l
    }
}

/// A snapshot a backend keeps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// The engine's reference to start a sandbox from it (an image for
    /// Docker).
    pub image: String,
    /// The sandbox it was taken from.
    pub source_sandbox: String,
    /// The spec of that sandbox.
    pub spec: SandboxSpec,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Bytes it holds beyond what it shares with its base.
    pub size: i64,
    /// Kept until deleted.
    pub durable: bool,
    /// The owning corral process, unless durable.
    #[serde(skip)]
    pub owner: Option<Owner>,
    /// Whether its owner is alive (filled in by the runtime).
    #[serde(skip)]
    pub ownership: Ownership,
}

impl SnapshotInfo {
    /// Reads a snapshot's labels; `None` when they are not a snapshot's
    /// (or its recorded spec does not parse).
    pub fn from_labels(
        labels: &HashMap<String, String>,
        image: String,
        created: i64,
        size: i64,
    ) -> Option<SnapshotInfo> {
        let name = labels.get(NAME)?.clone();
        let spec: SandboxSpec = serde_json::from_str(labels.get(SPEC)?).ok()?;
        let durable = labels.get(DURABLE).map(String::as_str) == Some("true");
        Some(SnapshotInfo {
            name,
            image,
            source_sandbox: labels.get(SOURCE).cloned().unwrap_or_default(),
            spec,
            created,
            size,
            durable,
            owner: Owner::from_labels(&owner_labels(labels)),
            ownership: Ownership::Orphan,
        })
    }

    /// Classifies it like a sandbox: durable ones are kept like persistent
    /// sandboxes, others belong to their owner.
    pub fn ownership(
        &self,
        labels: &HashMap<String, String>,
        this_host: &str,
        alive: impl Fn(u32, u64) -> bool,
    ) -> Ownership {
        let mut l = owner_labels(labels);
        if self.durable {
            l.insert(PERSISTENT.to_string(), "true".to_string());
        }
        crate::labels::ownership(&l, this_host, alive)
    }

    /// The spec a sandbox forked from it starts with: the source's, with
    /// the snapshot as its image and no start-up commands (their effect is
    /// in the snapshot).
    pub fn fork_spec(&self) -> SandboxSpec {
        let mut spec = self.spec.clone();
        spec.image = self.image.clone();
        spec.startup.clear();
        spec.persistent = None;
        spec
    }
}

/// The snapshot's owner labels under the standard keys.
fn owner_labels(labels: &HashMap<String, String>) -> HashMap<String, String> {
    [OWNER_HOST, OWNER_PID, OWNER_START]
        .into_iter()
        .filter_map(|k| {
            let key = k.strip_prefix("corral.owner.").unwrap_or(k);
            labels
                .get(&format!("{OWNER_PREFIX}{key}"))
                .map(|v| (k.to_string(), v.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_named_in_errors() {
        assert!(validate_name("repo-ready_1.2").is_ok());
        for bad in ["", "-x", "Upper", "a/b", "a b", &"x".repeat(129)] {
            let e = validate_name(bad).expect_err(bad);
            assert_eq!(e.field, "name");
            assert_eq!(e.value, bad);
        }
    }

    #[test]
    fn labels_round_trip_and_ownership_follows_durability() {
        let owner = Owner {
            host: "h".into(),
            pid: 42,
            start: 7,
        };
        let mut spec = SandboxSpec::new("img");
        spec.startup.push("make".into());
        spec.persistent = None;
        let req = SnapshotRequest {
            name: "prepared",
            sandbox_id: "sb-1",
            spec: &spec,
            owner: &owner,
            durable: false,
        };
        let labels = req.labels();
        // Never the keys that mark a sandbox's own ownership.
        assert!(!labels.contains_key(OWNER_HOST) && !labels.contains_key(PERSISTENT));
        let info = SnapshotInfo::from_labels(&labels, "corral-snapshot:prepared".into(), 1, 2)
            .expect("a snapshot");
        assert_eq!(info.owner, Some(owner.clone()));
        assert_eq!(info.spec, spec);
        assert_eq!(
            info.ownership(&labels, "h", |p, s| p == 42 && s == 7),
            Ownership::LiveOwner
        );
        assert_eq!(
            info.ownership(&labels, "h", |_, _| false),
            Ownership::Orphan
        );
        let fork = info.fork_spec();
        assert_eq!(fork.image, "corral-snapshot:prepared");
        assert!(fork.startup.is_empty());

        let durable = SnapshotRequest {
            durable: true,
            ..req
        };
        let labels = durable.labels();
        let info = SnapshotInfo::from_labels(&labels, "i".into(), 1, 2).expect("a snapshot");
        assert!(info.durable && info.owner.is_none());
        assert_eq!(
            info.ownership(&labels, "h", |_, _| false),
            Ownership::Persistent
        );
        assert!(SnapshotInfo::from_labels(&HashMap::new(), "i".into(), 0, 0).is_none());
    }
}
