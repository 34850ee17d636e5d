//! The backend's side of egress by name (`crate::egress`): a placement's
//! policies and gateway made before its sandbox pod and deleted after it,
//! the gateway's counts read with the API server's exec, the objects that
//! outlived their sandbox pod collected at `gc`, and the probe telling
//! whether the cluster enforces NetworkPolicy (run before the first
//! sandbox with an egress policy and by `doctor`).

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use corral_core::backend::Check;
use corral_core::egress::{EgressCounts, EgressPolicy};
use corral_core::labels::{Owner, Ownership};
use corral_core::Error;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{AttachParams, DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::Api;
use tokio::io::AsyncReadExt;

use super::{api_err, KubeBackend};
use crate::egress::{
    self, Enforcement, GatewayParams, GatewayPolicyParams, GatewayProgress, EGRESS_FOR_LABEL,
    EGRESS_LABEL, GATEWAY_CONTAINER, PROBE_CONTAINER, PROBE_PORTS, ROLE_GATEWAY, ROLE_LABEL,
    ROLE_SANDBOX,
};
use crate::error::{is_not_found, status_code};
use crate::lease::LEASE_LABEL;

/// Longest wait for the gateway's counts.
const COUNTS_WAIT: Duration = Duration::from_secs(15);
/// How much longer than a start the probe's client may take (its own
/// waits: a minute for the listener, five seconds on the denied port).
const PROBE_EXTRA: Duration = Duration::from_secs(75);

/// How a placement's egress objects are named and labelled.
struct Names {
    gateway: String,
    egress_id: String,
    sandbox_pod: String,
    lease: String,
}

impl KubeBackend {
    fn network_policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.inner.client.clone(), &self.inner.namespace)
    }

    /// Creates `object` with `api`; a name taken by an object of the same
    /// sandbox pod (a retried create) is fine, one taken by anything else
    /// is an error.
    async fn create_egress_object<K>(
        &self,
        api: &Api<K>,
        object: &K,
        kind: &str,
        sandbox_pod: &str,
    ) -> Result<(), Error>
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + k8s_openapi::serde::Serialize
            + std::fmt::Debug,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let what = format!("create {kind} {name} for sandbox pod {sandbox_pod}");
        let post = PostParams::default();
        match self.call(&what, || api.create(&post, object)).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => {
                let existing = api.get(&name).await.map_err(|e2| {
                    api_err(format!("read {kind} {name} after a name conflict"), e2)
                })?;
                let ours = existing
                    .meta()
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(EGRESS_FOR_LABEL))
                    .is_some_and(|v| v == sandbox_pod);
                if ours {
                    Ok(())
                } else {
                    Err(api_err(what, e))
                }
            }
            Err(e) => Err(api_err(what, e)),
        }
    }

    /// Makes the policies and the gateway of sandbox pod `sandbox_pod` and
    /// waits until the gateway runs; returns its address (the sandbox's
    /// resolver). On failure nothing is left.
    pub(super) async fn make_egress(
        &self,
        policy: &EgressPolicy,
        sandbox_id: &str,
        sandbox_pod: &str,
        lease: &str,
    ) -> Result<Ipv4Addr, Error> {
        let names = Names {
            gateway: egress::gateway_name(sandbox_pod, sandbox_id)?,
            egress_id: sandbox_id.to_string(),
            sandbox_pod: sandbox_pod.to_string(),
            lease: lease.to_string(),
        };
        let made = self.make_gateway(policy, &names).await;
        if made.is_err() {
            self.remove_egress(sandbox_pod).await;
        }
        made
    }

    async fn make_gateway(&self, policy: &EgressPolicy, n: &Names) -> Result<Ipv4Addr, Error> {
        let config = &self.inner.config;
        let policies = self.network_policies();
        // The sandbox's confinement first: no pod of it runs without.
        let confine =
            egress::sandbox_policy(&n.egress_id, &n.sandbox_pod, &n.lease, &policy.ports());
        self.create_egress_object(&policies, &confine, "network policy", &n.sandbox_pod)
            .await?;
        let bound = egress::gateway_policy(
            policy,
            &GatewayPolicyParams {
                name: &n.gateway,
                egress_id: &n.egress_id,
                sandbox_pod: &n.sandbox_pod,
                lease: &n.lease,
                nameservers: &config.egress_nameservers,
            },
        )?;
        self.create_egress_object(&policies, &bound, "network policy", &n.sandbox_pod)
            .await?;
        let gateway = egress::gateway_pod(
            policy,
            &GatewayParams {
                name: &n.gateway,
                egress_id: &n.egress_id,
                sandbox_pod: &n.sandbox_pod,
                lease: &n.lease,
                agent_image: &config.agent_image,
                nameservers: &config.egress_nameservers,
            },
        )?;
        self.inner.limiter.acquire().await;
        self.create_egress_object(
            &self.inner.pods,
            &gateway,
            "egress gateway pod",
            &n.sandbox_pod,
        )
        .await?;
        self.await_gateway(&n.gateway, &n.egress_id, GATEWAY_CONTAINER)
            .await
    }

    /// Waits (at most `start_timeout_ms`) until gateway pod `name` runs;
    /// its address, or why it will not run.
    async fn await_gateway(
        &self,
        name: &str,
        sandbox: &str,
        container: &str,
    ) -> Result<Ipv4Addr, Error> {
        let settled = |p: Option<&Pod>| {
            p.is_none_or(|p| egress::gateway_progress(p, container) != GatewayProgress::Pending)
        };
        let timeout = self.inner.config.start_timeout;
        let failed = |reason: String| Error::Network {
            network: name.to_string(),
            reason: format!("the egress gateway pod of sandbox {sandbox} {reason}"),
        };
        let waited = tokio::time::timeout(
            timeout,
            await_condition(self.inner.pods.clone(), name, settled),
        )
        .await;
        let pod = match waited {
            Ok(Ok(Some(pod))) => pod,
            Ok(Ok(None)) => return Err(failed("was deleted while it started".into())),
            Ok(Err(e)) => {
                return Err(Error::EngineLost {
                    op: format!("watch egress gateway pod {name} of sandbox {sandbox}"),
                    source: Box::new(e),
                })
            }
            Err(_) => {
                return Err(failed(format!(
                    "did not run within {} ms (kubernetes.start_timeout_ms)",
                    timeout.as_millis()
                )))
            }
        };
        match egress::gateway_progress(&pod, container) {
            GatewayProgress::Running(ip) => Ok(ip),
            GatewayProgress::Image(reason, message) => Err(crate::state::image_error(
                &self.inner.config.agent_image,
                &reason,
                &message,
            )),
            GatewayProgress::Unschedulable(message) => Err(Error::Capacity {
                sandbox: sandbox.to_string(),
                message: format!("egress gateway pod {name}: {message}"),
            }),
            GatewayProgress::Failed(why) => Err(failed(format!("does not run: {why}"))),
            GatewayProgress::Pending => Err(failed("is still starting".into())),
        }
    }

    /// Deletes the gateway and the policies of sandbox pod `sandbox_pod`
    /// (call it once that pod is gone: its policy confines it until
    /// then). Gone is fine; anything else is logged and left to `gc`.
    pub(super) async fn remove_egress(&self, sandbox_pod: &str) {
        let gateway = egress::gateway_of(sandbox_pod);
        let params = DeleteParams {
            grace_period_seconds: Some(1),
            ..Default::default()
        };
        if let Err(e) = self.inner.pods.delete(&gateway, &params).await {
            if !is_not_found(&e) {
                tracing::warn!(pod = %gateway, error = %e, "deleting an egress gateway failed; gc removes it");
            }
        }
        let policies = self.network_policies();
        for name in [sandbox_pod, gateway.as_str()] {
            if let Err(e) = policies.delete(name, &DeleteParams::default()).await {
                if !is_not_found(&e) {
                    tracing::warn!(policy = %name, error = %e, "deleting an egress network policy failed; gc removes it");
                }
            }
        }
    }

    /// The counts of the newest running gateway of `sandbox_id` (read
    /// with the API server's exec); `None` when it has none.
    pub(super) async fn gateway_counts(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<EgressCounts>, Error> {
        let pods = &self.inner.pods;
        let params = ListParams::default().labels(&format!(
            "{EGRESS_LABEL}={sandbox_id},{ROLE_LABEL}={ROLE_GATEWAY}"
        ));
        let what = format!("list the egress gateways of sandbox {sandbox_id}");
        let list = self
            .call(&what, || pods.list(&params))
            .await
            .map_err(|e| api_err(what.clone(), e))?;
        let Some(name) = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .max_by_key(|p| p.metadata.creation_timestamp.clone())
            .and_then(|p| p.metadata.name)
        else {
            return Ok(None);
        };
        let what = format!("read the counts of egress gateway {name} (sandbox {sandbox_id})");
        let attach = AttachParams::default()
            .container(GATEWAY_CONTAINER)
            .stdin(false)
            .stdout(true)
            .stderr(false);
        let read = async {
            let mut process = pods
                .exec(&name, ["/corral-agent", "egress-stats"], &attach)
                .await
                .map_err(|e| api_err(what.clone(), e))?;
            let mut out = Vec::new();
            if let Some(mut stdout) = process.stdout() {
                stdout
                    .read_to_end(&mut out)
                    .await
                    .map_err(|e| Error::Network {
                        network: name.clone(),
                        reason: format!("{what}: {e}"),
                    })?;
            }
            let _ = process.join().await;
            Ok::<_, Error>(out)
        };
        let out = tokio::time::timeout(COUNTS_WAIT, read)
            .await
            .map_err(|_| Error::Network {
                network: name.clone(),
                reason: format!("{what}: no answer within {} s", COUNTS_WAIT.as_secs()),
            })??;
        serde_json::from_slice(&out)
            .map(Some)
            .map_err(|e| Error::Network {
                network: name.clone(),
                reason: format!(
                    "gateway {name} printed no counts ({e}): {}",
                    String::from_utf8_lossy(&out)
                ),
            })
    }

    /// Deletes the egress objects (gateways, the probe's pods, their
    /// policies) whose sandbox pod is gone, when their owner's Lease is
    /// gone too or they are older than a start may take. Returns
    /// `pod/NAME` and `networkpolicy/NAME` for each.
    pub(super) async fn remove_orphan_egress(&self) -> Result<Vec<String>, Error> {
        let pods = &self.inner.pods;
        // The sandbox pods first: an object listed after them whose pod is
        // missing was made before a pod that does not exist yet, or never
        // will.
        let sandboxes = ListParams::default().labels(&format!("{ROLE_LABEL}={ROLE_SANDBOX}"));
        let live: HashSet<String> = self
            .call("list sandbox pods with an egress policy", || {
                pods.list(&sandboxes)
            })
            .await
            .map_err(|e| api_err("list sandbox pods with an egress policy", e))?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        let ours = ListParams::default().labels(EGRESS_LABEL);
        let gateways = self
            .call("list egress gateway pods", || pods.list(&ours))
            .await
            .map_err(|e| api_err("list egress gateway pods", e))?;
        let policies_api = self.network_policies();
        let policies = self
            .call("list egress network policies", || policies_api.list(&ours))
            .await
            .map_err(|e| api_err("list egress network policies", e))?;
        let judge = self.ownership_judge().await?;
        let now = Timestamp::now();
        let grace = i64::try_from(self.inner.config.start_timeout.as_secs())
            .unwrap_or(i64::MAX)
            .saturating_add(60);
        let orphan = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            let labels: HashMap<String, String> = meta
                .labels
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            let exists = labels
                .get(EGRESS_FOR_LABEL)
                .is_some_and(|p| live.contains(p));
            let alive = matches!(
                judge.ownership(&labels),
                Ownership::LiveOwner | Ownership::ForeignHost | Ownership::Persistent
            );
            let age = meta
                .creation_timestamp
                .as_ref()
                .map_or(i64::MAX, |t| now.as_second() - t.0.as_second());
            egress::is_orphan(exists, alive, age, grace)
        };
        let mut removed = Vec::new();
        let gone = |e: &kube::Error| is_not_found(e);
        for p in gateways.items.iter().filter(|p| orphan(&p.metadata)) {
            let Some(name) = &p.metadata.name else {
                continue;
            };
            let params = DeleteParams {
                grace_period_seconds: Some(1),
                ..Default::default()
            };
            match pods.delete(name, &params).await {
                Ok(_) => removed.push(format!("pod/{name}")),
                Err(e) if gone(&e) => {}
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "gc could not delete an egress pod")
                }
            }
        }
        for np in policies.items.iter().filter(|p| orphan(&p.metadata)) {
            let Some(name) = &np.metadata.name else {
                continue;
            };
            match policies_api.delete(name, &DeleteParams::default()).await {
                Ok(_) => removed.push(format!("networkpolicy/{name}")),
                Err(e) if gone(&e) => {}
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "gc could not delete an egress network policy")
                }
            }
        }
        Ok(removed)
    }

    /// Before a sandbox with an egress policy: the cluster must enforce
    /// NetworkPolicy (probed once per backend), unless the operator
    /// accepts that it does not.
    pub(super) async fn ensure_egress_enforced(
        &self,
        policy: &EgressPolicy,
        owner: &Owner,
    ) -> Result<(), Error> {
        if self.inner.config.accept_unenforced_egress {
            return Ok(());
        }
        let verdict = self
            .inner
            .enforcement
            .get_or_try_init(|| async {
                self.probe_network_policy(owner)
                    .await
                    .map_err(|why| Error::Network {
                        network: "NetworkPolicy".into(),
                        reason: format!(
                            "network.egress '{}': cannot tell whether this cluster enforces \
                         NetworkPolicy, which confines a sandbox to its egress gateway: {why}; \
                         see corral doctor, or set kubernetes.accept_unenforced_egress: true to \
                         run such sandboxes unconfined",
                            policy.allow.join(",")
                        ),
                    })
            })
            .await?;
        match verdict {
            Enforcement::Enforced(_) => Ok(()),
            Enforcement::NotEnforced(seen) => Err(Error::Unsupported {
                what: format!(
                    "network.egress '{}' on Kubernetes: this cluster's network plugin does not \
                     enforce NetworkPolicy ({seen}), so nothing would keep the sandbox from \
                     connecting around its egress gateway; use a plugin that enforces it, or \
                     set kubernetes.accept_unenforced_egress: true to run such sandboxes with \
                     only the gateway's DNS answers between them and the network",
                    policy.allow.join(",")
                ),
            }),
        }
    }

    /// `doctor`'s NetworkPolicy check: the probe's verdict.
    pub async fn network_policy_check(&self, owner: &Owner) -> Check {
        let accepted = self.inner.config.accept_unenforced_egress;
        let (ok, detail) = match self.probe_network_policy(owner).await {
            Ok(Enforcement::Enforced(seen)) => (
                true,
                format!(
                    "enforced ({seen}): network: none, the ingress policy and egress policies \
                     by name confine sandboxes"
                ),
            ),
            Ok(Enforcement::NotEnforced(seen)) if accepted => (
                true,
                format!(
                    "NOT enforced ({seen}); kubernetes.accept_unenforced_egress is true, so \
                     sandboxes with network.egress run with only their gateway's DNS answers \
                     between them and the network, and network: none does not isolate"
                ),
            ),
            Ok(Enforcement::NotEnforced(seen)) => (
                false,
                format!(
                    "NOT enforced ({seen}): sandboxes with network.egress are refused \
                     (kubernetes.accept_unenforced_egress), network: none does not isolate, \
                     and only the agent's handshake guards its port"
                ),
            ),
            Err(why) => (false, format!("cannot tell: {why}")),
        };
        Check {
            name: "network policy".into(),
            ok,
            detail,
        }
    }

    /// Whether the cluster enforces NetworkPolicy: a listener (a gateway
    /// pod with an empty policy, so also proof that a gateway runs here)
    /// and a client confined by a sandbox's policy to the listener's port
    /// 443, trying its port 80 (`corral-agent netpol-probe`). Everything
    /// is deleted after; labelled as egress objects of a pod that never
    /// exists, so `gc` takes what a crash leaves.
    pub async fn probe_network_policy(&self, owner: &Owner) -> Result<Enforcement, String> {
        let keeper = self
            .ensure_lease(owner)
            .await
            .map_err(|e| format!("no Lease for the probe: {e}"))?;
        let sfx = self.suffix();
        let names = Names {
            gateway: format!("corral-netpol-{sfx}-listener"),
            egress_id: format!("netpol-{sfx}"),
            sandbox_pod: format!("corral-netpol-{sfx}"),
            lease: keeper.name().to_string(),
        };
        let client = format!("corral-netpol-{sfx}-client");
        let verdict = self.run_probe(&names, &client).await;
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        for pod in [&names.gateway, &client] {
            if let Err(e) = self.inner.pods.delete(pod, &params).await {
                if !is_not_found(&e) {
                    tracing::warn!(pod = %pod, error = %e, "deleting a NetworkPolicy probe pod failed; gc removes it");
                }
            }
        }
        if let Err(e) = self
            .network_policies()
            .delete(&names.sandbox_pod, &DeleteParams::default())
            .await
        {
            if !is_not_found(&e) {
                tracing::warn!(policy = %names.sandbox_pod, error = %e, "deleting the NetworkPolicy probe's policy failed; gc removes it");
            }
        }
        verdict
    }

    async fn run_probe(&self, n: &Names, client: &str) -> Result<Enforcement, String> {
        let config = &self.inner.config;
        let confine =
            egress::sandbox_policy(&n.egress_id, &n.sandbox_pod, &n.lease, &[PROBE_PORTS.0]);
        self.create_egress_object(
            &self.network_policies(),
            &confine,
            "network policy",
            &n.sandbox_pod,
        )
        .await
        .map_err(|e| e.to_string())?;
        let listener = egress::gateway_pod(
            &EgressPolicy::default(),
            &GatewayParams {
                name: &n.gateway,
                egress_id: &n.egress_id,
                sandbox_pod: &n.sandbox_pod,
                lease: &n.lease,
                agent_image: &config.agent_image,
                nameservers: &[],
            },
        )
        .map_err(|e| e.to_string())?;
        self.create_egress_object(&self.inner.pods, &listener, "probe pod", &n.sandbox_pod)
            .await
            .map_err(|e| e.to_string())?;
        let ip = self
            .await_gateway(&n.gateway, &n.egress_id, GATEWAY_CONTAINER)
            .await
            .map_err(|e| format!("the probe's listener, an egress gateway, does not run: {e}"))?;
        let pod = egress::probe_client_pod(
            client,
            &n.egress_id,
            &n.sandbox_pod,
            &n.lease,
            &config.agent_image,
            ip,
        );
        self.create_egress_object(&self.inner.pods, &pod, "probe pod", &n.sandbox_pod)
            .await
            .map_err(|e| e.to_string())?;
        let done = |p: Option<&Pod>| {
            p.is_none_or(|p| {
                matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
        };
        let wait = config.start_timeout + PROBE_EXTRA;
        match tokio::time::timeout(wait, await_condition(self.inner.pods.clone(), client, done))
            .await
        {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return Err(format!("the probe's client {client} was deleted")),
            Ok(Err(e)) => return Err(format!("cannot watch the probe's client {client}: {e}")),
            Err(_) => {
                return Err(format!(
                    "the probe's client {client} did not finish within {} s",
                    wait.as_secs()
                ))
            }
        }
        let params = LogParams {
            container: Some(PROBE_CONTAINER.into()),
            limit_bytes: Some(4096),
            ..Default::default()
        };
        let text =
            self.inner.pods.logs(client, &params).await.map_err(|e| {
                format!("cannot read what the probe's client printed (pods/log): {e}")
            })?;
        egress::probe_verdict(&text)
    }
}

/// The Lease label of `labels` (a request's), for the egress objects.
pub(super) fn lease_of(labels: &HashMap<String, String>) -> &str {
    labels.get(LEASE_LABEL).map_or("", String::as_str)
}
