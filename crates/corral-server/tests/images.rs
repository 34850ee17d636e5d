//! Images through a real `corral serve` on the real daemon and a real
//! registry on loopback (`corral_testing::registry`): `GET /v1/images`
//! lists what the caller may name and the pulls under way (a start of a
//! missing image shows there while it waits), `POST /v1/images/pull` pulls
//! what the policy lists, refuses what it does not with the line that
//! would allow it, types a missing tag, and takes no credentials from the
//! client.

use corral_testing::registry::{Registry, Relay};
use serde_json::{json, Value};

mod common;
use common::service::start;
use common::{Guard, BUSYBOX};

fn names(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["image"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn images_are_listed_and_pulled_under_the_policy_with_their_progress() {
    let label = "images-api";
    let _g = Guard(label);
    common::images();
    let registry = Registry::start().expect("start a registry on loopback");
    let relay = Relay::start(&registry.host).expect("relay");
    registry
        .push_unique(BUSYBOX, "corral/api", "v1", 2 << 20)
        .expect("push an image with a new layer");
    registry
        .push_unique(BUSYBOX, "corral/api", "v2", 2 << 20)
        .expect("push an image with a new layer");
    let allowed = format!("{}/corral/*", relay.host);
    let s = start(label, |c, _| {
        c.server.policy.images = vec![allowed.clone(), "corral-test/*".into()];
    })
    .await;

    // Only what the policy lets the caller name is listed.
    let r = s.send(s.req("GET", "/v1/images")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let listed = names(&r.json, "images");
    assert!(
        listed.iter().any(|i| i.starts_with("corral-test/busybox")),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .all(|i| i.starts_with("corral-test/") || i.starts_with(&relay.host)),
        "only images the policy allows: {listed:?}"
    );

    // Not listed: refused, naming the line that would allow it.
    let r = s
        .send(
            s.req("POST", "/v1/images/pull")
                .json(json!({"image": "python:3.12-slim"})),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.field(), "image");
    assert!(r.message().contains("python:3.12-slim"), "{}", r.text);
    // Credentials never come from a client.
    let r = s
        .send(s.req("POST", "/v1/images/pull").json(json!({
            "image": relay.image("corral/api", "v1"),
            "auth": {"username": "u", "password": "p"}
        })))
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.message().contains("auth"), "{}", r.text);
    // Bad input names the field.
    let r = s
        .send(
            s.req("POST", "/v1/images/pull")
                .json(json!({"image": "  "})),
        )
        .await;
    assert_eq!((r.status, r.field()), (400, "image"), "{}", r.text);
    // A tag the registry lacks: typed, not retryable.
    let r = s
        .send(
            s.req("POST", "/v1/images/pull")
                .json(json!({"image": relay.image("corral/api", "nosuchtag")})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json["error"]["kind"], "image_not_found", "{}", r.text);
    assert_eq!(r.json["error"]["retryable"], false, "{}", r.text);

    // A start of a missing image waits for its pull, which shows in
    // GET /v1/images (the relay paces the registry so the pull lasts).
    relay.slow_down(25);
    let image = relay.image("corral/api", "v1");
    let create = s.send(s.req("POST", "/v1/sandboxes").json(json!({"image": image})));
    let watch = async {
        let mut seen: Option<Value> = None;
        for _ in 0..2000 {
            let r = s.send(s.req("GET", "/v1/images")).await;
            if let Some(p) = r.json["pulls"]
                .as_array()
                .and_then(|a| a.iter().find(|p| p["image"] == image.as_str()))
            {
                if p["state"] == "pulling" && p["bytes"].as_u64().unwrap_or(0) > 0 {
                    seen = Some(p.clone());
                    break;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        seen
    };
    let (created, seen) = tokio::join!(create, watch);
    assert_eq!(created.status, 201, "{}", created.text);
    let seen = seen.expect("the pull showed in GET /v1/images with its bytes");
    assert!(seen["layers"].as_u64().unwrap_or(0) >= 1, "{seen}");
    let id = created.json["id"].as_str().expect("id").to_string();
    let r = s
        .send(
            s.req("POST", &format!("/v1/sandboxes/{id}/exec"))
                .json(json!({"command": "echo pulled"})),
        )
        .await;
    assert_eq!(r.json["stdout"], "pulled\n", "{}", r.text);
    let r = s
        .send(s.req("DELETE", &format!("/v1/sandboxes/{id}")))
        .await;
    assert!(r.status < 300, "{}", r.text);
    relay.slow_down(0);

    // A listed image pulled ahead of any start; then present, then listed.
    let v2 = relay.image("corral/api", "v2");
    let r = s
        .send(s.req("POST", "/v1/images/pull").json(json!({"image": v2})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["image"], v2.as_str());
    let r = s.send(s.req("GET", "/v1/images")).await;
    assert!(names(&r.json, "images").contains(&v2), "{}", r.text);
    assert!(names(&r.json, "pulls").is_empty(), "{}", r.text);

    s.stop().await;
    drop(relay);
    drop(registry);
}
