//! `corral doctor` on Kubernetes: the API server, the permissions corral
//! needs in its namespace (asked with SelfSubjectAccessReviews, so the
//! answer is the cluster's own), the RuntimeClasses on offer, and what
//! cannot be checked from the API.

use corral_core::backend::Check;
use corral_core::Error;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{ListParams, PostParams};
use kube::Api;

use crate::error::api;
use crate::KubeBackend;

/// Every permission the backend uses: (API group, resource, subresource,
/// verb), as `deploy/kubernetes/rbac.yaml` grants them.
pub const PERMISSIONS: &[(&str, &str, &str, &str)] = &[
    ("", "pods", "", "create"),
    ("", "pods", "", "get"),
    ("", "pods", "", "list"),
    ("", "pods", "", "watch"),
    ("", "pods", "", "delete"),
    ("", "pods", "attach", "create"),
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
];

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
    /// One check per permission, then RuntimeClasses and network policy.
    pub checks: Vec<Check>,
}

impl KubeBackend {
    /// Checks the cluster as `doctor` reports it.
    pub async fn doctor(&self) -> Result<KubeReport, Error> {
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
        checks.push(Check {
            name: "network policies".into(),
            ok: true,
            detail: "enforced only where the cluster's network plugin enforces NetworkPolicy; \
                     the API cannot tell, so network: none isolates only there"
                .into(),
        });
        Ok(KubeReport {
            endpoint: self.endpoint_url().to_string(),
            server_version: version.git_version,
            namespace: self.namespace().to_string(),
            agent_image: self.config().agent_image.clone(),
            checks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Attaching is a websocket upgrade of a GET; the Role grants both.
        wanted.push(("".into(), "pods/attach".into(), "get".into()));
        granted.sort();
        wanted.sort();
        assert_eq!(granted, wanted);
    }
}
