//! Ownership by Lease, persistent sessions on claims and `doctor`'s agent
//! image check, against a real cluster: the cluster named by
//! `CORRAL_TEST_KUBECONFIG` (namespace `CORRAL_TEST_KUBE_NAMESPACE`,
//! default `corral-test`; images `CORRAL_TEST_KUBE_IMAGE` and
//! `CORRAL_TEST_KUBE_AGENT_IMAGE`, as for `tests/contract.rs`; on a
//! cluster without a registry name a sandbox image tagged other than
//! `latest`, which Kubernetes always pulls). Without
//! `CORRAL_TEST_KUBECONFIG` every case prints that it was skipped.
//!
//! `a_persistent_sessions_files_outlive_its_pods` runs commands, so it
//! needs a cluster whose `pods/attach` works for corral (see README);
//! the others need no connection to an agent.
//!
//! Two `KubeBackend`s in one test are two corral processes: each holds
//! its own Lease.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::pool::ProviderConfig;
use corral::{CommandSpec, Provider, Runtime, RuntimeConfig, SandboxSpec};
use corral_core::backend::{Backend, Placement, SandboxInfo, StartRequest};
use corral_core::labels::{self, Owner, Ownership};
use corral_kube::lease::LEASE_LABEL;
use corral_kube::{KubeBackend, KubeConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::Api;

/// A backend (a corral process) on the cluster under test, with Leases
/// of `lease_secs`, or `None` after saying why the test is skipped.
async fn backend(test: &str, lease_secs: u64) -> Option<KubeBackend> {
    let Some(kubeconfig) = std::env::var("CORRAL_TEST_KUBECONFIG")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: CORRAL_TEST_KUBECONFIG is not set, so there is no cluster"
        );
        return None;
    };
    let config = KubeConfig {
        kubeconfig: Some(kubeconfig),
        namespace: Some(
            std::env::var("CORRAL_TEST_KUBE_NAMESPACE").unwrap_or_else(|_| "corral-test".into()),
        ),
        agent_image: std::env::var("CORRAL_TEST_KUBE_AGENT_IMAGE")
            .unwrap_or_else(|_| corral_kube::default_agent_image()),
        lease_duration: Duration::from_secs(lease_secs),
        session_volume_size: 1 << 20,
        ..KubeConfig::default()
    };
    Some(
        KubeBackend::connect(&config)
            .await
            .expect("CORRAL_TEST_KUBECONFIG names a cluster that answers"),
    )
}

fn runtime(backend: &KubeBackend, seal_dir: &std::path::Path) -> Runtime {
    Runtime::new(
        Arc::new(backend.clone()),
        RuntimeConfig {
            shared_slots: false,
            reap_orphans: false,
            seal_key_file: Some(seal_dir.join("seal.key")),
            ..RuntimeConfig::default()
        },
    )
}

/// The hardened spec less what a pod cannot express, labelled for `test`.
fn spec(test: &str) -> SandboxSpec {
    let image = std::env::var("CORRAL_TEST_KUBE_IMAGE")
        .unwrap_or_else(|_| "corral-test/busybox:latest".into());
    let mut spec = SandboxSpec::new(image);
    spec.limits.pids = None;
    for t in &mut spec.tmpfs {
        t.options.clear();
    }
    spec.labels.insert("corraltest".into(), test.into());
    spec
}

/// A directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deletes what a test made even when it fails: its pods (by the test's
/// label), the claims named, and the backend's Lease (`close`).
struct Cleanup {
    backend: KubeBackend,
    test: &'static str,
    claims: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let pods: Api<Pod> =
            Api::namespaced(self.backend.client().clone(), self.backend.namespace());
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.backend.client().clone(), self.backend.namespace());
        let selector = format!("corraltest={}", self.test);
        let names = std::mem::take(&mut self.claims);
        let backend = self.backend.clone();
        let cleanup = async move {
            backend.close().await;
            let now = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            let _ = pods
                .delete_collection(&now, &ListParams::default().labels(&selector))
                .await;
            for name in names {
                let _ = claims.delete(&name, &DeleteParams::default()).await;
            }
        };
        // Drop may run on the test's runtime thread: clean up on another.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(cleanup);
            }
        })
        .join();
    }
}

async fn find(rt: &Runtime, placement: &Placement) -> Option<SandboxInfo> {
    rt.list_sandboxes()
        .await
        .expect("list")
        .into_iter()
        .find(|i| &i.placement == placement)
}

/// Makes and starts a sandbox pod through `backend` alone (no runtime
/// holds the backend, so dropping it ends its Lease's renewals).
async fn make_pod(backend: &KubeBackend, owner: &Owner, test: &str) -> Placement {
    let s = spec(test);
    let id = format!("sb-{test}-{}", std::process::id() % 100_000);
    let labels = [(labels::SANDBOX.to_string(), id.clone())]
        .into_iter()
        .chain(owner.labels())
        .collect();
    let req = StartRequest {
        sandbox_id: &id,
        spec: &s,
        agent_env: Vec::new(),
        labels,
        owner,
    };
    backend.prepare(&req).await.expect("prepare");
    let placement = backend.create(&req).await.expect("create");
    backend.start(&req, &placement).await.expect("start");
    placement
}

async fn lease_exists(backend: &KubeBackend, name: &str) -> bool {
    let leases: Api<Lease> = Api::namespaced(backend.client().clone(), backend.namespace());
    leases.get_opt(name).await.expect("read Lease").is_some()
}

/// A corral on another host whose process dies (its Lease is no longer
/// renewed) leaves pods that another corral judges orphans once the Lease
/// expired, and its `gc` removes them and the Lease; before that they are
/// the live owner's and `gc` keeps them.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_owners_pods_are_orphans_any_corral_collects() {
    let test = "k-lease-expiry";
    let Some(a) = backend(test, 10).await else {
        return;
    };
    let Some(b) = backend(test, 10).await else {
        return;
    };
    let _cleanup = Cleanup {
        backend: b.clone(),
        test,
        claims: Vec::new(),
    };
    let seal = TempDir::new(test);
    let judge = runtime(&b, &seal.0);
    // Another host: by host and pid it could never be judged from here.
    let elsewhere = Owner {
        host: "another-node".into(),
        pid: 4242,
        start: 1,
    };
    let placement = make_pod(&a, &elsewhere, test).await;
    let info = find(&judge, &placement).await.expect("listed");
    assert_eq!(info.ownership, Ownership::LiveOwner, "{info:?}");
    let lease = info
        .labels
        .get(LEASE_LABEL)
        .cloned()
        .expect("a Lease label");
    assert!(lease_exists(&b, &lease).await);
    let report = judge.gc(false).await.expect("gc");
    assert!(
        !report.removed.iter().any(|i| i.placement == placement),
        "gc removed a live owner's pod"
    );

    // The owner dies: nothing renews its Lease any more.
    drop(a);
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let info = find(&judge, &placement).await.expect("still listed");
        if info.ownership == Ownership::Orphan {
            break;
        }
        assert_eq!(info.ownership, Ownership::LiveOwner);
        assert!(Instant::now() < until, "the Lease never expired");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let report = judge.gc(false).await.expect("gc");
    assert!(
        report.removed.iter().any(|i| i.placement == placement),
        "gc kept an orphan: {report:?}"
    );
    assert!(
        report.volumes_removed.contains(&format!("lease/{lease}")),
        "{report:?}"
    );
    assert!(!lease_exists(&b, &lease).await, "the expired Lease is gone");
    assert!(find(&judge, &placement).await.is_none());
    b.close().await;
}

/// A corral that exits cleanly deletes its Lease: its pods are orphans at
/// once, not a Lease duration later.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_owners_pods_are_orphans_at_once() {
    let test = "k-lease-close";
    let Some(a) = backend(test, 60).await else {
        return;
    };
    let Some(b) = backend(test, 60).await else {
        return;
    };
    let _cleanup = Cleanup {
        backend: b.clone(),
        test,
        claims: Vec::new(),
    };
    let seal = TempDir::new(test);
    let judge = runtime(&b, &seal.0);
    let owner = corral::host::this_owner();
    let placement = make_pod(&a, &owner, test).await;
    let info = find(&judge, &placement).await.expect("listed");
    assert_eq!(info.ownership, Ownership::LiveOwner);
    let lease = info
        .labels
        .get(LEASE_LABEL)
        .cloned()
        .expect("a Lease label");
    a.close().await;
    assert!(!lease_exists(&b, &lease).await, "close deleted the Lease");
    let info = find(&judge, &placement).await.expect("listed");
    assert_eq!(info.ownership, Ownership::Orphan);
    let report = judge.gc(false).await.expect("gc");
    assert!(report.removed.iter().any(|i| i.placement == placement));
    b.close().await;
}

/// A persistent session's files live in its claim: they outlive its pods;
/// the recorded pod is adopted by the next provider; releasing deletes the
/// pod and keeps the claim, which `gc` never touches.
#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_sessions_files_outlive_its_pods() {
    let test = "k-session";
    let Some(b) = backend(test, 60).await else {
        return;
    };
    let key = format!("corral-test/{}", std::process::id());
    let claim = corral_kube::session::claim_name(&key);
    let _cleanup = Cleanup {
        backend: b.clone(),
        test,
        claims: vec![claim.clone()],
    };
    let seal = TempDir::new(test);
    let rt = runtime(&b, &seal.0);
    let root = seal.0.join("workspaces");
    let provider =
        || Provider::with_persistence_root(rt.clone(), ProviderConfig::default(), root.clone());
    let sh = |s: &str| CommandSpec::shell(s).timeout(Duration::from_secs(60));

    let p1 = provider();
    let lease = p1
        .acquire_persistent(&key, &spec(test))
        .await
        .expect("acquire");
    let r = lease
        .run(&sh("echo kept > /workspace/f && echo $HOME && pwd"))
        .await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "/home/corral\n/workspace\n",
        "{r:?}"
    );
    let first = lease.id().to_string();
    drop(lease);
    p1.shutdown().await;

    // A restarted corral adopts the recorded, running pod.
    let p2 = provider();
    let lease = p2
        .acquire_persistent(&key, &spec(test))
        .await
        .expect("adopt");
    assert_eq!(lease.id(), first, "adopted");
    drop(lease);
    p2.release_and_wait(&key).await.expect("release");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(b.client().clone(), b.namespace());
    assert!(
        claims.get_opt(&claim).await.expect("read claim").is_some(),
        "releasing kept the claim"
    );
    let report = rt.gc(false).await.expect("gc");
    assert!(report.volumes_removed.iter().all(|v| !v.contains(&claim)));

    // A new pod of the session finds the files.
    let lease = p2
        .acquire_persistent(&key, &spec(test))
        .await
        .expect("acquire again");
    assert_ne!(lease.id(), first);
    let r = lease.run(&sh("cat /workspace/f")).await;
    assert_eq!(r.stdout, b"kept\n", "{r:?}");
    drop(lease);
    p2.release_and_wait(&key).await.expect("release");
    p2.shutdown().await;
    assert!(!root.exists(), "no host directory was made");
    b.close().await;
}

/// Below the runtime (no agent connection needed): a persistent pod gets
/// its session's claim, mounted, and is recorded on it; it is judged
/// persistent whatever its Lease; removing it keeps the claim, and `gc`
/// never deletes one.
#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_pods_claim_is_made_recorded_and_kept() {
    let test = "k-claim";
    let Some(b) = backend(test, 60).await else {
        return;
    };
    let key = format!("corral-test/{}/claim", std::process::id());
    let claim = corral_kube::session::claim_name(&key);
    let _cleanup = Cleanup {
        backend: b.clone(),
        test,
        claims: vec![claim.clone()],
    };
    let seal = TempDir::new(test);
    let rt = runtime(&b, &seal.0);
    let owner = corral::host::this_owner();
    let mut s = spec(test);
    s.persistent = Some(key.clone());
    let id = format!("sb-{test}-{}", std::process::id() % 100_000);
    let labels = [
        (labels::SANDBOX.to_string(), id.clone()),
        (labels::PERSISTENT.to_string(), "true".to_string()),
        (labels::SESSION.to_string(), key.clone()),
    ]
    .into_iter()
    .chain(owner.labels())
    .collect();
    let req = StartRequest {
        sandbox_id: &id,
        spec: &s,
        agent_env: Vec::new(),
        labels,
        owner: &owner,
    };
    b.prepare(&req).await.expect("prepare");
    let placement = b.create(&req).await.expect("create");

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(b.client().clone(), b.namespace());
    let made = claims.get(&claim).await.expect("the session's claim");
    let annotations = made.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(labels::SESSION), Some(&key));
    assert_eq!(
        annotations.get(corral_kube::session::CLAIM_POD),
        Some(&placement.0),
        "the pod is recorded on its claim"
    );
    let pods: Api<Pod> = Api::namespaced(b.client().clone(), b.namespace());
    let pod = pods.get(placement.id()).await.expect("the pod");
    let mounted = pod
        .spec
        .and_then(|s| s.volumes)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.persistent_volume_claim)
        .any(|c| c.claim_name == claim);
    assert!(mounted, "the pod mounts the claim");
    assert_eq!(
        b.session_placement(&key).await.expect("record"),
        Some(placement.clone())
    );
    assert_eq!(
        b.session_placement("no-such-session").await.expect("none"),
        None
    );

    // Persistent whatever its Lease says, and gc keeps it and its claim.
    b.close().await;
    let info = find(&rt, &placement).await.expect("listed");
    assert_eq!(info.ownership, Ownership::Persistent);
    assert_eq!(info.session.as_deref(), Some(key.as_str()));
    let report = rt.gc(false).await.expect("gc");
    assert!(!report.removed.iter().any(|i| i.placement == placement));

    b.remove(&placement, &id).await.expect("remove");
    assert!(
        claims.get_opt(&claim).await.expect("read claim").is_some(),
        "removing the pod kept the claim"
    );
    assert_eq!(b.session_placement(&key).await.expect("record"), None);
    rt.gc(false).await.expect("gc");
    assert!(
        claims.get_opt(&claim).await.expect("read claim").is_some(),
        "gc kept the claim"
    );
}

/// `doctor` runs the agent image on the nodes and leaves no pod behind.
#[tokio::test(flavor = "multi_thread")]
async fn doctor_runs_the_agent_image_and_cleans_up() {
    let test = "k-doctor";
    let Some(b) = backend(test, 60).await else {
        return;
    };
    let report = b.doctor(&corral::host::this_owner()).await.expect("doctor");
    let check = report
        .checks
        .iter()
        .find(|c| c.name == "agent image")
        .expect("an agent image check");
    assert!(check.ok, "{check:?}");
    assert!(
        check.detail.contains(env!("CARGO_PKG_VERSION")),
        "{check:?}"
    );
    let pods: Api<Pod> = Api::namespaced(b.client().clone(), b.namespace());
    let left = pods
        .list(&ListParams::default().labels(corral_kube::doctor::DOCTOR_LABEL))
        .await
        .expect("list");
    let ours: Vec<_> = left
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::OWNER_PID))
                .is_some_and(|pid| pid == &std::process::id().to_string())
        })
        .collect();
    assert!(ours.is_empty(), "doctor left {} pods", ours.len());
    b.close().await;
}
