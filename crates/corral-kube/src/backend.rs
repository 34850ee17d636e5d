//! The Kubernetes backend: a sandbox is a pod whose PID 1 is corral's
//! agent, reached over TCP on the pod network (or through the API
//! server's port-forward) after a handshake proving corral holds the
//! sandbox's secret (`control.rs`). Who owns a pod is judged by Lease
//! (`backend/owners.rs`); persistent sessions keep their files in a claim
//! per key (`backend/sessions.rs`).

mod egress;
mod owners;
mod ports;
mod pristine;
mod sessions;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use corral_core::agent_auth::{self, Secret};
use corral_core::backend::{
    AgentStream, Backend, BackendCounters, BoxFuture, ImagePresence, OnDeath, Placement,
    PortStream, Prepared, SandboxInfo, SessionStorage, StartRequest,
};
use corral_core::config::{Config, ControlPath};
use corral_core::labels::{self, Owner};
use corral_core::{ContainerState, Error, FailureKind, RetryPolicy};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use tokio::sync::OnceCell;

use crate::control::{self, ControlError};
use crate::error::{api, classify, is_not_found, status_code};
use crate::lease::LeaseKeeper;
use crate::pod::{self, PodParams, SANDBOX_CONTAINER};
use crate::rate::RateLimiter;
use crate::session;
use crate::state::{self, Progress};
use crate::watch::PodWatch;

/// The engine's name in messages.
const ENGINE: &str = "Kubernetes";

/// How long `control: auto` goes through port-forward after the pod
/// network proved unreachable before it tries the direct path again.
const DIRECT_RETRY: Duration = Duration::from_secs(60);

/// How long a removal waits for the pod object to be gone.
const REMOVE_WAIT: Duration = Duration::from_secs(30);

/// Times an unconditional pod deletion answered 409 is tried again.
const DELETE_CONFLICT_RETRIES: u32 = 5;

/// How to reach the cluster and how hard to lean on it.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeConfig {
    /// Namespace of the pods; `None`: the kubeconfig context's.
    pub namespace: Option<String>,
    /// Kubeconfig file; `None`: `$KUBECONFIG`, `~/.kube/config`, in-cluster.
    pub kubeconfig: Option<String>,
    /// Kubeconfig context; `None`: the current one.
    pub context: Option<String>,
    /// Image of the init container holding `/corral-agent`.
    pub agent_image: String,
    /// Pod creations and API-server connections per second.
    pub qps: f64,
    /// Creations and connections at once after a quiet spell.
    pub burst: u32,
    /// Longest wait for a created pod to run.
    pub start_timeout: Duration,
    /// How the agent is reached.
    pub control: ControlPath,
    /// The agent's port in each pod.
    pub agent_port: u16,
    /// Longest wait for a direct connection.
    pub connect_timeout: Duration,
    /// Address blocks besides corral's pods allowed to the agent port.
    pub controller_cidrs: Vec<String>,
    /// Retries of transient API errors.
    pub retry: RetryPolicy,
    /// How long this process's Lease lasts unrenewed (`owners.rs`).
    pub lease_duration: Duration,
    /// Bytes of a persistent session's claim (`sessions.rs`).
    pub session_volume_size: u64,
    /// StorageClass of sessions' claims; `None`: the cluster's default.
    pub session_storage_class: Option<String>,
    /// Upstream resolvers of egress gateways; empty: the cluster's DNS.
    pub egress_nameservers: Vec<String>,
    /// Run egress policies where NetworkPolicy is not enforced.
    pub accept_unenforced_egress: bool,
    /// AppArmor profile of pristine sandboxes' containers; `None`: the
    /// runtime's default.
    pub pristine_apparmor_profile: Option<String>,
    /// RuntimeClass of `isolation: gvisor` pods (`kubernetes.runtime_class`).
    pub runtime_class: String,
}

/// The agent image of this build of corral.
pub fn default_agent_image() -> String {
    format!("corral-agent:{}", env!("CARGO_PKG_VERSION"))
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig::from(&Config::default())
    }
}

impl From<&Config> for KubeConfig {
    fn from(config: &Config) -> Self {
        let k = &config.kubernetes;
        KubeConfig {
            namespace: k.namespace.clone(),
            kubeconfig: k.kubeconfig.clone(),
            context: k.context.clone(),
            agent_image: k.agent_image.clone().unwrap_or_else(default_agent_image),
            qps: k.qps,
            burst: k.burst,
            start_timeout: Duration::from_millis(k.start_timeout_ms),
            control: k.control,
            agent_port: k.agent_port,
            connect_timeout: Duration::from_millis(k.connect_timeout_ms),
            controller_cidrs: k.controller_cidrs.clone(),
            retry: config.daemon.retry.clone(),
            lease_duration: Duration::from_secs(u64::from(k.lease_duration_seconds)),
            session_volume_size: k.session_volume_size,
            session_storage_class: k.session_storage_class.clone(),
            egress_nameservers: k.egress_nameservers.clone(),
            accept_unenforced_egress: k.accept_unenforced_egress,
            pristine_apparmor_profile: k.pristine_apparmor_profile.clone(),
            runtime_class: k.runtime_class.clone(),
        }
    }
}

/// A connection to one cluster and namespace. Cheap to clone; share one
/// per process (the rate limit and the pod watch are per backend).
#[derive(Clone)]
pub struct KubeBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    pods: Api<Pod>,
    namespace: String,
    endpoint: String,
    config: KubeConfig,
    limiter: RateLimiter,
    retries: AtomicU64,
    created: AtomicU64,
    policies: OnceCell<()>,
    watch: Arc<PodWatch>,
    /// Where each pod's agent is and its secret, by pod name, as this
    /// process made or last read them.
    agents: Mutex<HashMap<String, AgentEndpoint>>,
    /// When a direct connection last failed to reach the pod network
    /// under `control: auto`: connections go through port-forward until
    /// [`DIRECT_RETRY`] has passed, then the direct path is tried again.
    direct_unreachable: Mutex<Option<Instant>>,
    /// This process's Lease, made with its first pod (`owners.rs`).
    lease: OnceCell<LeaseKeeper>,
    /// Whether the cluster enforces NetworkPolicy, probed before the
    /// first sandbox with an egress policy (`egress.rs`).
    enforcement: OnceCell<crate::egress::Enforcement>,
    /// Whether pods may hold what in-place reset needs (`pristine.rs`).
    pristine: pristine::PristineGate,
}

/// How to reach one pod's agent.
#[derive(Debug, Clone)]
struct AgentEndpoint {
    secret: Secret,
    ip: Option<IpAddr>,
}

impl KubeBackend {
    /// Connects with `config`; fails fast, saying why, when no cluster
    /// configuration is found or the API server does not answer.
    pub async fn connect(config: &KubeConfig) -> Result<Self, Error> {
        let unavailable = |detail: String| Error::EngineUnavailable {
            engine: ENGINE,
            detail,
        };
        let options = KubeConfigOptions {
            context: config.context.clone(),
            ..Default::default()
        };
        let kube_config = match &config.kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path)
                    .map_err(|e| unavailable(format!("kubeconfig {path}: {e}")))?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| unavailable(format!("kubeconfig {path}: {e}")))?
            }
            None if config.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| unavailable(format!("kubeconfig: {e}")))?,
            None => kube::Config::infer()
                .await
                .map_err(|e| unavailable(format!("no cluster configuration: {e}")))?,
        };
        let endpoint = kube_config.cluster_url.to_string();
        let namespace = config
            .namespace
            .clone()
            .unwrap_or_else(|| kube_config.default_namespace.clone());
        let client =
            Client::try_from(kube_config).map_err(|e| unavailable(format!("{endpoint}: {e}")))?;
        let backend = KubeBackend {
            inner: Arc::new(Inner {
                pods: Api::namespaced(client.clone(), &namespace),
                client,
                namespace,
                endpoint,
                config: config.clone(),
                limiter: RateLimiter::new(config.qps, config.burst),
                retries: AtomicU64::new(0),
                created: AtomicU64::new(0),
                policies: OnceCell::new(),
                watch: Arc::new(PodWatch::default()),
                agents: Mutex::new(HashMap::new()),
                direct_unreachable: Mutex::new(None),
                lease: OnceCell::new(),
                enforcement: OnceCell::new(),
                pristine: pristine::PristineGate::default(),
            }),
        };
        backend
            .inner
            .client
            .apiserver_version()
            .await
            .map_err(|e| unavailable(format!("{}: {e}", backend.inner.endpoint)))?;
        Ok(backend)
    }

    /// The namespace the pods live in.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The configuration in force.
    pub fn config(&self) -> &KubeConfig {
        &self.inner.config
    }

    /// Where the API server is.
    pub fn endpoint_url(&self) -> &str {
        &self.inner.endpoint
    }

    /// The raw client, for `doctor` and tests.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Runs an API call named `what`, retrying transient errors.
    async fn call<T, F, Fut>(&self, what: &str, op: F) -> Result<T, kube::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let policy = &self.inner.config.retry;
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(policy.initial_delay_ms))
            .with_max_delay(Duration::from_millis(policy.max_delay_ms))
            .with_factor(2.0)
            .with_max_times(policy.attempts.saturating_sub(1));
        if policy.jitter {
            backoff = backoff.with_jitter();
        }
        op.retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|e| classify(e) == FailureKind::DaemonUnavailable)
            .notify(|e, delay| {
                self.inner.retries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(op = what, error = %e, retry_in_ms = delay.as_millis() as u64,
                    "transient API server error, retrying");
            })
            .await
    }

    /// A suffix no earlier pod of this process had (uniqueness, not
    /// secrecy: the name is public).
    pub(crate) fn suffix(&self) -> String {
        use std::hash::{BuildHasher, Hasher};
        let n = self.inner.created.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        format!("{:08x}", h.finish() as u32)
    }

    /// The namespace's network policies, made once per backend; one of
    /// the same name with another spec is an error, never overwritten.
    async fn ensure_policies(&self) -> Result<(), Error> {
        self.inner
            .policies
            .get_or_try_init(|| async {
                let api: Api<NetworkPolicy> =
                    Api::namespaced(self.inner.client.clone(), &self.inner.namespace);
                let config = &self.inner.config;
                for policy in pod::network_policies(&config.controller_cidrs) {
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    let what = format!("create network policy {name}");
                    let post = PostParams::default();
                    match self.call(&what, || api.create(&post, &policy)).await {
                        Ok(_) => {}
                        Err(e) if status_code(&e) == Some(409) => {
                            // Whatever was made first holds the secret: read it there.
                            self.forget(&name);
                            let existing = api
                                .get(&name)
                                .await
                                .map_err(|e| api_err(format!("read network policy {name}"), e))?;
                            if existing.spec != policy.spec {
                                return Err(Error::Network {
                                    network: name,
                                    reason: format!(
                                        "a network policy of that name exists in namespace {} \
                                         with another spec; corral will not change it",
                                        self.inner.namespace
                                    ),
                                });
                            }
                        }
                        Err(e) => return Err(api_err(what, e)),
                    }
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Creates the pod of `req` (`claim`: the session's claim to mount).
    async fn do_create(
        &self,
        req: &StartRequest<'_>,
        claim: Option<&str>,
    ) -> Result<Placement, Error> {
        let (spec, id) = (req.spec, req.sandbox_id);
        let name = pod::pod_name(id, &self.suffix())?;
        let secret = control::new_secret().map_err(|e| Error::Agent {
            sandbox: id.to_string(),
            message: format!("cannot make the agent's secret: {e}"),
        })?;
        let pristine = spec.in_place_reset().is_ok();
        let refused = match pristine {
            true => self.pristine_refusal().await,
            false => None,
        };
        let params = |pristine_refused: Option<&'static str>| PodParams {
            sandbox_id: id,
            name: &name,
            labels: &req.labels,
            agent_image: &self.inner.config.agent_image,
            agent_port: self.inner.config.agent_port,
            secret: &secret,
            pristine_refused,
            pristine_apparmor: self.inner.config.pristine_apparmor_profile.as_deref(),
            gvisor_runtime_class: &self.inner.config.runtime_class,
        };
        // An egress policy's gateway and policies first: the pod resolves
        // through the gateway and never runs unconfined.
        let gateway = match &spec.network {
            corral_core::Network::Egress(policy) => {
                // Checked before anything is made.
                pod::pod(&crate::egress::without_egress(spec), &params(None))?;
                let lease = egress::lease_of(&req.labels);
                Some(self.make_egress(policy, id, &name, lease).await?)
            }
            _ => None,
        };
        let egress = gateway.is_some();
        let make = |pristine_refused: Option<&str>| -> Result<Pod, Error> {
            let params = PodParams {
                pristine_refused,
                ..params(None)
            };
            let mut pod = match gateway {
                Some(ip) => crate::egress::sandbox_pod(spec, &params, ip)?,
                None => pod::pod(spec, &params)?,
            };
            if let Some(claim) = claim {
                session::mount(&mut pod, claim);
            }
            Ok(pod)
        };
        let pod = match make(refused.as_deref()) {
            Ok(pod) => pod,
            Err(e) => {
                if egress {
                    self.remove_egress(&name).await;
                }
                return Err(e);
            }
        };
        self.remember(
            &name,
            AgentEndpoint {
                secret: secret.clone(),
                ip: None,
            },
        );
        self.inner.limiter.acquire().await;
        let pods = &self.inner.pods;
        let what = format!("create pod {name} for sandbox {id}");
        let post = PostParams::default();
        let mut created = self.call(&what, || pods.create(&post, &pod)).await;
        if let Err(e) = &created {
            if pristine && refused.is_none() && pristine::maybe_refused_for_pristine(e) {
                // Refused for the agent's extra capabilities, or for
                // something else: the same pod without them tells.
                let why =
                    format!("the API server refused a pod whose agent holds CAP_SYS_ADMIN: {e}");
                let plain = make(Some(&why))?;
                self.inner.limiter.acquire().await;
                created = self.call(&what, || pods.create(&post, &plain)).await;
                if created.is_ok() {
                    self.note_pristine(Some(why));
                }
            }
        }
        match created {
            Ok(_) => Ok(Placement(name)),
            // A retried create whose first attempt went through.
            Err(e) if status_code(&e) == Some(409) => {
                let existing = pods
                    .get(&name)
                    .await
                    .map_err(|e2| api_err(format!("read pod {name} after a name conflict"), e2))?;
                let ours = existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::SANDBOX))
                    .is_some_and(|v| v == id);
                if ours {
                    Ok(Placement(name))
                } else {
                    if egress {
                        self.remove_egress(&name).await;
                    }
                    Err(api_err(what, e))
                }
            }
            Err(e) => {
                self.forget(&name);
                if egress {
                    self.remove_egress(&name).await;
                }
                Err(api_err(what, e))
            }
        }
    }

    fn remember(&self, name: &str, endpoint: AgentEndpoint) {
        lock(&self.inner.agents).insert(name.to_string(), endpoint);
    }

    fn forget(&self, name: &str) {
        lock(&self.inner.agents).remove(name);
    }

    /// Waits until the pod's agent runs, or says why it will not.
    async fn do_start(&self, req: &StartRequest<'_>, name: &str) -> Result<(), Error> {
        let (id, image) = (req.sandbox_id, req.spec.image.as_str());
        let agent_image = self.inner.config.agent_image.as_str();
        let settled = |p: Option<&Pod>| match p {
            None => true,
            Some(p) => !matches!(
                state::start_progress(id, image, agent_image, p),
                Progress::Pending
            ),
        };
        let timeout = self.inner.config.start_timeout;
        let waited = tokio::time::timeout(
            timeout,
            await_condition(self.inner.pods.clone(), name, settled),
        )
        .await;
        let pod = match waited {
            Ok(Ok(pod)) => pod,
            Ok(Err(e)) => {
                return Err(Error::EngineLost {
                    op: format!("watch pod {name} of sandbox {id} start"),
                    source: Box::new(e),
                })
            }
            Err(_) => {
                let now = self.inner.pods.get_opt(name).await.ok().flatten();
                let state = state::container_state(name, now.as_ref());
                return Err(Error::Engine {
                    op: format!("start sandbox {id} (pod {name})"),
                    kind: FailureKind::DaemonUnavailable,
                    source: format!(
                        "the pod did not run within {} ms (kubernetes.start_timeout_ms): {state}",
                        timeout.as_millis()
                    )
                    .into(),
                });
            }
        };
        match pod {
            None => Err(Error::ContainerLost {
                sandbox: id.to_string(),
                state: Box::new(state::container_state(name, None)),
            }),
            Some(p) => match state::start_progress(id, image, agent_image, &p) {
                Progress::Running => {
                    if let Some(ip) = pod_ip(&p) {
                        if let Some(e) = lock(&self.inner.agents).get_mut(name) {
                            e.ip = Some(ip);
                        }
                    }
                    Ok(())
                }
                Progress::Failed(e) if state::pull_backoff(&p) => {
                    Err(self.pull_cause(name, image, agent_image, e).await)
                }
                Progress::Failed(e) => Err(e),
                Progress::Pending => Err(Error::Agent {
                    sandbox: id.to_string(),
                    message: format!("pod {name} is still starting"),
                }),
            },
        }
    }

    /// The kubelet's pull back-off names no cause; the pod's latest
    /// `Failed` event does (`Failed to pull image "x": ... not found`).
    /// Typed from it; `fallback` (typed from the back-off) when the events
    /// cannot be read or say nothing.
    async fn pull_cause(
        &self,
        name: &str,
        image: &str,
        agent_image: &str,
        fallback: Error,
    ) -> Error {
        use k8s_openapi::api::core::v1::Event;
        let events: Api<Event> = Api::namespaced(self.inner.client.clone(), &self.inner.namespace);
        let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let Ok(list) = events.list(&params).await else {
            return fallback;
        };
        // The latest pull failure (the API server does not order a list).
        let failed = list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Failed"))
            .filter(|e| e.message.as_deref().is_some_and(|m| m.contains("pull")))
            .max_by_key(|e| e.last_timestamp.clone())
            .and_then(|e| e.message.as_deref());
        match failed {
            Some(message) => {
                let which = if message.contains(agent_image) {
                    agent_image
                } else {
                    image
                };
                state::image_error(which, state::PULL_BACKOFF, message)
            }
            None => fallback,
        }
    }

    /// The pod's agent endpoint: as remembered, else read from the pod
    /// (one this process did not make, such as an adopted persistent
    /// sandbox's, or one whose IP was not known yet).
    async fn endpoint(&self, name: &str, sandbox: &str) -> Result<AgentEndpoint, Error> {
        if let Some(e) = lock(&self.inner.agents).get(name).cloned() {
            if e.ip.is_some() || self.inner.config.control == ControlPath::PortForward {
                return Ok(e);
            }
        }
        let pods = &self.inner.pods;
        let what = format!("read pod {name} of sandbox {sandbox}");
        let pod = match self.call(&what, || pods.get_opt(name)).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                return Err(Error::ContainerLost {
                    sandbox: sandbox.to_string(),
                    state: Box::new(state::container_state(name, None)),
                })
            }
            Err(e) => return Err(api_err(what, e)),
        };
        let secret = pod_secret(&pod).ok_or_else(|| Error::Agent {
            sandbox: sandbox.to_string(),
            message: format!(
                "pod {name} carries no valid {} for its agent: not a pod corral made",
                agent_auth::SECRET_ENV
            ),
        })?;
        let endpoint = AgentEndpoint {
            secret,
            ip: pod_ip(&pod),
        };
        self.remember(name, endpoint.clone());
        Ok(endpoint)
    }

    async fn do_connect(&self, name: &str, sandbox: &str) -> Result<AgentStream, Error> {
        let endpoint = self.endpoint(name, sandbox).await?;
        let config = &self.inner.config;
        let agent_err = |e: ControlError| Error::Agent {
            sandbox: sandbox.to_string(),
            message: format!("pod {name}: {e}"),
        };
        let direct = match config.control {
            ControlPath::Direct => true,
            ControlPath::PortForward => false,
            ControlPath::Auto => lock(&self.inner.direct_unreachable)
                .is_none_or(|failed| failed.elapsed() >= DIRECT_RETRY),
        };
        if direct {
            let Some(ip) = endpoint.ip else {
                return Err(Error::Agent {
                    sandbox: sandbox.to_string(),
                    message: format!("pod {name} has no IP yet"),
                });
            };
            match control::connect_direct(
                ip,
                config.agent_port,
                &endpoint.secret,
                config.connect_timeout,
            )
            .await
            {
                Ok(stream) => {
                    if lock(&self.inner.direct_unreachable).take().is_some() {
                        tracing::info!(
                            pod = name,
                            sandbox,
                            "the pod network is reachable again; reaching agents directly"
                        );
                    }
                    return Ok(stream);
                }
                Err(e @ ControlError::Unreachable { .. })
                    if config.control == ControlPath::Auto =>
                {
                    // Say so when it starts: for a while this process goes
                    // through the API server.
                    if lock(&self.inner.direct_unreachable)
                        .replace(Instant::now())
                        .is_none()
                    {
                        tracing::warn!(pod = name, sandbox, error = %e,
                            "the pod network is not reachable from here; \
                             reaching agents through the API server's port-forward");
                    }
                }
                Err(e) => return Err(agent_err(e)),
            }
        }
        self.inner.limiter.acquire().await;
        let pods = &self.inner.pods;
        let what = format!("port-forward to the agent of sandbox {sandbox} (pod {name})");
        let port = config.agent_port;
        let ports = [port];
        let forwarder = self
            .call(&what, || pods.portforward(name, &ports))
            .await
            .map_err(|e| api_err(what.clone(), e))?;
        control::through_forward(forwarder, port, &endpoint.secret, &what)
            .await
            .map_err(agent_err)
    }

    async fn do_state(&self, name: &str) -> Result<ContainerState, Error> {
        let pods = &self.inner.pods;
        let what = format!("read pod {name}");
        let pod = self
            .call(&what, || pods.get_opt(name))
            .await
            .map_err(|e| api_err(what.clone(), e))?;
        Ok(state::container_state(name, pod.as_ref()))
    }

    pub(crate) async fn do_remove(&self, name: &str, sandbox: &str) -> Result<(), Error> {
        // A sandbox with an egress policy leaves its gateway and policies,
        // deleted once the pod is gone (until then they confine it); when
        // the pod outlasts the wait they stay for `gc`.
        if let Some(had_egress) = self.remove_pod(name, sandbox).await? {
            if had_egress {
                self.remove_egress(name).await;
            }
        }
        Ok(())
    }

    /// Deletes pod `name` and waits for it to go: `Some(whether it had an
    /// egress policy, or may have: one already gone)` once gone, `None`
    /// when it is still listed after [`REMOVE_WAIT`].
    async fn remove_pod(&self, name: &str, sandbox: &str) -> Result<Option<bool>, Error> {
        // The shortest graceful deletion, not a forced one: sandboxes hold
        // nothing worth saving, but a forced deletion (grace 0) removes the
        // object at once and leaves the kubelet to kill the containers
        // later, so the sandbox would go on running (and answering on its
        // control stream) after `remove` returned. With a grace the object
        // goes only once the kubelet has killed them (SIGTERM, which the
        // agent forwards, then SIGKILL a second later), and the wait below
        // makes `remove` mean what Docker's `rm -f` means.
        let params = DeleteParams {
            grace_period_seconds: Some(1),
            ..Default::default()
        };
        let pods = &self.inner.pods;
        let what = format!("delete pod {name} of sandbox {sandbox}");
        self.forget(name);
        // The deletion has no precondition, so a 409 is the API server's own
        // write conflict (its graceful deletion racing the kubelet's status
        // update), which upstream retries inside the server and some API
        // servers return instead: ask again, as for any transient error.
        let mut conflicts = 0;
        let deleted = loop {
            match self.call(&what, || pods.delete(name, &params)).await {
                Err(e) if status_code(&e) == Some(409) && conflicts < DELETE_CONFLICT_RETRIES => {
                    conflicts += 1;
                    self.inner.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(pod = name, error = %e, "pod deletion conflicted, retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(conflicts))).await;
                }
                other => break other,
            }
        };
        let deleted = match deleted {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => {
                self.inner
                    .watch
                    .died(name, format!("pod {name} was deleted"));
                return Ok(Some(true));
            }
            Err(e) => return Err(api_err(what, e)),
        };
        // Whoever still watches it (a sandbox this process did not remove
        // itself) learns now, not when the watch event arrives.
        self.inner
            .watch
            .died(name, format!("pod {name} is being deleted"));
        let Some(deleted) = deleted.left() else {
            return Ok(Some(true));
        };
        let had_egress = deleted
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(crate::egress::EGRESS_FOR_LABEL));
        let Some(uid) = deleted.metadata.uid else {
            return Ok(Some(had_egress));
        };
        let gone = tokio::time::timeout(
            REMOVE_WAIT,
            await_condition(
                pods.clone(),
                name,
                kube::runtime::conditions::is_deleted(&uid),
            ),
        )
        .await;
        if !matches!(gone, Ok(Ok(_))) {
            tracing::warn!(
                pod = name,
                sandbox,
                "pod deleted but still listed after {REMOVE_WAIT:?}"
            );
            return Ok(None);
        }
        Ok(Some(had_egress))
    }

    async fn do_list(&self) -> Result<Vec<SandboxInfo>, Error> {
        let pods = &self.inner.pods;
        let params = ListParams::default().labels(labels::SANDBOX);
        let list = self
            .call("list sandboxes", || pods.list(&params))
            .await
            .map_err(|e| api_err("list sandboxes", e))?;
        // After the pods: a pod listed was made after its owner's Lease.
        let judge = self.ownership_judge().await?;
        Ok(list
            .items
            .into_iter()
            .map(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let l = pod::labels_of(&p.metadata);
                let state = state::container_state(&name, Some(&p));
                let phase = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                SandboxInfo {
                    sandbox_id: l.get(labels::SANDBOX).cloned().unwrap_or_default(),
                    placement: Placement(name),
                    image: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers.iter().find(|c| c.name == SANDBOX_CONTAINER))
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default(),
                    status: match &state.error {
                        Some(e) => format!("{phase} ({e})"),
                        None => phase,
                    },
                    state: state.status,
                    created: p
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.as_second())
                        .unwrap_or_default(),
                    owner: Owner::from_labels(&l),
                    ownership: judge.ownership(&l),
                    session: l.get(labels::SESSION).cloned(),
                    labels: l,
                }
            })
            .collect())
    }
}

fn api_err(op: impl Into<String>, e: kube::Error) -> Error {
    api(op, e)
}

/// The pod's IP, as its status reports it.
fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The secret corral gave the pod's agent.
fn pod_secret(pod: &Pod) -> Option<Secret> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == SANDBOX_CONTAINER)?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == agent_auth::SECRET_ENV)?
        .value
        .as_deref()
        .and_then(|v| Secret::from_hex(v).ok())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Backend for KubeBackend {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            self.inner
                .client
                .apiserver_version()
                .await
                .map(|_| ())
                .map_err(|e| api_err("read the API server's version", e))
        })
    }

    fn prepare<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Prepared, Error>> {
        Box::pin(async move {
            // The nodes pull images and the init container brings the
            // agent: all that is left here is the namespace's policies
            // and this process's Lease.
            let t = Instant::now();
            self.ensure_policies().await?;
            self.ensure_lease(req.owner).await?;
            if let corral_core::Network::Egress(policy) = &req.spec.network {
                self.ensure_egress_enforced(policy, req.owner).await?;
            }
            Ok(Prepared {
                image: Duration::ZERO,
                agent: t.elapsed(),
            })
        })
    }

    fn create<'a>(&'a self, req: &'a StartRequest<'a>) -> BoxFuture<'a, Result<Placement, Error>> {
        Box::pin(self.create_owned(req))
    }

    fn start<'a>(
        &'a self,
        req: &'a StartRequest<'a>,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.do_start(req, placement.id()))
    }

    fn connect<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<AgentStream, Error>> {
        Box::pin(self.do_connect(placement.id(), sandbox_id))
    }

    fn state<'a>(
        &'a self,
        placement: &'a Placement,
    ) -> BoxFuture<'a, Result<ContainerState, Error>> {
        Box::pin(self.do_state(placement.id()))
    }

    fn watch(&self, placement: &Placement, on_death: OnDeath) {
        self.inner
            .watch
            .watch(&self.inner.pods, placement.id(), on_death);
    }

    fn unwatch(&self, placement: &Placement) {
        self.inner.watch.unwatch(placement.id());
    }

    fn remove<'a>(
        &'a self,
        placement: &'a Placement,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.do_remove(placement.id(), sandbox_id))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, Error>> {
        Box::pin(self.do_list())
    }

    fn judges_ownership(&self) -> bool {
        // By Lease (`owners.rs`): an owner's host and pid mean nothing to
        // a corral on another machine of the cluster.
        true
    }

    fn session_storage(&self) -> SessionStorage {
        SessionStorage::Backend
    }

    fn session_placement<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Option<Placement>, Error>> {
        Box::pin(self.recorded_session_pod(session))
    }

    fn collect_garbage(&self) -> BoxFuture<'_, Result<Vec<String>, Error>> {
        Box::pin(async move {
            // Judged by their owners' Leases: before expired ones go.
            let mut removed = self.remove_orphan_egress().await?;
            removed.extend(self.remove_expired_leases().await?);
            Ok(removed)
        })
    }

    fn egress_counts<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<corral_core::egress::EgressCounts>, Error>> {
        Box::pin(self.gateway_counts(sandbox_id))
    }

    fn image_present<'a>(&'a self, _image: &'a str) -> BoxFuture<'a, Result<ImagePresence, Error>> {
        // Each node pulls what its pods need (per the pod's pull policy)
        // and the API server keeps no record of which node holds which
        // image (a node's status lists some of its images, truncated, and
        // a pod may be scheduled on any node): nobody corral can ask
        // knows. Saying "absent" would be as false as "present"; the
        // caller decides as if the image might be pulled.
        Box::pin(async { Ok(ImagePresence::Unknown) })
    }

    fn open_port<'a>(
        &'a self,
        placement: &'a Placement,
        port: u16,
    ) -> BoxFuture<'a, Result<PortStream, Error>> {
        Box::pin(self.connect_port(placement, port))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.release_lease())
    }

    fn counters(&self) -> BackendCounters {
        BackendCounters {
            retries: self.inner.retries.load(Ordering::Relaxed),
        }
    }
}
