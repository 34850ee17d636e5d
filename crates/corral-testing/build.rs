//! Builds the static agent exactly as `crates/corral-docker/build.rs` does
//! (same command, same `target/agent` directory, so the two share one
//! build) and tells the crate where it is through
//! `CORRAL_TESTING_AGENT_BIN`. Set `CORRAL_AGENT_BIN` to use a prebuilt
//! agent instead.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .expect("crate lives in <workspace>/crates/")
        .to_path_buf();
    println!("cargo:rerun-if-env-changed=CORRAL_AGENT_BIN");
    for p in ["crates/corral-agent", "crates/corral-core", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    if let Ok(prebuilt) = env::var("CORRAL_AGENT_BIN") {
        println!("cargo:rustc-env=CORRAL_TESTING_AGENT_BIN={prebuilt}");
        return;
    }
    let target_dir = root.join("target").join("agent");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--profile",
            "agent",
            "-p",
            "corral-agent",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static");
    // The outer build's settings must not leak into the agent's build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_PROFILE",
        "PROFILE",
        "__CARGO_FIX_PLZ",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("cannot run cargo to build corral-agent");
    assert!(status.success(), "building corral-agent failed: {status}");
    let built = target_dir.join(TARGET).join("agent").join("corral-agent");
    println!(
        "cargo:rustc-env=CORRAL_TESTING_AGENT_BIN={}",
        built.display()
    );
}
