//! The backend's side of ownership by Lease (`crate::lease`): this
//! process's Lease, made with its first pod and carried by every pod it
//! makes; judging listed pods by their owners' Leases; deleting expired
//! Leases at `gc`; and giving ours up at close.

use std::collections::HashMap;

use corral_core::backend::{Placement, StartRequest};
use corral_core::labels::{Owner, Ownership};
use corral_core::Error;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::Api;

use super::{api_err, KubeBackend};
use crate::error::status_code;
use crate::lease::{self, LeaseKeeper, LEASE_LABEL};

/// The Leases of the namespace at one moment, and ours: judges pods.
pub(super) struct OwnershipJudge {
    leases: HashMap<String, Lease>,
    own: Option<String>,
    now: Timestamp,
}

impl OwnershipJudge {
    /// The ownership of a pod with corral's `labels`.
    pub(super) fn ownership(&self, labels: &HashMap<String, String>) -> Ownership {
        lease::ownership(labels, &self.leases, self.own.as_deref(), self.now)
    }
}

impl KubeBackend {
    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.inner.client.clone(), &self.inner.namespace)
    }

    /// This process's Lease, made (and renewed from then on) on first use.
    pub(crate) async fn ensure_lease(&self, owner: &Owner) -> Result<&LeaseKeeper, Error> {
        self.inner
            .lease
            .get_or_try_init(|| async {
                let name = lease::lease_name(&owner.host, owner.pid, &self.suffix());
                LeaseKeeper::acquire(
                    self.leases(),
                    name,
                    lease::holder_identity(owner),
                    self.inner.config.lease_duration,
                )
                .await
            })
            .await
    }

    /// Creates `req`'s pod carrying this process's Lease (made first, so
    /// no pod of ours is ever seen without it), with its session's claim
    /// when it is persistent, then records the pod on the claim.
    pub(super) async fn create_owned(&self, req: &StartRequest<'_>) -> Result<Placement, Error> {
        let keeper = self.ensure_lease(req.owner).await?;
        let mut labels = req.labels.clone();
        labels.insert(LEASE_LABEL.to_string(), keeper.name().to_string());
        let owned = StartRequest {
            labels,
            ..req.clone()
        };
        let claim = match &req.spec.persistent {
            Some(key) => Some(self.ensure_claim(key).await?),
            None => None,
        };
        let placement = self.do_create(&owned, claim.as_deref()).await?;
        if let Some(claim) = &claim {
            self.record_claim(claim, &placement, req.sandbox_id).await;
        }
        Ok(placement)
    }

    /// Lists corral's Leases for judging pods listed just before.
    pub(super) async fn ownership_judge(&self) -> Result<OwnershipJudge, Error> {
        let api = self.leases();
        let params = ListParams::default().labels(LEASE_LABEL);
        let list = self
            .call("list Leases", || api.list(&params))
            .await
            .map_err(|e| api_err("list Leases (who owns corral's pods)", e))?;
        Ok(OwnershipJudge {
            leases: list
                .items
                .into_iter()
                .filter_map(|l| Some((l.metadata.name.clone()?, l)))
                .collect(),
            own: self.inner.lease.get().map(|k| k.name().to_string()),
            now: Timestamp::now(),
        })
    }

    /// Deletes corral's expired Leases but ours (each only as it was when
    /// judged: one renewed meanwhile stays). Runs after `gc` removed their
    /// orphans; a persistent pod's Lease may go too (persistent pods are
    /// judged without it). Returns `lease/NAME` for each.
    pub(super) async fn remove_expired_leases(&self) -> Result<Vec<String>, Error> {
        let api = self.leases();
        let judge = self.ownership_judge().await?;
        let mut removed = Vec::new();
        for (name, l) in &judge.leases {
            if judge.own.as_deref() == Some(name.as_str()) || !lease::expired(l, judge.now) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: l.metadata.uid.clone(),
                    resource_version: l.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            match api.delete(name, &params).await {
                Ok(_) => removed.push(format!("lease/{name}")),
                // Gone, or renewed since: its holder is back.
                Err(e) if matches!(status_code(&e), Some(404 | 409)) => {}
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "gc could not delete an expired Lease")
                }
            }
        }
        removed.sort();
        Ok(removed)
    }

    /// The name of this process's Lease, once made (its pods and egress
    /// objects carry it as `corral.lease`).
    pub fn lease_name(&self) -> Option<String> {
        self.inner.lease.get().map(|k| k.name().to_string())
    }

    /// Gives up this process's Lease (see `Backend::close`).
    pub(super) async fn release_lease(&self) {
        if let Some(keeper) = self.inner.lease.get() {
            keeper.release().await;
        }
    }
}
