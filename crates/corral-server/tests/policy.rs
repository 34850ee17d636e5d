//! The client policy, one test per attack (`attack!`): sandbox specs that
//! would be root on the host (host mounts of `/etc` and the Docker socket,
//! no-new-privileges off, `SYS_ADMIN`, kept capabilities), read the
//! service's environment, change the runtime, plant `corral.*` labels or a
//! persistent session for another key, remove or exceed limits, lengthen
//! the dead-man switch or make the daemon pull an image, each sent to the
//! real service (`common::service`) with a valid token: 403, the field
//! named, the value in the message, no container made. What clients may ask
//! for still works.

use serde_json::{json, Value};

mod common;
use common::service::{start, Req};
use common::{remaining, Guard};

/// Sends one create request a client may not make: 403, kind `forbidden`,
/// the field named, the value in the message, and no container made.
async fn refused(label: &'static str, body: Value, field: &str, value: &str) {
    refused_under(label, |_| {}, body, field, value).await;
}

/// [`refused`] by a service whose configuration `tweak` changed.
async fn refused_under(
    label: &'static str,
    tweak: impl FnOnce(&mut corral_core::config::Config),
    body: Value,
    field: &str,
    value: &str,
) {
    let _g = Guard(label);
    let svc = start(label, |c, _| tweak(c)).await;
    let r = svc
        .send(svc.req("POST", "/v1/sandboxes").json(body.clone()))
        .await;
    assert_eq!(r.status, 403, "{body}: {}", r.text);
    assert_eq!(r.json["error"]["kind"], "forbidden", "{body}: {}", r.text);
    assert_eq!(r.field(), field, "{body}: {}", r.text);
    assert!(
        r.message().contains(value),
        "{body}: the message names the value {value}: {}",
        r.text
    );
    assert_eq!(
        remaining(label),
        Vec::<String>::new(),
        "a refused request created a container"
    );
    svc.stop().await;
}

/// One test per attack on the spec: `attack!(name, body, field, value)`.
macro_rules! attack {
    ($name:ident, $body:expr, $field:expr, $value:expr) => {
        #[tokio::test]
        async fn $name() {
            refused(
                concat!("api-trust-", stringify!($name)),
                $body,
                $field,
                $value,
            )
            .await;
        }
    };
}

attack!(
    host_mount_of_etc,
    json!({"spec": {"mounts": [{"host": "/etc", "container": "/host-etc"}]}}),
    "spec.mounts[0]",
    "/etc:/host-etc"
);
attack!(
    docker_socket_mount,
    json!({"spec": {"mounts": [{"host": "/var/run/docker.sock", "container": "/var/run/docker.sock", "read_only": true}]}}),
    "spec.mounts[0]",
    "/var/run/docker.sock"
);
attack!(
    no_new_privileges_off,
    json!({"spec": {"security": {"no_new_privileges": false}}}),
    "spec.security.no_new_privileges",
    "false"
);
attack!(
    cap_add_sys_admin,
    json!({"spec": {"security": {"cap_add": ["CHOWN", "SYS_ADMIN"]}}}),
    "spec.security.cap_add[1]",
    "SYS_ADMIN"
);
attack!(
    all_capabilities_kept,
    json!({"spec": {"security": {"drop_all_caps": false}}}),
    "spec.security.drop_all_caps",
    "false"
);
attack!(
    setuid_capabilities,
    json!({"spec": {"security": {"setuid_caps": true}}}),
    "spec.security.setuid_caps",
    "true"
);
attack!(
    host_env_forwarding,
    json!({"spec": {"env": [{"name": "OK", "value": "1"}, {"forward": "HOME"}]}}),
    "spec.env[1]",
    "HOME"
);
attack!(
    host_env_expansion,
    json!({"spec": {"expand_host_env": true, "env": [{"name": "LEAK", "value": "$HOME"}]}}),
    "spec.expand_host_env",
    "true"
);
attack!(
    runtime_change,
    json!({"spec": {"runtime": "runc"}}),
    "spec.runtime",
    "runc"
);
attack!(
    corral_persistent_labels,
    json!({"spec": {"labels": {"corral.persistent": "true", "corral.session": "victim"}}}),
    "spec.labels.corral.persistent",
    "true"
);
attack!(
    corral_sandbox_label,
    json!({"spec": {"labels": {"Corral.Sandbox": "sb-someone-else"}}}),
    "spec.labels.Corral.Sandbox",
    "sb-someone-else"
);
attack!(
    persistent_in_the_spec,
    json!({"spec": {"persistent": "victim"}}),
    "spec.persistent",
    "victim"
);
attack!(
    persistent_session,
    json!({"session": "victim", "persistent": true}),
    "persistent",
    "true"
);
attack!(
    memory_above_the_maximum,
    json!({"spec": {"limits": {"memory": 68_719_476_736u64}}}),
    "spec.limits.memory",
    "68719476736"
);
attack!(
    memory_limit_removed,
    json!({"spec": {"limits": {"memory": null}}}),
    "spec.limits.memory",
    "null"
);
attack!(
    pids_limit_removed,
    json!({"spec": {"limits": {"pids": null}}}),
    "spec.limits.pids",
    "null"
);
attack!(
    cpus_above_the_maximum,
    json!({"spec": {"limits": {"cpus": 64.0}}}),
    "spec.limits.cpus",
    "64"
);
attack!(
    tmpfs_limits_removed,
    json!({"spec": {"tmpfs": []}}),
    "spec.tmpfs[0]",
    "(removed)"
);
attack!(
    dead_man_switch_lengthened,
    json!({"spec": {"agent_grace_ms": 86_400_000}}),
    "spec.agent_grace_ms",
    "86400000"
);
attack!(
    image_pulled_from_a_registry,
    json!({"image": "corral-test/not-on-this-daemon:1"}),
    "image",
    "corral-test/not-on-this-daemon:1"
);

/// The operator's egress policy: a client may narrow it, never widen it.
fn operator_egress(c: &mut corral_core::config::Config) {
    c.defaults.network = corral_core::Network::Egress(corral_core::egress::EgressPolicy {
        allow: vec!["pypi.test".into(), "*.mirror.test".into()],
        deny: vec!["169.254.0.0/16".into()],
    });
}

#[tokio::test]
async fn egress_wider_than_the_operators() {
    refused_under(
        "api-trust-egress-wider",
        operator_egress,
        json!({"spec": {"network": {"egress": {"allow": ["pypi.test", "evil.test"],
                                                "deny": ["169.254.0.0/16"]}}}}),
        "spec.network.egress.allow[1]",
        "evil.test",
    )
    .await;
}

#[tokio::test]
async fn egress_dropping_the_operators_deny() {
    refused_under(
        "api-trust-egress-undeny",
        operator_egress,
        json!({"spec": {"network": {"egress": {"allow": ["a.mirror.test"], "deny": []}}}}),
        "spec.network.egress.deny",
        "",
    )
    .await;
}

#[tokio::test]
async fn bridge_under_an_operators_egress_policy() {
    refused_under(
        "api-trust-egress-bridge",
        operator_egress,
        json!({"spec": {"network": "bridge"}}),
        "spec.network",
        "bridge",
    )
    .await;
}

#[tokio::test]
async fn egress_outside_the_services_egress_allow() {
    refused_under(
        "api-trust-egress-allow",
        |c| c.server.policy.egress_allow = Some(vec!["*.test".into()]),
        json!({"spec": {"network": {"egress": {"allow": ["pypi.test", "github.com"]}}}}),
        "spec.network.egress.allow[1]",
        "github.com",
    )
    .await;
}

#[tokio::test]
async fn a_narrower_egress_policy_is_granted_and_enforced() {
    let label = "api-trust-egress-narrower";
    let _g = Guard(label);
    let svc = start(label, |c, _| operator_egress(c)).await;
    let r = svc
        .send(svc.req("POST", "/v1/sandboxes").json(json!({
            "session": "narrow",
            "spec": {"network": {"egress": {"allow": ["a.mirror.test"],
                                            "deny": ["169.254.0.0/16"]}}}})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    // pypi.test is the operator's, but this client gave it up.
    let r = svc
        .send(svc.req("POST", "/v1/sandboxes/narrow/exec").json(json!({
            "command": "nslookup pypi.test >/dev/null 2>&1; echo pypi=$?; \
                        nslookup a.mirror.test 2>/dev/null | grep -c '^Address' "})))
        .await;
    let out = r.json["stdout"].as_str().unwrap_or_default().to_string();
    assert!(out.starts_with("pypi=1\n"), "{}", r.text);
    // The refusal is counted for this sandbox.
    let r = svc
        .send(svc.req("GET", "/v1/sandboxes/narrow/egress"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json["dns_refused"].as_u64() >= Some(1), "{}", r.text);
    assert!(
        r.json["recent_refusals"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "dns pypi.test")),
        "{}",
        r.text
    );
    let r = svc.send(svc.req("DELETE", "/v1/sandboxes/narrow")).await;
    assert_eq!(r.status, 204, "{}", r.text);
    svc.stop().await;
    assert_eq!(remaining(label), Vec::<String>::new());
}

#[tokio::test]
async fn what_clients_may_ask_for_still_works() {
    let _g = Guard("api-trust-allowed");
    let svc = start("api-trust-allowed", |_, _| {}).await;
    // Limits within the maxima, no network, environment values, labels of
    // their own, a working directory.
    let r = svc
        .send(svc.req("POST", "/v1/sandboxes").json(json!({
            "session": "allowed",
            "spec": {"limits": {"memory": 268_435_456u64, "pids": 64}, "network": "none",
                     "env": [{"name": "GREETING", "value": "$HOME"}], "labels": {"team": "rl"},
                     "workdir": "/tmp"}})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes/allowed/exec")
                .json(json!({"command": "echo $GREETING; pwd", "cwd": "/"})),
        )
        .await;
    assert_eq!(r.json["stdout"], "$HOME\n/\n", "{}", r.text);
    let r = svc.send(svc.req("DELETE", "/v1/sandboxes/allowed")).await;
    assert_eq!(r.status, 204, "{}", r.text);
    svc.stop().await;
    assert_eq!(remaining("api-trust-allowed"), Vec::<String>::new());
}

#[tokio::test]
async fn a_client_cannot_raise_isolation_to_a_tier_without_result_integrity() {
    let label = "api-trust-isolation-raised";
    let _g = Guard(label);
    // Sandboxes that start as a user: under gVisor the agent could not
    // keep its stream out of commands' reach.
    let svc = start(label, |c, _| {
        c.defaults.security.user = Some("1000:1000".into());
    })
    .await;
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"spec": {"isolation": "gvisor"}})),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.json["error"]["kind"], "forbidden", "{}", r.text);
    assert_eq!(r.field(), "spec.isolation", "{}", r.text);
    assert!(
        r.message().contains("gvisor")
            && r.message().contains("security.user '1000:1000'")
            && r.message().contains("not integrity-protected"),
        "{}",
        r.text
    );
    assert_eq!(
        remaining(label),
        Vec::<String>::new(),
        "a container was made"
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_may_raise_isolation_to_gvisor_which_holds_result_integrity() {
    let label = "api-trust-isolation-gvisor";
    if !gvisor_available(label) {
        return;
    }
    let _g = Guard(label);
    let svc = start(label, |_, _| {}).await;
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "raised", "spec": {"isolation": "gvisor"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["result_integrity"], true, "{}", r.text);
    assert_eq!(r.json["result_integrity_gap"], Value::Null, "{}", r.text);
    let r = svc.send(svc.req("DELETE", "/v1/sandboxes/raised")).await;
    assert_eq!(r.status, 204, "{}", r.text);
    svc.stop().await;
    assert_eq!(remaining(label), Vec::<String>::new());
}

/// Whether the daemon has gVisor's runtime (`scripts/ensure-gvisor.sh`);
/// says so when it does not.
fn gvisor_available(test: &str) -> bool {
    let out = std::process::Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .expect("docker info");
    let has = String::from_utf8_lossy(&out.stdout).contains("\"runsc\"");
    if !has {
        eprintln!("skipped {test}: the daemon has no runtime 'runsc' (scripts/ensure-gvisor.sh)");
    }
    has
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operators_gvisor_sandbox_as_a_user_says_its_results_are_not_integrity_protected() {
    let label = "api-trust-gvisor-integrity";
    if !gvisor_available(label) {
        return;
    }
    let _g = Guard(label);
    let svc = start(label, |c, _| {
        let mut runc = c.defaults.clone();
        runc.isolation = corral_core::Isolation::Container;
        runc.security.user = Some("1000:1000".into());
        c.profiles.insert("runc".into(), runc);
        // Under gVisor as a user the agent cannot hide its stream.
        c.defaults.isolation = corral_core::Isolation::Gvisor;
        c.defaults.security.user = Some("1000:1000".into());
        c.server.e2b_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let gap = |v: &Value| v.as_str().unwrap_or_default().to_string();
    // The operator's tier: created, and the answer says what it means.
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "graded"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["result_integrity"], false, "{}", r.text);
    let why = gap(&r.json["result_integrity_gap"]);
    assert!(
        why.starts_with("isolation gvisor with security.user '1000:1000':")
            && why.contains("not integrity-protected"),
        "{}",
        r.text
    );
    // So does its description.
    let r = svc.send(svc.req("GET", "/v1/sandboxes/graded")).await;
    assert_eq!(r.json["result_integrity"], false, "{}", r.text);
    assert_eq!(gap(&r.json["result_integrity_gap"]), why, "{}", r.text);
    // A runc profile of the same service holds it.
    let r = svc
        .send(
            svc.req("POST", "/v1/sandboxes")
                .json(json!({"session": "plain", "profile": "runc"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["result_integrity"], true, "{}", r.text);
    assert_eq!(r.json["result_integrity_gap"], Value::Null, "{}", r.text);
    // The E2B listener's create says it beside E2B's own fields.
    let r = svc
        .send_e2b(
            Req::new("POST", "/sandboxes")
                .header("X-API-Key", svc.token.as_deref().expect("token"))
                .json(json!({"templateID": "base", "timeout": 60})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["resultIntegrity"], false, "{}", r.text);
    assert_eq!(gap(&r.json["resultIntegrityGap"]), why, "{}", r.text);
    let e2b_id = r.json["sandboxID"].as_str().expect("sandboxID").to_string();
    let r = svc
        .send_e2b(
            Req::new("DELETE", &format!("/sandboxes/{e2b_id}"))
                .header("X-API-Key", svc.token.as_deref().expect("token")),
        )
        .await;
    assert!(r.status < 300, "{}", r.text);
    for id in ["graded", "plain"] {
        let r = svc
            .send(svc.req("DELETE", &format!("/v1/sandboxes/{id}")))
            .await;
        assert_eq!(r.status, 204, "{}", r.text);
    }
    svc.stop().await;
    assert_eq!(remaining(label), Vec::<String>::new());
}
