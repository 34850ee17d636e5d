//! `corral egress` as a user runs it: a real sandbox with an egress policy
//! on the real daemon, its gateway reaching the test internet
//! (`corral_testing::internet`), makes one allowed request and one
//! refused one; the command's lines and its JSON show both counts moved.
//! A sandbox without a policy and one that does not exist are refused by
//! name (125). The CLI acts on the engine as its operator, as `corral ps`
//! and `corral port` do: tenants are the service's (their not-found is
//! tested through the HTTP API, the Python client and MCP).

use std::process::Command;
use std::sync::Arc;

use corral::{CommandSpec, Network, Runtime, RuntimeConfig, SandboxSpec};
use corral_core::egress::EgressPolicy;
use corral_docker::{DockerBackend, DockerConfig};
use corral_testing::internet::{internet, remove_sandbox, SANDBOXES};

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// Removes the test's sandboxes however it ends.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for id in &self.0 {
            remove_sandbox(id);
        }
    }
}

fn corral(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(CORRAL)
        .args(args)
        .env_remove("CORRAL_CONFIG")
        .output()
        .expect("run corral");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number on the line starting with `label` of `corral egress`'s output.
fn count(text: &str, label: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{label}' count in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_egress_shows_what_the_gateway_allowed_and_refused() {
    let net = internet();
    let backend = DockerBackend::connect(&DockerConfig {
        egress_network: Some(net.network.clone()),
        ..DockerConfig::default()
    })
    .await
    .expect("a Docker daemon");
    let rt = Runtime::new(
        Arc::new(backend),
        RuntimeConfig {
            reap_orphans: false,
            ..RuntimeConfig::default()
        },
    );
    let mut cleanup = Cleanup(Vec::new());
    let mut spec = SandboxSpec::new(&net.image);
    spec.labels.insert("corraltest".into(), "cli-egress".into());
    spec.network = Network::Egress(EgressPolicy {
        allow: vec!["pypi.test".into()],
        deny: vec![],
    });
    let sb = rt
        .create(&spec)
        .await
        .expect("start a sandbox with a policy");
    cleanup.0.push(sb.id().to_string());
    if let Ok(mut s) = SANDBOXES.lock() {
        s.push(sb.id().to_string());
    }

    // Nothing yet.
    let (code, out, err) = corral(&["egress", sb.id()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(count(&out, "dns refused"), 0, "{out}");

    let allowed = sb
        .run(&CommandSpec::shell(
            "curl -sf -m 10 -o /dev/null http://pypi.test/",
        ))
        .await;
    assert_eq!(allowed.exit_code, Some(0), "{allowed:?}");
    let denied = sb
        .run(&CommandSpec::shell(
            "curl -sf -m 10 -o /dev/null http://evil.test/",
        ))
        .await;
    assert_ne!(denied.exit_code, Some(0), "{denied:?}");

    // By a prefix of the id, as `corral ps` shows it.
    let (code, out, err) = corral(&["egress", &sb.id()[..12]]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(count(&out, "dns allowed") >= 1, "{out}");
    assert!(count(&out, "connections allowed") >= 1, "{out}");
    assert!(count(&out, "dns refused") >= 1, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("refused") && l.contains("evil.test")),
        "{out}"
    );
    let (code, out, err) = corral(&["egress", "--json", sb.id()]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert!(v["connections_allowed"].as_u64() >= Some(1), "{v}");
    assert!(v["dns_refused"].as_u64() >= Some(1), "{v}");

    // A sandbox without a policy has no counts, and says so.
    let mut plain = SandboxSpec::new("corral-test/busybox");
    plain
        .labels
        .insert("corraltest".into(), "cli-egress".into());
    plain.network = Network::None;
    let other = rt.create(&plain).await.expect("start a plain sandbox");
    cleanup.0.push(other.id().to_string());
    let (code, out, err) = corral(&["egress", other.id()]);
    assert_eq!(code, Some(125), "{out}{err}");
    assert!(err.contains("has no egress policy"), "{err}");
    other.destroy().await.expect("destroy");

    // Nor does one that does not exist.
    let (code, _, err) = corral(&["egress", "no-such-sandbox"]);
    assert_eq!(code, Some(125));
    assert!(err.contains("no sandbox 'no-such-sandbox'"), "{err}");

    sb.destroy().await.expect("destroy");
}
