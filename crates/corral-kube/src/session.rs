//! Persistent sessions on Kubernetes: a PersistentVolumeClaim per session
//! key holds the session's workspace and home, mounted where Docker's
//! backend mounts its host directories (`/workspace`, `/home/corral`).
//!
//! The claim is named from the key ([`claim_name`]: a readable prefix and
//! 128 bits of SHA-256 of the whole key, so distinct keys never share
//! one), carries the full key as an annotation (checked whenever the claim
//! is found again) and outlives every pod of the session: removing a
//! sandbox keeps it, and `gc` never touches claims (it removes pods, and
//! Leases). After making a session's pod the backend records it on the
//! claim (pod name and uid, [`CLAIM_POD`], [`CLAIM_POD_UID`]): the
//! runtime adopts only the recorded pod, as it adopts only the container
//! recorded in a session's host directory with Docker.
//!
//! Pure: the claim, its checks and the pod's mounts are unit-tested here.

use std::collections::BTreeMap;

use corral_core::backend::{SESSION_HOME, SESSION_WORKSPACE};
use corral_core::{labels, Error, SpecError};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::pod::SANDBOX_CONTAINER;

/// The pod's volume holding the session's claim.
pub const SESSION_VOLUME: &str = "corral-session";
/// Claim annotation: the pod last made for the session.
pub const CLAIM_POD: &str = "corral.claim.pod";
/// Claim annotation: that pod's uid (a pod made later under the same name
/// is another pod).
pub const CLAIM_POD_UID: &str = "corral.claim.pod-uid";
/// The claim's directory mounted at [`SESSION_WORKSPACE`].
const WORKSPACE_DIR: &str = "workspace";
/// The claim's directory mounted at [`SESSION_HOME`].
const HOME_DIR: &str = "home";
/// Characters of the key kept readable in a claim's name.
const PREFIX_CHARS: usize = 15;

/// The claim of session `key`: `corral-session-<prefix>-<32 hex>`, an
/// RFC 1123 label: up to 15 characters of the key (lowercased, every run
/// of other characters one `-`) and the first 128 bits of SHA-256 of the
/// whole key.
pub fn claim_name(key: &str) -> String {
    let mut prefix = String::new();
    for c in key.chars().flat_map(char::to_lowercase) {
        if prefix.len() >= PREFIX_CHARS {
            break;
        }
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
    }
    let prefix = prefix.trim_matches('-');
    let digest = Sha256::digest(key.as_bytes());
    let hash: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    if prefix.is_empty() {
        format!("corral-session-{hash}")
    } else {
        format!("corral-session-{prefix}-{hash}")
    }
}

/// What a session's claim is made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimParams<'a> {
    /// The session key.
    pub key: &'a str,
    /// Bytes requested.
    pub size: u64,
    /// StorageClass; `None`: the cluster's default.
    pub storage_class: Option<&'a str>,
}

/// The claim of a session: ReadWriteOnce (one node mounts it at a time,
/// as one pod of the session runs at a time), labelled as corral's and
/// persistent, the key in an annotation.
pub fn claim(p: &ClaimParams<'_>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(p.key)),
            labels: Some(BTreeMap::from([
                (labels::PERSISTENT.to_string(), "true".to_string()),
                (
                    labels::VERSION.to_string(),
                    env!("CARGO_PKG_VERSION").to_string(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                labels::SESSION.to_string(),
                p.key.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(p.size.to_string()),
                )])),
                ..Default::default()
            }),
            storage_class_name: p.storage_class.map(str::to_string),
            ..Default::default()
        }),
        status: None,
    }
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Checks that an existing claim of [`claim_name`]`(key)` is session
/// `key`'s: one made for another key (or not by corral) is never mounted.
pub fn check_claim(existing: &PersistentVolumeClaim, key: &str) -> Result<(), Error> {
    match annotation(existing, labels::SESSION) {
        Some(k) if k == key => Ok(()),
        other => Err(Error::InvalidSpec(SpecError {
            field: "persistent".into(),
            value: key.into(),
            reason: format!(
                "the PersistentVolumeClaim {} belongs to {}; corral will not mount it",
                claim_name(key),
                match other {
                    Some(k) => format!("session {k:?}"),
                    None => "no corral session".to_string(),
                }
            ),
        })),
    }
}

/// The pod the claim records as the session's: (name, uid).
pub fn recorded_pod(claim: &PersistentVolumeClaim) -> Option<(&str, &str)> {
    Some((
        annotation(claim, CLAIM_POD).filter(|n| !n.is_empty())?,
        annotation(claim, CLAIM_POD_UID).filter(|u| !u.is_empty())?,
    ))
}

/// The merge patch recording pod `name` (uid `uid`) on a session's claim.
pub fn record_patch(name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {CLAIM_POD: name, CLAIM_POD_UID: uid}}
    })
}

/// Mounts claim `claim` into `pod`'s sandbox container: its `workspace`
/// directory at [`SESSION_WORKSPACE`], its `home` at [`SESSION_HOME`]
/// (the kubelet makes both on first use). A pod without a sandbox
/// container is left as it is.
///
/// Unlike Docker's host directories the claim is not mounted `nosuid`
/// (a pod cannot ask for mount options; a StorageClass's `mountOptions`
/// can): a setuid file a sandbox leaves there is inert while the next
/// sandbox of the session runs with no-new-privileges (the default), and
/// it never reaches corral's host.
pub fn mount(pod: &mut Pod, claim: &str) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let Some(sandbox) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == SANDBOX_CONTAINER)
    else {
        return;
    };
    let mounts = sandbox.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.mount_path != SESSION_WORKSPACE && m.mount_path != SESSION_HOME);
    for (path, dir) in [(SESSION_WORKSPACE, WORKSPACE_DIR), (SESSION_HOME, HOME_DIR)] {
        mounts.push(VolumeMount {
            name: SESSION_VOLUME.into(),
            mount_path: path.into(),
            sub_path: Some(dir.into()),
            read_only: Some(false),
            ..Default::default()
        });
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != SESSION_VOLUME);
    volumes.push(Volume {
        name: SESSION_VOLUME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(false),
        }),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{is_dns_label, pod, PodParams};
    use corral_core::SandboxSpec;
    use std::collections::HashMap;

    #[test]
    fn claim_names_are_dns_labels_unique_per_key() {
        let a = claim_name("user-42/task");
        assert!(a.starts_with("corral-session-user-42-task-"), "{a}");
        assert!(is_dns_label(&a), "{a} ({})", a.len());
        assert_eq!(a, claim_name("user-42/task"), "deterministic");
        // Keys that read the same still get their own claim.
        assert_ne!(claim_name("user-42/task"), claim_name("user-42_task"));
        assert_ne!(claim_name("A"), claim_name("a"));
        let long = "k".repeat(500);
        let fifteen = "x".repeat(15);
        for key in ["", "---", "ÄÖÜ", long.as_str(), "-x-", fifteen.as_str()] {
            let name = claim_name(key);
            assert!(is_dns_label(&name), "{key:?} -> {name} ({})", name.len());
        }
        assert_eq!(claim_name("").len(), "corral-session-".len() + 32);
        assert_eq!(claim_name(&"k".repeat(500)).len(), 63);
    }

    #[test]
    fn the_claim_is_the_sessions_and_sized_from_config() {
        let c = claim(&ClaimParams {
            key: "user-42/task",
            size: 1 << 30,
            storage_class: Some("fast"),
        });
        assert_eq!(
            c.metadata.name.as_deref(),
            Some(claim_name("user-42/task").as_str())
        );
        let spec = c.spec.as_ref().expect("spec");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        let requests = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone())
            .expect("requests");
        assert_eq!(requests["storage"], Quantity("1073741824".into()));
        assert_eq!(
            c.metadata.labels.as_ref().expect("labels")[labels::PERSISTENT],
            "true"
        );
        check_claim(&c, "user-42/task").expect("its own key");
        let other = check_claim(&c, "user-43/task").expect_err("another key");
        let text = other.to_string();
        assert!(
            text.contains("persistent") && text.contains("user-42/task"),
            "{text}"
        );
        assert_eq!(other.kind(), corral_core::FailureKind::InvalidSpec);
        let foreign = PersistentVolumeClaim::default();
        assert!(check_claim(&foreign, "k")
            .expect_err("not corral's")
            .to_string()
            .contains("no corral session"));
        let default_class = claim(&ClaimParams {
            key: "k",
            size: 1 << 20,
            storage_class: None,
        });
        assert_eq!(
            default_class.spec.and_then(|s| s.storage_class_name),
            None,
            "the cluster's default class"
        );
    }

    #[test]
    fn the_claim_records_the_sessions_pod() {
        let mut c = claim(&ClaimParams {
            key: "k",
            size: 1 << 20,
            storage_class: None,
        });
        assert_eq!(recorded_pod(&c), None);
        let patch = record_patch("corral-sb-1-x", "uid-1");
        let annotations = patch["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        for (k, v) in annotations {
            c.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(k.clone(), v.as_str().expect("string").to_string());
        }
        assert_eq!(recorded_pod(&c), Some(("corral-sb-1-x", "uid-1")));
        // The merge patch leaves the session's key alone.
        assert_eq!(annotation(&c, labels::SESSION), Some("k"));
    }

    fn persistent_pod() -> Pod {
        let mut spec = SandboxSpec::new("busybox:1");
        spec.limits.pids = None;
        for t in &mut spec.tmpfs {
            t.options.clear();
        }
        spec.persistent = Some("user-42/task".into());
        spec.workdir = Some(SESSION_WORKSPACE.into());
        let labels = HashMap::from([
            (labels::SANDBOX.to_string(), "sb-1".to_string()),
            (labels::PERSISTENT.to_string(), "true".to_string()),
            (labels::SESSION.to_string(), "user-42/task".to_string()),
        ]);
        pod(
            &spec,
            &PodParams {
                sandbox_id: "sb-1",
                name: "corral-sb-1-x",
                labels: &labels,
                agent_image: "corral-agent:9",
                agent_port: 7150,
                secret: &corral_core::agent_auth::Secret::new([1; 32]),
                pristine_refused: None,
                pristine_apparmor: None,
                gvisor_runtime_class: "gvisor",
            },
        )
        .expect("a persistent spec maps")
    }

    #[test]
    fn a_persistent_pod_mounts_the_sessions_claim() {
        let mut p = persistent_pod();
        let claim = claim_name("user-42/task");
        mount(&mut p, &claim);
        mount(&mut p, &claim); // idempotent
        let spec = p.spec.as_ref().expect("spec");
        let volumes: Vec<_> = spec
            .volumes
            .as_ref()
            .expect("volumes")
            .iter()
            .filter(|v| v.name == SESSION_VOLUME)
            .collect();
        assert_eq!(volumes.len(), 1);
        let source = volumes[0]
            .persistent_volume_claim
            .as_ref()
            .expect("a claim");
        assert_eq!(source.claim_name, claim);
        assert_eq!(source.read_only, Some(false));
        let sandbox = &spec.containers[0];
        let mounts: Vec<_> = sandbox
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .filter(|m| m.name == SESSION_VOLUME)
            .map(|m| (m.mount_path.as_str(), m.sub_path.as_deref()))
            .collect();
        assert_eq!(
            mounts,
            [
                (SESSION_WORKSPACE, Some(WORKSPACE_DIR)),
                (SESSION_HOME, Some(HOME_DIR))
            ]
        );
        assert_eq!(sandbox.working_dir.as_deref(), Some(SESSION_WORKSPACE));
        // The agent's volume is still there, read-only; the init container
        // never sees the session.
        assert!(sandbox
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .any(|m| m.name == crate::pod::AGENT_VOLUME && m.read_only == Some(true)));
        let init = &spec.init_containers.as_ref().expect("init")[0];
        assert!(init
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .all(|m| m.name != SESSION_VOLUME));
        // The session's record is on the pod for adoption.
        let a = p.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(a[labels::SESSION], "user-42/task");
        assert_eq!(
            p.metadata.labels.as_ref().expect("labels")[labels::PERSISTENT],
            "true"
        );
    }
}
