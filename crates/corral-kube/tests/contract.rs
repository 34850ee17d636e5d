//! The engine contract against a real cluster: the cases the Docker
//! backend passes (echo, exit codes, stdin, a timeout killing a tree, OOM
//! typed, the output cap, a lost pod under `fail` and `recreate`, files,
//! shells, refusals, no leaks), run through the runtime over
//! [`KubeBackend`].
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

use corral::{FileOptions, Runtime, RuntimeConfig};
use corral_core::backend::{Backend, OnDeath, StartRequest};
use corral_core::policy::Recovery;
use corral_core::{CommandSpec, ContainerStatus, Error, FailureKind, Network, SandboxSpec};
use corral_kube::{KubeBackend, KubeConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

/// The cluster under test, or `None` after saying why it is skipped.
async fn cluster(test: &str) -> Option<(Runtime, KubeBackend)> {
    let Some(kubeconfig) = std::env::var("CORRAL_TEST_KUBECONFIG")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        // Straight to stderr: the test harness captures eprintln!, and a
        // skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: CORRAL_TEST_KUBECONFIG is not set, so there is no cluster to run \
             the Kubernetes contract against"
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
    Some((runtime, backend))
}

fn image() -> String {
    std::env::var("CORRAL_TEST_KUBE_IMAGE").unwrap_or_else(|_| "corral-test/busybox:latest".into())
}

/// The hardened spec less what a pod cannot express (no per-pod pids
/// limit, no tmpfs options), labelled for the test.
fn spec(test: &str) -> SandboxSpec {
    let mut spec = SandboxSpec::new(image());
    spec.limits.pids = None;
    for t in &mut spec.tmpfs {
        t.options.clear();
    }
    spec.labels.insert("corraltest".into(), test.into());
    spec
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// The pods a test still has.
async fn remaining(backend: &KubeBackend, test: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(backend.client().clone(), backend.namespace());
    let list = pods
        .list(&ListParams::default().labels(&format!("corraltest={test}")))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// Asserts the test left no pod behind (deletion is asynchronous on a
/// cluster: a pod may take a moment to go).
async fn assert_clean(backend: &KubeBackend, test: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let left = remaining(backend, test).await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "test {test} leaked pods: {left:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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

/// Deletes a pod out of band, as an operator or the cluster would.
async fn delete_pod(backend: &KubeBackend, name: &str) {
    let pods: Api<Pod> = Api::namespaced(backend.client().clone(), backend.namespace());
    pods.delete(
        name,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete the pod out of band");
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_commands_with_exit_codes_and_separate_streams() {
    let test = "k-basic";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let t = Instant::now();
    let sb = rt.create(&spec(test)).await.expect("create");
    eprintln!("{test}: sandbox ready in {:?}", t.elapsed());
    let r = sb.run(&sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(text(&r.stdout), "out\n");
    assert_eq!(text(&r.stderr), "err\n");
    let r = sb.run(&sh("false")).await;
    assert_eq!((r.exit_code, r.failure), (Some(1), None));
    let r = sb.run(&CommandSpec::argv(["echo", "direct", "argv"])).await;
    assert_eq!(text(&r.stdout), "direct argv\n");
    let r = sb.run(&sh("echo $GREETING").env("GREETING", "hi")).await;
    assert_eq!(text(&r.stdout), "hi\n");
    // The agent is PID 1 and its directory is read-only.
    let r = sb
        .run(&sh(
            "cat /proc/1/cmdline | tr '\\0' ' '; touch /.corral/x 2>/dev/null || echo ro",
        ))
        .await;
    assert!(
        text(&r.stdout).starts_with("/.corral/corral-agent init"),
        "{r:?}"
    );
    assert!(text(&r.stdout).ends_with("ro\n"), "{r:?}");
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_is_forwarded_and_absent_stdin_is_eof() {
    let test = "k-stdin";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let sb = rt.create(&spec(test)).await.expect("create");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let r = sb.run(&sh("cat").stdin(data.clone())).await;
    assert_eq!(r.failure, None, "{:?}", r.failure);
    assert!(
        r.stdout == data,
        "stdin came back changed ({} bytes)",
        r.stdout.len()
    );
    let r = sb
        .run(&sh("cat; echo done").timeout(Duration::from_secs(20)))
        .await;
    assert_eq!(r.failure, None);
    assert_eq!(text(&r.stdout), "done\n");
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_capped_and_a_timeout_kills_the_tree() {
    let test = "k-cap";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let sb = rt.create(&spec(test)).await.expect("create");
    let r = sb
        .run(&sh("head -c 5000000 /dev/zero | tr '\\000' a; printf END").max_output(1 << 20))
        .await;
    assert_eq!(r.failure, None);
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_total_bytes, 5_000_003);
    assert_eq!(r.stdout.len(), 1 << 20);
    assert!(r.stdout.ends_with(b"aaaEND"));

    let cmd = CommandSpec::shell("sleep 300 & (sleep 301 &) ; setsid sleep 302 & sleep 303")
        .timeout(Duration::from_millis(800));
    let r = sb.run(&cmd).await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::Timeout));
    let r = sb
        .run(&sh(
            "ps -o pid,comm,args | grep 'sleep 30' | grep -v grep; true",
        ))
        .await;
    assert_eq!(text(&r.stdout), "", "survivors: {}", text(&r.stdout));
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oom_kill_is_typed() {
    let test = "k-oom";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let mut s = spec(test);
    s.limits.memory = Some(64 << 20);
    let sb = rt.create(&s).await.expect("create");
    let r = sb
        .run(&sh("dd if=/dev/zero of=/dev/null bs=200M count=1"))
        .await;
    let f = r.failure.expect("oom");
    assert_eq!(f.kind, FailureKind::OomKilled, "{f}");
    let r = sb.run(&sh("echo alive")).await;
    assert_eq!(text(&r.stdout), "alive\n");
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_out_of_band_is_container_lost_under_fail() {
    let test = "k-lost";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let mut s = spec(test);
    s.recovery = Recovery::Fail;
    let sb = rt.create(&s).await.expect("create");
    let running = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.run(&sh("sleep 60")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    delete_pod(&backend, &sb.container_id()).await;
    let r = running.await.expect("join");
    let f = r.failure.expect("lost");
    assert_eq!(f.kind, FailureKind::ContainerLost, "{f}");
    assert!(f.retryable());
    let r = sb.run(&sh("true")).await;
    assert_eq!(r.failure.map(|f| f.kind), Some(FailureKind::ContainerLost));
    sb.destroy()
        .await
        .expect("destroy of a deleted pod is fine");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_out_of_band_is_replaced_under_recreate() {
    let test = "k-recreate";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let mut s = spec(test);
    s.recovery = Recovery::Recreate;
    let sb = rt.create(&s).await.expect("create");
    let first = sb.container_id();
    delete_pod(&backend, &first).await;
    let r = sb.run(&sh("echo again")).await;
    assert_eq!(r.failure, None, "{r:?}");
    assert_eq!(text(&r.stdout), "again\n");
    assert_ne!(sb.container_id(), first, "a new pod");
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_and_shells_work() {
    let test = "k-files";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let sb = rt.create(&spec(test)).await.expect("create");
    let data: Vec<u8> = (0..70_000u32).map(|i| (i % 256) as u8).collect();
    let opts = FileOptions::default();
    sb.write_file("/tmp/data.bin", &data, &opts)
        .await
        .expect("write");
    let back = sb.read_file("/tmp/data.bin", &opts).await.expect("read");
    assert!(back == data, "read back {} bytes", back.len());
    let missing = sb.read_file("/tmp/nope", &opts).await.expect_err("missing");
    assert!(
        matches!(missing, corral::FileError::NotFound { .. }),
        "{missing}"
    );

    let shell = sb.shell("main");
    let t = Some(Duration::from_secs(30));
    let r = shell.run("cd /tmp && X=42", t, 1 << 20).await;
    assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
    let r = shell.run("echo $X $(pwd)", t, 1 << 20).await;
    assert_eq!(text(&r.result.stdout), "42 /tmp\n");
    sb.destroy().await.expect("destroy");
    assert_clean(&backend, test).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_typed_and_leave_nothing() {
    let test = "k-refuse";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    // The unmodified hardened default asks for a pids limit.
    let mut s = SandboxSpec::new(image());
    s.labels.insert("corraltest".into(), test.into());
    let e = create_err(&rt, &s).await;
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("limits.pids"), "{e}");

    let mut s = spec(test);
    s.image = "corral-test/does-not-exist:1".into();
    let e = create_err(&rt, &s).await;
    assert_eq!(e.kind(), FailureKind::ImageNotFound, "{e}");
    assert!(
        e.to_string().contains("corral-test/does-not-exist:1"),
        "{e}"
    );

    let mut s = spec(test);
    s.network = Network::None;
    s.limits.memory = Some(u64::MAX / 2);
    // No node has 4 EiB: the scheduler's refusal, typed and retryable.
    let e = create_err(&rt, &s).await;
    assert!(matches!(e, Error::Capacity { .. }), "{e}");
    assert!(e.retryable());
    assert_clean(&backend, test).await;
}

/// The backend's own operations, below the runtime: a pod is made and
/// runs, its state and listing read back what corral put on it, the death
/// watch fires when it is deleted out of band, and removal is final.
#[tokio::test(flavor = "multi_thread")]
async fn pods_are_made_run_listed_watched_and_removed() {
    let test = "k-pod";
    let Some((rt, backend)) = cluster(test).await else {
        return;
    };
    let s = spec(test);
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
        env: vec![("GREETING".into(), "hi".into())],
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
        info.labels.get("corraltest").map(String::as_str),
        Some(test)
    );
    assert_eq!(info.state, ContainerStatus::Running);

    let (tx, rx) = std::sync::mpsc::channel();
    let on_death: OnDeath = Arc::new(move |how: String| {
        let _ = tx.send(how);
    });
    backend.watch(&placement, on_death);
    delete_pod(&backend, placement.id()).await;
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
    assert_clean(&backend, test).await;
}
