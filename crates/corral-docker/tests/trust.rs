//! The trust-boundary attacks (`trust/cases.rs`) under runc, the
//! `container` tier.

mod common;

/// The tier every case's sandboxes run under.
const ISOLATION: corral::Isolation = corral::Isolation::Container;

#[path = "trust/cases.rs"]
mod cases;
