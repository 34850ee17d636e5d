//! Usage through a real `corral serve` on the real daemon: a command's
//! result carries what its processes used; a sandbox's usage says who read
//! it; `/metrics` reports usage per owner, with at most
//! `server.metrics.top_sandboxes` per-sandbox series however many
//! sandboxes run, from a sample taken at most once per refresh interval,
//! in which gone sandboxes vanish; a tenant's scrape shows its own only.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use corral_core::config::TenantConfig;
use serde_json::json;

mod common;
use common::service::{as_, start, Service};
use common::Guard;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";
const TOP: usize = 3;
const MIB: u64 = 1 << 20;

/// The body of `GET /metrics` as `token` sees it.
async fn scrape(s: &Service, token: &str) -> String {
    let r = s.send(as_(token, "GET", "/metrics")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) || l.starts_with(&format!("{name} ")))
        .collect()
}

fn value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("{name}=\""))? + name.len() + 2;
    line[at..].split('"').next()
}

/// Scrapes until `ok` holds for the text (samples are refreshed in the
/// background; a generous bound: the thing tested is that it happens).
async fn scrape_until(s: &Service, token: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(s, token).await;
        if ok(&text) || Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn sandboxes_of(text: &str, owner: &str) -> f64 {
    series(text, "corral_usage_sandboxes")
        .into_iter()
        .filter(|l| label(l, "owner") == Some(owner))
        .map(value)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_reaches_results_and_metrics_with_bounded_labels() {
    let tag = "usage-metrics";
    let _g = Guard(tag);
    let s = start(tag, |c, _| {
        c.server.admin_token = Some(ADMIN.into());
        c.defaults.limits.memory = Some(128 * MIB);
        c.server.metrics.top_sandboxes = TOP;
        c.server.metrics.usage_refresh_ms = 1000;
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

    // Five sandboxes of Alice's and three of Bob's: more than TOP.
    let mut made = Vec::new();
    let svc = &s;
    for (token, prefix, n) in [(ALICE, "a", 5), (BOB, "b", 3)] {
        for i in 0..n {
            made.push(async move {
                let key = format!("{prefix}{i}");
                let r = svc
                    .send(as_(token, "POST", "/v1/sandboxes").json(json!({"session": key})))
                    .await;
                assert_eq!(r.status, 201, "{}", r.text);
                (
                    token,
                    key,
                    r.json["sandbox_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            });
        }
    }
    let made = futures_util::future::join_all(made).await;
    let a0 = made
        .iter()
        .find(|(_, k, _)| k == "a0")
        .map(|(_, _, id)| id.clone())
        .expect("a0");

    // A command's result: what its processes used.
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes/a0/exec").json(json!({
            "command": "dd if=/dev/zero of=/dev/null bs=32M count=1 2>/dev/null"})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let used = &r.json["usage"];
    assert!(
        used["peak_memory_bytes"].as_u64().unwrap_or(0) >= 32 * MIB,
        "{}",
        r.text
    );
    let (cpu, user, system) = (
        used["cpu_ms"].as_f64().unwrap_or(-1.0),
        used["cpu_user_ms"].as_f64().unwrap_or(-1.0),
        used["cpu_system_ms"].as_f64().unwrap_or(-1.0),
    );
    assert!(
        cpu > 0.0 && (cpu - user - system).abs() < 0.01,
        "{}",
        r.text
    );
    // Who read a sandbox's usage.
    let r = s.send(as_(ALICE, "GET", "/v1/sandboxes/a0/usage")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["source"], "engine", "{}", r.text);
    assert_eq!(r.json["memory_limit_bytes"], 128 * MIB, "{}", r.text);

    // Under load: a0 holds 48 MiB, b0 and a1 burn CPU in the background.
    let r = s
        .send(as_(ALICE, "POST", "/v1/sandboxes/a0/exec").json(json!({
            "command": "(dd if=/dev/zero bs=48M count=1 2>/dev/null | sleep 600) >/dev/null 2>&1 &"})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (token, key) in [(BOB, "b0"), (ALICE, "a1")] {
        let r = s
            .send(
                as_(token, "POST", &format!("/v1/sandboxes/{key}/exec")).json(json!({
                "command": "(while :; do :; done) >/dev/null 2>&1 &"})),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    let id_of = |key: &str| {
        made.iter()
            .find(|(_, k, _)| k == key)
            .map(|(_, _, id)| id.as_str())
            .unwrap_or_default()
    };
    let busy_ids = [id_of("b0"), id_of("a1")];

    // The operator's scrape: every owner, TOP sandbox series, a0 on top.
    let all = scrape_until(&s, ADMIN, |t| {
        sandboxes_of(t, "tenant:alice") == 5.0
            && sandboxes_of(t, "tenant:bob") == 3.0
            && series(t, "corral_usage_top_memory_bytes")
                .first()
                .and_then(|l| label(l, "sandbox"))
                == Some(a0.as_str())
            && series(t, "corral_usage_top_cpu_cores")
                .first()
                .is_some_and(|l| busy_ids.contains(&label(l, "sandbox").unwrap_or_default()))
    })
    .await;
    assert_eq!(sandboxes_of(&all, "tenant:alice"), 5.0, "{all}");
    assert_eq!(sandboxes_of(&all, "tenant:bob"), 3.0, "{all}");
    let top = series(&all, "corral_usage_top_memory_bytes");
    assert_eq!(top.len(), TOP, "{all}");
    assert_eq!(label(top[0], "sandbox"), Some(a0.as_str()), "{all}");
    assert_eq!(label(top[0], "session"), Some("alice:a0"), "{all}");
    assert!(value(top[0]) >= (48 * MIB) as f64, "{all}");
    assert_eq!(
        series(&all, "corral_usage_top_cpu_cores").len(),
        TOP,
        "{all}"
    );
    // The busiest sandbox is one of the two burning CPU (how much CPU
    // they get depends on the machine's load; that they lead does not).
    let busiest = series(&all, "corral_usage_top_cpu_cores");
    assert!(
        busiest.first().is_some_and(
            |l| value(l) > 0.0 && busy_ids.contains(&label(l, "sandbox").unwrap_or_default())
        ),
        "{all}"
    );
    let bob_cores = series(&all, "corral_usage_cpu_cores")
        .into_iter()
        .find(|l| label(l, "owner") == Some("tenant:bob"))
        .map(value)
        .unwrap_or(0.0);
    assert!(bob_cores > 0.0, "bob's busy loop shows: {all}");
    let inf = series(&all, "corral_usage_memory_limit_fraction_sandboxes")
        .into_iter()
        .find(|l| label(l, "le") == Some("+Inf"))
        .map(value);
    assert_eq!(inf, Some(8.0), "{all}");
    // Bounded: the per-sandbox series name at most 2 x TOP sandboxes.
    let named: BTreeSet<&str> = all
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| label(l, "sandbox"))
        .collect();
    assert!(named.len() <= 2 * TOP, "{named:?}");

    // Within the refresh interval a scrape reads nothing new: the same
    // sample (its duration unchanged), only older.
    let took = |t: &str| {
        series(t, "corral_usage_sample_duration_seconds")
            .first()
            .map(|l| value(l))
    };
    let age = |t: &str| {
        series(t, "corral_usage_sample_age_seconds")
            .first()
            .map(|l| value(l))
    };
    let first = scrape(&s, ADMIN).await;
    let second = scrape(&s, ADMIN).await;
    if age(&second) < Some(0.9) {
        assert_eq!(took(&first), took(&second), "{first}\n{second}");
        assert!(age(&second) >= age(&first), "{first}\n{second}");
    }

    // Alice sees her own only, named as she names them.
    let hers = scrape(&s, ALICE).await;
    assert_eq!(sandboxes_of(&hers, "tenant:alice"), 5.0, "{hers}");
    assert!(!hers.contains("tenant:bob"), "{hers}");
    for l in series(&hers, "corral_usage_top_memory_bytes") {
        assert_eq!(label(l, "owner"), Some("tenant:alice"), "{l}");
    }
    assert_eq!(
        series(&hers, "corral_usage_top_memory_bytes")
            .first()
            .and_then(|l| label(l, "session")),
        Some("a0"),
        "{hers}"
    );

    // Every sandbox's usage at once, from the same sample: Alice's five,
    // by her keys; Bob's three.
    let r = s.send(as_(ALICE, "GET", "/v1/usage")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ids: Vec<&str> = r.json["sandboxes"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["a0", "a1", "a2", "a3", "a4"], "{}", r.text);
    let first = &r.json["sandboxes"][0];
    assert_eq!(first["sandbox_id"], a0.as_str(), "{}", r.text);
    assert!(
        first["usage"]["memory_bytes"].as_u64().unwrap_or(0) >= 48 * MIB,
        "{}",
        r.text
    );
    assert_eq!(
        first["usage"]["memory_limit_bytes"],
        128 * MIB,
        "{}",
        r.text
    );
    assert!(r.json["age_ms"].as_u64().is_some(), "{}", r.text);
    let r = s.send(as_(BOB, "GET", "/v1/usage")).await;
    assert_eq!(
        r.json["sandboxes"].as_array().map(Vec::len),
        Some(3),
        "{}",
        r.text
    );

    // Gone sandboxes vanish from the next sample.
    for key in ["a0", "a1"] {
        let r = s
            .send(as_(ALICE, "DELETE", &format!("/v1/sandboxes/{key}")))
            .await;
        assert!(r.status < 300, "{}", r.text);
    }
    let later = scrape_until(&s, ADMIN, |t| sandboxes_of(t, "tenant:alice") == 3.0).await;
    assert_eq!(sandboxes_of(&later, "tenant:alice"), 3.0, "{later}");
    assert!(!later.contains(&a0), "a0's series are gone: {later}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_sampling_off_means_no_usage_metrics_and_a_clear_refusal() {
    let tag = "usage-off";
    let _g = Guard(tag);
    let s = start(tag, |c, _| c.server.metrics.usage_refresh_ms = 0).await;
    let token = s.token.clone().expect("a token");
    let r = s.send(as_(&token, "GET", "/v1/usage")).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.field(), "server.metrics.usage_refresh_ms", "{}", r.text);
    let text = scrape(&s, &token).await;
    assert!(text.contains("corral_sandboxes"), "{text}");
    assert!(!text.contains("corral_usage_"), "{text}");
    s.stop().await;
}

/// A sandbox's description carries its usage without anyone having
/// sampled it first: read from its agent when the service's sample does
/// not have it (sampling on or off); the listing waits for the first
/// sample, or says null with sampling off.
#[tokio::test(flavor = "multi_thread")]
async fn a_description_carries_usage_before_anything_samples_it() {
    for (tag, refresh) in [("usage-describe", 10_000), ("usage-describe-off", 0)] {
        let _g = Guard(tag);
        let s = start(tag, |c, _| c.server.metrics.usage_refresh_ms = refresh).await;
        let token = s.token.clone().expect("a token");
        let r = s
            .send(as_(&token, "POST", "/v1/sandboxes").json(json!({"session": "fresh"})))
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let r = s.send(as_(&token, "GET", "/v1/sandboxes/fresh")).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let usage = &r.json["usage"];
        assert!(
            usage["usage"]["memory_bytes"].as_u64().unwrap_or(0) > 0,
            "{tag}: {}",
            r.text
        );
        assert!(usage["age_ms"].as_u64().is_some(), "{tag}: {}", r.text);
        let r = s.send(as_(&token, "GET", "/v1/sandboxes")).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let listed = &r.json["sandboxes"][0]["usage"];
        if refresh == 0 {
            assert!(listed.is_null(), "{tag}: {}", r.text);
        } else {
            assert!(
                listed["usage"]["memory_bytes"].as_u64().unwrap_or(0) > 0,
                "{tag}: {}",
                r.text
            );
        }
        s.stop().await;
    }
}
