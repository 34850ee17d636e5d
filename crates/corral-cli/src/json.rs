//! The JSON shapes the CLI prints; scripts rely on these field names. A
//! command's outcome is the HTTP API's type (`corral_server::wire`), not a
//! shape of its own.

use corral_core::CommandResult;
use corral_server::wire::CommandOutcome;
use serde_json::{json, Value};

/// A command outcome as `corral run --json` prints it: the HTTP API's
/// [`CommandOutcome`], the one type behind both, so a script reads the same
/// fields from either (a hand-built copy here once lost `log_tail`).
pub fn result(r: &CommandResult, sandbox_id: Option<&str>) -> CommandOutcome {
    CommandOutcome::new(r, sandbox_id)
}

/// Mean time per successful start in each phase, in ms rounded to the µs,
/// keyed by phase name (`first_command` over the sandboxes that ran one).
pub fn start_phase_means(m: &corral::metrics::MetricsSnapshot) -> Value {
    json!(m.start_phase_means_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::{ContainerState, Failure, FailureKind};
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn keys(v: &Value) -> BTreeSet<&str> {
        v.as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// A lost container with a log tail and output that is not UTF-8: every
    /// optional part of the shape is present.
    fn lost_with_binary_output() -> CommandResult {
        let mut failure = Failure::new(FailureKind::ContainerLost, "container abc removed");
        failure.container = Some(ContainerState {
            id: "abc".into(),
            exit_code: Some(137),
            log_tail: vec!["agent: controller gone".into()],
            ..ContainerState::default()
        });
        CommandResult {
            stdout: vec![b'o', 0xff],
            stderr: b"e\n".to_vec(),
            duration: Duration::from_millis(12),
            failure: Some(failure),
            ..CommandResult::default()
        }
    }

    #[test]
    fn run_json_is_the_apis_command_outcome() {
        let r = lost_with_binary_output();
        for sandbox in [Some("sb-1"), None] {
            let cli = serde_json::to_value(result(&r, sandbox)).expect("json");
            let api = serde_json::to_value(CommandOutcome::new(&r, sandbox)).expect("json");
            assert_eq!(cli, api);
        }
    }

    /// The keys the book's CLI chapter documents for `corral run --json`; a change here is a
    /// change of the contract scripts and the Python client read.
    #[test]
    fn run_json_has_the_documented_keys_including_the_log_tail() {
        let v = serde_json::to_value(result(&lost_with_binary_output(), None)).expect("json");
        assert_eq!(
            keys(&v),
            BTreeSet::from([
                "exit_code",
                "signal",
                "stdout",
                "stderr",
                "stdout_base64",
                "stdout_truncated",
                "stderr_truncated",
                "stdout_total_bytes",
                "stderr_total_bytes",
                "duration_ms",
                "usage",
                "failure",
                "sandbox_id",
            ])
        );
        assert_eq!(v["stdout"], "o\u{fffd}");
        assert_eq!(v["stdout_base64"], "b/8=");
        assert_eq!(v["sandbox_id"], Value::Null);
        assert_eq!(
            keys(&v["failure"]),
            BTreeSet::from(["kind", "retryable", "message", "container"])
        );
        assert_eq!(
            keys(&v["failure"]["container"]),
            BTreeSet::from([
                "id",
                "status",
                "exit_code",
                "oom_killed",
                "error",
                "restart_count",
                "log_tail",
            ])
        );
        assert_eq!(
            v["failure"]["container"]["log_tail"],
            json!(["agent: controller gone"])
        );
    }
}
