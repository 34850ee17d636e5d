//! The backend's side of persistent sessions (`crate::session`): the
//! session's claim, made or checked before its pod, the pod recorded on
//! it after, and the recorded pod looked up for adoption.

use corral_core::backend::Placement;
use corral_core::Error;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

use super::{api_err, KubeBackend};
use crate::error::status_code;
use crate::session::{self, ClaimParams};

impl KubeBackend {
    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.inner.client.clone(), &self.inner.namespace)
    }

    /// Session `key`'s claim, made when missing; returns its name. One of
    /// that name made for another key is an error, never mounted. A claim
    /// made earlier keeps its size and class.
    pub(super) async fn ensure_claim(&self, key: &str) -> Result<String, Error> {
        let config = &self.inner.config;
        let wanted = session::claim(&ClaimParams {
            key,
            size: config.session_volume_size,
            storage_class: config.session_storage_class.as_deref(),
        });
        let name = session::claim_name(key);
        let api = self.claims();
        let what = format!("read PersistentVolumeClaim {name} of session {key:?}");
        if let Some(existing) = self
            .call(&what, || api.get_opt(&name))
            .await
            .map_err(|e| api_err(what.clone(), e))?
        {
            session::check_claim(&existing, key)?;
            return Ok(name);
        }
        let what = format!("create PersistentVolumeClaim {name} of session {key:?}");
        let post = PostParams::default();
        match self.call(&what, || api.create(&post, &wanted)).await {
            Ok(_) => Ok(name),
            // Made meanwhile (another corral, or a retried create).
            Err(e) if status_code(&e) == Some(409) => {
                let existing = api
                    .get(&name)
                    .await
                    .map_err(|e| api_err(format!("read PersistentVolumeClaim {name}"), e))?;
                session::check_claim(&existing, key)?;
                Ok(name)
            }
            Err(e) => Err(api_err(what, e)),
        }
    }

    /// Records `placement` (with its uid) on session claim `claim` as the
    /// session's pod. Best effort: without the record the next corral
    /// replaces the pod instead of adopting it (the claim keeps the files).
    pub(super) async fn record_claim(&self, claim: &str, placement: &Placement, sandbox: &str) {
        let pod = placement.id();
        let uid = match self.inner.pods.get(pod).await {
            Ok(p) => p.metadata.uid,
            Err(e) => {
                tracing::warn!(sandbox, pod, error = %e, "reading a persistent pod's uid failed; it will not be adopted");
                return;
            }
        };
        let Some(uid) = uid else {
            return;
        };
        let patch = Patch::Merge(session::record_patch(pod, &uid));
        if let Err(e) = self
            .claims()
            .patch(claim, &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!(sandbox, pod, claim, error = %e, "recording a persistent pod on its session's claim failed; it will not be adopted");
        }
    }

    /// The pod recorded on session `key`'s claim, while a pod of that name
    /// and uid exists.
    pub(super) async fn recorded_session_pod(&self, key: &str) -> Result<Option<Placement>, Error> {
        let name = session::claim_name(key);
        let api = self.claims();
        let what = format!("read PersistentVolumeClaim {name} of session {key:?}");
        let Some(claim) = self
            .call(&what, || api.get_opt(&name))
            .await
            .map_err(|e| api_err(what.clone(), e))?
        else {
            return Ok(None);
        };
        if session::check_claim(&claim, key).is_err() {
            return Ok(None);
        }
        let Some((pod, uid)) = session::recorded_pod(&claim) else {
            return Ok(None);
        };
        let pods = &self.inner.pods;
        let what = format!("read pod {pod} of session {key:?}");
        let found = self
            .call(&what, || pods.get_opt(pod))
            .await
            .map_err(|e| api_err(what.clone(), e))?;
        Ok(found
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
            .map(|_| Placement(pod.to_string())))
    }
}
