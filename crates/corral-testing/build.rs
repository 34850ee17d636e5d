//! Builds the static agent exactly as `crates/corral-agent-bin/build.rs` does
//! (the same `crates/corral-agent/build_static.rs`, the same `target/agent`
//! directory, so the two share one build) and tells the crate where it is
//! through `CORRAL_TESTING_AGENT_BIN`. Set `CORRAL_AGENT_BIN` to use a
//! prebuilt agent instead.

include!("../corral-agent/build_static.rs");

fn main() {
    let root = workspace_root();
    let built = build_static_agent(&root);
    println!(
        "cargo:rustc-env=CORRAL_TESTING_AGENT_BIN={}",
        built.display()
    );
}
