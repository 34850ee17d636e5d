//! The MCP tools' arguments: their JSON schemas (from the types below) and
//! their checking. A bad argument is an MCP invalid-params error naming the
//! tool, the field and the value; nothing here panics on client input.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::JsonObject;
use rmcp::schemars::JsonSchema;
use rmcp::ErrorData;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

/// Time limit of a command when none is given.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest time limit a tool call may ask for.
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(1800);

/// Longest shell session name.
const MAX_SESSION_NAME: usize = 64;

/// Arguments of `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct RunCommand {
    /// The command line, run by /bin/sh -c (pipes, redirections, && work).
    pub command: String,
    /// Seconds after which the command and everything it started are
    /// killed (default 120, at most 1800; fractions allowed).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Working directory (default: the sandbox's working directory).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Wait until background jobs started with & have closed stdout and
    /// stderr, and return their output too (bounded by the timeout), as
    /// docker exec does. Default false: the call returns when the command
    /// itself exits and later output of its jobs is lost.
    #[serde(default)]
    pub wait_for_output: bool,
}

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct RunCode {
    /// Python code, run in the sandbox's Jupyter kernel: variables,
    /// imports and functions carry over between calls; the value of the
    /// last expression is returned, plots come back as images.
    pub code: String,
    /// Seconds after which the code is interrupted (default 120, at most
    /// 1800; fractions allowed).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Run it in a fresh kernel with nothing else alive in the sandbox
    /// (every other process ended first; the kernel's variables are
    /// lost): for checking work with nothing left behind interfering.
    #[serde(default)]
    pub exclusive: bool,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct ReadFile {
    /// The file; a relative path is taken from the sandbox's working
    /// directory.
    pub path: String,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct WriteFile {
    /// The file; a relative path is taken from the sandbox's working
    /// directory.
    pub path: String,
    /// The complete new content (text).
    pub content: String,
    /// Create missing parent directories (default false).
    #[serde(default)]
    pub mkdirs: Option<bool>,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct ListFiles {
    /// The directory; a relative path is taken from the sandbox's working
    /// directory.
    pub path: String,
}

/// Arguments of `shell_run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct ShellRun {
    /// The command line, run in the session's shell.
    pub command: String,
    /// The shell session's name (default "main"): letters, digits, '.',
    /// '_' or '-', at most 64.
    #[serde(default)]
    pub session: Option<String>,
    /// Seconds after which the command is interrupted like Ctrl-C (default
    /// 120, at most 1800; fractions allowed).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
}

/// Arguments of `shell_close`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct ShellClose {
    /// The shell session's name.
    pub session: String,
}

/// Arguments of `reset`: none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct Reset {}

/// Arguments of `egress`: none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct Egress {}

/// Arguments of `port_url`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct PortUrl {
    /// The port a server listens on inside the sandbox (1 to 65535).
    pub port: i64,
}

/// A port number, or the invalid-params error naming it.
pub(super) fn port(tool: &str, port: i64) -> Result<u16, ErrorData> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| invalid(tool, "port", &json!(port), "a port from 1 to 65535"))
}

/// Arguments of `snapshot`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct Snapshot {
    /// The snapshot's name: 1 to 128 of a-z, 0-9, '.', '_', '-', starting
    /// with a letter or digit. A snapshot of that name is replaced.
    pub name: String,
    /// Keep it after this session and the service end, until deleted
    /// (default false).
    #[serde(default)]
    pub durable: Option<bool>,
    /// Keep the running processes and their memory too (a live snapshot),
    /// which restore brings back running; only where the sandbox's tier
    /// can checkpoint (gVisor without network), else an error saying why
    /// (default false: files only).
    #[serde(default)]
    pub live: Option<bool>,
}

/// Arguments of `restore`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct Restore {
    /// The name of the snapshot to go back to.
    pub name: String,
}

/// A snapshot name.
pub(super) fn snapshot_name(tool: &str, name: &str) -> Result<(), ErrorData> {
    corral_core::snapshot::validate_name(name)
        .map_err(|e| invalid(tool, "name", &json!(name), &e.reason))
}

/// The input schema of a tool taking `T`.
pub(super) fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_input::<T>().unwrap_or_else(|e| {
        // The types above are fixed; a unit test checks each schema.
        tracing::error!(error = %e, "invalid MCP input schema");
        rmcp::handler::server::common::schema_for_empty_input()
    })
}

/// An invalid-params error for `field` of `tool`, carrying both in its data.
pub(super) fn invalid(
    tool: &str,
    field: &str,
    value: &serde_json::Value,
    reason: &str,
) -> ErrorData {
    ErrorData::invalid_params(
        format!("{tool}: invalid {field} {value}: {reason}"),
        Some(json!({ "tool": tool, "field": field, "value": value, "reason": reason })),
    )
}

/// Decodes a tool's arguments; errors name the field at fault.
pub(super) fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T, ErrorData> {
    serde_path_to_error::deserialize(serde_json::Value::Object(args)).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.into_inner().to_string();
        let message = if field == "." {
            format!("{tool}: invalid arguments: {reason}")
        } else {
            format!("{tool}: invalid {field}: {reason}")
        };
        ErrorData::invalid_params(
            message,
            Some(json!({ "tool": tool, "field": field, "reason": reason })),
        )
    })
}

/// A non-empty command line.
pub(super) fn command(tool: &str, command: &str) -> Result<(), ErrorData> {
    if command.trim().is_empty() {
        return Err(invalid(
            tool,
            "command",
            &json!(command),
            "a command is required",
        ));
    }
    Ok(())
}

/// `timeout_secs` as a duration: above zero, at most [`MAX_TIMEOUT`].
pub(super) fn timeout(tool: &str, secs: Option<f64>) -> Result<Duration, ErrorData> {
    let Some(secs) = secs else {
        return Ok(DEFAULT_TIMEOUT);
    };
    if !secs.is_finite() || secs <= 0.0 || secs > MAX_TIMEOUT.as_secs_f64() {
        return Err(invalid(
            tool,
            "timeout_secs",
            &json!(secs),
            &format!(
                "must be above 0 and at most {} seconds",
                MAX_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A path argument: not empty, no NUL byte.
pub(super) fn path(tool: &str, field: &str, path: &str) -> Result<(), ErrorData> {
    if path.is_empty() {
        return Err(invalid(tool, field, &json!(path), "a path is required"));
    }
    if path.contains('\0') {
        return Err(invalid(
            tool,
            field,
            &json!(path),
            "must not contain NUL bytes",
        ));
    }
    Ok(())
}

/// A shell session name.
pub(super) fn session(tool: &str, name: &str) -> Result<(), ErrorData> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SESSION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(invalid(
            tool,
            "session",
            &json!(name),
            &format!("use 1 to {MAX_SESSION_NAME} letters, digits, '.', '_' or '-'"),
        ));
    }
    Ok(())
}

/// `path` made absolute against the directory `cwd`.
pub(super) fn absolute(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", cwd.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: serde_json::Value) -> JsonObject {
        match v {
            serde_json::Value::Object(o) => o,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn every_schema_is_a_valid_object_schema() {
        for (name, r) in [
            (
                "run_command",
                rmcp::handler::server::common::schema_for_input::<RunCommand>(),
            ),
            (
                "read_file",
                rmcp::handler::server::common::schema_for_input::<ReadFile>(),
            ),
            (
                "run_code",
                rmcp::handler::server::common::schema_for_input::<RunCode>(),
            ),
            (
                "write_file",
                rmcp::handler::server::common::schema_for_input::<WriteFile>(),
            ),
            (
                "list_files",
                rmcp::handler::server::common::schema_for_input::<ListFiles>(),
            ),
            (
                "shell_run",
                rmcp::handler::server::common::schema_for_input::<ShellRun>(),
            ),
            (
                "shell_close",
                rmcp::handler::server::common::schema_for_input::<ShellClose>(),
            ),
            (
                "reset",
                rmcp::handler::server::common::schema_for_input::<Reset>(),
            ),
            (
                "snapshot",
                rmcp::handler::server::common::schema_for_input::<Snapshot>(),
            ),
            (
                "restore",
                rmcp::handler::server::common::schema_for_input::<Restore>(),
            ),
        ] {
            let s = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.get("type"), Some(&json!("object")), "{name}: {s:?}");
        }
        let s = schema::<RunCommand>();
        assert_eq!(s.get("required"), Some(&json!(["command"])), "{s:?}");
        let props = s.get("properties").and_then(|p| p.as_object());
        let props = props.expect("properties");
        assert!(props.contains_key("timeout_secs") && props.contains_key("cwd"));
        let desc = props["command"]["description"].as_str().unwrap_or_default();
        assert!(desc.contains("/bin/sh -c"), "{desc}");
    }

    #[test]
    fn bad_arguments_name_the_field_and_the_value() {
        let e = parse::<RunCommand>("run_command", obj(json!({}))).expect_err("missing");
        assert!(e.message.contains("missing field `command`"), "{e:?}");
        let e = parse::<RunCommand>(
            "run_command",
            obj(json!({"command": "ls", "timeout_secs": "soon"})),
        )
        .expect_err("type");
        assert!(
            e.message.contains("timeout_secs") && e.message.contains("\"soon\""),
            "{e:?}"
        );
        let e = parse::<RunCommand>("run_command", obj(json!({"command": "ls", "timout": 3})))
            .expect_err("unknown");
        assert!(e.message.contains("timout"), "{e:?}");
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);

        let e = timeout("run_command", Some(-1.0)).expect_err("negative");
        assert!(
            e.message.contains("timeout_secs") && e.message.contains("-1"),
            "{e:?}"
        );
        assert!(timeout("x", Some(1801.0)).is_err());
        assert!(timeout("x", Some(f64::NAN)).is_err());
        assert_eq!(timeout("x", None).ok(), Some(DEFAULT_TIMEOUT));
        assert_eq!(
            timeout("x", Some(0.5)).ok(),
            Some(Duration::from_millis(500))
        );

        let e = session("shell_run", "a b").expect_err("space");
        assert!(
            e.message.contains("session") && e.message.contains("\"a b\""),
            "{e:?}"
        );
        assert!(session("x", &"s".repeat(65)).is_err());
        assert!(session("x", "").is_err());
        assert!(session("x", "build-1.x_y").is_ok());
        let e = path("read_file", "path", "").expect_err("empty");
        assert!(e.message.contains("read_file: invalid path \"\""), "{e:?}");
        assert!(path("x", "path", "a\0b").is_err());
        assert!(command("x", "  ").is_err());
        let e = snapshot_name("snapshot", "Bad/Name").expect_err("bad name");
        assert!(
            e.message.contains("snapshot: invalid name \"Bad/Name\""),
            "{e:?}"
        );
        assert!(snapshot_name("restore", "step-3.ok").is_ok());
    }

    #[test]
    fn optional_fields_may_be_null_or_absent() {
        let a: ShellRun =
            parse("shell_run", obj(json!({"command": "pwd", "session": null}))).expect("null");
        assert_eq!((a.session, a.timeout_secs), (None, None));
        let a: WriteFile = parse(
            "write_file",
            obj(json!({"path": "f", "content": "", "mkdirs": true})),
        )
        .expect("write");
        assert_eq!(a.mkdirs, Some(true));
    }

    #[test]
    fn relative_paths_join_the_working_directory() {
        assert_eq!(absolute("/w", "a/b"), "/w/a/b");
        assert_eq!(absolute("/", "a"), "/a");
        assert_eq!(absolute("/w/", "a"), "/w/a");
        assert_eq!(absolute("/w", "/etc/x"), "/etc/x");
    }
}
