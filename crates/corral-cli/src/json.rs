//! The JSON shapes the CLI prints; scripts rely on these field names.

use base64::Engine;
use corral_core::{CommandResult, ContainerState, Failure};
use serde_json::{json, Map, Value};

fn text_field(out: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            out.insert(name.into(), Value::String(s.into()));
        }
        Err(_) => {
            // Not UTF-8: a lossy string for reading, base64 for the exact bytes.
            out.insert(
                name.into(),
                Value::String(String::from_utf8_lossy(bytes).into()),
            );
            out.insert(
                format!("{name}_base64"),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            );
        }
    }
}

/// A container state as JSON.
pub fn state(s: &ContainerState) -> Value {
    json!({
        "id": s.id,
        "status": s.status,
        "exit_code": s.exit_code,
        "oom_killed": s.oom_killed,
        "error": s.error,
        "restart_count": s.restart_count,
    })
}

/// A failure as JSON: `{kind, retryable, message, container}`.
pub fn failure(f: &Failure) -> Value {
    json!({
        "kind": f.kind.as_str(),
        "retryable": f.retryable(),
        "message": f.message,
        "container": f.container.as_ref().map(state),
    })
}

/// A command outcome as JSON.
pub fn result(r: &CommandResult, sandbox_id: Option<&str>) -> Value {
    let mut out = Map::new();
    out.insert("exit_code".into(), json!(r.exit_code));
    out.insert("signal".into(), json!(r.signal));
    text_field(&mut out, "stdout", &r.stdout);
    text_field(&mut out, "stderr", &r.stderr);
    out.insert("stdout_truncated".into(), json!(r.stdout_truncated));
    out.insert("stderr_truncated".into(), json!(r.stderr_truncated));
    out.insert("stdout_total_bytes".into(), json!(r.stdout_total_bytes));
    out.insert("stderr_total_bytes".into(), json!(r.stderr_total_bytes));
    out.insert(
        "duration_ms".into(),
        json!(r.duration.as_secs_f64() * 1000.0),
    );
    out.insert(
        "failure".into(),
        r.failure.as_ref().map(failure).unwrap_or(Value::Null),
    );
    out.insert("sandbox_id".into(), json!(sandbox_id));
    Value::Object(out)
}

/// Mean time per successful start in each phase, in ms rounded to the µs,
/// keyed by phase name (`first_command` over the sandboxes that ran one).
pub fn start_phase_means(m: &corral::metrics::MetricsSnapshot) -> Value {
    use corral::metrics::StartPhase;
    StartPhase::ALL
        .into_iter()
        .map(|phase| {
            let mean = m.start_phase_mean(phase).as_secs_f64() * 1e3;
            (
                phase.as_str().to_string(),
                json!((mean * 1e3).round() / 1e3),
            )
        })
        .collect::<Map<String, Value>>()
        .into()
}
