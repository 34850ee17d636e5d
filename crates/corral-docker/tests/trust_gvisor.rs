//! The trust-boundary attacks (`trust/cases.rs`) under gVisor, the
//! `gvisor` tier: the same cases, each skipped saying why when the daemon
//! has no runtime `runsc` (`scripts/ensure-gvisor.sh`).

mod common;

/// The tier every case's sandboxes run under.
const ISOLATION: corral::Isolation = corral::Isolation::Gvisor;

#[path = "trust/cases.rs"]
mod cases;
