//! A sandbox's usage over HTTP (`Sandbox::usage`: the engine's accounting,
//! or where the engine has none the sandbox's agent reading its cgroup
//! from inside, read once per request; nothing is polled in the
//! background).

use axum::extract::{Path, State};
use axum::Json;

use super::{AppState, Observed};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::wire::{ErrorBody, SandboxUsageBody, UsageBody, UsageListBody};

/// What a sandbox uses now: CPU time, memory now and at peak against its
/// limit, processes against their limit, block and network I/O, and who
/// read it (`source`: the engine, or the sandbox's agent where the engine
/// keeps no accounting, as on Kubernetes).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/usage", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = UsageBody),
        (status = 404, description = "No such sandbox (or another's)", body = ErrorBody),
        (status = 410, description = "The sandbox's container is lost", body = ErrorBody),
        (status = 400, description = "Neither the engine nor the sandbox's agent can tell (`unsupported`)", body = ErrorBody),
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
    s.refuse_when_closing()?;
    // Reading usage is observing: not activity for the idle timeout.
    let sandbox = match s.observed(&caller, &id)? {
        Observed::Live(sandbox) => sandbox,
        Observed::Lost(f) => return Err(ApiError::failure(&f)),
    };
    let usage = sandbox
        .usage()
        .await
        .map_err(|e| ApiError::runtime(&e, ""))?;
    Ok(Json(usage.into()))
}

/// The usage of every sandbox of the caller (the operator: everyone's) at
/// once, from the service's usage sample, the one `/metrics` reports:
/// taken at most once per `server.metrics.usage_refresh_ms` (through each
/// sandbox's agent, no engine call where it can answer), so polling this
/// costs the engine nothing however many sandboxes there are. A page
/// showing many sandboxes (the dashboard) reads this rather than each
/// sandbox's usage. `unsupported` (400) when the service's usage sampling
/// is off (`usage_refresh_ms: 0`).
#[utoipa::path(
    get, path = "/v1/usage", tag = "sandboxes",
    responses(
        (status = 200, body = UsageListBody),
        (status = 400, description = "Usage sampling is off (`server.metrics.usage_refresh_ms: 0`)", body = ErrorBody),
        (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
        (status = 403, description = "Refused: a browser Origin or a foreign Host", body = ErrorBody),
    )
)]
pub(super) async fn all_usage(
    State(s): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<UsageListBody>, ApiError> {
    let sampler = s.usage_sampler();
    let Some(sample) = sampler.current().await else {
        let mut e = ApiError::runtime(
            &corral_core::Error::Unsupported {
                what: "usage of every sandbox at once with server.metrics.usage_refresh_ms 0 \
                       (ask each sandbox's /usage)"
                    .into(),
            },
            "",
        );
        e.detail.field = Some("server.metrics.usage_refresh_ms".into());
        return Err(e);
    };
    let sandboxes = sampler
        .sessions(&sample, &caller)
        .into_iter()
        .map(|u| SandboxUsageBody {
            id: u.session,
            sandbox_id: u.sandbox,
            cpu_cores: u.cpu_cores,
            usage: u.usage.into(),
        })
        .collect();
    Ok(Json(UsageListBody {
        age_ms: u64::try_from(sample.age().as_millis()).unwrap_or(u64::MAX),
        sandboxes,
    }))
}
