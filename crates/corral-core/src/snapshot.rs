//! Snapshots: a sandbox's file system kept under a name, to start sandboxes
//! from (`fork`). Pure: names, the labels a backend puts on what it keeps,
//! and the spec a fork starts from.
//!
//! A snapshot records the spec of the sandbox it was taken from, so a fork
//! gets the same environment, working directory, limits and protections;
//! its image is the snapshot, and its start-up commands are not run again
//! (their effect is in the snapshot).
//!
//! A snapshot never carries secret values: the spec it records has its
//! environment's values taken out, and the names of the variables the
//! sandbox set are recorded instead (`corral.snapshot.env`). A fork takes
//! their values from whoever forks ([`SnapshotInfo::fork_spec_with`]).
//!
//! A snapshot belongs to a principal's namespace
//! (`corral.snapshot.namespace`, none for the operator's; see
//! [`crate::principal`]); names are unique within a namespace.
//!
//! Ownership is recorded under keys of the snapshot's own
//! (`corral.snapshot.owner.*`): a backend may pass its labels on to the
//! sandboxes started from it, which must not look owned by the snapshot's
//! owner or persistent.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::labels::{Owner, Ownership, OWNER_HOST, OWNER_PID, OWNER_START, PERSISTENT};
use crate::principal::QualifiedName;
use crate::{EnvVar, SandboxSpec, SpecError};

/// The snapshot's name.
pub const NAME: &str = "corral.snapshot";
/// The source sandbox's spec, as JSON.
pub const SPEC: &str = "corral.snapshot.spec";
/// The sandbox it was taken from.
pub const SOURCE: &str = "corral.snapshot.source";
/// `true` for a durable snapshot (kept until deleted).
pub const DURABLE: &str = "corral.snapshot.durable";
/// The namespace of the principal it belongs to; absent for the
/// operator's.
pub const NAMESPACE: &str = "corral.snapshot.namespace";
/// Names of the variables the source sandbox set, as a JSON list (their
/// values are not kept).
pub const ENV_NAMES: &str = "corral.snapshot.env";
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
    /// The namespace it goes in (`None`: the operator's).
    pub namespace: Option<&'a str>,
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
        let (spec, env_names) = without_values(self.spec);
        let mut l = HashMap::from([
            (NAME.to_string(), self.name.to_string()),
            (SOURCE.to_string(), self.sandbox_id.to_string()),
            (
                SPEC.to_string(),
                serde_json::to_string(&spec).unwrap_or_default(),
            ),
            (
                ENV_NAMES.to_string(),
                serde_json::to_string(&env_names).unwrap_or_default(),
            ),
            (DURABLE.to_string(), self.durable.to_string()),
        ]);
        if let Some(ns) = self.namespace {
            l.insert(NAMESPACE.to_string(), ns.to_string());
        }
        if !self.durable {
            for (k, v) in self.owner.labels() {
                let key = k.strip_prefix("corral.owner.").unwrap_or(&k);
                l.insert(format!("{OWNER_PREFIX}{key}"), v);
            }
        }
        l
    }
}

/// How a snapshot is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// The engine keeps an image of the sandbox's root file system (Docker:
    /// `docker commit`); a fork starts from that image.
    #[default]
    Image,
    /// corral keeps the sandbox's changes to its image, as its agent
    /// exported them (in memory, or a file when durable); a fork starts
    /// from the source's image and its agent takes the changes in before
    /// its first command. Only of sandboxes that reset in place.
    Delta,
    /// The engine's checkpoint of the running sandbox: its processes,
    /// memory, open files, listening sockets, tmpfs mounts and root file
    /// system, kept by corral as files; a fork is restored from it and
    /// goes on from that state. Never chosen unless asked for; only of
    /// tiers that checkpoint (on Docker: `isolation: gvisor` with
    /// `network: none`).
    Live,
}

impl SnapshotKind {
    /// `image`, `delta` or `live`.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Image => "image",
            SnapshotKind::Delta => "delta",
            SnapshotKind::Live => "live",
        }
    }
}

/// A snapshot a backend keeps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// How it is kept.
    pub kind: SnapshotKind,
    /// The namespace it belongs to (`None`: the operator's).
    pub namespace: Option<String>,
    /// The image a fork starts from: the snapshot's own (an `image`
    /// snapshot), or the source's (a `delta` one).
    pub image: String,
    /// The sandbox it was taken from.
    pub source_sandbox: String,
    /// The spec of that sandbox, without the values of the variables it
    /// set.
    pub spec: SandboxSpec,
    /// The names of the variables that sandbox set (a fork takes their
    /// values from whoever forks).
    pub env_names: Vec<String>,
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
        let recorded: SandboxSpec = serde_json::from_str(labels.get(SPEC)?).ok()?;
        // Snapshots taken before values were left out still hold them in
        // their labels: they are dropped here all the same.
        let (spec, mut env_names) = without_values(&recorded);
        if let Some(names) = labels.get(ENV_NAMES) {
            let listed: Vec<String> = serde_json::from_str(names).ok()?;
            for n in listed {
                if !env_names.contains(&n) {
                    env_names.push(n);
                }
            }
        }
        let namespace = labels.get(NAMESPACE).filter(|n| !n.is_empty()).cloned();
        let durable = labels.get(DURABLE).map(String::as_str) == Some("true");
        Some(SnapshotInfo {
            name,
            kind: SnapshotKind::Image,
            namespace,
            image,
            source_sandbox: labels.get(SOURCE).cloned().unwrap_or_default(),
            spec,
            env_names,
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

    /// Its name with its namespace.
    pub fn qualified(&self) -> QualifiedName {
        QualifiedName {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The spec a sandbox forked from it starts with when no values are
    /// given: the source's, with the snapshot as its image, no start-up
    /// commands (their effect is in the snapshot) and none of the
    /// variables the source set.
    pub fn fork_spec(&self) -> SandboxSpec {
        self.fork_spec_with(&[])
    }

    /// [`SnapshotInfo::fork_spec`] with the forking principal's variables:
    /// `env` (its request's, then its defaults'; the first of a name wins,
    /// a forwarded one is resolved where the fork starts) gives the values
    /// of the variables the source set, and a variable `env` has that the
    /// source did not set is added. A variable of the source that `env`
    /// does not give is left to the image (unset unless the base image sets
    /// it: no engine keeps a sandbox's values in its container's
    /// configuration, so a snapshot never holds them).
    pub fn fork_spec_with(&self, env: &[EnvVar]) -> SandboxSpec {
        let mut spec = self.spec.clone();
        spec.image = self.image.clone();
        spec.startup.clear();
        spec.persistent = None;
        let name_of = |v: &EnvVar| match v {
            EnvVar::Set { name, .. } => name.clone(),
            EnvVar::Forward { forward } => forward.clone(),
        };
        let mut given: Vec<EnvVar> = Vec::new();
        for var in env {
            let name = name_of(var);
            if given.iter().any(|v| name_of(v) == name) {
                continue;
            }
            given.push(var.clone());
        }
        spec.env
            .retain(|v| !given.iter().any(|g| name_of(g) == name_of(v)));
        spec.env.extend(given);
        spec
    }
}

/// `spec` without the values of the variables it sets, and their names.
fn without_values(spec: &SandboxSpec) -> (SandboxSpec, Vec<String>) {
    let mut stripped = spec.clone();
    let mut names = Vec::new();
    stripped.env.retain(|v| match v {
        EnvVar::Set { name, .. } => {
            if !names.contains(name) {
                names.push(name.clone());
            }
            false
        }
        EnvVar::Forward { .. } => true,
    });
    (stripped, names)
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

/// Hard-links (or, across file systems, copies) every file of checkpoint
/// directory `from` (a live snapshot's, see [`SnapshotKind::Live`]) into
/// the existing directory `to`; the bytes it holds.
pub fn link_checkpoint(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<u64> {
    let mut size = 0;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)?;
        }
        size += e.metadata()?.len();
    }
    Ok(size)
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
            namespace: None,
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

    #[test]
    fn snapshots_keep_variable_names_never_values() {
        let owner = Owner {
            host: "h".into(),
            pid: 1,
            start: 1,
        };
        let mut spec = SandboxSpec::new("img");
        spec.env = vec![
            EnvVar::Set {
                name: "API_KEY".into(),
                value: "s3cret".into(),
            },
            EnvVar::Forward {
                forward: "HOME".into(),
            },
            EnvVar::Set {
                name: "MODE".into(),
                value: "train".into(),
            },
        ];
        let req = SnapshotRequest {
            name: "repo-ready",
            namespace: Some("alice"),
            sandbox_id: "sb-1",
            spec: &spec,
            owner: &owner,
            durable: true,
        };
        let labels = req.labels();
        for (k, v) in &labels {
            assert!(!v.contains("s3cret") && !v.contains("train"), "{k}={v}");
        }
        let info = SnapshotInfo::from_labels(&labels, "i".into(), 1, 2).expect("a snapshot");
        assert_eq!(info.env_names, ["API_KEY", "MODE"]);
        assert_eq!(info.namespace.as_deref(), Some("alice"));
        assert_eq!(info.qualified().to_string(), "alice/repo-ready");
        assert_eq!(
            info.fork_spec().env,
            [EnvVar::Forward {
                forward: "HOME".into()
            }]
        );
        let mine = [
            EnvVar::Set {
                name: "API_KEY".into(),
                value: "mine".into(),
            },
            EnvVar::Set {
                name: "API_KEY".into(),
                value: "default".into(),
            },
        ];
        let fork = info.fork_spec_with(&mine);
        assert_eq!(fork.env.len(), 2);
        assert_eq!(fork.env[1], mine[0]);

        // A snapshot taken before values were left out: dropped on reading.
        let mut old = labels.clone();
        old.insert(SPEC.into(), serde_json::to_string(&spec).expect("json"));
        old.remove(ENV_NAMES);
        let info = SnapshotInfo::from_labels(&old, "i".into(), 1, 2).expect("a snapshot");
        assert_eq!(info.env_names, ["API_KEY", "MODE"]);
        assert_eq!(info.fork_spec().env.len(), 1);
    }
}
