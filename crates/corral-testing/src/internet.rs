//! "The internet" of the egress tests and benchmarks (Docker's and
//! Kubernetes'): [`corral_internet`]'s servers, one per test binary, made
//! on first use (after `scripts/build-test-images.sh --net`) and torn down
//! when the process exits, with every Docker sandbox a test registered in
//! [`SANDBOXES`]. Failures panic, as a test's should. Needs the `docker`
//! CLI, `openssl` and a daemon.

use std::process::Command;
use std::sync::{Mutex, OnceLock};

pub use corral_internet::{remove_sandbox, Internet, Joined};

static INTERNET: OnceLock<Internet> = OnceLock::new();
/// Docker sandboxes whose containers, gateways and networks the teardown
/// removes (a test that fails leaves nothing).
pub static SANDBOXES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Runs `cmd`, asserting it succeeds; its stdout, trimmed.
pub fn run(cmd: &mut Command) -> String {
    corral_internet::run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// `docker ARGS`, asserting it succeeds; its stdout, trimmed.
pub fn docker(args: &[&str]) -> String {
    run(Command::new("docker").args(args))
}

extern "C" fn tear_down() {
    let ids: Vec<String> = SANDBOXES.lock().map(|s| s.clone()).unwrap_or_default();
    for id in ids {
        remove_sandbox(&id);
    }
    if let Some(net) = INTERNET.get() {
        net.tear_down();
    }
}

/// The internet, made on first use.
pub fn internet() -> &'static Internet {
    INTERNET.get_or_init(|| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/build-test-images.sh"
        );
        run(Command::new("bash").args([script, "--net"]));
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe { libc::atexit(tear_down) };
        let tag = format!("corral-egtest-{}", std::process::id());
        Internet::start(&tag).unwrap_or_else(|e| panic!("making the test internet: {e}"))
    })
}

/// [`Internet::join`], asserting it succeeds.
pub fn join(net: &Internet, network: &str) -> Joined {
    net.join(network)
        .unwrap_or_else(|e| panic!("joining {network}: {e}"))
}
