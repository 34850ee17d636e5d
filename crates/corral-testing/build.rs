//! Builds the static agent exactly as `crates/corral-agent-bin/build.rs` does
//! (the same `crates/corral-agent/build_static.rs`, the same `target/agent`
//! directory, so the two share one build) and tells the crate where it is
//! through `CORRAL_TESTING_AGENT_BIN`. Set `CORRAL_AGENT_BIN` to use a
//! prebuilt agent instead.

use std::env;
use std::path::{Path, PathBuf};

include!("../corral-agent/build_static.rs");

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .expect("crate lives in <workspace>/crates/")
        .to_path_buf();
    let built = build_static_agent(&root);
    println!(
        "cargo:rustc-env=CORRAL_TESTING_AGENT_BIN={}",
        built.display()
    );
}
