//! Code contexts over HTTP: run code in a sandbox's Jupyter kernel
//! (`corral::Sandbox::run_code`, `corral/src/code.rs`) with its events
//! streamed, and the contexts' create, list and delete. E2B's code
//! interpreter (`e2b/code.rs`) is the same code path in E2B's format.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::UnboundedReceiverStream;
use utoipa::ToSchema;

use super::AppState;
use crate::ceilings::{Holder, Reservation};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{ErrorBody, FailureBody};

/// Body of `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeRequest {
    /// The code (Python).
    pub code: String,
    /// The context to run it in (from `POST .../code/contexts`); omitted:
    /// the sandbox's default Python context, made on first use.
    #[serde(default)]
    pub context: Option<String>,
    /// Environment variables for this execution only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Interrupt it after this many milliseconds (the kernel is restarted
    /// when the interrupt does not land); the failure is `timeout`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes kept of stdout, of stderr and of rich results (default 1 MiB
    /// each, at most the service's command output ceiling).
    #[serde(default)]
    pub max_output: Option<u64>,
    /// Run it in a fresh kernel with nothing else alive in the sandbox:
    /// the context's kernel is restarted (its variables are lost) as an
    /// exclusive command, which ends every other process first, other
    /// contexts' kernels included (they start afresh at their next run).
    /// For a grader after a rollout.
    #[serde(default)]
    pub exclusive: bool,
}

/// The last event of `POST /v1/sandboxes/{id}/code` (`end`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CodeEndBody {
    /// The kernel's execution counter after the run.
    pub execution_count: Option<u64>,
    /// Set when it did not run to its end: `timeout`, `oom_killed`, a
    /// kernel that could not start or died (`spawn_failed`).
    pub failure: Option<FailureBody>,
    /// Output or results beyond `max_output` were dropped.
    pub truncated: bool,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
}

/// Body of `POST /v1/sandboxes/{id}/code/contexts`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewContextRequest {
    /// `python` (the default); another language is `unsupported`.
    #[serde(default)]
    pub language: Option<String>,
    /// Its working directory (default: the sandbox's).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A code context.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CodeContextBody {
    /// Its id.
    pub id: String,
    /// Its language.
    pub language: String,
    /// Its working directory, when set.
    pub cwd: Option<String>,
}

impl From<corral::CodeContext> for CodeContextBody {
    fn from(c: corral::CodeContext) -> Self {
        CodeContextBody {
            id: c.id,
            language: c.language,
            cwd: c.cwd,
        }
    }
}

/// Run code in a code context and stream what it produces as server-sent
/// events: `stdout` and `stderr` (`{text}`), `result` (`{data,
/// is_main_result}`, `data` a MIME bundle: `text/plain`, `text/html`,
/// `image/png` as base64, ...), `error` (`{name, value, traceback}`, the
/// code raised), then one `end` (CodeEndBody). Variables live on between
/// runs of a context. Closing the stream interrupts the kernel. The run
/// reserves its output (4 x `max_output`, plus the code) from the
/// service's budget until its stream ends.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RunCodeRequest,
    responses(
        (status = 200, content_type = "text/event-stream", description = "Events `stdout`/`stderr`/`result`/`error`, then `end` (CodeEndBody)"),
        (status = 400, description = "A bad field", body = ErrorBody),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
        (status = 503, description = "Overloaded: the service's budget for work in flight is taken (`overloaded`, retryable, with `Retry-After`)", body = ErrorBody),
    )
)]
pub(super) async fn run_code(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    crate::api::JsonBody(req): crate::api::JsonBody<RunCodeRequest>,
) -> Result<
    (
        Reservation,
        Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>,
    ),
    ApiError,
> {
    let max_output = super::max_output(s.ceilings(), req.max_output)?;
    // What the run may hold: its output on the way (the relay's queue,
    // then this stream's events for a slow reader) and its code.
    let held = s.ceilings().command(
        &Holder::of(&caller),
        max_output,
        req.code.len() as u64,
        true,
    )?;
    let lease = s.lease(&caller, &id).await?;
    let mut run = corral::RunCode::new(req.code);
    run.env = req.env.into_iter().collect();
    run.timeout = req.timeout_ms.map(Duration::from_millis);
    run.max_output = max_output;
    run.exclusive = req.exclusive;
    run.max_contexts = s.ceilings().limits().max_code_contexts as usize;
    let task_held = held.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Event, Infallible>>();
    tokio::spawn(async move {
        let send = |name: &str, event: &corral::CodeEvent| {
            let data = match serde_json::to_value(event) {
                Ok(serde_json::Value::Object(mut m)) => {
                    m.remove("type");
                    serde_json::Value::Object(m)
                }
                _ => return,
            };
            if let Ok(e) = Event::default().event(name).json_data(data) {
                let _ = tx.send(Ok(e));
            }
        };
        let sb = lease.sandbox();
        let running = sb.run_code(req.context.as_deref(), &run, |e| {
            let name = match &e {
                corral::CodeEvent::Stdout { .. } => "stdout",
                corral::CodeEvent::Stderr { .. } => "stderr",
                corral::CodeEvent::Result { .. } => "result",
                corral::CodeEvent::Error { .. } => "error",
            };
            send(name, &e);
        });
        // A closed stream drops the run, which interrupts the kernel.
        let outcome = tokio::select! {
            o = running => o,
            () = tx.closed() => return,
        };
        let end = match outcome {
            Ok(o) => CodeEndBody {
                execution_count: o.execution_count,
                failure: o.failure.as_ref().map(FailureBody::from),
                truncated: o.truncated,
                duration_ms: o.duration.as_millis() as u64,
            },
            Err(f) => CodeEndBody {
                execution_count: None,
                failure: Some(FailureBody::from(&f)),
                truncated: false,
                duration_ms: 0,
            },
        };
        if let Ok(e) = Event::default().event("end").json_data(end) {
            let _ = tx.send(Ok(e));
        }
        drop(lease);
        drop(task_held);
    });
    Ok((
        held,
        Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()),
    ))
}

/// Create a code context: a fresh kernel (Python) in the sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = NewContextRequest,
    responses(
        (status = 200, body = CodeContextBody),
        (status = 400, description = "A language without a kernel (`unsupported`), a kernel that cannot start (`spawn_failed`), or a sandbox holding `server.limits.max_code_contexts` contexts already (`invalid_spec`)", body = ErrorBody),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn create_context(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    crate::api::JsonBody(req): crate::api::JsonBody<NewContextRequest>,
) -> Result<Json<CodeContextBody>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    let max = s.ceilings().limits().max_code_contexts as usize;
    let made = lease
        .sandbox()
        .create_code_context_within(req.language.as_deref(), req.cwd.as_deref(), max)
        .await
        .map_err(|f| ApiError::failure(&f))?;
    Ok(Json(made.into()))
}

/// The sandbox's code contexts.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = Vec<CodeContextBody>),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn list_contexts(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<CodeContextBody>>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    let all = lease.sandbox().code_contexts();
    Ok(Json(all.into_iter().map(Into::into).collect()))
}

/// End a code context's kernel and forget it.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id"),
    ),
    responses(
        (status = 204, description = "Ended"),
        (status = 404, description = "No such sandbox or context", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn delete_context(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path((id, context)): Path<(String, String)>,
) -> Result<axum::http::StatusCode, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    if lease.sandbox().remove_code_context(&context).await {
        Ok(axum::http::StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "context '{context}': sandbox {id} has no such code context"
        )))
    }
}
