//! Ownership by Lease: how a corral on any host tells a live owner's pods
//! from orphans.
//!
//! Docker's rule (the owner's host and pid, `corral_core::labels`) needs
//! the owner on the judge's host; a cluster's corrals run anywhere. So
//! each corral process using this backend holds a `coordination.k8s.io/v1`
//! Lease in its namespace, renewed every third of its duration by a
//! background task, and every pod it makes carries the Lease's name
//! ([`LEASE_LABEL`]). A pod is its live owner's while that Lease exists
//! and was renewed within its duration (plus [`CLOCK_SKEW`]); otherwise it
//! is an orphan, which `corral gc` removes from any host. Persistent pods
//! stay persistent whatever their Lease says.
//!
//! The Lease is made when the process first makes a pod, deleted by
//! [`LeaseKeeper::release`] on a clean shutdown, and otherwise expires;
//! `gc` deletes expired ones ([`expired`]). A Lease whose name another
//! holder took is an error, never shared.
//!
//! The judgment ([`ownership`], [`expired`]) and the objects
//! ([`lease_name`], [`lease_object`]) are pure and unit-tested here; the
//! keeper does the IO.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_core::labels::{self, Owner, Ownership};
use corral_core::{Error, FailureKind};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::Api;

use crate::error::{api, status_code};

/// On pods: the name of the owner's Lease. On Leases: their own name, so
/// corral's Leases are listed by it.
pub const LEASE_LABEL: &str = "corral.lease";

/// How far two hosts' clocks may disagree before a live owner's Lease
/// would look expired: the renewal time is the holder's clock, the judge
/// compares it with its own.
pub const CLOCK_SKEW: Duration = Duration::from_secs(10);

/// The shortest Lease corral holds, whatever it is asked for: renewing
/// more often than every few seconds only loads the API server.
pub const MIN_DURATION: Duration = Duration::from_secs(10);

/// The longest a host name may take in a Lease name.
const HOST_CHARS: usize = 30;

/// The Lease name of a process: `corral-owner-<host>-<pid>-<random>`, an
/// RFC 1123 label (at most 63 characters, so it is also a label value):
/// the host lowercased, every run of other characters one `-`, cut to 30.
pub fn lease_name(host: &str, pid: u32, random: &str) -> String {
    let mut h = String::new();
    for c in host.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            h.push(c);
        } else if !h.ends_with('-') {
            h.push('-');
        }
        if h.len() >= HOST_CHARS {
            break;
        }
    }
    let h = h.trim_matches('-');
    let h = if h.is_empty() { "host" } else { h };
    format!("corral-owner-{h}-{pid}-{random}")
}

/// The Lease's holder: the owner record as `host/pid/start`.
pub fn holder_identity(owner: &Owner) -> String {
    format!("{}/{}/{}", owner.host, owner.pid, owner.start)
}

/// The Lease `name` held by `holder` for `duration_secs`, renewed `now`.
pub fn lease_object(name: &str, holder: &str, duration_secs: i32, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                (LEASE_LABEL.to_string(), name.to_string()),
                (
                    labels::VERSION.to_string(),
                    env!("CARGO_PKG_VERSION").to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Whether `lease` has run out at `now`: last renewed (else acquired,
/// else made) longer ago than its duration plus [`CLOCK_SKEW`]. A Lease
/// with no time at all has run out.
pub fn expired(lease: &Lease, now: Timestamp) -> bool {
    let spec = lease.spec.as_ref();
    let last = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|t| t.0)
        .or_else(|| lease.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let Some(last) = last else {
        return true;
    };
    let duration_ms = i64::from(
        spec.and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0)
            .max(0),
    ) * 1000;
    let deadline = last
        .as_millisecond()
        .saturating_add(duration_ms)
        .saturating_add(CLOCK_SKEW.as_millis() as i64);
    now.as_millisecond() > deadline
}

/// The ownership of a pod with `labels` (corral's, as `labels_of` reads
/// them), given the namespace's corral Leases by name at `now`; `own` is
/// this process's Lease, whose pods are always its live owner's (it is
/// alive, whatever its last renewal managed).
///
/// A pod without a Lease label was made by a corral that held none: it
/// cannot be judged, so it is kept like another host's ([`Ownership::ForeignHost`],
/// removed only by `gc --all`).
pub fn ownership(
    labels: &HashMap<String, String>,
    leases: &HashMap<String, Lease>,
    own: Option<&str>,
    now: Timestamp,
) -> Ownership {
    if labels.get(labels::PERSISTENT).map(String::as_str) == Some("true") {
        return Ownership::Persistent;
    }
    let Some(name) = labels.get(LEASE_LABEL) else {
        return Ownership::ForeignHost;
    };
    if own == Some(name.as_str()) {
        return Ownership::LiveOwner;
    }
    match leases.get(name) {
        Some(lease) if !expired(lease, now) => Ownership::LiveOwner,
        _ => Ownership::Orphan,
    }
}

/// What the keeper knows of its Lease on the server.
#[derive(Debug, Default)]
struct Held {
    /// The last `resourceVersion` it wrote or read (optimistic
    /// concurrency for the next renewal).
    resource_version: Option<String>,
    /// The object's uid, so a release deletes only this object.
    uid: Option<String>,
}

/// What the renewal task shares with the keeper.
struct Shared {
    api: Api<Lease>,
    name: String,
    holder: String,
    duration_secs: i32,
    /// When this process first made its Lease.
    acquired: Timestamp,
    held: Mutex<Held>,
}

/// This process's Lease and the task renewing it; dropping the keeper
/// stops the renewals (the Lease then expires).
pub struct LeaseKeeper {
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl LeaseKeeper {
    /// Makes Lease `name` for `holder` and starts renewing it every third
    /// of `duration` (at least [`MIN_DURATION`]); a failed renewal is
    /// tried again after a quarter of that, so one slow answer of the API
    /// server does not cost a third of the Lease. A Lease of that name
    /// with another holder is an error; one with this holder (a retried
    /// create that went through) is taken over.
    pub async fn acquire(
        api: Api<Lease>,
        name: String,
        holder: String,
        duration: Duration,
    ) -> Result<Self, Error> {
        let duration = duration.max(MIN_DURATION);
        let duration_secs = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
        let shared = Arc::new(Shared {
            api,
            name,
            holder,
            duration_secs,
            acquired: Timestamp::now(),
            held: Mutex::new(Held::default()),
        });
        shared.create().await?;
        let period = duration / 3;
        let renewer = shared.clone();
        let task = tokio::spawn(async move {
            let mut wait = period;
            loop {
                tokio::time::sleep(wait).await;
                wait = match renewer.renew().await {
                    Ok(()) => period,
                    Err(e) => {
                        tracing::warn!(lease = %renewer.name, error = %e,
                            "renewing this process's Lease failed; once it expires, other \
                             corrals may remove its pods as orphans");
                        period / 4
                    }
                };
            }
        });
        Ok(LeaseKeeper {
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    /// The Lease's name (the value of [`LEASE_LABEL`] on our pods).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Stops renewing and deletes the Lease (only the object this keeper
    /// made), so other corrals see this process's pods as orphans at once.
    /// One already gone is fine.
    pub async fn release(&self) {
        if let Some(task) = self.task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
        let uid = self.shared.held.lock().ok().and_then(|h| h.uid.clone());
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.shared.api.delete(&self.shared.name, &params).await {
            Ok(_) => {}
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => {}
            Err(e) => {
                tracing::warn!(lease = %self.shared.name, error = %e,
                    "deleting this process's Lease failed; it expires instead")
            }
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Ok(mut task) = self.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
    }
}

impl Shared {
    /// The Lease as it should be now: acquired when first made, renewed
    /// now.
    fn object(&self) -> Lease {
        let mut lease = lease_object(&self.name, &self.holder, self.duration_secs, self.acquired);
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        lease
    }

    fn remember(&self, lease: &Lease) {
        if let Ok(mut held) = self.held.lock() {
            held.resource_version = lease.metadata.resource_version.clone();
            held.uid = lease.metadata.uid.clone();
        }
    }

    /// The error for a Lease of our name that another holder has.
    fn taken(&self, holder: Option<&str>) -> Error {
        Error::Engine {
            op: format!("hold Lease {}", self.name),
            kind: FailureKind::Unsupported,
            source: format!(
                "it is held by {}, not by this process ({}); corral never shares a Lease",
                holder.unwrap_or("nobody"),
                self.holder
            )
            .into(),
        }
    }

    fn holder_of(lease: &Lease) -> Option<&str> {
        lease.spec.as_ref()?.holder_identity.as_deref()
    }

    /// Creates the Lease; on a name conflict takes over one we hold.
    async fn create(&self) -> Result<(), Error> {
        let what = format!("create Lease {}", self.name);
        match self
            .api
            .create(&PostParams::default(), &self.object())
            .await
        {
            Ok(lease) => {
                self.remember(&lease);
                Ok(())
            }
            Err(e) if status_code(&e) == Some(409) => {
                let existing = self
                    .api
                    .get(&self.name)
                    .await
                    .map_err(|e| api(format!("read Lease {}", self.name), e))?;
                if Self::holder_of(&existing) != Some(self.holder.as_str()) {
                    return Err(self.taken(Self::holder_of(&existing)));
                }
                self.remember(&existing);
                self.renew().await
            }
            Err(e) => Err(api(what, e)),
        }
    }

    /// Writes a fresh renewal time over the version last seen. A conflict
    /// (someone wrote it meanwhile) re-reads it and tries once more if it
    /// is still ours; a Lease deleted meanwhile (a `gc` that judged us
    /// gone while renewals failed, or a person) is made again.
    async fn renew(&self) -> Result<(), Error> {
        for _ in 0..2 {
            let mut lease = self.object();
            let (version, uid) = match self.held.lock() {
                Ok(h) => (h.resource_version.clone(), h.uid.clone()),
                Err(_) => (None, None),
            };
            lease.metadata.resource_version = version;
            lease.metadata.uid = uid;
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(lease) => {
                    self.remember(&lease);
                    return Ok(());
                }
                Err(e) if status_code(&e) == Some(404) => {
                    tracing::warn!(lease = %self.name,
                        "this process's Lease was deleted; making it again");
                    return Box::pin(self.create()).await;
                }
                Err(e) if status_code(&e) == Some(409) => {
                    let current = self
                        .api
                        .get(&self.name)
                        .await
                        .map_err(|e| api(format!("read Lease {}", self.name), e))?;
                    if Self::holder_of(&current) != Some(self.holder.as_str()) {
                        return Err(self.taken(Self::holder_of(&current)));
                    }
                    self.remember(&current);
                }
                Err(e) => return Err(api(format!("renew Lease {}", self.name), e)),
            }
        }
        Err(Error::Engine {
            op: format!("renew Lease {}", self.name),
            kind: FailureKind::DaemonUnavailable,
            source: "it kept changing under this process".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid time")
    }

    fn lease(name: &str, renewed: i64, duration: i32) -> Lease {
        lease_object(name, "h/1/2", duration, at(renewed))
    }

    fn pod(lease: Option<&str>) -> HashMap<String, String> {
        let mut l = HashMap::from([(labels::SANDBOX.to_string(), "sb-1".to_string())]);
        if let Some(name) = lease {
            l.insert(LEASE_LABEL.into(), name.into());
        }
        l
    }

    #[test]
    fn a_lease_expires_after_its_duration_and_the_clock_skew() {
        let skew = CLOCK_SKEW.as_secs() as i64;
        let l = lease("l", 1_000, 60);
        assert!(!expired(&l, at(1_000)));
        assert!(!expired(&l, at(1_060)), "within the duration");
        assert!(!expired(&l, at(1_060 + skew)), "within the skew allowance");
        assert!(expired(&l, at(1_061 + skew)));
        // Renewal time first, then acquisition, then creation.
        let mut acquired_only = l.clone();
        if let Some(s) = acquired_only.spec.as_mut() {
            s.renew_time = None;
            s.acquire_time = Some(MicroTime(at(2_000)));
        }
        assert!(!expired(&acquired_only, at(2_050)));
        let mut made_only = Lease::default();
        made_only.metadata.creation_timestamp = Some(Time(at(3_000)));
        assert!(
            !expired(&made_only, at(3_000 + skew)),
            "no duration: skew only"
        );
        assert!(expired(&made_only, at(3_001 + skew)));
        assert!(expired(&Lease::default(), at(0)), "no time at all");
        let mut negative = l;
        if let Some(s) = negative.spec.as_mut() {
            s.lease_duration_seconds = Some(-100);
        }
        assert!(expired(&negative, at(1_001 + skew)));
    }

    #[test]
    fn pods_are_judged_by_their_owners_lease() {
        let now = at(10_000);
        let leases = HashMap::from([
            ("live".to_string(), lease("live", 9_990, 60)),
            ("stale".to_string(), lease("stale", 9_000, 60)),
        ]);
        let judge = |labels: &HashMap<String, String>, own| ownership(labels, &leases, own, now);
        assert_eq!(judge(&pod(Some("live")), None), Ownership::LiveOwner);
        assert_eq!(judge(&pod(Some("stale")), None), Ownership::Orphan);
        assert_eq!(judge(&pod(Some("gone")), None), Ownership::Orphan);
        // Our own pods are ours even when our renewals fell behind.
        assert_eq!(
            judge(&pod(Some("stale")), Some("stale")),
            Ownership::LiveOwner
        );
        assert_eq!(
            judge(&pod(Some("gone")), Some("gone")),
            Ownership::LiveOwner
        );
        // No Lease label: made by a corral without Leases; not judged.
        assert_eq!(judge(&pod(None), None), Ownership::ForeignHost);
        // Persistent pods stay, whatever their Lease.
        let mut persistent = pod(Some("gone"));
        persistent.insert(labels::PERSISTENT.into(), "true".into());
        assert_eq!(judge(&persistent, None), Ownership::Persistent);
        persistent.insert(labels::PERSISTENT.into(), "false".into());
        assert_eq!(judge(&persistent, None), Ownership::Orphan);
    }

    #[test]
    fn lease_names_are_dns_labels_from_the_host() {
        let name = lease_name("node-a.example.com", 4242, "0a1b2c3d");
        assert_eq!(name, "corral-owner-node-a-example-com-4242-0a1b2c3d");
        assert!(crate::pod::is_dns_label(&name) && crate::pod::is_label_value(&name));
        let odd = lease_name("__My_Host__", 1, "ff");
        assert_eq!(odd, "corral-owner-my-host-1-ff");
        assert_eq!(lease_name("", 1, "ff"), "corral-owner-host-1-ff");
        assert_eq!(lease_name("...", 1, "ff"), "corral-owner-host-1-ff");
        let long = lease_name(&"x".repeat(200), u32::MAX, "0a1b2c3d");
        assert!(crate::pod::is_dns_label(&long), "{long} ({})", long.len());
        let unicode = lease_name("höst-ñ", 7, "00");
        assert!(crate::pod::is_dns_label(&unicode), "{unicode}");
    }

    #[test]
    fn the_lease_object_names_its_holder_and_duration() {
        let owner = Owner {
            host: "node-a".into(),
            pid: 42,
            start: 7,
        };
        let holder = holder_identity(&owner);
        assert_eq!(holder, "node-a/42/7");
        let l = lease_object("corral-owner-node-a-42-ff", &holder, 60, at(5));
        let spec = l.spec.as_ref().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a/42/7"));
        assert_eq!(spec.lease_duration_seconds, Some(60));
        assert_eq!(spec.renew_time, Some(MicroTime(at(5))));
        let labels = l.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[LEASE_LABEL], "corral-owner-node-a-42-ff");
        assert!(labels.contains_key(labels::VERSION));
    }
}
