//! Whether pods of this namespace may give their agent what in-place reset
//! needs (CAP_SYS_ADMIN, CAP_SYS_CHROOT and CAP_SETPCAP, for the agent
//! alone), and why not.
//!
//! Two sources, both the cluster's own answer: the namespace's Pod
//! Security level (`pod-security.kubernetes.io/enforce`: `baseline` and
//! `restricted` forbid adding CAP_SYS_ADMIN), read when this process can
//! read its namespace; and the API server's refusal of a pod that asks
//! for them (Pod Security, an admission webhook or policy): such a create
//! is retried at once without them, and when that one is admitted the
//! refusal was about in-place reset. Either way the sandbox starts, its
//! agent tells the runtime why it cannot reset in place (so a reset
//! replaces the pod and says why), and the reason is logged once. A
//! refusal is remembered for [`RECHECK`], so that a namespace relabelled
//! meanwhile is seen without a restart.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use super::{lock, KubeBackend};
use crate::error::status_code;

/// How long a finding (the namespace's level, a refusal) stands before
/// the namespace is read again.
const RECHECK: Duration = Duration::from_secs(600);

/// The Pod Security label that decides what pods the namespace admits.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// What this process last found out.
#[derive(Default)]
pub(crate) struct PristineGate {
    finding: Mutex<Option<Finding>>,
    /// The reason last logged, so each is logged once.
    logged: Mutex<Option<String>>,
}

#[derive(Clone)]
struct Finding {
    at: Instant,
    refusal: Option<String>,
}

/// The reason a namespace labelled `labels` refuses the agent's extra
/// capabilities; `None` when its level allows them or none is set (the
/// cluster's default then decides, and a refusal shows at the create).
pub fn pod_security_refusal(namespace: &str, labels: &BTreeMap<String, String>) -> Option<String> {
    let level = labels.get(ENFORCE_LABEL)?;
    matches!(level.as_str(), "baseline" | "restricted").then(|| {
        format!(
            "namespace {namespace} enforces Pod Security '{level}' ({ENFORCE_LABEL}), which \
             forbids the CAP_SYS_ADMIN the agent needs to reset in place; a namespace at \
             'privileged' allows it"
        )
    })
}

/// Whether a refused create may have been refused for the agent's extra
/// capabilities: an admission refusal (Pod Security, a webhook, a policy:
/// 400, 403 or 422), not a missing permission (RBAC's 403 says the user
/// "cannot create resource"). Only a retry without them tells for sure.
pub fn maybe_refused_for_pristine(e: &kube::Error) -> bool {
    let kube::Error::Api(status) = e else {
        return false;
    };
    matches!(status_code(e), Some(400 | 403 | 422)) && !status.message.contains("cannot create")
}

impl KubeBackend {
    /// Why pods may not give their agent what in-place reset needs now;
    /// `None` when nothing says so. Reads the namespace's labels when
    /// the last finding is older than [`RECHECK`] (a namespace this
    /// process may not read tells nothing).
    pub(super) async fn pristine_refusal(&self) -> Option<String> {
        let gate = &self.inner.pristine;
        if let Some(f) = lock(&gate.finding).clone() {
            if f.at.elapsed() < RECHECK {
                return f.refusal;
            }
        }
        let namespaces: Api<Namespace> = Api::all(self.inner.client.clone());
        let refusal = match namespaces.get(&self.inner.namespace).await {
            Ok(ns) => pod_security_refusal(
                &self.inner.namespace,
                &ns.metadata.labels.unwrap_or_default(),
            ),
            Err(e) => {
                tracing::debug!(namespace = %self.inner.namespace, error = %e,
                    "cannot read the namespace's Pod Security level; a refusal will show at the create");
                None
            }
        };
        self.note_pristine(refusal.clone());
        refusal
    }

    /// Records what was found (a refusal the API server gave, or what the
    /// namespace says), logging each new reason once.
    pub(super) fn note_pristine(&self, refusal: Option<String>) {
        let gate = &self.inner.pristine;
        *lock(&gate.finding) = Some(Finding {
            at: Instant::now(),
            refusal: refusal.clone(),
        });
        let mut logged = lock(&gate.logged);
        if refusal.is_some() && *logged != refusal {
            tracing::warn!(namespace = %self.inner.namespace,
                reason = refusal.as_deref().unwrap_or_default(),
                "pristine sandboxes cannot reset in place here; each reset replaces the pod");
        }
        *logged = refusal;
    }

    /// What `doctor` says of in-place reset from the namespace alone (not
    /// a protection: `ok` false means pristine sandboxes fall back to
    /// replacement).
    pub async fn pristine_check(&self) -> corral_core::backend::Check {
        let namespaces: Api<Namespace> = Api::all(self.inner.client.clone());
        let (ok, detail) = match namespaces.get(&self.inner.namespace).await {
            Ok(ns) => {
                let labels = ns.metadata.labels.unwrap_or_default();
                match pod_security_refusal(&self.inner.namespace, &labels) {
                    Some(why) => (
                        false,
                        format!(
                            "unavailable: {why}; pristine sandboxes are replaced at each reset"
                        ),
                    ),
                    None => (
                        true,
                        format!(
                            "Pod Security '{}' admits the agent's CAP_SYS_ADMIN; whether the \
                             nodes' seccomp and AppArmor let it mount shows in the probe below",
                            labels
                                .get(ENFORCE_LABEL)
                                .map_or("privileged (no label: the cluster's default)", |l| l)
                        ),
                    ),
                }
            }
            Err(e) => (
                true,
                format!(
                    "cannot read namespace {} ({e}): a Pod Security refusal shows at the first \
                     pristine create, which then starts without in-place reset",
                    self.inner.namespace
                ),
            ),
        };
        corral_core::backend::Check {
            name: "in-place reset (Pod Security)".into(),
            ok,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn baseline_and_restricted_refuse_privileged_and_no_label_do_not() {
        let labels = |level: &str| BTreeMap::from([(ENFORCE_LABEL.to_string(), level.to_string())]);
        for level in ["baseline", "restricted"] {
            let why = pod_security_refusal("rl", &labels(level)).expect("refused");
            assert!(why.contains("namespace rl"), "{why}");
            assert!(why.contains(&format!("'{level}'")), "{why}");
            assert!(why.contains("CAP_SYS_ADMIN"), "{why}");
        }
        assert_eq!(pod_security_refusal("rl", &labels("privileged")), None);
        assert_eq!(pod_security_refusal("rl", &BTreeMap::new()), None);
        // Only enforce decides; audit and warn admit the pod.
        let warn = BTreeMap::from([(
            "pod-security.kubernetes.io/warn".to_string(),
            "restricted".to_string(),
        )]);
        assert_eq!(pod_security_refusal("rl", &warn), None);
    }

    fn refused(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            message: message.into(),
            reason: "Forbidden".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn an_admission_refusal_may_be_about_pristine_a_missing_permission_is_not() {
        assert!(maybe_refused_for_pristine(&refused(
            403,
            "pods \"corral-sb-1-x\" is forbidden: violates PodSecurity \"baseline:latest\": \
             non-default capabilities (container \"sandbox\" must not include \"SYS_ADMIN\" in \
             securityContext.capabilities.add)"
        )));
        assert!(maybe_refused_for_pristine(&refused(
            400,
            "admission webhook \"validation.gatekeeper.sh\" denied the request"
        )));
        assert!(maybe_refused_for_pristine(&refused(
            422,
            "ValidatingAdmissionPolicy denied"
        )));
        assert!(!maybe_refused_for_pristine(&refused(
            403,
            "pods is forbidden: User \"system:serviceaccount:x:corral\" cannot create resource \
             \"pods\" in API group \"\" in the namespace \"x\""
        )));
        assert!(!maybe_refused_for_pristine(&refused(409, "exists")));
        assert!(!maybe_refused_for_pristine(&refused(500, "etcd")));
    }
}
