//! Snapshots and forks over HTTP against the real daemon: a snapshot of a
//! prepared sandbox, forks that each see its state and are the service's
//! sandboxes, deletion refused while forks live; and the attacks: a client
//! forking an operator's snapshot of a sandbox with a host mount, and a
//! client naming a snapshot's image past the image allow-list.

use std::process::Command;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral::{Provider, Runtime, RuntimeConfig, SnapshotOptions};
use corral_core::config::{AuthMode, Config};
use corral_core::spec::Mount;
use corral_server::{app, AppState, Listener};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

mod common;
use common::{images, Guard, BUSYBOX};

const LISTEN: &str = "127.0.0.1:7070";

/// Removes the test's snapshot images when dropped (after its containers:
/// declare it before the container guard).
struct Snapshots(Vec<String>);

impl Drop for Snapshots {
    fn drop(&mut self) {
        // The operator's, and tenant `default`'s (the clients here).
        for name in &self.0 {
            for image in [
                format!("corral-snapshot:{name}"),
                format!("corral-snapshot/default:{name}"),
            ] {
                let _ = Command::new("docker").args(["rmi", &image]).output();
            }
        }
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        corral::host::random_hex(6)
    )
}

fn config(label: &str) -> Config {
    let mut c = Config::default();
    c.defaults.image = BUSYBOX.into();
    c.defaults.labels.insert("corraltest".into(), label.into());
    c.server.auth = AuthMode::None;
    c.provider.max_live = 8;
    c
}

async fn service(config: Config) -> (axum::Router, Provider, Runtime) {
    images();
    let runtime = common::service::runtime(RuntimeConfig {
        reap_orphans: false,
        ..RuntimeConfig::default()
    })
    .await;
    let provider = Provider::new(runtime.clone(), config.provider.clone());
    let state = AppState::new(provider.clone(), runtime.clone(), config, BUSYBOX.into());
    let app = app(state, None, Listener::Tcp(LISTEN.parse().expect("addr")));
    (app, provider, runtime)
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", LISTEN);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let body = body.map(|v| Body::from(v.to_string())).unwrap_or_default();
    let resp = app
        .clone()
        .oneshot(req.body(body).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

async fn exec(app: &axum::Router, id: &str, command: &str) -> String {
    let (st, r) = call(
        app,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": command, "timeout_ms": 60_000})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["exit_code"], 0, "{command}: {r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_see_the_snapshot_and_hold_it_until_deleted() {
    let mut snaps = Snapshots(Vec::new());
    let _g = Guard("api-snap");
    let (app, provider, _) = service(config("api-snap")).await;
    let (st, src) = call(&app, "POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(st, StatusCode::CREATED, "{src}");
    let src = src["id"].as_str().expect("id").to_string();
    exec(
        &app,
        &src,
        "mkdir -p /srv/p && echo prepared > /srv/p/README && echo gone > /srv/p/old && rm /srv/p/old",
    )
    .await;

    let (st, e) = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{src}/snapshot"),
        Some(json!({"name": "Not/A Name"})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["error"]["field"], "name");

    let name = unique("api");
    snaps.0.push(name.clone());
    let (st, snap) = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{src}/snapshot"),
        Some(json!({"name": name})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{snap}");
    assert_eq!(snap["name"], name.as_str());
    assert_eq!(snap["base_image"], BUSYBOX);
    assert_eq!(snap["durable"], false);
    // In the client's namespace (tenant `default`: the service's one token).
    assert_eq!(snap["image"], format!("corral-snapshot/default:{name}"));
    assert_eq!(snap["owner"], "tenant:default");
    assert_eq!(snap["read_only"], false);
    assert!(
        snap.get("spec").is_none(),
        "the spec (env values) stays private: {snap}"
    );

    let (st, list) = call(&app, "GET", "/v1/snapshots", None).await;
    assert_eq!(st, StatusCode::OK);
    let listed = list["snapshots"].as_array().expect("list");
    assert!(listed.iter().any(|s| s["name"] == name.as_str()), "{list}");
    let (st, one) = call(&app, "GET", &format!("/v1/snapshots/{name}"), None).await;
    assert_eq!(
        (st, &one["source_sandbox"]),
        (StatusCode::OK, &snap["source_sandbox"])
    );
    let (st, e) = call(&app, "GET", "/v1/snapshots/no-such-snapshot-here", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    let (st, e) = call(&app, "GET", "/v1/snapshots/Bad%20Name", None).await;
    assert_eq!(
        (st, &e["error"]["field"]),
        (StatusCode::BAD_REQUEST, &json!("name"))
    );

    let fork_uri = format!("/v1/snapshots/{name}/fork");
    for bad in [json!({"count": 0}), json!({"count": 9})] {
        let (st, e) = call(&app, "POST", &fork_uri, Some(bad)).await;
        assert_eq!(
            (st, &e["error"]["field"]),
            (StatusCode::BAD_REQUEST, &json!("count")),
            "{e}"
        );
    }
    let (st, e) = call(
        &app,
        "POST",
        "/v1/snapshots/missing-one/fork",
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");

    let prefix = unique("f");
    let (st, forks) = call(
        &app,
        "POST",
        &fork_uri,
        Some(json!({"count": 3, "session_prefix": prefix})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{forks}");
    let forks = forks["sandboxes"].as_array().expect("sandboxes").clone();
    assert_eq!(forks.len(), 3);
    for (i, f) in forks.iter().enumerate() {
        let id = f["id"].as_str().expect("id");
        assert_eq!(id, format!("{prefix}-{i}"));
        assert_eq!(f["image"], format!("corral-snapshot/default:{name}"));
        let seen = exec(&app, id, "cat /srv/p/README; ls /srv/p").await;
        assert_eq!(seen, "prepared\nREADME\n");
    }
    // Forks are separate sandboxes.
    exec(&app, &format!("{prefix}-0"), "echo mine > /srv/p/README").await;
    assert_eq!(
        exec(&app, &format!("{prefix}-1"), "cat /srv/p/README").await,
        "prepared\n"
    );
    // The keys are taken now.
    let (st, e) = call(
        &app,
        "POST",
        &fork_uri,
        Some(json!({"count": 1, "session_prefix": prefix})),
    )
    .await;
    assert_eq!(
        (st, &e["error"]["field"]),
        (StatusCode::CONFLICT, &json!("session_prefix")),
        "{e}"
    );

    let (st, e) = call(&app, "DELETE", &format!("/v1/snapshots/{name}"), None).await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    for f in &forks {
        let (st, _) = call(
            &app,
            "DELETE",
            &format!("/v1/sandboxes/{}", f["id"].as_str().unwrap_or_default()),
            None,
        )
        .await;
        assert_eq!(st, StatusCode::NO_CONTENT);
    }
    let (st, e) = call(&app, "DELETE", &format!("/v1/snapshots/{name}"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{e}");
    let (st, _) = call(&app, "DELETE", &format!("/v1/snapshots/{name}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cannot_fork_an_operators_snapshot_with_a_host_mount() {
    let mut snaps = Snapshots(Vec::new());
    let _g = Guard("api-snap-attack");
    let mut c = config("api-snap-attack");
    // An allow-list that does not list snapshots: forks of a client's own
    // snapshot still start, a client naming a snapshot image does not.
    c.server.policy.images = vec![format!("{BUSYBOX}*")];
    let op_name = unique("operator");
    // Shared with tenants, so the fork reaches the policy (unshared, it is
    // not there for them at all: see tests/tenants.rs).
    c.server.shared_snapshots = vec![op_name.clone()];
    let (app, provider, runtime) = service(c.clone()).await;

    // The operator (the library, a CLI, a profile) snapshots a sandbox
    // with the host's /etc mounted.
    let host_dir = std::env::temp_dir().join(unique("corral-snap-host"));
    std::fs::create_dir_all(&host_dir).expect("host dir");
    let mut spec = c.defaults.clone();
    spec.mounts.push(Mount {
        host: host_dir.display().to_string(),
        container: "/host".into(),
        read_only: false,
        nosuid: false,
    });
    let operators = runtime.create(&spec).await.expect("the operator's sandbox");
    snaps.0.push(op_name.clone());
    operators
        .snapshot(&op_name, SnapshotOptions::default())
        .await
        .expect("the operator's snapshot");
    operators.destroy().await.expect("destroy");

    let (st, e) = call(
        &app,
        "POST",
        &format!("/v1/snapshots/{op_name}/fork"),
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{e}");
    assert_eq!(e["error"]["field"], "spec.mounts[0]", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&op_name),
        "{e}"
    );
    let (_, list) = call(&app, "GET", "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"], json!([]), "nothing was started");

    // Naming a snapshot's image directly is no way around it: the image
    // allow-list applies as to any image.
    let (st, e) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"image": format!("corral-snapshot:{op_name}")})),
    )
    .await;
    assert_eq!(
        (st, &e["error"]["field"]),
        (StatusCode::FORBIDDEN, &json!("image")),
        "{e}"
    );

    // A client's own snapshot forks under the same allow-list.
    let (_, src) = call(&app, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let src = src["id"].as_str().expect("id").to_string();
    let own = unique("own");
    snaps.0.push(own.clone());
    let (st, e) = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{src}/snapshot"),
        Some(json!({"name": own})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{e}");
    let (st, forks) = call(
        &app,
        "POST",
        &format!("/v1/snapshots/{own}/fork"),
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{forks}");
    provider.shutdown().await;
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// What a fork must see: the paths under the directories the snapshot and
/// the episodes touch, and the prepared file.
const TREE: &str = "find /etc /srv /opt /root /home 2>/dev/null | sort; cat /srv/p/README";

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_lands_in_a_warm_pristine_sandbox_and_its_delete_returns_it_pristine() {
    let snaps = Snapshots(Vec::new());
    let _g = Guard("api-pool-fork");
    let mut c = config("api-pool-fork");
    let mut pool = corral::pool::PoolConfig {
        spec: c.defaults.clone(),
        warm: 3,
        pristine: true,
        ..Default::default()
    };
    pool.spec.image = BUSYBOX.into();
    c.provider.pools.insert("p".into(), pool);
    let (app, provider, _) = service(c).await;
    let warm = || provider.wait_warm("p", std::time::Duration::from_secs(60));
    assert!(warm().await, "the pool never got warm");

    // The source is one of the pool's: the same spec as every warm one.
    let (st, src) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "src", "profile": "p"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{src}");
    let src = src["id"].as_str().expect("id").to_string();
    exec(
        &app,
        &src,
        "mkdir -p /srv/p && echo prepared > /srv/p/README && rm /etc/passwd",
    )
    .await;
    let name = unique("pool");
    let (st, snap) = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{src}/snapshot"),
        Some(json!({"name": name})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{snap}");
    let expected = exec(&app, &src, TREE).await;
    assert!(!expected.contains("/etc/passwd\n"), "{expected}");

    // The pool's sandboxes, with the last episode's mess left in one.
    assert!(warm().await, "the pool was not refilled");
    let (st, used) = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(json!({"session": "episode", "profile": "p"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{used}");
    // The API's id is the session key; the pool holds the sandbox by its
    // own id, which outlives the session.
    let used = used["sandbox_id"].as_str().expect("sandbox_id").to_string();
    exec(
        &app,
        "episode",
        "echo left > /etc/left-behind; mkdir -p /opt/old",
    )
    .await;
    let (st, _) = call(&app, "DELETE", "/v1/sandboxes/episode", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(warm().await, "the pool was not refilled");
    let pooled: Vec<String> = provider
        .held()
        .into_iter()
        .filter(|h| h.key.is_none())
        .map(|h| h.sandbox.id().to_string())
        .collect();
    assert!(
        pooled.contains(&used),
        "the used sandbox is not back in the pool"
    );

    let (st, forks) = call(
        &app,
        "POST",
        &format!("/v1/snapshots/{name}/fork"),
        Some(json!({"count": pooled.len(), "session_prefix": "ep"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{forks}");
    let forks: Vec<(String, String)> = forks["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| {
            let id = s["id"].as_str().expect("id").to_string();
            let sandbox = s["sandbox_id"].as_str().expect("sandbox_id").to_string();
            (id, sandbox)
        })
        .collect();
    for (id, sandbox) in &forks {
        assert!(
            pooled.contains(sandbox),
            "fork {id} started a container: {sandbox} is not one of {pooled:?}"
        );
        assert_eq!(exec(&app, id, TREE).await, expected, "fork {id}");
    }
    let took_used = forks
        .iter()
        .find(|(_, sandbox)| *sandbox == used)
        .map(|(id, _)| id.clone())
        .expect("no fork took the used sandbox");

    // Deleted, the fork goes back to its pool as the pool's state.
    let (st, _) = call(&app, "DELETE", &format!("/v1/sandboxes/{took_used}"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let back = provider
        .held()
        .into_iter()
        .find(|h| h.key.is_none() && h.sandbox.id() == used)
        .expect("the fork's sandbox went back to its pool")
        .sandbox;
    let r = back
        .run(&corral_core::CommandSpec::shell(
            "ls /srv/p /etc/left-behind /opt/old 2>&1 | grep -c 'No such'; test -e /etc/passwd && echo passwd",
        ))
        .await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "3\npasswd\n", "{r:?}");

    provider.shutdown().await;
    drop(snaps);
}
