//! Fault-injection acceptance: many sandboxes and commands through a proxy
//! that injects transient daemon errors, while containers are removed,
//! killed and OOM-killed out-of-band. Measured here, on the real daemon:
//! - `recreate`: every workload command eventually succeeds;
//! - `fail`: every affected sandbox reports a typed loss, every other one
//!   completes all its commands;
//! - four corral processes with a shared start limit of four never have
//!   more than four container starts in flight (counted at the proxy);
//! - nothing is left behind.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use corral::{Runtime, RuntimeConfig};
use corral_core::{CommandSpec, FailureKind, Network, Recovery, RetryPolicy, SandboxSpec};
use corral_docker::{DockerBackend, DockerConfig};
use corral_faultproxy::{Action, FaultProxy, Matcher, Rule};

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");
const SANDBOXES: usize = 32;

/// Makes PID 1 the OOM killer's victim: commands run at oom_score_adj 500,
/// so several small allocators (each well under half the limit) lose to
/// PID 1 at 1000 once together they exhaust the memory limit.
const PID1_OOM: &str = "echo 1000 > /proc/1/oom_score_adj; \
    for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/dev/null bs=10M count=2000 & done; wait";
const COMMANDS: usize = 50;

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("corral-chaos-{name}-{}.sock", std::process::id()))
}

/// About 5% of starts and execs (and inspects) answered with transient errors.
fn transient_rules() -> Vec<Rule> {
    let locked = || Action::error(500, "database is locked");
    vec![
        Rule::new(Matcher::new("POST", "/containers/*/start"), locked()).with_probability(0.05),
        Rule::new(Matcher::new("POST", "/containers/*/exec"), locked()).with_probability(0.05),
        Rule::new(
            Matcher::new("POST", "/exec/*/start"),
            Action::error(500, "error retrieving exec session: timed out"),
        )
        .with_probability(0.05),
        Rule::new(Matcher::new("GET", "/containers/*/json"), locked()).with_probability(0.05),
        Rule::new(Matcher::new("POST", "/containers/create"), Action::Reset).with_probability(0.03),
    ]
}

/// The runtime over the daemon behind the fault proxy at `endpoint`.
async fn connect(endpoint: &std::path::Path) -> Result<Runtime, corral::Error> {
    let docker = DockerBackend::connect(&DockerConfig {
        endpoint: Some(format!("unix://{}", endpoint.display())),
        retry: RetryPolicy {
            attempts: 8,
            initial_delay_ms: 20,
            max_delay_ms: 200,
            jitter: true,
        },
        ..Default::default()
    })
    .await?;
    Ok(Runtime::new(
        std::sync::Arc::new(docker),
        RuntimeConfig {
            start_limit: 8,
            shared_slots: false,
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    ))
}

fn docker(args: &[&str]) {
    let _ = Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn leftovers(label: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=chaos={label}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let left = leftovers(&self.0);
        if !left.is_empty() {
            let _ = Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(&left)
                .output();
        }
    }
}

/// What one sandbox saw.
struct Outcome {
    index: usize,
    ok: usize,
    failure: Option<FailureKind>,
    message: String,
    chaos: bool,
}

/// The out-of-band act for sandbox `i`, if it is one of the ~10% chosen.
#[derive(Clone, Copy)]
enum Chaos {
    Remove,
    Kill,
    OomPid1,
}

fn chaos_for(i: usize) -> Option<Chaos> {
    match i {
        3 | 17 => Some(Chaos::Remove),
        9 => Some(Chaos::Kill),
        25 => Some(Chaos::OomPid1),
        _ => None,
    }
}

async fn workload(backend: Runtime, recovery: Recovery, label: &str) -> Vec<Outcome> {
    let mut spec = SandboxSpec::new("corral-test/busybox");
    spec.network = Network::None;
    spec.recovery = recovery;
    spec.limits.memory = Some(48 << 20);
    spec.labels.insert("chaos".into(), label.into());
    let tasks = (0..SANDBOXES).map(|i| {
        let (backend, spec) = (backend.clone(), spec.clone());
        tokio::spawn(async move {
            let chaos = chaos_for(i);
            let mut out = Outcome {
                index: i,
                ok: 0,
                failure: None,
                message: String::new(),
                chaos: chaos.is_some(),
            };
            let sandbox = match backend.create(&spec).await {
                Ok(s) => s,
                Err(e) => {
                    out.failure = Some(e.failure().kind);
                    out.message = format!("create: {e}");
                    return out;
                }
            };
            let act_at = 10 + i % 20;
            for j in 0..COMMANDS {
                if j == act_at {
                    match chaos {
                        Some(Chaos::Remove) | Some(Chaos::Kill) => {
                            // Out-of-band, while a command is in flight.
                            let cid = sandbox.container_id();
                            let remove = matches!(chaos, Some(Chaos::Remove));
                            let act = tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(150)).await;
                                tokio::task::spawn_blocking(move || {
                                    if remove {
                                        docker(&["rm", "-f", &cid]);
                                    } else {
                                        docker(&["kill", &cid]);
                                    }
                                })
                                .await
                            });
                            let r = sandbox
                                .run(&CommandSpec::shell(format!("sleep 1; echo {i}-{j}")))
                                .await;
                            let _ = act.await;
                            if let Some(f) = r.failure {
                                out.failure = Some(f.kind);
                                out.message = f.to_string();
                                break;
                            }
                            if r.stdout == format!("{i}-{j}\n").as_bytes() {
                                out.ok += 1;
                            }
                            continue;
                        }
                        Some(Chaos::OomPid1) => {
                            // The command makes PID 1 the OOM killer's choice.
                            let r = sandbox.run(&CommandSpec::shell(PID1_OOM)).await;
                            let kind = r.failure.map(|f| f.kind);
                            assert_eq!(kind, Some(FailureKind::OomKilled), "sandbox {i}");
                            if recovery == Recovery::Fail {
                                out.failure = kind;
                                break;
                            }
                        }
                        None => {}
                    }
                }
                let r = sandbox
                    .run(
                        &CommandSpec::shell(format!("echo {i}-{j}"))
                            .timeout(Duration::from_secs(60)),
                    )
                    .await;
                match r.failure {
                    None if r.stdout == format!("{i}-{j}\n").as_bytes() => out.ok += 1,
                    None => panic!(
                        "sandbox {i} command {j}: wrong output {:?}",
                        String::from_utf8_lossy(&r.stdout)
                    ),
                    Some(f) => {
                        out.failure = Some(f.kind);
                        out.message = f.to_string();
                        if recovery == Recovery::Recreate {
                            panic!("sandbox {i} command {j} failed under recreate: {f}");
                        }
                        break;
                    }
                }
            }
            if let Err(e) = sandbox.destroy().await {
                panic!("sandbox {i}: teardown failed: {e}");
            }
            out
        })
    });
    futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("sandbox task panicked"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_recreate_policy_every_command_succeeds() {
    images();
    let label = format!("recreate-{}", std::process::id());
    let _cleanup = Cleanup(label.clone());
    let proxy = FaultProxy::start(socket("recreate"), "/var/run/docker.sock").expect("proxy");
    proxy.set_seed(7);
    proxy.set_rules(transient_rules()).expect("rules");
    let backend = connect(proxy.socket_path())
        .await
        .expect("connect through proxy");
    let outcomes = workload(backend.clone(), Recovery::Recreate, &label).await;
    let ok: usize = outcomes.iter().map(|o| o.ok).sum();
    for o in outcomes.iter().filter(|o| o.failure.is_some()) {
        eprintln!("sandbox {}: {:?} {}", o.index, o.failure, o.message);
    }
    let stats = proxy.stats();
    let injected: u64 = stats.rules.iter().map(|r| r.injected).sum();
    let m = backend.metrics();
    eprintln!(
        "recreate: {ok}/{} commands ok, {injected} faults injected, {} retries, {} containers recreated",
        SANDBOXES * COMMANDS,
        m.retries,
        m.recreated
    );
    assert_eq!(ok, SANDBOXES * COMMANDS);
    assert!(
        injected > 0,
        "the proxy injected no fault: the test proved nothing"
    );
    assert!(
        m.recreated >= 4,
        "removed, killed and OOM-killed containers were recreated: {m:?}"
    );
    assert!(leftovers(&label).is_empty(), "containers left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_fail_policy_types_every_loss() {
    images();
    let label = format!("fail-{}", std::process::id());
    let _cleanup = Cleanup(label.clone());
    let proxy = FaultProxy::start(socket("fail"), "/var/run/docker.sock").expect("proxy");
    proxy.set_seed(11);
    proxy.set_rules(transient_rules()).expect("rules");
    let backend = connect(proxy.socket_path())
        .await
        .expect("connect through proxy");
    let outcomes = workload(backend.clone(), Recovery::Fail, &label).await;
    let affected: BTreeSet<usize> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.index)
        .collect();
    let chosen: BTreeSet<usize> = outcomes
        .iter()
        .filter(|o| o.chaos)
        .map(|o| o.index)
        .collect();
    let injected: u64 = proxy.stats().rules.iter().map(|r| r.injected).sum();
    for o in outcomes.iter().filter(|o| o.failure.is_some()) {
        eprintln!("sandbox {}: {:?} {}", o.index, o.failure, o.message);
    }
    eprintln!("fail: affected {affected:?}, chosen {chosen:?}, {injected} faults injected");
    assert_eq!(
        affected, chosen,
        "only the sandboxes hit out-of-band may fail"
    );
    for o in &outcomes {
        match o.failure {
            None => assert_eq!(o.ok, COMMANDS, "sandbox {} did not complete", o.index),
            Some(k) => assert!(
                matches!(k, FailureKind::ContainerLost | FailureKind::OomKilled),
                "sandbox {} failed with {k}",
                o.index
            ),
        }
    }
    assert!(
        injected > 0,
        "the proxy injected no fault: the test proved nothing"
    );
    assert_eq!(
        backend.metrics().recreated,
        0,
        "fail never substitutes a container"
    );
    assert!(leftovers(&label).is_empty(), "containers left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_share_a_start_limit_of_four() {
    images();
    let proxy = FaultProxy::start(socket("slots"), "/var/run/docker.sock").expect("proxy");
    // Slow starts down so that, without the limit, many would overlap.
    proxy
        .set_rules(vec![Rule::new(
            Matcher::new("POST", "/containers/*/start"),
            Action::delay(Duration::from_millis(150)),
        )])
        .expect("rules");
    let start = Matcher::new("POST", "/containers/*/start");
    proxy.set_tracked(vec![start]).expect("tracked");
    let slot_dir = std::env::temp_dir().join(format!("corral-chaos-slots-{}", std::process::id()));
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(CORRAL)
                .args([
                    "--endpoint",
                    &format!("unix://{}", proxy.socket_path().display()),
                    "--start-limit",
                    "4",
                    "workload",
                    "--sandboxes",
                    "8",
                    "--commands",
                    "3",
                    "--parallel",
                    "8",
                ])
                .env("CORRAL_IMAGE", "corral-test/busybox")
                .env("XDG_RUNTIME_DIR", &slot_dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn corral workload")
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let outputs: Vec<_> = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for out in &outputs {
        assert!(
            out.status.success(),
            "workload failed: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stats = proxy.stats();
    let tracked = stats
        .tracked(Some("POST"), "/containers/*/start")
        .expect("tracked starts");
    eprintln!(
        "starts: {} in all, at most {} in flight at once",
        tracked.total, tracked.max_in_flight
    );
    assert_eq!(tracked.total, 32);
    assert!(
        tracked.max_in_flight <= 4,
        "{} starts were in flight at once",
        tracked.max_in_flight
    );
    assert!(
        tracked.max_in_flight >= 2,
        "the workload never overlapped starts: the test proved nothing"
    );
    for pid in pids {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=corral.owner.pid={pid}"),
            ])
            .output()
            .expect("docker ps");
        assert!(
            out.stdout.is_empty(),
            "workload process {pid} left containers"
        );
    }
    std::fs::remove_dir_all(slot_dir).ok();
}
