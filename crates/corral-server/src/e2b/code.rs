//! E2B's code interpreter (`e2b-code-interpreter`): the calls its SDK sends
//! with `E2b-Sandbox-Port: 49999` (`POST /execute`, `/contexts`,
//! `/contexts/{id}`, `/contexts/{id}/restart`), served by the sandbox's
//! code contexts ([`corral::Sandbox::run_code`], `corral/src/code.rs`), the
//! same code path as corral's own `/v1/sandboxes/{id}/code` route.
//!
//! `/execute` answers E2B's JSON lines as the code runs: `stdout`,
//! `stderr`, `result` (a MIME bundle spread over `text`, `html`, `png`, ...
//! with `is_main_result`), `error` (name, value, traceback as one string)
//! and `number_of_executions`. The SDK's `timeout` is its own read
//! deadline: when it gives up and closes the connection, the execution is
//! interrupted. A corral failure (timeout, `oom_killed`, a kernel that died)
//! arrives as an `error` line named by its kind.

use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use corral::{CodeEvent, FailureKind, RunCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{Code, RpcError};
use super::E2b;

/// The port E2B's SDK names for its code interpreter.
pub(super) const JUPYTER_PORT: &str = "49999";

/// The profile E2B's code-interpreter templates start.
pub const PROFILE: &str = "code-interpreter";

/// For E2B's code-interpreter templates (`code-interpreter-v1`, the SDK's
/// default, and `code-interpreter`): the profile they start, which the
/// operator configures (`profiles: {code-interpreter: {image: ...}}`, an
/// image with ipykernel); refused by name where there is none. `None` for
/// any other template.
pub(super) fn template_profile(
    config: &corral_core::config::Config,
    template: &str,
) -> Result<Option<String>, super::control::E2bError> {
    if !matches!(template, "code-interpreter-v1" | "code-interpreter") {
        return Ok(None);
    }
    if config.profiles.contains_key(PROFILE) {
        return Ok(Some(PROFILE.to_string()));
    }
    Err(super::control::error(
        StatusCode::BAD_REQUEST,
        format!(
            "templateID '{template}': E2B's code interpreter runs in the profile '{PROFILE}', \
             which this service does not configure; add one whose image has ipykernel, \
             e.g. `profiles: {{{PROFILE}: {{image: corral-test/python}}}}`"
        ),
    ))
}

/// The server-side bound of one execution: E2B's SDK default (300 s).
const EXECUTE_TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn routes() -> axum::Router<E2b> {
    axum::Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", axum::routing::delete(remove_context))
        .route("/contexts/{id}/restart", post(restart_context))
}

/// A code-interpreter error: E2B's server answers plain text; the SDK
/// shows the body.
fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    (status, message.into()).into_response()
}

fn from_rpc(e: RpcError) -> Response {
    let status = match e.code {
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound | Code::Unimplemented => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        // As E2B's proxy answers for a sandbox that is gone.
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, e.message)
}

fn from_failure(f: &corral::Failure) -> Response {
    let status = match f.kind {
        FailureKind::InvalidSpec => StatusCode::NOT_FOUND,
        FailureKind::Unsupported => StatusCode::BAD_REQUEST,
        FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, f.message.clone())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Execute {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("request body: {e}"))
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// One E2B output line for `event`.
fn line(event: CodeEvent) -> Value {
    match event {
        CodeEvent::Stdout { text } => {
            json!({"type": "stdout", "text": text, "timestamp": now_ns()})
        }
        CodeEvent::Stderr { text } => {
            json!({"type": "stderr", "text": text, "timestamp": now_ns()})
        }
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => {
            json!({"type": "error", "name": name, "value": value, "traceback": traceback.join("\n")})
        }
        CodeEvent::Result {
            data,
            is_main_result,
        } => {
            let mut out = serde_json::Map::new();
            out.insert("type".into(), json!("result"));
            out.insert("is_main_result".into(), json!(is_main_result));
            let mut extra = serde_json::Map::new();
            for (mime, value) in data {
                let key = match mime.as_str() {
                    "text/plain" => "text",
                    "text/html" => "html",
                    "text/markdown" => "markdown",
                    "image/svg+xml" => "svg",
                    "image/png" => "png",
                    "image/jpeg" => "jpeg",
                    "application/pdf" => "pdf",
                    "text/latex" => "latex",
                    "application/json" => "json",
                    "application/javascript" => "javascript",
                    _ => {
                        extra.insert(mime, value);
                        continue;
                    }
                };
                out.insert(key.into(), value);
            }
            if !extra.is_empty() {
                out.insert("extra".into(), Value::Object(extra));
            }
            Value::Object(out)
        }
    }
}

/// The error line for a corral failure, named by its kind.
fn failure_line(f: &corral::Failure) -> Value {
    let name = match f.kind {
        FailureKind::Timeout => "TimeoutError".to_string(),
        FailureKind::OomKilled => "OOMKilled".to_string(),
        other => format!("{other:?}"),
    };
    json!({"type": "error", "name": name, "value": f.message, "traceback": f.message})
}

async fn execute(State(e2b): State<E2b>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let envd = match e2b.envd_on(&headers, JUPYTER_PORT).await {
        Ok(e) => e,
        Err(e) => return from_rpc(e),
    };
    let req: Execute = match parse(&body) {
        Ok(r) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    if req.context_id.is_some() && req.language.is_some() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "context_id and language: give one, not both",
        );
    }
    if let Some(lang) = req.language.as_deref() {
        if !matches!(lang.to_ascii_lowercase().as_str(), "python" | "python3") {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("language '{lang}': no kernel for it; corral runs Python code contexts"),
            );
        }
    }
    let sb = envd.lease.sandbox().clone();
    if let Some(id) = req.context_id.as_deref() {
        if id != corral::DEFAULT_CONTEXT && !sb.code_contexts().iter().any(|c| c.id == id) {
            return refuse(
                StatusCode::NOT_FOUND,
                format!("context_id '{id}': this sandbox has no such context"),
            );
        }
    }
    let mut run = RunCode::new(req.code);
    run.timeout = Some(EXECUTE_TIMEOUT);
    run.max_contexts = e2b.app.ceilings().limits().max_code_contexts as usize;
    // The sandbox's own envVars first, then this execution's.
    run.env = envd
        .entry
        .envs
        .iter()
        .chain(req.env_vars.iter().flatten())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // What the run may hold (its output on the way, its code) is the
    // service's budget's, until its answer is sent.
    let held = match e2b.app.ceilings().command(
        &crate::ceilings::Holder::of(&envd.entry.owner),
        run.max_output,
        run.code.len() as u64,
        true,
    ) {
        Ok(h) => h,
        Err(busy) => return crate::error::ApiError::from(busy).into_response(),
    };
    let task_held = held.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<String, std::io::Error>>();
    tokio::spawn(async move {
        let _held = task_held;
        let lease = envd.lease;
        let send = |v: Value| {
            let _ = tx.send(Ok(format!("{v}\n")));
        };
        let context = req.context_id.clone();
        let sb = lease.sandbox();
        let run = sb.run_code(context.as_deref(), &run, |e| send(line(e)));
        // The SDK closing the connection (its own timeout) drops the run,
        // which interrupts the kernel.
        let outcome = tokio::select! {
            o = run => o,
            _ = tx.closed() => return,
        };
        match outcome {
            Ok(o) => {
                if let Some(f) = &o.failure {
                    send(failure_line(f));
                }
                if let Some(n) = o.execution_count {
                    send(json!({"type": "number_of_executions", "execution_count": n}));
                }
            }
            Err(f) => send(failure_line(&f)),
        }
        drop(lease);
    });
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    (
        held,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

fn context_json(c: &corral::CodeContext) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd.clone().unwrap_or_default()})
}

async fn create_context(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let envd = match e2b.code_contexts(&headers).await {
        Ok(e) => e,
        Err(e) => return from_rpc(e),
    };
    let req: NewContext = match parse(if body.is_empty() { b"{}" } else { &body }) {
        Ok(r) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let max = e2b.app.ceilings().limits().max_code_contexts as usize;
    match envd
        .lease
        .sandbox()
        .create_code_context_within(req.language.as_deref(), req.cwd.as_deref(), max)
        .await
    {
        Ok(c) => axum::Json(context_json(&c)).into_response(),
        Err(f) => from_failure(&f),
    }
}

async fn list_contexts(State(e2b): State<E2b>, headers: HeaderMap) -> Response {
    let envd = match e2b.code_contexts(&headers).await {
        Ok(e) => e,
        Err(e) => return from_rpc(e),
    };
    let all: Vec<Value> = envd
        .lease
        .sandbox()
        .code_contexts()
        .iter()
        .map(context_json)
        .collect();
    axum::Json(all).into_response()
}

async fn remove_context(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let envd = match e2b.code_contexts(&headers).await {
        Ok(e) => e,
        Err(e) => return from_rpc(e),
    };
    if envd.lease.sandbox().remove_code_context(&id).await {
        StatusCode::NO_CONTENT.into_response()
    } else {
        refuse(
            StatusCode::NOT_FOUND,
            format!("context '{id}': this sandbox has no such context"),
        )
    }
}

async fn restart_context(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let envd = match e2b.code_contexts(&headers).await {
        Ok(e) => e,
        Err(e) => return from_rpc(e),
    };
    match envd.lease.sandbox().restart_code_context(&id).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => refuse(
            StatusCode::NOT_FOUND,
            format!("context '{id}': this sandbox has no such context"),
        ),
        Err(f) => from_failure(&f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_spread_the_mime_bundle() {
        let mut data = serde_json::Map::new();
        data.insert("text/plain".into(), json!("2"));
        data.insert("image/png".into(), json!("iVBOR"));
        data.insert("application/x-custom".into(), json!({"a": 1}));
        let v = line(CodeEvent::Result {
            data,
            is_main_result: true,
        });
        assert_eq!(v["type"], "result");
        assert_eq!(v["text"], "2");
        assert_eq!(v["png"], "iVBOR");
        assert_eq!(v["is_main_result"], true);
        assert_eq!(v["extra"]["application/x-custom"]["a"], 1);
        let e = line(CodeEvent::Error {
            name: "ValueError".into(),
            value: "x".into(),
            traceback: vec!["a".into(), "b".into()],
        });
        assert_eq!(e["traceback"], "a\nb");
    }
}
