//! Principals through a real `corral serve` on the real daemon: two
//! tenants with their own tokens share one service, and each tries, as an
//! attacker would, to list, read, run in, reset, snapshot, fork, restore,
//! overwrite and delete what the other owns. Everything of another's is
//! answered 404, as if absent; a tenant past its quota gets a typed,
//! retryable `capacity` refusal; the operator's admin token sees both; a
//! snapshot keeps its variables' names, never their values; an MCP session
//! opened by one tenant cannot be driven with another's token.

use std::process::Command;

use corral_core::config::TenantConfig;
use serde_json::{json, Value};

mod common;
use common::service::{as_, initialize, mcp, start, Req, Resp, Service};
use common::Guard;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

/// Removes the snapshot images the test made, whatever happens.
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", image]).output();
        }
    }
}

async fn two_tenants(label: &str) -> Service {
    start(label, |c, _| {
        c.server.admin_token = Some(ADMIN.into());
        c.server.tenants.insert(
            "alice".into(),
            TenantConfig {
                token: Some(ALICE.into()),
                ..TenantConfig::default()
            },
        );
        c.server.tenants.insert(
            "bob".into(),
            TenantConfig {
                token: Some(BOB.into()),
                max_sandboxes: Some(1),
                max_snapshots: Some(1),
                ..TenantConfig::default()
            },
        );
    })
    .await
}

async fn exec(s: &Service, token: &str, id: &str, command: &str) -> Resp {
    s.send(
        as_(token, "POST", &format!("/v1/sandboxes/{id}/exec")).json(json!({
            "command": command, "timeout_ms": 60_000
        })),
    )
    .await
}

fn stdout(r: &Resp) -> String {
    r.json["stdout"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_reach_what_another_owns() {
    let label = "tenants-rest";
    let _g = Guard(label);
    let snap = format!("repo-ready-{}", corral::host::random_hex(6));
    let _images = Images(vec![
        format!("corral-snapshot/alice:{snap}"),
        format!("corral-snapshot/bob:{snap}"),
    ]);
    let s = two_tenants(label).await;

    // Who each token is.
    let who = s.send(as_(BOB, "GET", "/v1/whoami")).await;
    assert_eq!(who.status, 200, "{}", who.text);
    assert_eq!(who.json["principal"], "tenant:bob");
    assert_eq!(who.json["max_sandboxes"], 1);
    let who = s.send(as_(ADMIN, "GET", "/v1/whoami")).await;
    assert_eq!(who.json["principal"], "operator");

    // Alice prepares a sandbox with a secret and takes a snapshot.
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes").json(json!({
            "session": "ep-1",
            "spec": {"env": [{"name": "API_KEY", "value": "alice-s3cret"}]}
        })))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["id"], "ep-1");
    assert_eq!(r.json["owner"], "tenant:alice");
    let alice_sandbox = r.json["sandbox_id"].clone();
    let r = exec(&s, ALICE, "ep-1", "echo alice > /srv-alice; echo $API_KEY").await;
    assert_eq!(stdout(&r), "alice-s3cret\n", "{}", r.text);
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": snap})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        (&r.json["name"], &r.json["owner"]),
        (&json!(snap), &json!("tenant:alice"))
    );
    assert_eq!(r.json["env_names"], json!(["API_KEY"]));

    // The snapshot keeps the variable's name, never its value.
    let labels = Command::new("docker")
        .args(["image", "inspect", "--format", "{{json .Config.Labels}}"])
        .arg(format!("corral-snapshot/alice:{snap}"))
        .output()
        .expect("docker image inspect");
    let labels = String::from_utf8_lossy(&labels.stdout);
    assert!(labels.contains("API_KEY"), "{labels}");
    assert!(
        !labels.contains("alice-s3cret"),
        "a secret in the labels: {labels}"
    );

    // Bob sees none of it: every route answers as if it did not exist.
    let r = s.send(as_(BOB, "GET", "/v1/sandboxes")).await;
    assert_eq!(r.json["sandboxes"], json!([]), "{}", r.text);
    for (method, path, body) in [
        ("GET", "/v1/sandboxes/ep-1", None),
        (
            "POST",
            "/v1/sandboxes/ep-1/exec",
            Some(json!({"command": "cat /srv-alice"})),
        ),
        (
            "POST",
            "/v1/sandboxes/ep-1/exec/stream",
            Some(json!({"command": "true"})),
        ),
        (
            "POST",
            "/v1/sandboxes/ep-1/shells/main/exec",
            Some(json!({"command": "true"})),
        ),
        ("GET", "/v1/sandboxes/ep-1/files?path=/srv-alice", None),
        ("POST", "/v1/sandboxes/ep-1/reset", None),
        (
            "POST",
            "/v1/sandboxes/ep-1/snapshot",
            Some(json!({"name": "stolen"})),
        ),
        ("DELETE", "/v1/sandboxes/ep-1", None),
        ("GET", &format!("/v1/snapshots/{snap}"), None),
        ("GET", &format!("/v1/snapshots/alice%2F{snap}"), None),
        (
            "POST",
            &format!("/v1/snapshots/{snap}/fork"),
            Some(json!({"count": 1})),
        ),
        (
            "POST",
            &format!("/v1/snapshots/alice%2F{snap}/fork"),
            Some(json!({"count": 1})),
        ),
        ("DELETE", &format!("/v1/snapshots/{snap}"), None),
        ("DELETE", &format!("/v1/snapshots/alice%2F{snap}"), None),
    ] {
        let mut req = as_(BOB, method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = s.send(req).await;
        assert_eq!(r.status, 404, "{method} {path} as bob: {}", r.text);
    }
    let r = s.send(as_(BOB, "GET", "/v1/snapshots")).await;
    assert_eq!(r.json["snapshots"], json!([]), "{}", r.text);

    // Bob's own `ep-1` and snapshot of the same name are his, not Alice's.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes").json(json!({"session": "ep-1"})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_ne!(r.json["sandbox_id"], alice_sandbox);
    let r = exec(
        &s,
        BOB,
        "ep-1",
        "cat /srv-alice 2>&1; echo bob > /srv-bob; echo ${API_KEY-unset}",
    )
    .await;
    assert!(stdout(&r).ends_with("unset\n"), "{}", r.text);
    assert!(stdout(&r).contains("No such file"), "{}", r.text);
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": snap})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["owner"], "tenant:bob");

    // Bob's quotas: one sandbox, one snapshot; typed, retryable refusals.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes").json(json!({"session": "ep-2"})))
        .await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.json["error"]["kind"], "capacity");
    assert_eq!(r.json["error"]["retryable"], true);
    assert_eq!(r.field(), "max_sandboxes");
    assert!(
        r.text.to_ascii_lowercase().contains("retry-after: 10"),
        "{}",
        r.text
    );
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": "another"})))
        .await;
    assert_eq!((r.status, r.field()), (503, "max_snapshots"), "{}", r.text);
    // Replacing his own snapshot is no new one.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": snap})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);

    // Alice's sandbox and snapshot are untouched: a fork has her file, not
    // Bob's, and her variable only when she gives its value again.
    let r = s
        .send(
            as_(ALICE, "POST", &format!("/v1/snapshots/{snap}/fork")).json(json!({
                "count": 1, "session_prefix": "fork", "env": {"API_KEY": "given-again"}
            })),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = exec(
        &s,
        ALICE,
        "fork-0",
        "cat /srv-alice; ls /srv-bob 2>&1; echo $API_KEY",
    )
    .await;
    let out = stdout(&r);
    assert!(
        out.starts_with("alice\n") && out.ends_with("given-again\n"),
        "{out}"
    );
    assert!(out.contains("No such file"), "{out}");
    let r = s
        .send(
            as_(ALICE, "POST", &format!("/v1/snapshots/{snap}/fork")).json(json!({
                "count": 1, "session_prefix": "bare"
            })),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = exec(&s, ALICE, "bare-0", "echo \"[$API_KEY]\"").await;
    assert_eq!(
        stdout(&r),
        "[]\n",
        "a fork got a value the snapshot kept: {}",
        r.text
    );
    let r = s.send(as_(ALICE, "GET", "/v1/sandboxes")).await;
    let ids: Vec<&str> = r.json["sandboxes"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["bare-0", "ep-1", "fork-0"], "{}", r.text);

    // The operator sees every tenant's, by their qualified names.
    let r = s.send(as_(ADMIN, "GET", "/v1/sandboxes")).await;
    let mut ids: Vec<&str> = r.json["sandboxes"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["id"].as_str()).collect())
        .unwrap_or_default();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["alice:bare-0", "alice:ep-1", "alice:fork-0", "bob:ep-1"],
        "{}",
        r.text
    );
    let r = s.send(as_(ADMIN, "GET", "/v1/snapshots")).await;
    let names: Vec<&str> = r.json["snapshots"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&format!("alice/{snap}").as_str())
            && names.contains(&format!("bob/{snap}").as_str()),
        "{names:?}"
    );
    let r = exec(&s, ADMIN, "bob:ep-1", "cat /srv-bob").await;
    assert_eq!(stdout(&r), "bob\n", "{}", r.text);

    // Bob deletes his own; Alice's stays.
    for id in ["ep-1"] {
        let r = s
            .send(as_(BOB, "DELETE", &format!("/v1/sandboxes/{id}")))
            .await;
        assert_eq!(r.status, 204, "{}", r.text);
    }
    let r = s
        .send(as_(BOB, "DELETE", &format!("/v1/snapshots/{snap}")))
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = s
        .send(as_(ALICE, "GET", &format!("/v1/snapshots/{snap}")))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // With his sandbox gone, Bob has room again.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes").json(json!({"session": "ep-2"})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    s.stop().await;
}

/// A pristine sandbox's snapshot is a delta the service keeps (no image):
/// another tenant can neither see, fork, overwrite nor delete it, its own
/// of the same name stays apart, its quota counts it, and a durable one is
/// the owner's file the other cannot reach either.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_reach_another_tenants_delta_snapshot() {
    let label = "tenants-delta";
    let _g = Guard(label);
    let snap = format!("delta-ready-{}", corral::host::random_hex(6));
    let s = two_tenants(label).await;
    for (token, file) in [(ALICE, "/srv-alice"), (BOB, "/srv-bob")] {
        let r = s
            .send(as_(token, "POST", "/v1/sandboxes").json(json!({
                "session": "ep-1", "spec": {"pristine": true}
            })))
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let r = exec(&s, token, "ep-1", &format!("echo mine > {file}")).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": snap})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["kind"], "delta", "{}", r.text);
    assert_eq!(r.json["owner"], "tenant:alice");
    assert_eq!(r.json["image"], "corral-test/busybox", "{}", r.text);
    let durable = format!("{snap}-kept");
    let r = s
        .send(
            as_(ALICE, "POST", "/v1/sandboxes/ep-1/snapshot")
                .json(json!({"name": durable, "durable": true, "kind": "delta"})),
        )
        .await;
    assert_eq!(
        (r.status, &r.json["kind"]),
        (201, &json!("delta")),
        "{}",
        r.text
    );
    // No image was made for either.
    let images = Command::new("docker")
        .args(["images", "-q", &format!("corral-snapshot/alice:{snap}")])
        .output()
        .expect("docker images");
    assert!(images.stdout.is_empty(), "an image for a delta snapshot");

    for name in [&snap, &durable] {
        for (method, path, body) in [
            ("GET", format!("/v1/snapshots/{name}"), None),
            ("GET", format!("/v1/snapshots/alice%2F{name}"), None),
            (
                "POST",
                format!("/v1/snapshots/alice%2F{name}/fork"),
                Some(json!({"count": 1})),
            ),
            ("DELETE", format!("/v1/snapshots/alice%2F{name}"), None),
        ] {
            let mut req = as_(BOB, method, &path);
            if let Some(b) = body {
                req = req.json(b);
            }
            let r = s.send(req).await;
            assert_eq!(r.status, 404, "{method} {path} as bob: {}", r.text);
        }
    }
    // Naming Alice's namespace in a snapshot is no way to overwrite hers.
    let r = s
        .send(
            as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot")
                .json(json!({"name": format!("alice/{snap}")})),
        )
        .await;
    assert_eq!((r.status, r.field()), (403, "name"), "{}", r.text);
    let r = s.send(as_(BOB, "GET", "/v1/snapshots")).await;
    assert_eq!(r.json["snapshots"], json!([]), "{}", r.text);
    // Bob's own of the same name is his: a fork of it has his file only.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": snap})))
        .await;
    assert_eq!(
        (r.status, &r.json["owner"]),
        (201, &json!("tenant:bob")),
        "{}",
        r.text
    );
    // His quota (one snapshot) counts deltas as it counts images.
    let r = s
        .send(as_(BOB, "POST", "/v1/sandboxes/ep-1/snapshot").json(json!({"name": "another"})))
        .await;
    assert_eq!((r.status, r.field()), (503, "max_snapshots"), "{}", r.text);
    let r = s.send(as_(BOB, "DELETE", "/v1/sandboxes/ep-1")).await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = s
        .send(
            as_(BOB, "POST", &format!("/v1/snapshots/{snap}/fork"))
                .json(json!({"count": 1, "session_prefix": "fork"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = exec(&s, BOB, "fork-0", "cat /srv-bob; cat /srv-alice 2>&1").await;
    assert!(
        stdout(&r).starts_with("mine\n") && stdout(&r).contains("No such file"),
        "{}",
        r.text
    );

    // Alice's forks have her file, from the kept one as from the other.
    for (name, prefix) in [(&snap, "a"), (&durable, "b")] {
        let r = s
            .send(
                as_(ALICE, "POST", &format!("/v1/snapshots/{name}/fork"))
                    .json(json!({"count": 2, "session_prefix": prefix})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        for i in 0..2 {
            let r = exec(
                &s,
                ALICE,
                &format!("{prefix}-{i}"),
                "cat /srv-alice; cat /srv-bob 2>&1",
            )
            .await;
            assert!(
                stdout(&r).starts_with("mine\n") && stdout(&r).contains("No such file"),
                "{}",
                r.text
            );
        }
    }
    // The admin sees both tenants' (only this test's: the others in this
    // file keep image snapshots on the same daemon meanwhile).
    let r = s.send(as_(ADMIN, "GET", "/v1/snapshots")).await;
    let mut names: Vec<&str> = r.json["snapshots"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["name"].as_str())
                .filter(|n| n.contains(&snap))
                .collect()
        })
        .unwrap_or_default();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            format!("alice/{snap}"),
            format!("alice/{durable}"),
            format!("bob/{snap}")
        ],
        "{}",
        r.text
    );
    for name in [&snap, &durable] {
        let r = s
            .send(as_(ALICE, "DELETE", &format!("/v1/snapshots/{name}")))
            .await;
        assert_eq!(r.status, 204, "{}", r.text);
    }
    let r = s
        .send(as_(BOB, "GET", &format!("/v1/snapshots/{snap}")))
        .await;
    assert_eq!(r.status, 200, "bob's stays: {}", r.text);
    s.stop().await;
}

/// The session id an MCP answer carries.
fn session_id(r: &Resp) -> String {
    r.text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Mcp-Session-Id in {}", r.text))
}

fn call(id: u64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": args}})
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_session_answers_only_the_principal_that_opened_it() {
    let label = "tenants-mcp";
    let _g = Guard(label);
    let s = two_tenants(label).await;
    let r = s
        .send(mcp(as_(ALICE, "POST", "/mcp")).json(initialize()))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sid = session_id(&r);
    let r = s
        .send(
            mcp(as_(ALICE, "POST", "/mcp"))
                .header("Mcp-Session-Id", &sid)
                .json(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
        )
        .await;
    assert!(r.status < 300, "{}", r.text);

    // Bob holding Alice's session id: as if there were no such session.
    for (method, body) in [
        (
            "POST",
            Some(call(2, "run_command", json!({"command": "echo hijacked"}))),
        ),
        ("GET", None),
        ("DELETE", None),
    ] {
        let mut req = mcp(as_(BOB, method, "/mcp")).header("Mcp-Session-Id", &sid);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = s.send(req).await;
        assert_eq!(r.status, 404, "{method} /mcp as bob: {}", r.text);
    }

    // Alice's session goes on, in a sandbox she owns.
    let r = s
        .send(
            mcp(as_(ALICE, "POST", "/mcp"))
                .header("Mcp-Session-Id", &sid)
                .json(call(
                    3,
                    "run_command",
                    json!({"command": "echo still-mine"}),
                )),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("still-mine"), "{}", r.text);
    // Its sandbox counts as Alice's MCP session's, which the REST API
    // does not hand out (it has no session key there).
    let r = s.send(as_(ALICE, "GET", "/v1/sandboxes")).await;
    assert_eq!(r.json["sandboxes"], json!([]), "{}", r.text);
    let r = s
        .send(mcp(as_(ALICE, "DELETE", "/mcp")).header("Mcp-Session-Id", &sid))
        .await;
    assert!(r.status < 300, "{}", r.text);
    s.stop().await;
}

/// The image id (`sha256:...`) of `image` on the daemon.
fn image_id(image: &str) -> String {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .output()
        .expect("docker image inspect");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("sha256:"), "no id for {image}: {out:?}");
    id
}

/// A snapshot is another's files: naming its image (any spelling the
/// daemon resolves to it, its image id included) starts nothing for a
/// tenant that may not read it, on REST (`image`, `spec.image`, a pull),
/// E2B (`templateID`) and MCP (`restore`), with no allow-list
/// (`server.policy.images` empty: "any image on the daemon") and with one
/// that lists everything. Its owner still may.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_start_another_tenants_snapshot_by_naming_its_image() {
    for listed in [false, true] {
        let label = if listed {
            "tenants-snapimg-listed"
        } else {
            "tenants-snapimg"
        };
        let _g = Guard(label);
        let snap = format!("secret-{}", corral::host::random_hex(6));
        let alice_image = format!("corral-snapshot/alice:{snap}");
        let ops_image = format!("corral-snapshot:{snap}");
        let _images = Images(vec![alice_image.clone(), ops_image.clone()]);
        let s = start(label, |c, _| {
            c.server.admin_token = Some(ADMIN.into());
            c.server.e2b_listen = Some("127.0.0.1:0".into());
            if listed {
                c.server.policy.images = vec!["*".into()];
            }
            for (name, token) in [("alice", ALICE), ("bob", BOB)] {
                c.server.tenants.insert(
                    name.into(),
                    TenantConfig {
                        token: Some(token.into()),
                        ..TenantConfig::default()
                    },
                );
            }
        })
        .await;

        // Alice and the operator each keep a secret in a snapshot.
        for (token, file) in [(ALICE, "/srv-alice"), (ADMIN, "/srv-ops")] {
            let r = s
                .send(as_(token, "POST", "/v1/sandboxes").json(json!({"session": "prep"})))
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            let r = exec(&s, token, "prep", &format!("echo secret > {file}")).await;
            assert_eq!(r.status, 200, "{}", r.text);
            let r = s
                .send(as_(token, "POST", "/v1/sandboxes/prep/snapshot").json(json!({"name": snap})))
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
        }
        let alice_id = image_id(&alice_image);
        let ops_id = image_id(&ops_image);
        let hex = |id: &str| id.trim_start_matches("sha256:").to_string();
        let spellings = [
            alice_image.clone(),
            format!("docker.io/corral-snapshot/alice:{snap}"),
            format!("index.docker.io/corral-snapshot/alice:{snap}"),
            ops_image.clone(),
            format!("docker.io/library/corral-snapshot:{snap}"),
            format!("library/corral-snapshot:{snap}"),
            alice_id.clone(),
            hex(&alice_id),
            hex(&alice_id)[..12].to_string(),
            format!("sha256:{}", &hex(&ops_id)[..16]),
            ops_id.clone(),
        ];

        // REST: as `image`, as `spec.image`, and as a pull.
        for image in &spellings {
            for (body, field) in [
                (json!({"image": image}), "image"),
                (json!({"spec": {"image": image}}), "spec.image"),
            ] {
                let r = s.send(as_(BOB, "POST", "/v1/sandboxes").json(body)).await;
                assert_eq!(
                    (r.status, r.field()),
                    (403, field),
                    "bob started {image}: {}",
                    r.text
                );
                assert!(!r.text.contains("secret\n"), "{}", r.text);
            }
            let r = s
                .send(as_(BOB, "POST", "/v1/images/pull").json(json!({"image": image})))
                .await;
            assert_eq!(r.status, 403, "bob pulled {image}: {}", r.text);
        }
        // A snapshot that does not exist is answered the same way.
        let r = s
            .send(
                as_(BOB, "POST", "/v1/sandboxes")
                    .json(json!({"image": "corral-snapshot/alice:none-such"})),
            )
            .await;
        assert_eq!((r.status, r.field()), (403, "image"), "{}", r.text);
        assert!(r.message().contains("names a snapshot"), "{}", r.text);

        // E2B: the template is the image.
        for image in &spellings {
            let r = s
                .send_e2b(
                    Req::new("POST", "/sandboxes")
                        .header("X-API-Key", BOB)
                        .json(json!({"templateID": image})),
                )
                .await;
            assert_eq!(r.status, 403, "bob's E2B sandbox of {image}: {}", r.text);
        }

        // MCP: a session restores only what it may read, however named.
        let r = s
            .send(mcp(as_(BOB, "POST", "/mcp")).json(initialize()))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let sid = session_id(&r);
        let r = s
            .send(
                mcp(as_(BOB, "POST", "/mcp"))
                    .header("Mcp-Session-Id", &sid)
                    .json(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            )
            .await;
        assert!(r.status < 300, "{}", r.text);
        for (i, name) in [
            format!("alice/{snap}"),
            snap.clone(),
            alice_image.clone(),
            ops_image.clone(),
            alice_id.clone(),
        ]
        .iter()
        .enumerate()
        {
            let r = s
                .send(
                    mcp(as_(BOB, "POST", "/mcp"))
                        .header("Mcp-Session-Id", &sid)
                        .json(call(10 + i as u64, "restore", json!({"name": name}))),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.text);
            // A tool error, or a JSON-RPC one for a name no snapshot has.
            assert!(
                r.text.contains("\"isError\":true") || r.text.contains("\"error\":{"),
                "restore {name}: {}",
                r.text
            );
        }
        let r = s
            .send(
                mcp(as_(BOB, "POST", "/mcp"))
                    .header("Mcp-Session-Id", &sid)
                    .json(call(
                        20,
                        "run_command",
                        json!({"command": "cat /srv-alice /srv-ops 2>&1"}),
                    )),
            )
            .await;
        assert!(r.text.contains("No such file"), "{}", r.text);
        let r = s
            .send(mcp(as_(BOB, "DELETE", "/mcp")).header("Mcp-Session-Id", &sid))
            .await;
        assert!(r.status < 300, "{}", r.text);

        // Bob has no sandbox of either; his own image choice still works.
        let r = s.send(as_(BOB, "GET", "/v1/sandboxes")).await;
        assert_eq!(r.json["sandboxes"], json!([]), "{}", r.text);
        let r = s
            .send(
                as_(BOB, "POST", "/v1/sandboxes")
                    .json(json!({"session": "own", "image": common::BUSYBOX})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);

        // Alice may start her own snapshot's image, and sees her file.
        let r = s
            .send(
                as_(ALICE, "POST", "/v1/sandboxes")
                    .json(json!({"session": "mine", "image": alice_image})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let r = exec(&s, ALICE, "mine", "cat /srv-alice").await;
        assert_eq!(stdout(&r), "secret\n", "{}", r.text);
        // But not the operator's, which is not shared.
        let r = s
            .send(as_(ALICE, "POST", "/v1/sandboxes").json(json!({"image": ops_image})))
            .await;
        assert_eq!(r.status, 403, "{}", r.text);
        s.stop().await;
    }
}
