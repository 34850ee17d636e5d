//! corral-testing: **test doubles for corral's runtime. NOT A SANDBOX.**
//!
//! [`LocalProcessBackend`] implements [`corral_core::Backend`] by running
//! the real `corral-agent init` as a child process of the test, as PID 1 of
//! a fresh PID namespace (`unshare --pid --fork --mount-proc`), with no
//! container, no filesystem isolation, no cgroup limits, no network
//! isolation and no dropped capabilities: a command "in the sandbox" runs
//! on the host as the test's user (root in CI). It exists so the runtime
//! (commands, recovery, the provider, shells, files, the control stream)
//! can be tested in milliseconds against the real agent, and so faults the
//! Docker daemon cannot easily give (a control stream cut mid-frame, a
//! start that hangs, a connect that fails) can be injected ([`Faults`]).
//!
//! [`contract`] is the engine contract: one suite of cases run through
//! the runtime against every real backend (each backend's test file
//! expands [`contract_suite!`] over a [`contract::Target`]).
//!
//! [`registry`] is a real registry on loopback (Debian's `docker-registry`)
//! for the tests that pull; [`internet`] the servers and names the egress
//! tests reach (or must not); [`served`] a real `corral serve` process for
//! the tests of commands that talk to a service.
//!
//! Never use it for untrusted code, and never wire it into a front end:
//! no production crate depends on this one (it is `publish = false` and
//! only ever a dev-dependency).

pub mod contract;
pub mod internet;
mod local;
pub mod registry;
pub mod served;

pub use local::{Faults, LocalConfig, LocalProcessBackend, UNSAFE_NOT_A_SANDBOX};

/// Builds the offline test images (`scripts/build-test-images.sh`, which
/// skips those already there) once per test process.
pub fn images() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/build-test-images.sh"
        );
        let ok = std::process::Command::new("bash")
            .arg(script)
            .status()
            .expect("run build-test-images.sh")
            .success();
        assert!(ok, "building the test images failed");
    });
}
