//! A sandbox's usage over HTTP (`Sandbox::usage`: the engine's accounting
//! read once per request; nothing is polled in the background).

use axum::extract::{Path, State};
use axum::Json;

use super::{check_name, AppState};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{ErrorBody, UsageBody};

/// What a sandbox uses now: CPU time, memory now and at peak against its
/// limit, processes against their limit, block and network I/O.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/usage", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = UsageBody),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 410, description = "The sandbox's container is lost", body = ErrorBody),
        (status = 400, description = "The engine cannot tell (`unsupported`)", body = ErrorBody),
        (status = 503, description = "Daemon unavailable", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn sandbox_usage(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<UsageBody>, ApiError> {
    check_name("id", &id)?;
    let lease = s.lease(&caller, &id).await?;
    let usage = lease.usage().await.map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(Json(usage.into()))
}
