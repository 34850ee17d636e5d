//! `GET /v1/sandboxes/{id}/egress`: what a sandbox's egress gateway allowed
//! and refused (the sandbox's owner only, as every sandbox route).

use axum::extract::{Path, State};
use axum::Json;

use super::AppState;
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{EgressCounts, ErrorBody};

/// The egress counts of a sandbox with `network: {egress: ...}`.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = EgressCounts),
        (status = 404, description = "No such sandbox (or another's), or one without an egress policy", body = ErrorBody),
        (status = 410, description = "The sandbox's container is lost", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn egress_counts(
    State(s): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<EgressCounts>, ApiError> {
    let lease = s.lease(&caller, &id).await?;
    let counts = lease
        .sandbox()
        .egress_counts()
        .await
        .map_err(|e| ApiError::runtime(&e, ""))?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "sandbox {id} has no egress policy (network: {{egress: ...}})"
            ))
        })?;
    Ok(Json(EgressCounts {
        dns_allowed: counts.dns_allowed,
        dns_refused: counts.dns_refused,
        connections_allowed: counts.connections_allowed,
        connections_refused: counts.connections_refused,
        recent_refusals: counts.recent_refusals,
    }))
}
