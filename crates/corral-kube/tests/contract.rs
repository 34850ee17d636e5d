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

impl Kube {
    /// The cluster `CORRAL_TEST_KUBECONFIG` names, or `None` after saying
    /// why `test` is skipped.
    async fn connect(test: &str) -> Option<Kube> {
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
