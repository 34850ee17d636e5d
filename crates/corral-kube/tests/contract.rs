//! The engine contract against a real cluster: the shared cases of
//! `corral_testing::contract` (the ones the Docker backend passes: echo,
//! exit codes, stdin, a timeout killing a tree, OOM typed, the output cap,
//! a lost pod under `fail` and `recreate`, files, shells, pools, no
//! leaks), run through the runtime over [`KubeBackend`], and the cases
//! only Kubernetes has (refusals typed, the backend's own pod life).
//!
//! Runs against whatever cluster `CORRAL_TEST_KUBECONFIG` names (a
//! kubeconfig file), in namespace `CORRAL_TEST_KUBE_NAMESPACE` (default
//! `corral-test`), with the sandbox image `CORRAL_TEST_KUBE_IMAGE`
//! (default `corral-test/busybox:latest`, from
//! `scripts/build-test-images.sh`) and the agent image
//! `CORRAL_TEST_KUBE_AGENT_IMAGE` (default `corral-agent:<version>`, from
//! `scripts/build-agent-image.sh`), both pullable by the nodes. Without
//! `CORRAL_TEST_KUBECONFIG` every case prints that it was skipped and why.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Runtime, RuntimeConfig};
use corral_core::backend::{Backend, OnDeath, StartRequest};
use corral_core::{ContainerStatus, Error, Network, SandboxSpec};
use corral_kube::{KubeBackend, KubeConfig};
use corral_testing::contract::{BoxFuture, Target, TEST_LABEL};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

/// The cluster under test: a runtime over a [`KubeBackend`], and the
/// backend itself for what only Kubernetes has.
struct Kube {
    runtime: Runtime,
    backend: KubeBackend,
}

/// ERROR events corral logged in this test process: the only one is an
/// agent protocol violation, which no case here may provoke (a pod deleted
/// mid-command included).
static ERRORS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct CountErrors;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountErrors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Counts corral's ERROR events and shows its warnings on stderr.
fn watch_logs() {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    let shown = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
    let _ = tracing_subscriber::registry()
        .with(shown)
        .with(CountErrors)
        .try_init();
}

impl Kube {
    /// The cluster `CORRAL_TEST_KUBECONFIG` names, or `None` after saying
    /// why `test` is skipped.
    async fn connect(test: &str) -> Option<Kube> {
        watch_logs();
        let Some(kubeconfig) = std::env::var("CORRAL_TEST_KUBECONFIG")
            .ok()
            .filter(|v| !v.is_empty())
        else {
            // Straight to stderr: the test harness captures eprintln!, and a
            // skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: CORRAL_TEST_KUBECONFIG is not set, so there is no cluster to \
                 run the Kubernetes contract against"
            );
            return None;
        };
        let config = KubeConfig {
            kubeconfig: Some(kubeconfig),
            namespace: Some(
                std::env::var("CORRAL_TEST_KUBE_NAMESPACE")
                    .unwrap_or_else(|_| "corral-test".into()),
            ),
            agent_image: std::env::var("CORRAL_TEST_KUBE_AGENT_IMAGE")
                .unwrap_or_else(|_| corral_kube::default_agent_image()),
            ..KubeConfig::default()
        };
        let backend = KubeBackend::connect(&config)
            .await
            .expect("CORRAL_TEST_KUBECONFIG names a cluster that answers");
        let runtime = Runtime::new(
            Arc::new(backend.clone()),
            RuntimeConfig {
                shared_slots: false,
                reap_orphans: false,
                ..RuntimeConfig::default()
            },
        );
        Some(Kube { runtime, backend })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.backend.client().clone(), self.backend.namespace())
    }

    /// The pods labelled `corraltest=<label>`, being deleted or not.
    async fn pods_labelled(&self, label: &str) -> Vec<String> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(&format!("{TEST_LABEL}={label}")))
            .await
            .expect("list pods");
        list.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    /// Asserts the test left no pod behind (deletion is asynchronous on a
    /// cluster: a pod may take a moment to go).
    async fn assert_clean(&self, test: &str) {
        let until = Instant::now() + self.removal_grace();
        loop {
            let left = self.pods_labelled(test).await;
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < until, "test {test} leaked pods: {left:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Deletes a pod out of band, as an operator or the cluster would.
    async fn delete_pod(&self, name: &str) {
        self.pods()
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .expect("delete the pod out of band");
    }
}

impl Target for Kube {
    fn engine(&self) -> &'static str {
        "Kubernetes"
    }

    fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The hardened spec less what a pod cannot express (no per-pod pids
    /// limit, no tmpfs options).
    fn base_spec(&self) -> SandboxSpec {
        let mut spec = SandboxSpec::new(image());
        spec.limits.pids = None;
        for t in &mut spec.tmpfs {
            t.options.clear();
        }
        spec
    }

    fn leftovers<'a>(&'a self, label: &'a str) -> BoxFuture<'a, Vec<String>> {
        Box::pin(self.pods_labelled(label))
    }

    fn sweep<'a>(&'a self, label: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for pod in self.pods_labelled(label).await {
                let _ = self
                    .pods()
                    .delete(
                        &pod,
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await;
            }
        })
    }

    fn removal_grace(&self) -> Duration {
        Duration::from_secs(30)
    }
}

async fn kube(case: &str) -> Option<Box<dyn Target>> {
    Some(Box::new(Kube::connect(case).await?))
}

corral_testing::contract_suite!(kube);

fn image() -> String {
    std::env::var("CORRAL_TEST_KUBE_IMAGE").unwrap_or_else(|_| "corral-test/busybox:latest".into())
}

/// The base spec labelled for a Kubernetes-only test.
fn spec(k: &Kube, test: &str) -> SandboxSpec {
    let mut spec = k.base_spec();
    spec.labels.insert(TEST_LABEL.into(), test.into());
    spec
}

/// The error of a create that must fail; a sandbox made anyway is removed.
async fn create_err(rt: &Runtime, spec: &SandboxSpec) -> Error {
    match rt.create(spec).await {
        Err(e) => e,
        Ok(sb) => {
            sb.destroy().await.expect("destroy");
            panic!("created a sandbox from {spec:?}");
        }
    }
}

/// What a pod cannot express, and what no node can hold, is refused
/// typed, naming the field, and leaves no pod. (A missing image is a
/// shared contract case.)
#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_typed_and_leave_nothing() {
    let Some(k) = Kube::connect("refusals_are_typed_and_leave_nothing").await else {
        return;
    };
    let test = format!("k-refuse-{}", std::process::id());
    // The unmodified hardened default asks for a pids limit.
    let mut s = SandboxSpec::new(image());
    s.labels.insert(TEST_LABEL.into(), test.clone());
    let e = create_err(&k.runtime, &s).await;
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("limits.pids"), "{e}");

    let mut s = spec(&k, &test);
    s.network = Network::None;
    s.limits.memory = Some(u64::MAX / 2);
    // No node has 4 EiB: the scheduler's refusal, typed and retryable.
    let e = create_err(&k.runtime, &s).await;
    assert!(matches!(e, Error::Capacity { .. }), "{e}");
    assert!(e.retryable());
    k.assert_clean(&test).await;
}

/// The backend's own operations, below the runtime: a pod is made and
/// runs, its state and listing read back what corral put on it, the death
/// watch fires when it is deleted out of band, and removal is final.
#[tokio::test(flavor = "multi_thread")]
async fn pods_are_made_run_listed_watched_and_removed() {
    let Some(k) = Kube::connect("pods_are_made_run_listed_watched_and_removed").await else {
        return;
    };
    let test = format!("k-pod-{}", std::process::id());
    let (rt, backend) = (&k.runtime, &k.backend);
    let s = spec(&k, &test);
    let id = format!("sb-{}", std::process::id());
    let owner = rt.owner().clone();
    let labels = [(corral_core::labels::SANDBOX.to_string(), id.clone())]
        .into_iter()
        .chain(owner.labels())
        .chain([(corral_core::labels::SEAL.to_string(), "ab".repeat(32))])
        .collect();
    let req = StartRequest {
        sandbox_id: &id,
        spec: &s,
        agent_env: Vec::new(),
        labels,
        owner: &owner,
    };
    backend.prepare(&req).await.expect("prepare");
    let t = Instant::now();
    let placement = backend.create(&req).await.expect("create");
    if let Err(e) = backend.start(&req, &placement).await {
        let _ = backend.remove(&placement, &id).await;
        panic!("start: {e}");
    }
    let ran = t.elapsed();
    let _ = writeln!(
        std::io::stderr(),
        "{test}: pod create to Running took {ran:?}"
    );
    let state = backend.state(&placement).await.expect("state");
    assert_eq!(state.status, ContainerStatus::Running, "{state}");

    let listed = backend.list().await.expect("list");
    let info = listed
        .iter()
        .find(|i| i.placement == placement)
        .expect("the pod is listed");
    assert_eq!(info.sandbox_id, id);
    assert_eq!(info.owner.as_ref(), Some(&owner));
    assert_eq!(
        info.labels.get(corral_core::labels::SEAL),
        Some(&"ab".repeat(32))
    );
    assert_eq!(
        info.labels.get(TEST_LABEL).map(String::as_str),
        Some(test.as_str())
    );
    assert_eq!(info.state, ContainerStatus::Running);

    let (tx, rx) = std::sync::mpsc::channel();
    let on_death: OnDeath = Arc::new(move |how: String| {
        let _ = tx.send(how);
    });
    backend.watch(&placement, on_death);
    k.delete_pod(placement.id()).await;
    let how = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
        .await
        .expect("join")
        .expect("the death watch fired");
    assert!(how.contains(placement.id()), "{how}");
    backend.unwatch(&placement);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let state = backend.state(&placement).await.expect("state");
        if state.status == ContainerStatus::Removed {
            break;
        }
        assert!(Instant::now() < until, "still there: {state}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    backend
        .remove(&placement, &id)
        .await
        .expect("removing a pod already gone is success");
    k.assert_clean(&test).await;
}

/// A namespace whose Pod Security level forbids the agent's CAP_SYS_ADMIN
/// still starts pristine sandboxes: without in-place reset, saying why
/// (the runtime's reason, naming the namespace and its level), and a
/// reset replaces the pod. Makes (and deletes) a namespace of its own
/// labelled `pod-security.kubernetes.io/enforce: baseline`.
#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_at_baseline_replaces_pristine_pods_and_says_why() {
    use k8s_openapi::api::core::v1::Namespace;
    let Some(k) =
        Kube::connect("a_namespace_at_baseline_replaces_pristine_pods_and_says_why").await
    else {
        return;
    };
    let test = format!("k-psa-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(k.backend.client().clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": test,
            "labels": {
                "pod-security.kubernetes.io/enforce": "baseline",
                TEST_LABEL: test,
            }
        }
    }))
    .expect("namespace");
    namespaces
        .create(&Default::default(), &ns)
        .await
        .expect("create the test namespace");
    let config = KubeConfig {
        namespace: Some(test.clone()),
        ..k.backend.config().clone()
    };
    let outcome = tokio::spawn(async move {
        let backend = KubeBackend::connect(&config).await.expect("connect");
        let rt = Runtime::new(
            Arc::new(backend.clone()),
            RuntimeConfig {
                shared_slots: false,
                reap_orphans: false,
                ..RuntimeConfig::default()
            },
        );
        // What doctor reports of it.
        let check = backend.pristine_check().await;
        assert!(!check.ok, "{check:?}");
        assert!(check.detail.contains("'baseline'"), "{check:?}");
        let mut s = SandboxSpec::new(image());
        s.limits.pids = None;
        for t in &mut s.tmpfs {
            t.options.clear();
        }
        s.pristine = true;
        let sb = rt.create(&s).await.expect("a pristine pod still starts");
        let why = sb.resets_in_place().expect_err("no in-place reset here");
        assert!(
            why.contains(&format!("namespace {}", backend.namespace()))
                && why.contains("'baseline'"),
            "{why}"
        );
        // Commands hold nothing more than usual, and neither does the agent.
        let r = sb
            .run(&corral::CommandSpec::shell("grep CapEff /proc/1/status"))
            .await;
        let eff = String::from_utf8_lossy(&r.stdout).to_string();
        let bits =
            u64::from_str_radix(eff.split_whitespace().nth(1).unwrap_or(""), 16).expect("CapEff");
        assert_eq!(bits & (1 << 21), 0, "the agent holds CAP_SYS_ADMIN: {eff}");
        let before = sb.container_id();
        let outcome = sb.reset().await.expect("reset");
        assert_eq!(outcome.mode, corral::ResetMode::Replaced, "{outcome:?}");
        assert!(
            outcome
                .fallback_reason
                .as_deref()
                .is_some_and(|r| r.contains("Pod Security 'baseline'")),
            "{outcome:?}"
        );
        assert_ne!(sb.container_id(), before);
        sb.destroy().await.expect("destroy");
        rt.backend().close().await;
    })
    .await;
    let _ = namespaces.delete(&test, &DeleteParams::default()).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A server in a pod is reached through the pod's address
/// (`Backend::open_port`): busybox `httpd` answers a request; a port with
/// nothing listening is an error naming the port; the agent's own port is
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn ports_of_a_pod_are_reached_through_its_address() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(k) = Kube::connect("ports_of_a_pod_are_reached_through_its_address").await else {
        return;
    };
    let test = format!("k-ports-{}", std::process::id());
    let sb = k.runtime.create(&spec(&k, &test)).await.expect("create");
    let r = sb
        .run(&corral::CommandSpec::shell(
            "mkdir -p /tmp/www && echo hello-from-the-pod > /tmp/www/index.html \
             && httpd -p 8080 -h /tmp/www",
        ))
        .await;
    assert_eq!((r.failure.clone(), r.exit_code), (None, Some(0)), "{r:?}");
    let backend = k.runtime.backend();
    let mut conn = backend
        .open_port(&sb.placement(), 8080)
        .await
        .expect("open port 8080");
    conn.write_all(b"GET /index.html HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .await
        .expect("send");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut answer))
        .await
        .expect("an answer in time")
        .expect("read");
    assert!(
        answer.starts_with("HTTP/1.") && answer.contains(" 200 "),
        "{answer}"
    );
    assert!(answer.contains("hello-from-the-pod"), "{answer}");

    let e = match backend.open_port(&sb.placement(), 8081).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("connected to a port nothing listens on"),
    };
    assert!(e.contains("port 8081"), "{e}");
    let agent_port = k.backend.config().agent_port;
    let e = match backend.open_port(&sb.placement(), agent_port).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("opened the agent's port"),
    };
    assert!(e.contains("agent's control port"), "{e}");
    sb.destroy().await.expect("destroy");
    k.assert_clean(&test).await;
}

/// A pod deleted by someone else (as `kubectl delete` does: graceful, the
/// agent running on until the kubelet kills it) is seen before the next
/// command: under `fail` the command is `container_lost` and never runs in
/// the dying pod; under `recreate` it runs in a new pod.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_elsewhere_never_runs_the_next_command() {
    let Some(k) = Kube::connect("a_pod_deleted_elsewhere_never_runs_the_next_command").await else {
        return;
    };
    let test = format!("k-deleted-{}", std::process::id());
    let mut failing = spec(&k, &test);
    failing.recovery = corral::Recovery::Fail;
    let mut recreating = spec(&k, &test);
    recreating.recovery = corral::Recovery::Recreate;
    let (a, b) = tokio::join!(k.runtime.create(&failing), k.runtime.create(&recreating));
    let (a, b) = (a.expect("create"), b.expect("create"));
    for sb in [&a, &b] {
        let r = sb
            .run(&corral::CommandSpec::shell("echo old > /tmp/marker"))
            .await;
        assert_eq!(r.failure, None, "{r:?}");
        // Deleted with a grace: the object shows a deletion timestamp
        // while the agent still runs.
        k.pods()
            .delete(
                sb.placement().id(),
                &DeleteParams {
                    grace_period_seconds: Some(10),
                    ..Default::default()
                },
            )
            .await
            .expect("delete out of band");
    }
    // The watch's event, not the kubelet, tells corral.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let r = a
        .run(&corral::CommandSpec::shell(
            "echo ran >> /tmp/marker; cat /tmp/marker",
        ))
        .await;
    assert!(r.stdout.is_empty(), "it ran: {r:?}");
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, corral::FailureKind::ContainerLost, "{f}");
    let old = b.container_id();
    let r = b
        .run(&corral::CommandSpec::shell(
            "cat /tmp/marker 2>/dev/null || echo fresh",
        ))
        .await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "fresh\n");
    assert_ne!(b.container_id(), old);
    a.destroy().await.expect("destroy");
    b.destroy().await.expect("destroy");
    k.assert_clean(&test).await;
    assert_eq!(
        ERRORS.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "corral logged an error (a protocol violation) after the deletions"
    );
}

/// A removal through the backend (another part of this process, `gc`, a
/// test removing out of band) closes the sandbox's control stream before
/// it returns, not when the watch's event arrives: the very next command
/// cannot reach the dying pod's agent.
#[tokio::test(flavor = "multi_thread")]
async fn a_removal_closes_the_stream_before_it_returns() {
    let Some(k) = Kube::connect("a_removal_closes_the_stream_before_it_returns").await else {
        return;
    };
    let test = format!("k-removal-{}", std::process::id());
    let mut s = spec(&k, &test);
    s.recovery = corral::Recovery::Fail;
    let sb = k.runtime.create(&s).await.expect("create");
    assert!(sb.looks_alive());
    k.runtime
        .backend()
        .remove(&sb.placement(), sb.id())
        .await
        .expect("remove out of band");
    assert!(
        !sb.looks_alive(),
        "the removal returned with the stream to the removed pod still open"
    );
    let r = sb.run(&corral::CommandSpec::shell("echo ran")).await;
    assert!(r.stdout.is_empty(), "it ran: {r:?}");
    assert_eq!(
        r.failure.map(|f| f.kind),
        Some(corral::FailureKind::ContainerLost)
    );
    sb.destroy().await.expect("destroy");
    k.assert_clean(&test).await;
}
