//! `cargo bench -p corral-kube --bench forks`: a fork of N pods on a
//! cluster against preparing N, each way measured in the same run on the
//! same cluster:
//! - preparing N from scratch [floor]: N pods created at once, each
//!   running the preparation (`FORKS_MB` MB of files written, 50 by
//!   default, as `corral bench`'s fork row);
//! - forking N: one pristine pod prepared the same way, its snapshot (a
//!   delta its agent sends over the control stream, no image, no
//!   registry), then N pods forked from it, each taking the delta in
//!   before its first command.
//!
//! Every fork is checked to hold the preparation before it is destroyed.
//! `FORKS_N` pods per round (default 4), `FORKS_ROUNDS` rounds (default
//! 3). Runs against the cluster `CORRAL_TEST_KUBECONFIG` names, in
//! `CORRAL_TEST_KUBE_NAMESPACE` (default `corral-test`), with the images
//! of the Kubernetes contract (`CORRAL_TEST_KUBE_IMAGE`,
//! `CORRAL_TEST_KUBE_AGENT_IMAGE`); without a cluster it says so and
//! exits. Under `cargo test` (no `--bench`) it does nothing. Every pod it
//! makes carries `corralbench=<run>` and is deleted at the end, also
//! after a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Runtime, RuntimeConfig, Sandbox, SnapshotOptions};
use corral_core::snapshot::SnapshotKind;
use corral_core::{CommandSpec, SandboxSpec};
use corral_kube::{KubeBackend, KubeConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

const LABEL: &str = "corralbench";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn prepare(mb: usize) -> CommandSpec {
    CommandSpec::shell(format!(
        "mkdir -p /srv/prepared && for i in $(seq 1 {mb}); do \
         head -c 1048576 /dev/urandom > /srv/prepared/f$i || exit 1; done"
    ))
    .timeout(Duration::from_secs(600))
}

fn check(mb: usize) -> CommandSpec {
    CommandSpec::shell(format!(
        "test $(ls /srv/prepared | wc -l) -eq {mb} && test -s /srv/prepared/f{mb}"
    ))
    .timeout(Duration::from_secs(60))
}

async fn run_ok(sb: &Sandbox, cmd: &CommandSpec) {
    let r = sb.run(cmd).await;
    assert!(
        r.failure.is_none() && r.exit_code == Some(0),
        "{:?} in {}: {r:?}",
        cmd.argv,
        sb.id()
    );
}

async fn destroy_all(sandboxes: Vec<Sandbox>) {
    for r in futures_util::future::join_all(sandboxes.iter().map(Sandbox::destroy)).await {
        r.expect("destroy");
    }
}

/// N pods created and prepared at once; the wall time.
async fn scratch(rt: &Runtime, spec: &SandboxSpec, n: usize, mb: usize) -> Duration {
    let t = Instant::now();
    let made = futures_util::future::join_all((0..n).map(|_| async {
        let sb = rt.create(spec).await.expect("create");
        run_ok(&sb, &prepare(mb)).await;
        sb
    }))
    .await;
    let took = t.elapsed();
    destroy_all(made).await;
    took
}

struct Forked {
    snapshot: Duration,
    fork: Duration,
    bytes: i64,
}

/// One pristine pod prepared (not timed), its delta snapshot and N forks
/// of it (timed), each fork checked.
async fn fork(rt: &Runtime, spec: &SandboxSpec, n: usize, mb: usize, name: &str) -> Forked {
    let source = rt.create(spec).await.expect("create the source");
    source
        .resets_in_place()
        .unwrap_or_else(|why| panic!("a pristine pod must reset in place to fork: {why}"));
    run_ok(&source, &prepare(mb)).await;
    let t = Instant::now();
    let info = source
        .snapshot(name, SnapshotOptions::default())
        .await
        .expect("snapshot");
    let snapshot = t.elapsed();
    assert_eq!(info.kind, SnapshotKind::Delta);
    let t = Instant::now();
    let forks = rt.fork(name, n).await.expect("fork");
    let fork = t.elapsed();
    for f in &forks {
        run_ok(f, &check(mb)).await;
    }
    destroy_all(forks).await;
    source.destroy().await.expect("destroy");
    rt.delete_snapshot(name).await.expect("delete the snapshot");
    Forked {
        snapshot,
        fork,
        bytes: info.size,
    }
}

async fn sweep(pods: &Api<Pod>, run: &str) {
    let params = ListParams::default().labels(&format!("{LABEL}={run}"));
    if let Ok(list) = pods.list(&params).await {
        for pod in list.items {
            if let Some(name) = pod.metadata.name {
                let _ = pods
                    .delete(
                        &name,
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await;
            }
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(kubeconfig) = std::env::var("CORRAL_TEST_KUBECONFIG")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("forks: CORRAL_TEST_KUBECONFIG is not set: no cluster to measure");
        return;
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
    let pods: Api<Pod> = Api::namespaced(backend.client().clone(), backend.namespace());
    let rt = Runtime::new(
        Arc::new(backend.clone()),
        RuntimeConfig {
            shared_slots: false,
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    let run = format!("forks-{}", std::process::id());
    let mut spec = SandboxSpec::new(
        std::env::var("CORRAL_TEST_KUBE_IMAGE")
            .unwrap_or_else(|_| "corral-test/busybox:latest".into()),
    );
    spec.limits.pids = None;
    for t in &mut spec.tmpfs {
        t.options.clear();
    }
    spec.labels.insert(LABEL.into(), run.clone());
    spec.pristine = true;
    let (n, rounds, mb) = (
        env_or("FORKS_N", 4),
        env_or("FORKS_ROUNDS", 3),
        env_or("FORKS_MB", 50),
    );
    let measured = tokio::spawn({
        let (rt, spec, run) = (rt.clone(), spec.clone(), run.clone());
        async move {
            let mut scratches = Vec::new();
            let mut forks = Vec::new();
            for round in 0..rounds {
                // Alternate which way goes first, so neither always finds
                // the node's caches warmer.
                let name = format!("{run}-{round}");
                if round % 2 == 0 {
                    scratches.push(scratch(&rt, &spec, n, mb).await);
                    forks.push(fork(&rt, &spec, n, mb, &name).await);
                } else {
                    forks.push(fork(&rt, &spec, n, mb, &name).await);
                    scratches.push(scratch(&rt, &spec, n, mb).await);
                }
            }
            (scratches, forks)
        }
    })
    .await;
    sweep(&pods, &run).await;
    let (scratches, forks) = match measured {
        Ok(m) => m,
        Err(e) => {
            rt.backend().close().await;
            panic!("the bench failed (its pods were deleted): {e}");
        }
    };
    rt.backend().close().await;
    println!(
        "cluster {} namespace {}; {n} pods per round, {rounds} rounds, {mb} MB prepared",
        backend.endpoint_url(),
        backend.namespace()
    );
    println!(
        "{:<48} {:>10} {:>10} {:>10}",
        "row (wall per round)", "median ms", "min ms", "max ms"
    );
    let row = |name: &str, v: &[Duration]| {
        println!(
            "{:<48} {:>10.0} {:>10.0} {:>10.0}",
            name,
            ms(median(v.to_vec())),
            ms(*v.iter().min().expect("a round")),
            ms(*v.iter().max().expect("a round"))
        );
    };
    let walls: Vec<Duration> = forks.iter().map(|f| f.snapshot + f.fork).collect();
    row(&format!("prepare {n} from scratch [floor]"), &scratches);
    row(&format!("fork {n} (snapshot + fork)"), &walls);
    row(
        "  of which the snapshot (delta over the stream)",
        &forks.iter().map(|f| f.snapshot).collect::<Vec<_>>(),
    );
    row(
        &format!("  of which the fork ({n} pods, delta into each)"),
        &forks.iter().map(|f| f.fork).collect::<Vec<_>>(),
    );
    println!(
        "delta {:.1} MB; fork of {n} vs preparing {n}: {:.2}x (median walls)",
        forks[0].bytes as f64 / 1e6,
        median(scratches).as_secs_f64() / median(walls).as_secs_f64()
    );
}
