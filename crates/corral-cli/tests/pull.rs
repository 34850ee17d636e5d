//! `corral pull` and `corral images` as a user runs them, against the real
//! daemon and a real registry on loopback (`corral_testing::registry`).

use std::process::Command;

use corral_testing::registry::Registry;
use serde_json::Value;

use corral_testing::images;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// Runs corral with `args`; returns (exit code, stdout, stderr).
fn corral(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(CORRAL)
        .args(args)
        .output()
        .expect("run corral");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn listed(image: &str) -> bool {
    let (code, out, err) = corral(&["images", "--json"]);
    assert_eq!(code, 0, "{err}");
    out.lines().any(|l| {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        v["image"] == image && v["size"].as_u64().is_some_and(|s| s > 0) && v["created"].is_i64()
    })
}

#[test]
fn corral_pull_fetches_an_image_that_then_runs_and_is_listed() {
    images();
    let registry = Registry::start().expect("start a registry");
    let image = registry
        .push("corral-test/busybox", "corral/cli", "v1")
        .expect("push");
    assert!(!listed(&image), "not on the daemon before the pull");

    let (code, _, err) = corral(&["pull", &image]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("{image} is present")), "{err}");
    assert_eq!(
        registry.tag_requests("corral/cli", "v1"),
        1,
        "{}",
        registry.log()
    );
    assert!(listed(&image), "corral images lists the pulled image");

    // Present now: a second pull asks the registry nothing.
    let (code, _, err) = corral(&["pull", &image]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        registry.tag_requests("corral/cli", "v1"),
        1,
        "{}",
        registry.log()
    );

    let (code, out, err) = corral(&["run", "--image", &image, "--", "echo pulled-and-ran"]);
    assert_eq!((code, out.as_str()), (0, "pulled-and-ran\n"), "{err}");
}

#[test]
fn corral_pull_fails_typed_with_exit_125() {
    images();
    let mut registry = Registry::start().expect("start a registry");
    let image = registry
        .push("corral-test/busybox", "corral/clifail", "v1")
        .expect("push");

    let missing = image.replace(":v1", ":nosuchtag");
    let (code, _, err) = corral(&["pull", &missing]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.contains("(image_not_found)") && err.contains(&missing),
        "{err}"
    );

    registry.stop();
    let (code, _, err) = corral(&["pull", &image]);
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("(daemon_unavailable; retryable)"), "{err}");
}
