//! `cargo bench -p corral-kube --bench episodes`: what an episode costs on
//! a cluster, each row against its floor measured in the same run on the
//! same cluster:
//! - a reset of a pristine pod in place (the agent's overlay, no API
//!   call) against a reset that replaces the pod (delete, create, wait
//!   until it runs, start-up commands);
//! - an RL workload, E episodes of M commands with P at a time, from a
//!   pristine pool of P pods reset in place between episodes against a
//!   new pod per episode (create, commands, delete).
//!
//! Runs against the cluster `CORRAL_TEST_KUBECONFIG` names, in
//! `CORRAL_TEST_KUBE_NAMESPACE` (default `corral-test`), with the images
//! of the Kubernetes contract (`CORRAL_TEST_KUBE_IMAGE`,
//! `CORRAL_TEST_KUBE_AGENT_IMAGE`); without a cluster it says so and
//! exits. `EPISODES_RESETS` in-place resets (default 30),
//! `EPISODES_REPLACES` replacements (default 5), `EPISODES_E`,
//! `EPISODES_M`, `EPISODES_P` for the workload (default 12, 5, 4). Under
//! `cargo test` (no `--bench`) it does nothing. Every pod it makes
//! carries `corralbench=<run>` and is deleted at the end, also after a
//! failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::pool::{PoolConfig, ProviderConfig};
use corral::{Provider, ResetMode, Runtime, RuntimeConfig, Sandbox};
use corral_core::{CommandSpec, SandboxSpec};
use corral_kube::{KubeBackend, KubeConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use tokio::task::JoinSet;

const LABEL: &str = "corralbench";

/// What an episode leaves behind before a reset: files on the root file
/// system and a process left running; the next episode checks both gone.
const MESS: &str = "test ! -e /etc/bench-mess && echo x > /etc/bench-mess \
    && mkdir -p /opt/bench && echo y > /opt/bench/f \
    && { sleep 600 </dev/null >/dev/null 2>&1 & }";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cmd(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

/// Nearest-rank percentile of sorted samples, in ms.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e3
}

struct Row {
    name: String,
    samples: Vec<Duration>,
}

impl Row {
    fn new(name: &str, mut samples: Vec<Duration>) -> Row {
        samples.sort();
        Row {
            name: name.into(),
            samples,
        }
    }

    fn p50(&self) -> f64 {
        pct(&self.samples, 50.0)
    }

    fn print(&self) {
        println!(
            "{:<52} {:>6} {:>11.3} {:>11.3} {:>11.3}",
            self.name,
            self.samples.len(),
            self.p50(),
            pct(&self.samples, 90.0),
            pct(&self.samples, 99.0)
        );
    }
}

async fn run_ok(sb: &Sandbox, script: &str) {
    let r = sb.run(&cmd(script)).await;
    assert!(
        r.failure.is_none() && r.exit_code == Some(0),
        "{script}: {r:?}"
    );
}

/// `n` resets of one sandbox of `spec`, each after a mess, checked done
/// the expected way and the mess gone.
async fn resets(rt: &Runtime, spec: &SandboxSpec, n: usize, mode: ResetMode) -> Vec<Duration> {
    let sb = rt.create(spec).await.expect("create");
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 1 {
        run_ok(&sb, MESS).await;
        let t = Instant::now();
        let outcome = sb.reset().await.expect("reset");
        let took = t.elapsed();
        assert_eq!(outcome.mode, mode, "{outcome:?}");
        // The first is a warm-up.
        if i > 0 {
            samples.push(took);
        }
    }
    run_ok(
        &sb,
        "test ! -e /etc/bench-mess && test \"$(ps -o args | grep -c '[s]leep 600')\" = 0",
    )
    .await;
    sb.destroy().await.expect("destroy");
    samples
}

/// One episode: M trivial commands, the first checking the last episode
/// left nothing, the last leaving a mess.
async fn episode(sb: &Sandbox, m: usize) {
    run_ok(sb, "test ! -e /etc/bench-mess").await;
    for _ in 1..m.saturating_sub(1) {
        run_ok(sb, "true").await;
    }
    run_ok(sb, MESS).await;
}

/// E episodes, P at a time, a new pod each; returns the wall time and
/// each episode's time (create, commands, delete).
async fn new_pod_per_episode(
    rt: &Runtime,
    spec: &SandboxSpec,
    e: usize,
    m: usize,
    p: usize,
) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(p));
    let mut set = JoinSet::new();
    for _ in 0..e {
        let (rt, spec, permits) = (rt.clone(), spec.clone(), permits.clone());
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("permit");
            let t = Instant::now();
            let sb = rt.create(&spec).await.expect("create");
            episode(&sb, m).await;
            sb.destroy().await.expect("destroy");
            t.elapsed()
        });
    }
    let mut each = Vec::new();
    while let Some(r) = set.join_next().await {
        each.push(r.expect("episode"));
    }
    (start.elapsed(), each)
}

/// E episodes, P at a time, from a pristine pool of P pods filled (and
/// each used and reset once) before the clock; a released pod is reset
/// in place in the background and handed to a later episode. The clock
/// stops when every reset is done. Returns the wall time, each episode's
/// time (acquire, commands, release) and the provider.
async fn pristine_pool(
    rt: &Runtime,
    spec: &SandboxSpec,
    e: usize,
    m: usize,
    p: usize,
) -> (Duration, Vec<Duration>) {
    let config = ProviderConfig {
        max_live: p,
        pools: BTreeMap::from([(
            "episodes".to_string(),
            PoolConfig {
                spec: spec.clone(),
                warm: p,
                pristine: true,
                ..PoolConfig::default()
            },
        )]),
        ..ProviderConfig::default()
    };
    let provider = Provider::new(rt.clone(), config);
    assert!(
        provider
            .wait_warm("episodes", Duration::from_secs(300))
            .await,
        "the pool never filled"
    );
    // Prime: every pod used and reset once, so each timed episode gets
    // one an earlier episode used.
    let mut primed = Vec::new();
    for i in 0..p {
        let lease = provider
            .acquire(&format!("prime-{i}"), "episodes")
            .await
            .expect("acquire");
        lease
            .resets_in_place()
            .unwrap_or_else(|why| panic!("the pool's pods cannot reset in place: {why}"));
        run_ok(&lease, MESS).await;
        primed.push(lease);
    }
    for lease in primed {
        lease.release().await.expect("release");
    }
    provider.settled(Duration::from_secs(120)).await;
    let before = rt.metrics();

    let start = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(p));
    let mut set = JoinSet::new();
    for i in 0..e {
        let (provider, permits) = (provider.clone(), permits.clone());
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("permit");
            let t = Instant::now();
            let lease = provider
                .acquire(&format!("episode-{i}"), "episodes")
                .await
                .expect("acquire");
            episode(&lease, m).await;
            lease.release().await.expect("release");
            t.elapsed()
        });
    }
    let mut each = Vec::new();
    while let Some(r) = set.join_next().await {
        each.push(r.expect("episode"));
    }
    provider.settled(Duration::from_secs(120)).await;
    let wall = start.elapsed();
    let after = rt.metrics();
    assert_eq!(
        after.resets_replaced, before.resets_replaced,
        "a pool pod was replaced instead of reset in place"
    );
    assert!(
        after.resets_in_place >= before.resets_in_place + e as u64,
        "every episode's pod was reset in place: {} -> {}",
        before.resets_in_place,
        after.resets_in_place
    );
    provider.shutdown().await;
    (wall, each)
}

/// Deletes every pod of this run (the end, and after a failure).
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

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(kubeconfig) = std::env::var("CORRAL_TEST_KUBECONFIG")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("episodes: CORRAL_TEST_KUBECONFIG is not set: no cluster to measure");
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
    let run = format!("episodes-{}", std::process::id());
    let mut spec = SandboxSpec::new(
        std::env::var("CORRAL_TEST_KUBE_IMAGE")
            .unwrap_or_else(|_| "corral-test/busybox:latest".into()),
    );
    spec.limits.pids = None;
    for t in &mut spec.tmpfs {
        t.options.clear();
    }
    spec.labels.insert(LABEL.into(), run.clone());
    let mut pristine = spec.clone();
    pristine.pristine = true;

    let (n_reset, n_replace) = (
        env_or("EPISODES_RESETS", 30),
        env_or("EPISODES_REPLACES", 5),
    );
    let (e, m, p) = (
        env_or("EPISODES_E", 12),
        env_or("EPISODES_M", 5),
        env_or("EPISODES_P", 4),
    );
    let measured = tokio::spawn({
        let (rt, spec, pristine) = (rt.clone(), spec.clone(), pristine.clone());
        async move {
            let in_place = resets(&rt, &pristine, n_reset, ResetMode::InPlace).await;
            let replaced = resets(&rt, &spec, n_replace, ResetMode::Replaced).await;
            let (plain_wall, plain) = new_pod_per_episode(&rt, &spec, e, m, p).await;
            let (pool_wall, pool) = pristine_pool(&rt, &pristine, e, m, p).await;
            (
                Row::new("reset in place (pristine pod)", in_place),
                Row::new("reset by replacing the pod [floor]", replaced),
                Row::new("episode, new pod each [floor]", plain),
                Row::new("episode, pristine pool reset in place", pool),
                plain_wall,
                pool_wall,
            )
        }
    })
    .await;
    sweep(&pods, &run).await;
    let (in_place, replaced, plain, pool, plain_wall, pool_wall) = match measured {
        Ok(rows) => rows,
        Err(e) => {
            rt.backend().close().await;
            panic!("the bench failed (its pods were deleted): {e}");
        }
    };
    println!(
        "cluster {} namespace {}; workload {e} episodes x {m} commands, {p} at a time",
        backend.endpoint_url(),
        backend.namespace()
    );
    println!(
        "{:<52} {:>6} {:>11} {:>11} {:>11}",
        "row", "n", "p50 ms", "p90 ms", "p99 ms"
    );
    for row in [&in_place, &replaced, &plain, &pool] {
        row.print();
    }
    println!(
        "reset: in place {:.1}x faster than replacing the pod (p50)",
        replaced.p50() / in_place.p50()
    );
    println!(
        "workload wall: new pod per episode {:.2} s, pristine pool {:.2} s: {:.1}x",
        plain_wall.as_secs_f64(),
        pool_wall.as_secs_f64(),
        plain_wall.as_secs_f64() / pool_wall.as_secs_f64()
    );
    rt.backend().close().await;
}
