//! Builds the in-container agent as a static binary and embeds it in this
//! crate (`corral_agent_bin::BINARY`, the runtime's `corral::agent`), so
//! the `corral` binary needs no separate install step.
//!
//! The agent is compiled by a nested cargo invocation into its own target
//! directory (`target/agent`), with `+crt-static` on the gnu target: a static
//! glibc binary runs in any x86_64 image, `FROM scratch` included. Set
//! `CORRAL_AGENT_BIN` to embed a prebuilt agent instead. The build itself
//! is `crates/corral-agent/build_static.rs`, shared with `corral-testing`.

use std::env;
use std::path::PathBuf;

include!("../corral-agent/build_static.rs");

fn main() {
    let root = workspace_root();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("corral-agent");
    let built = build_static_agent(&root);
    std::fs::copy(&built, &out).unwrap_or_else(|e| panic!("cannot copy {}: {e}", built.display()));
}
