// The static agent build shared by the build scripts that need the agent
// binary (`corral-agent-bin` embeds it, `corral-testing` runs it), included
// with `include!` so both build it the same way into the same
// `target/agent` directory (one build, shared). Not part of the agent crate.

/// The workspace's root, from the including crate's manifest directory
/// (every crate lives in `<workspace>/crates/`).
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    manifest
        .parent()
        .and_then(std::path::Path::parent)
        .expect("crate lives in <workspace>/crates/")
        .to_path_buf()
}

/// Builds `corral-agent` statically (`+crt-static`, gnu target) for the
/// workspace at `root` with the `agent` profile, and returns the binary's
/// path; `CORRAL_AGENT_BIN` names a prebuilt agent instead. Announces the
/// inputs it depends on to cargo.
fn build_static_agent(root: &std::path::Path) -> std::path::PathBuf {
    const TARGET: &str = "x86_64-unknown-linux-gnu";
    println!("cargo:rerun-if-env-changed=CORRAL_AGENT_BIN");
    for p in ["crates/corral-agent", "crates/corral-core", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    if let Ok(prebuilt) = std::env::var("CORRAL_AGENT_BIN") {
        return std::path::PathBuf::from(prebuilt);
    }
    let target_dir = root.join("target").join("agent");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(root)
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
    // The outer build's settings (clippy's wrapper, its flags, a profile or
    // target of its own) must not leak into the agent's build.
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
    target_dir.join(TARGET).join("agent").join("corral-agent")
}
