//! `corral doctor` on Kubernetes: the API server, the permissions corral
//! needs in its namespace (asked with SelfSubjectAccessReviews, so the
//! answer is the cluster's own), the RuntimeClasses on offer, whether the
//! nodes can run the agent image (a short-lived pod runs only
//! `corral-agent --version` from it), whether the namespace's Pod Security
//! level admits in-place reset, and what cannot be checked from the API.

use std::collections::{BTreeMap, HashMap};

use corral_core::backend::Check;
use corral_core::labels::{self, Owner};
use corral_core::Error;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, LogParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::Api;

use crate::error::api;
use crate::lease::LEASE_LABEL;
use crate::pod::{agent_container, AGENT_INIT_CONTAINER};
use crate::state::IMAGE_REASONS;
use crate::KubeBackend;

/// Every permission the backend uses: (API group, resource, subresource,
/// verb), as `deploy/kubernetes/rbac.yaml` grants them.
pub const PERMISSIONS: &[(&str, &str, &str, &str)] = &[
    ("", "pods", "", "create"),
    ("", "pods", "", "get"),
    ("", "pods", "", "list"),
    ("", "pods", "", "watch"),
    ("", "pods", "", "delete"),
    ("", "pods", "portforward", "create"),
    // An egress gateway's counts (`corral-agent egress-stats`).
    ("", "pods", "exec", "create"),
    // Only `doctor`'s agent image check and the NetworkPolicy probe read
    // a log.
    ("", "pods", "log", "get"),
    // A pull back-off's cause is in the pod's events.
    ("", "events", "", "list"),
    ("", "persistentvolumeclaims", "", "create"),
    ("", "persistentvolumeclaims", "", "get"),
    ("", "persistentvolumeclaims", "", "patch"),
    ("coordination.k8s.io", "leases", "", "create"),
    ("coordination.k8s.io", "leases", "", "get"),
    ("coordination.k8s.io", "leases", "", "list"),
    ("coordination.k8s.io", "leases", "", "update"),
    ("coordination.k8s.io", "leases", "", "delete"),
    ("networking.k8s.io", "networkpolicies", "", "create"),
    ("networking.k8s.io", "networkpolicies", "", "get"),
    // Each egress policy's two, deleted with their sandbox; gc lists them.
    ("networking.k8s.io", "networkpolicies", "", "list"),
    ("networking.k8s.io", "networkpolicies", "", "delete"),
];

/// Label of `doctor`'s agent image check pod (besides a sandbox's labels,
/// so `gc` removes it when `doctor` dies before it does).
pub const DOCTOR_LABEL: &str = "corral.doctor";

/// The pod that runs only `corral-agent --version` from `agent_image`,
/// hardened as the sandboxes' init container, labelled as a sandbox of
/// this process (`labels`: sandbox id, owner, Lease) plus
/// [`DOCTOR_LABEL`].
pub fn version_pod(name: &str, agent_image: &str, labels: &HashMap<String, String>) -> Pod {
    let mut pod_labels: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    pod_labels.insert(DOCTOR_LABEL.into(), "agent-image".into());
    pod_labels.insert(
        labels::VERSION.into(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(pod_labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![agent_container(
                agent_image,
                &["/corral-agent", "--version"],
            )],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        status: None,
    }
}

/// Where the version pod stands: `None` while it runs or waits, else
/// whether the agent ran (or why not).
pub fn version_outcome(pod: &Pod, agent_image: &str) -> Option<Result<(), String>> {
    let status = pod.status.as_ref()?;
    let container = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.name == AGENT_INIT_CONTAINER))
        .and_then(|c| c.state.as_ref());
    if let Some(w) = container.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.as_deref().unwrap_or_default();
        if IMAGE_REASONS.contains(&reason) {
            return Some(Err(format!(
                "the nodes cannot pull {agent_image}: {reason}: {}",
                w.message.as_deref().unwrap_or("no message")
            )));
        }
    }
    if let Some(t) = container.and_then(|s| s.terminated.as_ref()) {
        return Some(if t.exit_code == 0 {
            Ok(())
        } else {
            Err(format!(
                "corral-agent --version exited with {}: {}",
                t.exit_code,
                t.message
                    .as_deref()
                    .or(t.reason.as_deref())
                    .unwrap_or("no message")
            ))
        });
    }
    if let Some(c) = status
        .conditions
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
    {
        if c.status == "False" && c.reason.as_deref() == Some("Unschedulable") {
            return Some(Err(format!(
                "no node can take the check's pod: {}",
                c.message.as_deref().unwrap_or("unschedulable")
            )));
        }
    }
    match status.phase.as_deref() {
        Some("Succeeded") => Some(Ok(())),
        Some("Failed") => Some(Err(format!(
            "the check's pod failed: {}",
            status
                .message
                .as_deref()
                .or(status.reason.as_deref())
                .unwrap_or("no message")
        ))),
        _ => None,
    }
}

/// The check for the agent's `--version` output `text`: this build's
/// version is what every sandbox of this corral expects.
pub fn version_check(text: &str) -> Check {
    let line = text.lines().next().unwrap_or_default().trim();
    let ours = env!("CARGO_PKG_VERSION");
    let version = line.strip_prefix("corral-agent ").map(str::trim);
    match version {
        Some(v) if v == ours => Check {
            name: "agent image".into(),
            ok: true,
            detail: format!("runs on the nodes: {line}"),
        },
        Some(v) => Check {
            name: "agent image".into(),
            ok: false,
            detail: format!(
                "runs on the nodes, but its agent is version {v}, not this corral's {ours} \
                 (kubernetes.agent_image)"
            ),
        },
        None => Check {
            name: "agent image".into(),
            ok: false,
            detail: format!("corral-agent --version printed {line:?}, not a version"),
        },
    }
}

/// What `doctor` found.
#[derive(Debug, Clone)]
pub struct KubeReport {
    /// Where the API server is.
    pub endpoint: String,
    /// Its version (`gitVersion`).
    pub server_version: String,
    /// The sandboxes' namespace.
    pub namespace: String,
    /// The agent's image.
    pub agent_image: String,
    /// One check per permission, then RuntimeClasses, the agent image and
    /// whether NetworkPolicy is enforced (a probe).
    pub checks: Vec<Check>,
    /// Whether the namespace's Pod Security level admits what in-place
    /// reset needs (not a protection: without it, pristine sandboxes are
    /// replaced at each reset).
    pub pristine: Check,
}

impl KubeBackend {
    /// Checks the cluster as `doctor` reports it; `owner` is this process
    /// (the agent image check's pod is labelled as its sandbox).
    pub async fn doctor(&self, owner: &Owner) -> Result<KubeReport, Error> {
        let client = self.client().clone();
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| api("read the API server's version", e))?;
        let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
        let mut checks = Vec::new();
        for (group, resource, sub, verb) in PERMISSIONS {
            let name = if sub.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}/{sub}")
            };
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(self.namespace().to_string()),
                        group: Some(group.to_string()),
                        resource: Some(resource.to_string()),
                        subresource: (!sub.is_empty()).then(|| sub.to_string()),
                        verb: Some(verb.to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let check = match reviews.create(&PostParams::default(), &review).await {
                Ok(answer) => {
                    let status = answer.status.unwrap_or_default();
                    let allowed = status.allowed;
                    Check {
                        name,
                        ok: allowed,
                        detail: match (allowed, status.reason) {
                            (true, _) => "allowed".into(),
                            (false, Some(r)) if !r.is_empty() => format!("denied: {r}"),
                            (false, _) => "denied (see deploy/kubernetes/rbac.yaml)".into(),
                        },
                    }
                }
                Err(e) => Check {
                    name,
                    ok: false,
                    detail: format!("cannot ask (SelfSubjectAccessReview): {e}"),
                },
            };
            checks.push(check);
        }
        let classes: Api<RuntimeClass> = Api::all(client);
        checks.push(match classes.list(&ListParams::default()).await {
            Ok(list) => {
                let names: Vec<String> = list
                    .items
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .collect();
                Check {
                    name: "runtime classes".into(),
                    ok: true,
                    detail: if names.is_empty() {
                        "none: spec.runtime must stay unset".into()
                    } else {
                        format!("{} (spec.runtime)", names.join(", "))
                    },
                }
            }
            Err(e) => Check {
                name: "runtime classes".into(),
                ok: false,
                detail: format!("cannot list: {e}"),
            },
        });
        checks.push(self.agent_image_check(owner).await);
        // A probe, not the API: only the network plugin knows.
        checks.push(self.network_policy_check(owner).await);
        let pristine = self.pristine_check().await;
        Ok(KubeReport {
            pristine,
            endpoint: self.endpoint_url().to_string(),
            server_version: version.git_version,
            namespace: self.namespace().to_string(),
            agent_image: self.config().agent_image.clone(),
            checks,
        })
    }
}

impl KubeBackend {
    /// Runs `corral-agent --version` from the agent image in a pod of its
    /// own, waits (at most `start_timeout_ms`) for it to end, reads what
    /// it printed and deletes the pod (labelled as this process's sandbox:
    /// `gc` removes it if `doctor` dies first).
    async fn agent_image_check(&self, owner: &Owner) -> Check {
        let failed = |detail: String| Check {
            name: "agent image".into(),
            ok: false,
            detail,
        };
        let keeper = match self.ensure_lease(owner).await {
            Ok(k) => k,
            Err(e) => return failed(format!("not checked: {e}")),
        };
        let sandbox = format!("doctor-{}", self.suffix());
        let name = format!("corral-{sandbox}");
        let labels: HashMap<String, String> = owner
            .labels()
            .into_iter()
            .chain([
                (labels::SANDBOX.to_string(), sandbox.clone()),
                (LEASE_LABEL.to_string(), keeper.name().to_string()),
            ])
            .collect();
        let image = self.config().agent_image.clone();
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), self.namespace());
        if let Err(e) = pods
            .create(&PostParams::default(), &version_pod(&name, &image, &labels))
            .await
        {
            return failed(format!("cannot make the check's pod {name}: {e}"));
        }
        let check = self.await_version(&pods, &name, &image).await;
        if let Err(e) = self.do_remove(&name, &sandbox).await {
            tracing::warn!(pod = %name, error = %e, "removing doctor's agent image check pod failed; gc removes it");
        }
        check.unwrap_or_else(failed)
    }

    async fn await_version(
        &self,
        pods: &Api<Pod>,
        name: &str,
        image: &str,
    ) -> Result<Check, String> {
        let timeout = self.config().start_timeout;
        let done = |p: Option<&Pod>| p.is_none_or(|p| version_outcome(p, image).is_some());
        let pod =
            match tokio::time::timeout(timeout, await_condition(pods.clone(), name, done)).await {
                Ok(Ok(Some(pod))) => pod,
                Ok(Ok(None)) => return Err(format!("the check's pod {name} was deleted")),
                Ok(Err(e)) => return Err(format!("cannot watch the check's pod {name}: {e}")),
                Err(_) => {
                    return Err(format!(
                        "the check's pod {name} did not finish within {} ms \
                     (kubernetes.start_timeout_ms)",
                        timeout.as_millis()
                    ))
                }
            };
        version_outcome(&pod, image).unwrap_or(Ok(()))?;
        let params = LogParams {
            container: Some(AGENT_INIT_CONTAINER.into()),
            limit_bytes: Some(4096),
            ..Default::default()
        };
        let text = pods
            .logs(name, &params)
            .await
            .map_err(|e| format!("the agent ran, but its output cannot be read (pods/log): {e}"))?;
        Ok(version_check(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodStatus,
    };

    fn with_status(status: PodStatus) -> Pod {
        Pod {
            status: Some(status),
            ..Pod::default()
        }
    }

    fn container(state: ContainerState) -> PodStatus {
        PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: AGENT_INIT_CONTAINER.into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn the_version_pod_runs_only_the_agent_hardened_and_labelled() {
        let labels = HashMap::from([
            (labels::SANDBOX.to_string(), "doctor-1".to_string()),
            (LEASE_LABEL.to_string(), "corral-owner-h-1-ff".to_string()),
        ]);
        let pod = version_pod("corral-doctor-1", "registry/corral-agent:9", &labels);
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l[labels::SANDBOX], "doctor-1");
        assert_eq!(l[LEASE_LABEL], "corral-owner-h-1-ff");
        assert_eq!(l[DOCTOR_LABEL], "agent-image");
        let spec = pod.spec.as_ref().expect("spec");
        assert!(spec.init_containers.is_none());
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry/corral-agent:9"));
        assert_eq!(
            c.command,
            Some(vec!["/corral-agent".to_string(), "--version".to_string()])
        );
        let sec = c.security_context.as_ref().expect("hardened");
        assert_eq!(sec.run_as_non_root, Some(true));
        assert_eq!(sec.allow_privilege_escalation, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
    }

    #[test]
    fn the_version_pod_ends_ran_or_failed_typed() {
        assert_eq!(version_outcome(&Pod::default(), "img"), None);
        assert_eq!(
            version_outcome(
                &with_status(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                }),
                "img"
            ),
            None
        );
        let done = container(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(version_outcome(&with_status(done), "img"), Some(Ok(())));
        let crashed = container(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 127,
                reason: Some("StartError".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let e = version_outcome(&with_status(crashed), "img").expect("ended");
        assert!(e.is_err_and(|e| e.contains("127") && e.contains("StartError")));
        let pull = container(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("not found".into()),
            }),
            ..Default::default()
        });
        let e = version_outcome(&with_status(pull), "corral-agent:9").expect("ended");
        assert!(e.is_err_and(|e| e.contains("cannot pull corral-agent:9")));
        let creating = container(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        });
        assert_eq!(version_outcome(&with_status(creating), "img"), None);
        let full = PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let e = version_outcome(&with_status(full), "img").expect("ended");
        assert!(e.is_err_and(|e| e.contains("0/3 nodes")));
    }

    /// `deploy/kubernetes/rbac.yaml` grants exactly what the backend uses:
    /// every permission `doctor` checks, and no rule beyond them.
    #[test]
    fn the_shipped_role_grants_exactly_the_permissions() {
        let text = include_str!("../../../deploy/kubernetes/rbac.yaml");
        let mut granted = Vec::new();
        for doc in text.split("\n---") {
            let doc: yaml_serde::Value = yaml_serde::from_str(doc).expect("rbac.yaml parses");
            if doc["kind"].as_str() != Some("Role") {
                continue;
            }
            let strings = |v: &yaml_serde::Value| -> Vec<String> {
                v.as_sequence()
                    .expect("a list")
                    .iter()
                    .map(|s| s.as_str().expect("a string").to_string())
                    .collect()
            };
            for rule in doc["rules"].as_sequence().expect("rules") {
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            granted.push((group.clone(), resource.clone(), verb));
                        }
                    }
                }
            }
        }
        let mut wanted: Vec<(String, String, String)> = PERMISSIONS
            .iter()
            .map(|(group, resource, sub, verb)| {
                let resource = if sub.is_empty() {
                    resource.to_string()
                } else {
                    format!("{resource}/{sub}")
                };
                (group.to_string(), resource, verb.to_string())
            })
            .collect();
        // A port-forward and an exec are websocket upgrades of a GET; the
        // Role grants both verbs.
        wanted.push(("".into(), "pods/portforward".into(), "get".into()));
        wanted.push(("".into(), "pods/exec".into(), "get".into()));
        granted.sort();
        wanted.sort();
        assert_eq!(granted, wanted);
    }

    #[test]
    fn the_version_must_be_this_corrals() {
        let ours = env!("CARGO_PKG_VERSION");
        let ok = version_check(&format!("corral-agent {ours}\n"));
        assert!(ok.ok, "{ok:?}");
        assert!(ok.detail.contains(ours));
        let old = version_check("corral-agent 0.0.1\n");
        assert!(!old.ok && old.detail.contains("0.0.1"), "{old:?}");
        let junk = version_check("exec format error");
        assert!(
            !junk.ok && junk.detail.contains("not a version"),
            "{junk:?}"
        );
        assert!(!version_check("").ok);
    }
}
